//! Parsing chat commands. A message that starts with the command word (or an alias) is a command,
//! never an answer, whoever sends it.

use hark_core::domain::{
    DeadlinePolicy, HumanDuration, TaskRef, TaskState, TimeoutPolicy, duration,
};

use crate::texts::Texts;

/// A parsed chat command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    New {
        timeout: Option<HumanDuration>,
        on_timeout: Option<TimeoutPolicy>,
        /// When it runs, if not now.
        when: Option<When>,
        /// `--priority`: high (10), low (-10) or a number in -100..=100.
        priority: Option<i16>,
        /// `--deadline`: how long the task may take in all.
        deadline: Option<HumanDuration>,
        /// `--on-deadline`: fail or cancel.
        on_deadline: Option<DeadlinePolicy>,
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
    /// Pass an open question on: the one quoted, the one `handle` names, or the sender's only
    /// one; to the person mentioned, or to `to` (`@id` or `platform:id`).
    Delegate {
        handle: Option<String>,
        to: Option<String>,
    },
    /// Keys that belong to the sender: made, listed and revoked only in a private chat.
    Key(KeyAction),
    Help,
}

/// What `key` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyAction {
    /// Make a key called this.
    New(String),
    List,
    /// Revoke the key with this id (or prefix).
    Revoke(String),
}

/// The usage of `key`.
pub const KEY_USAGE: &str = "key new <name> | key list | key revoke <id>";

/// The words that manage the sender's keys by themselves, as `<command> key` does.
pub const KEY_WORDS: [&str; 2] = ["/key", "/密钥"];

/// The usage of `delegate`.
pub const DELEGATE_USAGE: &str = "delegate [#handle] @someone";

/// The words that pass a question on by themselves, as `<command> delegate` does.
pub const DELEGATE_WORDS: [&str; 2] = ["/delegate", "/转交"];

/// When a task made by `new` runs, if not now: `--in 30m`, `--at 2026-12-24T09:00`, or every
/// time `--cron "0 9 * * 1-5"` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum When {
    In(HumanDuration),
    At(String),
    Cron(String),
}

/// Whether `text` passes a question on by itself (`/delegate @someone`, `/转交@某人`: in QQ a
/// mention may follow the word without a space), and the rest of it if so.
pub fn strip_delegate(text: &str) -> Option<&str> {
    let trimmed = text.trim_start();
    DELEGATE_WORDS.iter().find_map(|word| {
        let head = trimmed
            .get(..word.len())
            .filter(|head| head.eq_ignore_ascii_case(word))?;
        let rest = &trimmed[head.len()..];
        let ends = rest.is_empty()
            || rest.starts_with(char::is_whitespace)
            || rest.starts_with(['@', '＠']);
        ends.then(|| rest.trim())
    })
}

/// Whether `text` starts with one of the command `words`, and the rest of it if so.
pub fn strip_command<'a>(text: &'a str, words: &[impl AsRef<str>]) -> Option<&'a str> {
    let trimmed = text.trim_start();
    words.iter().find_map(|word| {
        let word = word.as_ref();
        let rest = trimmed
            .get(..word.len())
            .filter(|head| head.eq_ignore_ascii_case(word))?;
        let rest = &trimmed[rest.len()..];
        (rest.is_empty() || rest.starts_with(char::is_whitespace)).then(|| rest.trim())
    })
}

/// Parses the text after the command word. The error is a short usage line to send back, in the
/// language of `t`. Verbs are taken in English or Chinese (`new` or `新建`).
pub fn parse(args: &str, word: &str, t: Texts) -> Result<Command, String> {
    let (verb, rest) = split_word(args);
    let rest = rest.trim();
    let need_id = |rest: &str, usage: &str| -> Result<(TaskRef, String), String> {
        let (id, tail) = split_word(rest);
        if id.is_empty() {
            return Err(t.usage(word, usage));
        }
        let task = id
            .parse::<TaskRef>()
            .map_err(|e| t.bad_value("任务编号", &format!("{e} ({word} list shows them)")))?;
        Ok((task, tail.trim().to_owned()))
    };
    match verb.to_ascii_lowercase().as_str() {
        "" | "help" | "h" | "?" | "帮助" => Ok(Command::Help),
        "new" | "create" | "新建" | "创建" => parse_new(rest, word, t),
        "list" | "ls" | "列表" | "列出" => {
            let mut all = false;
            let mut state = None;
            for token in rest.split_whitespace() {
                if token.eq_ignore_ascii_case("all") || token == "全部" {
                    all = true;
                } else {
                    state = Some(t.parse_state(token).ok_or_else(|| {
                        let e = token.parse::<TaskState>().map(|_| ()).unwrap_err();
                        t.bad_value("状态", &e.to_string())
                    })?);
                }
            }
            Ok(Command::List { all, state })
        }
        "status" | "show" | "状态" | "查看" => {
            need_id(rest, "status <id>").map(|(t, _)| Command::Status(t))
        }
        "cancel" | "stop" | "取消" => {
            need_id(rest, "cancel <id>").map(|(t, _)| Command::Cancel(t))
        }
        "pause" | "hold" | "暂停" => need_id(rest, "pause <id>").map(|(t, _)| Command::Pause(t)),
        "resume" | "continue" | "继续" | "恢复" => {
            need_id(rest, "resume <id>").map(|(t, _)| Command::Resume(t))
        }
        "history" | "log" | "历史" | "记录" => {
            need_id(rest, "history <id>").map(|(t, _)| Command::History(t))
        }
        "tell" | "告诉" | "补充" => {
            let (task, text) = need_id(rest, "tell <id> <instruction>")?;
            if text.is_empty() {
                return Err(t.usage(word, "tell <id> <instruction>"));
            }
            Ok(Command::Tell(task, text))
        }
        "delegate" | "pass" | "转交" => {
            let mut handle = None;
            let mut to = None;
            // A mention's name may hold spaces: words after the person are its name.
            for token in rest.split_whitespace() {
                match token.strip_prefix('#') {
                    Some(h) if handle.is_none() && !h.is_empty() => handle = Some(h.to_owned()),
                    _ if to.is_none() => to = Some(token.to_owned()),
                    _ => {}
                }
            }
            Ok(Command::Delegate { handle, to })
        }
        "key" | "keys" | "密钥" => {
            let (action, name) = split_word(rest);
            let name = name.trim();
            match action.to_ascii_lowercase().as_str() {
                "new" | "create" | "新建" | "创建" if !name.is_empty() => {
                    Ok(Command::Key(KeyAction::New(name.to_owned())))
                }
                "list" | "ls" | "" | "列表" | "列出" => Ok(Command::Key(KeyAction::List)),
                "revoke" | "delete" | "吊销" | "删除" | "撤销" if !name.is_empty() => {
                    Ok(Command::Key(KeyAction::Revoke(name.to_owned())))
                }
                _ => Err(t.usage(word, KEY_USAGE)),
            }
        }
        other => Err(t.unknown_command(word, &hark_core::domain::ids::shown(other))),
    }
}

/// A wait given to a flag (`--timeout`, `--deadline`): a duration no longer than a question may
/// wait; `label` names the flag's value in the error.
fn wait_of(label: &str, value: &str, t: Texts) -> Result<HumanDuration, String> {
    let parsed: HumanDuration =
        value
            .parse()
            .map_err(|e: hark_core::domain::duration::DurationError| {
                t.bad_value(label, &e.to_string())
            })?;
    duration::at_most(parsed.0, duration::MAX_QUESTION_WAIT).map_err(|e| t.bad_value(label, &e))?;
    Ok(parsed)
}

fn parse_new(mut rest: &str, word: &str, t: Texts) -> Result<Command, String> {
    let mut timeout = None;
    let mut on_timeout = None;
    let mut when = None;
    let mut priority = None;
    let mut deadline = None;
    let mut on_deadline = None;
    loop {
        let (flag, tail) = split_word(rest);
        match flag {
            "--priority" => {
                let (value, tail) = split_word(tail);
                let parsed = match value.to_ascii_lowercase().as_str() {
                    "high" | "高" => Some(10),
                    "normal" | "普通" => Some(0),
                    "low" | "低" => Some(-10),
                    n => n.parse::<i16>().ok().filter(|p| (-100..=100).contains(p)),
                };
                priority = Some(parsed.ok_or_else(|| {
                    t.bad_value(
                        "--priority 的取值",
                        &format!(
                            "`{}` is not a priority: give high, low or a number from -100 to 100",
                            hark_core::domain::ids::shown(value)
                        ),
                    )
                })?);
                rest = tail;
            }
            "--in" => {
                let (value, tail) = split_value(tail);
                let after: HumanDuration =
                    value
                        .parse()
                        .map_err(|e: hark_core::domain::duration::DurationError| {
                            t.bad_value("--in 的时长", &e.to_string())
                        })?;
                duration::at_most(after.0, duration::MAX_AHEAD)
                    .map_err(|e| t.bad_value("--in 的时长", &e))?;
                when = Some(When::In(after));
                rest = tail;
            }
            "--at" => {
                let (value, tail) = split_value(tail);
                when = Some(When::At(value.to_owned()));
                rest = tail;
            }
            "--cron" => {
                let (value, tail) = split_value(tail);
                when = Some(When::Cron(value.to_owned()));
                rest = tail;
            }
            "--timeout" => {
                let (value, tail) = split_word(tail);
                let parsed = wait_of("--timeout 的时长", value, t)?;
                if parsed.is_zero() {
                    return Err(t.zero_timeout());
                }
                timeout = Some(parsed);
                rest = tail;
            }
            "--deadline" => {
                let (value, tail) = split_word(tail);
                let parsed = wait_of("--deadline 的时长", value, t)?;
                if parsed.is_zero() {
                    return Err(t.bad_value(
                        "--deadline 的时长",
                        "must be more than 0; leave --deadline out for none",
                    ));
                }
                deadline = Some(parsed);
                rest = tail;
            }
            "--on-deadline" => {
                let (value, tail) = split_word(tail);
                on_deadline = Some(
                    value
                        .parse::<DeadlinePolicy>()
                        .map_err(|e| t.bad_value("--on-deadline 的取值", &e.to_string()))?,
                );
                rest = tail;
            }
            "--on-timeout" => {
                let (value, tail) = split_word(tail);
                on_timeout = Some(
                    value
                        .parse::<TimeoutPolicy>()
                        .map_err(|e| t.bad_value("--on-timeout 的取值", &e.to_string()))?,
                );
                rest = tail;
            }
            _ => break,
        }
    }
    let goal = rest.trim();
    if goal.is_empty() {
        return Err(t.usage(
            word,
            "new [--timeout 30m] [--on-timeout resume|fail|never] [--deadline 2h] [--on-deadline fail|cancel] [--in 30m | --at 2026-12-24T09:00 | --cron \"0 9 * * 1-5\"] [--priority high|low|N] <goal>",
        ));
    }
    Ok(Command::New {
        timeout,
        on_timeout,
        when,
        priority,
        deadline,
        on_deadline,
        goal: goal.to_owned(),
    })
}

/// A flag's value: one word, or the text between quotes (`"0 9 * * 1-5"`, `“0 9 * * *”`).
fn split_value(text: &str) -> (&str, &str) {
    let text = text.trim_start();
    for (open, close) in [('"', '"'), ('“', '”'), ('\'', '\'')] {
        if let Some(inner) = text.strip_prefix(open)
            && let Some(end) = inner.find(close)
        {
            return (&inner[..end], &inner[end + close.len_utf8()..]);
        }
    }
    split_word(text)
}

fn split_word(text: &str) -> (&str, &str) {
    let text = text.trim_start();
    match text.find(char::is_whitespace) {
        Some(i) => (&text[..i], &text[i..]),
        None => (text, ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hark_core::config::Language;

    const EN: Texts = Texts::new(Language::En);
    const ZH: Texts = Texts::new(Language::Zh);

    #[test]
    fn new_takes_when_it_runs() {
        let when = |args: &str| match parse(args, "/task", EN) {
            Ok(Command::New { when, goal, .. }) => (when, goal),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            when("new --in 30m water the plants"),
            (
                Some(When::In(HumanDuration::from_secs(1800))),
                "water the plants".into()
            )
        );
        assert_eq!(
            when("new --at 2026-12-24T09:00 open presents"),
            (
                Some(When::At("2026-12-24T09:00".into())),
                "open presents".into()
            )
        );
        assert_eq!(
            when("new --cron \"0 9 * * 1-5\" stand-up notes"),
            (
                Some(When::Cron("0 9 * * 1-5".into())),
                "stand-up notes".into()
            )
        );
        assert_eq!(
            when("新建 --cron “0 9 * * *” 早报"),
            (Some(When::Cron("0 9 * * *".into())), "早报".into())
        );
        assert!(
            parse("new --in soon go", "/task", EN)
                .unwrap_err()
                .contains("soon")
        );
    }

    #[test]
    fn chinese_verbs_and_states_parse_and_errors_are_chinese() {
        assert!(
            matches!(parse("新建 写一首诗", "/task", ZH), Ok(Command::New { goal, .. }) if goal == "写一首诗")
        );
        assert_eq!(
            parse("列表 全部 等待回答", "/task", ZH),
            Ok(Command::List {
                all: true,
                state: Some(TaskState::WaitingInput)
            })
        );
        assert!(matches!(
            parse("暂停 0190a3f2", "/task", ZH),
            Ok(Command::Pause(_))
        ));
        assert!(matches!(
            parse("继续 0190a3f2", "/task", ZH),
            Ok(Command::Resume(_))
        ));
        assert!(matches!(
            parse("取消 0190a3f2", "/task", ZH),
            Ok(Command::Cancel(_))
        ));
        assert!(
            matches!(parse("告诉 0190a3f2 用公制", "/task", ZH), Ok(Command::Tell(_, text)) if text == "用公制")
        );
        assert_eq!(parse("帮助", "/task", ZH), Ok(Command::Help));
        assert_eq!(
            parse("状态", "/task", ZH),
            Err("用法：/task status <编号>".into())
        );
        assert!(
            parse("飞", "/task", ZH)
                .unwrap_err()
                .starts_with("没有 `飞` 这个命令")
        );
        assert!(
            parse("new --timeout 0s go", "/task", ZH)
                .unwrap_err()
                .contains("必须大于 0")
        );
    }

    #[test]
    fn key_makes_lists_and_revokes_the_senders_keys() {
        assert_eq!(
            strip_command("/密钥 新建 笔记本", &KEY_WORDS),
            Some("新建 笔记本")
        );
        assert_eq!(strip_command("/keys", &KEY_WORDS), None);
        assert_eq!(
            parse("key new my laptop", "/task", EN),
            Ok(Command::Key(KeyAction::New("my laptop".into())))
        );
        assert_eq!(
            parse("密钥 新建 笔记本", "/task", ZH),
            Ok(Command::Key(KeyAction::New("笔记本".into())))
        );
        assert_eq!(parse("key", "/task", EN), Ok(Command::Key(KeyAction::List)));
        assert_eq!(
            parse("密钥 吊销 0190a3f2", "/task", ZH),
            Ok(Command::Key(KeyAction::Revoke("0190a3f2".into())))
        );
        assert!(parse("key new", "/task", EN).unwrap_err().contains("usage"));
        assert!(
            parse("key revoke", "/task", EN)
                .unwrap_err()
                .contains("usage")
        );
    }

    fn words() -> Vec<String> {
        vec!["/task".into(), "/mt".into()]
    }

    #[test]
    fn delegate_takes_a_handle_and_a_person_in_any_order() {
        assert_eq!(
            parse("delegate #a3f9 @10002", "/task", EN),
            Ok(Command::Delegate {
                handle: Some("a3f9".into()),
                to: Some("@10002".into())
            })
        );
        assert_eq!(
            parse("转交 qq:10002 #a3f9", "/task", ZH),
            Ok(Command::Delegate {
                handle: Some("a3f9".into()),
                to: Some("qq:10002".into())
            })
        );
        // A mention carries the person; the text then holds only its name.
        assert_eq!(
            parse("delegate", "/task", EN),
            Ok(Command::Delegate {
                handle: None,
                to: None
            })
        );
        assert_eq!(
            parse("delegate @member 200", "/task", ZH),
            Ok(Command::Delegate {
                handle: None,
                to: Some("@member".into())
            })
        );
        assert_eq!(strip_delegate("/转交@张三"), Some("@张三"));
        assert_eq!(strip_delegate(" /Delegate @bob"), Some("@bob"));
        assert_eq!(strip_delegate("/转交给他"), None);
        assert_eq!(strip_delegate("/delegated"), None);
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
            parse(
                "new --timeout 90s --on-timeout fail plan a trip",
                "/task",
                EN
            ),
            Ok(Command::New {
                timeout: Some(HumanDuration::from_secs(90)),
                on_timeout: Some(TimeoutPolicy::Fail),
                when: None,
                priority: None,
                deadline: None,
                on_deadline: None,
                goal: "plan a trip".into()
            })
        );
        assert_eq!(
            parse(
                "new --deadline 2h --on-deadline cancel plan a trip",
                "/task",
                EN
            ),
            Ok(Command::New {
                timeout: None,
                on_timeout: None,
                when: None,
                priority: None,
                deadline: Some(HumanDuration::from_secs(7200)),
                on_deadline: Some(DeadlinePolicy::Cancel),
                goal: "plan a trip".into()
            })
        );
        for (bad, named) in [
            ("--deadline 0s", "--deadline"),
            ("--deadline soon", "soon"),
            ("--on-deadline maybe", "fail or cancel"),
        ] {
            let refused = parse(&format!("new {bad} go"), "/task", EN).unwrap_err();
            assert!(refused.contains(named), "{bad}: {refused}");
        }
        assert_eq!(
            parse("new  write a poem --timeout 5m", "/task", EN),
            Ok(Command::New {
                timeout: None,
                on_timeout: None,
                when: None,
                priority: None,
                deadline: None,
                on_deadline: None,
                goal: "write a poem --timeout 5m".into()
            })
        );
        assert!(parse("new", "/task", EN).is_err());
        assert!(
            parse("new --timeout soon go", "/task", EN)
                .unwrap_err()
                .contains("soon")
        );
        assert!(
            parse("new --on-timeout maybe go", "/task", EN)
                .unwrap_err()
                .contains("maybe")
        );
    }

    #[test]
    fn every_verb_parses_and_bad_input_gets_usage() {
        assert_eq!(
            parse("list", "/task", EN),
            Ok(Command::List {
                all: false,
                state: None
            })
        );
        assert_eq!(
            parse("list all waiting_input", "/task", EN),
            Ok(Command::List {
                all: true,
                state: Some(TaskState::WaitingInput)
            })
        );
        assert!(matches!(
            parse("status 0190a3f2", "/task", EN),
            Ok(Command::Status(_))
        ));
        assert!(matches!(
            parse("cancel 0190a3f2", "/task", EN),
            Ok(Command::Cancel(_))
        ));
        assert!(matches!(
            parse("history 0190a3f2", "/task", EN),
            Ok(Command::History(_))
        ));
        assert!(matches!(
            parse("pause 0190a3f2", "/task", EN),
            Ok(Command::Pause(_))
        ));
        assert!(matches!(
            parse("resume 0190a3f2", "/task", EN),
            Ok(Command::Resume(_))
        ));
        assert!(parse("pause", "/task", EN).unwrap_err().contains("usage"));
        assert!(matches!(
            parse("tell 0190a3f2 use metric units", "/task", EN),
            Ok(Command::Tell(_, text)) if text == "use metric units"
        ));
        assert_eq!(parse("", "/task", EN), Ok(Command::Help));
        assert!(parse("status", "/task", EN).unwrap_err().contains("usage"));
        assert!(
            parse("tell 0190a3f2", "/task", EN)
                .unwrap_err()
                .contains("usage")
        );
        assert!(
            parse("status xyz!", "/task", EN)
                .unwrap_err()
                .contains("xyz!")
        );
        assert!(
            parse("fly", "/task", EN)
                .unwrap_err()
                .contains("unknown command")
        );
        assert!(parse("list sleeping", "/task", EN).is_err());
    }
}
