//! Every text hark writes into a chat, in Chinese and in English (`chat.language`; unset, Chinese
//! on `qq` and English elsewhere). Formatting that does not depend on the language (splitting a
//! long text, clipping, numbering choices) is in [`crate::render`].

use std::time::Duration;

use hark_core::{
    config::{ChatConfig, Language},
    domain::{
        DeadlinePolicy, QuestionOutcome, Role, TaskId, TaskState,
        decide::Say,
        shape::{FieldKind, Misfit, Shape},
    },
};

use crate::render::{self, clip};

/// The texts of one language.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Texts {
    lang: Language,
}

/// Which texts each chat gets: the configured language and context label.
#[derive(Debug, Clone, Default)]
pub struct Languages {
    language: Option<Language>,
    context_label: String,
}

impl Languages {
    pub fn new(chat: &ChatConfig) -> Self {
        Self {
            language: chat.language.fixed(),
            context_label: chat.context_label.clone(),
        }
    }

    /// The texts of chats on `platform`.
    pub fn of(&self, platform: &str) -> Texts {
        Texts {
            lang: Language::of(self.language, platform),
        }
    }

    /// The label before a question's context in `texts`' language, unless one is configured.
    pub fn context_label(&self, texts: Texts) -> &str {
        match (self.context_label.as_str(), texts.lang) {
            ("", Language::Zh) => "[上下文]",
            ("", Language::En) => "[context]",
            (label, _) => label,
        }
    }
}

macro_rules! pick {
    ($self:expr, zh: $zh:expr, en: $en:expr $(,)?) => {
        match $self.lang {
            Language::Zh => $zh,
            Language::En => $en,
        }
    };
}

impl Texts {
    pub const fn new(lang: Language) -> Self {
        Self { lang }
    }

    pub fn language(&self) -> Language {
        self.lang
    }

    fn task(&self, task: TaskId) -> String {
        pick!(self, zh: format!("任务 {}", task.short()), en: format!("task {}", task.short()))
    }

    /// A duration rounded to whole seconds: `1h30m` in English, `1小时30分钟` in Chinese.
    pub fn duration(&self, duration: Duration) -> String {
        match self.lang {
            Language::En => render::human(duration),
            Language::Zh => {
                let secs = duration.as_secs();
                let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
                let mut out = String::new();
                for (n, unit) in [(d, "天"), (h, "小时"), (m, "分钟"), (s, "秒")] {
                    if n > 0 {
                        out.push_str(&format!("{n}{unit}"));
                    }
                }
                if out.is_empty() { "0秒".into() } else { out }
            }
        }
    }

    /// A state as people read it.
    pub fn state(&self, state: TaskState) -> &'static str {
        match self.lang {
            Language::En => state.as_str(),
            Language::Zh => match state {
                TaskState::Pending => "排队中",
                TaskState::Running => "运行中",
                TaskState::WaitingInput => "等待回答",
                TaskState::Paused => "已暂停",
                TaskState::Completed => "已完成",
                TaskState::Failed => "已失败",
                TaskState::Cancelled => "已取消",
            },
        }
    }

    /// A state named in a command (`/task list 等待回答`), in either language.
    pub fn parse_state(&self, word: &str) -> Option<TaskState> {
        let zh = Texts::new(Language::Zh);
        word.parse::<TaskState>()
            .ok()
            .or_else(|| TaskState::ALL.into_iter().find(|s| zh.state(*s) == word))
    }

    // What the task's chat is told as it moves.

    /// The chat message that carries a question: the task, the handle to answer with, the
    /// question, its context after `label`, and its choices numbered.
    pub fn question(
        &self,
        task: TaskId,
        handle: &str,
        text: &str,
        context: &str,
        label: &str,
        shape: &Shape,
    ) -> String {
        let mut out = format!("[{} · #{handle}] {}", self.task(task), text.trim());
        if !context.trim().is_empty() {
            out.push('\n');
            out.push_str(label);
            out.push(' ');
            out.push_str(context.trim());
        }
        if !shape.is_text() {
            out.push('\n');
            out.push_str(&self.how_to_answer(shape));
        }
        out
    }

    /// The answers of a question of `shape` a person may pick with one press, where the platform
    /// shows buttons: (what the button shows, the reply it stands for). A press answers like that
    /// reply typed in the chat, so it starts with the question's `#handle`. None for a question
    /// whose answer is typed: text, a form, several choices.
    pub fn buttons(&self, handle: &str, shape: &Shape) -> Vec<(String, String)> {
        match shape {
            Shape::Choice {
                choices,
                multiple: false,
            }
            | Shape::Approval { choices, .. } => choices
                .iter()
                .enumerate()
                .map(|(i, choice)| (clip(choice, 40), format!("#{handle} {}", i + 1)))
                .collect(),
            Shape::Confirm => vec![
                (
                    pick!(self, zh: "是", en: "Yes").to_owned(),
                    format!("#{handle} yes"),
                ),
                (
                    pick!(self, zh: "否", en: "No").to_owned(),
                    format!("#{handle} no"),
                ),
            ],
            Shape::Text | Shape::Choice { .. } | Shape::Form { .. } => Vec::new(),
        }
    }

    /// What a question of `shape` accepts, and how to reply.
    pub fn how_to_answer(&self, shape: &Shape) -> String {
        use hark_core::domain::form::numbered;
        match shape {
            Shape::Text => String::new(),
            Shape::Choice {
                choices,
                multiple: false,
            } => format!(
                "{}\n{}",
                numbered(choices),
                pick!(self, zh: "（回复序号或选项）", en: "(reply with a number or a choice)")
            ),
            Shape::Choice {
                choices,
                multiple: true,
            } => format!(
                "{}\n{}",
                numbered(choices),
                pick!(self, zh: "（可多选，回复序号，如 1,3）", en: "(pick one or more: reply with numbers, e.g. 1,3)")
            ),
            Shape::Confirm => {
                pick!(self, zh: "（回复 是 或 否）", en: "(reply yes or no)").to_owned()
            }
            Shape::Approval { choices, arguments } => {
                let deny = choices.get(1).map_or("2", String::as_str);
                let mut how = format!(
                    "{}\n{}",
                    numbered(choices),
                    pick!(self,
                        zh: format!("（回复序号或选项；{deny}时可在后面写上理由）"),
                        en: format!("(reply with a number or a choice; after {deny}, a reason may follow)"))
                );
                if let Some(first) = arguments.first() {
                    how.push('\n');
                    how.push_str(&pick!(self,
                        zh: format!("要改参数后再批准，每行回复一项，如 `{first}: 新的值`（可改：{}）", arguments.join("、")),
                        en: format!("To change arguments and approve, reply one per line, e.g. `{first}: new value` ({})", arguments.join(", "))));
                }
                how
            }
            Shape::Form { fields } => {
                let mut lines: Vec<String> = fields
                    .iter()
                    .map(|f| {
                        let name = if f.title.is_empty() || f.title == f.key {
                            f.key.clone()
                        } else {
                            format!("{} ({})", f.key, f.title)
                        };
                        let what = match (f.kind, f.choices.is_empty()) {
                            (_, false) if f.multiple => format!(
                                "{}{}",
                                f.shown().join(" / "),
                                pick!(self, zh: "，可多选", en: ", one or more")
                            ),
                            (_, false) => f.shown().join(" / "),
                            (FieldKind::String, _) => {
                                pick!(self, zh: "文字", en: "text").to_owned()
                            }
                            (FieldKind::Integer, _) => {
                                pick!(self, zh: "整数", en: "whole number").to_owned()
                            }
                            (FieldKind::Number, _) => {
                                pick!(self, zh: "数字", en: "number").to_owned()
                            }
                            (FieldKind::Boolean, _) => {
                                pick!(self, zh: "是/否", en: "yes/no").to_owned()
                            }
                        };
                        let optional = if f.required {
                            ""
                        } else {
                            pick!(self, zh: "，可不填", en: ", optional")
                        };
                        format!("{name}: <{what}{optional}>")
                    })
                    .collect();
                lines.push(
                    pick!(self, zh: "（每行回复一项：字段: 值）", en: "(reply one `field: value` per line)")
                        .to_owned(),
                );
                lines.join("\n")
            }
        }
    }

    /// What a chat is told of a decision.
    pub fn say(&self, task: TaskId, say: &Say) -> String {
        let t = self.task(task);
        match say {
            Say::Completed { result } => pick!(self,
                zh: format!("[{t} 完成]\n{}", result.trim()),
                en: format!("[{t} done]\n{}", result.trim())),
            Say::Failed { error } => pick!(self,
                zh: format!("[{t} 失败] {}", error.trim()),
                en: format!("[{t} failed] {}", error.trim())),
            Say::Cancelled { reason } => {
                let head = pick!(self, zh: format!("[{t} 已取消]"), en: format!("[{t} cancelled]"));
                if reason.trim().is_empty() {
                    head
                } else {
                    format!("{head} {}", reason.trim())
                }
            }
            Say::Expired {
                handle,
                waited,
                resumed,
            } => {
                let waited = self.duration(*waited);
                match (self.lang, resumed) {
                    (Language::Zh, true) => {
                        format!(
                            "[{t} · #{handle}] {waited}内没有收到回答，任务不再等待，继续进行。"
                        )
                    }
                    (Language::Zh, false) => {
                        format!("[{t} · #{handle}] {waited}内没有收到回答，任务失败。")
                    }
                    (Language::En, true) => format!(
                        "[{t} · #{handle}] no answer within {waited}; the task goes on without it."
                    ),
                    (Language::En, false) => {
                        format!("[{t} · #{handle}] no answer within {waited}; the task failed.")
                    }
                }
            }
            Say::Reminder {
                handle,
                question,
                left,
            } => match left {
                Some(left) => {
                    let left = self.duration(*left);
                    pick!(self,
                        zh: format!("[{t} · #{handle}] 还在等你的回答（剩 {left}）：{question}"),
                        en: format!("[{t} · #{handle}] still waiting for your answer ({left} left): {question}"))
                }
                None => pick!(self,
                    zh: format!("[{t} · #{handle}] 还在等你的回答：{question}"),
                    en: format!("[{t} · #{handle}] still waiting for your answer: {question}")),
            },
        }
    }

    // Replies to what someone wrote.

    pub fn too_many_commands(&self, per_minute: u32, wait: Duration) -> String {
        let wait = self.duration(wait);
        pick!(self,
            zh: format!("你发命令的速度超过了每分钟 {per_minute} 条（chat.commands_per_minute），多出的已忽略。请 {wait} 后再试。"),
            en: format!("You are sending commands faster than {per_minute} a minute (chat.commands_per_minute); the ones over it were ignored. Wait {wait} and try again."))
    }

    pub fn too_late(&self, open_handles: &[String]) -> String {
        let handles = open_handles.join(", ");
        pick!(self,
            zh: format!("你的消息在它要回答的问题关闭之后才到，所以没有转交。要回答现在打开的问题（{handles}），请再回复一次。"),
            en: format!("Your message reached me after the question it answered had closed, so it was not passed on. To answer what is open now ({handles}), reply again."))
    }

    /// `open` as (handle, question text).
    pub fn ask_which(&self, open: &[(String, String)]) -> String {
        let list: Vec<String> = open
            .iter()
            .map(|(handle, text)| format!("#{handle} ({})", clip(text, 30)))
            .collect();
        let list = list.join(", ");
        pick!(self,
            zh: format!("我分不清你在回复哪个问题，所以没有转交。请引用那条问题消息，或在回复开头写上它的编号：{list}。"),
            en: format!("I cannot tell which question your reply is for, so it was not passed on. Quote the question itself, or start your reply with its handle: {list}."))
    }

    pub fn closed(&self, task: TaskId, handle: &str, outcome: QuestionOutcome) -> String {
        let why = match (self.lang, outcome) {
            (Language::Zh, QuestionOutcome::Answered) => "已经回答过了",
            (Language::Zh, QuestionOutcome::Expired) => "已经过期",
            (Language::Zh, QuestionOutcome::Cancelled) => "它的任务已取消",
            (Language::Zh, QuestionOutcome::Superseded) => "已被一个更新的问题取代",
            (Language::Zh, QuestionOutcome::Open) => "仍然打开",
            (Language::En, QuestionOutcome::Answered) => "it was already answered",
            (Language::En, QuestionOutcome::Expired) => "it expired",
            (Language::En, QuestionOutcome::Cancelled) => "its task was cancelled",
            (Language::En, QuestionOutcome::Superseded) => "a newer question replaced it",
            (Language::En, QuestionOutcome::Open) => "it is open",
        };
        pick!(self,
            zh: format!("任务 {} 的问题 #{handle} 已关闭：{why}。你的消息没有转交。", task.short()),
            en: format!("Question #{handle} of task {} is closed: {why}. Your message was not passed on.", task.short()))
    }

    /// A question passed on to its new askee by `by`: the question as it is asked, and who
    /// passed it on.
    pub fn passed_to_you(&self, asked: &str, by: &str) -> String {
        pick!(self,
            zh: format!("{asked}\n（{by} 把这个问题转交给了你，直接回复就是回答）"),
            en: format!("{asked}\n(passed on to you by {by}: reply here to answer)"))
    }

    /// The question `asked` put to someone else as well, because `first` has not answered it
    /// for `waited`.
    pub fn escalated_to_you(&self, asked: &str, first: &str, waited: Duration) -> String {
        let waited = self.duration(waited);
        pick!(self,
            zh: format!("{asked}\n（{first} {waited} 内没有回答，所以也来问你：直接回复就是回答，先回答的算数）"),
            en: format!("{asked}\n({first} has not answered in {waited}, so you are asked too: reply here to answer; the first answer counts)"))
    }

    /// The context of a question an outside agent asked with the key `by`: who asks, then the
    /// agent's own context.
    pub fn asked_through(&self, by: &str, context: &str) -> String {
        let who = pick!(self,
            zh: format!("{by} 通过 MCP 提问"),
            en: format!("asked by {by} through MCP"));
        match context.trim() {
            "" => who,
            context => format!("{who}\n{context}"),
        }
    }

    /// A message an outside agent sent the person with the key `by`, which asks for no answer.
    pub fn notified(&self, by: &str, message: &str) -> String {
        pick!(self,
            zh: format!("[{by}] {message}"),
            en: format!("[{by}] {message}"))
    }

    /// Told to someone whose answer to `handle` was kept while more are needed.
    pub fn answer_counted(&self, handle: &str, have: usize, need: usize) -> String {
        pick!(self,
            zh: format!("收到你对 #{handle} 的回答（已有 {have}/{need} 个回答），等其他人回答后任务继续。"),
            en: format!("Got your answer to #{handle} ({have} of {need} answers are in): the task goes on once the others answer."))
    }

    /// Told to whoever else was asked `handle` once `by` answered it.
    pub fn answered_by_another(&self, handle: &str, by: &str) -> String {
        pick!(self,
            zh: format!("#{handle} 已由 {by} 回答，不用再回答了。"),
            en: format!("#{handle} was answered by {by}; no answer from you is needed."))
    }

    pub fn passed_on(&self, handle: &str, to: &str) -> String {
        pick!(self,
            zh: format!("已把 #{handle} 转交给 {to}，现在由对方回答。"),
            en: format!("Passed #{handle} on to {to}: they answer it now."))
    }

    pub fn not_yours_to_pass_on(&self, handle: &str) -> String {
        pick!(self,
            zh: format!("只有被问的人或任务的主人才能转交 #{handle}。"),
            en: format!("Only the person asked, or the task's owner, can pass #{handle} on."))
    }

    pub fn already_asked(&self, handle: &str, askee: &str) -> String {
        pick!(self,
            zh: format!("#{handle} 本来就是问 {askee} 的。"),
            en: format!("#{handle} is already asked of {askee}."))
    }

    pub fn passed_meanwhile(&self, handle: &str, askee: &str) -> String {
        pick!(self,
            zh: format!("#{handle} 刚刚已被转交，现在由 {askee} 回答。"),
            en: format!("#{handle} was passed on meanwhile: {askee} answers it now."))
    }

    pub fn nothing_to_pass_on(&self) -> String {
        pick!(self,
            zh: "你在这里没有可以转交的问题。请引用那条问题消息，或写上它的 #编号。".into(),
            en: "You have no open question here to pass on. Quote the question, or name it with its #handle.".into())
    }

    pub fn answer_refused(&self, handle: &str, why: &str) -> String {
        pick!(self,
            zh: format!("你对 #{handle} 的回答无法接收（{why}），没有转交，问题仍然打开。"),
            en: format!("Your answer to #{handle} {why}; it was not passed on, and the question is still open."))
    }

    /// The acknowledgement of an answer, with the handles of the other questions still open.
    pub fn got_it(&self, task: TaskId, paused: bool, others: &[String]) -> String {
        let mut ack = match (self.lang, paused) {
            (Language::Zh, false) => format!("收到——任务 {} 继续进行。", task.short()),
            (Language::Zh, true) => {
                format!(
                    "收到——任务 {} 已暂停，恢复后会带着你的回答继续。",
                    task.short()
                )
            }
            (Language::En, false) => format!("Got it — task {} continues.", task.short()),
            (Language::En, true) => format!(
                "Got it — task {} is paused, and goes on with your answer once resumed.",
                task.short()
            ),
        };
        if !others.is_empty() {
            let handles: Vec<String> = others.iter().map(|h| format!("#{h}")).collect();
            let (n, handles) = (others.len(), handles.join(", "));
            ack.push_str(&match self.lang {
                Language::Zh => format!(
                    "这里还有 {n} 个问题在等你（{handles}）：请引用其中一个，或在回复开头写上它的 #编号。"
                ),
                Language::En => format!(
                    " {n} more question{} wait{} for you here ({handles}): quote one, or start your reply with its #handle.",
                    if n == 1 { "" } else { "s" },
                    if n == 1 { "s" } else { "" },
                ),
            });
        }
        ack
    }

    /// The hint for an answer that does not fit its question, which stays open.
    pub fn misfit(&self, handle: &str, shape: &Shape, misfit: &Misfit) -> String {
        let why = match misfit {
            Misfit::NotAChoice | Misfit::NotYesOrNo | Misfit::NotAnApproval => String::new(),
            Misfit::Missing(field) => {
                pick!(self, zh: format!("缺少 {field}。"), en: format!("`{field}` is missing. "))
            }
            Misfit::BadField { field, why } => {
                pick!(self, zh: format!("{field}：{why}。"), en: format!("`{field}` {why}. "))
            }
            Misfit::UnknownField(field) => pick!(self,
                zh: format!("没有 {field} 这一项。"),
                en: format!("there is no field `{field}`. ")),
        };
        let how = self.how_to_answer(shape);
        pick!(self,
            zh: format!("#{handle} 的回答不符合要求，问题仍然打开。{why}\n{how}"),
            en: format!("#{handle}: that answer does not fit; the question is still open. {why}\n{how}"))
    }

    pub fn no_platform(&self) -> String {
        pick!(self,
            zh: "命令需要知道你在哪个平台，但这个聊天没有说明。".into(),
            en: "Commands need to know which platform you are on, and this chat did not say.".into())
    }

    pub fn cannot_create(&self, role: Role, sender: &str) -> String {
        pick!(self,
            zh: format!("你不能创建任务（你的角色是 {role}）。管理员可以把 {sender} 加到 permission.users。"),
            en: format!("You cannot create tasks (your role is {role}). An admin can add {sender} to permission.users."))
    }

    pub fn goal_refused(&self, why: &str) -> String {
        pick!(self,
            zh: format!("任务目标无法接收（{why}），没有创建任务。"),
            en: format!("The goal {why}; no task was created."))
    }

    pub fn not_created(&self, why: &str) -> String {
        pick!(self,
            zh: format!("没有创建任务：{why}"),
            en: format!("No task was created: {why}"))
    }

    pub fn created(&self, task: TaskId, goal: &str) -> String {
        pick!(self,
            zh: format!("已创建任务 {}：{}", task.short(), clip(goal, 60)),
            en: format!("Task {} created: {}", task.short(), clip(goal, 60)))
    }

    pub fn too_many_active(&self, active: i64, limit: u32, word: &str) -> String {
        pick!(self,
            zh: format!("没有创建新任务：你有 {active} 个还没结束的任务，每人最多 {limit} 个（task.max_active_per_owner）。用 {word} cancel <编号> 取消一个，或等一个结束。"),
            en: format!("No new task: you have {active} tasks that have not ended, and {limit} is the most one person may have (task.max_active_per_owner). Cancel one with {word} cancel <id>, or wait for one to finish."))
    }

    /// A schedule made: its id, goal, first run (as people in its zone read it) and recurrence.
    pub fn scheduled(
        &self,
        schedule: &str,
        goal: &str,
        next: &str,
        zone: &str,
        cron: Option<&str>,
    ) -> String {
        let goal = clip(goal, 60);
        match (self.lang, cron) {
            (Language::Zh, None) => format!(
                "已安排任务 {schedule}：{goal}——将在 {next}（{zone}）开始。用 {} 取消。",
                format_args!("/task cancel {schedule}")
            ),
            (Language::Zh, Some(cron)) => format!(
                "已安排定时任务 {schedule}：{goal}——按 `{cron}` 重复，下次在 {next}（{zone}）。用 /task cancel {schedule} 停止。"
            ),
            (Language::En, None) => format!(
                "Scheduled {schedule}: {goal} — starts at {next} ({zone}). Cancel it with /task cancel {schedule}."
            ),
            (Language::En, Some(cron)) => format!(
                "Scheduled {schedule}: {goal} — repeats `{cron}`, next at {next} ({zone}). Stop it with /task cancel {schedule}."
            ),
        }
    }

    /// One schedule in `/task list`.
    pub fn schedule_line(
        &self,
        schedule: &str,
        goal: &str,
        next: &str,
        cron: Option<&str>,
    ) -> String {
        let goal = clip(goal, 40);
        match (self.lang, cron) {
            (Language::Zh, None) => format!("{schedule} 定于 {next} {goal}"),
            (Language::Zh, Some(cron)) => format!("{schedule} 下次 {next}（`{cron}`）{goal}"),
            (Language::En, None) => format!("{schedule} at {next} {goal}"),
            (Language::En, Some(cron)) => format!("{schedule} next {next} (`{cron}`) {goal}"),
        }
    }

    pub fn schedule_cancelled(&self, schedule: &str) -> String {
        pick!(self,
            zh: format!("已取消安排 {schedule}：之后不会再开始新的运行。"),
            en: format!("Cancelled schedule {schedule}: no run starts after this."))
    }

    pub fn schedule_ended(&self, schedule: &str) -> String {
        pick!(self,
            zh: format!("安排 {schedule} 已经结束。"),
            en: format!("Schedule {schedule} has already ended."))
    }

    /// A `--in`, `--at` or `--cron` that could not be used; `detail` says why, in English.
    pub fn schedule_refused(&self, detail: &str) -> String {
        pick!(self,
            zh: format!("无法安排这个任务：{detail}"),
            en: format!("The task was not scheduled: {detail}"))
    }

    pub fn admins_only_list(&self) -> String {
        pick!(self,
            zh: "只有管理员能列出所有人的任务。".into(),
            en: "Only admins can list everyone's tasks.".into())
    }

    pub fn no_tasks(&self) -> String {
        pick!(self, zh: "没有任务。".into(), en: "No tasks.".into())
    }

    /// One line of `/task list`.
    pub fn list_line(
        &self,
        task: TaskId,
        state: TaskState,
        owner: Option<&str>,
        goal: &str,
    ) -> String {
        let who = owner.map(|o| format!(" {o}")).unwrap_or_default();
        format!(
            "{} {}{who} {}",
            task.short(),
            self.state(state),
            clip(goal, 40)
        )
    }

    pub fn already_ended(&self, task: TaskId, state: TaskState) -> String {
        let state = self.state(state);
        pick!(self,
            zh: format!("任务 {} 已经结束（{state}）。", task.short()),
            en: format!("Task {} already ended ({state}).", task.short()))
    }

    pub fn cancelled_reply(&self, task: TaskId) -> String {
        pick!(self,
            zh: format!("已取消任务 {}。", task.short()),
            en: format!("Cancelled task {}.", task.short()))
    }

    pub fn cancelled_by(&self, sender: &str) -> String {
        pick!(self, zh: format!("由 {sender} 取消"), en: format!("cancelled by {sender}"))
    }

    pub fn paused(&self, task: TaskId, word: &str) -> String {
        let s = task.short();
        pick!(self,
            zh: format!("已暂停任务 {s}。用 {word} resume {s} 恢复。"),
            en: format!("Paused task {s}. Resume it with {word} resume {s}."))
    }

    pub fn pause_requested(&self, task: TaskId, word: &str) -> String {
        let s = task.short();
        pick!(self,
            zh: format!("任务 {s} 会在当前这一轮结束时暂停。用 {word} resume {s} 恢复。"),
            en: format!("Task {s} pauses when its current round ends. Resume it with {word} resume {s}."))
    }

    pub fn already(&self, task: TaskId, state: TaskState) -> String {
        let state = self.state(state);
        pick!(self,
            zh: format!("任务 {} 已经是{state}状态。", task.short()),
            en: format!("Task {} is already {state}.", task.short()))
    }

    pub fn cannot_pause(&self, task: TaskId, state: TaskState) -> String {
        let state = self.state(state);
        pick!(self,
            zh: format!("任务 {} 无法暂停：它{state}。", task.short()),
            en: format!("Task {} cannot be paused: it is {state}.", task.short()))
    }

    pub fn resumed(&self, task: TaskId, waiting: bool) -> String {
        let s = task.short();
        match (self.lang, waiting) {
            (Language::Zh, true) => format!("已恢复任务 {s}：它又在等你的回答了。"),
            (Language::Zh, false) => format!("已恢复任务 {s}。"),
            (Language::En, true) => format!("Resumed task {s}: it waits for your answer again."),
            (Language::En, false) => format!("Resumed task {s}."),
        }
    }

    pub fn not_paused(&self, task: TaskId, state: TaskState) -> String {
        let state = self.state(state);
        pick!(self,
            zh: format!("任务 {} 没有暂停（{state}）。", task.short()),
            en: format!("Task {} is not paused ({state}).", task.short()))
    }

    pub fn instruction_refused(&self, why: &str) -> String {
        pick!(self,
            zh: format!("这条指示无法接收（{why}），没有转交。"),
            en: format!("The instruction {why}; it was not passed on."))
    }

    pub fn keys_private_only(&self) -> String {
        pick!(self,
            zh: "密钥只在和我的私聊里管理：请私聊我发送 /密钥 新建 <名字>。".to_owned(),
            en: "Keys are managed only in a private chat with me: send /key new <name> there.".to_owned())
    }

    /// A key just made: shown this once.
    pub fn key_made(&self, id: &str, name: &str, secret: &str, lifetime: Duration) -> String {
        let lifetime = self.duration(lifetime);
        pick!(self,
        zh: format!(
            "你的密钥「{name}」（{id}），{lifetime}内有效：\n{secret}\n它只显示这一次。拿着它的人能以你的身份提问和回答；\
             不用了就发 /密钥 吊销 {id}。"
        ),
        en: format!(
            "Your key \"{name}\" ({id}), good for {lifetime}:\n{secret}\nIt is shown only this once. Whoever holds it \
             asks and answers as you; when you no longer need it, send /key revoke {id}."
        ))
    }

    pub fn key_list(&self, keys: &[crate::rows::KeyRow]) -> String {
        if keys.is_empty() {
            return pick!(self,
                zh: "你还没有密钥：发送 /密钥 新建 <名字> 来创建。".to_owned(),
                en: "You have no keys: send /key new <name> to make one.".to_owned());
        }
        let lines: Vec<String> = keys
            .iter()
            .map(|k| {
                let state = match (k.revoked_at, self.lang) {
                    (Some(_), Language::Zh) => "已吊销",
                    (Some(_), Language::En) => "revoked",
                    (None, Language::Zh) => "有效",
                    (None, Language::En) => "active",
                };
                format!("{} {} ({state})", k.short_id(), k.name)
            })
            .collect();
        lines.join("\n")
    }

    pub fn key_revoked(&self, id: &str, name: &str) -> String {
        pick!(self,
            zh: format!("已吊销密钥「{name}」（{id}）：它立即失效。"),
            en: format!("Revoked key \"{name}\" ({id}): it stops working now."))
    }

    pub fn no_key(&self, id: &str) -> String {
        pick!(self,
            zh: format!("你没有编号为 {id} 的密钥（/密钥 列表 列出你的密钥）"),
            en: format!("You have no key {id} (/key list shows yours)"))
    }

    pub fn key_refused(&self, why: &str) -> String {
        pick!(self, zh: format!("不能创建密钥：{why}"), en: format!("Cannot make a key: {why}"))
    }

    pub fn told(&self, task: TaskId, next_round: bool) -> String {
        let s = task.short();
        match (self.lang, next_round) {
            (Language::Zh, true) => format!("已告诉任务 {s}：它会在下一轮看到。"),
            (Language::Zh, false) => format!("已告诉任务 {s}：它恢复时会看到。"),
            (Language::En, true) => format!("Told task {s}: it sees this at its next round."),
            (Language::En, false) => format!("Told task {s}: it sees this when it resumes."),
        }
    }

    pub fn no_task(&self, reference: &str) -> String {
        pick!(self,
            zh: format!("你没有任务 {reference}。"),
            en: format!("You have no task {reference}."))
    }

    pub fn ambiguous(&self, prefix: &str, count: usize) -> String {
        pick!(self,
            zh: format!("`{prefix}` 对应你能看到的 {count} 个任务，请多给几位编号。"),
            en: format!("`{prefix}` matches {count} of the tasks you can see; give more of the id."))
    }

    // `/task status` and `/task history`.

    pub fn status_head(
        &self,
        task: TaskId,
        state: TaskState,
        rounds: i32,
        attempt: i32,
        goal: &str,
    ) -> String {
        let (s, state, goal) = (task.short(), self.state(state), clip(goal, 200));
        pick!(self,
            zh: format!("任务 {s} · {state} · 第 {rounds} 轮 · 第 {attempt} 次尝试\n目标：{goal}"),
            en: format!("Task {s} · {state} · round {rounds} · attempt {attempt}\ngoal: {goal}"))
    }

    pub fn status_waiting(&self, handle: &str, question: &str, left: Option<Duration>) -> String {
        let question = clip(question, 200);
        let mut out = pick!(self,
            zh: format!("\n等待回答 #{handle}：{question}"),
            en: format!("\nwaiting on #{handle}: {question}"));
        if let Some(left) = left {
            let left = self.duration(left);
            out.push_str(&pick!(self, zh: format!("（剩 {left}）"), en: format!(" ({left} left)")));
        }
        out
    }

    /// How long the task has before its own deadline ends it, and how.
    pub fn status_deadline(&self, left: Duration, policy: DeadlinePolicy) -> String {
        let left = self.duration(left);
        match policy {
            DeadlinePolicy::Fail => pick!(self,
                zh: format!("\n截止：剩 {left}，届时任务失败"),
                en: format!("\ndeadline: {left} left, then it fails")),
            DeadlinePolicy::Cancel => pick!(self,
                zh: format!("\n截止：剩 {left}，届时任务取消"),
                en: format!("\ndeadline: {left} left, then it is cancelled")),
        }
    }

    pub fn status_result(&self, result: &str) -> String {
        pick!(self, zh: format!("\n结果：{}", clip(result, 300)), en: format!("\nresult: {}", clip(result, 300)))
    }

    pub fn status_error(&self, error: &str) -> String {
        pick!(self, zh: format!("\n错误：{}", clip(error, 300)), en: format!("\nerror: {}", clip(error, 300)))
    }

    pub fn history_head(&self, task: TaskId, state: TaskState, rounds: usize) -> String {
        let (s, state) = (task.short(), self.state(state));
        pick!(self,
            zh: format!("任务 {s} · {state} · 共 {rounds} 轮"),
            en: format!("Task {s} · {state} · {rounds} rounds"))
    }

    /// One line about a checkpointed round: what the assistant said and which tools it called.
    pub fn history_round(&self, round: i32, messages: &serde_json::Value) -> String {
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
        let called = pick!(self,
            zh: format!("调用了 {}", tools.join(", ")),
            en: format!("called {}", tools.join(", ")));
        let summary = match (said.is_empty(), tools.is_empty()) {
            (true, true) => {
                pick!(self, zh: "（没有助手消息）".into(), en: "(no assistant message)".into())
            }
            (false, true) => said,
            (true, false) => called,
            (false, false) => format!("{said} · {called}"),
        };
        pick!(self, zh: format!("第 {round} 轮：{summary}"), en: format!("round {round}: {summary}"))
    }

    pub fn history_question(
        &self,
        handle: &str,
        text: &str,
        outcome: QuestionOutcome,
        answer: Option<&str>,
    ) -> String {
        let tail = match outcome {
            QuestionOutcome::Answered => format!(" → {}", clip(answer.unwrap_or(""), 60)),
            other => match self.lang {
                Language::En => format!(" ({other})"),
                Language::Zh => format!(
                    "（{}）",
                    match other {
                        QuestionOutcome::Open => "打开",
                        QuestionOutcome::Expired => "已过期",
                        QuestionOutcome::Cancelled => "已取消",
                        QuestionOutcome::Superseded => "已取代",
                        QuestionOutcome::Answered => "已回答",
                    }
                ),
            },
        };
        format!("#{handle} {}{tail}", clip(text, 80))
    }

    // Commands.

    /// The `help` text; `word` is the command word.
    pub fn help(&self, word: &str) -> String {
        pick!(self,
        zh: format!(
            "{word} new [--timeout 30m] [--on-timeout resume|fail|never] [--deadline 2h] <目标> — 开始一个任务\n\
             {word} list [all] [状态] — 你的任务（all：所有人的，仅管理员）\n\
             {word} status <编号> — 查看一个任务\n\
             {word} cancel <编号> — 取消任务\n\
             {word} pause <编号> / {word} resume <编号> — 暂停任务，再让它继续\n\
             {word} history <编号> — 最近几轮和问题\n\
             {word} tell <编号> <指示> — 给任务补充指示\n\
             {word} delegate [#编号] @某人 — 把问你的问题转交给别人（也可以直接发 /转交 @某人）\n\
             /密钥 新建 <名字>、/密钥 列表、/密钥 吊销 <编号> — 在私聊中管理你的密钥，供其他智能体以你的身份提问\n\
             中文命令也可以：/任务 新建、列表、状态、取消、暂停、继续、历史、告诉、转交、帮助。\n\
             回答问题：直接在这里回复；有多个问题时，引用其中一个，或在开头写上它的 #编号。"
        ),
        en: format!(
            "{word} new [--timeout 30m] [--on-timeout resume|fail|never] [--deadline 2h] <goal> — start a task\n\
             {word} list [all] [state] — your tasks (all: everyone's, admins)\n\
             {word} status <id> — one task\n\
             {word} cancel <id> — stop a task\n\
             {word} pause <id> / {word} resume <id> — hold a task still, and let it go on\n\
             {word} history <id> — its last rounds and questions\n\
             {word} tell <id> <instruction> — tell a task something\n\
             {word} delegate [#handle] @someone — pass a question you were asked on to someone else (or just /delegate @someone)\n\
             /key new <name>, /key list, /key revoke <id> — in a private chat: your keys, for other agents to ask as you\n\
             To answer a question, just reply here; with several open, quote one or start with its #handle."
        ))
    }

    /// The usage line of a verb, e.g. `status <id>`.
    pub fn usage(&self, word: &str, usage_en: &str) -> String {
        match self.lang {
            Language::En => format!("usage: {word} {usage_en}"),
            Language::Zh => format!(
                "用法：{word} {}",
                usage_en
                    .replace("<id>", "<编号>")
                    .replace("<instruction>", "<指示>")
                    .replace("<goal>", "<目标>")
                    .replace("#handle", "#编号")
                    .replace("@someone", "@某人")
            ),
        }
    }

    pub fn unknown_command(&self, word: &str, verb: &str) -> String {
        pick!(self,
            zh: format!("没有 `{verb}` 这个命令；试试 {word} help"),
            en: format!("unknown command `{verb}`; try {word} help"))
    }

    /// A value in a command that could not be read (`what`, in Chinese); `detail` says why, in
    /// English.
    pub fn bad_value(&self, what: &str, detail: &str) -> String {
        pick!(self, zh: format!("{what}不对：{detail}"), en: detail.to_owned())
    }

    pub fn zero_timeout(&self) -> String {
        pick!(self,
            zh: "--timeout 必须大于 0；不要截止时间请用 --on-timeout never".into(),
            en: "--timeout must be more than 0; use --on-timeout never for no deadline".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ZH: Texts = Texts { lang: Language::Zh };
    const EN: Texts = Texts { lang: Language::En };

    #[test]
    fn qq_chats_are_chinese_by_default_and_the_setting_wins() {
        let default = Languages::new(&ChatConfig::default());
        assert_eq!(default.of("qq").language(), Language::Zh);
        assert_eq!(default.of("telegram").language(), Language::En);
        assert_eq!(default.context_label(default.of("qq")), "[上下文]");
        assert_eq!(default.context_label(default.of("http")), "[context]");
        let english = Languages::new(&ChatConfig {
            language: hark_core::config::ChatLanguage::En,
            context_label: "Context:".into(),
            ..Default::default()
        });
        assert_eq!(english.of("qq").language(), Language::En);
        assert_eq!(english.context_label(english.of("qq")), "Context:");
    }

    #[test]
    fn an_approval_says_how_to_deny_with_a_reason_and_how_to_change_arguments() {
        let approval = Shape::Approval {
            choices: vec!["批准".into(), "拒绝".into(), "本任务内都批准".into()],
            arguments: vec!["path".into(), "mode".into()],
        };
        let zh = ZH.how_to_answer(&approval);
        assert!(
            zh.starts_with("1) 批准  2) 拒绝  3) 本任务内都批准\n"),
            "{zh}"
        );
        assert!(zh.contains("拒绝时可在后面写上理由"), "{zh}");
        assert!(zh.contains("`path: 新的值`（可改：path、mode）"), "{zh}");
        let en = EN.how_to_answer(&Shape::Approval {
            choices: vec!["approve".into(), "deny".into(), "always".into()],
            arguments: vec![],
        });
        assert!(
            en.ends_with("(reply with a number or a choice; after deny, a reason may follow)"),
            "{en}"
        );
        assert!(
            ZH.passed_to_you("[任务 x · #a1] 哪天？", "qq:100")
                .ends_with("（qq:100 把这个问题转交给了你，直接回复就是回答）")
        );
        assert_eq!(
            ZH.passed_on("a1", "qq:200"),
            "已把 #a1 转交给 qq:200，现在由对方回答。"
        );
    }

    #[test]
    fn a_button_stands_for_a_reply_its_question_reads_as_that_choice() {
        use hark_core::domain::Handle;
        let shapes = [
            Shape::choosing(vec!["S".to_owned(), "M".to_owned()]),
            Shape::Confirm,
            Shape::Approval {
                choices: vec!["批准".into(), "拒绝".into(), "本任务内都批准".into()],
                arguments: vec![],
            },
        ];
        for shape in &shapes {
            for texts in [ZH, EN] {
                let buttons = texts.buttons("a3f9", shape);
                assert!(buttons.len() >= 2, "{shape:?}");
                let mut read = Vec::new();
                for (label, reply) in &buttons {
                    assert!(!label.is_empty());
                    let (handle, answer) = Handle::strip_prefix(reply).expect("a handle");
                    assert_eq!(handle.as_str(), "a3f9");
                    read.push(shape.read(answer).expect("the reply fits"));
                }
                read.dedup();
                assert_eq!(
                    read.len(),
                    buttons.len(),
                    "each button picks another answer"
                );
            }
        }
        assert_eq!(
            ZH.buttons("a3f9", &shapes[0])[1],
            ("M".into(), "#a3f9 2".into())
        );
        assert_eq!(ZH.buttons("a3f9", &Shape::Confirm)[0].0, "是");
        let several = Shape::Choice {
            choices: vec!["a".into(), "b".into()],
            multiple: true,
        };
        assert!(EN.buttons("a3f9", &several).is_empty());
        assert!(EN.buttons("a3f9", &Shape::Text).is_empty());
    }

    #[test]
    fn a_question_shows_its_handle_context_and_choices_in_either_language() {
        let task = TaskId::new();
        let choices = Shape::choosing(vec!["S".to_owned(), "M".to_owned()]);
        let zh = ZH.question(task, "a3f9", "要哪个尺码？", "衬衫", "[上下文]", &choices);
        assert!(zh.starts_with(&format!(
            "[任务 {} · #a3f9] 要哪个尺码？\n[上下文] 衬衫\n",
            task.short()
        )));
        assert!(
            zh.contains("1) S  2) M") && zh.ends_with("（回复序号或选项）"),
            "{zh}"
        );
        let en = EN.question(task, "a3f9", "Which size?", "", "[context]", &Shape::Text);
        assert_eq!(en, format!("[task {} · #a3f9] Which size?", task.short()));
    }

    #[test]
    fn each_shape_says_how_to_answer_and_a_misfit_says_what_was_wrong() {
        use hark_core::domain::shape::Field;
        let task = TaskId::new();
        let several = Shape::Choice {
            choices: vec!["A".into(), "B".into()],
            multiple: true,
        };
        let zh = ZH.question(task, "a3f9", "选哪些？", "", "", &several);
        assert!(
            zh.ends_with("1) A  2) B\n（可多选，回复序号，如 1,3）"),
            "{zh}"
        );
        let en = EN.question(task, "a3f9", "Proceed?", "", "", &Shape::Confirm);
        assert!(en.ends_with("Proceed?\n(reply yes or no)"), "{en}");
        let form = Shape::Form {
            fields: vec![
                Field {
                    key: "name".into(),
                    title: String::new(),
                    kind: FieldKind::String,
                    choices: vec![],
                    required: true,
                    ..Field::default()
                },
                Field {
                    key: "size".into(),
                    title: "尺码".into(),
                    kind: FieldKind::String,
                    choices: vec!["S".into(), "M".into()],
                    required: false,
                    ..Field::default()
                },
            ],
        };
        let zh = ZH.question(task, "a3f9", "报名", "", "", &form);
        assert!(
            zh.contains("name: <文字>\nsize (尺码): <S / M，可不填>\n（每行回复一项：字段: 值）"),
            "{zh}"
        );
        let hint = EN.misfit("a3f9", &form, &Misfit::Missing("name".into()));
        assert!(
            hint.starts_with(
                "#a3f9: that answer does not fit; the question is still open. `name` is missing."
            ) && hint.contains("name: <text>"),
            "{hint}"
        );
        let hint = ZH.misfit("a3f9", &Shape::Confirm, &Misfit::NotYesOrNo);
        assert!(
            hint.contains("问题仍然打开") && hint.ends_with("（回复 是 或 否）"),
            "{hint}"
        );
    }

    #[test]
    fn every_decision_message_has_both_languages() {
        let task = TaskId::new();
        let says = [
            Say::Completed {
                result: "ok".into(),
            },
            Say::Failed {
                error: "broke".into(),
            },
            Say::Cancelled {
                reason: String::new(),
            },
            Say::Expired {
                handle: "a3f9".into(),
                waited: Duration::from_secs(5400),
                resumed: true,
            },
            Say::Expired {
                handle: "a3f9".into(),
                waited: Duration::from_secs(60),
                resumed: false,
            },
            Say::Reminder {
                handle: "a3f9".into(),
                question: "Q?".into(),
                left: Some(Duration::from_secs(90)),
            },
        ];
        for say in &says {
            let (zh, en) = (ZH.say(task, say), EN.say(task, say));
            assert!(zh.contains(&format!("任务 {}", task.short())), "{zh}");
            assert!(en.contains(&format!("task {}", task.short())), "{en}");
            assert_ne!(zh, en);
        }
        assert!(ZH.say(task, &says[3]).contains("1小时30分钟内没有收到回答"));
        assert!(EN.say(task, &says[3]).contains("no answer within 1h30m"));
        assert!(ZH.say(task, &says[5]).contains("剩 1分钟30秒"));
    }

    #[test]
    fn durations_read_naturally_in_chinese() {
        assert_eq!(ZH.duration(Duration::from_secs(0)), "0秒");
        assert_eq!(ZH.duration(Duration::from_secs(45)), "45秒");
        assert_eq!(ZH.duration(Duration::from_secs(90_061)), "1天1小时1分钟1秒");
    }

    #[test]
    fn states_are_read_and_written_in_chinese() {
        for state in TaskState::ALL {
            assert_eq!(ZH.parse_state(ZH.state(state)), Some(state));
            assert_eq!(EN.parse_state(state.as_str()), Some(state));
        }
        assert_eq!(ZH.parse_state("暂停了"), None);
    }

    #[test]
    fn the_help_names_every_verb_in_both_languages() {
        for verb in [
            "new", "list", "status", "cancel", "pause", "resume", "history", "tell",
        ] {
            assert!(
                EN.help("/task").contains(&format!("/task {verb}")),
                "{verb}"
            );
            assert!(
                ZH.help("/task").contains(&format!("/task {verb}")),
                "{verb}"
            );
        }
        assert!(ZH.help("/task").contains("/任务 新建"));
    }
}
