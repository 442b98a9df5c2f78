//! Questionnaires end to end: real task-control, a real worker, no model call. Each question is
//! asked in turn through the same questions, deadlines and answers as `ask_user`, and the task
//! completes with the answers as JSON.

mod common;

use std::time::Duration;

use common::Bed;
use hark_proto::v1 as pb;
use hark_worker::scripted::{Script, ScriptedLlm, Step};
use tonic::Code;

const WAIT: Duration = Duration::from_secs(20);

fn question(key: &str, text: &str, choices: &[&str]) -> pb::FormQuestion {
    pb::FormQuestion {
        key: key.into(),
        text: text.into(),
        choices: choices.iter().map(|c| (*c).to_owned()).collect(),
        ..Default::default()
    }
}

async fn bed() -> Bed {
    // The model would fail the task if it were ever called.
    let llm = ScriptedLlm::with_default(Script::new(vec![Step::say("the model was called")]))
        .await
        .expect("scripted LLM");
    let mut bed = Bed::start(llm, |_| {}).await;
    bed.add_worker("w1").await;
    bed
}

/// The QQ group 5, where the tests that ask several people ask them.
fn group_chat() -> pb::ChatRoute {
    pb::ChatRoute {
        platform: "qq".into(),
        bot_id: "1".into(),
        stream: "group:5".into(),
        ..Default::default()
    }
}

/// Answers `task`'s open question and waits for the next question or the end.
async fn answer_and_wait(bed: &Bed, task: &str, text: &str) -> pb::TaskEvent {
    answered_then(
        bed,
        pb::AnswerQuestionRequest {
            task_id: task.into(),
            answer: text.into(),
            answerer: "api:alice".into(),
            ..Default::default()
        },
    )
    .await
}

/// Sends `answer`, waiting for the next question or the end, and returns what came.
async fn answered_then(bed: &Bed, answer: pb::AnswerQuestionRequest) -> pb::TaskEvent {
    let replied = bed
        .client()
        .await
        .answer_question(pb::AnswerQuestionRequest {
            wait: pb::AnswerWait::NextQuestionOrEnd as i32,
            ..answer
        })
        .await
        .expect("answered")
        .into_inner();
    assert!(!replied.wait_timed_out);
    replied.event.expect("the next question or the end")
}

#[tokio::test]
async fn a_questionnaire_asks_in_turn_takes_choices_by_number_and_completes_with_json() {
    let bed = bed().await;
    let id = bed
        .create("api:alice", "", |r| {
            r.questionnaire = vec![
                question("name", "Your name?", &[]),
                question("size", "Which size?", &["S", "M", "L"]),
                question("", "Anything else?", &[]),
            ];
        })
        .await;
    let waiting = bed.wait_state(&id, pb::TaskState::WaitingInput, WAIT).await;
    let task = waiting.task.expect("task");
    assert_eq!(task.goal, "a questionnaire of 3 questions");
    assert_eq!(task.questionnaire.len(), 3);
    assert_eq!(
        task.questionnaire[2].key, "q3",
        "a key is given where none was"
    );
    let first = task.open_question.expect("first question");
    assert_eq!(first.text, "Your name?");
    assert!(first.choices.is_empty());

    let next = answer_and_wait(&bed, &id, "小明").await;
    let size = next.question.expect("the second question");
    assert_eq!(size.text, "Which size?");
    assert_eq!(size.choices, ["S", "M", "L"]);

    // An answer that is not a choice is refused, naming the choices, and the question stays
    // open; a number picks its choice.
    let err = bed
        .client()
        .await
        .answer_question(pb::AnswerQuestionRequest {
            task_id: id.clone(),
            answer: "XXL".into(),
            ..Default::default()
        })
        .await
        .expect_err("not a choice");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("1) S  2) M  3) L"),
        "{}",
        err.message()
    );
    let still = bed.task(&id).await.task.expect("task");
    assert_eq!(still.open_question.expect("still open").id, size.id);

    let next = answer_and_wait(&bed, &id, "2").await;
    assert_eq!(next.question.expect("the third").text, "Anything else?");
    let end = answer_and_wait(&bed, &id, "no").await;
    assert_eq!(end.state, pb::TaskState::Completed as i32);
    let output: serde_json::Value = serde_json::from_str(&end.result).expect("JSON output");
    assert_eq!(
        output,
        serde_json::json!({"name": "小明", "size": "M", "q3": "no"})
    );
    assert!(
        end.result.find("name") < end.result.find("size"),
        "keys keep the questions' order: {}",
        end.result
    );

    // The same ledger as ask_user: every question, with its answer as taken.
    let done = bed.task(&id).await;
    let answers: Vec<&str> = done.questions.iter().map(|q| q.answer.as_str()).collect();
    assert_eq!(answers, ["小明", "M", "no"]);
    // No worker took any step: the creation asked the first question, and after each answer
    // task-control took the step itself.
    let claimers: Vec<String> = bed
        .store
        .transitions_of(id.parse().expect("id"))
        .await
        .expect("transitions")
        .into_iter()
        .filter(|t| t.event == "claim")
        .map(|t| t.actor)
        .collect();
    assert_eq!(
        claimers,
        [
            "task-control",
            "task-control",
            "task-control",
            "task-control"
        ]
    );
    assert!(bed.llm.requests().is_empty(), "no model was called");
    // Each answer started from the question task-control had just asked, without reading it
    // again, but for the one after the refused answer, which was read.
    let metrics = bed.store.metrics();
    assert_eq!(
        (
            metrics.answer_starts(hark_control::metrics::REMEMBERED),
            metrics.answer_starts(hark_control::metrics::READ)
        ),
        (2, 1)
    );
    bed.stop().await;
}

#[tokio::test]
async fn an_expired_question_is_recorded_as_null_and_a_cancelled_questionnaire_stays_cancelled() {
    let bed = bed().await;
    let id = bed
        .create("api:alice", "quick poll", |r| {
            r.questionnaire = vec![
                question("first", "Quick: yes or no?", &["yes", "no"]),
                question("second", "And now?", &[]),
            ];
            r.ask_timeout_s = 1;
        })
        .await;
    // The first question expires; the second is asked, and expires too.
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let task = done.task.expect("task");
    let output: serde_json::Value = serde_json::from_str(&task.result).expect("JSON output");
    assert_eq!(output, serde_json::json!({"first": null, "second": null}));
    assert!(
        done.questions
            .iter()
            .all(|q| q.outcome == pb::QuestionOutcome::Expired as i32)
    );

    // With `fail`, an expiry fails the questionnaire.
    let failing = bed
        .create("api:alice", "strict poll", |r| {
            r.questionnaire = vec![question("", "Now or never?", &[])];
            r.ask_timeout_s = 1;
            r.on_timeout = pb::TimeoutPolicy::Fail as i32;
        })
        .await;
    bed.wait_state(&failing, pb::TaskState::Failed, WAIT).await;

    let cancelled = bed
        .create("api:alice", "cancelled poll", |r| {
            r.questionnaire = vec![question("", "Still there?", &[])];
        })
        .await;
    bed.wait_state(&cancelled, pb::TaskState::WaitingInput, WAIT)
        .await;
    let mut api = bed.client().await;
    api.cancel_task(pb::CancelTaskRequest {
        task_id: cancelled.clone(),
        reason: "not needed".into(),
    })
    .await
    .expect("cancelled");
    let err = api
        .answer_question(pb::AnswerQuestionRequest {
            task_id: cancelled.clone(),
            answer: "yes".into(),
            ..Default::default()
        })
        .await
        .expect_err("nothing to answer");
    assert_eq!(err.code(), Code::FailedPrecondition);
    let task = bed.task(&cancelled).await.task.expect("task");
    assert_eq!(task.state, pb::TaskState::Cancelled as i32);

    // A questionnaire that is not valid is refused, naming where.
    let err = api
        .create_task(pb::CreateTaskRequest {
            owner: "api:alice".into(),
            questionnaire: vec![question("a", "x", &[]), question("a", "y", &[])],
            ..Default::default()
        })
        .await
        .expect_err("two keys alike");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message()
            .starts_with("questionnaire: question 2: the key `a`"),
        "{}",
        err.message()
    );
    assert!(bed.llm.requests().is_empty(), "no model was called");
    bed.stop().await;
}

#[tokio::test]
async fn a_questionnaire_asks_confirms_several_choices_and_forms_and_outputs_their_values() {
    let bed = bed().await;
    let id = bed
        .create("api:alice", "sign-up", |r| {
            r.questionnaire = vec![
                pb::FormQuestion {
                    key: "agree".into(),
                    text: "Do you agree?".into(),
                    kind: "confirm".into(),
                    ..Default::default()
                },
                pb::FormQuestion {
                    key: "days".into(),
                    text: "Which days?".into(),
                    choices: vec!["Mon".into(), "Tue".into(), "Wed".into()],
                    multiple: true,
                    ..Default::default()
                },
                pb::FormQuestion {
                    key: "contact".into(),
                    text: "Contact?".into(),
                    kind: "form".into(),
                    fields: vec![
                        pb::FormField {
                            key: "email".into(),
                            r#type: "string".into(),
                            required: true,
                            ..Default::default()
                        },
                        pb::FormField {
                            key: "age".into(),
                            r#type: "integer".into(),
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                },
            ];
        })
        .await;
    let waiting = bed.wait_state(&id, pb::TaskState::WaitingInput, WAIT).await;
    let task = waiting.task.expect("task");
    assert_eq!(task.questionnaire[0].kind, "confirm");
    assert!(task.questionnaire[1].multiple);
    assert_eq!(task.questionnaire[2].fields.len(), 2);
    assert_eq!(task.open_question.expect("first").kind, "confirm");

    let next = answer_and_wait(&bed, &id, "好").await;
    let days = next.question.expect("the second question");
    assert!(days.multiple, "{days:?}");
    // An answer that does not fit is refused and the question stays open.
    let refused = bed
        .client()
        .await
        .answer_question(pb::AnswerQuestionRequest {
            task_id: id.clone(),
            answer: "Sunday".into(),
            ..Default::default()
        })
        .await
        .expect_err("not a choice");
    assert!(
        refused.message().contains("one or more of"),
        "{}",
        refused.message()
    );
    let next = answer_and_wait(&bed, &id, "1,3").await;
    assert_eq!(next.question.expect("the form").kind, "form");
    let end = answer_and_wait(&bed, &id, "email: a@b.c\nage: 30").await;
    let output: serde_json::Value = serde_json::from_str(&end.result).expect("JSON");
    assert_eq!(
        output,
        serde_json::json!({"agree": true, "days": ["Mon", "Wed"],
            "contact": {"email": "a@b.c", "age": 30}})
    );
    bed.stop().await;
}

/// The open question of `task` asked of `owner`, once there is one.
async fn open_question_of(bed: &Bed, task: &str, owner: &str) -> pb::Question {
    hark_testkit::eventually(
        &format!("a question of {task} is open to {owner}"),
        WAIT,
        || async {
            bed.task(task)
                .await
                .questions
                .into_iter()
                .find(|q| q.owner == owner && q.outcome == pb::QuestionOutcome::Open as i32)
        },
    )
    .await
}

/// Answers question `id` as `answerer` and waits for the next question or the end.
async fn answer_as(bed: &Bed, id: &str, answerer: &str, text: &str) -> pb::TaskEvent {
    answered_then(
        bed,
        pb::AnswerQuestionRequest {
            question_id: id.into(),
            answer: text.into(),
            answerer: answerer.into(),
            ..Default::default()
        },
    )
    .await
}

/// The task's questions are exactly `want`: each question's text, whom it was asked of, and
/// how it closed.
async fn assert_ledger(bed: &Bed, task: &str, want: &[(&str, &str, pb::QuestionOutcome)]) {
    let questions = bed.task(task).await.questions;
    let seen: Vec<(&str, &str, i32)> = questions
        .iter()
        .map(|q| (q.text.as_str(), q.owner.as_str(), q.outcome))
        .collect();
    for &(text, owner, outcome) in want {
        let want = (text, owner, outcome as i32);
        assert!(seen.contains(&want), "{want:?} not in {seen:?}");
    }
    assert_eq!(questions.len(), want.len(), "{seen:?}");
}

#[tokio::test]
async fn a_questionnaires_questions_escalate_and_the_first_answer_of_anyone_asked_counts() {
    let bed = bed().await;
    let escalating = |key: &str, text: &str, to: &[&str]| pb::FormQuestion {
        escalate_to: to.iter().map(|p| (*p).to_owned()).collect(),
        escalate_after_s: 1,
        ..question(key, text, &[])
    };
    let chat = group_chat();

    // Nobody can be asked in a chat the task does not have, nor on another platform.
    for (chat, named, why) in [
        (None, "200", "this task has no chat"),
        (Some(chat.clone()), "web:200", "web:200 is not on qq"),
    ] {
        let refused = bed
            .client()
            .await
            .create_task(pb::CreateTaskRequest {
                owner: "qq:100".into(),
                chat,
                questionnaire: vec![escalating("day", "Which day?", &[named])],
                ..Default::default()
            })
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(
            refused
                .message()
                .contains("questionnaire: question 1: escalate_to")
                && refused.message().contains(why),
            "{}",
            refused.message()
        );
    }

    let id = bed
        .create("qq:100", "", |r| {
            r.chat = Some(chat);
            r.questionnaire = vec![
                escalating("day", "Which day?", &["200"]),
                escalating("room", "Which room?", &["qq:300"]),
            ];
        })
        .await;
    let task = bed.task(&id).await.task.expect("task");
    assert_eq!(task.questionnaire[0].escalate_to, ["qq:200"]);

    // The first question, asked by a worker, goes to qq:200 too after a second; qq:200
    // answers, and qq:100's is closed.
    let first = open_question_of(&bed, &id, "qq:100").await;
    assert_eq!(first.text, "Which day?");
    let escalated = open_question_of(&bed, &id, "qq:200").await;
    assert_eq!(escalated.text, "Which day?");
    assert_eq!(escalated.chat.expect("chat").stream, "private:200");
    let next = answer_as(&bed, &escalated.id, "qq:200", "Friday").await;
    let room = next.question.expect("the second question");
    assert_eq!(room.text, "Which room?");
    assert_eq!(room.owner, "qq:100");

    // The second, asked by task-control in the answer's statement, escalates the same way;
    // this time the owner answers first.
    let escalated = open_question_of(&bed, &id, "qq:300").await;
    assert_eq!(escalated.text, "Which room?");
    let end = answer_as(&bed, &room.id, "qq:100", "Blue").await;
    assert_eq!(end.state, pb::TaskState::Completed as i32);
    let output: serde_json::Value = serde_json::from_str(&end.result).expect("JSON output");
    assert_eq!(output, serde_json::json!({"day": "Friday", "room": "Blue"}));

    // The ledger: who answered each, and whose question the answer closed.
    let (answered, superseded) = (
        pb::QuestionOutcome::Answered,
        pb::QuestionOutcome::Superseded,
    );
    assert_ledger(
        &bed,
        &id,
        &[
            ("Which day?", "qq:100", superseded),
            ("Which day?", "qq:200", answered),
            ("Which room?", "qq:100", answered),
            ("Which room?", "qq:300", superseded),
        ],
    )
    .await;
    let escalations = bed
        .store
        .transitions_of(id.parse().expect("id"))
        .await
        .expect("transitions")
        .into_iter()
        .filter(|t| t.event == "escalate")
        .count();
    assert_eq!(escalations, 2);
    assert!(bed.llm.requests().is_empty(), "no model was called");
    bed.stop().await;
}

#[tokio::test]
async fn a_questionnaires_question_put_to_several_people_waits_for_the_answers_it_needs() {
    let bed = bed().await;
    let put_to = |key: &str, text: &str, to: &[&str], need: &str| pb::FormQuestion {
        ask_to: to.iter().map(|p| (*p).to_owned()).collect(),
        need: need.into(),
        ..question(key, text, &["Mon", "Fri"])
    };
    let chat = group_chat();

    // ask_to is checked at creation: people on the chat's platform, a need it can read, and
    // not together with escalate_to.
    let both = pb::FormQuestion {
        escalate_to: vec!["400".into()],
        ..put_to("day", "Which day?", &["200"], "")
    };
    for (question, why) in [
        (
            put_to("day", "Which day?", &["web:2"], ""),
            "web:2 is not on qq",
        ),
        (put_to("day", "Which day?", &["200"], "most"), "`most`"),
        (both, "cannot be combined with escalate_to"),
    ] {
        let refused = bed
            .client()
            .await
            .create_task(pb::CreateTaskRequest {
                owner: "qq:100".into(),
                chat: Some(chat.clone()),
                questionnaire: vec![question],
                ..Default::default()
            })
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(
            refused.message().contains("question 1") && refused.message().contains(why),
            "{}",
            refused.message()
        );
    }

    let id = bed
        .create("qq:100", "", |r| {
            r.chat = Some(chat);
            r.questionnaire = vec![
                put_to("day", "Which day?", &["200", "qq:300"], "all"),
                put_to("room", "Which room?", &["400", "500"], "any"),
            ];
        })
        .await;

    // The first question, asked by a worker, goes to both at once, in the group, and never to
    // the owner; it waits for both.
    let first = open_question_of(&bed, &id, "qq:200").await;
    let second = open_question_of(&bed, &id, "qq:300").await;
    for asked in [&first, &second] {
        assert_eq!(asked.text, "Which day?");
        assert_eq!(asked.chat.as_ref().expect("chat").stream, "group:5");
    }
    let counted = bed
        .client()
        .await
        .answer_question(pb::AnswerQuestionRequest {
            question_id: first.id.clone(),
            answer: "2".into(),
            answerer: "qq:200".into(),
            ..Default::default()
        })
        .await
        .expect("kept")
        .into_inner();
    assert_eq!(
        counted.task.expect("task").state,
        pb::TaskState::WaitingInput as i32,
        "one answer of two needed"
    );
    let next = answer_as(&bed, &second.id, "qq:300", "Mon").await;
    let room = next.question.expect("the second question");
    assert_eq!(room.text, "Which room?");

    // The second, asked in the answer's statement, goes to both of its people; the first
    // answer is enough, and the other's question is closed.
    assert_eq!(room.owner, "qq:400");
    let other = open_question_of(&bed, &id, "qq:500").await;
    assert_eq!(other.text, "Which room?");
    let end = answer_as(&bed, &other.id, "qq:500", "Fri").await;
    assert_eq!(end.state, pb::TaskState::Completed as i32);
    let output: serde_json::Value = serde_json::from_str(&end.result).expect("JSON output");
    assert_eq!(
        output,
        serde_json::json!({
            "day": [{"by": "qq:200", "answer": "Fri"}, {"by": "qq:300", "answer": "Mon"}],
            "room": [{"by": "qq:500", "answer": "Fri"}],
        })
    );
    let (answered, superseded) = (
        pb::QuestionOutcome::Answered,
        pb::QuestionOutcome::Superseded,
    );
    assert_ledger(
        &bed,
        &id,
        &[
            ("Which day?", "qq:200", answered),
            ("Which day?", "qq:300", answered),
            ("Which room?", "qq:400", superseded),
            ("Which room?", "qq:500", answered),
        ],
    )
    .await;

    // Answered while its task is paused, the step is the worker's once resumed: it records the
    // answers with their authors all the same.
    let id = bed
        .create("qq:100", "", |r| {
            r.chat = Some(group_chat());
            r.questionnaire = vec![put_to("day", "Which day?", &["200", "300"], "any")];
        })
        .await;
    let asked = open_question_of(&bed, &id, "qq:300").await;
    bed.client()
        .await
        .pause_task(pb::PauseTaskRequest {
            task_id: id.clone(),
        })
        .await
        .expect("paused");
    bed.client()
        .await
        .answer_question(pb::AnswerQuestionRequest {
            question_id: asked.id.clone(),
            answer: "Mon".into(),
            answerer: "qq:300".into(),
            ..Default::default()
        })
        .await
        .expect("answered while paused");
    bed.client()
        .await
        .resume_task(pb::ResumeTaskRequest {
            task_id: id.clone(),
        })
        .await
        .expect("resumed");
    let done = bed.wait_state(&id, pb::TaskState::Completed, WAIT).await;
    let output: serde_json::Value =
        serde_json::from_str(&done.task.expect("task").result).expect("JSON output");
    assert_eq!(
        output,
        serde_json::json!({"day": [{"by": "qq:300", "answer": "Mon"}]})
    );
    assert!(bed.llm.requests().is_empty(), "no model was called");
    bed.stop().await;
}
