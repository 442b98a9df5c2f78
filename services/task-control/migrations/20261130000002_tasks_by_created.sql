-- Task ids are random, so listing pages by creation time.
CREATE INDEX tasks_by_created ON tasks (created_at DESC, id DESC);
