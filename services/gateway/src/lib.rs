//! gateway: the only place that knows a chat platform's wire format. It turns inbound OneBot v11
//! and HTTP events into normalised `ChatMessage`s on `CHAT_IN` and delivers `CHAT_OUT` messages
//! for the bots it holds.
