-- Every chat message that carried a question, so that quoting any delivered copy of it finds it.
-- Platform message ids are unique only within a chat on some platforms, so a copy is known by
-- its platform, its stream and its id.
CREATE TABLE question_messages (
    platform    text NOT NULL,
    stream      text NOT NULL,
    message_id  text NOT NULL,
    question_id uuid NOT NULL REFERENCES questions (id) ON DELETE CASCADE,
    PRIMARY KEY (platform, stream, message_id)
);
CREATE INDEX question_messages_by_question ON question_messages (question_id);

INSERT INTO question_messages (platform, stream, message_id, question_id)
SELECT platform, stream, chat_message_id, id FROM questions
WHERE chat_message_id IS NOT NULL AND platform IS NOT NULL AND stream IS NOT NULL
ON CONFLICT DO NOTHING;
