//! The cross-service end-to-end suite: it starts the real `hark` binary as separate processes
//! against the real Postgres and nats-server.
