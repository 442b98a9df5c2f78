-- ListQuestions and the console's inbox page through open questions in id order (ids are
-- UUIDv7, so that is the order they were asked in), for everyone or for one owner: each page is
-- a range of one of these, however many questions wait.
CREATE INDEX IF NOT EXISTS questions_open_by_id ON questions (id) WHERE outcome = 'open';
CREATE INDEX IF NOT EXISTS questions_open_by_owner_id ON questions (owner, id) WHERE outcome = 'open';
