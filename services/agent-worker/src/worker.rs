//! The worker process: pulls run jobs, claims each task, and runs it in one of a bounded number
//! of slots, with a heartbeat that keeps the lease and a subscription that stops the run the
//! moment its task is cancelled. Nothing is kept between jobs.

use std::{sync::Arc, time::Duration};

use async_nats::jetstream::{self, consumer::PullConsumer};
use futures_util::StreamExt;
use hark_core::{
    bus::{self, Names},
    codec,
    config::Config,
    consume::{self, DeadLetters, Failure},
    error::{Classified as _, Kind},
};
use hark_proto::v1 as pb;
use tokio::sync::Semaphore;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    agent::{Inbox, Outcome, Runner},
    control::ControlClient,
    llm, mcp,
    metrics::Metrics,
};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Bus(#[from] bus::Error),
    #[error("cannot build the LLM client: {0}")]
    Llm(#[from] reqwest::Error),
    #[error("cannot open the run job consumer: {0}")]
    Consumer(String),
}

impl hark_core::startup::Permanent for Error {
    /// A run job consumer that cannot be opened yet (JetStream electing a leader on a cluster,
    /// say) is waited for; an LLM client that cannot be built never will be.
    fn permanent(&self) -> bool {
        match self {
            Error::Bus(e) => e.permanent(),
            Error::Llm(_) => true,
            Error::Consumer(_) => false,
        }
    }
}

/// Whether a worker is alive: its pull loop asks for jobs (or its slots are all busy), NATS is
/// connected, and a task-control replica answers its requests.
#[derive(Debug, Clone)]
pub struct Health {
    nats: async_nats::Client,
    names: Names,
    metrics: std::sync::Arc<Metrics>,
}

/// How long a worker waits for its MCP servers before it takes jobs.
const MCP_START_WAIT: Duration = Duration::from_secs(10);

/// How long a poll waits at task-control before it is sent again.
const POLL_WAIT: Duration = Duration::from_secs(5);

/// How long the pull loop may be silent while no run is in flight (one pull waits 5 s).
const PULL_SILENCE: Duration = Duration::from_secs(30);

impl Health {
    /// `Ok` with what was seen, or what is wrong.
    pub async fn check(&self) -> Result<serde_json::Value, String> {
        if self.nats.connection_state() != async_nats::connection::State::Connected {
            return Err("NATS is not connected (nats.url)".into());
        }
        let running = self.metrics.running.get();
        let since_pull = self.metrics.since_pull();
        match since_pull {
            None => return Err("the worker has not asked for jobs yet".into()),
            Some(silent) if silent > PULL_SILENCE && running == 0 => {
                return Err(format!(
                    "the worker's pull loop has not asked for jobs for {}s",
                    silent.as_secs()
                ));
            }
            _ => {}
        }
        // Any answer, a refusal included, means a task-control replica serves requests.
        let subject = self.names.control(bus::ControlOp::Heartbeat);
        match tokio::time::timeout(
            Duration::from_secs(2),
            self.nats.request(subject, Default::default()),
        )
        .await
        {
            Ok(Ok(_)) => Ok(serde_json::json!({
                "status": "ok",
                "runs": running,
                "last_pull_ms": since_pull.map(|d| d.as_millis() as u64),
            })),
            Ok(Err(e)) => Err(format!(
                "task-control does not answer control requests: {e}"
            )),
            Err(_) => Err("task-control did not answer a control request within 2s".into()),
        }
    }
}

/// A built worker, ready to run.
#[derive(Debug)]
pub struct Worker {
    runner: Runner,
    nats: async_nats::Client,
    js: jetstream::Context,
    names: Names,
    concurrency: usize,
    /// Whether one idle slot waits at task-control for a job handed over directly.
    poll: bool,
    /// Where run jobs that can never be taken are set aside.
    dead: DeadLetters,
    /// The runs in flight, by task id, so a cancel hint can stop the right one: its stop token
    /// and its "no longer ours" token.
    running: Arc<std::sync::Mutex<std::collections::HashMap<String, RunTokens>>>,
}

/// A run's stop token and its "the task is no longer ours" token.
type RunTokens = (CancellationToken, CancellationToken);

/// How long a pull waits for run jobs.
const PULL_WAIT: Duration = Duration::from_secs(5);
/// How long it waits when slots are scarce (see `Worker::pull`).
const SCARCE_PULL_WAIT: Duration = Duration::from_millis(250);

impl Worker {
    /// Connects to NATS and makes sure the streams exist. `worker_id` names this worker in
    /// leases and logs.
    pub async fn build(
        config: &Config,
        llm: llm::Settings,
        worker_id: String,
    ) -> Result<Self, Error> {
        let connection = bus::connect(&config.nats, &format!("hark worker {worker_id}")).await?;
        Self::assemble(config, llm, worker_id, connection)
    }

    /// Like [`Worker::build`], waiting with capped backoff (and saying so) while NATS does not
    /// answer; `None` when `shutdown` fires first.
    pub async fn build_waiting(
        config: &Config,
        llm: llm::Settings,
        worker_id: String,
        shutdown: &CancellationToken,
    ) -> Result<Option<Self>, Error> {
        let what = format!(
            "NATS with JetStream at nats.url = {}",
            hark_core::secret::redact_url(config.nats.url.expose())
        );
        let name = format!("hark worker {worker_id}");
        let Some(connection) =
            hark_core::startup::wait_for(&what, shutdown, || bus::connect(&config.nats, &name))
                .await?
        else {
            return Ok(None);
        };
        Self::assemble(config, llm, worker_id, connection).map(Some)
    }

    fn assemble(
        config: &Config,
        llm: llm::Settings,
        worker_id: String,
        connection: bus::Connection,
    ) -> Result<Self, Error> {
        let bus::Connection {
            client: nats,
            js,
            names,
        } = connection;
        let tools = mcp::Hub::new(&config.tools);
        let runner = Runner {
            control: ControlClient::new(nats.clone(), names.clone()),
            llm: llm::Client::new(llm)?,
            tools,
            worker_id,
            max_rounds: config.task.max_rounds,
            language: config.chat.language,
        };
        Ok(Self {
            runner,
            nats,
            dead: DeadLetters::new(js.clone(), names.clone()),
            js,
            names,
            concurrency: config.worker.concurrency as usize,
            // With one slot, a poll and the pull would take turns at it.
            poll: config.worker.poll && config.worker.concurrency >= 2,
            running: Default::default(),
        })
    }

    /// The worker's tools, with the MCP servers they come from.
    pub fn tools(&self) -> Arc<mcp::Hub> {
        self.runner.tools.clone()
    }

    pub fn worker_id(&self) -> &str {
        &self.runner.worker_id
    }

    /// The process's worker metrics (shared by every worker of the process).
    pub fn metrics(&self) -> &Metrics {
        self.runner.llm.metrics()
    }

    /// What the worker's `/healthz` checks, usable after the worker has been moved into its
    /// loop.
    pub fn health(&self) -> Health {
        Health {
            nats: self.nats.clone(),
            names: self.names.clone(),
            metrics: self.runner.llm.metrics().clone(),
        }
    }

    /// Runs jobs until `shutdown`. Runs in flight then stop at their next step and hand their
    /// tasks back, so that another worker continues each from its last checkpoint at once.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> Result<(), Error> {
        self.runner.tools.start(shutdown.clone());
        // Runs started before a server is connected would not see its tools.
        if let Err(missing) = self.runner.tools.connected(MCP_START_WAIT).await {
            tracing::warn!(
                servers = missing.join(", "),
                "MCP servers not connected after {}s (tools.mcp); their tools are offered once they are",
                MCP_START_WAIT.as_secs()
            );
        }
        // One consumer per partition of TASK_RUN, each pulled on its own, all sharing the slots.
        let open = || async {
            let mut consumers: Vec<PullConsumer> = Vec::new();
            for (stream, _) in self.names.task_run_partitions() {
                consumers.push(
                    self.js
                        .get_consumer_from_stream(Names::WORKER_CONSUMER, &stream)
                        .await
                        .map_err(|e| Error::Consumer(format!("{stream}: {e}")))?,
                );
            }
            Ok::<_, Error>(consumers)
        };
        let Some(consumers) =
            hark_core::startup::wait_for("the run job consumers in JetStream", &shutdown, open)
                .await?
        else {
            return Ok(());
        };
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let tracker = TaskTracker::new();
        let this = Arc::new(self);
        tokio::spawn(this.clone().watch_cancels(shutdown.clone()));
        // Runs stop once task-control forgot this worker's polls, so that a task a run hands
        // back is never handed to this worker again.
        let runs_stop = CancellationToken::new();
        // Cancelled once the poll loop has stopped: no poll of this worker is sent after it.
        let polls_stopped = CancellationToken::new();
        {
            let (this, shutdown, runs_stop, polls_stopped) = (
                this.clone(),
                shutdown.clone(),
                runs_stop.clone(),
                polls_stopped.clone(),
            );
            tokio::spawn(async move {
                shutdown.cancelled().await;
                if this.poll {
                    polls_stopped.cancelled().await;
                    this.runner.control.stopping(&this.runner.worker_id).await;
                }
                runs_stop.cancel();
            });
        }
        match slots.clone().try_acquire_owned() {
            Ok(permit) if this.poll => {
                tracker.spawn(this.clone().poll(
                    permit,
                    slots.clone(),
                    tracker.clone(),
                    shutdown.clone(),
                    runs_stop.clone(),
                    polls_stopped,
                ));
            }
            _ => polls_stopped.cancel(),
        }
        tracing::info!(
            worker = this.runner.worker_id,
            slots = this.concurrency,
            "worker started"
        );
        let partitions = consumers.len();
        let pulls: Vec<_> = consumers
            .into_iter()
            .map(|consumer| {
                tokio::spawn(this.clone().pull(
                    consumer,
                    slots.clone(),
                    tracker.clone(),
                    shutdown.clone(),
                    runs_stop.clone(),
                    partitions,
                ))
            })
            .collect();
        for pull in pulls {
            if let Err(e) = pull.await {
                tracing::error!(error = %e, "pulling run jobs ended abnormally");
            }
        }
        tracker.close();
        tracker.wait().await;
        tracing::info!(worker = this.runner.worker_id, "worker stopped");
        Ok(())
    }

    /// Pulls run jobs from one of the `partitions` of `TASK_RUN` while slots are free, until
    /// `shutdown`.
    async fn pull(
        self: Arc<Self>,
        consumer: PullConsumer,
        slots: Arc<Semaphore>,
        tracker: TaskTracker,
        shutdown: CancellationToken,
        runs_stop: CancellationToken,
        partitions: usize,
    ) {
        let this = self;
        // A partition's pull holds at most its share of the slots while it waits for jobs, so
        // that an idle partition does not keep them from the others.
        let share = this.concurrency.div_ceil(partitions.max(1)).max(1);
        loop {
            let first = tokio::select! {
                _ = shutdown.cancelled() => return,
                permit = slots.clone().acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => return,
                },
            };
            let mut permits = vec![first];
            while permits.len() < share
                && let Ok(p) = slots.clone().try_acquire_owned()
            {
                permits.push(p);
            }
            this.runner.llm.metrics().pulling();
            // A pull waits for jobs holding its slots. When fewer slots are left free than there
            // are partitions, another partition may have none to pull with: the wait is then
            // short, so that a job there waits for a slot at most that long.
            let expires = if partitions > 1 && slots.available_permits() < partitions {
                SCARCE_PULL_WAIT
            } else {
                PULL_WAIT
            };
            let batch = consumer
                .fetch()
                .max_messages(permits.len())
                .expires(expires)
                .messages()
                .await;
            let mut batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot pull run jobs; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            loop {
                let next = tokio::select! {
                    _ = shutdown.cancelled() => None,
                    next = batch.next() => next,
                };
                let Some(message) = next else { break };
                let message = match message {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(error = %e, "pull failed");
                        break;
                    }
                };
                let Some(permit) = permits.pop() else { break };
                let (this, shutdown) = (this.clone(), runs_stop.clone());
                // The job runs in the trace of what queued it: a task's creation, an answer.
                let trace = hark_core::trace::from_headers(message.headers.as_ref());
                let span = hark_core::trace::process_span(&message.subject);
                tracker.spawn(hark_core::trace::scope_in(span, trace, async move {
                    let metrics = this.runner.llm.metrics();
                    metrics.running.add(1);
                    if let Err(panic) =
                        consume::unwound(Box::pin(this.handle(message, shutdown))).await
                    {
                        ran_into(&panic);
                    }
                    metrics.running.add(-1);
                    drop(permit);
                }));
            }
            if shutdown.is_cancelled() {
                return;
            }
        }
    }

    /// Keeps one idle slot waiting at task-control for a job handed over directly (see
    /// `PollRequest`); the slot goes with each task handed over, and the next free one waits.
    async fn poll(
        self: Arc<Self>,
        mut permit: tokio::sync::OwnedSemaphorePermit,
        slots: Arc<Semaphore>,
        tracker: TaskTracker,
        shutdown: CancellationToken,
        runs_stop: CancellationToken,
        polls_stopped: CancellationToken,
    ) {
        let _stopped = polls_stopped.drop_guard();
        loop {
            let polled = tokio::select! {
                // A stopping worker sends no new poll.
                biased;
                _ = shutdown.cancelled() => return,
                polled = self.runner.control.poll(&self.runner.worker_id, POLL_WAIT) => polled,
            };
            match polled {
                Ok(Some(handed)) => {
                    self.runner.control.take(&handed).await;
                    tracing::debug!(task = handed.job.task_id, "claimed (handed over)");
                    let span = hark_core::trace::process_span(&self.names.task_run());
                    let trace = hark_core::trace::TraceContext::parse(&handed.traceparent);
                    let (this, stop) = (self.clone(), runs_stop.clone());
                    tracker.spawn(hark_core::trace::scope_in(span, trace, async move {
                        let metrics = this.runner.llm.metrics();
                        metrics.running.add(1);
                        let task = handed.job.task_id.clone();
                        match consume::unwound(Box::pin(this.run_claimed(handed.claim, stop))).await
                        {
                            Ok(outcome) => tracing::debug!(task, ?outcome, "run ended"),
                            Err(panic) => ran_into(&panic),
                        }
                        metrics.running.add(-1);
                        drop(permit);
                    }));
                    permit = tokio::select! {
                        _ = shutdown.cancelled() => return,
                        next = slots.clone().acquire_owned() => match next {
                            Ok(next) => next,
                            Err(_) => return,
                        },
                    };
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "cannot poll task-control; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        }
    }

    fn lock_running(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, RunTokens>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One subscription for every task's cancel hint; a hint for a task this worker runs stops
    /// that run at its next step, an LLM call in flight included.
    async fn watch_cancels(self: Arc<Self>, shutdown: CancellationToken) {
        let mut hints = match self.nats.subscribe(self.names.task_cancel_all()).await {
            Ok(hints) => hints,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch for cancellations; relying on refusals");
                return;
            }
        };
        loop {
            let hint = tokio::select! {
                _ = shutdown.cancelled() => return,
                hint = hints.next() => hint,
            };
            let Some(hint) = hint else { return };
            let Some(task) = self.names.task_of_cancel(&hint.subject) else {
                continue;
            };
            let task = task.to_string();
            if let Some((cancel, gone)) = self.lock_running().get(&task) {
                tracing::info!(task, "cancelled: stopping the run");
                gone.cancel();
                cancel.cancel();
            }
        }
    }

    async fn handle(&self, message: jetstream::Message, shutdown: CancellationToken) {
        let mut claimed = None;
        // The job is settled once claimed: the task is ours under a lease now, and if this
        // process dies the lease lapses and the task is recovered. A job whose task moved on is
        // done; one task-control could not decide now comes back later; one it can never take
        // (or whose claim panics, time after time) is set aside.
        consume::handle(&message, "task_run", &self.dead, async {
            let job: pb::RunJob = codec::decode(&message.payload)
                .map_err(|e| Failure::new(Kind::Invalid, format!("undecodable run job: {e}")))?;
            tracing::debug!(
                task = job.task_id,
                generation = job.generation,
                "run job received"
            );
            match self
                .runner
                .control
                .claim(&job, &self.runner.worker_id)
                .await
            {
                Ok(claim) => {
                    claimed = Some((job, claim));
                    Ok(())
                }
                Err(e) => match e.kind() {
                    Kind::Gone | Kind::NotFound | Kind::Conflict => {
                        tracing::debug!(task = job.task_id, error = %e, "run job no longer applies");
                        Ok(())
                    }
                    kind => {
                        tracing::warn!(task = job.task_id, error = %e, "cannot claim");
                        Err(Failure::new(kind, e.to_string()))
                    }
                },
            }
        })
        .await;
        let Some((job, claim)) = claimed else { return };
        tracing::debug!(task = job.task_id, "claimed");
        let outcome = self.run_claimed(claim, shutdown).await;
        tracing::debug!(task = job.task_id, ?outcome, "run ended");
    }

    async fn run_claimed(
        &self,
        claimed: pb::ClaimResponse,
        shutdown: CancellationToken,
    ) -> Outcome {
        let Some(lease) = claimed.lease.clone() else {
            return Outcome::Stopped("no lease".into());
        };
        // `cancel` stops the run at its next step (the worker stops, or the task is not ours);
        // `gone` says the task is not ours any more, so nothing is written for it and it is not
        // handed back.
        let cancel = shutdown.child_token();
        let gone = CancellationToken::new();
        let inbox = Inbox::default();
        let helpers = CancellationToken::new();

        // Stop at once when the task is cancelled (see `watch_cancels`).
        self.lock_running()
            .insert(lease.task_id.clone(), (cancel.clone(), gone.clone()));

        // Keep the lease, and pick up told instructions.
        {
            let (control, lease, inbox, cancel, gone, helpers) = (
                self.runner.control.clone(),
                lease.clone(),
                inbox.clone(),
                cancel.clone(),
                gone.clone(),
                helpers.clone(),
            );
            let every = Duration::from_millis(u64::from(claimed.lease_ms.max(1000)) / 3);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                loop {
                    tokio::select! {
                        _ = helpers.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    match control.heartbeat(&lease).await {
                        Ok(response) => inbox.push(response.instructions),
                        Err(e) if e.is_final() => {
                            tracing::info!(task = lease.task_id, error = %e, "stopping: the task is no longer ours");
                            gone.cancel();
                            cancel.cancel();
                            return;
                        }
                        // task-control cannot renew it now; the run goes on, and its requests
                        // wait, while the lease may still hold.
                        Err(e) => {
                            tracing::warn!(task = lease.task_id, error = %e, "heartbeat failed")
                        }
                    }
                }
            });
        }

        // Once the worker stops, waiting for task-control on this run's behalf ends when the
        // lease would have lapsed anyway: a stop takes at most one lease.
        {
            let (shutdown, gone, helpers) = (shutdown.clone(), gone.clone(), helpers.clone());
            let lease = Duration::from_millis(u64::from(claimed.lease_ms.max(1000)));
            tokio::spawn(async move {
                tokio::select! {
                    _ = helpers.cancelled() => {}
                    _ = shutdown.cancelled() => {
                        tokio::select! {
                            _ = helpers.cancelled() => {}
                            _ = tokio::time::sleep(lease) => gone.cancel(),
                        }
                    }
                }
            });
        }

        let task_id = lease.task_id.clone();
        let span = tracing::info_span!(
            "invoke_agent",
            otel.name = "invoke_agent hark",
            otel.kind = "internal",
            gen_ai.operation.name = "invoke_agent",
            gen_ai.agent.name = "hark",
            gen_ai.conversation.id = %task_id,
            gen_ai.request.model = self.runner.llm.model(),
        );
        // The run that resumes a task links the span that asked its question.
        if let Some(asked) = claimed
            .resume
            .as_ref()
            .and_then(|r| hark_core::trace::TraceContext::parse(&r.asked_traceparent))
        {
            span.in_scope(|| hark_core::trace::link_current_to(asked));
        }
        let outcome = {
            use tracing::Instrument as _;
            // A run's future is large; boxed, it is written once where it stays, and the
            // futures that hold it, which tokio moves as it spawns them, stay small.
            Box::pin(self.runner.run(claimed, cancel, gone.clone(), inbox))
                .instrument(span)
                .await
        };
        self.lock_running().remove(&task_id);
        let outcome = self.hand_back(outcome, &lease, &shutdown, &gone).await;
        helpers.cancel();
        outcome
    }

    /// A run stopped because this worker stops: its task is handed back at once, so another
    /// worker continues it without waiting for the lease to lapse, and no attempt is lost.
    async fn hand_back(
        &self,
        outcome: Outcome,
        lease: &pb::Lease,
        shutdown: &CancellationToken,
        gone: &CancellationToken,
    ) -> Outcome {
        let task_id = &lease.task_id;
        if matches!(outcome, Outcome::Pausing) && !gone.is_cancelled() {
            return match self
                .runner
                .control
                .release(lease, "paused by its owner", gone)
                .await
            {
                Ok(()) => {
                    tracing::info!(task = task_id, "paused at a round boundary");
                    Outcome::Paused
                }
                Err(e) => {
                    tracing::warn!(task = task_id, error = %e, "could not hand a paused task back; its lease will lapse");
                    Outcome::Stopped(e.to_string())
                }
            };
        }
        if matches!(outcome, Outcome::Stopped(_)) && shutdown.is_cancelled() && !gone.is_cancelled()
        {
            match self
                .runner
                .control
                .release(lease, "the worker stopped", gone)
                .await
            {
                Ok(()) => {
                    tracing::info!(task = task_id, "handed the task back");
                    return Outcome::HandedBack;
                }
                Err(e) => {
                    tracing::warn!(task = task_id, error = %e, "could not hand the task back; its lease will lapse")
                }
            }
        }
        outcome
    }
}

/// A run that panicked: logged, and the worker's loop goes on. Its task is held under a lease
/// that lapses; it is then recovered by another attempt, at most `task.max_attempts` in all.
fn ran_into(panic: &str) {
    tracing::error!(
        panic,
        "a run panicked; its task is recovered when its lease lapses"
    );
}
