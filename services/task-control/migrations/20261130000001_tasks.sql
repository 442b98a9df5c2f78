-- hark's task store. task-control is its only writer; every state change is a compare-and-set on
-- (state, generation).

CREATE TABLE tasks (
    id                uuid PRIMARY KEY,
    owner             text        NOT NULL,
    -- The chat the task talks in; all NULL for a task created without one.
    platform          text,
    bot_id            text,
    stream            text,
    origin_message_id text,
    goal              text        NOT NULL,
    state             text        NOT NULL CHECK (state IN
                          ('pending', 'running', 'waiting_input', 'completed', 'failed', 'cancelled')),
    -- Increases at every transition; the compare-and-set token and the lease token.
    generation        bigint      NOT NULL DEFAULT 1,
    -- 1 for the first run; +1 for each run after a lost lease.
    attempt           integer     NOT NULL DEFAULT 1,
    worker_id         text,
    lease_until       timestamptz,
    on_timeout        text        NOT NULL CHECK (on_timeout IN ('resume', 'fail', 'never')),
    ask_timeout_s     integer     NOT NULL CHECK (ask_timeout_s >= 0),
    rounds            integer     NOT NULL DEFAULT 0,
    result            text,
    error             text,
    -- Idempotency key of CreateTask.
    request_id        text UNIQUE,
    -- Time spent running before the current run, for task.max_runtime.
    run_ms            bigint      NOT NULL DEFAULT 0,
    running_since     timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    CHECK ((platform IS NULL) = (stream IS NULL))
);

CREATE INDEX tasks_by_owner ON tasks (owner, created_at DESC);
CREATE INDEX tasks_by_stream ON tasks (platform, stream, created_at DESC);
CREATE INDEX tasks_running_by_lease ON tasks (lease_until) WHERE state = 'running';
CREATE INDEX tasks_pending ON tasks (updated_at) WHERE state = 'pending';

-- One row per round: the raw LLM messages appended in it, as the provider returned them.
CREATE TABLE checkpoints (
    task_id    uuid        NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    round      integer     NOT NULL CHECK (round >= 1),
    messages   jsonb       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, round)
);

-- One row per ask: the ledger of every question and its answer.
CREATE TABLE questions (
    id                 uuid PRIMARY KEY,
    task_id            uuid        NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    handle             text        NOT NULL,
    text               text        NOT NULL,
    context            text        NOT NULL DEFAULT '',
    -- The ask_user call the answer is the result of, and the round that made it.
    tool_call_id       text        NOT NULL,
    round              integer     NOT NULL,
    owner              text        NOT NULL,
    platform           text,
    bot_id             text,
    stream             text,
    outcome            text        NOT NULL DEFAULT 'open' CHECK (outcome IN
                           ('open', 'answered', 'expired', 'cancelled', 'superseded')),
    asked_at           timestamptz NOT NULL DEFAULT now(),
    deadline           timestamptz,
    reminded_at        timestamptz,
    closed_at          timestamptz,
    answerer           text,
    answer             text,
    -- The inbound chat message (or API request) that answered it.
    inbound_message_id text,
    -- The platform message id of the chat message that carried the question.
    chat_message_id    text,
    CHECK ((outcome = 'open') = (closed_at IS NULL))
);

-- Reply matching: the open questions of one owner in one stream, oldest first.
CREATE INDEX questions_open_by_stream_owner ON questions (platform, stream, owner, asked_at)
    WHERE outcome = 'open';
-- A handle names one open question of an owner in a stream.
CREATE UNIQUE INDEX questions_open_handle ON questions (platform, stream, owner, handle)
    WHERE outcome = 'open' AND stream IS NOT NULL;
CREATE INDEX questions_open_by_owner ON questions (owner, asked_at) WHERE outcome = 'open';
CREATE INDEX questions_open_deadline ON questions (deadline)
    WHERE outcome = 'open' AND deadline IS NOT NULL;
CREATE INDEX questions_by_chat_message ON questions (platform, chat_message_id)
    WHERE chat_message_id IS NOT NULL;
CREATE INDEX questions_by_task ON questions (task_id, asked_at);

-- Instructions injected with TellTask or `/task tell`.
CREATE TABLE instructions (
    id             uuid PRIMARY KEY,
    task_id        uuid        NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    text           text        NOT NULL,
    author         text        NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    -- Set when a checkpoint that contains it was stored.
    consumed_round integer
);

CREATE INDEX instructions_pending ON instructions (task_id, created_at) WHERE consumed_round IS NULL;

-- Every transition, for audit and `/task history`.
CREATE TABLE transitions (
    id          bigserial PRIMARY KEY,
    task_id     uuid        NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    from_state  text,
    to_state    text        NOT NULL,
    event       text        NOT NULL,
    generation  bigint      NOT NULL,
    actor       text        NOT NULL DEFAULT '',
    detail      text        NOT NULL DEFAULT '',
    at          timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX transitions_by_task ON transitions (task_id, id);

-- Inbound messages (chat messages, API requests with a request id) already applied, so that a
-- redelivered one changes nothing.
CREATE TABLE applied_inbound (
    key        text PRIMARY KEY,
    task_id    uuid,
    question_id uuid,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- Messages to publish, written in the transaction that decided them and relayed to NATS after
-- the commit, so nothing decided is lost between a commit and a publish.
CREATE TABLE outbox (
    id         bigserial PRIMARY KEY,
    subject    text        NOT NULL,
    msg_id     text        NOT NULL,
    payload    bytea       NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
