//! A questionnaire: no model runs; the owner is asked each question in turn, and the task
//! completes with the answers. Each round of its checkpoint is one record, the answers so far
//! and the question it asks, so a step read again after a crash asks the same question.

use hark_proto::v1 as pb;
use serde_json::{Map, Value, json};

/// The tool call id a question of `key` is asked under; its answer comes back under it.
pub fn call_id(key: &str) -> String {
    format!("form:{key}")
}

/// The answers so far, from the messages of a questionnaire's last round.
pub fn answers_of(messages: &[u8]) -> Result<Map<String, Value>, String> {
    let records: Vec<Value> = serde_json::from_slice(messages).map_err(|e| e.to_string())?;
    match records.last().map(|r| r.get("answers")) {
        Some(Some(Value::Object(answers))) => Ok(answers.clone()),
        _ => Err("it holds no answers".into()),
    }
}

/// Records the answer a resume brings: its text, or null when the deadline passed.
pub fn record(answers: &mut Map<String, Value>, resume: &pb::Resume) {
    if let Some(key) = resume.tool_call_id.strip_prefix("form:") {
        let value = if resume.expired {
            Value::Null
        } else {
            Value::String(resume.text.clone())
        };
        answers.insert(key.to_owned(), value);
    }
}

/// The first question not answered yet.
pub fn next<'a>(
    questions: &'a [pb::FormQuestion],
    answers: &Map<String, Value>,
) -> Option<&'a pb::FormQuestion> {
    questions.iter().find(|q| !answers.contains_key(&q.key))
}

/// The record of one step: the answers so far and the question it asks, if any.
pub fn step(answers: &Map<String, Value>, asking: Option<&str>) -> Value {
    json!({"role": "questionnaire", "answers": answers, "asking": asking})
}

/// The output: a JSON object of each question's key and its answer, in the questions' order.
pub fn output(questions: &[pb::FormQuestion], answers: &Map<String, Value>) -> String {
    let fields: Vec<String> = questions
        .iter()
        .map(|q| {
            let value = answers.get(&q.key).cloned().unwrap_or(Value::Null);
            format!("{}:{value}", Value::String(q.key.clone()))
        })
        .collect();
    format!("{{{}}}", fields.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question(key: &str) -> pb::FormQuestion {
        pb::FormQuestion {
            key: key.into(),
            text: format!("{key}?"),
            choices: vec![],
        }
    }

    #[test]
    fn a_questionnaire_asks_in_turn_records_answers_and_keeps_its_order() {
        let questions = [question("name"), question("b"), question("a")];
        let mut answers = Map::new();
        assert_eq!(
            next(&questions, &answers).map(|q| q.key.as_str()),
            Some("name")
        );
        record(
            &mut answers,
            &pb::Resume {
                tool_call_id: call_id("name"),
                text: "小明".into(),
                ..Default::default()
            },
        );
        record(
            &mut answers,
            &pb::Resume {
                tool_call_id: call_id("b"),
                expired: true,
                text: "no answer came".into(),
                ..Default::default()
            },
        );
        assert_eq!(
            next(&questions, &answers).map(|q| q.key.as_str()),
            Some("a")
        );
        // A step's record reads back.
        let stored = serde_json::to_vec(&[step(&answers, Some("a"))]).expect("json");
        assert_eq!(answers_of(&stored).expect("answers"), answers);
        answers.insert("a".into(), "yes".into());
        assert_eq!(next(&questions, &answers), None);
        let out = output(&questions, &answers);
        assert_eq!(out, r#"{"name":"小明","b":null,"a":"yes"}"#);
        let parsed: Value = serde_json::from_str(&out).expect("the output is JSON");
        assert_eq!(parsed["name"], "小明");
        assert!(answers_of(b"[{}]").is_err());
        assert!(answers_of(b"not json").is_err());
    }
}
