//! Which question a chat message answers, decided without I/O from what the store loaded.
//!
//! In order: (a) a quote of a chat message that carried a question — any delivered copy of it,
//! or, when hark never learnt that copy's id, the question the quoted text names (`#a3f9`);
//! (b) a `#handle` the message starts with; (c) the sender's oldest open question in the chat.
//! A quote hark cannot match is never sent to the oldest question while several are open: the
//! sender is asked which one they mean. A `#handle` of the sender's question that is closed is
//! told so, never passed to another question. A reply the gateway read before a question was
//! asked never answers that question without naming it, however late it reaches task-control
//! (after an outage, say): it was written for an earlier one. Only the question's owner answers.

use hark_core::domain::{Handle, QuestionId};
use time::OffsetDateTime;

use crate::store::QuestionRow;

/// A chat message that may be an answer.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    pub platform: &'a str,
    pub stream: &'a str,
    pub user_id: &'a str,
    pub bot_id: &'a str,
    pub text: &'a str,
    /// The platform id of the message it quotes; empty when it quotes none.
    pub quoted: &'a str,
    /// The quoted message's text and author, when the platform told.
    pub quoted_text: &'a str,
    pub quoted_sender: &'a str,
    /// When the gateway read it, if it said.
    pub received_at: Option<OffsetDateTime>,
}

/// What the store found for a message.
#[derive(Debug, Clone, Copy, Default)]
pub struct Found<'a> {
    /// The sender's open questions in the chat, oldest first.
    pub open: &'a [QuestionRow],
    /// The question the quoted message carried, if hark knows that message.
    pub quoted: Option<&'a QuestionRow>,
    /// The latest question of the chat with the message's `#handle`, whatever its outcome.
    pub by_handle: Option<&'a QuestionRow>,
}

/// Where a message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// It answers this question with this text.
    Answer { question: QuestionId, text: String },
    /// It is meant for a question that is closed: say so.
    Closed(QuestionId),
    /// It quotes a copy of the question with this handle, which is not open any more.
    QuotedClosed(String),
    /// It was read before every open question was asked: it answered an earlier one.
    TooLate,
    /// It quotes something that matches no question while several are open: ask which.
    AskWhich,
    /// It is not an answer.
    Ignore,
}

impl Message<'_> {
    fn may_answer(&self, question: &QuestionRow) -> bool {
        question.owner.is_sender(self.platform, self.user_id)
            && question.stream.as_deref() == Some(self.stream)
    }
}

/// Decides where `message` goes.
pub fn route(message: &Message<'_>, found: &Found<'_>) -> Route {
    let answer = |question: &QuestionRow, text: &str| Route::Answer {
        question: question.id,
        text: text.trim().to_owned(),
    };
    // Only questions asked by the time the gateway read the message can be what it answers
    // without naming one.
    let candidates: Vec<&QuestionRow> = found
        .open
        .iter()
        .filter(|q| message.asked_in_time(q))
        .collect();
    // (a) A quote.
    if !message.quoted.is_empty() {
        if let Some(question) = found.quoted {
            return match () {
                _ if !message.may_answer(question) => Route::Ignore,
                _ if !question.outcome.is_open() => Route::Closed(question.id),
                _ => answer(question, message.text),
            };
        }
        // A copy of a question whose id hark never learnt still names its handle.
        let from_the_bot =
            message.quoted_sender.is_empty() || message.quoted_sender == message.bot_id;
        if from_the_bot && let Some(handle) = handle_in(message.quoted_text) {
            return match found.open.iter().find(|q| q.handle == handle) {
                Some(question) => answer(question, message.text),
                None => Route::QuotedClosed(handle),
            };
        }
        return match (found.open, candidates.as_slice()) {
            ([], _) => Route::Ignore,
            (_, []) => Route::TooLate,
            ([_], [only]) => answer(only, message.text),
            _ => Route::AskWhich,
        };
    }
    // (b) A `#handle`.
    if let Some((handle, rest)) = Handle::strip_prefix(message.text) {
        if let Some(question) = found.open.iter().find(|q| q.handle == handle.as_str()) {
            return answer(question, rest);
        }
        // It names a question of theirs that is closed: never another one instead.
        if let Some(question) = found.by_handle
            && message.may_answer(question)
        {
            return Route::Closed(question.id);
        }
    }
    // (c) The oldest open question asked by the time the message was read.
    match (found.open.first(), candidates.first()) {
        (None, _) => Route::Ignore,
        (Some(_), None) => Route::TooLate,
        (Some(_), Some(question)) => answer(question, message.text),
    }
}

impl Message<'_> {
    /// Whether `question` was asked by the time the gateway read this message. A question is
    /// asked before its chat message is sent, and a person needs far longer to reply than
    /// clocks kept by NTP disagree, so a reply to it is always read after it was asked.
    fn asked_in_time(&self, question: &QuestionRow) -> bool {
        self.received_at
            .is_none_or(|read| question.asked_at <= read)
    }
}

/// The handle a question message shows (`[task 1a2b3c4d · #a3f9] …`), if the text is one.
fn handle_in(text: &str) -> Option<String> {
    let (_, rest) = text.split_once(" · #")?;
    let (handle, _) = rest.split_once(']')?;
    handle.parse::<Handle>().ok().map(|h| h.as_str().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use hark_core::domain::{Owner, QuestionOutcome, TaskId};

    fn question(handle: &str, owner: &str, outcome: QuestionOutcome) -> QuestionRow {
        QuestionRow {
            id: QuestionId::new(),
            task_id: TaskId::new(),
            handle: handle.into(),
            text: format!("question {handle}?"),
            context: String::new(),
            tool_call_id: "call".into(),
            round: 1,
            owner: owner.parse::<Owner>().expect("owner"),
            platform: Some("qq".into()),
            bot_id: Some("42".into()),
            stream: Some("group:7".into()),
            outcome,
            asked_at: OffsetDateTime::now_utc(),
            deadline: None,
            reminded_at: None,
            closed_at: None,
            answerer: None,
            answer: None,
            inbound_message_id: None,
            chat_message_id: None,
            choices: None,
            waits_for: None,
            escalate_to: Vec::new(),
            escalate_at: None,
            ask_group: None,
            need: 1,
            askees: 1,
            undelivered: None,
        }
    }

    fn message<'a>(text: &'a str, quoted: &'a str, quoted_text: &'a str) -> Message<'a> {
        Message {
            platform: "qq",
            stream: "group:7",
            user_id: "100",
            bot_id: "42",
            text,
            quoted,
            quoted_text,
            quoted_sender: "",
            received_at: Some(OffsetDateTime::now_utc() + Duration::from_secs(5)),
        }
    }

    fn answered(route: &Route) -> Option<(QuestionId, &str)> {
        match route {
            Route::Answer { question, text } => Some((*question, text.as_str())),
            _ => None,
        }
    }

    #[test]
    fn a_quote_of_a_known_copy_answers_that_question_even_when_it_is_not_the_oldest() {
        let open = [
            question("aaaa", "qq:100", QuestionOutcome::Open),
            question("bbbb", "qq:100", QuestionOutcome::Open),
        ];
        let found = Found {
            open: &open,
            quoted: Some(&open[1]),
            by_handle: None,
        };
        let route = route(&message(" blue ", "m-9", ""), &found);
        assert_eq!(answered(&route), Some((open[1].id, "blue")));
    }

    #[test]
    fn an_unknown_quote_with_several_open_asks_which_and_never_falls_back_to_the_oldest() {
        let open = [
            question("aaaa", "qq:100", QuestionOutcome::Open),
            question("bbbb", "qq:100", QuestionOutcome::Open),
        ];
        let found = Found {
            open: &open,
            ..Default::default()
        };
        assert_eq!(route(&message("blue", "m-9", ""), &found), Route::AskWhich);
        // Unless the quoted text says which: the question's handle.
        let text = format!("[task {} · #bbbb] question bbbb?", open[1].task_id.short());
        let by_handle = route(&message("blue", "m-9", &text), &found);
        assert_eq!(answered(&by_handle), Some((open[1].id, "blue")));
        // A copy of a question of the same task that is closed names that one, never the task's
        // open question.
        let text = format!(
            "[task {} · #cccc] an earlier question",
            open[0].task_id.short()
        );
        assert_eq!(
            route(&message("red", "m-8", &text), &found),
            Route::QuotedClosed("cccc".into())
        );
        // Text that is not a question message names nothing.
        assert_eq!(
            route(&message("blue", "m-9", "#bbbb and more"), &found),
            Route::AskWhich
        );
        // Text quoted from someone else's message names nothing.
        let mut from_someone = message("blue", "m-9", &text);
        from_someone.quoted_sender = "555";
        assert_eq!(route(&from_someone, &found), Route::AskWhich);
    }

    #[test]
    fn an_unknown_quote_with_one_open_question_answers_it() {
        let open = [question("aaaa", "qq:100", QuestionOutcome::Open)];
        let found = Found {
            open: &open,
            ..Default::default()
        };
        assert_eq!(
            answered(&route(&message("yes", "m-1", ""), &found)),
            Some((open[0].id, "yes"))
        );
        assert_eq!(
            route(&message("yes", "m-1", ""), &Found::default()),
            Route::Ignore
        );
    }

    #[test]
    fn a_quote_of_someone_elses_question_or_a_closed_one_does_not_answer() {
        let theirs = question("cccc", "qq:200", QuestionOutcome::Open);
        let closed = question("dddd", "qq:100", QuestionOutcome::Expired);
        let open = [question("aaaa", "qq:100", QuestionOutcome::Open)];
        let quoting = |q| Found {
            open: &open,
            quoted: Some(q),
            by_handle: None,
        };
        assert_eq!(
            route(&message("mine!", "m-1", ""), &quoting(&theirs)),
            Route::Ignore
        );
        assert_eq!(
            route(&message("late", "m-2", ""), &quoting(&closed)),
            Route::Closed(closed.id)
        );
    }

    #[test]
    fn a_reply_read_before_a_question_was_asked_never_answers_it() {
        let open = [question("bbbb", "qq:100", QuestionOutcome::Open)];
        let found = Found {
            open: &open,
            ..Default::default()
        };
        // Read ten seconds before the question existed (it waited out an outage since).
        let mut late = message("meant for the first question", "", "");
        late.received_at = Some(open[0].asked_at - Duration::from_secs(10));
        assert_eq!(route(&late, &found), Route::TooLate);
        let mut late_quote = late;
        late_quote.quoted = "unknown";
        assert_eq!(route(&late_quote, &found), Route::TooLate);
        // Naming the question explicitly still answers it.
        let mut named = message("#bbbb yes", "", "");
        named.received_at = late.received_at;
        assert_eq!(answered(&route(&named, &found)), Some((open[0].id, "yes")));
        // Two replies read in a row, the second just before the next question was asked (the
        // first answered the one before): the second was not written for this one.
        let mut second = message("the first answer again", "", "");
        second.received_at = Some(open[0].asked_at - Duration::from_millis(20));
        assert_eq!(route(&second, &found), Route::TooLate);
        // Read just after it was asked, it answers it.
        let mut after = message("just in time", "", "");
        after.received_at = Some(open[0].asked_at + Duration::from_millis(1));
        assert_eq!(
            answered(&route(&after, &found)),
            Some((open[0].id, "just in time"))
        );
    }

    #[test]
    fn the_handle_is_found_in_a_quoted_question_of_either_language() {
        assert_eq!(
            handle_in("[任务 1a2b3c4d · #beef] 要押韵吗？").as_deref(),
            Some("beef")
        );
        assert_eq!(
            handle_in("[task 1a2b3c4d · #beef] Rhyme?").as_deref(),
            Some("beef")
        );
        assert_eq!(handle_in("#beef rhyme"), None);
    }

    #[test]
    fn a_handle_picks_its_question_and_otherwise_the_oldest_answers() {
        let open = [
            question("aaaa", "qq:100", QuestionOutcome::Open),
            question("bbbb", "qq:100", QuestionOutcome::Open),
        ];
        let found = Found {
            open: &open,
            ..Default::default()
        };
        assert_eq!(
            answered(&route(&message("#BBBB: two", "", ""), &found)),
            Some((open[1].id, "two"))
        );
        assert_eq!(
            answered(&route(&message("one", "", ""), &found)),
            Some((open[0].id, "one"))
        );
        // A handle of a closed question is told it is closed, even while others are open: the
        // sender named that one.
        let closed = question("eeee", "qq:100", QuestionOutcome::Answered);
        for open in [&[][..], &open[..]] {
            let found = Found {
                open,
                quoted: None,
                by_handle: Some(&closed),
            };
            assert_eq!(
                route(&message("#eeee again", "", ""), &found),
                Route::Closed(closed.id)
            );
        }
        // Text that merely starts like a handle, naming nothing known, is a plain answer.
        let found = Found {
            open: &open,
            ..Default::default()
        };
        assert_eq!(
            answered(&route(&message("#1 priority: fix it", "", ""), &found)),
            Some((open[0].id, "#1 priority: fix it"))
        );
        assert_eq!(
            route(&message("hello", "", ""), &Found::default()),
            Route::Ignore
        );
    }
}
