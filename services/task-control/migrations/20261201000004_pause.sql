-- Pausing: a task held still by its owner. `pause_requested` marks a running task that is to
-- pause at its next round boundary; `paused_at` is when a paused task stopped, so that its
-- question's deadline can be moved on by the time it stood still.
ALTER TABLE tasks DROP CONSTRAINT tasks_state_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_state_check CHECK (state IN
    ('pending', 'running', 'waiting_input', 'paused', 'completed', 'failed', 'cancelled'));
ALTER TABLE tasks ADD COLUMN pause_requested boolean NOT NULL DEFAULT false;
ALTER TABLE tasks ADD COLUMN paused_at timestamptz;
ALTER TABLE tasks ADD CONSTRAINT tasks_paused_at CHECK ((state = 'paused') = (paused_at IS NOT NULL));

-- A paused task has not ended: it counts towards task.max_active_per_owner.
DROP INDEX tasks_active_by_owner;
CREATE INDEX tasks_active_by_owner ON tasks (owner)
    WHERE state IN ('pending', 'running', 'waiting_input', 'paused');
