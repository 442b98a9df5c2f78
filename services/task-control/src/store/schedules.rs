//! Scheduled and recurring tasks. A schedule starts a task of its own at each run; the timers of
//! any number of replicas take due schedules with `FOR UPDATE SKIP LOCKED`, and each run's task
//! is created under a request id of the schedule and the run, so a run that is taken again after
//! a crash finds the task it started instead of starting another.

use std::time::Duration;

use hark_core::domain::{
    DeadlinePolicy, Owner, TaskRef, TimeoutPolicy,
    schedule::{self, Cron, Overlap},
};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{ChatRoute, Error, NewTask, ScheduleRow, Store, TaskRow};

/// A schedule to create.
#[derive(Debug, Clone)]
pub struct NewSchedule {
    pub owner: Owner,
    pub goal: String,
    pub chat: Option<ChatRoute>,
    pub ask_timeout: Duration,
    pub on_timeout: TimeoutPolicy,
    /// The recurrence; `None` runs once, at `first_run`.
    pub cron: Option<Cron>,
    /// The IANA time zone the cron expression is read in.
    pub timezone: String,
    pub first_run: OffsetDateTime,
    /// Whether a run starts while the previous run's task has not ended.
    pub overlap: Overlap,
    pub request_id: Option<String>,
    /// The priority of each run's task.
    pub priority: i16,
}

const COLUMNS: &str = "id, owner, platform, bot_id, stream, origin_message_id, goal, on_timeout, \
    ask_timeout_s, cron, timezone, overlap, state, next_run, runs, skipped, last_task, created_at, \
    priority";

impl Store {
    /// Creates a schedule; a request id used before returns the schedule it created.
    pub async fn create_schedule(&self, new: &NewSchedule) -> Result<ScheduleRow, Error> {
        let chat = new.chat.as_ref();
        let inserted = sqlx::query_as::<_, ScheduleRow>(sqlx::AssertSqlSafe(format!(
            "INSERT INTO schedules (id, owner, platform, bot_id, stream, origin_message_id, goal,
                                    on_timeout, ask_timeout_s, cron, timezone, overlap, next_run,
                                    request_id, priority)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
             ON CONFLICT (request_id) DO NOTHING
             RETURNING {COLUMNS}"
        )))
        // Random, like a task's id, so that the 8 characters people see tell schedules apart.
        .bind(Uuid::new_v4())
        .bind(new.owner.as_str())
        .bind(chat.map(|c| c.platform.as_str()))
        .bind(chat.map(|c| c.bot_id.as_str()))
        .bind(chat.map(|c| c.stream.as_str()))
        .bind(chat.and_then(|c| c.origin_message_id.as_deref()))
        .bind(&new.goal)
        .bind(new.on_timeout.as_str())
        .bind(i32::try_from(new.ask_timeout.as_secs()).unwrap_or(i32::MAX))
        .bind(new.cron.as_ref().map(|c| c.to_string()))
        .bind(&new.timezone)
        .bind(new.overlap.as_str())
        .bind(new.first_run)
        .bind(new.request_id.as_deref())
        .bind(new.priority)
        .fetch_optional(&self.pool)
        .await?;
        match inserted {
            Some(row) => Ok(row),
            None => sqlx::query_as::<_, ScheduleRow>(sqlx::AssertSqlSafe(format!(
                "SELECT {COLUMNS} FROM schedules WHERE request_id = $1"
            )))
            .bind(new.request_id.as_deref())
            .fetch_one(&self.pool)
            .await
            .map_err(Error::from),
        }
    }

    /// The schedules of `owner` (everyone's without), active first, newest first.
    pub async fn list_schedules(
        &self,
        owner: Option<&Owner>,
        include_ended: bool,
        limit: i64,
    ) -> Result<Vec<ScheduleRow>, Error> {
        Ok(
            sqlx::query_as::<_, ScheduleRow>(sqlx::AssertSqlSafe(format!(
                "SELECT {COLUMNS} FROM schedules
             WHERE ($1::text IS NULL OR owner = $1) AND ($2 OR state = {active})
             ORDER BY state = {active} DESC, created_at DESC
             LIMIT $3",
                active = sql_schedule!(active)
            )))
            .bind(owner.map(Owner::as_str))
            .bind(include_ended)
            .bind(limit)
            .fetch_all(&self.pool)
            .await?,
        )
    }

    /// The one schedule whose id is `reference` or starts with it, among `visible_to`'s when
    /// given.
    pub async fn resolve_schedule(
        &self,
        reference: &TaskRef,
        visible_to: Option<&Owner>,
    ) -> Result<ScheduleRow, Error> {
        let pattern = match reference {
            TaskRef::Full(id) => id.to_string(),
            TaskRef::Prefix(p) => format!("{}%", p.to_ascii_lowercase()),
        };
        let rows = sqlx::query_as::<_, ScheduleRow>(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS} FROM schedules
             WHERE id::text LIKE $1 AND ($2::text IS NULL OR owner = $2)
             LIMIT 2"
        )))
        .bind(&pattern)
        .bind(visible_to.map(Owner::as_str))
        .fetch_all(&self.pool)
        .await?;
        match rows.len() {
            1 => Ok(rows.into_iter().next().expect("one row")),
            0 => Err(Error::ScheduleNotFound(
                pattern.trim_end_matches('%').to_owned(),
            )),
            n => Err(Error::AmbiguousTask {
                prefix: pattern.trim_end_matches('%').to_owned(),
                count: n,
            }),
        }
    }

    /// Cancels a schedule: no run starts after this. A task a run already started goes on.
    pub async fn cancel_schedule(&self, id: Uuid) -> Result<ScheduleRow, Error> {
        let cancelled = sqlx::query_as::<_, ScheduleRow>(sqlx::AssertSqlSafe(format!(
            "UPDATE schedules SET state = {cancelled}, next_run = NULL, ended_at = now()
             WHERE id = $1 AND state = {active} RETURNING {COLUMNS}",
            cancelled = sql_schedule!(cancelled),
            active = sql_schedule!(active)
        )))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        match cancelled {
            Some(row) => Ok(row),
            None => Err(Error::ScheduleEnded(id.to_string())),
        }
    }

    /// Starts the task of every due run, at most `limit`, and moves each schedule to its next
    /// run (a one-off one is done). A run whose previous task has not ended is skipped when the
    /// schedule says so. `active_limit` is `task.max_active_per_owner`: a run over it is
    /// skipped too. Returns the tasks started.
    pub async fn start_due_schedules(
        &self,
        limit: i64,
        active_limit: u32,
    ) -> Result<Vec<TaskRow>, Error> {
        let mut tx = self.pool.begin().await?;
        let due = sqlx::query_as::<_, DueRun>(sqlx::AssertSqlSafe(format!(
            "SELECT {COLUMNS}, now() AS db_now,
                    EXISTS (SELECT 1 FROM tasks t WHERE t.id = s.last_task AND t.state IN ({})) AS last_active
             FROM schedules s
             WHERE state = {} AND next_run <= now()
             ORDER BY next_run LIMIT $1
             FOR UPDATE SKIP LOCKED",
            active_states!(),
            sql_schedule!(active)
        )))
        .bind(limit)
        .fetch_all(&mut *tx)
        .await?;
        let mut started = Vec::new();
        for DueRun {
            schedule: s,
            db_now,
            last_active,
        } in due
        {
            let Some(run_at) = s.next_run else { continue };
            let skip = last_active && s.overlap == Overlap::Skip;
            let task = if skip {
                tracing::info!(schedule = %s.id, "skipping a run: the task of the one before has not ended");
                None
            } else {
                let created = self
                    .create_task(&NewTask {
                        owner: s.owner.clone(),
                        goal: s.goal.clone(),
                        chat: s.chat(),
                        ask_timeout: Duration::from_secs(s.ask_timeout_s.max(0) as u64),
                        on_timeout: s.on_timeout,
                        // One task per run, however often the run is taken.
                        request_id: Some(format!("schedule:{}:{}", s.id, run_at.unix_timestamp())),
                        active_limit,
                        questionnaire: None,
                        schedule: Some(s.id),
                        priority: s.priority,
                        // A schedule's runs have no deadline of their own yet.
                        deadline: None,
                        on_deadline: DeadlinePolicy::default(),
                        asked_by: None,
                        key_id: None,
                    })
                    .await;
                match created {
                    Ok(task) => {
                        hark_core::failpoint::hit("schedule.after_task");
                        Some(task)
                    }
                    Err(Error::TooManyActive { .. }) => {
                        tracing::info!(schedule = %s.id, owner = %s.owner, "skipping a run: its owner has as many tasks as task.max_active_per_owner allows");
                        None
                    }
                    Err(e) => return Err(e),
                }
            };
            // The next run after now: runs missed while nothing swept are not made up.
            let next = match s.cron.as_deref().map(str::parse::<Cron>) {
                Some(Ok(cron)) => {
                    let tz = schedule::time_zone(&s.timezone)
                        .map_err(|e| Error::Internal(format!("schedule {}: {e}", s.id)))?;
                    cron.next_after(db_now.max(run_at), &tz)
                }
                Some(Err(e)) => {
                    tracing::warn!(schedule = %s.id, error = %e, "a stored cron expression is unreadable; ending the schedule");
                    None
                }
                None => None,
            };
            sqlx::query(concat!(
                "UPDATE schedules SET next_run = $2,
                     state = CASE WHEN $2::timestamptz IS NULL THEN ",
                sql_schedule!(done),
                " ELSE ",
                sql_schedule!(active),
                " END,
                     ended_at = CASE WHEN $2::timestamptz IS NULL THEN now() END,
                     runs = runs + $3, skipped = skipped + $4,
                     last_task = coalesce($5, last_task)
                 WHERE id = $1",
            ))
            .bind(s.id)
            .bind(next)
            .bind(i32::from(task.is_some()))
            .bind(i32::from(task.is_none()))
            .bind(task.as_ref().map(|t| t.id.as_uuid()))
            .execute(&mut *tx)
            .await?;
            started.extend(task);
        }
        tx.commit().await?;
        Ok(started)
    }
}

#[derive(Debug, sqlx::FromRow)]
struct DueRun {
    #[sqlx(flatten)]
    schedule: ScheduleRow,
    db_now: OffsetDateTime,
    last_active: bool,
}
