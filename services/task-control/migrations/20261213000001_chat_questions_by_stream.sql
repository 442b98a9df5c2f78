-- A chat's answer finds its question by (platform, stream, owner); a question asked over the API
-- has no stream and is never found that way, yet each one wrote an entry of NULLs into this
-- index when it was asked. Only questions asked in a chat are kept in it now, as the index of
-- handles and tasks_by_stream already do.
DROP INDEX questions_open_by_stream_owner;
CREATE INDEX questions_open_by_stream_owner ON questions (platform, stream, owner, asked_at)
    WHERE outcome = 'open' AND stream IS NOT NULL;
