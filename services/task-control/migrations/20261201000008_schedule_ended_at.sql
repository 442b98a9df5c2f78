-- When a schedule ended (its one run started, or it was cancelled), so that task.retention can
-- delete it as it deletes finished tasks.
ALTER TABLE schedules ADD COLUMN ended_at timestamptz;
UPDATE schedules SET ended_at = now() WHERE state <> 'active';
CREATE INDEX schedules_ended ON schedules (ended_at) WHERE state <> 'active';
