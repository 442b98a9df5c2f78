//! A questionnaire's step taken by task-control itself. No model runs for a questionnaire, so
//! after an answer its next step — ask the next question, or complete with every answer — needs
//! no worker: the process that applied the answer claims the task like a worker would, takes the
//! step and writes it, each move a compare-and-set as usual.
//!
//! The answer's run job stays in the outbox meanwhile. When the claim loses or fails the job is
//! published and a worker takes the step; when this process dies first the outbox sweep publishes
//! it. Either way the step is taken once: whoever claims the task's generation first takes it.

use std::time::Duration;

use hark_core::domain::form::progress;

use super::{AskInput, Claimed, Error, OutboxMessage, Store, TaskRow};

/// The worker id the steps taken here are held under.
pub const WORKER: &str = "task-control";

impl Store {
    pub(super) async fn form_step(self, task: TaskRow, job: OutboxMessage, lease: Duration) {
        let claimed = match self.claim(task.id, task.generation, WORKER, lease).await {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::debug!(task = %task.id, error = %e, "a worker takes the questionnaire's step");
                self.published(vec![job]);
                return;
            }
        };
        let step = self.take_step(&claimed).await;
        // The job is done with: its row goes with the relay's next batch. Should this process
        // die first, the sweep publishes it and a worker finds it stale.
        self.done_with
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((job.subject, job.msg_id));
        if let Err(e) = step {
            // Handed back for a worker; should even that fail, the lease runs out and the
            // task is recovered.
            tracing::warn!(task = %task.id, error = %e, "a questionnaire's step failed here; handing it back");
            let _ = self
                .release(&claimed.lease, "task-control could not take the step")
                .await;
        }
    }

    async fn take_step(&self, claimed: &Claimed) -> Result<(), Error> {
        let number = claimed.rounds.last().map_or(0, |r| r.round) + 1;
        let mut answers = match claimed.rounds.last() {
            None => serde_json::Map::new(),
            Some(round) => progress::answers_in(&round.messages.0).map_err(|e| {
                Error::Internal(format!("round {} of the questionnaire: {e}", round.round))
            })?,
        };
        if let Some(resume) = &claimed.resume {
            progress::record(
                &mut answers,
                &resume.tool_call_id,
                resume.expired,
                &resume.text,
            );
        }
        let questions = claimed.task.questionnaire();
        let keys = questions.iter().map(|q| q.key.as_str());
        match progress::next(keys.clone(), &answers)
            .and_then(|k| questions.iter().find(|q| q.key == k))
        {
            Some(question) => {
                let input = AskInput {
                    round: number,
                    messages: serde_json::Value::Array(progress::step(
                        &answers,
                        Some(&question.key),
                    )),
                    consumed_instructions: Vec::new(),
                    tool_call_id: progress::call_id(&question.key),
                    question: question.text.clone(),
                    context: String::new(),
                    timeout: None,
                    choices: question.choices.clone(),
                };
                self.ask(&claimed.lease, &input).await.map(|_| ())
            }
            None => {
                let last = serde_json::Value::Array(progress::step(&answers, None));
                let output = progress::output(keys, &answers);
                self.complete(&claimed.lease, Some((number, &last)), &output)
                    .await
                    .map(|_| ())
            }
        }
    }
}
