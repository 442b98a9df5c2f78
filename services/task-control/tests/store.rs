//! The task store against the real Postgres, each test in a database of its own.

mod common;

use std::{sync::Arc, time::Duration};

use common::{
    Cases as _, HeldStatistics, TestDb, index_reads, rows_read,
    tasks::{
        LEASE, answer, ask_input, group_chat, new_task, new_task_spec, owner, run_jobs,
        waiting_task, waiting_task_in,
    },
};
use hark_control::store::{AnswerOutcome, Error, Lease, NewTask, Store, TaskFilter, TaskRow};
use hark_core::{
    codec,
    domain::{DeadlinePolicy, QuestionOutcome, TaskRef, TaskState, TimeoutPolicy},
};
use hark_proto::v1 as pb;
use serde_json::json;

#[tokio::test]
async fn connecting_creates_a_missing_database_and_migrating_twice_is_harmless() {
    let db = TestDb::new().await;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&db.name)
            .fetch_one(db.store.pool())
            .await
            .expect("query");
    assert!(exists);
    hark_control::store::migrate(db.store.pool())
        .await
        .expect("second migration is a no-op");
    db.drop().await;
}

#[tokio::test]
async fn sixteen_concurrent_claims_of_one_pending_task_have_exactly_one_winner() {
    let db = TestDb::new().await;
    let task = new_task(&db.store, None).await;
    let barrier = Arc::new(tokio::sync::Barrier::new(16));
    let mut handles = Vec::new();
    for i in 0..16 {
        let store = db.store.clone();
        let barrier = barrier.clone();
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            store
                .claim(task.id, task.generation, &format!("worker-{i}"), LEASE)
                .await
        }));
    }
    let mut winners = Vec::new();
    for handle in handles {
        match handle.await.expect("claim task") {
            Ok(claimed) => winners.push(claimed),
            Err(Error::StaleJob { state, .. }) => assert_eq!(state, TaskState::Running),
            Err(other) => panic!("unexpected claim error: {other}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one claim must win");
    let row = db.store.get_task(task.id).await.expect("task");
    assert_eq!(row.state, TaskState::Running);
    assert_eq!(
        row.worker_id.as_deref(),
        Some(winners[0].lease.worker_id.as_str())
    );
    assert_eq!(row.generation, task.generation + 1);
    let claims = db
        .store
        .transitions_of(task.id)
        .await
        .expect("audit")
        .into_iter()
        .filter(|t| t.event == "claim")
        .count();
    assert_eq!(claims, 1, "the audit shows one claim");
    db.drop().await;
}

#[tokio::test]
async fn an_answer_racing_a_cancel_never_leaves_the_task_both_answered_and_cancelled() {
    let db = TestDb::new().await;
    let mut answered_first = 0;
    let mut cancelled_first = 0;
    for i in 0..100 {
        let (task, question) = waiting_task(&db.store).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(2));
        let (s1, s2, b1, b2) = (db.store.clone(), db.store.clone(), barrier.clone(), barrier);
        let answering = tokio::spawn(async move {
            b1.wait().await;
            s1.answer(question, &answer("Paris", &format!("qq:42:msg-{i}")))
                .await
        });
        let cancelling = tokio::spawn(async move {
            b2.wait().await;
            s2.cancel(task.id, "qq:10001", "changed my mind").await
        });
        let answered = answering.await.expect("answer task");
        let cancelled = cancelling
            .await
            .expect("cancel task")
            .expect("a cancel always ends the task");
        assert_eq!(cancelled.state, TaskState::Cancelled);

        let q = db.store.get_question(question).await.expect("question");
        let resumes: Vec<_> = run_jobs(&db.store)
            .await
            .into_iter()
            .filter(|(t, _, reason)| {
                *t == task.id.to_string() && *reason == pb::RunReason::ResumeReply as i32
            })
            .collect();
        match answered {
            Ok(AnswerOutcome::Applied { .. }) => {
                answered_first += 1;
                // The answer won while the task waited; the cancel then ended the pending task.
                assert_eq!(q.outcome, QuestionOutcome::Answered);
                assert_eq!(resumes.len(), 1);
            }
            Err(Error::QuestionClosed { outcome, .. }) => {
                cancelled_first += 1;
                assert_eq!(outcome, QuestionOutcome::Cancelled);
                assert_eq!(q.outcome, QuestionOutcome::Cancelled);
                assert!(q.answer.is_none(), "a lost answer must not be recorded");
                assert!(resumes.is_empty(), "a lost answer must not queue a resume");
            }
            other => panic!("unexpected answer result: {other:?}"),
        }
        let final_task = db.store.get_task(task.id).await.expect("task");
        assert_eq!(final_task.state, TaskState::Cancelled);
        // The task can never come back to life afterwards.
        let late = db
            .store
            .claim(task.id, final_task.generation, "w2", LEASE)
            .await;
        assert!(late.is_err(), "a cancelled task must not be claimable");
    }
    assert_eq!(answered_first + cancelled_first, 100);
    db.drop().await;
}

#[tokio::test]
async fn the_same_inbound_message_applied_twice_changes_nothing_the_second_time() {
    let db = TestDb::new().await;
    let (task, question) = waiting_task(&db.store).await;
    let first = db
        .store
        .answer(question, &answer("Paris", "qq:42:msg-9"))
        .await
        .expect("first");
    assert!(matches!(first, AnswerOutcome::Applied { .. }));
    let after_first = db.store.get_task(task.id).await.expect("task");
    let jobs_after_first = run_jobs(&db.store).await;
    let audit_after_first = db.store.transitions_of(task.id).await.expect("audit").len();

    let second = db
        .store
        .answer(question, &answer("London", "qq:42:msg-9"))
        .await
        .expect("the duplicate is not an error");
    assert!(matches!(second, AnswerOutcome::Duplicate { .. }));

    let after_second = db.store.get_task(task.id).await.expect("task");
    assert_eq!(after_second.generation, after_first.generation);
    assert_eq!(after_second.state, TaskState::Pending);
    assert_eq!(run_jobs(&db.store).await, jobs_after_first);
    assert_eq!(
        db.store.transitions_of(task.id).await.expect("audit").len(),
        audit_after_first
    );
    let q = db.store.get_question(question).await.expect("question");
    assert_eq!(q.answer.as_deref(), Some("Paris"));
    db.drop().await;
}

#[tokio::test]
async fn a_resumed_claim_returns_the_checkpoint_and_the_answer_for_the_pending_tool_call() {
    let db = TestDb::new().await;
    let (task, question) = waiting_task(&db.store).await;
    let (_, told) = db
        .store
        .tell(task.id, "prefer trains", "qq:10001")
        .await
        .expect("tell");
    assert_eq!(told, hark_control::store::TellDelivery::OnResume);
    let AnswerOutcome::Applied { task: resumed, .. } = db
        .store
        .answer(question, &answer("Paris", "k1"))
        .await
        .expect("answer")
    else {
        panic!("answer not applied");
    };
    assert_eq!(resumed.state, TaskState::Pending);
    let jobs = run_jobs(&db.store).await;
    assert!(jobs.contains(&(
        task.id.to_string(),
        resumed.generation as u64,
        pb::RunReason::ResumeReply as i32
    )));

    let claimed = db
        .store
        .claim(task.id, resumed.generation, "w2", LEASE)
        .await
        .expect("claim");
    assert_eq!(claimed.rounds.len(), 1);
    assert_eq!(
        claimed.rounds[0].messages.0[0]["reasoning_content"],
        json!("provider extra kept as is"),
        "provider extras survive the checkpoint"
    );
    let resume = claimed.resume.expect("the answer is handed over");
    assert_eq!(resume.tool_call_id, "call-1");
    assert_eq!(resume.text, "Paris");
    assert!(!resume.expired);
    assert_eq!(claimed.instructions.len(), 1);
    assert_eq!(claimed.instructions[0].text, "prefer trains");

    // Once the round with the tool result is stored, a later claim no longer repeats the answer.
    let ids = vec![claimed.instructions[0].id];
    db.store
        .checkpoint(
            &claimed.lease,
            2,
            &json!([{"role": "tool", "tool_call_id": "call-1", "content": "Paris"}]),
            &ids,
        )
        .await
        .expect("checkpoint");
    let hb = db
        .store
        .heartbeat(&claimed.lease, LEASE)
        .await
        .expect("heartbeat");
    assert!(
        hb.is_empty(),
        "a consumed instruction is not handed over again"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_stale_worker_is_refused_once_the_task_moved_on() {
    let db = TestDb::new().await;
    let task = new_task(&db.store, Some(group_chat())).await;
    let claimed = db
        .store
        .claim(task.id, task.generation, "w1", LEASE)
        .await
        .expect("claim");
    let stale = Lease {
        generation: claimed.lease.generation - 1,
        ..claimed.lease.clone()
    };
    let other = Lease {
        worker_id: "w9".into(),
        ..claimed.lease.clone()
    };
    for lease in [&stale, &other] {
        assert!(matches!(
            db.store.checkpoint(lease, 1, &json!([]), &[]).await,
            Err(Error::LeaseLost { .. })
        ));
        assert!(matches!(
            db.store.heartbeat(lease, LEASE).await,
            Err(Error::LeaseLost { .. })
        ));
        assert!(matches!(
            db.store.complete(lease, None, "done").await,
            Err(Error::LeaseLost { .. })
        ));
    }
    // The stale claim job itself is refused too.
    assert!(matches!(
        db.store.claim(task.id, task.generation, "w2", LEASE).await,
        Err(Error::StaleJob { .. })
    ));

    db.store.cancel(task.id, "admin", "").await.expect("cancel");
    assert!(matches!(
        db.store
            .checkpoint(&claimed.lease, 1, &json!([]), &[])
            .await,
        Err(Error::Cancelled { .. })
    ));
    assert!(matches!(
        db.store.ask(&claimed.lease, &ask_input(1, "c")).await,
        Err(Error::Cancelled { .. })
    ));
    assert!(
        db.store
            .rounds_of(task.id)
            .await
            .expect("rounds")
            .is_empty(),
        "nothing was written"
    );
    db.drop().await;
}

#[tokio::test]
async fn creating_twice_with_one_request_id_returns_the_first_task() {
    let db = TestDb::new().await;
    let new = NewTask {
        owner: owner(),
        goal: "g".into(),
        chat: None,
        ask_timeout: Duration::from_secs(60),
        on_timeout: TimeoutPolicy::Fail,
        request_id: Some("req-1".into()),
        active_limit: 0,
        questionnaire: None,
        schedule: None,
        priority: 0,
        deadline: None,
        on_deadline: DeadlinePolicy::Fail,
        asked_by: None,
        key_id: None,
    };
    let a = db.store.create_task(&new).await.expect("create");
    let b = db.store.create_task(&new).await.expect("create again");
    assert_eq!(a.id, b.id);
    assert_eq!(run_jobs(&db.store).await.len(), 1, "one start job");
    db.drop().await;
}

#[tokio::test]
async fn a_completed_task_is_audited_announced_and_its_result_queued_for_the_chat() {
    let db = TestDb::new().await;
    // A store with a relay attached, as task-control runs it: committed messages reach the relay.
    let (relay, mut committed) = tokio::sync::mpsc::unbounded_channel();
    let store = db.store.clone().with_relay(relay);
    let task = new_task(&store, Some(group_chat())).await;
    let claimed = store
        .claim(task.id, task.generation, "w1", LEASE)
        .await
        .expect("claim");
    let long = "x".repeat(2500);
    let done = store
        .complete(
            &claimed.lease,
            Some((1, &json!([{"role": "assistant", "content": "ok"}]))),
            &long,
        )
        .await
        .expect("complete");
    assert_eq!(done.state, TaskState::Completed);
    assert!(done.finished_at.is_some());

    let audit: Vec<String> = store
        .transitions_of(task.id)
        .await
        .expect("audit")
        .into_iter()
        .map(|t| t.event)
        .collect();
    assert_eq!(audit, ["create", "claim", "finish"]);

    // Every state change is announced to the relay, best effort: not kept in the outbox.
    let mut handed = Vec::new();
    while let Ok(batch) = committed.try_recv() {
        handed.extend(batch);
    }
    let events: Vec<i32> = handed
        .iter()
        .filter(|m| m.subject == store.names().task_events())
        .map(|m| {
            assert!(!m.durable);
            codec::decode::<pb::TaskEvent>(&m.payload).expect("event")
        })
        .filter(|e| e.task_id == task.id.to_string())
        .map(|e| e.state)
        .collect();
    assert_eq!(
        events,
        [
            pb::TaskState::Pending as i32,
            pb::TaskState::Running as i32,
            pb::TaskState::Completed as i32
        ]
    );
    let outbox = store.outbox_batch(100).await.expect("outbox");
    assert!(
        outbox
            .iter()
            .all(|e| e.subject != store.names().task_events()),
        "events are not kept in the outbox"
    );
    assert_eq!(
        handed.iter().filter(|m| m.durable).count(),
        outbox.len(),
        "everything durable in the outbox was handed to the relay"
    );
    let chat_subject = store.names().chat_out("qq", "42").expect("subject");
    let parts: Vec<pb::OutboundMessage> = outbox
        .iter()
        .filter(|e| e.subject == chat_subject)
        .map(|e| codec::decode(&e.payload).expect("outbound"))
        .collect();
    assert_eq!(parts.len(), 3, "2500 characters go out in three parts");
    assert!(parts.iter().all(|p| p.text.chars().count() <= 1000));
    assert_eq!(
        parts[0].route.as_ref().map(|r| r.stream.as_str()),
        Some("group:777")
    );

    let published: Vec<(String, String)> = outbox
        .iter()
        .map(|e| (e.subject.clone(), e.msg_id.clone()))
        .collect();
    db.store
        .outbox_forget(&published)
        .await
        .expect("outbox cleared");
    assert!(db.store.outbox_batch(100).await.expect("outbox").is_empty());
    db.drop().await;
}

#[tokio::test]
async fn a_question_is_queued_for_its_chat_with_handle_and_context_in_the_ask_transaction() {
    let db = TestDb::new().await;
    let (task, question) = waiting_task(&db.store).await;
    assert_eq!(task.state, TaskState::WaitingInput);
    let q = db.store.get_question(question).await.expect("question");
    assert!(
        q.deadline.is_some(),
        "the resume policy gives the question a deadline"
    );
    let open = db
        .store
        .open_questions_for_sender("qq", "group:777", "10001", None)
        .await
        .expect("open questions");
    assert_eq!(open.len(), 1);
    let subject = db.store.names().chat_out("qq", "42").expect("subject");
    let shown: Vec<pb::OutboundMessage> = db
        .store
        .outbox_batch(100)
        .await
        .expect("outbox")
        .into_iter()
        .filter(|e| e.subject == subject)
        .map(|e| codec::decode(&e.payload).expect("outbound"))
        .collect();
    assert_eq!(shown.len(), 1);
    assert_eq!(shown[0].question_id, question.to_string());
    assert!(shown[0].text.contains(&format!("#{}", q.handle)));
    assert!(shown[0].text.contains("Which city?"));
    assert!(shown[0].text.contains("[上下文] for the weather"));
    db.drop().await;
}

#[tokio::test]
async fn a_task_is_found_by_a_unique_prefix_and_listed_newest_first() {
    let db = TestDb::new().await;
    let a = new_task(&db.store, None).await;
    let b = new_task(&db.store, Some(group_chat())).await;
    let found = db
        .store
        .resolve_task(&b.id.short().parse::<TaskRef>().expect("prefix"), None)
        .await;
    assert_eq!(
        found
            .expect("the short id shown in chats finds the task")
            .id,
        b.id
    );
    let full = db
        .store
        .resolve_task(&TaskRef::Full(a.id), None)
        .await
        .expect("full id");
    assert_eq!(full.id, a.id);
    assert!(matches!(
        db.store
            .resolve_task(&"ffffffff".parse::<TaskRef>().expect("prefix"), None)
            .await,
        Err(Error::TaskNotFound(_))
    ));
    let listed = db
        .store
        .list_tasks(&TaskFilter {
            owner: Some(owner()),
            limit: 10,
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(
        listed.iter().map(|t| t.id).collect::<Vec<_>>(),
        [b.id, a.id]
    );
    let in_stream = db
        .store
        .list_tasks(&TaskFilter {
            stream: Some("group:777".into()),
            states: vec![TaskState::Pending],
            limit: 10,
            ..Default::default()
        })
        .await
        .expect("list");
    assert_eq!(in_stream.len(), 1);
    db.drop().await;
}

/// A page of tasks reads that page, whoever else has tasks: by owner, by chat or of everyone,
/// and from a cursor deep in the list.
#[tokio::test]
async fn a_page_of_tasks_reads_its_own_rows_however_many_others_there_are() {
    let db = TestDb::new().await;
    // One backend runs every statement, so that its statistics of reads can be flushed.
    let store = &db.one_connection().await;
    // 3,000 tasks of someone else, half of them in one chat, all newer than the tasks below,
    // stored newest first, as the index of everyone's tasks walks them.
    const CROWD: i64 = 3000;
    sqlx::query(
        "INSERT INTO tasks (id, owner, goal, state, on_timeout, ask_timeout_s, platform, bot_id,
                            stream, created_at)
         SELECT gen_random_uuid(), 'api:crowd', 'theirs', 'completed', 'fail', 0,
                CASE WHEN i % 2 = 0 THEN 'qq' END, CASE WHEN i % 2 = 0 THEN '42' END,
                CASE WHEN i % 2 = 0 THEN 'group:777' END,
                now() + interval '1 day' - i * interval '1 second'
         FROM generate_series(1, $1) i",
    )
    .bind(CROWD)
    .execute(store.pool())
    .await
    .expect("the crowd's tasks");
    // Statistics that know only the crowd: every task is theirs, so a plan made for any owner
    // expects to find its page at once among everyone's tasks, newest first.
    sqlx::query("ANALYZE tasks")
        .execute(store.pool())
        .await
        .expect("analyzed");
    let mine = [
        new_task(store, None).await,
        new_task(store, Some(group_chat())).await,
        new_task(store, Some(group_chat())).await,
    ];

    let page = |filter: TaskFilter| async move {
        let before = rows_read(store, "tasks").await;
        let tasks = store.list_tasks(&filter).await.expect("a page");
        let read = rows_read(store, "tasks").await - before;
        assert!(
            read <= 2 * filter.limit + 2,
            "a page of {} read {read} rows of tasks among {CROWD} others ({filter:?})",
            filter.limit
        );
        tasks
    };
    let ids = |tasks: &[TaskRow]| tasks.iter().map(|t| t.id).collect::<Vec<_>>();

    let nobodys = page(TaskFilter {
        owner: Some("api:nobody".parse().expect("owner")),
        limit: 50,
        ..Default::default()
    })
    .await;
    assert!(nobodys.is_empty(), "{nobodys:?}");

    let first = page(TaskFilter {
        owner: Some(owner()),
        limit: 2,
        ..Default::default()
    })
    .await;
    assert_eq!(ids(&first), [mine[2].id, mine[1].id]);
    let second = page(TaskFilter {
        owner: Some(owner()),
        before: Some(mine[1].id),
        limit: 2,
        ..Default::default()
    })
    .await;
    assert_eq!(ids(&second), [mine[0].id]);

    let mine_in_chat = page(TaskFilter {
        owner: Some(owner()),
        platform: Some("qq".into()),
        stream: Some("group:777".into()),
        limit: 5,
        ..Default::default()
    })
    .await;
    assert_eq!(ids(&mine_in_chat), [mine[2].id, mine[1].id]);

    let chat = page(TaskFilter {
        platform: Some("qq".into()),
        stream: Some("group:777".into()),
        limit: 10,
        ..Default::default()
    })
    .await;
    assert_eq!(chat.len(), 10);
    assert!(
        chat.iter()
            .all(|t| t.owner.as_str() == "api:crowd" && t.stream.as_deref() == Some("group:777"))
    );
    let deep = page(TaskFilter {
        platform: Some("qq".into()),
        stream: Some("group:777".into()),
        before: Some(chat[9].id),
        limit: 10,
        ..Default::default()
    })
    .await;
    let newest_first = |tasks: &[TaskRow]| {
        tasks
            .windows(2)
            .all(|w| (w[0].created_at, w[0].id) > (w[1].created_at, w[1].id))
    };
    assert!(newest_first(&chat) && newest_first(&deep));
    assert!(deep[0].created_at < chat[9].created_at);

    let everyone = page(TaskFilter {
        limit: 10,
        ..Default::default()
    })
    .await;
    assert!(everyone.iter().all(|t| t.owner.as_str() == "api:crowd"));
    assert!(newest_first(&everyone));
    let pending = page(TaskFilter {
        owner: Some(owner()),
        states: vec![TaskState::Pending],
        limit: 10,
        ..Default::default()
    })
    .await;
    assert_eq!(pending.len(), 3);
    store.pool().close().await;
    db.drop().await;
}

/// The lookup of an answer's question reads what never changes of its task beside it, so that
/// the answer needs no read of the task of its own, whichever replica created it.
#[tokio::test]
async fn an_answers_lookup_reads_its_tasks_chat_and_waits_as_the_task_row_says() {
    let db = TestDb::new().await;
    let mut external = new_task_spec(None);
    external.asked_by = Some("agent:planner".into());
    let external = db.store.create_task(&external).await.expect("created");
    for (task, chat) in [
        (None, Some(group_chat())),
        (None, None),
        (Some(external), None),
    ] {
        let task = match task {
            Some(task) => task,
            None => new_task(&db.store, chat).await,
        };
        let claimed = db
            .store
            .claim(task.id, task.generation, "w1", LEASE)
            .await
            .expect("claim wins");
        db.store
            .ask(&claimed.lease, &ask_input(1, "call-1"))
            .await
            .expect("asked");
        // Another replica: it has seen nothing of the task.
        let other = db.connections(2).await;
        let target = other
            .find_answer_target(None, Some(task.id), None)
            .await
            .expect("lookup")
            .expect("the open question");
        let row = other.get_task(task.id).await.expect("the task");
        assert_eq!(target.chat.fixed(&target.task), row.fixed(), "{row:?}");
        other.pool().close().await;
    }
    db.drop().await;
}

/// Runs upkeep passes until what they did together satisfies `done`; backends report their
/// row counts to the statistics within seconds, not at once.
async fn upkeep_until(
    store: &Store,
    done: impl Fn(&hark_control::store::Upkeep) -> bool,
) -> hark_control::store::Upkeep {
    let mut all = hark_control::store::Upkeep::default();
    for _ in 0..60 {
        let pass = store.upkeep().await.expect("upkeep pass");
        all.analyzed.extend(pass.analyzed);
        all.vacuumed.extend(pass.vacuumed);
        if done(&all) {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("upkeep never did what was due: {all:?}");
}

#[tokio::test]
async fn upkeep_vacuums_tables_with_dead_rows_and_analyzes_tables_that_grew() {
    let db = TestDb::new().await;
    let store = &db.store;
    // Each claim leaves a dead version of its task's row; each task writes two audit rows.
    for _ in 0..80 {
        let task = new_task(store, None).await;
        store
            .claim(task.id, task.generation, "w1", LEASE)
            .await
            .expect("claim wins");
    }

    // While another replica holds the upkeep lock, a pass does nothing.
    let mut other = store.pool().acquire().await.expect("connection");
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(hark_control::store::UPKEEP_LOCK)
        .execute(&mut *other)
        .await
        .expect("lock taken");
    assert_eq!(
        store.upkeep().await.expect("pass"),
        hark_control::store::Upkeep::default()
    );
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(hark_control::store::UPKEEP_LOCK)
        .execute(&mut *other)
        .await
        .expect("lock released");
    drop(other);

    upkeep_until(store, |p| {
        p.vacuumed.iter().any(|t| t == "tasks")
            && (p.analyzed.iter().chain(&p.vacuumed)).any(|t| t == "transitions")
    })
    .await;
    let (vacuumed, analyzed): (bool, bool) = sqlx::query_as(
        "SELECT (SELECT last_vacuum IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'tasks'),
                (SELECT last_analyze IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'transitions')",
    )
    .fetch_one(store.pool())
    .await
    .expect("statistics");
    assert!(vacuumed && analyzed);

    // Nothing changes any more: once the last row counts have reached the statistics (backends
    // report within seconds), passes leave both tables alone.
    let mut quiet = false;
    for _ in 0..40 {
        let pass = store.upkeep().await.expect("pass");
        if !pass
            .analyzed
            .iter()
            .chain(&pass.vacuumed)
            .any(|t| t == "tasks" || t == "transitions")
        {
            quiet = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(quiet, "upkeep kept redoing tables nothing changed in");

    // Rows that only move leave dead versions without growing the table: the vacuum they are
    // due comes without an analyze. 80 moved rows of 80 are past the vacuum's threshold
    // (50 + 20 % of them) and short of the analyze's (50 + all of them).
    let analyzes = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'tasks'",
        )
        .fetch_one(store.pool())
        .await
        .expect("statistics");
        n
    };
    // Counts the claims' connections still hold reach the statistics within a second or so of
    // going idle; the table is analyzed until none has arrived over three reads in a row.
    let mut quiet_reads = 0;
    for _ in 0..60 {
        let left: i64 = sqlx::query_scalar(
            "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'tasks'",
        )
        .fetch_one(store.pool())
        .await
        .expect("statistics");
        if left == 0 {
            quiet_reads += 1;
            if quiet_reads == 3 {
                break;
            }
        } else {
            quiet_reads = 0;
            sqlx::query("ANALYZE tasks")
                .execute(store.pool())
                .await
                .expect("analyze");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        quiet_reads, 3,
        "the row counts of tasks never reached the statistics"
    );
    let before = analyzes().await;
    let moved = sqlx::query("UPDATE tasks SET updated_at = now()")
        .execute(store.pool())
        .await
        .expect("rows moved");
    assert_eq!(moved.rows_affected(), 80);
    let pass = upkeep_until(store, |p| p.vacuumed.iter().any(|t| t == "tasks")).await;
    assert!(!pass.analyzed.iter().any(|t| t == "tasks"), "{pass:?}");
    assert_eq!(analyzes().await, before, "the vacuum analyzed tasks too");
    db.drop().await;
}

/// The backends whose last statement created a task (its text starts with the new tasks; the
/// rest is past what `pg_stat_activity` shows of it).
async fn backends_that_created(store: &Store) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND query LIKE 'WITH n AS (%SELECT * FROM unnest($1::uuid[]%'",
    )
    .fetch_one(store.pool())
    .await
    .expect("pg_stat_activity")
}

#[tokio::test]
async fn creations_one_at_a_time_run_on_one_connection_and_the_loops_keep_at_most_half_the_pool() {
    let db = TestDb::new().await;
    // Four statements at once leave the pool four connections to hand out in turn.
    let pool = db.store.pool();
    let pause = || sqlx::query("SELECT pg_sleep(0.05)").execute(pool);
    let (a, b, c, d) = tokio::join!(pause(), pause(), pause(), pause());
    for done in [a, b, c, d] {
        done.expect("pg_sleep");
    }
    assert!(
        pool.num_idle() >= 2,
        "the pool holds {} idle",
        pool.num_idle()
    );
    for _ in 0..8 {
        new_task(&db.store, None).await;
    }
    // Each ran where the one before it ran, its statement planned there already.
    assert_eq!(backends_that_created(&db.store).await, 1);

    // A pool of one is never kept from everything else: a read right after a creation finds
    // the connection back in the pool rather than waiting for the creations to pause.
    let one = db.one_connection().await;
    let task = new_task(&one, None).await;
    let read = tokio::time::timeout(Duration::from_secs(5), one.get_task(task.id))
        .await
        .expect("the read waited for a connection kept for creations")
        .expect("the task reads back");
    assert_eq!(read.id, task.id);
    one.pool().close().await;

    // Three loops (creations, claims, asks) keep at most half of a pool of four. A connection
    // given back reaches the pool a moment later; one kept stays out for 10 s.
    let four = db.connections(4).await;
    waiting_task(&four).await;
    let pool = four.pool();
    let out = || pool.size() as usize - pool.num_idle();
    let settled = tokio::time::timeout(Duration::from_secs(5), async {
        while out() > 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(
        settled.is_ok(),
        "{} of the pool's {} connections stayed out of it",
        out(),
        pool.size()
    );
    assert!(out() >= 1, "no loop kept its connection");
    four.pool().close().await;
    db.drop().await;
}

#[tokio::test]
async fn an_analyze_keeps_statistics_of_the_columns_statements_read_only() {
    let db = TestDb::new().await;
    waiting_task(&db.store).await;
    sqlx::query("ANALYZE questions, tasks")
        .execute(db.store.pool())
        .await
        .expect("analyze");
    let kept: Vec<String> = sqlx::query_scalar(
        "SELECT tablename || '.' || attname FROM pg_stats
         WHERE schemaname = current_schema() AND tablename IN ('questions', 'tasks')",
    )
    .fetch_all(db.store.pool())
    .await
    .expect("statistics");
    for read in [
        "questions.outcome",
        "questions.owner",
        "questions.handle",
        "questions.model_answer",
        "tasks.state",
    ] {
        assert!(
            kept.iter().any(|c| c == read),
            "{read} has no statistics: {kept:?}"
        );
    }
    for unread in [
        "questions.text",
        "questions.context",
        "questions.choices",
        "tasks.goal",
    ] {
        assert!(
            !kept.iter().any(|c| c == unread),
            "{unread} has statistics: {kept:?}"
        );
    }
    db.drop().await;
}

#[tokio::test]
async fn claims_and_completions_decided_together_each_win_or_lose_on_their_own() {
    let db = TestDb::new().await;
    let store = &db.store;
    let mut tasks = Vec::new();
    for _ in 0..24 {
        tasks.push(new_task(store, Some(group_chat())).await);
    }
    // All claimed at once; every fourth with a stale generation, which must lose alone.
    let claims = futures_util::future::join_all(tasks.iter().enumerate().map(|(i, t)| {
        let generation = if i % 4 == 0 {
            t.generation + 1
        } else {
            t.generation
        };
        let (store, id) = (store.clone(), t.id);
        async move { store.claim(id, generation, &format!("w{i}"), LEASE).await }
    }))
    .await;
    let mut leases = Vec::new();
    for (i, claim) in claims.into_iter().enumerate() {
        match claim {
            Ok(claimed) => {
                assert!(i % 4 != 0, "the stale claim of task {i} won");
                assert_eq!(claimed.lease.task, tasks[i].id);
                assert_eq!(claimed.lease.worker_id, format!("w{i}"));
                leases.push((i, claimed.lease));
            }
            Err(Error::StaleJob { .. }) => assert!(i % 4 == 0, "the claim of task {i} lost"),
            Err(e) => panic!("claim {i}: {e}"),
        }
    }
    assert_eq!(leases.len(), 18);

    // All completed at once; every third under a lease of another worker, which must lose alone.
    let round = json!([{"role": "assistant", "content": "done"}]);
    let completions = futures_util::future::join_all(leases.iter().map(|(i, lease)| {
        let mut lease = lease.clone();
        if i % 3 == 0 {
            lease.worker_id = "someone else".into();
        }
        let (store, round) = (store.clone(), round.clone());
        let result = format!("result {i}");
        async move { store.complete(&lease, Some((1, &round)), &result).await }
    }))
    .await;
    for ((i, _), completed) in leases.iter().zip(completions) {
        let task = store.get_task(tasks[*i].id).await.expect("task");
        match completed {
            Ok(row) => {
                assert!(
                    i % 3 != 0,
                    "the completion of task {i} under a wrong lease won"
                );
                assert_eq!(row.state, TaskState::Completed);
                assert_eq!(task.state, TaskState::Completed);
                assert_eq!(task.result.as_deref(), Some(format!("result {i}").as_str()));
                let rounds = store.rounds_of(task.id).await.expect("rounds");
                assert_eq!(rounds.len(), 1);
                let audit = store.transitions_of(task.id).await.expect("audit");
                assert_eq!(
                    audit.iter().map(|t| t.event.as_str()).collect::<Vec<_>>(),
                    ["create", "claim", "finish"]
                );
            }
            Err(Error::LeaseLost { .. }) => {
                assert!(i % 3 == 0, "the completion of task {i} lost");
                assert_eq!(task.state, TaskState::Running);
                assert!(task.result.is_none());
            }
            Err(e) => panic!("completion {i}: {e}"),
        }
    }
    // Each completion that won queued its own chat message, and only those did.
    let queued: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE subject LIKE '%.chat.out.%'")
            .fetch_one(store.pool())
            .await
            .expect("outbox");
    assert_eq!(queued, 12, "chat messages queued for 12 completions");
    db.drop().await;
}

#[tokio::test]
async fn creations_decided_together_with_one_request_id_make_one_task() {
    let db = TestDb::new().await;
    let store = &db.store;
    let new = |request: Option<&str>| NewTask {
        owner: owner(),
        goal: "plan a trip".into(),
        chat: Some(group_chat()),
        ask_timeout: Duration::from_secs(600),
        on_timeout: TimeoutPolicy::Resume,
        request_id: request.map(str::to_owned),
        active_limit: 0,
        questionnaire: None,
        schedule: None,
        priority: 0,
        deadline: None,
        on_deadline: DeadlinePolicy::Fail,
        asked_by: None,
        key_id: None,
    };
    // Six creations at once: four share a request id, two have none.
    let requests = [
        Some("r-1"),
        None,
        Some("r-1"),
        Some("r-1"),
        None,
        Some("r-1"),
    ];
    let created = futures_util::future::join_all(requests.iter().map(|r| {
        let (store, new) = (store.clone(), new(*r));
        async move { store.create_task(&new).await }
    }))
    .await;
    let ids: Vec<_> = created
        .into_iter()
        .map(|c| c.expect("created").id)
        .collect();
    let shared: std::collections::HashSet<_> = [0, 2, 3, 5].iter().map(|i| ids[*i]).collect();
    assert_eq!(shared.len(), 1, "one task for one request id");
    assert_ne!(ids[1], ids[4]);
    assert!(!shared.contains(&ids[1]) && !shared.contains(&ids[4]));
    // Three tasks, three first run jobs.
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(store.pool())
        .await
        .expect("count");
    assert_eq!(count, 3);
    assert_eq!(run_jobs(store).await.len(), 3);
    db.drop().await;
}

#[tokio::test]
async fn answers_decided_together_apply_once_each() {
    let db = TestDb::new().await;
    let store = &db.store;
    let mut waiting = Vec::new();
    for _ in 0..6 {
        waiting.push(waiting_task(store).await);
    }
    // Task 5 is cancelled before its answer arrives.
    store
        .cancel(waiting[5].0.id, "qq:10001", "")
        .await
        .expect("cancelled");
    // One answer each, and the answer to task 0 delivered twice (the same inbound message).
    let mut requests: Vec<(usize, String)> = (0..6).map(|i| (i, format!("m-{i}"))).collect();
    requests.push((0, "m-0".into()));
    let outcomes = futures_util::future::join_all(requests.iter().map(|(i, key)| {
        let (store, question) = (store.clone(), waiting[*i].1);
        let answer = answer(&format!("answer {i}"), key);
        async move { store.answer(question, &answer).await }
    }))
    .await;
    let mut applied_to_0 = 0;
    for ((i, _), outcome) in requests.iter().zip(outcomes) {
        match outcome {
            Ok(AnswerOutcome::Applied { task, question, .. }) => {
                assert_ne!(*i, 5, "an answer to a cancelled task applied");
                assert_eq!(task.id, waiting[*i].0.id);
                assert_eq!(task.state, TaskState::Pending);
                assert_eq!(task.generation, waiting[*i].0.generation + 1);
                assert_eq!(
                    question.answer.as_deref(),
                    Some(format!("answer {i}").as_str())
                );
                if *i == 0 {
                    applied_to_0 += 1;
                }
            }
            Ok(AnswerOutcome::Duplicate { .. }) => {
                assert_eq!(*i, 0, "answer {i} taken for a duplicate")
            }
            Ok(counted @ AnswerOutcome::Counted { .. }) => {
                panic!("answer {i} to a question of one person counted: {counted:?}")
            }
            Err(Error::QuestionClosed { outcome, .. }) => {
                assert_eq!(*i, 5, "answer {i} refused");
                assert_eq!(outcome, QuestionOutcome::Cancelled);
            }
            Err(e) => panic!("answer {i}: {e}"),
        }
    }
    assert_eq!(applied_to_0, 1, "the same message applied once");
    // Five resume jobs, each for the generation the answer moved its task to.
    let jobs = run_jobs(store).await;
    for (task, _) in &waiting[..5] {
        let id = task.id.to_string();
        let resumes: Vec<_> = jobs
            .iter()
            .filter(|(t, generation, _)| *t == id && *generation == task.generation as u64 + 1)
            .collect();
        assert_eq!(resumes.len(), 1, "resume jobs of {id}: {jobs:?}");
    }
    db.drop().await;
}

#[tokio::test]
async fn answers_looked_up_together_each_find_their_own_question() {
    let db = TestDb::new().await;
    let store = &db.store;
    let mut waiting = Vec::new();
    for _ in 0..4 {
        waiting.push(waiting_task(store).await);
    }
    // Task 3's answer was applied before: the same message comes again.
    store
        .answer(waiting[3].1, &answer("first", "m-3"))
        .await
        .expect("first answer");
    let silent = new_task(store, None).await;
    let unknown = hark_core::domain::QuestionId::new();
    // By question, by task, by task again with another message, an unknown question, a task
    // without an open question, and the repeated message: all at once.
    let answers = [
        answer("to the question", "m-0"),
        answer("to the task", "m-1"),
        answer("to the task too", "m-2"),
        answer("to nobody", "m-x"),
        answer("to a task that asked nothing", "m-y"),
        answer("first", "m-3"),
    ];
    let (by_question, by_task, again, lost, none, repeated) = tokio::join!(
        store.answer(waiting[0].1, &answers[0]),
        store.answer_task(waiting[1].0.id, &answers[1]),
        store.answer_task(waiting[2].0.id, &answers[2]),
        store.answer(unknown, &answers[3]),
        store.answer_task(silent.id, &answers[4]),
        store.answer(waiting[3].1, &answers[5]),
    );
    for (i, outcome, text) in [
        (0, by_question, "to the question"),
        (1, by_task, "to the task"),
        (2, again, "to the task too"),
    ] {
        match outcome {
            Ok(AnswerOutcome::Applied { task, question, .. }) => {
                assert_eq!(task.id, waiting[i].0.id);
                assert_eq!(question.id, waiting[i].1);
                assert_eq!(question.answer.as_deref(), Some(text));
                assert_eq!(task.state, TaskState::Pending);
            }
            other => panic!("answer {i}: {other:?}"),
        }
    }
    assert!(
        matches!(lost, Err(Error::QuestionNotFound(ref id)) if *id == unknown.to_string()),
        "{lost:?}"
    );
    assert!(
        matches!(none, Err(Error::NoOpenQuestion { ref task }) if *task == silent.id.to_string()),
        "{none:?}"
    );
    assert!(
        matches!(repeated, Ok(AnswerOutcome::Duplicate { .. })),
        "{repeated:?}"
    );
    db.drop().await;
}

#[tokio::test]
async fn an_answer_from_the_open_questions_read_is_refused_for_a_message_applied_before() {
    let db = TestDb::new().await;
    let store = &db.store;
    let (task, first) = waiting_task(store).await;
    store
        .answer(first, &answer("Paris", "m-1"))
        .await
        .expect("first answer");
    // The task asks again; then the first message arrives once more, and another one.
    let claimed = store
        .claim(task.id, task.generation + 1, "w1", LEASE)
        .await
        .expect("claim wins");
    let second = store
        .ask(&claimed.lease, &ask_input(2, "call-2"))
        .await
        .expect("ask succeeds");
    let again = store
        .open_questions_for_sender("qq", "group:777", "10001", Some("m-1"))
        .await
        .expect("open questions");
    assert_eq!(
        again.iter().map(|t| t.question.id).collect::<Vec<_>>(),
        [second.id]
    );
    // Without a platform, the owner's user id is matched by its suffix.
    let unplatformed = store
        .open_questions_for_sender("", "group:777", "10001", None)
        .await
        .expect("open questions");
    assert_eq!(
        unplatformed
            .iter()
            .map(|t| t.question.id)
            .collect::<Vec<_>>(),
        [second.id]
    );
    for (platform, stream, user) in [
        ("", "group:777", "20002"),
        ("qq", "group:778", "10001"),
        ("wx", "group:777", "10001"),
    ] {
        let none = store
            .open_questions_for_sender(platform, stream, user, None)
            .await
            .expect("open questions");
        assert!(none.is_empty(), "{platform}/{stream}/{user} may not answer");
    }
    let repeated = store
        .answer_target(again[0].clone(), &answer("Paris", "m-1"))
        .await
        .expect("decided");
    assert!(
        matches!(repeated, AnswerOutcome::Duplicate { .. }),
        "{repeated:?}"
    );
    let fresh = store
        .open_questions_for_sender("qq", "group:777", "10001", Some("m-2"))
        .await
        .expect("open questions");
    match store
        .answer_target(fresh[0].clone(), &answer("Lyon", "m-2"))
        .await
        .expect("decided")
    {
        AnswerOutcome::Applied {
            task: moved,
            question,
            ..
        } => {
            assert_eq!(question.id, second.id);
            assert_eq!(question.answer.as_deref(), Some("Lyon"));
            assert_eq!(moved.state, TaskState::Pending);
        }
        other => panic!("the new message was not applied: {other:?}"),
    }
    // A target read before the task moved is refused: its question is closed now.
    let stale = store
        .answer_target(fresh[0].clone(), &answer("Nice", "m-3"))
        .await;
    assert!(
        matches!(
            stale,
            Err(Error::QuestionClosed {
                outcome: QuestionOutcome::Answered,
                ..
            })
        ),
        "{stale:?}"
    );
    db.drop().await;
}

#[tokio::test]
async fn asks_decided_together_draw_new_handles_when_theirs_are_taken() {
    let db = TestDb::new().await;
    let store = &db.store;
    // One in eight handles is taken by an open question of the same owner in the same chat, so
    // most batches of sixteen asks meet a taken handle, which fails their statement.
    let holder = new_task(store, Some(group_chat())).await;
    sqlx::query(
        "INSERT INTO questions (id, task_id, handle, text, tool_call_id, round, owner, platform,
                                bot_id, stream)
         SELECT gen_random_uuid(), $1, lpad(to_hex(g * 8), 4, '0'), 'taken', 'call', 1, $2, $3, $4, $5
         FROM generate_series(0, 8191) AS g",
    )
    .bind(holder.id.as_uuid())
    .bind(owner().as_str())
    .bind(&group_chat().platform)
    .bind(&group_chat().bot_id)
    .bind(&group_chat().stream)
    .execute(store.pool())
    .await
    .expect("handles taken");
    let mut leases = Vec::new();
    for _ in 0..16 {
        let task = new_task(store, Some(group_chat())).await;
        let claimed = store
            .claim(task.id, task.generation, "w1", LEASE)
            .await
            .expect("claim wins");
        leases.push(claimed.lease);
    }
    let asked = futures_util::future::join_all(leases.iter().map(|lease| {
        let (store, lease) = (store.clone(), lease.clone());
        async move { store.ask(&lease, &ask_input(1, "call-1")).await }
    }))
    .await;
    let mut handles = std::collections::HashSet::new();
    for (lease, question) in leases.iter().zip(asked) {
        let question = question.expect("every ask finds a free handle");
        let value = u32::from_str_radix(&question.handle, 16).expect("hex handle");
        assert_ne!(value % 8, 0, "handle {} was taken", question.handle);
        assert!(
            handles.insert(question.handle.clone()),
            "handle given twice"
        );
        let task = store.get_task(lease.task).await.expect("task");
        assert_eq!(task.state, TaskState::WaitingInput);
        let open: Vec<_> = store
            .questions_of(lease.task)
            .await
            .expect("questions")
            .into_iter()
            .filter(|q| q.outcome == QuestionOutcome::Open)
            .collect();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].id, question.id);
        assert_eq!(open[0].handle, question.handle);
    }
    db.drop().await;
}

#[tokio::test]
async fn an_answer_the_database_refuses_fails_alone_and_is_not_retried() {
    let db = TestDb::new().await;
    let store = &db.store;
    let mut waiting = Vec::new();
    for _ in 0..5 {
        waiting.push(waiting_task(store).await);
    }
    // Postgres refuses a NUL character in a text; the answer carrying one is in the same batch as
    // four good ones.
    let outcomes = futures_util::future::join_all(waiting.iter().enumerate().map(|(i, (_, q))| {
        let (store, question) = (store.clone(), *q);
        let text = if i == 2 {
            "bad\0answer".to_owned()
        } else {
            format!("answer {i}")
        };
        let answer = answer(&text, &format!("m-{i}"));
        async move { store.answer(question, &answer).await }
    }))
    .await;
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let task = store.get_task(waiting[i].0.id).await.expect("task");
        if i == 2 {
            let e = outcome.expect_err("the NUL answer is refused");
            assert!(!e.is_retryable(), "{e} would be retried forever");
            assert_eq!(task.state, TaskState::WaitingInput);
        } else {
            assert!(
                matches!(outcome, Ok(AnswerOutcome::Applied { .. })),
                "answer {i}"
            );
            assert_eq!(task.state, TaskState::Pending);
        }
    }
    db.drop().await;
}

#[tokio::test]
async fn finished_tasks_past_their_retention_are_deleted_with_what_they_own() {
    let db = TestDb::new().await;
    let store = &db.store;
    let keep = Duration::from_secs(30 * 86_400);
    // Old and completed: it asked, was told something, got its answer and finished.
    let (old, question) = waiting_task(store).await;
    store
        .tell(old.id, "also pack an umbrella", "qq:10001")
        .await
        .expect("told");
    store
        .answer(question, &answer("Paris", "m-old"))
        .await
        .expect("answered");
    let claimed = store
        .claim(old.id, old.generation + 1, "w1", LEASE)
        .await
        .expect("claim wins");
    store
        .complete(
            &claimed.lease,
            Some((2, &json!([{"role": "assistant", "content": "done"}]))),
            "done",
        )
        .await
        .expect("completed");
    // Old and cancelled; old but still waiting; recently cancelled, answered by a recent message.
    let cancelled = new_task(store, None).await;
    store
        .cancel(cancelled.id, "qq:10001", "")
        .await
        .expect("cancelled");
    let (waiting, _) = waiting_task(store).await;
    let (recent, recent_question) = waiting_task(store).await;
    store
        .answer(recent_question, &answer("Lyon", "m-new"))
        .await
        .expect("answered");
    store
        .cancel(recent.id, "qq:10001", "")
        .await
        .expect("cancelled");
    let aged = vec![
        old.id.as_uuid(),
        cancelled.id.as_uuid(),
        waiting.id.as_uuid(),
    ];
    sqlx::query(
        "UPDATE tasks SET created_at = created_at - interval '40 days',
                          finished_at = finished_at - interval '40 days'
         WHERE id = ANY($1)",
    )
    .bind(&aged)
    .execute(store.pool())
    .await
    .expect("aged");
    sqlx::query(
        "UPDATE applied_inbound SET applied_at = applied_at - interval '40 days' WHERE key = 'm-old'",
    )
    .execute(store.pool())
    .await
    .expect("aged");

    // In batches of one, then nothing is left to do.
    let first = store.purge_finished(keep, 1).await.expect("purged");
    assert_eq!((first.tasks, first.applied_inbound), (1, 1));
    let second = store.purge_finished(keep, 1).await.expect("purged");
    assert_eq!((second.tasks, second.applied_inbound), (1, 0));
    let third = store.purge_finished(keep, 1).await.expect("purged");
    assert_eq!((third.tasks, third.applied_inbound), (0, 0));

    for gone in [old.id, cancelled.id] {
        assert!(
            matches!(store.get_task(gone).await, Err(Error::TaskNotFound(_))),
            "task {gone} past its retention is still there"
        );
    }
    for table in ["checkpoints", "questions", "instructions", "transitions"] {
        let left: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} WHERE task_id = ANY($1)"
        )))
        .bind(&aged[..2])
        .fetch_one(store.pool())
        .await
        .expect("count");
        assert_eq!(left, 0, "{table} rows of deleted tasks are left");
    }
    // The waiting task and the recent one stay, with their history.
    for kept in [waiting.id, recent.id] {
        store.get_task(kept).await.expect("kept");
        assert!(!store.transitions_of(kept).await.expect("audit").is_empty());
    }
    let applied: Vec<String> = sqlx::query_scalar("SELECT key FROM applied_inbound")
        .fetch_all(store.pool())
        .await
        .expect("applied");
    assert_eq!(applied, ["m-new"]);
    db.drop().await;
}

#[tokio::test]
async fn every_outbox_message_carries_the_trace_that_caused_it() {
    use hark_core::trace::{self, TraceContext};
    let db = TestDb::new().await;
    let store = &db.store;
    let traced = TraceContext::new_root();
    // A task's whole life in one trace: created, claimed, asking in its chat, answered, claimed
    // again, sending a message, completing; a second task created and cancelled.
    trace::scope(Some(traced), async {
        let (task, question) = waiting_task(store).await;
        store
            .answer(question, &answer("Paris", "m-1"))
            .await
            .expect("answered");
        let claimed = store
            .claim(task.id, task.generation + 1, "w1", LEASE)
            .await
            .expect("claim wins");
        assert!(
            store
                .send(&claimed.lease, "halfway there", None)
                .await
                .expect("sent")
        );
        store
            .complete(&claimed.lease, None, "done")
            .await
            .expect("completed");
        let other = new_task(store, Some(group_chat())).await;
        store
            .cancel(other.id, "qq:10001", "not needed")
            .await
            .expect("cancelled");
    })
    .await;
    // Outside any trace, nothing is stamped.
    let untraced = new_task(store, None).await;

    let entries = store.outbox_batch(1000).await.expect("outbox");
    let mut subjects = std::collections::BTreeSet::new();
    for entry in &entries {
        let payload_task = codec::decode::<pb::RunJob>(&entry.payload)
            .map(|j| j.task_id)
            .unwrap_or_default();
        if payload_task == untraced.id.to_string() {
            assert_eq!(entry.traceparent, None, "{}", entry.subject);
            continue;
        }
        let context = entry
            .traceparent
            .as_deref()
            .and_then(TraceContext::parse)
            .unwrap_or_else(|| panic!("{} {} carries no trace", entry.subject, entry.msg_id));
        assert_eq!(context.trace_id(), traced.trace_id(), "{}", entry.subject);
        assert_ne!(context, traced, "a message is sent from a span of its own");
        subjects.insert(
            entry
                .subject
                .rsplit_once('.')
                .map_or("", |(s, _)| s)
                .to_owned(),
        );
    }
    // Run jobs (creation, answer) and chat messages (question, send, result, cancellation).
    let kinds = entries.iter().filter(|e| e.traceparent.is_some()).count();
    assert!(kinds >= 7, "{kinds} traced messages: {subjects:?}");
    assert!(
        subjects.iter().any(|s| s.ends_with(".task")),
        "{subjects:?}"
    );
    assert!(
        subjects.iter().any(|s| s.contains(".chat.out")),
        "{subjects:?}"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_fresh_database_gets_statistics_at_once_and_growth_is_analyzed_without_vacuuming() {
    let db = TestDb::new().await;
    let store = &db.store;
    // TestDb migrated a new database: every table of hark's has been analyzed, including any a
    // later migration adds.
    let never: Vec<String> = sqlx::query_scalar(
        "SELECT relname::text FROM pg_stat_user_tables
         WHERE schemaname = current_schema() AND relname <> '_sqlx_migrations'
           AND last_analyze IS NULL AND last_autoanalyze IS NULL",
    )
    .fetch_all(store.pool())
    .await
    .expect("statistics");
    assert!(never.is_empty(), "never analyzed: {never:?}");

    for _ in 0..120 {
        let task = new_task(store, None).await;
        store
            .claim(task.id, task.generation, "w1", LEASE)
            .await
            .expect("claim wins");
    }
    // With autovacuum left to the server, a pass analyzes what grew and vacuums nothing.
    let mut all = hark_control::store::Upkeep::default();
    for _ in 0..60 {
        let pass = store.upkeep_with(false).await.expect("pass");
        all.analyzed.extend(pass.analyzed);
        all.vacuumed.extend(pass.vacuumed);
        if all.analyzed.iter().any(|t| t == "tasks") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(all.analyzed.iter().any(|t| t == "tasks"), "{all:?}");
    assert!(all.vacuumed.is_empty(), "{all:?}");
    db.drop().await;
}

#[tokio::test]
async fn keys_written_before_they_named_their_stream_are_rewritten_to_name_it() {
    let db = TestDb::new().await;
    let store = &db.store;
    let (task, question) = waiting_task(store).await;
    // As an earlier version wrote them: `platform:bot:message_id`.
    sqlx::query(
        "INSERT INTO applied_inbound (key, task_id, question_id) VALUES ('qq:42:m-9', $1, $2),
                ('api:r-1', $1, NULL)",
    )
    .bind(task.id.as_uuid())
    .bind(question.as_uuid())
    .execute(store.pool())
    .await
    .expect("old keys");
    sqlx::query("UPDATE tasks SET request_id = 'qq:42:m-1' WHERE id = $1")
        .bind(task.id.as_uuid())
        .execute(store.pool())
        .await
        .expect("old request id");
    let migration = include_str!("../migrations/20261201000005_keys_by_stream.sql");
    sqlx::raw_sql(sqlx::AssertSqlSafe(migration))
        .execute(store.pool())
        .await
        .expect("the migration runs");
    let mut keys: Vec<String> = sqlx::query_scalar("SELECT key FROM applied_inbound")
        .fetch_all(store.pool())
        .await
        .expect("keys");
    keys.sort();
    assert_eq!(keys, ["api:r-1", "qq:42:group:777:m-9"]);
    let request: Option<String> = sqlx::query_scalar("SELECT request_id FROM tasks WHERE id = $1")
        .bind(task.id.as_uuid())
        .fetch_one(store.pool())
        .await
        .expect("request id");
    assert_eq!(request.as_deref(), Some("qq:42:group:777:m-1"));
    // The message applied before is known under its new key: applying it again changes nothing.
    let again = store
        .answer(question, &answer("Paris", "qq:42:group:777:m-9"))
        .await
        .expect("answer");
    assert!(
        matches!(again, AnswerOutcome::Duplicate { .. }),
        "{again:?}"
    );
    db.drop().await;
}

#[tokio::test]
async fn a_task_of_a_higher_priority_is_claimed_first_and_every_job_still_finds_a_task() {
    let db = TestDb::new().await;
    let store = &db.store;
    let with_priority = |priority: i16, goal: &str| NewTask {
        goal: goal.into(),
        priority,
        ..new_task_spec(None)
    };
    let routine = store
        .create_task(&with_priority(0, "tidy the archive"))
        .await
        .expect("task");
    let later = store
        .create_task(&with_priority(0, "tidy the attic"))
        .await
        .expect("task");
    let urgent = store
        .create_task(&with_priority(10, "the server is down"))
        .await
        .expect("task");
    // A worker free for the routine task's job gets the urgent task instead.
    let first = store
        .claim(routine.id, routine.generation, "w1", LEASE)
        .await
        .expect("a claim");
    assert_eq!(first.task.id, urgent.id);
    assert_eq!(
        first.lease.task, urgent.id,
        "the lease is for the task claimed"
    );
    // The urgent task's own job then finds it taken, and takes the longest pending of the rest.
    let second = store
        .claim(urgent.id, urgent.generation, "w2", LEASE)
        .await
        .expect("a claim");
    assert_eq!(second.task.id, routine.id);
    // Equal priorities keep to the job's own task.
    let third = store
        .claim(later.id, later.generation, "w3", LEASE)
        .await
        .expect("a claim");
    assert_eq!(third.task.id, later.id);
    // With nothing pending, a job left over is refused as before.
    assert!(matches!(
        store
            .claim(routine.id, routine.generation, "w4", LEASE)
            .await,
        Err(Error::StaleJob { .. })
    ));
    db.drop().await;
}

/// The names each column's CHECK constraint allows, as the migrations left them.
async fn allowed_by_the_migrations(db: &TestDb, table: &str, column: &str) -> Vec<String> {
    let definitions: Vec<String> = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
         JOIN pg_class t ON t.oid = c.conrelid
         WHERE t.relname = $1 AND c.contype = 'c'",
    )
    .bind(table)
    .fetch_all(db.store.pool())
    .await
    .expect("constraints");
    let list = definitions
        .iter()
        .find(|d| d.contains(&format!("(({column} = ANY")))
        .unwrap_or_else(|| panic!("no CHECK of {table}.{column} among {definitions:?}"));
    let mut names: Vec<String> = list
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn the_names_the_migrations_allow_are_the_domains_names() {
    use hark_core::domain::schedule::{Overlap, ScheduleState};
    let db = TestDb::new().await;
    let sorted = |mut names: Vec<&str>| {
        names.sort();
        names.into_iter().map(str::to_owned).collect::<Vec<_>>()
    };
    let cases = [
        (
            "tasks",
            "state",
            sorted(TaskState::ALL.map(TaskState::as_str).to_vec()),
        ),
        (
            "tasks",
            "on_timeout",
            sorted(TimeoutPolicy::ALL.map(TimeoutPolicy::as_str).to_vec()),
        ),
        (
            "questions",
            "outcome",
            sorted(QuestionOutcome::ALL.map(QuestionOutcome::as_str).to_vec()),
        ),
        (
            "tasks",
            "on_deadline",
            sorted(DeadlinePolicy::ALL.map(DeadlinePolicy::as_str).to_vec()),
        ),
        (
            "schedules",
            "state",
            sorted(ScheduleState::ALL.map(ScheduleState::as_str).to_vec()),
        ),
        (
            "schedules",
            "on_timeout",
            sorted(TimeoutPolicy::ALL.map(TimeoutPolicy::as_str).to_vec()),
        ),
        (
            "schedules",
            "overlap",
            sorted(Overlap::ALL.map(Overlap::as_str).to_vec()),
        ),
    ];
    for (table, column, named) in cases {
        assert_eq!(
            allowed_by_the_migrations(&db, table, column).await,
            named,
            "{table}.{column}"
        );
    }
    db.drop().await;
}

/// An ask closes a question its task still has open as its decision says, superseded, in the
/// statement that opens the new one.
#[tokio::test]
async fn an_ask_supersedes_a_question_left_open() {
    let db = TestDb::new().await;
    let (task, first) = waiting_task(&db.store).await;
    // The task runs again with its question still open, as no move of hark's leaves it.
    let generation: i64 = sqlx::query_scalar(
        "UPDATE tasks SET state = 'running', worker_id = 'w1', lease_until = now() + interval '1 minute'
         WHERE id = $1 RETURNING generation",
    )
    .bind(task.id.as_uuid())
    .fetch_one(db.store.pool())
    .await
    .expect("running again");
    let lease = Lease {
        task: task.id,
        generation,
        worker_id: "w1".into(),
    };
    let second = db
        .store
        .ask(&lease, &ask_input(2, "call-2"))
        .await
        .expect("asked");
    let questions = db.store.questions_of(task.id).await.expect("questions");
    let outcome = |id| {
        questions
            .iter()
            .find(|q| q.id == id)
            .map(|q| q.outcome)
            .expect("question")
    };
    assert_eq!(outcome(first), QuestionOutcome::Superseded);
    assert_eq!(outcome(second.id), QuestionOutcome::Open);
    db.drop().await;
}

/// Statistics taken while every question was closed make the indexes of open questions look
/// empty. An ask, which closes what its task left open, and an answer, which closes its
/// question, still find the question by its id or its task, instead of reading every open one.
#[tokio::test]
async fn asks_and_answers_after_the_statistics_saw_no_question_open_read_their_own_only() {
    let db = TestDb::new().await;
    // One backend runs every statement, so that its statistics of index reads can be flushed.
    let store = &db.one_connection().await;
    let pool = db.store.pool();
    let held = HeldStatistics::of(pool, "questions").await;
    const QUESTIONS: usize = 300;
    for i in 0..QUESTIONS {
        let (_, question) = waiting_task_in(store, None).await;
        store
            .answer(question, &answer("yes", &format!("closed-{i}")))
            .await
            .expect("answered");
    }
    sqlx::query("ANALYZE questions")
        .execute(pool)
        .await
        .expect("analyzed");
    // Then as many are open, with the statistics saying that none is.
    let mut open = Vec::new();
    for _ in 0..QUESTIONS {
        open.push(waiting_task_in(store, None).await.1);
    }

    let reads = || index_reads(store, "questions");
    for (i, question) in open.iter().take(10).enumerate() {
        let task = new_task(store, None).await;
        let claimed = store
            .claim(task.id, task.generation, "w1", LEASE)
            .await
            .expect("claim wins");
        let before = reads().await;
        store
            .ask(&claimed.lease, &ask_input(1, "call-1"))
            .await
            .expect("asked");
        let after = reads().await;
        assert!(
            after - before < 10,
            "an ask read {} index entries of questions, with {QUESTIONS} open",
            after - before
        );
        let before = reads().await;
        let outcome = store
            .answer(*question, &answer("yes", &format!("open-{i}")))
            .await
            .expect("answered");
        let after = reads().await;
        assert!(
            matches!(outcome, AnswerOutcome::Applied { .. }),
            "{outcome:?}"
        );
        assert!(
            after - before < 10,
            "an answer read {} index entries of questions, with {QUESTIONS} open",
            after - before
        );
    }
    held.release().await;
    store.pool().close().await;
    db.drop().await;
}

/// Statistics taken while no task ran make the indexes of running tasks look empty. A worker's
/// heartbeat, its reads of the task it holds and its ask still find that task by id, instead of
/// reading every running task each time.
#[tokio::test]
async fn a_workers_calls_after_the_statistics_saw_no_task_running_read_its_own_task_only() {
    let db = TestDb::new().await;
    // One backend runs every statement, so that its statistics of index reads can be flushed.
    let store = &db.one_connection().await;
    let pool = db.store.pool();
    // Neither Postgres nor task-control's upkeep may take the statistics again during the test.
    let held = HeldStatistics::of(pool, "tasks").await;
    const TASKS: usize = 300;
    for _ in 0..TASKS {
        let task = new_task(store, None).await;
        store.cancel(task.id, "admin", "").await.expect("cancelled");
    }
    sqlx::query("ANALYZE tasks")
        .execute(pool)
        .await
        .expect("analyzed");
    // Then as many run, with the statistics saying that none does.
    let mut leases = Vec::new();
    for _ in 0..TASKS {
        let task = new_task(store, None).await;
        let claimed = store
            .claim(task.id, task.generation, "w1", LEASE)
            .await
            .expect("claim wins");
        leases.push(claimed.lease);
    }

    // Every index of tasks: both of those holding only active tasks would do.
    let reads = || index_reads(store, "tasks");
    for lease in &leases[..10] {
        let before = reads().await;
        store.heartbeat(lease, LEASE).await.expect("renewed");
        store.held(lease).await.expect("held");
        store.rounds_after(lease, 0).await.expect("rounds");
        let after = reads().await;
        assert!(
            after - before < 10,
            "a heartbeat and two reads of the held task read {} index entries of tasks, with {TASKS} running",
            after - before
        );
        let before = reads().await;
        store
            .ask(lease, &ask_input(1, "call-1"))
            .await
            .expect("asked");
        let after = reads().await;
        assert!(
            after - before < 10,
            "an ask read {} index entries of tasks, with {TASKS} running",
            after - before
        );
        let task = store.get_task(lease.task).await.expect("task");
        assert_eq!(task.state, TaskState::WaitingInput);
    }
    held.release().await;
    store.pool().close().await;
    db.drop().await;
}

/// A task created over the API has no chat, so it writes no entry into the indexes by which a
/// chat finds its tasks and questions: each such entry would cost every move of it a write.
#[tokio::test]
async fn a_task_without_a_chat_writes_nothing_into_the_indexes_of_chats() {
    let db = TestDb::new().await;
    let store = &db.store;
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pageinspect")
        .execute(store.pool())
        .await
        .expect("pageinspect, from Postgres's contrib");
    const INDEXES: [&str; 3] = [
        "tasks_by_stream",
        "questions_open_by_stream_owner",
        "questions_open_handle",
    ];
    // The entries of an index small enough for its root to be its one leaf; one without any
    // has no root. Each version of a row that an update wrote has an entry until a vacuum.
    let entries = |index: &'static str| async move {
        sqlx::query_scalar::<_, i64>(
            "SELECT CASE WHEN (m).root = 0 THEN 0
                         ELSE (bt_page_stats($1, (m).root::bigint)).live_items END::bigint
             FROM (SELECT bt_metap($1) AS m) x",
        )
        .bind(index)
        .fetch_one(store.pool())
        .await
        .expect("the index's entries")
    };

    waiting_task_in(store, None).await;
    waiting_task_in(store, None).await;
    for index in INDEXES {
        assert_eq!(
            entries(index).await,
            0,
            "{index} holds tasks without a chat"
        );
    }
    // A task in a chat is found by each of them.
    waiting_task(store).await;
    for index in INDEXES {
        assert!(entries(index).await > 0, "{index} holds the chat's task");
    }
    db.drop().await;
}
