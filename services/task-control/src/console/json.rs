//! What the console's page reads: `hark.v1` messages as JSON, times as milliseconds since the
//! epoch and enums as lower-case words (`waiting_input`, `answered`).

use hark_proto::v1 as pb;
use serde_json::{Value, json};

/// A proto enum's value name without its prefix, lower case: `TASK_STATE_WAITING_INPUT` →
/// `waiting_input`.
fn word(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix)
        .unwrap_or(name)
        .to_ascii_lowercase()
}

pub fn state(value: i32) -> String {
    pb::TaskState::try_from(value)
        .map(|s| word(s.as_str_name(), "TASK_STATE_"))
        .unwrap_or_default()
}

fn outcome(value: i32) -> String {
    pb::QuestionOutcome::try_from(value)
        .map(|s| word(s.as_str_name(), "QUESTION_OUTCOME_"))
        .unwrap_or_default()
}

fn on_timeout(value: i32) -> String {
    pb::TimeoutPolicy::try_from(value)
        .map(|s| word(s.as_str_name(), "TIMEOUT_POLICY_"))
        .unwrap_or_default()
}

pub fn millis(t: Option<&prost_types::Timestamp>) -> Value {
    t.map_or(Value::Null, |t| {
        json!(t.seconds * 1000 + i64::from(t.nanos / 1_000_000))
    })
}

fn route(route: Option<&pb::ChatRoute>) -> Value {
    route.map_or(
        Value::Null,
        |r| json!({"platform": r.platform, "bot_id": r.bot_id, "stream": r.stream}),
    )
}

fn field(f: &pb::FormField) -> Value {
    json!({
        "key": f.key,
        "title": f.title,
        "type": f.r#type,
        "choices": f.choices,
        "labels": f.labels,
        "required": f.required,
        "multiple": f.multiple,
        "default": serde_json::from_str::<Value>(&f.default_json).unwrap_or(Value::Null),
    })
}

pub fn question(q: &pb::Question) -> Value {
    json!({
        "id": q.id,
        "task_id": q.task_id,
        "handle": q.handle,
        "text": q.text,
        "context": q.context,
        "owner": q.owner,
        "chat": route(q.chat.as_ref()),
        "outcome": outcome(q.outcome),
        "asked_at": millis(q.asked_at.as_ref()),
        "deadline": millis(q.deadline.as_ref()),
        "reminded_at": millis(q.reminded_at.as_ref()),
        "closed_at": millis(q.closed_at.as_ref()),
        "answerer": q.answerer,
        "answer": q.answer,
        "kind": q.kind,
        "choices": q.choices,
        "multiple": q.multiple,
        "fields": q.fields.iter().map(field).collect::<Vec<_>>(),
        "escalate_to": q.escalate_to,
        "escalate_at": millis(q.escalate_at.as_ref()),
        "ask_group": q.ask_group,
        "need": q.need,
        "askees": q.askees,
        "undelivered": q.undelivered,
    })
}

pub fn task(t: &pb::Task) -> Value {
    json!({
        "id": t.id,
        "owner": t.owner,
        "chat": route(t.chat.as_ref()),
        "goal": t.goal,
        "state": state(t.state),
        "generation": t.generation,
        "attempt": t.attempt,
        "on_timeout": on_timeout(t.on_timeout),
        "rounds": t.rounds,
        "result": t.result,
        "error": t.error,
        "created_at": millis(t.created_at.as_ref()),
        "updated_at": millis(t.updated_at.as_ref()),
        "finished_at": millis(t.finished_at.as_ref()),
        "open_question": t.open_question.as_ref().map_or(Value::Null, question),
        "questionnaire": !t.questionnaire.is_empty(),
        "kind": if !t.asked_by.is_empty() { "external" } else if t.questionnaire.is_empty() { "agent" } else { "questionnaire" },
        "asked_by": t.asked_by,
        "pause_requested": t.pause_requested,
        "priority": t.priority,
        "deadline": millis(t.deadline.as_ref()),
        "on_deadline": pb::DeadlinePolicy::try_from(t.on_deadline)
            .map(|p| word(p.as_str_name(), "DEADLINE_POLICY_"))
            .unwrap_or_default(),
    })
}

pub fn event(e: &pb::TaskEvent) -> Value {
    json!({
        "task_id": e.task_id,
        "state": state(e.state),
        "generation": e.generation,
        "cause": e.cause,
        "at": millis(e.at.as_ref()),
        "owner": e.owner,
        "result": e.result,
        "error": e.error,
        "question": e.question.as_ref().map_or(Value::Null, question),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_read_as_words_and_times_as_milliseconds() {
        assert_eq!(state(pb::TaskState::WaitingInput as i32), "waiting_input");
        assert_eq!(outcome(pb::QuestionOutcome::Answered as i32), "answered");
        assert_eq!(on_timeout(pb::TimeoutPolicy::Never as i32), "never");
        assert_eq!(state(99), "");
        let t = prost_types::Timestamp {
            seconds: 1_800_000_000,
            nanos: 250_000_000,
        };
        assert_eq!(millis(Some(&t)), json!(1_800_000_000_250_i64));
        assert_eq!(millis(None), Value::Null);
    }

    #[test]
    fn a_form_field_s_default_is_json_or_nothing() {
        let with = pb::FormField {
            key: "n".into(),
            default_json: "3".into(),
            ..Default::default()
        };
        assert_eq!(field(&with)["default"], json!(3));
        assert_eq!(field(&pb::FormField::default())["default"], Value::Null);
    }
}
