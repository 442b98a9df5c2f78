//! Passing an open question on to another person: the person asked (or the task's owner)
//! names someone else, and the question is asked of them from then on, in their own chat when it
//! was asked in a private one. The first valid answer still wins; the one passed over can no
//! longer answer.

use hark_core::domain::{Owner, Role, StreamId, decide::Command};

use super::{Caller, Error};
use crate::{
    shared::Shared,
    store::{Delegated, Delegation, QuestionRow, TaskRow},
};

/// Passes `question` on to `to`, as `caller`; `inbound_key` makes a redelivered request a no-op.
pub async fn delegate(
    shared: &Shared,
    caller: &Caller,
    question: &QuestionRow,
    to: &Owner,
    inbound_key: Option<&str>,
) -> Result<Delegated, Error> {
    // Applied before: the question has moved since, so it is not checked again.
    if let Some(key) = inbound_key
        && shared.store.was_applied(key).await?
    {
        return Ok(Delegated::Duplicate);
    }
    if let Caller::Person { owner, role } = caller
        && *owner != question.owner
        && *role < Role::Admin
    {
        let task = shared.store.get_task(question.task_id).await?;
        if task.owner != *owner {
            return Err(Error::NotYours {
                handle: question.handle.clone(),
            });
        }
    }
    if *to == question.owner {
        return Err(Error::AlreadyAsked {
            handle: question.handle.clone(),
            askee: to.clone(),
        });
    }
    // A chat's question stays on its platform, where its bot can ask.
    if let Some(platform) = &question.platform
        && to.platform() != platform
    {
        return Err(Error::OtherPlatform {
            to: to.clone(),
            platform: platform.clone(),
        });
    }
    let private = question
        .stream
        .as_deref()
        .and_then(|s| s.parse::<StreamId>().ok())
        .is_some_and(|s| s.kind() == "private");
    // An owner's user id is always a valid stream target: the two share one rule.
    let stream = private
        .then(|| StreamId::private(to.user_id()).ok())
        .flatten();
    let delegation = Delegation {
        question: question.id,
        from: &question.owner,
        to,
        stream: stream.as_ref().map(StreamId::as_str),
        actor: caller.actor(),
        inbound_key,
    };
    let effects = shared.store.effects();
    let by = caller.actor();
    let policy = shared.store.policy();
    let decide = |task: &TaskRow, question: &QuestionRow| {
        let now = time::OffsetDateTime::now_utc();
        super::decide_asked(task, question, &Command::Delegate, now, policy)
    };
    let ask = |question: &QuestionRow, task: &TaskRow| effects.passed_on(question, task, by);
    let delegated = shared.store.delegate(&delegation, decide, ask).await?;
    Ok(delegated)
}
