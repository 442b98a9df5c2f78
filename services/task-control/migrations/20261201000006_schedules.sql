-- Scheduled and recurring tasks. A schedule starts a task of its own at each run: once at
-- `next_run` (no `cron`), or at every time its cron expression names, read in `timezone`.
CREATE TABLE schedules (
    id                uuid        PRIMARY KEY,
    owner             text        NOT NULL,
    platform          text,
    bot_id            text,
    stream            text,
    origin_message_id text,
    goal              text        NOT NULL,
    on_timeout        text        NOT NULL CHECK (on_timeout IN ('resume', 'fail', 'never')),
    ask_timeout_s     integer     NOT NULL CHECK (ask_timeout_s >= 0),
    cron              text,
    timezone          text        NOT NULL,
    -- What a run does while the previous run's task has not ended: skip it, or start anyway.
    overlap           text        NOT NULL DEFAULT 'skip' CHECK (overlap IN ('skip', 'allow')),
    state             text        NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'done', 'cancelled')),
    next_run          timestamptz,
    runs              integer     NOT NULL DEFAULT 0,
    skipped           integer     NOT NULL DEFAULT 0,
    last_task         uuid,
    request_id        text        UNIQUE,
    created_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((state = 'active') = (next_run IS NOT NULL)),
    CHECK ((platform IS NULL) = (stream IS NULL))
);
CREATE INDEX schedules_due ON schedules (next_run) WHERE state = 'active';
CREATE INDEX schedules_by_owner ON schedules (owner, created_at DESC);

-- The schedule whose run started a task.
ALTER TABLE tasks ADD COLUMN schedule_id uuid;
