//! Rows as they come out of Postgres, already parsed into domain types, and the few plain values
//! that go into them. The store reads and writes them; [`crate::convert`] turns them into
//! `hark.v1` messages.

use hark_core::domain::{
    DeadlinePolicy, Owner, QuestionId, QuestionOutcome, Role, TaskId, TaskState, TimeoutPolicy,
    form::FormQuestion,
    schedule::{Overlap, ScheduleState},
    shape::Shape,
};
use sqlx::types::Json;
use time::OffsetDateTime;
use uuid::Uuid;

/// The chat a task talks in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatRoute {
    pub platform: String,
    pub bot_id: String,
    pub stream: String,
    pub origin_message_id: Option<String>,
}

impl ChatRoute {
    /// The route of a row's nullable columns; `None` for a row without a chat.
    pub fn of(
        platform: &Option<String>,
        bot_id: &Option<String>,
        stream: &Option<String>,
        origin_message_id: &Option<String>,
    ) -> Option<ChatRoute> {
        Some(ChatRoute {
            platform: platform.clone()?,
            bot_id: bot_id.clone().unwrap_or_default(),
            stream: stream.clone()?,
            origin_message_id: origin_message_id.clone(),
        })
    }
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TaskRow {
    #[sqlx(try_from = "Uuid")]
    pub id: TaskId,
    #[sqlx(try_from = "String")]
    pub owner: Owner,
    pub platform: Option<String>,
    pub bot_id: Option<String>,
    pub stream: Option<String>,
    pub origin_message_id: Option<String>,
    pub goal: String,
    #[sqlx(try_from = "String")]
    pub state: TaskState,
    pub generation: i64,
    pub attempt: i32,
    pub worker_id: Option<String>,
    pub lease_until: Option<OffsetDateTime>,
    #[sqlx(try_from = "String")]
    pub on_timeout: TimeoutPolicy,
    pub ask_timeout_s: i32,
    pub rounds: i32,
    pub result: Option<String>,
    pub error: Option<String>,
    pub run_ms: i64,
    pub running_since: Option<OffsetDateTime>,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
    pub finished_at: Option<OffsetDateTime>,
    /// The questions of a questionnaire; `None` for an agent task.
    pub questionnaire: Option<Json<Vec<FormQuestion>>>,
    /// A running task that is to pause at its next round boundary.
    pub pause_requested: bool,
    /// When a paused task stopped.
    pub paused_at: Option<OffsetDateTime>,
    /// The schedule whose run started it.
    pub schedule_id: Option<Uuid>,
    /// Claimed before every pending task of a lower priority.
    pub priority: i16,
    /// When the task ends by `on_deadline` if it has not ended by itself.
    pub deadline_at: Option<OffsetDateTime>,
    #[sqlx(try_from = "String")]
    pub on_deadline: DeadlinePolicy,
    /// Of an `external` task, the one question an outside agent asked through hark's MCP
    /// server: the name of the key that asked it (or the operator's door).
    pub asked_by: Option<String>,
    /// The person's key that asked it.
    pub key_id: Option<Uuid>,
}

/// The columns of a task the lifecycle decides on, as every statement that feeds
/// [`decide`](hark_core::domain::decide::decide) reads them (`lifecycle_columns!` in the store).
/// [`Lifecycle::task`] is the one place a [`decide::Task`](hark_core::domain::decide::Task) is
/// built from a row.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Lifecycle {
    #[sqlx(rename = "task_state", try_from = "String")]
    pub state: TaskState,
    #[sqlx(rename = "task_on_timeout", try_from = "String")]
    pub on_timeout: TimeoutPolicy,
    #[sqlx(rename = "task_attempt")]
    pub attempt: i32,
    #[sqlx(rename = "task_pause_requested")]
    pub pause_requested: bool,
    /// When a paused task stopped; its last change where that was not recorded.
    #[sqlx(rename = "task_paused_since")]
    pub paused_since: OffsetDateTime,
    /// The default wait of its questions, in seconds; 0: none.
    #[sqlx(rename = "task_ask_timeout_s")]
    pub ask_timeout_s: i32,
}

impl Lifecycle {
    /// How a question it asks waits, with the ask's `own` timeout.
    pub fn wait(&self, own: Option<std::time::Duration>) -> hark_core::domain::decide::Wait {
        hark_core::domain::decide::Wait {
            on_timeout: self.on_timeout,
            ask_timeout: seconds(self.ask_timeout_s),
            own,
        }
    }

    /// The task as the lifecycle decides on it, with its open question when it has one; `None`
    /// for a task waiting on a question that is not open.
    pub fn task(
        &self,
        question: Option<hark_core::domain::decide::OpenQuestion>,
    ) -> Option<hark_core::domain::decide::Task> {
        use hark_core::domain::decide::State;
        let state = match self.state {
            TaskState::Pending => State::Pending,
            TaskState::Running => State::Running {
                pause_requested: self.pause_requested,
            },
            TaskState::WaitingInput => State::WaitingInput {
                question: question?,
            },
            TaskState::Paused => State::Paused {
                since: self.paused_since,
                question,
            },
            TaskState::Completed => State::Completed,
            TaskState::Failed => State::Failed,
            TaskState::Cancelled => State::Cancelled,
        };
        Some(hark_core::domain::decide::Task {
            state,
            on_timeout: self.on_timeout,
            attempt: self.attempt,
        })
    }
}

impl TaskRow {
    /// The columns of the row the lifecycle decides on.
    pub fn lifecycle_columns(&self) -> Lifecycle {
        Lifecycle {
            state: self.state,
            on_timeout: self.on_timeout,
            attempt: self.attempt,
            pause_requested: self.pause_requested,
            paused_since: self.paused_at.unwrap_or(self.updated_at),
            ask_timeout_s: self.ask_timeout_s,
        }
    }

    /// The columns [`TaskChat`] reads beside a question.
    pub fn chat_columns(&self) -> TaskChat {
        TaskChat {
            platform: self.platform.clone(),
            bot_id: self.bot_id.clone(),
            stream: self.stream.clone(),
            origin_message_id: self.origin_message_id.clone(),
            external: self.asked_by.is_some(),
        }
    }

    /// What never changes of the task once created: its chat, and how its questions wait.
    pub fn fixed(&self) -> Fixed {
        self.chat_columns().fixed(&self.lifecycle_columns())
    }

    /// The task as the lifecycle decides on it, with its open question when it waits on one.
    pub fn lifecycle(
        &self,
        question: Option<hark_core::domain::decide::OpenQuestion>,
    ) -> Option<hark_core::domain::decide::Task> {
        self.lifecycle_columns().task(question)
    }

    /// The questions of a questionnaire, none for an agent task.
    pub fn questionnaire(&self) -> &[FormQuestion] {
        self.questionnaire.as_ref().map_or(&[], |q| q.0.as_slice())
    }

    pub fn chat(&self) -> Option<ChatRoute> {
        ChatRoute::of(
            &self.platform,
            &self.bot_id,
            &self.stream,
            &self.origin_message_id,
        )
    }
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct QuestionRow {
    #[sqlx(try_from = "Uuid")]
    pub id: QuestionId,
    #[sqlx(try_from = "Uuid")]
    pub task_id: TaskId,
    pub handle: String,
    pub text: String,
    pub context: String,
    pub tool_call_id: String,
    pub round: i32,
    #[sqlx(try_from = "String")]
    pub owner: Owner,
    pub platform: Option<String>,
    pub bot_id: Option<String>,
    pub stream: Option<String>,
    #[sqlx(try_from = "String")]
    pub outcome: QuestionOutcome,
    pub asked_at: OffsetDateTime,
    pub deadline: Option<OffsetDateTime>,
    pub reminded_at: Option<OffsetDateTime>,
    pub closed_at: Option<OffsetDateTime>,
    pub answerer: Option<String>,
    pub answer: Option<String>,
    pub inbound_message_id: Option<String>,
    pub chat_message_id: Option<String>,
    /// What it accepts, as [`StoredShape`] keeps it (the column is `choices`).
    pub choices: Option<Json<StoredShape>>,
    /// The subtask it waits for, when it is asked of a task rather than of a person: that
    /// task's end answers it, and nobody else may.
    pub waits_for: Option<Uuid>,
    /// Whom it is asked of next, in order, should it stay unanswered until `escalate_at`.
    pub escalate_to: Vec<String>,
    pub escalate_at: Option<OffsetDateTime>,
    /// The first question of the ask it belongs to, when that ask was put to several people.
    pub ask_group: Option<Uuid>,
    /// How many answers of the ask's people resume its task, and how many it was put to at
    /// once.
    pub need: i16,
    pub askees: i16,
    /// Why its chat message could never be delivered, when none was.
    pub undelivered: Option<String>,
}

/// Another open question of the same ask, put to someone else: told when an answer closes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Sibling {
    pub id: String,
    pub owner: String,
    pub platform: Option<String>,
    pub bot_id: Option<String>,
    pub stream: Option<String>,
    pub handle: String,
    pub chat_message_id: Option<String>,
    #[serde(deserialize_with = "outcome_of")]
    pub outcome: QuestionOutcome,
    pub answerer: Option<String>,
    pub answer: Option<String>,
}

fn outcome_of<'de, D: serde::Deserializer<'de>>(d: D) -> Result<QuestionOutcome, D::Error> {
    let name = <String as serde::Deserialize>::deserialize(d)?;
    name.parse().map_err(serde::de::Error::custom)
}

/// A question's shape as the `choices` column keeps it: NULL for free text, the list of choices
/// for one choice (as before there were other shapes, so replicas that know only choices read
/// it), else the shape with its kind.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum StoredShape {
    Choices(Vec<String>),
    Shape(Shape),
}

impl StoredShape {
    /// The column's value for `shape`.
    pub fn of(shape: &Shape) -> Option<Json<StoredShape>> {
        match shape {
            Shape::Text => None,
            Shape::Choice {
                choices,
                multiple: false,
            } => Some(Json(StoredShape::Choices(choices.clone()))),
            shape => Some(Json(StoredShape::Shape(shape.clone()))),
        }
    }

    pub fn shape(&self) -> Shape {
        match self {
            StoredShape::Choices(choices) if choices.is_empty() => Shape::Text,
            StoredShape::Choices(choices) => Shape::Choice {
                choices: choices.clone(),
                multiple: false,
            },
            StoredShape::Shape(shape) => shape.clone(),
        }
    }
}

impl QuestionRow {
    /// The question `q` as the statement that asked it of `task` created it (`task` as that
    /// statement left it).
    pub fn asked(
        task: &TaskRow,
        q: Asked<'_>,
        tool_call_id: &str,
        round: i32,
        waits_for: Option<TaskId>,
    ) -> Self {
        Self {
            id: q.id,
            task_id: task.id,
            handle: q.handle.to_owned(),
            text: q.text.to_owned(),
            context: q.context.to_owned(),
            tool_call_id: tool_call_id.to_owned(),
            round,
            owner: task.owner.clone(),
            platform: task.platform.clone(),
            bot_id: task.bot_id.clone(),
            stream: task.stream.clone(),
            outcome: QuestionOutcome::Open,
            asked_at: task.updated_at,
            deadline: q.deadline,
            reminded_at: None,
            closed_at: None,
            answerer: None,
            answer: None,
            inbound_message_id: None,
            chat_message_id: None,
            choices: StoredShape::of(q.shape),
            waits_for: waits_for.map(|t| t.as_uuid()),
            escalate_to: Vec::new(),
            escalate_at: None,
            ask_group: None,
            need: 1,
            askees: 1,
            undelivered: None,
        }
    }

    /// The question as the lifecycle sees it, when it is open.
    pub fn open(&self) -> Option<hark_core::domain::decide::OpenQuestion> {
        self.outcome
            .is_open()
            .then(|| hark_core::domain::decide::OpenQuestion {
                handle: self.handle.clone(),
                text: self.text.clone(),
                asked_at: self.asked_at,
                deadline: self.deadline,
            })
    }

    /// The question as a statement that applied `answer` at `at` left it.
    pub fn answered_with(&mut self, answer: &Answer, at: OffsetDateTime) {
        self.outcome = QuestionOutcome::Answered;
        self.closed_at = Some(at);
        self.answerer = Some(answer.answerer.clone());
        self.answer = Some(answer.text.clone());
        self.inbound_message_id = answer.inbound_key.clone();
    }

    /// What it accepts.
    pub fn shape(&self) -> Shape {
        self.choices.as_ref().map_or(Shape::Text, |c| c.0.shape())
    }
}

/// One checkpointed round.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RoundRow {
    pub round: i32,
    pub messages: sqlx::types::Json<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Instruction {
    pub id: Uuid,
    pub text: String,
    pub author: String,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TransitionRow {
    pub from_state: Option<String>,
    pub to_state: String,
    pub event: String,
    pub generation: i64,
    pub actor: String,
    pub detail: String,
    pub at: OffsetDateTime,
}

/// A worker's right to a running task: it must match the row for any write to succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub task: TaskId,
    pub generation: i64,
    pub worker_id: String,
}

/// A question just asked of `task`'s owner, as the statement that asked it created it.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    pub id: hark_core::domain::QuestionId,
    pub handle: &'a str,
    pub text: &'a str,
    pub context: &'a str,
    pub shape: &'a Shape,
    pub deadline: Option<OffsetDateTime>,
}

/// An answer to apply.
#[derive(Debug, Clone)]
pub struct Answer {
    /// `platform:user_id`, or the API caller.
    pub answerer: String,
    pub text: String,
    /// A structured answer given as JSON (over the API), read instead of `text`.
    pub json: Option<serde_json::Value>,
    /// The inbound message (or request) id; the same key applied twice changes nothing.
    pub inbound_key: Option<String>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct ScheduleRow {
    pub id: Uuid,
    #[sqlx(try_from = "String")]
    pub owner: Owner,
    pub platform: Option<String>,
    pub bot_id: Option<String>,
    pub stream: Option<String>,
    pub origin_message_id: Option<String>,
    pub goal: String,
    #[sqlx(try_from = "String")]
    pub on_timeout: TimeoutPolicy,
    pub ask_timeout_s: i32,
    pub cron: Option<String>,
    pub timezone: String,
    #[sqlx(try_from = "String")]
    pub overlap: Overlap,
    #[sqlx(try_from = "String")]
    pub state: ScheduleState,
    pub next_run: Option<OffsetDateTime>,
    pub runs: i32,
    pub skipped: i32,
    pub last_task: Option<Uuid>,
    pub created_at: OffsetDateTime,
    pub priority: i16,
}

impl ScheduleRow {
    /// Its id in the short form people type, like a task's.
    pub fn short(&self) -> String {
        TaskId::from_uuid(self.id).short()
    }

    pub fn chat(&self) -> Option<ChatRoute> {
        ChatRoute::of(
            &self.platform,
            &self.bot_id,
            &self.stream,
            &self.origin_message_id,
        )
    }

    pub fn is_active(&self) -> bool {
        self.state == ScheduleState::Active
    }
}

/// What never changes of a task, read beside the question an answer goes to (`answer_target_columns!`
/// in the store), so that the answer needs no read of its own: with [`Lifecycle`], its
/// [`Fixed`].
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct TaskChat {
    #[sqlx(rename = "task_platform")]
    pub platform: Option<String>,
    #[sqlx(rename = "task_bot_id")]
    pub bot_id: Option<String>,
    #[sqlx(rename = "task_stream")]
    pub stream: Option<String>,
    #[sqlx(rename = "task_origin_message_id")]
    pub origin_message_id: Option<String>,
    /// Asked by an agent (an `external` task).
    #[sqlx(rename = "task_external")]
    pub external: bool,
}

impl TaskChat {
    /// What never changes of the task, with its lifecycle columns.
    pub fn fixed(&self, lifecycle: &Lifecycle) -> Fixed {
        Fixed {
            chat: ChatRoute::of(
                &self.platform,
                &self.bot_id,
                &self.stream,
                &self.origin_message_id,
            ),
            on_timeout: lifecycle.on_timeout,
            ask_timeout: seconds(lifecycle.ask_timeout_s),
            external: self.external,
        }
    }
}

/// What never changes of a task once created, kept to spare a read per write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixed {
    pub chat: Option<ChatRoute>,
    pub on_timeout: TimeoutPolicy,
    /// Its questions' default wait; zero: none.
    pub ask_timeout: std::time::Duration,
    /// An `external` task: the agent that asked gets the answer, and the chat is not told its
    /// end as well.
    pub external: bool,
}

impl Fixed {
    /// The chat told of the task's end: its chat, but none for an external task, whose end
    /// goes back to the agent that asked.
    pub fn end_told_in(&self) -> Option<&ChatRoute> {
        self.chat.as_ref().filter(|_| !self.external)
    }

    /// How a question the task asks waits, with the ask's `own` timeout.
    pub fn wait(&self, own: Option<std::time::Duration>) -> hark_core::domain::decide::Wait {
        hark_core::domain::decide::Wait {
            on_timeout: self.on_timeout,
            ask_timeout: self.ask_timeout,
            own,
        }
    }
}

/// A count of seconds from a column, none when negative.
fn seconds(s: i32) -> std::time::Duration {
    std::time::Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

/// A key as it is listed: everything but the key.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct KeyRow {
    pub id: Uuid,
    #[sqlx(try_from = "String")]
    pub owner: Owner,
    pub name: String,
    /// The most its holder may do; capped again by the owner's role when it is used.
    #[sqlx(try_from = "String")]
    pub role: Role,
    pub created_by: String,
    pub created_at: OffsetDateTime,
    pub expires_at: Option<OffsetDateTime>,
    pub revoked_at: Option<OffsetDateTime>,
    pub last_used_at: Option<OffsetDateTime>,
}

impl KeyRow {
    /// The first eight hex digits of its id, which name it to a person.
    pub fn short_id(&self) -> String {
        self.id.simple().to_string()[..8].to_owned()
    }
}
