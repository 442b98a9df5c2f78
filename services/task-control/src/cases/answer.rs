//! Answering a question, written once for chat, the API, the console and the subtask sweep:
//! find the question, check the answer fits it, decide what it does to its task, and apply that
//! in one compare-and-set. With a worker polling this replica, a resume claims its task for that
//! worker in the answer's own statement and hands the claim over.

use hark_core::domain::{
    QuestionId, QuestionOutcome, TaskId, TaskState,
    decide::{self, Command, Then},
    form::{FormQuestion, progress},
    shape::Shape,
};
use hark_proto::v1 as pb;
use sqlx::types::Json;
use time::OffsetDateTime;

use super::handoff;
use crate::{
    rows::Sibling,
    shared::Shared,
    store::{
        Answer, AnswerOutcome, AnswerTarget, Error, FormStep, QuestionRow, Step, Store, TaskRow,
        subtask_answerer,
    },
};

/// Answers, applied to the store, with the hand-over when there is a replica's workers to hand
/// to.
#[derive(Debug, Clone, Copy)]
pub struct Answers<'a> {
    store: &'a Store,
    /// The replica whose polling workers a resume is handed to.
    workers: Option<&'a Shared>,
}

impl<'a> Answers<'a> {
    /// Answers on this replica: a resume goes straight to a worker polling it.
    pub fn of(shared: &'a Shared) -> Self {
        Self {
            store: &shared.store,
            workers: Some(shared),
        }
    }

    /// Answers applied to `store` alone: every resume is queued for the run queue.
    pub fn in_store(store: &'a Store) -> Self {
        Self {
            store,
            workers: None,
        }
    }

    /// Applies an answer to an open question: the question becomes answered, the inbound
    /// message is recorded as applied, and the task goes from waiting_input to pending with its
    /// resume job queued, all in one statement.
    pub async fn answer(
        self,
        question: QuestionId,
        answer: &Answer,
    ) -> Result<AnswerOutcome, Error> {
        self.apply(Some(question), None, answer).await
    }

    /// Answers the open question of `task`, if it has one.
    pub async fn answer_task(self, task: TaskId, answer: &Answer) -> Result<AnswerOutcome, Error> {
        self.apply(None, Some(task), answer).await
    }

    /// Applies an answer to `question`, or to the open question of `task`.
    async fn apply(
        self,
        question: Option<QuestionId>,
        task: Option<TaskId>,
        answer: &Answer,
    ) -> Result<AnswerOutcome, Error> {
        if question.is_none() && task.is_none() {
            return Err(Error::QuestionNotFound(String::new()));
        }
        // A question this process asked starts the answer without a read. Only an applied
        // answer counts: anything else (the task moved since, the message was applied before,
        // the answer does not fit) is decided again from a read, as if nothing were remembered.
        if let Some(remembered) = self.store.take_remembered(question, task) {
            // Once: a task that moved since is decided from a read below.
            let outcome = self.once(remembered, answer).await;
            if let Ok(applied @ AnswerOutcome::Applied { .. }) = outcome {
                self.store.count_answered(&applied);
                self.store
                    .metrics()
                    .answer_start(crate::metrics::REMEMBERED);
                return Ok(applied);
            }
        }
        let found = self
            .store
            .find_answer_target(question, task, answer.inbound_key.clone())
            .await?;
        let Some(target) = found else {
            return Err(match (question, task) {
                (Some(q), _) => Error::QuestionNotFound(q.to_string()),
                (None, t) => Error::NoOpenQuestion {
                    task: t.map(|t| t.to_string()).unwrap_or_default(),
                },
            });
        };
        let outcome = self.target(target, answer).await;
        if let Ok(AnswerOutcome::Applied { .. }) = &outcome {
            self.store.metrics().answer_start(crate::metrics::READ);
        }
        outcome
    }

    /// Applies an answer to the question of `target`, starting from the task's state and
    /// generation as `target` read them (a compare-and-set: a task that moved since is refused).
    /// `target.applied` must say whether `answer`'s inbound message was applied before.
    pub async fn target(
        self,
        mut target: AnswerTarget,
        answer: &Answer,
    ) -> Result<AnswerOutcome, Error> {
        // The task moved under the question, which stayed open to the same person (it was
        // escalated, say): the answer is decided again from a fresh read.
        let mut tries = 0;
        let outcome = loop {
            let question = target.question.id;
            match self.once(target, answer).await {
                Err(Error::Raced(_)) if tries < 3 => {
                    tries += 1;
                    target = self
                        .store
                        .find_answer_target(Some(question), None, answer.inbound_key.clone())
                        .await?
                        .ok_or_else(|| Error::QuestionNotFound(question.to_string()))?;
                }
                Err(Error::Raced(_)) => {
                    return Err(Error::Busy(format!(
                        "question {question} kept changing while it was answered"
                    )));
                }
                outcome => break outcome?,
            }
        };
        self.store.count_answered(&outcome);
        Ok(outcome)
    }

    /// One try of [`Answers::target`]: validate, decide, apply.
    async fn once(self, target: AnswerTarget, answer: &Answer) -> Result<AnswerOutcome, Error> {
        let AnswerTarget {
            question: question_row,
            task,
            chat,
            task_generation: generation,
            applied,
            task_questionnaire,
            form_last_round,
            siblings,
        } = target;
        let siblings = siblings.map(|Json(s)| s).unwrap_or_default();
        let question = question_row.id;
        if applied {
            return Ok(AnswerOutcome::Duplicate {
                question: Box::new(question_row),
            });
        }
        let task_id = question_row.task_id;
        // Only the end of the subtask a question waits for answers it.
        if let Some(subtask) = question_row.waits_for
            && answer.answerer != subtask_answerer(subtask)
        {
            return Err(Error::WaitsForSubtask {
                handle: question_row.handle.clone(),
                subtask: subtask.to_string(),
            });
        }
        if !question_row.outcome.is_open() {
            return Err(Error::QuestionClosed {
                id: question.to_string(),
                outcome: question_row.outcome,
            });
        }
        // A question of a shape takes an answer that fits it, kept as the agent reads it (a
        // questionnaire keeps a choice's text as it is); one that does not fit changes nothing.
        let shape = question_row.shape();
        let questionnaire = task_questionnaire.as_ref().is_some_and(|q| !q.0.is_empty());
        let read;
        let answer = match (&shape, &answer.json) {
            (Shape::Text, None) => answer,
            (_, json) => {
                let value = match json {
                    Some(value) => shape.check(value),
                    None => shape.read(&answer.text),
                }
                .map_err(|misfit| Error::Misfit {
                    handle: question_row.handle.clone(),
                    answer: hark_core::domain::ids::shown(&match json {
                        Some(value) => value.to_string(),
                        None => answer.text.clone(),
                    }),
                    shape: Box::new(shape.clone()),
                    misfit,
                })?;
                let text = match value {
                    serde_json::Value::String(text) if shape.is_text() || questionnaire => text,
                    value if questionnaire => value.to_string(),
                    value => shape.for_model(&value),
                };
                read = Answer {
                    text,
                    json: None,
                    ..answer.clone()
                };
                &read
            }
        };
        // The task moves only from the generation just read. A question is only ever closed
        // together with a move of its task, so when this move wins the question is still open.
        let Some(lifecycle) = question_row.open().and_then(|open| task.task(Some(open))) else {
            return Err(Error::QuestionClosed {
                id: question.to_string(),
                outcome: question_row.outcome,
            });
        };
        let now = OffsetDateTime::now_utc();
        let policy = self.store.policy();
        // Of an ask put to several people: more answers may be needed, and the model reads them
        // all with their authors; one denial of an approval ends it.
        let answered_before: Vec<&Sibling> = siblings
            .iter()
            .filter(|s| s.outcome == QuestionOutcome::Answered)
            .collect();
        let denied = matches!(shape, Shape::Approval { .. })
            && shape.value_of(&answer.text)["decision"] == "deny";
        let have = answered_before.len() + 1;
        let need = usize::try_from(question_row.need).unwrap_or(1).max(1);
        if have < need && !denied {
            let decision = decide::decide(&lifecycle, &Command::Collect, now, policy)
                .map_err(|r| Error::refused(task_id, r))?;
            return self
                .store
                .collect(question_row, generation, answer, &decision, (have, need))
                .await;
        }
        // A questionnaire records every answer with its author, each as its output keeps it.
        let form_answers = (questionnaire && question_row.askees > 1)
            .then(|| progress::together(authored(&answered_before, answer), &shape));
        let model_answer = question_row.ask_group.map(|_| match &form_answers {
            Some(all) => serde_json::json!({ "answers": all }).to_string(),
            None if question_row.askees > 1 => together(&shape, &answered_before, answer, denied),
            None => answer.text.clone(),
        });
        let open_others: Vec<Sibling> = siblings
            .iter()
            .filter(|s| s.outcome.is_open())
            .cloned()
            .collect();
        let decision = decide::decide(&lifecycle, &Command::Answer, now, policy)
            .map_err(|r| Error::refused(task_id, r))?;
        let resumes = decision.to == TaskState::Pending;
        if let Some(Json(questions)) = task_questionnaire.filter(|_| self.store.takes_form_steps())
            && !questions.is_empty()
            && resumes
        {
            let last = form_last_round.map(|Json(round)| round);
            let step = form_step(&question_row, &questions, last, answer, form_answers)?;
            let then = match &step.step {
                // A questionnaire's question waits as its task says.
                Step::Ask(_) => Then::Ask {
                    wait: task.wait(None),
                },
                Step::Finish(output) => Then::Finish { result: output },
            };
            if let Some(chain) = decide::answer_then(&lifecycle, then, now, policy)
                .map_err(|r| Error::refused(task_id, r))?
            {
                return self
                    .store
                    .answer_form(
                        question_row,
                        &chat.fixed(&task),
                        &chain,
                        generation,
                        answer,
                        step,
                        &open_others,
                    )
                    .await;
            }
        }
        // An answer that closes others' questions tells them, which only the plain statement does.
        if resumes
            && model_answer.is_none()
            && let Some(shared) = self.workers
            && let Some(chain) = decide::answer_then(
                &lifecycle,
                Then::Claim {
                    lease: shared.config.task.lease.0,
                },
                now,
                policy,
            )
            .map_err(|r| Error::refused(task_id, r))?
            && let Some(claimed) =
                claim_for_idle(shared, &question_row, generation, answer, &chain).await?
        {
            let mut question_row = question_row;
            question_row.answered_with(answer, claimed.updated_at);
            return Ok(AnswerOutcome::Applied {
                task: claimed,
                question: Box::new(question_row),
                asked: None,
            });
        }
        self.store
            .answer_moving(
                question_row,
                generation,
                answer,
                &decision,
                &open_others,
                model_answer,
            )
            .await
    }
}

/// With a worker polling this replica, applies the answer and claims the task for that worker
/// in one statement, and hands the claim over. `None`, and nothing changed, when no worker
/// polls, a task of a higher priority is pending (it goes first: the answer then queues its run
/// as usual), or the task moved since it was read (the plain answer then says how).
async fn claim_for_idle(
    shared: &Shared,
    question: &QuestionRow,
    generation: i64,
    answer: &Answer,
    chain: &decide::Chain,
) -> Result<Option<Box<TaskRow>>, Error> {
    let Some(waiter) = shared.parked.take() else {
        return Ok(None);
    };
    let claimed = shared
        .store
        .answer_and_claim(question, generation, answer, waiter.worker(), chain)
        .await;
    let claimed = match claimed {
        Ok(Some(claimed)) => claimed,
        other => {
            shared.parked.put_back(waiter);
            return other.map(|_| None);
        }
    };
    let task_row = Box::new(claimed.task.clone());
    let job = pb::RunJob {
        task_id: question.task_id.to_string(),
        generation: (generation + 1) as u64,
        reason: pb::RunReason::ResumeReply as i32,
        ..Default::default()
    };
    handoff::hand(shared, waiter, claimed, job, hark_core::trace::outgoing());
    Ok(Some(task_row))
}

/// The step a questionnaire takes after `answer` to `question`: its round after `last` with
/// the answer recorded (or `all`, every answer with its author, for a question put to several
/// people), and its next question or its output.
fn form_step<'q>(
    question: &QuestionRow,
    questions: &'q [FormQuestion],
    last: Option<serde_json::Value>,
    answer: &Answer,
    all: Option<serde_json::Value>,
) -> Result<FormStep<'q>, Error> {
    let (round, mut answers) = match &last {
        None => (1, serde_json::Map::new()),
        Some(round) => (
            round["round"].as_i64().unwrap_or(0) as i32 + 1,
            progress::answers_in(&round["messages"]).map_err(|e| {
                Error::Internal(format!(
                    "the last round of questionnaire {}: {e}",
                    question.task_id
                ))
            })?,
        ),
    };
    match all {
        Some(all) => progress::record_value(&mut answers, &question.tool_call_id, all),
        None => progress::record(
            &mut answers,
            &question.tool_call_id,
            false,
            &answer.text,
            &question.shape(),
        ),
    }
    let keys = questions.iter().map(|q| q.key.as_str());
    let step = match progress::next(keys.clone(), &answers)
        .and_then(|k| questions.iter().find(|q| q.key == k))
    {
        Some(next) => Step::Ask(next),
        None => Step::Finish(progress::output(keys, &answers)),
    };
    let asking = match &step {
        Step::Ask(next) => Some(next.key.as_str()),
        Step::Finish(_) => None,
    };
    Ok(FormStep {
        round,
        messages: serde_json::Value::Array(progress::step(&answers, asking)),
        step,
    })
}

/// Answers the open questions that wait for a subtask which has ended, with how it ended:
/// `{"task": id, "state": …, "result": …}` (or `"error"`). Each answer carries an inbound key of
/// its question, so one applied twice (by two replicas, or again after a crash) changes
/// nothing. Returns how many were answered.
pub async fn settle_subtasks(answers: Answers<'_>, limit: i64) -> Result<usize, Error> {
    let mut answered = 0;
    for ended in answers.store.ended_subtasks(limit).await? {
        let mut text = serde_json::json!({
            "task": ended.subtask.to_string(),
            "state": ended.state.as_str(),
        });
        if let Some(result) = ended.result {
            text["result"] = serde_json::json!(result);
        }
        if let Some(error) = ended.error {
            text["error"] = serde_json::json!(error);
        }
        let answer = Answer {
            answerer: subtask_answerer(ended.subtask.as_uuid()),
            text: text.to_string(),
            json: None,
            inbound_key: Some(format!("subtask:{}", ended.question)),
        };
        match answers.answer(ended.question, &answer).await {
            Ok(AnswerOutcome::Applied { .. }) => answered += 1,
            Ok(_) => {}
            // Closed meanwhile (the parent was cancelled, say): nothing waits any more.
            Err(
                Error::QuestionClosed { .. } | Error::WrongState { .. } | Error::Already { .. },
            ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(answered)
}

/// Every answer to an ask put to several people, as `(by, text)` in the order they came:
/// the answers `before`, then `answer`.
fn authored<'a>(before: &[&'a Sibling], answer: &'a Answer) -> Vec<(&'a str, &'a str)> {
    before
        .iter()
        .map(|s| {
            (
                s.answerer.as_deref().unwrap_or(&s.owner),
                s.answer.as_deref().unwrap_or_default(),
            )
        })
        .chain([(answer.answerer.as_str(), answer.text.as_str())])
        .collect()
}

/// What the model reads of an ask put to several people: every answer with its author, in the
/// order they came (`answer` the last). For an approval, the decision they make together: a
/// denial, or an approval (for the rest of the task when every approver said so) with the first
/// arguments an approver changed.
fn together(shape: &Shape, before: &[&Sibling], answer: &Answer, denied: bool) -> String {
    let all = authored(before, answer);
    let answers: Vec<serde_json::Value> = all
        .iter()
        .map(|(by, text)| serde_json::json!({"by": by, "answer": shape.value_of(text)}))
        .collect();
    if !matches!(shape, Shape::Approval { .. }) {
        return serde_json::json!({ "answers": answers }).to_string();
    }
    let mut decision = if denied {
        shape.value_of(&answer.text)
    } else {
        let values: Vec<serde_json::Value> = all.iter().map(|(_, t)| shape.value_of(t)).collect();
        let for_task = values.iter().all(|v| v["decision"] == "approve_for_task");
        let mut approved = serde_json::json!({
            "decision": if for_task { "approve_for_task" } else { "approve" }
        });
        if let Some(arguments) = values.iter().find_map(|v| v.get("arguments")) {
            approved["arguments"] = arguments.clone();
        }
        approved
    };
    decision["answers"] = serde_json::Value::Array(answers);
    decision.to_string()
}
