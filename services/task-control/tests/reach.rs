//! Where hark may reach a person without being told: where it saw them speak. Against the real
//! Postgres and NATS, with chat messages as the gateway publishes them.

mod common;

use std::time::Duration;

use common::control::{BOT, PLATFORM, TestControl};
use hark_control::cases::{self, reach::route_for};
use hark_core::domain::Owner;

#[tokio::test]
async fn a_person_is_reached_only_in_chats_they_were_seen_in() {
    let tc = TestControl::start().await;
    let alice: Owner = format!("{PLATFORM}:1001").parse().expect("owner");
    let bob: Owner = format!("{PLATFORM}:2002").parse().expect("owner");

    // Never seen: nowhere to ask them, and nothing is made up.
    let err = route_for(&tc.shared, &alice, None)
        .await
        .expect_err("unseen");
    assert!(matches!(err, cases::Error::NeverSeen { .. }), "{err}");

    tc.say("group:555", "1001", "hello all").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while tc.store.chats_of(&alice).await.expect("read").is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the message was never seen"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Seen in a group only: their private chat goes through the bot that saw them.
    let private = route_for(&tc.shared, &alice, None).await.expect("private");
    assert_eq!(
        (
            private.platform.as_str(),
            private.bot_id.as_str(),
            private.stream.as_str()
        ),
        (PLATFORM, BOT, "private:1001")
    );
    let group = route_for(&tc.shared, &alice, Some("group:555"))
        .await
        .expect("a group she speaks in");
    assert_eq!(group.stream, "group:555");

    // Not where she was never seen, nor someone else's private chat.
    for chat in ["group:999", "private:2002", "not a chat"] {
        let err = route_for(&tc.shared, &alice, Some(chat))
            .await
            .expect_err(chat);
        assert!(
            matches!(err, cases::Error::NotTheirChat { .. }),
            "{chat}: {err}"
        );
    }
    // Bob, never seen, is not reached through Alice's sightings.
    let err = route_for(&tc.shared, &bob, Some("group:555"))
        .await
        .expect_err("bob");
    assert!(matches!(err, cases::Error::NotTheirChat { .. }), "{err}");

    // Many messages in a minute: one row per chat, written once.
    for n in 0..5 {
        tc.say("group:555", "1001", &format!("more {n}")).await;
    }
    tc.say("private:1001", "1001", "hi bot").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let chats = tc.store.chats_of(&alice).await.expect("read");
        if chats.len() == 2 {
            assert_eq!(
                chats[0].stream, "private:1001",
                "the latest first: {chats:?}"
            );
            break;
        }
        assert!(chats.len() < 2, "{chats:?}");
        assert!(std::time::Instant::now() < deadline, "{chats:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tc.stop().await;
}
