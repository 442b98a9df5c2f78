//! A whole hark in processes with a OneBot bot in a group: `hark control`, `hark gateway` and
//! workers, the scripted LLM over HTTP, and the bot played over WebSocket.

use std::time::Duration;

use hark_proto::v1 as pb;
use hark_worker::scripted::{Script, ScriptedLlm, Step};

use crate::{Env, Process, bot::Bot};

/// How long a test waits for what hark does next.
pub const WAIT: Duration = Duration::from_secs(30);
/// The group the bot is in, and the user who owns the tasks.
pub const GROUP: i64 = 777;
pub const OWNER: i64 = 100;

/// hark in processes, with the bot of qq account 42 connected to its gateway.
#[derive(Debug)]
pub struct Hark {
    pub env: Env,
    pub llm: ScriptedLlm,
    pub control: Process,
    pub gateway: Process,
    pub workers: Vec<Process>,
    pub bot: Bot,
}

impl Hark {
    /// Starts hark with the scripted model answering `steps`, the `HARK_…` variables `vars`, and
    /// a worker per id in `workers`.
    pub async fn start(steps: Vec<Step>, vars: &[(&str, &str)], workers: &[&str]) -> Self {
        let llm = ScriptedLlm::with_default(Script::new(steps))
            .await
            .expect("scripted LLM");
        let mut env = Env::new().await;
        env.set("HARK_LLM__BASE_URL", &llm.base_url());
        env.set("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", "tok");
        env.set("HARK_PERMISSION__ADMINS", "qq:1");
        for (k, v) in vars {
            env.set(k, v);
        }
        let control = env.spawn(&["control"], &[]);
        env.client().await;
        let gateway = env.spawn(&["gateway"], &[]);
        let workers = workers
            .iter()
            .map(|id| env.spawn(&["worker", "--id", id], &[]))
            .collect();
        let bot = Bot::connect(env.gateway_port().await, 42, "tok").await;
        Self {
            env,
            llm,
            control,
            gateway,
            workers,
            bot,
        }
    }

    pub async fn say(&mut self, user: i64, text: &str) -> i64 {
        self.bot.group_message(GROUP, user, text).await
    }

    /// `/task new` in the group; returns the short id from the reply.
    pub async fn new_task(&mut self, goal: &str) -> String {
        self.say(OWNER, &format!("/task new {goal}")).await;
        let created = self
            .bot
            .expect("a 'created' reply", WAIT, |s| s.text.contains("created"))
            .await;
        created
            .text
            .split_whitespace()
            .nth(1)
            .expect("the reply names the task")
            .to_owned()
    }

    pub async fn task(&self, id: &str) -> pb::Task {
        self.env
            .client()
            .await
            .get_task(pb::GetTaskRequest { task_id: id.into() })
            .await
            .expect("get task")
            .into_inner()
            .task
            .expect("task")
    }

    pub async fn stop(mut self) {
        for w in &mut self.workers {
            w.stop().await;
        }
        self.gateway.stop().await;
        self.control.stop().await;
        drop(self.llm);
        self.env.cleanup().await;
    }
}

/// The `#handle` in a question message (`[task 1a2b3c4d · #a3f9] …`).
pub fn handle_of(text: &str) -> String {
    text.split('#')
        .nth(1)
        .and_then(|s| s.split(']').next())
        .expect("a #handle")
        .to_owned()
}
