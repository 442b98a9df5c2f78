-- Retention deletes finished tasks with their children and old records of applied inbound
-- messages: the cascade from tasks looks instructions up by task (the only child without such
-- an index), and old applied records are found by age.
CREATE INDEX instructions_by_task ON instructions (task_id);
CREATE INDEX applied_inbound_by_age ON applied_inbound (applied_at);
