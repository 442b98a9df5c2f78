//! Approval before acting: a call of a tool that needs its owner's consent is not run; hark
//! asks the owner instead, as an ordinary durable question of the approval shape, and the task
//! waits like any other. The answer resumes the task: approved, the call runs then (with the
//! arguments the owner changed, when they sent `key: value` lines); denied (with the reason the
//! owner gave, if any) or unanswered, the model reads that it did not run. "Approve for the rest
//! of this task" is kept in the checkpoint as a record the model never sees.

use std::collections::HashSet;

use hark_core::{config::Language, domain::shape::Shape};
use hark_proto::v1 as pb;
use serde_json::{Value, json};

use crate::{
    agent::PendingAsk,
    limits,
    llm::{self, ToolCall},
    mcp::Progress,
    tools::Checked,
};

/// The tool call id an approval is asked under: this prefix and the model's call id.
pub const CALL_PREFIX: &str = "approve:";
/// The tool call id a server's input request is asked under: this prefix and the call's id.
pub const ELICIT_PREFIX: &str = "elicit:";

/// Whether a question's tool call id is one hark asked on a call's behalf.
pub fn asked_by_hark(tool_call_id: &str) -> bool {
    tool_call_id.starts_with(CALL_PREFIX) || tool_call_id.starts_with(ELICIT_PREFIX)
}

/// The question for a server's input request during the call `call_id` of `tool`.
pub(crate) fn elicitation(tool: &str, call_id: &str, message: &str, shape: Shape) -> PendingAsk {
    PendingAsk {
        call_id: format!("{ELICIT_PREFIX}{call_id}"),
        question: format!("`{tool}`: {}", limits::cut(message, limits::MAX_QUESTION)),
        context: String::new(),
        timeout_s: 0,
        escalate_to: Vec::new(),
        escalate_after_s: 0,
        ask_to: Vec::new(),
        need: String::new(),
        shape,
        waits_for: String::new(),
    }
}

/// The record of the owner's answer to an input request of the call `call_id` (`None`: declined
/// or unanswered).
pub fn elicited_record(call_id: &str, answer: Option<&Value>) -> Value {
    json!({"role": RECORD_ROLE, "elicited": call_id, "answer": answer})
}

/// The answers to the input requests of the call `call_id` so far, in order.
pub fn elicited(history: &[Value], call_id: &str) -> Vec<crate::mcp::Elicited> {
    history
        .iter()
        .filter(|m| m["role"] == RECORD_ROLE && m["elicited"] == call_id)
        .map(|m| Some(m["answer"].clone()).filter(|a| !a.is_null()))
        .collect()
}

/// The idempotency key of the call `call_id`: `task:round:call id`, the round being the one
/// the call was made in (its id says, `r3_0`), else `round`.
pub fn call_key(task: &str, call_id: &str, round: u32) -> String {
    let made_in = call_id
        .strip_prefix('r')
        .and_then(|rest| rest.split_once('_'))
        .and_then(|(n, _)| n.parse::<u32>().ok())
        .unwrap_or(round);
    format!("{task}:{made_in}:{call_id}")
}

/// The role of the checkpoint's records that are hark's own, never sent to the model.
const RECORD_ROLE: &str = "hark";

/// The choices, in order: approve, deny, approve for the rest of the task.
const CHOICES_EN: [&str; 3] = ["approve", "deny", "approve for the rest of this task"];
const CHOICES_ZH: [&str; 3] = ["批准", "拒绝", "本任务内都批准"];

/// How many bytes of the arguments' values the question shows in all.
const SUMMARY_BYTES: usize = 600;

/// A call's arguments as an approval question shows them: every name, each value cut on its
/// own to a fair share of [`SUMMARY_BYTES`] (short values first, so that a long `content`
/// cannot push a `path` out of view), and the names of those cut.
pub(crate) fn summary(arguments: &serde_json::Map<String, Value>) -> (String, Vec<String>) {
    let mut values: Vec<(&String, String)> = arguments
        .iter()
        .map(|(name, value)| {
            let text = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (name, text)
        })
        .collect();
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by_key(|&i| values[i].1.len());
    let mut budget = SUMMARY_BYTES;
    let mut cut = Vec::new();
    for (done, &i) in order.iter().enumerate() {
        let share = budget / (order.len() - done);
        let (name, text) = &mut values[i];
        if text.len() > share {
            let keep = hark_core::domain::text::floor_char_boundary(text, share);
            text.truncate(keep);
            text.push('…');
            cut.push((*name).clone());
        }
        budget = budget.saturating_sub(text.len());
    }
    let shown = values
        .iter()
        .map(|(name, text)| format!("{name}={}", hark_core::domain::ids::one_line(text)))
        .collect::<Vec<_>>()
        .join(", ");
    cut.sort();
    (shown, cut)
}

/// The question asking the owner to approve `checked`, made under the model's call `call_id`.
pub(crate) fn ask(language: Language, checked: &Checked<'_>, call_id: &str) -> PendingAsk {
    let (summary, cut) = summary(&checked.arguments);
    let tool = &checked.tool.name;
    let cut = cut.join(", ");
    let (question, choices) = match language {
        Language::Zh if summary.is_empty() => (format!("要运行 `{tool}` 吗？"), CHOICES_ZH),
        Language::Zh if cut.is_empty() => {
            (format!("要运行 `{tool}` 吗？参数：{summary}"), CHOICES_ZH)
        }
        Language::Zh => (
            format!("要运行 `{tool}` 吗？参数：{summary}（已截断：{cut}）"),
            CHOICES_ZH,
        ),
        Language::En if summary.is_empty() => (format!("Run `{tool}`?"), CHOICES_EN),
        Language::En if cut.is_empty() => (format!("Run `{tool}` with {summary}?"), CHOICES_EN),
        Language::En => (
            format!("Run `{tool}` with {summary}? (cut short: {cut})"),
            CHOICES_EN,
        ),
    };
    PendingAsk {
        call_id: format!("{CALL_PREFIX}{call_id}"),
        question,
        context: String::new(),
        timeout_s: 0,
        escalate_to: Vec::new(),
        escalate_after_s: 0,
        ask_to: checked.tool.approvers.clone(),
        need: checked.tool.approvals_needed.clone(),
        shape: Shape::Approval {
            choices: choices.iter().map(|c| (*c).to_owned()).collect(),
            arguments: checked.arguments.keys().cloned().collect(),
        },
        waits_for: String::new(),
    }
}

/// What the owner decided.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Approve {
        for_task: bool,
        /// The arguments the owner changed, to run the call with instead.
        arguments: Option<serde_json::Map<String, Value>>,
    },
    Deny {
        reason: Option<String>,
    },
    /// Nobody answered before the deadline.
    Expired,
}

impl Decision {
    /// The decision a resume brings: the approval's value as task-control read it, or (for a
    /// question asked with three plain choices) one of the choices, as its text.
    pub fn of(resume: &pb::Resume) -> Self {
        if resume.expired {
            return Self::Expired;
        }
        if let Ok(value) = serde_json::from_str::<Value>(&resume.text)
            && let Some(decision) = value["decision"].as_str()
        {
            return match decision {
                "approve" | "approve_for_task" => Self::Approve {
                    for_task: decision == "approve_for_task",
                    arguments: value["arguments"].as_object().cloned(),
                },
                _ => Self::Deny {
                    reason: value["reason"]
                        .as_str()
                        .map(str::to_owned)
                        .filter(|r| !r.trim().is_empty()),
                },
            };
        }
        // The answer comes as the agent reads a choice, {"choice": …}.
        let answer = Shape::choosing(CHOICES_EN.map(str::to_owned).to_vec()).value_of(&resume.text);
        let answer = answer.as_str().unwrap_or(resume.text.as_str()).trim();
        let index = [CHOICES_EN, CHOICES_ZH]
            .iter()
            .find_map(|choices| choices.iter().position(|c| c.eq_ignore_ascii_case(answer)));
        match index {
            Some(0) => Self::Approve {
                for_task: false,
                arguments: None,
            },
            Some(2) => Self::Approve {
                for_task: true,
                arguments: None,
            },
            _ => Self::Deny { reason: None },
        }
    }
}

/// The call `call_id` of the last assistant message that made it.
pub fn call_in(history: &[Value], call_id: &str) -> Option<ToolCall> {
    history
        .iter()
        .rev()
        .filter(|m| m["role"] == "assistant")
        .filter_map(|m| llm::parse_message(m.clone(), ""))
        .find_map(|reply| reply.tool_calls.into_iter().find(|c| c.id == call_id))
}

/// `call` with the arguments the owner changed put over the model's; as it is without changes.
/// The changed call is checked against the tool's schema again before it runs.
pub fn with_arguments(
    call: &ToolCall,
    changed: Option<serde_json::Map<String, Value>>,
) -> ToolCall {
    let Some(changed) = changed else {
        return call.clone();
    };
    let mut arguments = match &call.arguments {
        Value::String(text) => serde_json::from_str::<Value>(text).unwrap_or_default(),
        other => other.clone(),
    };
    let object = match arguments.as_object_mut() {
        Some(object) => object,
        None => {
            arguments = Value::Object(Default::default());
            arguments.as_object_mut().expect("an object")
        }
    };
    object.extend(changed);
    ToolCall {
        arguments: Value::String(arguments.to_string()),
        ..call.clone()
    }
}

/// The record that `tool` is approved for the rest of the task.
pub fn record(tool: &str) -> Value {
    json!({"role": RECORD_ROLE, "approved": tool})
}

/// The tools approved for the rest of the task, from the records of the checkpoint.
pub fn granted(history: &[Value]) -> HashSet<String> {
    history
        .iter()
        .filter(|m| m["role"] == RECORD_ROLE)
        .filter_map(|m| m["approved"].as_str().map(str::to_owned))
        .collect()
}

/// Whether a message of the conversation is sent to the model (hark's records are not).
pub fn for_model(message: &Value) -> bool {
    message["role"] != RECORD_ROLE
}

/// A progress note for the chat: `⏳ tool 2/5 message`.
pub fn progress_text(tool: &str, report: &Progress) -> String {
    let amount = match report.total {
        Some(total) => format!("{}/{}", report.progress, total),
        None => format!("{}", report.progress),
    };
    let message = report
        .message
        .as_deref()
        .map(|m| format!(" {}", limits::cut(m, 200)))
        .unwrap_or_default();
    format!("⏳ {tool} {amount}{message}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resume(text: &str, expired: bool) -> pb::Resume {
        pb::Resume {
            text: text.into(),
            expired,
            ..Default::default()
        }
    }

    #[test]
    fn each_choice_in_either_language_is_its_decision() {
        assert_eq!(
            Decision::of(&resume(r#"{"choice":"approve"}"#, false)),
            Decision::Approve {
                for_task: false,
                arguments: None
            }
        );
        assert_eq!(
            Decision::of(&resume("approve", false)),
            Decision::Approve {
                for_task: false,
                arguments: None
            }
        );
        assert_eq!(
            Decision::of(&resume("本任务内都批准", false)),
            Decision::Approve {
                for_task: true,
                arguments: None
            }
        );
        let deny = Decision::Deny { reason: None };
        assert_eq!(Decision::of(&resume("拒绝", false)), deny);
        assert_eq!(Decision::of(&resume("whatever", false)), deny);
        assert_eq!(Decision::of(&resume("approve", true)), Decision::Expired);
        // An approval's value, as task-control reads the owner's answer.
        assert_eq!(
            Decision::of(&resume(r#"{"decision":"deny","reason":"太贵了"}"#, false)),
            Decision::Deny {
                reason: Some("太贵了".into())
            }
        );
        assert_eq!(
            Decision::of(&resume(
                r#"{"decision":"approve","arguments":{"path":"/tmp/b"}}"#,
                false
            )),
            Decision::Approve {
                for_task: false,
                arguments: Some(json!({"path": "/tmp/b"}).as_object().cloned().expect("map"))
            }
        );
        assert_eq!(
            Decision::of(&resume(r#"{"decision":"approve_for_task"}"#, false)),
            Decision::Approve {
                for_task: true,
                arguments: None
            }
        );
    }

    #[test]
    fn the_call_is_found_and_records_stay_out_of_the_model_s_view() {
        let history = vec![
            json!({"role": "user", "content": "go"}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "r1_0", "type": "function", "function": {"name": "fs__rm", "arguments": "{\"path\":\"/x\"}"}}
            ]}),
            record("fs__rm"),
        ];
        let call = call_in(&history, "r1_0").expect("found");
        assert_eq!(call.name, "fs__rm");
        assert_eq!(call.arguments, json!("{\"path\":\"/x\"}"));
        assert!(call_in(&history, "r9_0").is_none());
        assert_eq!(granted(&history), HashSet::from(["fs__rm".to_owned()]));
        assert_eq!(history.iter().filter(|m| for_model(m)).count(), 2);
    }

    #[test]
    fn an_approval_shows_every_argument_and_a_long_one_cannot_hide_a_short_one() {
        let mut arguments = serde_json::Map::new();
        arguments.insert("content".into(), json!("A".repeat(5000)));
        arguments.insert("path".into(), json!("/etc/cron.d/evil"));
        arguments.insert("mode".into(), json!(493));
        let (shown, cut) = summary(&arguments);
        assert!(shown.contains("path=/etc/cron.d/evil"), "{shown}");
        assert!(shown.contains("mode=493"), "{shown}");
        assert!(shown.contains("content=AAAA"), "{shown}");
        assert!(shown.len() < SUMMARY_BYTES + 100, "{}", shown.len());
        assert_eq!(cut, vec!["content".to_owned()]);
        // Many long values share the budget; each is named.
        let mut many = serde_json::Map::new();
        for name in ["a", "b", "c", "d"] {
            many.insert(name.into(), json!("x\ny".repeat(400)));
        }
        let (shown, cut) = summary(&many);
        for name in ["a=", "b=", "c=", "d="] {
            assert!(shown.contains(name), "{shown}");
        }
        assert!(!shown.contains('\n'), "{shown}");
        assert_eq!(cut.len(), 4);
    }

    #[test]
    fn progress_reads_as_a_short_note() {
        let report = Progress {
            progress: 2.0,
            total: Some(5.0),
            message: Some("step 2".into()),
        };
        assert_eq!(progress_text("x__long", &report), "⏳ x__long 2/5 step 2");
    }
}
