-- The rows every move writes beside its task (its audit rows, its round, its question) no longer
-- carry a foreign key to tasks. Each is written by the statement that inserts or moves its task,
-- so it always has one; the key's check only cost a lookup and a row lock of the task per row:
-- about 10 µs of Postgres each, four to five per questionnaire step. Retention deletes them
-- together with their task (store/retention.rs). A question's chat messages keep their key to
-- the question, and go with it.
ALTER TABLE transitions DROP CONSTRAINT IF EXISTS transitions_task_id_fkey;
ALTER TABLE checkpoints DROP CONSTRAINT IF EXISTS checkpoints_task_id_fkey;
ALTER TABLE questions DROP CONSTRAINT IF EXISTS questions_task_id_fkey;
