-- The relay deletes published messages by (subject, msg_id), and the sweep takes old rows first.
CREATE INDEX outbox_by_msg ON outbox (msg_id);
CREATE INDEX outbox_by_age ON outbox (created_at);
