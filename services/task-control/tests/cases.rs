//! The use cases every door shares, called directly: what they refuse, what they decide, and
//! who may act on which task.

mod common;

use std::time::Duration;

use common::control::TestControl;
use hark_control::{
    cases::{self, Caller, Create},
    store,
};
use hark_core::{
    domain::{Owner, Role, TaskRef, TaskState, form::FormQuestion},
    error::{Classified, Kind},
};

fn owner(s: &str) -> Owner {
    s.parse().expect("owner")
}

fn create(who: &str, goal: &str) -> Create {
    Create {
        by: Caller::Operator("test"),
        owner: owner(who),
        goal: goal.into(),
        chat: None,
        ask_timeout: None,
        on_timeout: None,
        priority: 0,
        request_key: None,
        questionnaire: None,
        deadline: None,
        on_deadline: None,
    }
}

#[tokio::test]
async fn a_guest_cannot_have_tasks_and_nothing_is_created() {
    let tc = TestControl::start_with(|c| c.permission.default_role = Role::Guest).await;
    let refused = cases::create_task(&tc.shared, create("api:stranger", "do it"))
        .await
        .expect_err("a guest is refused");
    assert_eq!(refused.kind(), Kind::Forbidden);
    assert!(
        refused.to_string().contains("permission.users"),
        "{refused}"
    );
    let made = tc
        .store
        .list_tasks(&store::TaskFilter {
            owner: Some(owner("api:stranger")),
            limit: 10,
            ..Default::default()
        })
        .await
        .expect("list");
    assert!(made.is_empty(), "{made:?}");
    tc.stop().await;
}

#[tokio::test]
async fn a_creation_decides_what_the_door_left_to_the_configuration() {
    let tc =
        TestControl::start_with(|c| c.task.ask_timeout = "7m".parse().expect("duration")).await;
    let task = cases::create_task(&tc.shared, create("api:me", "  a goal  "))
        .await
        .expect("created");
    assert_eq!(task.goal, "a goal");
    assert_eq!(task.ask_timeout_s, 7 * 60);
    assert_eq!(task.on_timeout, tc.shared.config.task.on_timeout);

    let mut too_long = create("api:me", "wait a while");
    too_long.ask_timeout = Some(Duration::from_secs(400 * 24 * 3600));
    let refused = cases::create_task(&tc.shared, too_long)
        .await
        .expect_err("past the longest wait");
    assert_eq!(refused.kind(), Kind::Invalid);

    let mut out_of_range = create("api:me", "first of all");
    out_of_range.priority = 101;
    assert!(matches!(
        cases::create_task(&tc.shared, out_of_range).await,
        Err(cases::Error::Priority)
    ));

    let mut form = create("api:me", " ");
    form.questionnaire = Some(vec![FormQuestion {
        key: "name".into(),
        text: "Your name?".into(),
        choices: vec![],
        shape: None,
        escalate_to: vec![],
        escalate_after_s: 0,
        ask_to: vec![],
        need: String::new(),
        context: String::new(),
    }]);
    let titled = cases::create_task(&tc.shared, form).await.expect("created");
    assert_eq!(titled.goal, "a questionnaire of 1 questions");
    tc.stop().await;
}

#[tokio::test]
async fn a_request_key_gives_its_task_again_and_refuses_another_request() {
    let tc = TestControl::start().await;
    let mut first = create("api:me", "book a room");
    first.request_key = Some("api:api:me:k1".into());
    let made = cases::create_task(&tc.shared, first.clone())
        .await
        .expect("created");
    let again = cases::create_task(&tc.shared, first.clone())
        .await
        .expect("the same request again");
    assert_eq!(again.id, made.id);
    let mut other = first;
    other.goal = "book a car".into();
    match cases::create_task(&tc.shared, other).await {
        Err(cases::Error::Reused { task }) => assert_eq!(task, made.id),
        got => panic!("another request under the key: {got:?}"),
    }
    tc.stop().await;
}

#[tokio::test]
async fn a_person_finds_and_moves_only_their_own_tasks_and_an_admin_any() {
    let tc = TestControl::start().await;
    let theirs = cases::create_task(&tc.shared, create("qq:100", "mine"))
        .await
        .expect("created");
    let stranger = Caller::Person {
        owner: owner("qq:200"),
        role: Role::User,
    };
    // A whole id is refused as not theirs; a prefix is not found among their tasks.
    for (reference, kind) in [
        (TaskRef::Full(theirs.id), Kind::Forbidden),
        (
            TaskRef::Prefix(theirs.id.to_string()[..8].to_owned()),
            Kind::NotFound,
        ),
    ] {
        let refused = cases::find(&tc.shared, &stranger, &reference)
            .await
            .expect_err("not the stranger's");
        assert_eq!(refused.kind(), kind, "{refused}");
    }

    let owner_caller = Caller::Person {
        owner: owner("qq:100"),
        role: Role::User,
    };
    let found = cases::find(&tc.shared, &owner_caller, &TaskRef::Full(theirs.id))
        .await
        .expect("their own");
    let paused = cases::pause(&tc.shared, &found).await.expect("paused");
    assert_eq!(paused.state, TaskState::Paused);

    let admin = Caller::Person {
        owner: owner("qq:1"),
        role: Role::Admin,
    };
    let found = cases::find(&tc.shared, &admin, &TaskRef::Full(theirs.id))
        .await
        .expect("an admin sees every task");
    let cancelled = cases::cancel(&tc.shared, &found, "by the admin")
        .await
        .expect("cancelled");
    assert_eq!(cancelled.state, TaskState::Cancelled);
    let audit = tc.store.transitions_of(theirs.id).await.expect("audit");
    let actors: Vec<&str> = audit.iter().map(|t| t.actor.as_str()).collect();
    assert!(
        actors.contains(&"qq:100") && actors.contains(&"qq:1"),
        "{actors:?}"
    );
    tc.stop().await;
}

#[tokio::test]
async fn an_instruction_is_checked_and_recorded_as_its_callers() {
    let tc = TestControl::start().await;
    let task = cases::create_task(&tc.shared, create("qq:100", "write the notes"))
        .await
        .expect("created");
    let caller = Caller::Person {
        owner: owner("qq:100"),
        role: Role::User,
    };
    let found = cases::find(&tc.shared, &caller, &TaskRef::Full(task.id))
        .await
        .expect("their own");
    let refused = cases::tell(&tc.shared, &found, "   ", None)
        .await
        .expect_err("an empty instruction");
    assert_eq!(refused.kind(), Kind::Invalid);
    let (_, delivery) = cases::tell(&tc.shared, &found, " keep it short ", None)
        .await
        .expect("told");
    // Queued, not running: its agent reads it when it starts.
    assert_eq!(delivery, store::TellDelivery::OnResume);
    let pending: Vec<(String, String)> =
        sqlx::query_as("SELECT text, author FROM instructions WHERE task_id = $1")
            .bind(task.id.as_uuid())
            .fetch_all(tc.store.pool())
            .await
            .expect("instructions");
    assert_eq!(
        pending,
        vec![("keep it short".to_owned(), "qq:100".to_owned())]
    );
    tc.stop().await;
}

#[tokio::test]
async fn a_reminder_is_sent_only_for_a_question_of_a_task_the_caller_sees() {
    let tc = TestControl::start().await;
    let (task, question) =
        common::tasks::waiting_task_in(&tc.store, Some(common::tasks::group_chat())).await;
    let person = |who: &str| Caller::Person {
        owner: owner(who),
        role: Role::User,
    };

    // Someone else's question is not found, and nobody is reminded.
    let refused = cases::remind(&tc.shared, &person("qq:999"), question)
        .await
        .expect_err("not theirs");
    assert_eq!(refused.kind(), Kind::NotFound, "{refused}");
    let untouched = tc.store.get_question(question).await.expect("question");
    assert!(untouched.reminded_at.is_none(), "{untouched:?}");

    // The task's owner reminds; a second reminder within the minute is refused, whoever asks.
    let reminded = cases::remind(&tc.shared, &person(task.owner.as_str()), question)
        .await
        .expect("reminded");
    assert!(reminded.reminded_at.is_some(), "{reminded:?}");
    let again = cases::remind(&tc.shared, &Caller::Operator("console"), question)
        .await
        .expect_err("too soon");
    assert!(again.to_string().contains("#"), "{again}");
    assert_eq!(again.kind(), Kind::Exhausted, "{again}");
    tc.stop().await;
}
