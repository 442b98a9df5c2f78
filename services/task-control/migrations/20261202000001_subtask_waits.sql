-- A question a task asks of another task rather than of a person: the agent waits for the subtask
-- it created, and the subtask's end answers it (see Store::settle_subtasks).
ALTER TABLE questions ADD COLUMN waits_for uuid;
CREATE INDEX questions_waiting_for_tasks ON questions (waits_for)
    WHERE outcome = 'open' AND waits_for IS NOT NULL;
