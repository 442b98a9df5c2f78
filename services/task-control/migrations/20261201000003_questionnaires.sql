-- A questionnaire asks its owner these questions in turn, without an agent: a JSON array of
-- {key, text, choices}. NULL for an agent task.
ALTER TABLE tasks ADD COLUMN questionnaire jsonb;

-- The answers a question accepts, as a JSON array of texts, when it offers choices.
ALTER TABLE questions ADD COLUMN choices jsonb;
