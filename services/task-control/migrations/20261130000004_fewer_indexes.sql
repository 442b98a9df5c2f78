-- Every task update rewrites each index of tasks (a state change rules out HOT updates), so
-- indexes nothing reads are dropped: pending tasks are never scanned (the outbox guarantees
-- their run jobs), and the outbox is small enough that the sweep needs no age index.
DROP INDEX tasks_pending;
DROP INDEX outbox_by_age;
