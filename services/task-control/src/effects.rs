//! What a decision's effects become: chat text, protobuf and subjects, as the outbox messages the
//! store writes with the move. The store decides and applies; it formats nothing itself.

use hark_core::{
    bus::Names,
    codec,
    domain::{
        QuestionId, TaskId,
        decide::{Decision, Effect},
        shape::Shape,
    },
};
use hark_proto::v1 as pb;
use uuid::Uuid;

use crate::{
    render,
    store::{ChatRoute, OutboxMessage, QuestionRow, TaskRow},
    texts::Languages,
};

/// Turns effects into messages. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Effects {
    names: Names,
    /// Which language each chat is written in.
    languages: Languages,
    /// Counts each move whose event is made here.
    metrics: std::sync::Arc<crate::metrics::Metrics>,
}

impl Effects {
    pub fn new(names: Names, languages: Languages) -> Self {
        Self {
            names,
            languages,
            metrics: std::sync::Arc::new(crate::metrics::Metrics::new([])),
        }
    }

    pub fn with_metrics(mut self, metrics: std::sync::Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.metrics
    }

    /// The messages `decision` sends for `task` once its move to `generation` commits: its run
    /// job and what its chat is told (as a reply to `reply_to`, when given). The task event is
    /// added by the store, from the row the move returned.
    pub fn of(
        &self,
        task: TaskId,
        generation: i64,
        chat: Option<&ChatRoute>,
        reply_to: Option<&str>,
        decision: &Decision,
    ) -> Vec<OutboxMessage> {
        let mut out = Vec::new();
        for effect in &decision.effects {
            match effect {
                Effect::QueueRun(reason) => out.push(self.run(task, generation, *reason)),
                Effect::Say(say) => {
                    if let Some(route) = chat {
                        let text = self.languages.of(&route.platform).say(task, say);
                        out.extend(self.chat(route, &text, None, reply_to));
                    }
                }
                Effect::HintStop => out.push(self.stop_hint(task)),
                // Applied by the statement itself.
                Effect::CloseQuestion(_)
                | Effect::RecordError(_)
                | Effect::CountAttempt
                | Effect::ShiftDeadline(_)
                | Effect::OpenQuestion { .. }
                | Effect::GrantLease(_)
                | Effect::CloseOthers(_)
                | Effect::Guard(_) => {}
                // Each person asked gets the question in their own chat, rendered with the
                // question the statement creates for them (`Effects::escalated`).
                Effect::AskNext { .. } => {}
            }
        }
        out
    }

    /// The event of a move that won: `row` as it is now, `cause`, and the question it waits on.
    /// Every move that won has its event made here, once, so this is where moves are counted.
    pub fn event(
        &self,
        row: &TaskRow,
        cause: &str,
        question: Option<pb::Question>,
    ) -> OutboxMessage {
        self.metrics
            .moved(row.platform.as_deref(), row.state, cause);
        OutboxMessage {
            subject: self.names.task_events(),
            msg_id: Names::task_event_msg_id(row.id, row.generation as u64),
            payload: codec::encode(crate::convert::event(row, cause, question)),
            durable: false,
            trace: hark_core::trace::outgoing(),
        }
    }

    /// Tells the worker holding `task` to stop now. Only a hint, published once and best
    /// effort: the compare-and-set refuses the worker's next write for the task anyway.
    pub fn stop_hint(&self, task: TaskId) -> OutboxMessage {
        OutboxMessage {
            subject: self.names.task_cancel(task),
            msg_id: String::new(),
            payload: Default::default(),
            durable: false,
            trace: hark_core::trace::outgoing(),
        }
    }

    /// The job that runs `task` at `generation`.
    pub fn run(&self, task: TaskId, generation: i64, reason: pb::RunReason) -> OutboxMessage {
        let job = pb::RunJob {
            task_id: task.to_string(),
            generation: generation as u64,
            reason: reason as i32,
            ..Default::default()
        };
        OutboxMessage {
            subject: self.names.task_run_of(task),
            msg_id: Names::run_job_msg_id(task, generation as u64),
            payload: codec::encode(job),
            durable: true,
            trace: hark_core::trace::outgoing(),
        }
    }

    /// Chat messages for `route`, one per part of `text`. None when the route's names cannot
    /// form a subject (they were checked when the task was created, so this does not happen).
    pub fn chat(
        &self,
        route: &ChatRoute,
        text: &str,
        question: Option<QuestionId>,
        reply_to: Option<&str>,
    ) -> Vec<OutboxMessage> {
        self.chat_mentioning(route, text, question, reply_to, &[], Vec::new())
    }

    /// The chat message that asks `question`, passed on by `by`, of its new askee: in a group it
    /// mentions them.
    pub fn passed_on(
        &self,
        question: &QuestionRow,
        task: &TaskRow,
        by: &str,
    ) -> Vec<OutboxMessage> {
        let Some(route) = ChatRoute::of(
            &question.platform,
            &question.bot_id,
            &question.stream,
            &None,
        ) else {
            return Vec::new();
        };
        let asked = self.asking(
            &route.platform,
            task.id,
            &question.handle,
            &question.text,
            &question.context,
            &question.shape(),
        );
        let in_group = route
            .stream
            .parse::<hark_core::domain::StreamId>()
            .is_ok_and(|s| s.is_group());
        let mentions = if in_group {
            vec![question.owner.user_id().to_owned()]
        } else {
            Vec::new()
        };
        let texts = self.languages.of(&route.platform);
        self.chat_mentioning(
            &route,
            &texts.passed_to_you(&asked.text, by),
            Some(question.id),
            None,
            &mentions,
            asked.buttons,
        )
    }

    /// The chat message that asks `question` of the next person of its escalation, in their own
    /// chat: `first` has not answered it for `waited`.
    pub fn escalated(
        &self,
        question: &QuestionRow,
        task: TaskId,
        first: &str,
        waited: std::time::Duration,
    ) -> Vec<OutboxMessage> {
        let Some(route) = ChatRoute::of(
            &question.platform,
            &question.bot_id,
            &question.stream,
            &None,
        ) else {
            return Vec::new();
        };
        let asked = self.asking(
            &route.platform,
            task,
            &question.handle,
            &question.text,
            &question.context,
            &question.shape(),
        );
        let texts = self.languages.of(&route.platform);
        self.chat_mentioning(
            &route,
            &texts.escalated_to_you(&asked.text, first, waited),
            Some(question.id),
            None,
            &[],
            asked.buttons,
        )
    }

    /// Tells whoever else was asked the same as `question` that `by` answered it: `others` are
    /// their questions, closed by the answer.
    pub fn answered_elsewhere(
        &self,
        others: &[crate::rows::Sibling],
        by: &str,
    ) -> Vec<OutboxMessage> {
        let mut out = Vec::new();
        for other in others {
            let Some(route) = ChatRoute::of(&other.platform, &other.bot_id, &other.stream, &None)
            else {
                continue;
            };
            let text = self
                .languages
                .of(&route.platform)
                .answered_by_another(&other.handle, by);
            out.extend(self.chat(&route, &text, None, other.chat_message_id.as_deref()));
        }
        out
    }

    fn chat_mentioning(
        &self,
        route: &ChatRoute,
        text: &str,
        question: Option<QuestionId>,
        reply_to: Option<&str>,
        mentions: &[String],
        buttons: Vec<pb::ChoiceButton>,
    ) -> Vec<OutboxMessage> {
        let Ok(subject) = self.names.chat_out(&route.platform, &route.bot_id) else {
            tracing::warn!(
                platform = route.platform,
                bot = route.bot_id,
                "chat route cannot form a subject"
            );
            return Vec::new();
        };
        let pieces = if question.is_some() {
            vec![text.to_owned()]
        } else {
            render::parts(text)
        };
        pieces
            .into_iter()
            .map(|piece| {
                let id = Uuid::now_v7().to_string();
                let message = pb::OutboundMessage {
                    id: id.clone(),
                    route: Some(pb::ChatRoute {
                        platform: route.platform.clone(),
                        bot_id: route.bot_id.clone(),
                        stream: route.stream.clone(),
                        origin_message_id: route.origin_message_id.clone().unwrap_or_default(),
                    }),
                    text: piece,
                    reply_to_message_id: reply_to.unwrap_or_default().to_owned(),
                    question_id: question.map(|q| q.to_string()).unwrap_or_default(),
                    mentions: mentions.to_vec(),
                    // A question is one piece, so its buttons go with it.
                    buttons: buttons.clone(),
                    ..Default::default()
                };
                OutboxMessage {
                    subject: subject.clone(),
                    msg_id: id,
                    payload: codec::encode(message),
                    durable: true,
                    trace: hark_core::trace::outgoing(),
                }
            })
            .collect()
    }

    /// The chat message that asks a question, quoting the message that created its task.
    #[allow(clippy::too_many_arguments)]
    pub fn question(
        &self,
        route: &ChatRoute,
        task: TaskId,
        question: QuestionId,
        handle: &str,
        text: &str,
        context: &str,
        shape: &Shape,
    ) -> Vec<OutboxMessage> {
        let asked = self.asking(&route.platform, task, handle, text, context, shape);
        self.chat_mentioning(
            route,
            &asked.text,
            Some(question),
            route.origin_message_id.as_deref(),
            &[],
            asked.buttons,
        )
    }

    /// [`Effects::question`] put to someone else than the task's owner: in a group it mentions
    /// `mentions`.
    #[allow(clippy::too_many_arguments)]
    pub fn question_mentioning(
        &self,
        route: &ChatRoute,
        task: TaskId,
        question: QuestionId,
        handle: &str,
        text: &str,
        context: &str,
        shape: &Shape,
        mentions: &[String],
    ) -> Vec<OutboxMessage> {
        let asked = self.asking(&route.platform, task, handle, text, context, shape);
        self.chat_mentioning(
            route,
            &asked.text,
            Some(question),
            route.origin_message_id.as_deref(),
            mentions,
            asked.buttons,
        )
    }

    /// The text that asks a question in a chat on `platform`, in its language, and the buttons
    /// of its answers.
    fn asking(
        &self,
        platform: &str,
        task: TaskId,
        handle: &str,
        text: &str,
        context: &str,
        shape: &Shape,
    ) -> Asking {
        let texts = self.languages.of(platform);
        let label = self.languages.context_label(texts);
        Asking {
            text: texts.question(task, handle, text, context, label, shape),
            buttons: texts
                .buttons(handle, shape)
                .into_iter()
                .map(|(label, reply)| pb::ChoiceButton { label, reply })
                .collect(),
        }
    }
}

/// A question as a chat message carries it.
struct Asking {
    text: String,
    buttons: Vec<pb::ChoiceButton>,
}
