//! An answer over the API to a question this replica asked of a task without a chat starts
//! from what the ask left, without reading it again. Against the real Postgres: that it does,
//! and that whenever the task moved elsewhere since (another replica paused or cancelled it, or
//! the answer's message was applied before) the answer is decided exactly as a read would have
//! decided it.

mod common;

use common::{
    Cases as _, TestDb,
    tasks::{answer, group_chat, waiting_task_in},
};
use hark_control::{
    metrics::{READ, REMEMBERED},
    store::{AnswerOutcome, Error, Store},
};
use hark_core::domain::{QuestionOutcome, TaskState};

/// Another replica of task-control on the same database: it remembers nothing `store` asked.
fn replica(store: &Store) -> Store {
    Store::new(
        store.pool().clone(),
        store.names().clone(),
        hark_control::texts::Languages::new(&Default::default()),
    )
}

fn starts(store: &Store) -> (u64, u64) {
    let metrics = store.metrics();
    (
        metrics.answer_starts(REMEMBERED),
        metrics.answer_starts(READ),
    )
}

#[tokio::test]
async fn an_answer_to_a_question_this_replica_asked_starts_from_the_ask_and_records_the_same() {
    let db = TestDb::new().await;
    let store = &db.store;

    // By question id and by task id: both start from what the ask left.
    let (by_question, question) = waiting_task_in(store, None).await;
    let applied = store
        .answer(question, &answer("Paris", "api:req-1"))
        .await
        .expect("answered");
    let AnswerOutcome::Applied {
        task, question: q, ..
    } = applied
    else {
        panic!("applied: {applied:?}");
    };
    assert_eq!(task.state, TaskState::Pending);
    assert_eq!(task.generation, by_question.generation + 1);
    assert_eq!(q.outcome, QuestionOutcome::Answered);
    assert_eq!(starts(store), (1, 0));
    // What the reply said is what was stored.
    let stored = store.get_question(question).await.expect("question");
    assert_eq!(stored.outcome, QuestionOutcome::Answered);
    assert_eq!(stored.answer.as_deref(), Some("Paris"));
    assert_eq!(stored.answerer, q.answerer);
    assert_eq!(stored.inbound_message_id.as_deref(), Some("api:req-1"));
    assert_eq!(stored.asked_at, q.asked_at, "the ask's time, as remembered");
    assert_eq!(stored.handle, q.handle);
    assert_eq!(stored.tool_call_id, q.tool_call_id);
    assert_eq!(
        store
            .get_task(by_question.id)
            .await
            .expect("task")
            .generation,
        task.generation
    );

    let (by_task, _) = waiting_task_in(store, None).await;
    let applied = store
        .answer_task(by_task.id, &answer("Rome", "api:req-2"))
        .await
        .expect("answered");
    assert!(
        matches!(applied, AnswerOutcome::Applied { .. }),
        "{applied:?}"
    );
    assert_eq!(starts(store), (2, 0));

    // The same request again finds nothing remembered: read, and told it was applied before.
    let again = store
        .answer_task(by_task.id, &answer("Rome", "api:req-2"))
        .await
        .expect("a retry is answered");
    assert!(
        matches!(again, AnswerOutcome::Duplicate { .. }),
        "{again:?}"
    );

    // A question in a chat is not remembered (a reminder may change it): read.
    let (_, asked) = waiting_task_in(store, Some(group_chat())).await;
    store
        .answer(asked, &answer("Oslo", "api:req-3"))
        .await
        .expect("answered");
    assert_eq!(starts(store), (2, 1));
    db.drop().await;
}

#[tokio::test]
async fn a_remembered_question_whose_task_moved_on_another_replica_is_answered_as_a_read_would() {
    let db = TestDb::new().await;
    let store = &db.store;
    let other = replica(store);

    // Paused on the other replica: the question stays open and the answer is recorded, the
    // task stays paused.
    let (task, question) = waiting_task_in(store, None).await;
    other.pause(task.id, "api:bob").await.expect("paused");
    let applied = store
        .answer(question, &answer("Paris", "api:req-1"))
        .await
        .expect("an answer to a paused task is recorded");
    assert!(
        matches!(applied, AnswerOutcome::Applied { .. }),
        "{applied:?}"
    );
    assert_eq!(
        store.get_task(task.id).await.expect("task").state,
        TaskState::Paused
    );
    assert_eq!(
        store
            .get_question(question)
            .await
            .expect("q")
            .answer
            .as_deref(),
        Some("Paris")
    );
    assert_eq!(starts(store), (0, 1), "decided from a read");

    // Cancelled on the other replica: the answer is told the question was cancelled.
    let (task, question) = waiting_task_in(store, None).await;
    other
        .cancel(task.id, "api:bob", "no longer needed")
        .await
        .expect("cancelled");
    let refused = store
        .answer(question, &answer("Rome", "api:req-2"))
        .await
        .expect_err("the question is closed");
    assert!(
        matches!(
            refused,
            Error::QuestionClosed {
                outcome: QuestionOutcome::Cancelled,
                ..
            }
        ),
        "{refused:?}"
    );
    let cancelled = store.get_task(task.id).await.expect("task");
    assert_eq!(cancelled.state, TaskState::Cancelled);
    assert_eq!(starts(store), (0, 1));
    db.drop().await;
}

#[tokio::test]
async fn a_message_applied_before_is_not_applied_again_through_a_remembered_question() {
    let db = TestDb::new().await;
    let store = &db.store;
    let other = replica(store);

    // The other replica applies message K to its own task's question.
    let (first, first_question) = waiting_task_in(&other, None).await;
    other
        .answer(first_question, &answer("Paris", "api:K"))
        .await
        .expect("applied");

    // The same message K to a question this replica remembers: the statement refuses it, and
    // the read says what K did then.
    let (second, second_question) = waiting_task_in(store, None).await;
    let outcome = store
        .answer(second_question, &answer("Rome", "api:K"))
        .await
        .expect("a duplicate is not an error");
    let AnswerOutcome::Duplicate { question } = outcome else {
        panic!("told it was applied before: {outcome:?}");
    };
    assert_eq!(question.id, first_question, "the question K answered");
    let untouched = store.get_task(second.id).await.expect("task");
    assert_eq!(untouched.state, TaskState::WaitingInput);
    let open = store.get_question(second_question).await.expect("question");
    assert_eq!(open.outcome, QuestionOutcome::Open);
    assert_eq!(
        other.get_task(first.id).await.expect("task").state,
        TaskState::Pending
    );
    // A new message then answers it, from a read (the remembered question was used up).
    store
        .answer(second_question, &answer("Rome", "api:K2"))
        .await
        .expect("applied");
    assert_eq!(starts(store), (0, 1));
    db.drop().await;
}
