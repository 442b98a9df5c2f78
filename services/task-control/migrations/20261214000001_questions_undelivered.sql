-- Why the chat message of a question could never be delivered (the gateway set it aside), so
-- that whoever reads the question learns that nobody in the chat saw it.
ALTER TABLE questions ADD COLUMN undelivered text;
