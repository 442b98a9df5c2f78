-- Counting the tasks of an owner that have not ended, for task.max_active_per_owner: one index
-- lookup, whatever the owner's finished tasks.
CREATE INDEX tasks_active_by_owner ON tasks (owner) WHERE state IN ('pending', 'running', 'waiting_input');
