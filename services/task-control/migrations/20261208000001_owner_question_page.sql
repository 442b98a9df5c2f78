-- One owner's page of open questions. An owner whose questions came after the last ANALYZE (an
-- app that just started, a bench run) is estimated at a few rows, however many wait. The planner
-- then reads every one of them through a bitmap and sorts them for a page of 100: 60 ms at
-- 100,000 waiting. Walking questions_open_by_owner_id in order reads one page whatever the
-- statistics say, so this function allows no other plan.
CREATE FUNCTION open_questions_page(p_owner text, p_platform text, p_stream text, p_after uuid, p_limit bigint)
RETURNS SETOF questions
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off
SET enable_sort = off
AS $$
BEGIN
    -- PL/pgSQL keeps the plan for the session, where an SQL function would plan every call.
    RETURN QUERY
    SELECT * FROM questions
    WHERE owner = p_owner AND outcome = 'open'
      AND (p_platform IS NULL OR platform = p_platform)
      AND (p_stream IS NULL OR stream = p_stream)
      AND id > coalesce(p_after, '00000000-0000-0000-0000-000000000000'::uuid)
    ORDER BY owner, id
    LIMIT p_limit;
END
$$;

-- The owner's open questions by when they were asked: no statement reads them so any more (a
-- chat's answer goes by questions_open_by_stream_owner, a page by questions_open_by_owner_id),
-- and it cost every waiting task an index entry.
DROP INDEX IF EXISTS questions_open_by_owner;
