//! Keys that belong to a person: made by an operator over gRPC or by the person in a private
//! chat, and acting only as that person on the API. Against the real Postgres and NATS.

mod common;

use std::time::Duration;

use common::control::TestControl;
use hark_proto::v1::{self as pb, task_service_client::TaskServiceClient};
use tonic::{Code, Request, transport::Channel};

const OPERATOR: &str = "op-token";

/// `message` sent with `Authorization: Bearer <token>`.
fn with<T>(token: &str, message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    request
}

fn create(owner: &str, goal: &str) -> pb::CreateTaskRequest {
    pb::CreateTaskRequest {
        owner: owner.into(),
        goal: goal.into(),
        ..Default::default()
    }
}

async fn make_key(
    api: &mut TaskServiceClient<Channel>,
    token: &str,
    owner: &str,
    role: &str,
) -> Result<(pb::PersonKey, String), tonic::Status> {
    let made = api
        .create_key(with(
            token,
            pb::CreateKeyRequest {
                owner: owner.into(),
                name: "laptop".into(),
                role: role.into(),
                expires_in: None,
            },
        ))
        .await?
        .into_inner();
    Ok((made.key.expect("key"), made.secret))
}

async fn task_of(api: &mut TaskServiceClient<Channel>, token: &str, owner: &str) -> pb::Task {
    api.create_task(with(token, create(owner, &format!("a task of {owner}"))))
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task")
}

async fn state_of(api: &mut TaskServiceClient<Channel>, id: &str) -> i32 {
    api.get_task(with(OPERATOR, pb::GetTaskRequest { task_id: id.into() }))
        .await
        .expect("operator reads")
        .into_inner()
        .task
        .expect("task")
        .state
}

#[tokio::test]
async fn a_persons_key_sees_and_moves_only_that_persons_tasks() {
    let tc = TestControl::start_with(|c| c.control.api_tokens = vec![OPERATOR.into()]).await;
    let mut api = tc.client().await;
    let (key, alice) = make_key(&mut api, OPERATOR, "qq:1001", "")
        .await
        .expect("made");
    assert!(alice.starts_with("hk_") && alice.len() > 60, "{alice}");
    assert_eq!((key.owner.as_str(), key.role.as_str()), ("qq:1001", "user"));
    assert_eq!(key.created_by, "api");
    let hers = task_of(&mut api, OPERATOR, "qq:1001").await;
    let bobs = task_of(&mut api, OPERATOR, "qq:2002").await;

    // Seen: her own tasks only, however she asks.
    let listed = api
        .list_tasks(with(&alice, pb::ListTasksRequest::default()))
        .await
        .expect("listed")
        .into_inner()
        .tasks;
    let ids: Vec<&str> = listed.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, [hers.id.as_str()]);
    let named_other = api
        .list_tasks(with(
            &alice,
            pb::ListTasksRequest {
                owner: "qq:2002".into(),
                ..Default::default()
            },
        ))
        .await
        .expect_err("another owner");
    assert_eq!(named_other.code(), Code::PermissionDenied);
    assert!(named_other.message().contains("qq:2002"), "{named_other}");
    // Named by its whole id, another's task is refused as not hers; by a prefix, it is not
    // found among hers, so that probing prefixes tells nothing.
    for (id, code) in [
        (bobs.id.clone(), Code::PermissionDenied),
        (bobs.id[..8].to_owned(), Code::NotFound),
    ] {
        let err = api
            .get_task(with(&alice, pb::GetTaskRequest { task_id: id }))
            .await
            .expect_err("not hers");
        assert_eq!(err.code(), code, "{err}");
    }

    let err = api
        .watch_task(with(
            &alice,
            pb::WatchTaskRequest {
                task_id: bobs.id.clone(),
            },
        ))
        .await
        .expect_err("not hers");
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = api
        .watch_tasks(with(
            &alice,
            pb::WatchTasksRequest {
                owner: "qq:2002".into(),
                ..Default::default()
            },
        ))
        .await
        .expect_err("another owner");
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = api
        .list_questions(with(
            &alice,
            pb::ListQuestionsRequest {
                owner: "qq:2002".into(),
                ..Default::default()
            },
        ))
        .await
        .expect_err("another owner");
    assert_eq!(err.code(), Code::PermissionDenied);

    // Moved: nothing of another's, and a refusal leaves it as it was.
    let err = api
        .cancel_task(with(
            &alice,
            pb::CancelTaskRequest {
                task_id: bobs.id.clone(),
                reason: String::new(),
            },
        ))
        .await
        .expect_err("not hers");
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(
        state_of(&mut api, &bobs.id).await,
        pb::TaskState::Pending as i32
    );
    let err = api
        .answer_question(with(
            &alice,
            pb::AnswerQuestionRequest {
                task_id: bobs.id.clone(),
                answer: "yes".into(),
                ..Default::default()
            },
        ))
        .await
        .expect_err("not hers");
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = api
        .answer_question(with(
            &alice,
            pb::AnswerQuestionRequest {
                task_id: hers.id.clone(),
                answer: "yes".into(),
                answerer: "qq:2002".into(),
                ..Default::default()
            },
        ))
        .await
        .expect_err("as another");
    assert_eq!(err.code(), Code::PermissionDenied);
    let cancelled = api
        .cancel_task(with(
            &alice,
            pb::CancelTaskRequest {
                task_id: hers.id[..8].to_owned(),
                reason: String::new(),
            },
        ))
        .await
        .expect("hers")
        .into_inner()
        .task
        .expect("task");
    assert_eq!(cancelled.state, pb::TaskState::Cancelled as i32);

    // Created: for herself only; naming nobody means her.
    let err = api
        .create_task(with(&alice, create("qq:2002", "for bob")))
        .await
        .expect_err("for another");
    assert_eq!(err.code(), Code::PermissionDenied);
    let listed_before = api
        .list_tasks(with(OPERATOR, pb::ListTasksRequest::default()))
        .await
        .expect("listed")
        .into_inner()
        .tasks
        .len();
    assert_eq!(listed_before, 2, "the refused create left no task");
    let own = task_of(&mut api, &alice, "").await;
    assert_eq!(own.owner, "qq:1001");

    // Keys: her own, never above her role, never another's.
    let err = make_key(&mut api, &alice, "qq:2002", "")
        .await
        .expect_err("another's");
    assert_eq!(err.code(), Code::PermissionDenied);
    let err = make_key(&mut api, &alice, "qq:1001", "admin")
        .await
        .expect_err("above");
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("admin"), "{err}");
    let (_, spare) = make_key(&mut api, &alice, "", "").await.expect("her own");
    make_key(&mut api, OPERATOR, "qq:2002", "")
        .await
        .expect("bob's");
    let keys = |token: &str| {
        let mut api = api.clone();
        let token = token.to_owned();
        async move {
            api.list_keys(with(&token, pb::ListKeysRequest {}))
                .await
                .expect("listed")
                .into_inner()
                .keys
        }
    };
    assert_eq!(keys(&alice).await.len(), 2);
    assert_eq!(keys(OPERATOR).await.len(), 3);
    let bobs_key = keys(OPERATOR)
        .await
        .into_iter()
        .find(|k| k.owner == "qq:2002")
        .expect("bob's key");
    let err = api
        .revoke_key(with(
            &alice,
            pb::RevokeKeyRequest {
                key_id: bobs_key.id.clone(),
            },
        ))
        .await
        .expect_err("not hers");
    assert_eq!(err.code(), Code::NotFound);

    // Revoked: it stops working at once; her other key goes on.
    api.revoke_key(with(
        &alice,
        pb::RevokeKeyRequest {
            key_id: key.id[..8].to_owned(),
        },
    ))
    .await
    .expect("revoked");
    let err = api
        .list_tasks(with(&alice, pb::ListTasksRequest::default()))
        .await
        .expect_err("revoked");
    assert_eq!(err.code(), Code::Unauthenticated);
    assert!(err.message().contains("revoked"), "{err}");
    api.list_tasks(with(&spare, pb::ListTasksRequest::default()))
        .await
        .expect("the other key works");
    // A made-up key is no key.
    let err = api
        .list_tasks(with(
            &format!("hk_{}", "0".repeat(64)),
            pb::ListTasksRequest::default(),
        ))
        .await
        .expect_err("unknown");
    assert_eq!(err.code(), Code::Unauthenticated);
    // Guessing keys at speed: the address is refused for a while, even with a good key.
    for _ in 1..hark_core::secret::Failures::ALLOWED {
        let _ = api
            .list_tasks(with(
                &format!("hk_{}", "2".repeat(64)),
                pb::ListTasksRequest::default(),
            ))
            .await;
    }
    let err = api
        .list_tasks(with(&spare, pb::ListTasksRequest::default()))
        .await
        .expect_err("throttled");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    tc.stop().await;
}

#[tokio::test]
async fn where_operators_need_no_token_a_key_still_acts_only_as_its_owner() {
    let tc = TestControl::start_with(|c| c.permission.default_role = hark_core::domain::Role::User)
        .await;
    let mut api = tc.client().await;
    let (_, guest) = make_key(&mut api, "", "qq:1001", "guest")
        .await
        .expect("made");
    let bobs = api
        .create_task(create("qq:2002", "bob's"))
        .await
        .expect("created")
        .into_inner()
        .task
        .expect("task");
    let listed = api
        .list_tasks(with(&guest, pb::ListTasksRequest::default()))
        .await
        .expect("listed")
        .into_inner()
        .tasks;
    assert!(listed.is_empty(), "{listed:?}");
    let err = api
        .get_task(with(&guest, pb::GetTaskRequest { task_id: bobs.id }))
        .await
        .expect_err("not hers");
    assert_eq!(err.code(), Code::PermissionDenied);
    // Its role is the key's: a guest's key creates no task.
    let err = api
        .create_task(with(&guest, create("", "mine")))
        .await
        .expect_err("a guest's key");
    assert_eq!(err.code(), Code::PermissionDenied);
    tc.stop().await;
}

#[tokio::test]
async fn a_key_is_made_in_a_private_chat_only_and_once_per_message() {
    let tc = TestControl::start().await;
    let mut api = tc.client().await;

    tc.say("group:555", "1001", "/key new laptop").await;
    let refused = tc.out_containing("private chat").await;
    assert_eq!(refused.route.as_ref().expect("route").stream, "group:555");
    assert!(!refused.text.contains("hk_"), "{}", refused.text);

    let id = tc.message_id();
    tc.say_as("private:1001", "1001", "/密钥 新建 笔记本", &id)
        .await;
    let made = tc.out_containing("hk_").await;
    assert_eq!(made.route.as_ref().expect("route").stream, "private:1001");
    let secret = made
        .text
        .split_whitespace()
        .find_map(|w| {
            w.strip_prefix("hk_")
                .map(|rest| format!("hk_{}", rest.trim()))
        })
        .expect("the key in the reply");
    // The same message again makes nothing and says nothing.
    tc.say_again_mentioning("private:1001", "1001", "/密钥 新建 笔记本", &[], &id)
        .await;
    tc.say("private:1001", "1001", "/key list").await;
    let list = tc.out_containing("笔记本").await;
    assert_eq!(list.text.lines().count(), 1, "{}", list.text);

    let keys = api
        .list_keys(with(&secret, pb::ListKeysRequest {}))
        .await
        .expect("the key works")
        .into_inner()
        .keys;
    assert_eq!(keys.len(), 1);
    assert_eq!(
        (keys[0].owner.as_str(), keys[0].name.as_str()),
        ("qq:1001", "笔记本")
    );
    assert_eq!(keys[0].created_by, "qq:1001");
    assert!(keys[0].expires_at.is_some(), "a chat key expires");

    let short: String = keys[0].id.replace('-', "").chars().take(8).collect();
    tc.say("private:1001", "1001", &format!("/key revoke {short}"))
        .await;
    tc.out_containing(&short).await;
    let err = api
        .list_keys(with(&secret, pb::ListKeysRequest {}))
        .await
        .expect_err("revoked");
    assert_eq!(err.code(), Code::Unauthenticated);
    // Another person cannot revoke it, nor learn of it.
    tc.say("private:2002", "2002", &format!("/key revoke {short}"))
        .await;
    let other = tc.out_containing(&short).await;
    assert_eq!(other.route.as_ref().expect("route").stream, "private:2002");
    tc.stop().await;
}

/// The key expires on its own, however it was made.
#[tokio::test]
async fn an_expired_key_gets_nobody_in() {
    let tc = TestControl::start().await;
    let mut api = tc.client().await;
    let made = api
        .create_key(pb::CreateKeyRequest {
            owner: "qq:1001".into(),
            name: "brief".into(),
            role: String::new(),
            expires_in: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
        })
        .await
        .expect("made")
        .into_inner();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match api
            .list_tasks(with(&made.secret, pb::ListTasksRequest::default()))
            .await
        {
            Err(e) if e.code() == Code::Unauthenticated => break,
            Ok(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => panic!("the key still works after its second: {other:?}"),
        }
    }
    tc.stop().await;
}
