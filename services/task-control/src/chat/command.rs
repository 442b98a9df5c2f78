//! Parsing chat commands. A message that starts with the command word (or an alias) is a command,
//! never an answer, whoever sends it.

use hark_core::domain::{HumanDuration, TaskRef, TaskState, TimeoutPolicy};

/// A parsed chat command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    New {
        timeout: Option<HumanDuration>,
        on_timeout: Option<TimeoutPolicy>,
        goal: String,
    },
    List {
        all: bool,
        state: Option<TaskState>,
    },
    Status(TaskRef),
    Cancel(TaskRef),
    Pause(TaskRef),
    Resume(TaskRef),
    History(TaskRef),
    Tell(TaskRef, String),
    Help,
}

/// Whether `text` starts with one of the command `words`, and the rest of it if so.
pub fn strip_command<'a>(text: &'a str, words: &[String]) -> Option<&'a str> {
    let trimmed = text.trim_start();
    words.iter().find_map(|word| {
        let rest = trimmed
            .get(..word.len())
            .filter(|head| head.eq_ignore_ascii_case(word))?;
        let rest = &trimmed[rest.len()..];
        (rest.is_empty() || rest.starts_with(char::is_whitespace)).then(|| rest.trim())
    })
}

/// Parses the text after the command word. The error is a short usage line to send back.
pub fn parse(args: &str, word: &str) -> Result<Command, String> {
    let (verb, rest) = split_word(args);
    let rest = rest.trim();
    let need_id = |rest: &str, usage: &str| -> Result<(TaskRef, String), String> {
        let (id, tail) = split_word(rest);
        if id.is_empty() {
            return Err(format!("usage: {word} {usage}"));
        }
        let task = id.parse::<TaskRef>().map_err(|e| e.to_string())?;
        Ok((task, tail.trim().to_owned()))
    };
    match verb.to_ascii_lowercase().as_str() {
        "" | "help" | "h" | "?" => Ok(Command::Help),
        "new" | "create" => parse_new(rest, word),
        "list" | "ls" => {
            let mut all = false;
            let mut state = None;
            for token in rest.split_whitespace() {
                if token.eq_ignore_ascii_case("all") {
                    all = true;
                } else {
                    state = Some(token.parse::<TaskState>().map_err(|e| e.to_string())?);
                }
            }
            Ok(Command::List { all, state })
        }
        "status" | "show" => need_id(rest, "status <id>").map(|(t, _)| Command::Status(t)),
        "cancel" | "stop" => need_id(rest, "cancel <id>").map(|(t, _)| Command::Cancel(t)),
        "pause" | "hold" => need_id(rest, "pause <id>").map(|(t, _)| Command::Pause(t)),
        "resume" | "continue" => need_id(rest, "resume <id>").map(|(t, _)| Command::Resume(t)),
        "history" | "log" => need_id(rest, "history <id>").map(|(t, _)| Command::History(t)),
        "tell" => {
            let (task, text) = need_id(rest, "tell <id> <instruction>")?;
            if text.is_empty() {
                return Err(format!("usage: {word} tell <id> <instruction>"));
            }
            Ok(Command::Tell(task, text))
        }
        other => Err(format!(
            "unknown command `{}`; try {word} help",
            hark_core::domain::ids::shown(other)
        )),
    }
}

fn parse_new(mut rest: &str, word: &str) -> Result<Command, String> {
    let mut timeout = None;
    let mut on_timeout = None;
    loop {
        let (flag, tail) = split_word(rest);
        match flag {
            "--timeout" => {
                let (value, tail) = split_word(tail);
                let parsed: HumanDuration = value
                    .parse()
                    .map_err(|e: hark_core::domain::duration::DurationError| e.to_string())?;
                if parsed.is_zero() {
                    return Err(
                        "--timeout must be more than 0; use --on-timeout never for no deadline"
                            .into(),
                    );
                }
                timeout = Some(parsed);
                rest = tail;
            }
            "--on-timeout" => {
                let (value, tail) = split_word(tail);
                on_timeout = Some(value.parse::<TimeoutPolicy>().map_err(|e| e.to_string())?);
                rest = tail;
            }
            _ => break,
        }
    }
    let goal = rest.trim();
    if goal.is_empty() {
        return Err(format!(
            "usage: {word} new [--timeout 30m] [--on-timeout resume|fail|never] <goal>"
        ));
    }
    Ok(Command::New {
        timeout,
        on_timeout,
        goal: goal.to_owned(),
    })
}

fn split_word(text: &str) -> (&str, &str) {
    let text = text.trim_start();
    match text.find(char::is_whitespace) {
        Some(i) => (&text[..i], &text[i..]),
        None => (text, ""),
    }
}

/// The `help` text.
pub fn help(word: &str) -> String {
    format!(
        "{word} new [--timeout 30m] [--on-timeout resume|fail|never] <goal> — start a task\n\
         {word} list [all] [state] — your tasks (all: everyone's, admins)\n\
         {word} status <id> — one task\n\
         {word} cancel <id> — stop a task\n\
         {word} pause <id> / {word} resume <id> — hold a task still, and let it go on\n\
         {word} history <id> — its last rounds and questions\n\
         {word} tell <id> <instruction> — tell a task something\n\
         To answer a question, just reply here; with several open, quote one or start with its #handle."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words() -> Vec<String> {
        vec!["/task".into(), "/mt".into()]
    }

    #[test]
    fn only_the_command_word_itself_starts_a_command() {
        assert_eq!(strip_command("/task list", &words()), Some("list"));
        assert_eq!(
            strip_command("  /MT status ab12", &words()),
            Some("status ab12")
        );
        assert_eq!(strip_command("/task", &words()), Some(""));
        assert_eq!(strip_command("/tasks list", &words()), None);
        assert_eq!(strip_command("yes /task", &words()), None);
        assert_eq!(strip_command("", &words()), None);
    }

    #[test]
    fn new_takes_flags_then_the_goal() {
        assert_eq!(
            parse("new --timeout 90s --on-timeout fail plan a trip", "/task"),
            Ok(Command::New {
                timeout: Some(HumanDuration::from_secs(90)),
                on_timeout: Some(TimeoutPolicy::Fail),
                goal: "plan a trip".into()
            })
        );
        assert_eq!(
            parse("new  write a poem --timeout 5m", "/task"),
            Ok(Command::New {
                timeout: None,
                on_timeout: None,
                goal: "write a poem --timeout 5m".into()
            })
        );
        assert!(parse("new", "/task").is_err());
        assert!(
            parse("new --timeout soon go", "/task")
                .unwrap_err()
                .contains("soon")
        );
        assert!(
            parse("new --on-timeout maybe go", "/task")
                .unwrap_err()
                .contains("maybe")
        );
    }

    #[test]
    fn every_verb_parses_and_bad_input_gets_usage() {
        assert_eq!(
            parse("list", "/task"),
            Ok(Command::List {
                all: false,
                state: None
            })
        );
        assert_eq!(
            parse("list all waiting_input", "/task"),
            Ok(Command::List {
                all: true,
                state: Some(TaskState::WaitingInput)
            })
        );
        assert!(matches!(
            parse("status 0190a3f2", "/task"),
            Ok(Command::Status(_))
        ));
        assert!(matches!(
            parse("cancel 0190a3f2", "/task"),
            Ok(Command::Cancel(_))
        ));
        assert!(matches!(
            parse("history 0190a3f2", "/task"),
            Ok(Command::History(_))
        ));
        assert!(matches!(
            parse("pause 0190a3f2", "/task"),
            Ok(Command::Pause(_))
        ));
        assert!(matches!(
            parse("resume 0190a3f2", "/task"),
            Ok(Command::Resume(_))
        ));
        assert!(parse("pause", "/task").unwrap_err().contains("usage"));
        assert!(matches!(
            parse("tell 0190a3f2 use metric units", "/task"),
            Ok(Command::Tell(_, text)) if text == "use metric units"
        ));
        assert_eq!(parse("", "/task"), Ok(Command::Help));
        assert!(parse("status", "/task").unwrap_err().contains("usage"));
        assert!(
            parse("tell 0190a3f2", "/task")
                .unwrap_err()
                .contains("usage")
        );
        assert!(parse("status xyz!", "/task").unwrap_err().contains("xyz!"));
        assert!(
            parse("fly", "/task")
                .unwrap_err()
                .contains("unknown command")
        );
        assert!(parse("list sleeping", "/task").is_err());
    }
}
