//! Questions outside agents ask through hark (`cases::external`, behind the MCP server): who they
//! go to, the limits of a key, and how the task shows who asked. Against the real Postgres and
//! NATS; the MCP clients themselves are in tests/tests/mcp_server.rs.

mod common;

use common::control::TestControl;
use hark_control::cases::{
    Caller, Error,
    external::{self, Ask, Asker},
    keys,
};
use hark_core::domain::{Owner, Role, shape::Shape};
use hark_proto::v1 as pb;

const PERSON: &str = "qq:1001";

fn owner() -> Owner {
    PERSON.parse().expect("owner")
}

fn question(text: &str) -> Ask {
    Ask {
        question: text.into(),
        shape: Shape::Text,
        ..Default::default()
    }
}

/// The person's key, once hark has seen them in a private chat with the bot.
async fn key_holder(tc: &TestControl) -> Asker {
    // The key is made in the private chat, which is where its questions go.
    tc.say("private:1001", "1001", "/key new laptop").await;
    tc.out_containing("hk_").await;
    let (key, _) = keys::create(
        &tc.shared,
        &Caller::Operator("test"),
        keys::Make {
            owner: owner(),
            name: "laptop".into(),
            role: None,
            expires_in: None,
        },
    )
    .await
    .expect("a key");
    Asker {
        caller: Caller::Person {
            owner: owner(),
            role: Role::User,
        },
        key: Some(key),
    }
}

async fn tasks(tc: &TestControl) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM tasks")
        .fetch_one(tc.store.pool())
        .await
        .expect("count")
}

#[tokio::test]
async fn a_key_asks_only_its_owner_within_its_limits_and_its_name_shows_who_asked() {
    let tc = TestControl::start_with(|c| {
        c.mcp.max_open_per_key = 2;
        c.mcp.max_per_minute_per_key = 3;
    })
    .await;
    let asker = key_holder(&tc).await;

    let first = external::ask(&tc.shared, &asker, question("First?"))
        .await
        .expect("asked");
    let shown = tc.out_containing("First?").await;
    assert_eq!(shown.route.expect("route").stream, "private:1001");
    assert!(
        shown.text.contains("asked by laptop through MCP"),
        "{}",
        shown.text
    );
    external::ask(&tc.shared, &asker, question("Second?"))
        .await
        .expect("asked");

    // Two open: a third is refused, and nothing is made.
    let made = tasks(&tc).await;
    let refused = external::ask(&tc.shared, &asker, question("Third?")).await;
    assert!(
        matches!(refused, Err(Error::TooManyOpen { limit: 2, .. })),
        "{refused:?}"
    );
    assert!(
        refused
            .unwrap_err()
            .to_string()
            .contains("mcp.max_open_per_key")
    );
    assert_eq!(tasks(&tc).await, made);

    // One closed: a third is asked; a fourth in the same minute is refused.
    let cancelled = external::cancel(&tc.shared, &asker, first.question.id)
        .await
        .expect("cancelled");
    assert!(!cancelled.waiting());
    tc.out_containing("no longer needs the answer").await;
    external::ask(&tc.shared, &asker, question("Third?"))
        .await
        .expect("asked");
    let open = external::open(&tc.shared, &asker).await.expect("listed");
    assert_eq!(open.len(), 2);
    external::cancel(&tc.shared, &asker, open[0].question.id)
        .await
        .expect("cancelled");
    let refused = external::ask(&tc.shared, &asker, question("Fourth?")).await;
    assert!(
        matches!(refused, Err(Error::TooFast { limit: 3, .. })),
        "{refused:?}"
    );

    // The task says who asked, on gRPC and in the console.
    let task = tc
        .client()
        .await
        .get_task(pb::GetTaskRequest {
            task_id: open[1].task.id.to_string(),
        })
        .await
        .expect("got")
        .into_inner()
        .task
        .expect("task");
    assert_eq!(task.asked_by, "laptop");
    let shown = hark_control::console::json::task(&task);
    assert_eq!(shown["kind"], "external");
    assert_eq!(shown["asked_by"], "laptop");

    // Another person is not asked with this key, nor sees its questions.
    let refused = external::ask(
        &tc.shared,
        &asker,
        Ask {
            owner: Some("qq:2002".parse().expect("owner")),
            ..question("Yours?")
        },
    )
    .await;
    assert!(
        matches!(refused, Err(Error::ForAnother { .. })),
        "{refused:?}"
    );
    let stranger = Asker {
        caller: Caller::Person {
            owner: "qq:2002".parse().expect("owner"),
            role: Role::User,
        },
        key: None,
    };
    let refused = external::find(&tc.shared, &stranger, open[1].question.id).await;
    assert!(
        matches!(refused, Err(Error::NotYourQuestion { .. })),
        "{refused:?}"
    );
    // An operator names the person; without one, nobody is asked.
    let operator = Asker {
        caller: Caller::Operator("mcp"),
        key: None,
    };
    let refused = external::ask(&tc.shared, &operator, question("Whom?")).await;
    assert!(matches!(refused, Err(Error::OwnerNeeded)), "{refused:?}");
    tc.stop().await;
}

#[tokio::test]
async fn a_question_goes_only_where_its_owner_was_seen() {
    let tc = TestControl::start().await;
    let asker = key_holder(&tc).await;
    let refused = external::ask(
        &tc.shared,
        &asker,
        Ask {
            chat: Some("group:999".into()),
            ..question("Here?")
        },
    )
    .await;
    assert!(
        matches!(refused, Err(Error::NotTheirChat { .. })),
        "{refused:?}"
    );
    // Seen speaking in a group: a question may go there.
    tc.say("group:777", "1001", "hello all").await;
    let asked = hark_testkit::eventually(
        "the group is noted",
        std::time::Duration::from_secs(10),
        || async {
            external::ask(
                &tc.shared,
                &asker,
                Ask {
                    chat: Some("group:777".into()),
                    request_id: Some("here-1".into()),
                    ..question("Here?")
                },
            )
            .await
            .ok()
        },
    )
    .await;
    assert_eq!(asked.question.stream.as_deref(), Some("group:777"));
    // The same request id is the same question.
    let again = external::ask(
        &tc.shared,
        &asker,
        Ask {
            chat: Some("group:777".into()),
            request_id: Some("here-1".into()),
            ..question("Here?")
        },
    )
    .await
    .expect("the same");
    assert_eq!(again.question.id, asked.question.id);
    tc.stop().await;
}

#[tokio::test]
async fn a_tool_approved_for_a_session_lasts_its_day_and_then_goes() {
    let tc = TestControl::start().await;
    let asker = key_holder(&tc).await;
    let key = asker.key.as_ref().expect("key").id;
    external::grant(&tc.shared, &asker, "s1", "Bash", "qq:1001")
        .await
        .expect("granted");
    assert!(external::granted(&tc.shared, &asker, "s1", "Bash").await);
    assert!(!external::granted(&tc.shared, &asker, "s2", "Bash").await);
    assert!(!external::granted(&tc.shared, &asker, "s1", "Edit").await);
    // One whose day is over no longer counts, and the retention pass deletes it.
    tc.store
        .grant(key, "s3", "Bash", "qq:1001", std::time::Duration::ZERO)
        .await
        .expect("granted");
    assert!(!external::granted(&tc.shared, &asker, "s3", "Bash").await);
    let purged = tc
        .store
        .purge_finished(std::time::Duration::from_secs(3600), 100)
        .await
        .expect("purged");
    assert_eq!(purged.grants, 1);
    assert!(external::granted(&tc.shared, &asker, "s1", "Bash").await);
    tc.stop().await;
}

#[tokio::test]
async fn a_held_wait_ends_when_task_control_stops_and_the_question_stays_open() {
    let tc = TestControl::start().await;
    let asker = key_holder(&tc).await;
    let asked = external::ask(&tc.shared, &asker, question("Still there?"))
        .await
        .expect("asked");
    let shared = tc.shared.clone();
    let holder = asker.clone();
    let held = tokio::spawn(async move {
        external::wait(
            &shared,
            &holder,
            asked.question.id,
            std::time::Duration::from_secs(3600),
        )
        .await
    });
    // Held until task-control stops, which no call may hold up.
    tc.eventually("the call holds on a watch", || async {
        tc.watchers.count() > 0
    })
    .await;
    assert!(!held.is_finished());
    tc.watchers.stop();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), held)
        .await
        .expect("the wait ends with task-control")
        .expect("ran")
        .expect("read");
    assert!(ended.waiting(), "the question stays open for the next call");
    tc.stop().await;
}
