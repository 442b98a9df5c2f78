-- A task's own deadline, across all its questions and runs: when it passes before the task ends,
-- on_deadline decides whether the task fails or is cancelled. (Named apart from questions.deadline,
-- so that a statement reading both never finds the name ambiguous.)
ALTER TABLE tasks ADD COLUMN deadline_at timestamptz;
ALTER TABLE tasks ADD COLUMN on_deadline text NOT NULL DEFAULT 'fail' CHECK (on_deadline IN ('fail', 'cancel'));
CREATE INDEX tasks_by_deadline ON tasks (deadline_at)
    WHERE deadline_at IS NOT NULL AND state IN ('pending', 'running', 'waiting_input', 'paused');
