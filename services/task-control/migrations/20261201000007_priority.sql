-- Priority: when workers are scarce, a pending task of a higher priority is claimed before every
-- task of a lower one, the longest pending first among equals.
ALTER TABLE tasks ADD COLUMN priority smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100);
ALTER TABLE schedules ADD COLUMN priority smallint NOT NULL DEFAULT 0 CHECK (priority BETWEEN -100 AND 100);
CREATE INDEX tasks_pending_by_priority ON tasks (priority DESC, updated_at) WHERE state = 'pending';
-- A pending task whose job was spent on a task of a higher priority: the job of that task, when
-- it comes and finds its task taken, takes this one instead.
ALTER TABLE tasks ADD COLUMN owed boolean NOT NULL DEFAULT false;
