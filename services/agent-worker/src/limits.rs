//! How much of what a model and its tools produce is kept. Every round is checkpointed as one
//! message on the bus, so a round must stay well below the bus's payload limit whatever the
//! model or a tool returns: an oversized tool result or model output is cut, and the model is
//! told so in the text it reads.

use serde_json::Value;

/// The most bytes of one tool result the model gets back.
pub const MAX_TOOL_RESULT: usize = 16 * 1024;
/// The most bytes one assistant message keeps: its text, reasoning and tool-call arguments.
pub const MAX_MODEL_MESSAGE: usize = 256 * 1024;
/// The most tool calls one round runs; the model is told about the others.
pub const MAX_CALLS_PER_ROUND: usize = 16;
/// The most bytes of a question (and of its context) shown in a chat.
pub const MAX_QUESTION: usize = 8 * 1024;

/// `text` cut to at most `max` bytes (at a character boundary), with a note saying so.
pub fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let note = format!(
        "\n[hark cut this: it was {} bytes, more than the {max} kept]",
        text.len()
    );
    let keep = hark_core::domain::text::floor_char_boundary(text, max.saturating_sub(note.len()));
    format!("{}{note}", &text[..keep])
}

/// Cuts the longest strings of `value` until its JSON takes at most `budget` bytes; returns
/// whether anything was cut. Each cut string says so at its end.
pub fn shrink(value: &mut Value, budget: usize) -> bool {
    let mut cut_any = false;
    for _ in 0..64 {
        let size = serde_json::to_vec(value).map_or(0, |v| v.len());
        if size <= budget {
            break;
        }
        let Some(longest) = longest_string(value) else {
            break;
        };
        let Some(Value::String(text)) = value.pointer_mut(&longest) else {
            break;
        };
        let excess = size - budget;
        // Cut at least the excess (and a little for the note), at least half of the string.
        let target = text.len().saturating_sub(excess + 96).min(text.len() / 2);
        *text = cut(text, target.max(96));
        cut_any = true;
    }
    cut_any
}

/// The JSON pointer of the longest string in `value`.
fn longest_string(value: &Value) -> Option<String> {
    fn walk(value: &Value, path: &mut String, best: &mut Option<(usize, String)>) {
        match value {
            Value::String(s) if best.as_ref().is_none_or(|(len, _)| s.len() > *len) => {
                *best = Some((s.len(), path.clone()));
            }
            Value::Array(items) => {
                for (i, item) in items.iter().enumerate() {
                    let len = path.len();
                    path.push_str(&format!("/{i}"));
                    walk(item, path, best);
                    path.truncate(len);
                }
            }
            Value::Object(fields) => {
                for (key, item) in fields {
                    let len = path.len();
                    path.push('/');
                    path.push_str(&key.replace('~', "~0").replace('/', "~1"));
                    walk(item, path, best);
                    path.truncate(len);
                }
            }
            _ => {}
        }
    }
    let mut best = None;
    walk(value, &mut String::new(), &mut best);
    best.map(|(_, path)| path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_long_text_is_cut_with_a_note_and_a_short_one_is_kept() {
        assert_eq!(cut("short", 100), "short");
        let long = "字".repeat(10_000);
        let cut_text = cut(&long, 1000);
        assert!(cut_text.len() <= 1000, "{}", cut_text.len());
        assert!(cut_text.contains("hark cut this: it was 30000 bytes"));
    }

    #[test]
    fn an_oversized_message_is_shrunk_to_its_budget_by_its_longest_strings() {
        let mut message = json!({
            "role": "assistant",
            "content": "a".repeat(300_000),
            "reasoning_content": "b".repeat(200_000),
            "tool_calls": [{"id": "c1", "function": {"name": "t", "arguments": "c".repeat(5000)}}]
        });
        assert!(shrink(&mut message, MAX_MODEL_MESSAGE));
        let size = serde_json::to_vec(&message).expect("json").len();
        assert!(size <= MAX_MODEL_MESSAGE, "{size}");
        assert_eq!(message["role"], "assistant");
        assert_eq!(message["tool_calls"][0]["id"], "c1");
        assert!(
            message["content"]
                .as_str()
                .expect("content")
                .contains("hark cut this")
        );
        let mut small = json!({"content": "fine"});
        assert!(!shrink(&mut small, 1000));
        assert_eq!(small, json!({"content": "fine"}));
    }
}
