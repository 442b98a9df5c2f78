-- Questions put to more than one person.
--
-- Escalation: an open question still unanswered at escalate_at is asked of the next person in
-- escalate_to as well, in their own chat, and escalate_at moves on by escalate_every_ms while
-- anyone is left. An ask put to several people at once (escalate_every_ms = 0) asks all of
-- escalate_to right after it is asked.
--
-- The questions of one ask share ask_group (the first one's id). The ask resumes its task once
-- `need` of them are answered (1: the first valid answer wins); the others are then closed as
-- superseded. `askees` is how many people the ask was put to at once, and model_answer what
-- the model reads when that is more than what one answer says (every answer with its author).
ALTER TABLE questions
    ADD COLUMN escalate_to text[] NOT NULL DEFAULT '{}',
    ADD COLUMN escalate_every_ms bigint,
    ADD COLUMN escalate_at timestamptz,
    ADD COLUMN ask_group uuid,
    ADD COLUMN need smallint NOT NULL DEFAULT 1 CHECK (need >= 1),
    ADD COLUMN askees smallint NOT NULL DEFAULT 1 CHECK (askees >= need),
    ADD COLUMN model_answer text,
    ADD CHECK (escalate_at IS NULL OR cardinality(escalate_to) > 0);
CREATE INDEX questions_escalate_due ON questions (escalate_at)
    WHERE outcome = 'open' AND escalate_at IS NOT NULL;
