//! A QQ group whose members each start a task that asks them one question, answer it, and get
//! its result: what the fault tests drive while they break hark's servers, and the checks that
//! every answer was applied exactly once.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use hark_worker::scripted::{Script, ScriptedLlm, Step};

use crate::{Env, Process, bot::Bot};

/// The group the bot is in.
pub const GROUP: i64 = 777;

/// The member who owns task `i`.
pub fn owner(i: usize) -> i64 {
    20_000 + i as i64
}

/// The number after `prefix` in `text`.
fn number_after(text: &str, prefix: &str) -> Option<usize> {
    let rest = &text[text.find(prefix)? + prefix.len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// What the bot posted in the group, read into tasks, questions and results. The scripted model
/// asks "Question of …?" and then says "answers: {answers}".
#[derive(Debug)]
pub struct Group {
    pub bot: Bot,
    /// How long a step may take, a fault's recovery included.
    pub wait: Duration,
    /// The task of each short id hark named when it created it.
    shorts: BTreeMap<String, usize>,
    /// The tasks whose question was posted.
    pub asked: BTreeMap<usize, i64>,
    /// When each task's result reached the group, every time it did.
    pub results: BTreeMap<usize, Vec<Instant>>,
    /// Whether owners start and answer tasks in private chats with the bot, each its own
    /// stream, rather than in the group.
    pub private: bool,
}

impl Group {
    pub fn new(bot: Bot, wait: Duration) -> Self {
        Self {
            bot,
            wait,
            shorts: BTreeMap::new(),
            asked: BTreeMap::new(),
            results: BTreeMap::new(),
            private: false,
        }
    }

    /// Owner `i` says `text`, in the group or in a private chat.
    async fn say(&mut self, i: usize, text: &str) {
        if self.private {
            self.bot.private_message(owner(i), text).await;
        } else {
            self.bot.group_message(GROUP, owner(i), text).await;
        }
    }

    /// The owners of tasks `range` each start one (`/task new job-<i>`), and their questions
    /// arrive.
    pub async fn start_tasks(&mut self, range: std::ops::Range<usize>) {
        for i in range.clone() {
            self.say(i, &format!("/task new job-{i}")).await;
        }
        self.until("every task's question", |group| {
            range.clone().all(|i| group.asked.contains_key(&i))
        })
        .await;
    }

    fn read(&mut self, text: &str, message_id: i64) {
        if let Some(i) = number_after(text, "created: job-") {
            let short = text.split_whitespace().nth(1).unwrap_or_default();
            self.shorts.insert(short.to_owned(), i);
        } else if let Some(i) = text
            .strip_prefix("[task ")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|short| self.shorts.get(short))
            .filter(|_| text.contains("Question of"))
        {
            self.asked.insert(*i, message_id);
        } else if text.contains("answers:")
            && let Some(i) = number_after(text, "reply-")
        {
            self.results.entry(i).or_default().push(Instant::now());
        }
    }

    /// Reads what the bot posts until `done` holds.
    pub async fn until(&mut self, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + self.wait;
        while !done(self) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "hark did not post {what} within {:?}; asked {:?}, results {:?}",
                self.wait,
                self.asked.keys().collect::<Vec<_>>(),
                self.results.keys().collect::<Vec<_>>()
            );
            if let Some(sent) = self.bot.next_sent(left.min(Duration::from_secs(1))).await {
                self.read(&sent.text, sent.message_id);
            }
        }
    }

    /// The owners of tasks `range` answer (`reply-<i>`), without waiting for anything.
    pub async fn reply(&mut self, range: std::ops::Range<usize>) {
        for i in range {
            self.say(i, &format!("reply-{i}")).await;
        }
    }

    /// The results of tasks `range` arrive; returns how long after `since` the first did.
    pub async fn results_of(&mut self, range: std::ops::Range<usize>, since: Instant) -> Duration {
        let what = format!("the results of tasks {range:?}");
        self.until(&what, |group| {
            range.clone().all(|i| group.results.contains_key(&i))
        })
        .await;
        range
            .filter_map(|i| self.results[&i].first().copied())
            .min()
            .map_or(Duration::ZERO, |first| {
                first.saturating_duration_since(since)
            })
    }

    /// Every one of `tasks` tasks completed once, with one resume each, its result posted once,
    /// and none failed. Reads what hark still posts for `settle` first, so that a late duplicate
    /// is seen.
    pub async fn check_exactly_once(&mut self, env: &Env, tasks: usize, settle: Duration) {
        for sent in self.bot.drain(settle).await {
            self.read(&sent.text, sent.message_id);
        }
        let twice: Vec<_> = self.results.iter().filter(|(_, r)| r.len() > 1).collect();
        assert!(twice.is_empty(), "results posted more than once: {twice:?}");
        assert_eq!(
            self.results.len(),
            tasks,
            "every task's result reached the group"
        );
        let answers = env
            .sql("SELECT count(*) FROM transitions WHERE event = 'answer'")
            .await;
        assert_eq!(answers, tasks.to_string(), "each task resumed once");
        let done = env
            .sql("SELECT count(*) FROM tasks WHERE state = 'completed'")
            .await;
        assert_eq!(done, tasks.to_string(), "every task completed");
        let failed = env
            .sql("SELECT count(*) FROM transitions WHERE event LIKE '%fail'")
            .await;
        assert_eq!(failed, "0", "no task failed because of a fault");
    }
}

/// hark in processes on an installation's servers: a task-control, a gateway and two workers,
/// the scripted model asking each task one question, and the group's bot connected.
#[derive(Debug)]
pub struct GroupHark {
    pub llm: ScriptedLlm,
    pub roles: Vec<Process>,
    pub group: Group,
}

impl GroupHark {
    /// Starts it on `env` with the `HARK_…` variables `vars`.
    pub async fn start(env: &mut Env, vars: &[(&str, &str)], wait: Duration) -> Self {
        let llm = ScriptedLlm::with_default(Script::new(vec![
            Step::ask("Question of {goal}?"),
            Step::say("answers: {answers}"),
        ]))
        .await
        .expect("scripted LLM");
        llm.keep_requests(false);
        let base_url = llm.base_url();
        let defaults = [
            ("HARK_LLM__BASE_URL", base_url.as_str()),
            ("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", "tok"),
            ("HARK_TASK__MAX_ACTIVE_PER_OWNER", "0"),
            ("HARK_CHAT__COMMANDS_PER_MINUTE", "0"),
        ];
        for (key, value) in defaults.iter().chain(vars) {
            env.set(key, value);
        }
        let mut roles = vec![env.spawn(&["control"], &[])];
        env.client().await;
        roles.push(env.spawn(&["gateway"], &[]));
        roles.push(env.spawn(&["worker", "--id", "w1"], &[]));
        roles.push(env.spawn(&["worker", "--id", "w2"], &[]));
        let bot = Bot::connect(env.gateway_port().await, 42, "tok").await;
        Self {
            llm,
            roles,
            group: Group::new(bot, wait),
        }
    }

    /// Every role still runs and none panicked; then they stop.
    pub async fn stop(mut self) {
        for role in &mut self.roles {
            assert!(role.running(), "a role exited: {}", role.output());
            assert!(
                !role.output().contains("panicked"),
                "a role panicked: {}",
                role.output()
            );
        }
        for role in &mut self.roles {
            role.stop().await;
        }
    }
}
