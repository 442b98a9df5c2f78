-- A task of the `external` kind holds one question an outside agent asked through hark's MCP
-- server with a person's key: no agent runs in hark for it. `asked_by` names the key (or the
-- operator) to the person; `key_id` counts the key's open questions and its rate.
ALTER TABLE tasks ADD COLUMN asked_by text, ADD COLUMN key_id uuid;

CREATE INDEX tasks_by_key ON tasks (key_id, created_at) WHERE key_id IS NOT NULL;

-- A tool a person approved for the rest of an MCP session (`permission_prompt`): later prompts
-- for it in that session are allowed without asking.
CREATE TABLE mcp_grants (
    key_id     uuid NOT NULL,
    session    text NOT NULL,
    tool       text NOT NULL,
    granted_by text NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (key_id, session, tool)
);
