//! Connecting to Postgres, creating the database when it does not exist, and migrating it.

use std::str::FromStr;

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
    ensure_database(&options, &name).await?;
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(std::time::Duration::from_secs(10))
        // A ping before every use would add a round trip to every query on the resume path; a
        // connection that died is noticed by the query itself, which fails as retryable.
        .test_before_acquire(false)
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
