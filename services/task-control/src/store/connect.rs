//! Connecting to Postgres, creating the database when it does not exist, and migrating it.

use std::{
    str::FromStr,
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use sqlx::{
    AssertSqlSafe, ConnectOptions, Connection, PgPool,
    postgres::{PgConnectOptions, PgConnection, PgPoolOptions},
};

use super::Error;

/// Connects a pool to `url`, creating the database first when it does not exist.
pub async fn connect(url: &str, max_connections: u32) -> Result<PgPool, Error> {
    let options = PgConnectOptions::from_str(url)
        .map_err(|e| Error::DatabaseUrl(hark_core::secret::redact_url(url), e.to_string()))?;
    let name = options.get_database().unwrap_or("postgres").to_owned();
    let shown = hark_core::secret::redact_url(url);
    match tokio::time::timeout(CONNECT_WITHIN, ensure_database(&options, &name)).await {
        Err(_) => {
            return Err(Error::Unanswered {
                url: shown,
                within_s: CONNECT_WITHIN.as_secs(),
            });
        }
        Ok(Err(Error::Database(e))) => return Err(first_contact(shown, e)),
        Ok(result) => result?,
    }
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(std::time::Duration::from_secs(10))
        // A ping before every use would add a round trip to every query on the resume path; a
        // connection that died is noticed by the query itself, which fails as retryable.
        .test_before_acquire(false)
        // After a connection was found dead, the ones that were made before are pinged before
        // use for a while, so a database restart costs one failed call, not one per connection.
        .before_acquire(|conn, meta| {
            Box::pin(async move {
                if !made_before_a_loss(meta.age) {
                    return Ok(true);
                }
                Ok(conn.ping().await.is_ok())
            })
        })
        .connect_with(
            options
                // Each statement is planned once per connection (and again when its tables'
                // statistics change), not for every call: they are point lookups whose plan does
                // not depend on the values bound.
                .options([("plan_cache_mode", "force_generic_plan")])
                .log_statements(tracing::log::LevelFilter::Trace),
        )
        .await?;
    Ok(pool)
}

/// How long the first connection may take before hark says nothing answers as Postgres.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

/// One connection to the server of `url` (its `postgres` database), to learn whether it lets
/// hark in: `Err` with [`first_contact`]'s reading when it does not, or when nothing answers
/// within [`CONNECT_WITHIN`].
pub async fn probe(url: &str) -> Result<(), Error> {
    let shown = hark_core::secret::redact_url(url);
    let options = PgConnectOptions::from_str(url)
        .map_err(|e| Error::DatabaseUrl(shown.clone(), e.to_string()))?
        .database("postgres");
    match tokio::time::timeout(CONNECT_WITHIN, PgConnection::connect_with(&options)).await {
        Err(_) => Err(Error::Unanswered {
            url: shown,
            within_s: CONNECT_WITHIN.as_secs(),
        }),
        Ok(Err(e)) => Err(first_contact(shown, e)),
        Ok(Ok(connection)) => {
            let _ = connection.close().await;
            Ok(())
        }
    }
}

/// What the first connection's failure means: credentials or a database refused, or something
/// else than Postgres at that port, are the caller's to fix; anything else may pass.
fn first_contact(url: String, error: sqlx::Error) -> Error {
    match &error {
        sqlx::Error::Database(e) => {
            let code = e.code().unwrap_or_default();
            // Invalid authorization (28…), no such database (3D000), no such role's
            // permission to connect (42501).
            if code.starts_with("28") || code == "3D000" || code == "42501" {
                Error::Refused {
                    url,
                    said: e.message().to_owned(),
                }
            } else {
                Error::Database(error)
            }
        }
        sqlx::Error::Protocol(said) => Error::NotPostgres {
            url,
            said: said.clone(),
        },
        // The first bytes read as a message length past any Postgres message: another server
        // (NATS says `INFO …` first, which reads as 1.3 GB).
        sqlx::Error::Io(e)
            if e.kind() == std::io::ErrorKind::UnexpectedEof
                && e.to_string().contains("expected to read") =>
        {
            Error::NotPostgres {
                url,
                said: "it answered something else than the Postgres protocol".into(),
            }
        }
        _ => Error::Database(error),
    }
}

/// How long after a lost connection the older ones are pinged before use.
const SUSPECT_FOR: Duration = Duration::from_secs(30);

/// When a call last failed because its connection or the server was away, in milliseconds since
/// [`process_clock`] started (0: never).
static LAST_LOSS: AtomicU64 = AtomicU64::new(0);

/// How many calls failed because their connection or the server was away.
static LOSSES: AtomicU64 = AtomicU64::new(0);

fn process_clock() -> Duration {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// Remembers that `error` lost a connection, if it did, and says so when it met a read-only
/// standby instead of the primary.
pub(super) fn note(error: &sqlx::Error) {
    if read_only(error) {
        // At most one warning in ten seconds: every write fails alike meanwhile.
        static WARNED: AtomicU64 = AtomicU64::new(0);
        let now = process_clock().as_millis() as u64 + 1;
        let last = WARNED.load(Ordering::Relaxed);
        if (last == 0 || now.saturating_sub(last) >= 10_000)
            && WARNED
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                "database.url leads to a read-only Postgres standby, not the primary: writes wait \
                 and are retried until it is promoted or database.url (HARK_DATABASE__URL) points \
                 at the primary (with CloudNativePG, the cluster's -rw Service)"
            );
        }
    }
    if matches!(
        error,
        sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::WorkerCrashed
    ) {
        // Never 0, which means "no loss yet".
        let now = process_clock().as_millis() as u64 + 1;
        LAST_LOSS.fetch_max(now, Ordering::Relaxed);
        LOSSES.fetch_add(1, Ordering::Relaxed);
    }
}

/// How many connections were lost so far: a connection kept aside before the last of them may
/// be dead.
pub(super) fn losses() -> u64 {
    LOSSES.load(Ordering::Relaxed)
}

/// Whether `error` is Postgres refusing a write because it is a standby in recovery
/// (`read_only_sql_transaction`).
pub fn read_only(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if e.code().as_deref() == Some("25006"))
}

/// Whether a connection of this age was made before the last loss, and that loss is recent.
fn made_before_a_loss(age: Duration) -> bool {
    let lost = LAST_LOSS.load(Ordering::Relaxed);
    if lost == 0 {
        return false;
    }
    let now = process_clock();
    let lost = Duration::from_millis(lost);
    now.saturating_sub(lost) < SUSPECT_FOR && now.saturating_sub(age) <= lost
}

/// Runs the embedded migrations, then analyzes the tables that never had statistics. Safe to run
/// from several replicas at once: sqlx holds an advisory lock while migrating.
pub async fn migrate(pool: &PgPool) -> Result<(), Error> {
    sqlx::migrate!("./migrations").run(pool).await?;
    let analyzed = super::upkeep::analyze_new_tables(pool).await?;
    if !analyzed.is_empty() {
        tracing::debug!(?analyzed, "analyzed tables without statistics");
    }
    Ok(())
}

async fn ensure_database(options: &PgConnectOptions, name: &str) -> Result<(), Error> {
    if name == "postgres" {
        return Ok(());
    }
    let mut admin: PgConnection =
        PgConnection::connect_with(&options.clone().database("postgres")).await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(&mut admin)
            .await?;
    if !exists {
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        match sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {quoted}")))
            .execute(&mut admin)
            .await
        {
            Ok(_) => tracing::info!(database = name, "created database"),
            // Another replica created it in the meantime.
            Err(sqlx::Error::Database(e))
                if matches!(e.code().as_deref(), Some("42P04" | "23505")) => {}
            Err(source) => {
                return Err(Error::CreateDatabase {
                    name: name.to_owned(),
                    source,
                });
            }
        }
    }
    admin.close().await?;
    Ok(())
}
