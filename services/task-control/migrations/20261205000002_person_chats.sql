-- The chats each person was seen speaking in, through which bot, and when last: where hark may
-- ask them without being told (their private chat, through the bot that last saw them), and
-- which chats a key of theirs may name.
CREATE TABLE person_chats (
    owner        text NOT NULL,
    platform     text NOT NULL,
    bot_id       text NOT NULL,
    stream       text NOT NULL,
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (owner, platform, bot_id, stream)
);

CREATE INDEX person_chats_by_last_seen ON person_chats (owner, last_seen_at DESC);
