-- A page of tasks, newest first, for an owner, a chat or everyone. The list statement was one
-- generic plan for every filter (`$1 IS NULL OR owner = $1`, ...), which no index serves: every
-- page read the whole table, 40 ms at 100,000 tasks whichever owner asked, and the indexes by
-- owner and by chat were written on every move of every task and read by nothing.
--
-- Each filter now walks its own index in (created_at, id) order from the cursor, and reads a page.
-- The function allows no other plan: with one owner holding most tasks (a bench, an app), the
-- statistics make a generic plan by owner look like half the table.
DROP INDEX tasks_by_owner;
CREATE INDEX tasks_by_owner ON tasks (owner, created_at, id);

-- Only tasks of a chat are listed by chat; tasks created over the API have no stream.
DROP INDEX tasks_by_stream;
CREATE INDEX tasks_by_stream ON tasks (platform, stream, created_at, id) WHERE stream IS NOT NULL;

-- Only a request with a request id is looked up by it; the others had an entry of NULL, written
-- on every move of every such task.
ALTER TABLE tasks DROP CONSTRAINT tasks_request_id_key;
CREATE UNIQUE INDEX tasks_request_id_key ON tasks (request_id) WHERE request_id IS NOT NULL;

-- The audit is read by task, in order; its key now serves that read, one index entry per row
-- instead of two.
CREATE UNIQUE INDEX transitions_key ON transitions (task_id, id);
ALTER TABLE transitions DROP CONSTRAINT transitions_pkey;
ALTER TABLE transitions ADD CONSTRAINT transitions_pkey PRIMARY KEY USING INDEX transitions_key;
DROP INDEX transitions_by_task;

CREATE FUNCTION tasks_page(p_owner text, p_states text[], p_platform text, p_stream text,
                           p_before uuid, p_limit bigint)
RETURNS SETOF tasks
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off
SET enable_seqscan = off
SET enable_sort = off
AS $$
DECLARE
    -- The cursor: tasks created before this one, in (created_at, id) order.
    b_at timestamptz := 'infinity';
    b_id uuid := 'ffffffff-ffff-ffff-ffff-ffffffffffff';
BEGIN
    IF p_before IS NOT NULL THEN
        SELECT created_at, id INTO b_at, b_id FROM tasks WHERE id = p_before;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;
    -- PL/pgSQL keeps each branch's plan for the session.
    IF p_owner IS NOT NULL THEN
        RETURN QUERY
        SELECT * FROM tasks
        WHERE owner = p_owner AND (created_at, id) < (b_at, b_id)
          AND (cardinality(p_states) = 0 OR state = ANY(p_states))
          AND (p_platform IS NULL OR platform = p_platform)
          AND (p_stream IS NULL OR stream = p_stream)
        ORDER BY owner DESC, created_at DESC, id DESC
        LIMIT p_limit;
    ELSIF p_platform IS NOT NULL AND p_stream IS NOT NULL THEN
        RETURN QUERY
        SELECT * FROM tasks
        WHERE platform = p_platform AND stream = p_stream AND (created_at, id) < (b_at, b_id)
          AND (cardinality(p_states) = 0 OR state = ANY(p_states))
        ORDER BY platform DESC, stream DESC, created_at DESC, id DESC
        LIMIT p_limit;
    ELSE
        RETURN QUERY
        SELECT * FROM tasks
        WHERE (created_at, id) < (b_at, b_id)
          AND (cardinality(p_states) = 0 OR state = ANY(p_states))
          AND (p_platform IS NULL OR platform = p_platform)
          AND (p_stream IS NULL OR stream = p_stream)
        ORDER BY created_at DESC, id DESC
        LIMIT p_limit;
    END IF;
END
$$;
