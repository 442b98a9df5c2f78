//! What clients that wait on people are told: the event that says where a task stands now, the
//! wait of an answer for what the task does next, and the stream of many tasks' events that a
//! resume token continues.
//!
//! Events are published once each task's move committed, so a `GetTask` made after an event
//! arrived reads that move or a later one: there is one database, and every read goes to it.

use std::{collections::HashSet, time::Duration};

use async_nats::jetstream::{self, consumer::DeliverPolicy};
use futures_util::StreamExt;
use hark_core::{
    codec,
    domain::{Owner, QuestionId, TaskId, TaskState},
};
use hark_proto::v1 as pb;
use tokio::sync::mpsc;

use crate::{
    convert,
    shared::Shared,
    store::{self, Store, TaskRow},
    watchers::{Fed, Slot, Watch},
};

/// How long a wait looks for an event before it looks at the task row itself: events are
/// published best effort, and a lost one must not make a watcher wait for ever.
pub const RECHECK: Duration = Duration::from_secs(15);

/// The sending end of a stream to a client. Each item is boxed, so that the channel's buffer,
/// which one of the many streams a process serves allocates, costs a pointer a slot rather than
/// an event (measured: 26 KiB a stream before, with the events in place).
#[derive(Debug)]
pub struct Out<T>(mpsc::Sender<Box<T>>);

impl<T> Out<T> {
    pub async fn send(&self, item: T) -> Result<(), mpsc::error::SendError<Box<T>>> {
        self.0.send(Box::new(item)).await
    }

    /// Once the client went away.
    pub async fn closed(&self) {
        self.0.closed().await
    }
}

/// A stream to a client, `capacity` items deep, and its sending end.
pub fn channel<T: Send + 'static>(
    capacity: usize,
) -> (Out<T>, impl futures_util::Stream<Item = T> + Send + 'static) {
    let (tx, rx) = mpsc::channel(capacity);
    (
        Out(tx),
        tokio_stream::wrappers::ReceiverStream::new(rx).map(|item| *item),
    )
}

/// How long a `WatchTasks` stream waits for the process's feed of task events to start.
const FEED_WAIT: Duration = Duration::from_secs(10);

/// What a stream's client is told when task-control stops under it.
pub fn stopping() -> tonic::Status {
    tonic::Status::unavailable("task-control is stopping; watch again (another replica answers)")
}

/// What a stream's client is told when the events stop coming from NATS.
fn lost(why: &str) -> tonic::Status {
    tonic::Status::unavailable(format!(
        "task events stopped coming from NATS ({why}); watch again with the last resume_token"
    ))
}

/// The event that says where `row` stands now, with the question it waits on.
pub async fn current(store: &Store, row: &TaskRow) -> Result<pb::TaskEvent, store::Error> {
    let question = match row.state {
        TaskState::WaitingInput => store
            .open_question_of(row.id)
            .await?
            .map(|q| convert::question(&q)),
        _ => None,
    };
    Ok(convert::event(row, "current", question))
}

/// What an event says when the chat message of an open question was set aside, never
/// delivered: not a move, so it carries the generation of the task's last move.
pub const UNDELIVERED: &str = "undelivered";

/// Tells the task's watchers that the chat message of `question` was never delivered, with the
/// question as it now stands, while it is open. Best effort, as every task event is: a watcher
/// that misses it reads the reason with the question.
pub async fn told_undelivered(shared: &Shared, question: QuestionId) {
    let told = async {
        let question = shared
            .store
            .get_question(question)
            .await
            .map_err(|e| e.to_string())?;
        if question.outcome != hark_core::domain::QuestionOutcome::Open {
            return Ok(());
        }
        let row = shared
            .store
            .get_task(question.task_id)
            .await
            .map_err(|e| e.to_string())?;
        if row.state != TaskState::WaitingInput {
            return Ok(());
        }
        let event = convert::event(&row, UNDELIVERED, Some(convert::question(&question)));
        let msg_id = format!(
            "{}:{UNDELIVERED}:{}",
            hark_core::bus::Names::task_event_msg_id(row.id, row.generation as u64),
            question.id
        );
        hark_core::publish::publish(
            &shared.js,
            hark_core::publish::Outgoing {
                subject: shared.names.task_events(),
                msg_id: &msg_id,
                payload: codec::encode(event),
                trace: None,
            },
        )
        .await
        .map_err(|e| e.to_string())?;
        Ok::<(), String>(())
    };
    if let Err(e) = told.await {
        tracing::debug!(error = e, %question, "watchers were not told of an undelivered question");
    }
}

/// Whether `event`, of the generation `last` already passed on, is still news: it says that a
/// question of that move never reached its chat.
pub fn news_of_same_move(event: &pb::TaskEvent, last: u64) -> bool {
    event.generation == last && event.cause == UNDELIVERED
}

fn state_of(event: &pb::TaskEvent) -> Option<TaskState> {
    pb::TaskState::try_from(event.state)
        .ok()
        .and_then(TaskState::from_proto)
}

/// Whether `event` is what an answer to `answered` waits for: the task asked another question,
/// or ended, or stands paused (it goes on only once resumed).
fn asked_again_or_ended(event: &pb::TaskEvent, answered: QuestionId) -> bool {
    match state_of(event) {
        Some(state) if state.is_terminal() || state == TaskState::Paused => true,
        Some(TaskState::WaitingInput) => event
            .question
            .as_ref()
            .is_none_or(|q| q.id != answered.to_string()),
        _ => false,
    }
}

/// Waits, at most `timeout`, until the task of `watch` asked a question other than `answered`
/// or ended, and returns that event; `None` when the time ran out. `after` is the task as the
/// answer left it: if it already asked again or ended, that is the answer at once.
pub async fn next_question_or_end(
    store: &Store,
    mut watch: Watch,
    after: &TaskRow,
    answered: QuestionId,
    timeout: Duration,
) -> Result<Option<pb::TaskEvent>, store::Error> {
    let deadline = tokio::time::Instant::now() + timeout;
    let now = current(store, after).await?;
    if asked_again_or_ended(&now, answered) {
        return Ok(Some(now));
    }
    let mut last = after.generation as u64;
    let stop = watch.stopping();
    loop {
        let event = tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return Ok(None),
            // The answer stands; the wait ends with the process.
            _ = stop.cancelled() => return Ok(None),
            event = watch.next() => match event {
                Some(event) => event,
                None => return Ok(None),
            },
            _ = tokio::time::sleep(RECHECK) => {
                let row = store.get_task(after.id).await?;
                if row.generation as u64 <= last {
                    continue;
                }
                current(store, &row).await?
            }
        };
        if event.generation <= last {
            continue;
        }
        last = event.generation;
        if asked_again_or_ended(&event, answered) {
            return Ok(Some(event));
        }
    }
}

/// Which events a `WatchTasks` stream passes on.
#[derive(Debug, Default, Clone)]
pub struct Filter {
    pub owner: Option<Owner>,
    pub states: Vec<TaskState>,
    pub tasks: HashSet<TaskId>,
}

impl Filter {
    fn passes(&self, event: &pb::TaskEvent) -> bool {
        if let Some(owner) = &self.owner
            && event.owner != owner.to_string()
        {
            return false;
        }
        if !self.states.is_empty() && !state_of(event).is_some_and(|s| self.states.contains(&s)) {
            return false;
        }
        self.tasks.is_empty()
            || event
                .task_id
                .parse::<TaskId>()
                .is_ok_and(|t| self.tasks.contains(&t))
    }
}

/// A place in the stream of task events: the stream (by when it was made, so a stream made
/// anew is told from the old one) and the sequence of the last event passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    pub stream_created_ns: i128,
    pub sequence: u64,
}

impl Token {
    pub fn encode(self) -> String {
        format!("1.{:x}.{}", self.stream_created_ns, self.sequence)
    }

    pub fn decode(token: &str) -> Option<Self> {
        let mut parts = token.split('.');
        let (Some("1"), Some(created), Some(sequence), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        Some(Self {
            stream_created_ns: i128::from_str_radix(created, 16).ok()?,
            sequence: sequence.parse().ok()?,
        })
    }
}

/// Why a stream of task events could not start.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("resume_token: not a token WatchTasks gave")]
    BadToken,
    #[error(
        "resume_token: the events after it are gone (they are kept for an hour, and not across a NATS restart); list the tasks again and watch from now"
    )]
    Gone,
    #[error("task events cannot be read from NATS now: {0}; try again")]
    Unavailable(String),
}

/// Starts a stream of the events that pass `filter`, from now or after `resume`; each goes out
/// with the token that continues after it. The stream ends when its receiver is dropped.
///
/// Live events come from the process's one feed ([`crate::watchers::Watchers::feed`]); only a
/// stream that resumes reads the events it missed with a consumer of its own, which it drops once
/// it has caught up with the feed.
pub async fn watch_many(
    shared: &Shared,
    filter: Filter,
    resume: Option<&str>,
    slot: Slot,
) -> Result<
    impl futures_util::Stream<Item = Result<pb::WatchTasksResponse, tonic::Status>> + Send + use<>,
    WatchError,
> {
    let unavailable = |e: &dyn std::fmt::Display| WatchError::Unavailable(e.to_string());
    // Taken once the feed reads the stream, and before the stream's state is read: every event
    // after that state reaches this stream through the feed.
    tokio::time::timeout(FEED_WAIT, slot.feeding().cancelled())
        .await
        .map_err(|_| unavailable(&"the feed of task events has not started"))?;
    let mut feed = slot.feed();
    // The stream lives in NATS's memory: after a NATS restart it is made again here, and a token
    // from before is told apart by the stream's creation time.
    let config = shared
        .names
        .stream_configs()
        .into_iter()
        .find(|c| c.name == shared.names.task_events_stream())
        .ok_or_else(|| WatchError::Unavailable("no task event stream is configured".into()))?;
    let mut stream = shared
        .js
        .get_or_create_stream(config)
        .await
        .map_err(|e| unavailable(&e))?;
    let info = stream.info().await.map_err(|e| unavailable(&e))?;
    let created = info.created.unix_timestamp_nanos();
    let last = info.state.last_sequence;
    // The events from after the token up to the stream's end now, read on their own.
    let missed = match resume {
        None => None,
        Some(token) => {
            let token = Token::decode(token).ok_or(WatchError::BadToken)?;
            let next = token.sequence + 1;
            // The stream was made anew, the token is from its future, or events after it were
            // dropped already.
            if token.stream_created_ns != created
                || token.sequence > last
                || next < info.state.first_sequence
            {
                return Err(WatchError::Gone);
            }
            if next > last {
                None
            } else {
                let consumer = stream
                    .create_consumer(jetstream::consumer::pull::OrderedConfig {
                        filter_subject: shared.names.task_events(),
                        deliver_policy: DeliverPolicy::ByStartSequence {
                            start_sequence: next,
                        },
                        ..Default::default()
                    })
                    .await
                    .map_err(|e| unavailable(&e))?;
                let name = consumer.cached_info().name.clone();
                let messages = consumer.messages().await.map_err(|e| unavailable(&e))?;
                Some((name, messages))
            }
        }
    };
    let (tx, rx) = channel(64);
    let stop = slot.stopping();
    tokio::spawn(async move {
        let _slot = slot;
        // The last event gone out (or passed over): each goes out once, in the stream's order.
        let mut sent = last;
        let pass = |sequence: u64, event: pb::TaskEvent| {
            filter.passes(&event).then(|| pb::WatchTasksResponse {
                event: Some(event),
                resume_token: Token {
                    stream_created_ns: created,
                    sequence,
                }
                .encode(),
            })
        };
        if let Some((name, mut messages)) = missed {
            // Catching up ends where the feed takes over.
            loop {
                let message = tokio::select! {
                    _ = tx.closed() => return,
                    _ = stop.cancelled() => {
                        let _ = tx.send(Err(stopping())).await;
                        return;
                    }
                    message = messages.next() => message,
                };
                let message = match message {
                    Some(Ok(message)) => message,
                    Some(Err(e)) => {
                        let _ = tx.send(Err(lost(&e.to_string()))).await;
                        return;
                    }
                    None => {
                        let _ = tx.send(Err(lost("the stream ended"))).await;
                        return;
                    }
                };
                let Ok(info) = message.info() else { continue };
                let sequence = info.stream_sequence;
                if let Ok(event) = codec::decode::<pb::TaskEvent>(&message.payload)
                    && let Some(response) = pass(sequence, event)
                    && tx.send(Ok(response)).await.is_err()
                {
                    return;
                }
                if sequence >= last {
                    sent = sequence;
                    break;
                }
            }
            // Deleted once caught up; if this process dies first, NATS forgets it in 30 s.
            drop(messages);
            if let Err(e) = stream.delete_consumer(&name).await {
                tracing::debug!(error = %e, "cannot delete a caught-up consumer; NATS forgets it soon");
            }
        }
        loop {
            let fed = tokio::select! {
                _ = tx.closed() => return,
                _ = stop.cancelled() => {
                    let _ = tx.send(Err(stopping())).await;
                    return;
                }
                fed = feed.recv() => fed,
            };
            let fed = match fed {
                Ok(fed) => fed,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    let why = format!("this stream fell {missed} events behind");
                    let _ = tx.send(Err(lost(&why))).await;
                    return;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    let _ = tx.send(Err(stopping())).await;
                    return;
                }
            };
            match &*fed {
                Fed::Lost(why) => {
                    let _ = tx.send(Err(lost(why))).await;
                    return;
                }
                Fed::Event {
                    created: made,
                    sequence,
                    event,
                } => {
                    if *made != created {
                        let _ = tx
                            .send(Err(lost("the stream of task events was made anew")))
                            .await;
                        return;
                    }
                    if *sequence <= sent {
                        continue;
                    }
                    sent = *sequence;
                    if let Some(response) = pass(*sequence, (**event).clone())
                        && tx.send(Ok(response)).await.is_err()
                    {
                        return;
                    }
                }
            }
        }
    });
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_reads_back_and_anything_else_is_refused() {
        let token = Token {
            stream_created_ns: 1_796_000_000_123_456_789,
            sequence: 42,
        };
        assert_eq!(Token::decode(&token.encode()), Some(token));
        for bad in ["", "42", "1.zz.3", "2.10.3", "1.10.3.4", "1.10.-1"] {
            assert_eq!(Token::decode(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_filter_passes_only_what_it_names() {
        let task = TaskId::new();
        let event = pb::TaskEvent {
            task_id: task.to_string(),
            owner: "qq:1".into(),
            state: pb::TaskState::WaitingInput as i32,
            ..Default::default()
        };
        assert!(Filter::default().passes(&event));
        let owner = Filter {
            owner: Some("qq:1".parse().expect("owner")),
            ..Default::default()
        };
        assert!(owner.passes(&event));
        let other = Filter {
            owner: Some("qq:2".parse().expect("owner")),
            ..Default::default()
        };
        assert!(!other.passes(&event));
        let states = Filter {
            states: vec![TaskState::Completed],
            ..Default::default()
        };
        assert!(!states.passes(&event));
        let tasks = Filter {
            tasks: [TaskId::new()].into(),
            ..Default::default()
        };
        assert!(!tasks.passes(&event));
        let this = Filter {
            tasks: [task].into(),
            states: vec![TaskState::WaitingInput],
            ..Default::default()
        };
        assert!(this.passes(&event));
    }

    #[test]
    fn an_answer_waits_for_another_question_or_the_end() {
        let answered = QuestionId::new();
        let waiting_on = |id: String| pb::TaskEvent {
            state: pb::TaskState::WaitingInput as i32,
            question: Some(pb::Question {
                id,
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(!asked_again_or_ended(
            &waiting_on(answered.to_string()),
            answered
        ));
        assert!(asked_again_or_ended(
            &waiting_on(QuestionId::new().to_string()),
            answered
        ));
        let state = |s: pb::TaskState| pb::TaskEvent {
            state: s as i32,
            ..Default::default()
        };
        assert!(!asked_again_or_ended(
            &state(pb::TaskState::Pending),
            answered
        ));
        assert!(!asked_again_or_ended(
            &state(pb::TaskState::Running),
            answered
        ));
        for end in [
            pb::TaskState::Completed,
            pb::TaskState::Failed,
            pb::TaskState::Cancelled,
        ] {
            assert!(asked_again_or_ended(&state(end), answered));
        }
    }
}
