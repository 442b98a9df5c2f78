//! The plain, short texts hark writes into chats.

use hark_core::domain::TaskId;

/// A platform message longer than this is split.
pub const PART_CHARS: usize = 1000;
/// At most this many parts are sent; the rest is cut.
pub const MAX_PARTS: usize = 5;

/// The chat message that carries a question: the task, the handle to answer with, the question,
/// and its context after it.
pub fn question(
    task: TaskId,
    handle: &str,
    text: &str,
    context: &str,
    context_label: &str,
) -> String {
    let mut out = format!("[task {} · #{handle}] {}", task.short(), text.trim());
    if !context.trim().is_empty() {
        out.push('\n');
        out.push_str(context_label);
        out.push(' ');
        out.push_str(context.trim());
    }
    out
}

/// A question's text followed by the choices it offers, numbered, when it offers any.
pub fn with_choices(mut question: String, choices: &[String]) -> String {
    if !choices.is_empty() {
        question.push('\n');
        question.push_str(&hark_core::domain::form::numbered(choices));
        question.push_str("\n(reply with a number or a choice)");
    }
    question
}

/// Splits a long text into at most [`MAX_PARTS`] parts of at most [`PART_CHARS`] characters,
/// preferring to break at a line end. Text beyond the last part is cut and marked with `…`.
pub fn parts(text: &str) -> Vec<String> {
    let chars: Vec<char> = text.trim().chars().collect();
    let mut parts = Vec::new();
    let mut start = 0;
    while start < chars.len() && parts.len() < MAX_PARTS {
        let mut end = (start + PART_CHARS).min(chars.len());
        if end < chars.len() {
            if parts.len() + 1 == MAX_PARTS {
                end = start + PART_CHARS - 1;
                let mut last: String = chars[start..end].iter().collect();
                last.push('…');
                parts.push(last);
                break;
            }
            if let Some(nl) = chars[start..end].iter().rposition(|c| *c == '\n')
                && nl > PART_CHARS / 2
            {
                end = start + nl + 1;
            }
        }
        parts.push(
            chars[start..end]
                .iter()
                .collect::<String>()
                .trim_end()
                .to_owned(),
        );
        start = end;
    }
    if parts.is_empty() {
        parts.push(String::new());
    }
    parts
}

/// The chat message for a task that finished.
pub fn completed(task: TaskId, result: &str) -> String {
    format!("[task {} done]\n{}", task.short(), result.trim())
}

pub fn failed(task: TaskId, error: &str) -> String {
    format!("[task {} failed] {}", task.short(), error.trim())
}

pub fn cancelled(task: TaskId, reason: &str) -> String {
    if reason.trim().is_empty() {
        format!("[task {} cancelled]", task.short())
    } else {
        format!("[task {} cancelled] {}", task.short(), reason.trim())
    }
}

/// The chat message for a question whose deadline passed: the task goes on without an answer
/// (`resumed`) or failed.
pub fn expired(task: TaskId, handle: &str, waited: std::time::Duration, resumed: bool) -> String {
    let outcome = if resumed {
        "the task goes on without it"
    } else {
        "the task failed"
    };
    format!(
        "[task {} · #{handle}] no answer within {}; {outcome}.",
        task.short(),
        human(waited)
    )
}

/// The reminder of a question that closes in `left`.
pub fn reminder(task: TaskId, handle: &str, question: &str, left: std::time::Duration) -> String {
    format!(
        "[task {} · #{handle}] still waiting for your answer ({} left): {question}",
        task.short(),
        human(left)
    )
}

/// `text` cut to `max` characters, with `…` when cut, on one line.
pub fn clip(text: &str, max: usize) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= max {
        one_line
    } else {
        let mut cut: String = one_line.chars().take(max.saturating_sub(1)).collect();
        cut.push('…');
        cut
    }
}

/// One line about a checkpointed round: what the assistant said and which tools it called.
pub fn round_summary(messages: &serde_json::Value) -> String {
    let mut said = String::new();
    let mut tools = Vec::new();
    for message in messages.as_array().into_iter().flatten() {
        if message["role"] != "assistant" {
            continue;
        }
        if let Some(text) = message["content"].as_str()
            && said.is_empty()
        {
            said = clip(text, 60);
        }
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            if let Some(name) = call["function"]["name"].as_str() {
                tools.push(name.to_owned());
            }
        }
    }
    match (said.is_empty(), tools.is_empty()) {
        (true, true) => "(no assistant message)".into(),
        (false, true) => said,
        (true, false) => format!("called {}", tools.join(", ")),
        (false, false) => format!("{said} · called {}", tools.join(", ")),
    }
}

/// A duration rounded to whole seconds, as `1h30m` or `45s`.
pub fn human(duration: std::time::Duration) -> String {
    hark_core::domain::HumanDuration(std::time::Duration::from_secs(duration.as_secs())).to_string()
}

/// What the model receives when its question expired without an answer.
pub fn expiry_notice(waited: std::time::Duration) -> String {
    format!(
        "No answer came within {}. Continue without it: make a reasonable assumption and say so, or ask again if you cannot go on.",
        human(waited)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_question_shows_its_handle_and_its_context_after_it() {
        let id = TaskId::new();
        let text = question(
            id,
            "a3f9",
            "Which city?",
            "for the weather report",
            "[上下文]",
        );
        assert!(text.contains("#a3f9"));
        assert!(text.contains(&id.short()));
        let q = text.find("Which city?").expect("question shown");
        let c = text
            .find("[上下文] for the weather report")
            .expect("context shown");
        assert!(q < c);
        assert!(!question(id, "a3f9", "Q", "  ", "[上下文]").contains("[上下文]"));
    }

    #[test]
    fn choices_follow_their_question_numbered() {
        let text = with_choices("Which size?".into(), &["S".into(), "M".into()]);
        assert_eq!(
            text,
            "Which size?\n1) S  2) M\n(reply with a number or a choice)"
        );
        assert_eq!(with_choices("Free text?".into(), &[]), "Free text?");
    }

    #[test]
    fn long_text_is_split_into_at_most_five_parts_of_at_most_1000_chars() {
        assert_eq!(parts("short"), vec!["short".to_owned()]);
        let long = "字".repeat(2500);
        let split = parts(&long);
        assert_eq!(split.len(), 3);
        assert!(split.iter().all(|p| p.chars().count() <= PART_CHARS));
        assert_eq!(split.concat().chars().count(), 2500);

        let huge = "x".repeat(7000);
        let split = parts(&huge);
        assert_eq!(split.len(), MAX_PARTS);
        assert!(split.iter().all(|p| p.chars().count() <= PART_CHARS));
        assert!(split.last().expect("parts").ends_with('…'));
    }

    #[test]
    fn splitting_prefers_line_ends() {
        let text = format!("{}\n{}", "a".repeat(700), "b".repeat(700));
        let split = parts(&text);
        assert_eq!(split, vec!["a".repeat(700), "b".repeat(700)]);
    }
}
