//! task-control as a whole: [`App::build`] connects to Postgres and NATS, migrates, creates the
//! streams and binds the gRPC listener; [`App::run_until_stopped`] serves until the shutdown
//! token fires, then drains its tasks.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use hark_core::{
    bus::{self, Names},
    codec,
    config::Config,
    consume::{self, Failure},
    domain::QuestionId,
    error::{Classified as _, Kind},
    publish,
};
use hark_proto::v1 as pb;
use tokio::{net::TcpListener, sync::mpsc::UnboundedReceiver};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::{
    api, cases::handoff, chat, control, shared::Shared, store, store::OutboxMessage, timers,
};
use hark_core::startup;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] hark_core::config::Error),
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error(transparent)]
    Bus(#[from] bus::Error),
    #[error("cannot listen for gRPC on control.grpc_listen = {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("{0}")]
    Serve(String),
}

/// A built task-control, ready to run.
#[derive(Debug)]
pub struct App {
    shared: Shared,
    listener: TcpListener,
    /// Outbox messages of committed transactions, for the relay.
    committed: UnboundedReceiver<Vec<OutboxMessage>>,
    /// The web console's listener (`control.http_listen`), when there is one.
    console: Option<std::net::TcpListener>,
}

impl App {
    /// Builds task-control when Postgres and NATS answer now; fails at once when they do not.
    pub async fn build(config: Config) -> Result<Self, Error> {
        let (listener, console) = bind(&config)?;
        let pool = connect_store(&config).await?;
        let connection = bus::connect(&config.nats, "hark task-control").await?;
        Self::assemble(config, listener, console, pool, connection)
    }

    /// Builds task-control, waiting (with capped backoff, saying what it waits for) for
    /// Postgres and NATS to answer. Meanwhile the gRPC listener serves health only, as
    /// `NOT_SERVING`, so that probes see the role is up and not ready. `None` when `shutdown`
    /// fires first. A configuration that can never work fails at once.
    pub async fn build_waiting(
        config: Config,
        shutdown: &CancellationToken,
    ) -> Result<Option<Self>, Error> {
        let (listener, console) = bind(&config)?;
        let interim = NotReady::serve(&listener)?;
        let database = format!(
            "Postgres at database.url = {}",
            hark_core::secret::redact_url(config.database.url.expose())
        );
        let Some(pool) = startup::wait_for(&database, shutdown, || connect_store(&config)).await?
        else {
            return Ok(None);
        };
        let nats = format!(
            "NATS with JetStream at nats.url = {}",
            hark_core::secret::redact_url(config.nats.url.expose())
        );
        let Some(connection) = startup::wait_for(&nats, shutdown, || {
            bus::connect(&config.nats, "hark task-control")
        })
        .await?
        else {
            return Ok(None);
        };
        interim.stop().await;
        Self::assemble(config, listener, console, pool, connection).map(Some)
    }

    fn assemble(
        config: Config,
        listener: std::net::TcpListener,
        console: Option<std::net::TcpListener>,
        pool: sqlx::PgPool,
        connection: bus::Connection,
    ) -> Result<Self, Error> {
        let addr = config.control.grpc_listen;
        let listener =
            TcpListener::from_std(listener).map_err(|source| Error::Listen { addr, source })?;
        let bus::Connection {
            client: nats,
            js,
            names,
        } = connection;
        let (relay, committed) = tokio::sync::mpsc::unbounded_channel();
        let parked = Arc::new(crate::parked::Parked::default());
        let platforms = std::iter::once(config.gateway.onebot.platform.clone())
            .chain(config.gateway.http.platforms.iter().cloned());
        let metrics = Arc::new(crate::metrics::Metrics::new(platforms));
        let scraped = Arc::new(crate::metrics::Scraped {
            metrics: metrics.clone(),
            pool: pool.clone(),
            js: js.clone(),
            names: names.clone(),
        });
        hark_core::metrics::Registry::global().register(scraped.clone());
        let store = store::Store::new(
            pool,
            names.clone(),
            crate::texts::Languages::new(&config.chat),
        )
        .with_relay(relay)
        .with_policy(hark_core::domain::decide::Policy {
            max_attempts: i32::try_from(config.task.max_attempts).unwrap_or(i32::MAX),
        })
        .with_questionnaire_steps()
        .with_remind_before(config.task.remind_before.0)
        .with_metrics(metrics);
        Ok(Self {
            shared: Shared {
                store,
                nats,
                js: js.clone(),
                names: names.clone(),
                commands: Arc::new(crate::limit::CommandLimiter::new(
                    config.chat.commands_per_minute,
                )),
                watchers: crate::watchers::Watchers::new(crate::watchers::Limits {
                    total: config.control.max_watchers.into(),
                    per_connection: config.control.max_watchers_per_connection.into(),
                    per_token: config.control.max_watchers_per_token.into(),
                }),
                metrics: scraped,
                parked,
                dead: hark_core::consume::DeadLetters::new(js.clone(), names.clone()),
                liveness: Default::default(),
                config: Arc::new(config),
            },
            listener,
            committed,
            console,
        })
    }

    /// The address the gRPC API listens on (the real port when the config said 0).
    pub fn grpc_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or(self.shared.config.control.grpc_listen)
    }

    /// The address the web console listens on, when there is one.
    pub fn console_addr(&self) -> Option<SocketAddr> {
        self.console.as_ref().and_then(|l| l.local_addr().ok())
    }

    pub fn shared(&self) -> &Shared {
        &self.shared
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> Result<(), Error> {
        let Self {
            shared,
            listener,
            committed,
            console,
        } = self;
        let tracker = TaskTracker::new();
        // Control requests are served before anything publishes a run job, so that a worker
        // given one at start finds a replica to claim it from.
        let requests = control::subscribe(&shared)
            .await
            .map_err(|e| Error::Serve(format!("cannot take control requests (nats.url): {e}")))?;
        tracker.spawn(control::serve(shared.clone(), requests, shutdown.clone()));

        {
            let (watchers, shutdown) = (shared.watchers.clone(), shutdown.clone());
            tracker.spawn(async move {
                shutdown.cancelled().await;
                watchers.stop();
            });
        }
        tracker.spawn(relay(shared.clone(), committed, shutdown.clone()));
        if let Some(console) = console {
            tracker.spawn(crate::console::serve(
                shared.clone(),
                console,
                shutdown.clone(),
            ));
        }
        tracker.spawn(sweep(shared.clone(), shutdown.clone()));
        tracker.spawn(handoff::forget_stopping(shared.clone(), shutdown.clone()));
        tracker.spawn(timers::run(shared.clone(), shutdown.clone()));
        tracker.spawn(timers::upkeep(shared.clone(), shutdown.clone()));
        tracker.spawn(timers::retention(shared.clone(), shutdown.clone()));
        tracker.spawn(consume_chat(shared.clone(), shutdown.clone()));
        tracker.spawn(consume_receipts(shared.clone(), shutdown.clone()));
        tracker.spawn(shared.watchers.clone().run(
            shared.nats.clone(),
            shared.names.task_events(),
            shutdown.clone(),
        ));
        tracker.spawn(shared.watchers.clone().feed(
            shared.js.clone(),
            shared.names.clone(),
            shutdown.clone(),
        ));

        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_serving::<pb::task_service_server::TaskServiceServer<api::Api>>()
            .await;
        tracker.spawn(watch_health(shared.clone(), health, shutdown.clone()));
        let reflection = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(hark_proto::PUBLIC_FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .map_err(|e| Error::Serve(format!("cannot build gRPC reflection: {e}")))?;
        let auth = api::Auth::new(shared.config.control.api_tokens.clone());
        let service = pb::task_service_server::TaskServiceServer::with_interceptor(
            api::Api::new(shared.clone()).counting(auth.failures()),
            auth,
        );
        // Without TCP_NODELAY, answers to requests multiplexed on one connection wait for the
        // client's delayed ACK (40 ms) whenever an earlier reply is still unacknowledged.
        let incoming =
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let served = tonic::transport::Server::builder()
            .layer(crate::traced::TraceLayer)
            .add_service(health_service)
            .add_service(reflection)
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, shutdown.clone().cancelled_owned())
            .await;
        shutdown.cancel();
        tracker.close();
        tracker.wait().await;
        served.map_err(|e| Error::Serve(format!("gRPC server failed: {e}")))
    }
}

/// Checks the configuration that can be checked without a dependency, and binds the gRPC
/// listener and the web console's.
fn bind(config: &Config) -> Result<(std::net::TcpListener, Option<std::net::TcpListener>), Error> {
    config.check_control_exposure()?;
    let addr = config.control.grpc_listen;
    let listener =
        std::net::TcpListener::bind(addr).map_err(|source| Error::Listen { addr, source })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| Error::Listen { addr, source })?;
    if let Ok(bound) = listener.local_addr() {
        hark_core::listen::bound("control.grpc_listen", bound);
    }
    let console = crate::console::bind(config).map_err(Error::Serve)?;
    Ok((listener, console))
}

/// Connects to Postgres and migrates.
async fn connect_store(config: &Config) -> Result<sqlx::PgPool, store::Error> {
    let pool = store::connect(
        config.database.url.expose(),
        config.database.max_connections,
    )
    .await?;
    store::migrate(&pool).await?;
    Ok(pool)
}

/// The gRPC health service answering `NOT_SERVING`, and the API answering `UNAVAILABLE`, while
/// task-control waits for its dependencies, on a second handle of the listener the real API
/// takes over afterwards.
struct NotReady {
    stop: CancellationToken,
    served: tokio::task::JoinHandle<()>,
}

impl NotReady {
    fn serve(listener: &std::net::TcpListener) -> Result<Self, Error> {
        let addr = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        let listen = |source| Error::Listen { addr, source };
        let interim =
            TcpListener::from_std(listener.try_clone().map_err(listen)?).map_err(listen)?;
        let stop = CancellationToken::new();
        let token = stop.clone();
        let served = tokio::spawn(async move {
            let (health, service) = tonic_health::server::health_reporter();
            health
                .set_not_serving::<pb::task_service_server::TaskServiceServer<api::Api>>()
                .await;
            health
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
            let incoming = tonic::transport::server::TcpIncoming::from(interim);
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .add_service(pb::task_service_server::TaskServiceServer::new(
                    api::Starting,
                ))
                .serve_with_incoming_shutdown(incoming, token.cancelled_owned())
                .await;
        });
        Ok(Self { stop, served })
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.served.await;
    }
}

/// Reports NOT_SERVING while NATS or Postgres does not answer, or one of this replica's
/// consumers has not consumed for [`consume::STALLED_AFTER`]; SERVING again once all do.
async fn watch_health(
    shared: Shared,
    health: tonic_health::server::HealthReporter,
    shutdown: CancellationToken,
) {
    type Service = pb::task_service_server::TaskServiceServer<api::Api>;
    let mut serving = true;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
        let nats_up = shared.nats.connection_state() == async_nats::connection::State::Connected;
        let db_up = sqlx::query("SELECT 1")
            .execute(shared.store.pool())
            .await
            .is_ok();
        let stalled = shared.liveness.stalled_for(consume::STALLED_AFTER);
        match (serving, nats_up && db_up && stalled.is_empty()) {
            (true, false) => {
                let stalled: Vec<String> = stalled
                    .iter()
                    .map(|(name, why)| format!("{name}: {why}"))
                    .collect();
                tracing::warn!(
                    nats_up,
                    db_up,
                    stalled = stalled.join("; "),
                    "not serving: a dependency does not answer, or a consumer does not consume"
                );
                health.set_not_serving::<Service>().await;
                serving = false;
            }
            (false, true) => {
                tracing::info!("serving again");
                health.set_serving::<Service>().await;
                serving = true;
            }
            _ => {}
        }
    }
}

/// Publishes outbox messages the moment their transaction commits, and forgets them (in
/// batches, off the hot path) once JetStream acknowledged them.
async fn relay(
    shared: Shared,
    mut committed: UnboundedReceiver<Vec<OutboxMessage>>,
    shutdown: CancellationToken,
) {
    let acknowledged: handoff::Delivered = Default::default();
    let mut flush = tokio::time::interval(Duration::from_millis(50));
    let events = shared.names.task_events();
    loop {
        let batch = tokio::select! {
            batch = committed.recv() => batch,
            _ = flush.tick() => {
                forget(&shared, &acknowledged).await;
                continue;
            }
            _ = shutdown.cancelled() => None,
        };
        let Some(mut batch) = batch else { break };
        // Take whatever else committed meanwhile, to publish it in one pipelined go.
        while let Ok(more) = committed.try_recv() {
            batch.extend(more);
        }
        let mut pending = Vec::with_capacity(batch.len());
        for message in batch {
            if !message.durable {
                // A task event reaches this process's watchers at once, without the trip
                // through NATS; the copy that comes back is recognised by its generation.
                if shared.watchers.count() > 0
                    && message.subject == events
                    && let Ok(event) = codec::decode::<pb::TaskEvent>(&message.payload)
                {
                    shared.watchers.dispatch(event);
                }
                // Best effort: no outbox row to forget, no ack to wait for.
                let mut headers = async_nats::HeaderMap::new();
                let (_span, traceparent) =
                    publish::sending(&message.subject, message.trace.as_deref());
                if let Some(trace) = &traceparent {
                    headers.insert(hark_core::trace::HEADER, trace.as_str());
                }
                if let Err(e) = shared
                    .nats
                    .publish_with_headers(message.subject, headers, message.payload)
                    .await
                {
                    tracing::debug!(error = %e, "cannot publish a task event");
                }
                continue;
            }
            // A worker waits here: it gets the run job at once, claimed for it.
            if shared.names.is_task_run(&message.subject)
                && let Some(waiter) = shared.parked.take()
            {
                // The run continues from the hand-over, as it would from the job's send.
                let (_span, traceparent) =
                    publish::sending(&message.subject, message.trace.as_deref());
                tokio::spawn(handoff::hand_over(
                    shared.clone(),
                    waiter,
                    message,
                    traceparent,
                    acknowledged.clone(),
                ));
                continue;
            }
            let outgoing = publish::Outgoing {
                subject: message.subject.clone(),
                msg_id: &message.msg_id,
                payload: message.payload.clone(),
                trace: message.trace.as_deref(),
            };
            match publish::send(&shared.js, outgoing).await {
                Ok(sent) => pending.push((message, sent)),
                // Left in the outbox: the sweep publishes it.
                Err(e) => tracing::warn!(error = %e, "the sweep will publish the message"),
            }
        }
        tracing::debug!(messages = pending.len(), "relayed");
        let mut published = Vec::with_capacity(pending.len());
        for (message, sent) in pending {
            match sent.acked().await {
                Ok(_) => {
                    if shared.names.is_task_run(&message.subject) {
                        shared.store.metrics().run_job(crate::metrics::QUEUED);
                    }
                    published.push((message.subject, message.msg_id))
                }
                Err(e) => tracing::warn!(error = %e, "the sweep will publish the message"),
            }
        }
        let many = {
            let mut acknowledged = acknowledged.lock().unwrap_or_else(|p| p.into_inner());
            acknowledged.extend(published);
            acknowledged.len() >= 256
        };
        if many {
            forget(&shared, &acknowledged).await;
        }
    }
    forget(&shared, &acknowledged).await;
}

async fn forget(shared: &Shared, acknowledged: &handoff::Delivered) {
    let rows = std::mem::take(&mut *acknowledged.lock().unwrap_or_else(|p| p.into_inner()));
    if rows.is_empty() {
        return;
    }
    if let Err(e) = shared.store.outbox_forget(&rows).await {
        // Kept for the next try; if this process dies first, the sweep publishes the rows again
        // and JetStream drops the duplicates by their Nats-Msg-Id.
        tracing::warn!(error = %e, "cannot clear published outbox rows");
        acknowledged
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(rows);
    }
}

/// Publishes outbox rows nobody published: those a crashed process (this one before a restart,
/// or another replica) committed but did not relay. At start it takes every row; afterwards
/// only rows older than [`SWEEP_AGE`], so as not to race the relay of fresh commits.
async fn sweep(shared: Shared, shutdown: CancellationToken) {
    let ready = shared.store.outbox_ready();
    let mut min_age = Duration::ZERO;
    loop {
        match shared.store.relay_outbox(&shared.js, 256, min_age).await {
            Ok(256) => continue,
            Ok(_) => min_age = SWEEP_AGE,
            Err(e) => tracing::warn!(error = %e, "outbox sweep failed; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            // A commit without a relay to hand its messages to.
            _ = ready.notified() => min_age = Duration::ZERO,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// How old an outbox row must be before the sweep takes it over from the relay.
const SWEEP_AGE: Duration = Duration::from_secs(3);

/// Pulls inbound chat messages in order and handles them one by one, through
/// [`hark_core::consume`]: a message that cannot be handled is set aside, and one whose handling
/// hit an unavailable store is delivered again later. Each partition of `CHAT_IN` has a loop of
/// its own, so one chat's messages stay in order and a stalled partition holds up no other.
async fn consume_chat(shared: Shared, shutdown: CancellationToken) {
    let loops = shared
        .names
        .chat_in_partitions()
        .into_iter()
        .enumerate()
        .map(|(p, (stream, _))| {
            let name = Names::chat_in_consumer_name(p);
            run_consumer(shared.clone(), shutdown.clone(), stream, name, "chat_in")
        });
    futures_util::future::join_all(loops).await;
}

async fn consume_receipts(shared: Shared, shutdown: CancellationToken) {
    let stream = shared.names.chat_receipt_stream();
    run_consumer(
        shared,
        shutdown,
        stream,
        "chat_receipt".into(),
        "chat_receipt",
    )
    .await;
}

async fn run_consumer(
    shared: Shared,
    shutdown: CancellationToken,
    stream: String,
    name: String,
    source: &'static str,
) {
    let chat_in = source == "chat_in";
    let handler = |message: async_nats::jetstream::Message| {
        let shared = shared.clone();
        async move {
            let trace = hark_core::trace::from_headers(message.headers.as_ref());
            let span = hark_core::trace::process_span(&message.subject);
            hark_core::trace::scope_in(span, trace, async {
                if chat_in {
                    handle_chat(&shared, &message.payload).await
                } else {
                    handle_receipt(&shared, &message.payload).await
                }
            })
            .await
        }
    };
    consume::run(
        &shared.js,
        consume::Consumer {
            stream: &stream,
            durable: Names::CONTROL_CONSUMER,
            source,
            name: &name,
        },
        &shared.dead,
        &shared.liveness,
        &shutdown,
        handler,
    )
    .await;
}

/// Handles one inbound chat message. A message that cannot be decoded is invalid for good; a
/// failure to handle it is settled by its kind (retried only while the store is unavailable).
async fn handle_chat(shared: &Shared, payload: &[u8]) -> Result<(), Failure> {
    let message: pb::ChatMessage = codec::decode(payload)
        .map_err(|e| Failure::new(Kind::Invalid, format!("undecodable chat message: {e}")))?;
    chat::handle(shared, message).await.map(drop).map_err(|e| {
        let kind = e.kind();
        if kind.is_retryable() {
            tracing::warn!(error = %e, "chat message will be retried");
        }
        Failure::new(kind, e.to_string())
    })
}

async fn handle_receipt(shared: &Shared, payload: &[u8]) -> Result<(), Failure> {
    let receipt: pb::DeliveryReceipt = codec::decode(payload)
        .map_err(|e| Failure::new(Kind::Invalid, format!("undecodable delivery receipt: {e}")))?;
    if receipt.question_id.is_empty()
        || (receipt.platform_message_id.is_empty() && receipt.failed.is_empty())
    {
        return Ok(());
    }
    let question = receipt.question_id.parse::<QuestionId>().map_err(|_| {
        Failure::new(
            Kind::Invalid,
            format!(
                "delivery receipt names no valid question: {}",
                hark_core::domain::ids::shown(&receipt.question_id)
            ),
        )
    })?;
    let recorded = if receipt.platform_message_id.is_empty() {
        let reason = hark_core::domain::ids::one_line(&receipt.failed);
        let reason = &reason[..hark_core::domain::text::floor_char_boundary(&reason, 1000)];
        tracing::warn!(%question, reason, "a question's chat message was never delivered");
        let recorded = shared.store.set_undelivered(question, reason).await;
        if matches!(recorded, Ok(true)) {
            crate::events::told_undelivered(shared, question).await;
        }
        recorded
    } else {
        shared
            .store
            .set_chat_message_id(question, &receipt.platform_message_id)
            .await
    };
    recorded.map(|_| ()).map_err(|e| {
        tracing::warn!(error = %e, "delivery receipt not recorded");
        Failure::new(e.kind(), e.to_string())
    })
}
