//! Rows as `hark.v1` messages.

use hark_proto::v1 as pb;
use time::OffsetDateTime;

use hark_core::domain::{TaskState, form::FormQuestion, shape::Shape};

use crate::rows::{ChatRoute, Instruction, QuestionRow, ScheduleRow, TaskRow};

/// The most of a task's output an event carries; beyond it the event says it was cut.
pub const EVENT_RESULT_MAX: usize = 64 * 1024;

/// The event that says where `row` stands, caused by `cause`, with what changed: the output
/// when it completed, the error when it failed or was cancelled, and `question` when it waits.
pub fn event(row: &TaskRow, cause: &str, question: Option<pb::Question>) -> pb::TaskEvent {
    let (result, result_truncated) = match (&row.result, row.state) {
        (Some(result), TaskState::Completed) => {
            let cut = hark_core::domain::text::floor_char_boundary(result, EVENT_RESULT_MAX);
            (result[..cut].to_owned(), cut < result.len())
        }
        _ => (String::new(), false),
    };
    pb::TaskEvent {
        version: hark_proto::WIRE_VERSION,
        task_id: row.id.to_string(),
        state: row.state.to_proto() as i32,
        generation: row.generation as u64,
        cause: cause.to_owned(),
        at: Some(timestamp(row.updated_at)),
        owner: row.owner.to_string(),
        result,
        result_truncated,
        error: match row.state {
            TaskState::Failed | TaskState::Cancelled => row.error.clone().unwrap_or_default(),
            _ => String::new(),
        },
        question: question.filter(|_| row.state == TaskState::WaitingInput),
    }
}

pub fn timestamp(t: OffsetDateTime) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.unix_timestamp(),
        nanos: t.nanosecond() as i32,
    }
}

pub fn route(route: &ChatRoute) -> pb::ChatRoute {
    pb::ChatRoute {
        platform: route.platform.clone(),
        bot_id: route.bot_id.clone(),
        stream: route.stream.clone(),
        origin_message_id: route.origin_message_id.clone().unwrap_or_default(),
    }
}

pub fn instruction(i: Instruction) -> pb::Instruction {
    pb::Instruction {
        id: i.id.to_string(),
        text: i.text,
        author: i.author,
    }
}

pub fn task(row: &TaskRow, open_question: Option<&QuestionRow>) -> pb::Task {
    pb::Task {
        id: row.id.to_string(),
        owner: row.owner.to_string(),
        chat: row.chat().map(|c| route(&c)),
        goal: row.goal.clone(),
        state: row.state.to_proto() as i32,
        generation: row.generation as u64,
        attempt: row.attempt as u32,
        on_timeout: row.on_timeout.to_proto() as i32,
        ask_timeout_s: row.ask_timeout_s as u32,
        rounds: row.rounds as u32,
        result: row.result.clone().unwrap_or_default(),
        error: row.error.clone().unwrap_or_default(),
        created_at: Some(timestamp(row.created_at)),
        updated_at: Some(timestamp(row.updated_at)),
        finished_at: row.finished_at.map(timestamp),
        open_question: open_question.map(question),
        questionnaire: row.questionnaire().iter().map(form_question).collect(),
        pause_requested: row.pause_requested,
        paused_at: row.paused_at.map(timestamp),
        deadline: row.deadline_at.map(timestamp),
        on_deadline: row.on_deadline.to_proto() as i32,
        schedule_id: row.schedule_id.map(|s| s.to_string()).unwrap_or_default(),
        priority: row.priority.into(),
        asked_by: row.asked_by.clone().unwrap_or_default(),
    }
}

pub fn schedule(row: &ScheduleRow) -> pb::Schedule {
    pb::Schedule {
        id: row.id.to_string(),
        owner: row.owner.to_string(),
        goal: row.goal.clone(),
        chat: row.chat().map(|c| route(&c)),
        cron: row.cron.clone().unwrap_or_default(),
        timezone: row.timezone.clone(),
        state: row.state.as_str().to_owned(),
        next_run_at: row.next_run.map(timestamp),
        runs: row.runs.max(0) as u32,
        skipped: row.skipped.max(0) as u32,
        last_task_id: row.last_task.map(|t| t.to_string()).unwrap_or_default(),
        created_at: Some(timestamp(row.created_at)),
        priority: row.priority.into(),
    }
}

pub fn person_key(row: &crate::rows::KeyRow) -> pb::PersonKey {
    pb::PersonKey {
        id: row.id.to_string(),
        owner: row.owner.to_string(),
        name: row.name.clone(),
        role: row.role.as_str().to_owned(),
        created_by: row.created_by.clone(),
        created_at: Some(timestamp(row.created_at)),
        expires_at: row.expires_at.map(timestamp),
        revoked_at: row.revoked_at.map(timestamp),
        last_used_at: row.last_used_at.map(timestamp),
    }
}

pub fn question(q: &QuestionRow) -> pb::Question {
    pb::Question {
        id: q.id.to_string(),
        task_id: q.task_id.to_string(),
        handle: q.handle.clone(),
        text: q.text.clone(),
        context: q.context.clone(),
        owner: q.owner.to_string(),
        chat: match (&q.platform, &q.stream) {
            (Some(platform), Some(stream)) => Some(pb::ChatRoute {
                platform: platform.clone(),
                bot_id: q.bot_id.clone().unwrap_or_default(),
                stream: stream.clone(),
                origin_message_id: String::new(),
            }),
            _ => None,
        },
        outcome: q.outcome.to_proto() as i32,
        asked_at: Some(timestamp(q.asked_at)),
        deadline: q.deadline.map(timestamp),
        reminded_at: q.reminded_at.map(timestamp),
        closed_at: q.closed_at.map(timestamp),
        answerer: q.answerer.clone().unwrap_or_default(),
        answer: q.answer.clone().unwrap_or_default(),
        chat_message_id: q.chat_message_id.clone().unwrap_or_default(),
        escalate_to: q.escalate_to.clone(),
        escalate_at: q.escalate_at.map(timestamp),
        ask_group: q.ask_group.map(|g| g.to_string()).unwrap_or_default(),
        need: u32::try_from(q.need).unwrap_or(1),
        askees: u32::try_from(q.askees).unwrap_or(1),
        undelivered: q.undelivered.clone().unwrap_or_default(),
        ..shaped(&q.shape())
    }
}

/// A task as an agent sees it in a list: goal, result and error cut short.
pub fn task_summary(row: &TaskRow) -> pb::TaskSummary {
    let short = |text: &str| crate::render::clip(text, 300);
    pb::TaskSummary {
        id: row.id.to_string(),
        goal: short(&row.goal),
        state: row.state.as_str().to_owned(),
        created_at: row
            .created_at
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default(),
        result: row.result.as_deref().map(short).unwrap_or_default(),
        error: row.error.as_deref().map(short).unwrap_or_default(),
    }
}

/// A question's shape, as the proto's `kind`, `choices`, `multiple` and `fields` carry it.
pub fn shaped(shape: &Shape) -> pb::Question {
    let (kind, choices, multiple, fields) = shape.to_proto();
    pb::Question {
        kind,
        choices,
        multiple,
        fields,
        ..Default::default()
    }
}

pub fn form_question(q: &FormQuestion) -> pb::FormQuestion {
    let (kind, choices, multiple, fields) = q.shape().to_proto();
    pb::FormQuestion {
        key: q.key.clone(),
        text: q.text.clone(),
        choices,
        kind,
        multiple,
        fields,
        escalate_to: q.escalate_to.clone(),
        escalate_after_s: q.escalate_after_s,
        ask_to: q.ask_to.clone(),
        need: q.need.clone(),
        context: q.context.clone(),
    }
}
