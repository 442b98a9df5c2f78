-- The W3C trace context an outbox message is published with: the trace of what caused it.
ALTER TABLE outbox ADD COLUMN traceparent text;
