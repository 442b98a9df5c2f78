-- Keys that belong to a person: whoever holds one acts as its owner, with at most the owner's
-- role. Only a SHA-256 of the key is kept; the key itself is shown once, when it is made.
CREATE TABLE person_keys (
    id           uuid PRIMARY KEY,
    owner        text NOT NULL,
    name         text NOT NULL,
    role         text NOT NULL CHECK (role IN ('guest', 'user', 'admin')),
    key_hash     bytea NOT NULL UNIQUE,
    created_by   text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz,
    revoked_at   timestamptz,
    last_used_at timestamptz
);

CREATE INDEX person_keys_by_owner ON person_keys (owner, created_at);
