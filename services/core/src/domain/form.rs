//! Questions with choices, and questionnaires: tasks without an agent that ask their owner a
//! list of questions in turn and complete with the answers.

use serde::{Deserialize, Serialize};

use super::{
    shape::{Shape, ShapeError},
    text,
};

/// The most questions one questionnaire asks.
pub const MAX_QUESTIONS: usize = 50;
/// The most bytes of one question's text.
pub const MAX_QUESTION_BYTES: usize = 8 * 1024;
/// The most choices one question offers.
pub const MAX_CHOICES: usize = 20;
/// The most bytes of one choice, and of one key.
pub const MAX_CHOICE_BYTES: usize = 256;

/// One question of a questionnaire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FormQuestion {
    /// The answer's key in the output.
    pub key: String,
    pub text: String,
    /// When not empty, the answer is one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
    /// Any shape other than free text or one of `choices` (which older questionnaires, and
    /// replicas that know only those, keep as above).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<Shape>,
    /// Whom it is asked of next, one after another, while it stays unanswered: people as
    /// `platform:user_id`, or a bare user id on the platform of the task's chat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalate_to: Vec<String>,
    /// Unanswered this many seconds, it goes to the next of `escalate_to`; 0: at its first
    /// reminder.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub escalate_after_s: u32,
    /// The people it is put to at once instead of the task's owner, named as in
    /// `escalate_to`; in a group chat each is asked there, otherwise in their own chat.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ask_to: Vec<String>,
    /// With `ask_to`: how many of them must answer, as [`Need`](super::Need) reads it ("any",
    /// "all" or a number); empty: any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub need: String,
    /// What the person should know to answer it, shown under the question.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub context: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The most people one question is escalated to, or put to at once.
pub const MAX_ESCALATE_TO: usize = 20;

impl FormQuestion {
    /// What it accepts.
    pub fn shape(&self) -> Shape {
        self.shape
            .clone()
            .unwrap_or_else(|| Shape::choosing(self.choices.clone()))
    }
}

/// Why a questionnaire or a list of choices was refused; it names the place that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormError {
    #[error("must have at least one question")]
    Empty,
    #[error("has {0} questions, more than the {MAX_QUESTIONS} allowed")]
    TooMany(usize),
    #[error("question {index}: the text {why}")]
    Text { index: usize, why: text::TextError },
    #[error("question {index}: the key {why}")]
    Key { index: usize, why: String },
    #[error("question {index}: the key `{key}` is used by an earlier question")]
    DuplicateKey { index: usize, key: String },
    #[error("question {index}: {why}")]
    Choices { index: usize, why: ChoiceError },
    #[error("question {index}: {why}")]
    Shape { index: usize, why: ShapeError },
    #[error("question {index}: escalate_to {why}")]
    EscalateTo { index: usize, why: String },
    #[error("question {index}: ask_to {why}")]
    AskTo { index: usize, why: String },
    #[error("question {index}: {why}")]
    Need { index: usize, why: String },
}

/// Why a list of choices was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChoiceError {
    #[error("{0} choices, more than the {MAX_CHOICES} allowed")]
    TooMany(usize),
    #[error("choice {index} {why}")]
    Text { index: usize, why: text::TextError },
    #[error("choice {index} repeats choice {first}")]
    Repeated { index: usize, first: usize },
}

/// Choices as offered: each trimmed, none empty, none repeated (ignoring case), within bounds.
pub fn choices(offered: &[String]) -> Result<Vec<String>, ChoiceError> {
    if offered.len() > MAX_CHOICES {
        return Err(ChoiceError::TooMany(offered.len()));
    }
    let mut kept: Vec<String> = Vec::with_capacity(offered.len());
    for (i, choice) in offered.iter().enumerate() {
        let choice = text::text(choice, MAX_CHOICE_BYTES)
            .map_err(|why| ChoiceError::Text { index: i + 1, why })?;
        if let Some(first) = kept
            .iter()
            .position(|c| c.to_lowercase() == choice.to_lowercase())
        {
            return Err(ChoiceError::Repeated {
                index: i + 1,
                first: first + 1,
            });
        }
        kept.push(choice.to_owned());
    }
    Ok(kept)
}

/// A questionnaire as given: at least one question and at most [`MAX_QUESTIONS`], texts within
/// bounds, keys unique (`q1`, `q2`, … where none is given), choices as [`choices`] wants them.
pub fn questionnaire(given: Vec<FormQuestion>) -> Result<Vec<FormQuestion>, FormError> {
    if given.is_empty() {
        return Err(FormError::Empty);
    }
    if given.len() > MAX_QUESTIONS {
        return Err(FormError::TooMany(given.len()));
    }
    let mut kept: Vec<FormQuestion> = Vec::with_capacity(given.len());
    for (i, question) in given.into_iter().enumerate() {
        let index = i + 1;
        let text = text::text(&question.text, MAX_QUESTION_BYTES)
            .map_err(|why| FormError::Text { index, why })?
            .to_owned();
        let key = match question.key.trim() {
            "" => format!("q{index}"),
            key => text::key(key)
                .map_err(|why| FormError::Key {
                    index,
                    why: why.to_string(),
                })?
                .to_owned(),
        };
        if key.len() > MAX_CHOICE_BYTES {
            return Err(FormError::Key {
                index,
                why: format!("is longer than {MAX_CHOICE_BYTES} bytes"),
            });
        }
        if kept.iter().any(|q| q.key == key) {
            return Err(FormError::DuplicateKey { index, key });
        }
        let choices =
            choices(&question.choices).map_err(|why| FormError::Choices { index, why })?;
        let shape = match question.shape {
            None => None,
            Some(shape) => {
                let (kind, given, multiple, fields) = shape.to_proto();
                let given = if given.is_empty() {
                    choices.clone()
                } else {
                    given
                };
                match Shape::from_proto(&kind, &given, multiple, &fields)
                    .map_err(|why| FormError::Shape { index, why })?
                {
                    Shape::Text => None,
                    Shape::Choice {
                        multiple: false, ..
                    } => None,
                    shape => Some(shape),
                }
            }
        };
        let choices = match &shape {
            Some(shape) => shape.choices().to_vec(),
            None => choices,
        };
        let escalate_to =
            people(&question.escalate_to).map_err(|why| FormError::EscalateTo { index, why })?;
        let ask_to = people(&question.ask_to).map_err(|why| FormError::AskTo { index, why })?;
        if !ask_to.is_empty() && !escalate_to.is_empty() {
            return Err(FormError::AskTo {
                index,
                why: "cannot be combined with escalate_to: ask everyone at once with ask_to, \
                      or one after another with escalate_to"
                    .into(),
            });
        }
        let need = question.need.trim().to_ascii_lowercase();
        if !need.is_empty() {
            if ask_to.is_empty() {
                return Err(FormError::Need {
                    index,
                    why: "need counts the answers of ask_to; name the people with ask_to".into(),
                });
            }
            need.parse::<super::Need>()
                .map_err(|why| FormError::Need { index, why })?;
        }
        kept.push(FormQuestion {
            key,
            text,
            choices,
            shape,
            escalate_to,
            escalate_after_s: question.escalate_after_s,
            ask_to,
            need,
            context: question.context,
        });
    }
    Ok(kept)
}

/// A list of people as a question names them, each a short text, at most
/// [`MAX_ESCALATE_TO`]; or why it is refused.
fn people(named: &[String]) -> Result<Vec<String>, String> {
    if named.len() > MAX_ESCALATE_TO {
        return Err(format!(
            "names {} people, more than the {MAX_ESCALATE_TO} allowed",
            named.len()
        ));
    }
    named
        .iter()
        .map(|person| {
            text::text(person, MAX_CHOICE_BYTES)
                .map(str::to_owned)
                .map_err(|why| format!("names someone whose name {why}"))
        })
        .collect()
}

/// The choice an answer picks: its number (from 1), or its text ignoring case and the space
/// around it. `None` when it picks none.
pub fn pick<'a>(choices: &'a [String], answer: &str) -> Option<&'a str> {
    let whole = answer.trim();
    let answer = whole
        .strip_suffix(['.', '。', ')', '）'])
        .unwrap_or(whole)
        .trim();
    if let Ok(n) = answer.parse::<usize>() {
        return n
            .checked_sub(1)
            .and_then(|i| choices.get(i))
            .map(String::as_str);
    }
    // A choice that itself ends in a full stop is named with it.
    named(choices, whole).or_else(|| named(choices, answer))
}

/// The choice whose text is `text`, ignoring case: how a value given over the API names one,
/// even a choice that reads as a number.
pub fn named<'a>(choices: &'a [String], text: &str) -> Option<&'a str> {
    let lower = text.trim().to_lowercase();
    choices
        .iter()
        .find(|c| c.to_lowercase() == lower)
        .map(String::as_str)
}

/// The choices as a person reads them: `1) red  2) blue`.
pub fn numbered(choices: &[String]) -> String {
    choices
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{}) {c}", i + 1))
        .collect::<Vec<_>>()
        .join("  ")
}

/// A questionnaire's progress, as each round of its checkpoint records it: the answers so far,
/// by key. A step reads the last round, records the answer it resumed with, then asks the next
/// question unanswered or completes with [`output`].
pub mod progress {
    use serde_json::{Map, Value, json};

    use super::Shape;

    /// The tool call id a question of `key` is asked under; its answer comes back under it.
    pub fn call_id(key: &str) -> String {
        format!("form:{key}")
    }

    /// The answers so far, from the messages of a questionnaire's last round.
    pub fn answers_of(messages: &[u8]) -> Result<Map<String, Value>, String> {
        let records: Value = serde_json::from_slice(messages).map_err(|e| e.to_string())?;
        answers_in(&records)
    }

    /// [`answers_of`] for messages already parsed.
    pub fn answers_in(messages: &Value) -> Result<Map<String, Value>, String> {
        match messages
            .as_array()
            .and_then(|r| r.last())
            .map(|r| r.get("answers"))
        {
            Some(Some(Value::Object(answers))) => Ok(answers.clone()),
            _ => Err("it holds no answers".into()),
        }
    }

    /// Records the answer a resume brings for the call `call_id` of a question of `shape`: its
    /// text (a choice's text for one choice), its value for the other shapes (a list, true or
    /// false, an object), or null when the deadline passed.
    pub fn record(
        answers: &mut Map<String, Value>,
        call_id: &str,
        expired: bool,
        text: &str,
        shape: &Shape,
    ) {
        let value = if expired {
            Value::Null
        } else {
            value(text, shape)
        };
        record_value(answers, call_id, value);
    }

    /// Records `value` as the answer to the question asked under `call_id`.
    pub fn record_value(answers: &mut Map<String, Value>, call_id: &str, value: Value) {
        if let Some(key) = call_id.strip_prefix("form:") {
            answers.insert(key.to_owned(), value);
        }
    }

    /// An answer's text as the output keeps it: text and a single choice as text, anything
    /// else as the JSON it is.
    pub fn value(text: &str, shape: &Shape) -> Value {
        match shape {
            Shape::Text
            | Shape::Choice {
                multiple: false, ..
            } => Value::String(text.to_owned()),
            _ => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned())),
        }
    }

    /// The answers of a question put to several people, as the output keeps them: each with
    /// its author, in the order they came.
    pub fn together<'a>(
        answers: impl IntoIterator<Item = (&'a str, &'a str)>,
        shape: &Shape,
    ) -> Value {
        answers
            .into_iter()
            .map(|(by, text)| json!({"by": by, "answer": value(text, shape)}))
            .collect()
    }

    /// The key of the first question not answered yet, among `keys` in order.
    pub fn next<'a>(
        keys: impl IntoIterator<Item = &'a str>,
        answers: &Map<String, Value>,
    ) -> Option<&'a str> {
        keys.into_iter().find(|k| !answers.contains_key(*k))
    }

    /// The messages of one step's round: the answers so far and the question it asks, if any.
    pub fn step(answers: &Map<String, Value>, asking: Option<&str>) -> Vec<Value> {
        vec![json!({"role": "questionnaire", "answers": answers, "asking": asking})]
    }

    /// The output: a JSON object of each key and its answer, in the questions' order.
    pub fn output<'a>(
        keys: impl IntoIterator<Item = &'a str>,
        answers: &Map<String, Value>,
    ) -> String {
        let fields: Vec<String> = keys
            .into_iter()
            .map(|k| {
                let value = answers.get(k).cloned().unwrap_or(Value::Null);
                format!("{}:{value}", Value::String(k.to_owned()))
            })
            .collect();
        format!("{{{}}}", fields.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(key: &str, text: &str, choices: &[&str]) -> FormQuestion {
        FormQuestion {
            key: key.into(),
            text: text.into(),
            choices: choices.iter().map(|c| (*c).to_owned()).collect(),
            shape: None,
            escalate_to: Vec::new(),
            escalate_after_s: 0,
            ask_to: Vec::new(),
            need: String::new(),
            context: String::new(),
        }
    }

    #[test]
    fn a_questionnaire_asks_in_turn_records_answers_and_keeps_its_order() {
        use progress::*;
        let keys = ["name", "b", "a"];
        let mut answers = serde_json::Map::new();
        assert_eq!(next(keys, &answers), Some("name"));
        record(&mut answers, &call_id("name"), false, "小明", &Shape::Text);
        record(
            &mut answers,
            &call_id("b"),
            true,
            "no answer came",
            &Shape::Text,
        );
        record(
            &mut answers,
            "call-7",
            false,
            "not a questionnaire's call",
            &Shape::Text,
        );
        assert_eq!(next(keys, &answers), Some("a"));
        // A step's record reads back.
        let stored = serde_json::to_vec(&step(&answers, Some("a"))).expect("json");
        assert_eq!(answers_of(&stored).expect("answers"), answers);
        answers.insert("a".into(), "yes".into());
        assert_eq!(next(keys, &answers), None);
        let out = output(keys, &answers);
        assert_eq!(out, r#"{"name":"小明","b":null,"a":"yes"}"#);
        let parsed: serde_json::Value = serde_json::from_str(&out).expect("the output is JSON");
        assert_eq!(parsed["name"], "小明");
        assert!(answers_of(b"[{}]").is_err());
        assert!(answers_of(b"not json").is_err());
    }

    #[test]
    fn a_questionnaire_takes_every_shape_and_records_its_value() {
        use progress::*;
        let mut confirm = q("ok", "Agree?", &[]);
        confirm.shape = Some(Shape::Confirm);
        let mut several = q("tags", "Tags?", &["a", "b", "c"]);
        several.shape = Some(Shape::Choice {
            choices: vec![],
            multiple: true,
        });
        let mut one = q("one", "One?", &["x", "y"]);
        one.shape = Some(Shape::Choice {
            choices: vec!["x".into(), "y".into()],
            multiple: false,
        });
        let kept = questionnaire(vec![confirm, several, one]).expect("valid");
        assert_eq!(kept[0].shape(), Shape::Confirm);
        assert_eq!(
            kept[1].shape(),
            Shape::Choice {
                choices: vec!["a".into(), "b".into(), "c".into()],
                multiple: true
            }
        );
        // One choice is kept as before: its choices, no shape.
        assert_eq!(kept[2].shape, None);
        assert_eq!(kept[2].choices, ["x", "y"]);
        let mut bad = q("f", "Form?", &[]);
        bad.shape = Some(Shape::Form { fields: vec![] });
        assert!(matches!(
            questionnaire(vec![bad]),
            Err(FormError::Shape { index: 1, .. })
        ));

        let mut answers = serde_json::Map::new();
        record(
            &mut answers,
            &call_id("ok"),
            false,
            "true",
            &kept[0].shape(),
        );
        record(
            &mut answers,
            &call_id("tags"),
            false,
            r#"["a","c"]"#,
            &kept[1].shape(),
        );
        record(&mut answers, &call_id("one"), false, "y", &kept[2].shape());
        assert_eq!(
            output(["ok", "tags", "one"], &answers),
            r#"{"ok":true,"tags":["a","c"],"one":"y"}"#
        );
    }

    #[test]
    fn an_answer_picks_a_choice_by_number_or_by_text() {
        let choices = vec!["Red".to_owned(), "蓝色".to_owned()];
        assert_eq!(pick(&choices, "1"), Some("Red"));
        assert_eq!(pick(&choices, " 2. "), Some("蓝色"));
        assert_eq!(pick(&choices, "2）"), Some("蓝色"));
        assert_eq!(pick(&choices, "red"), Some("Red"));
        assert_eq!(pick(&choices, "蓝色"), Some("蓝色"));
        assert_eq!(pick(&choices, "3"), None);
        assert_eq!(pick(&choices, "0"), None);
        assert_eq!(pick(&choices, "green"), None);
        assert_eq!(numbered(&choices), "1) Red  2) 蓝色");
    }

    #[test]
    fn a_questionnaire_gets_its_keys_and_is_refused_where_it_is_wrong() {
        let kept = questionnaire(vec![
            q("", " Name? ", &[]),
            q("size", "Size?", &["S", " M "]),
        ])
        .expect("valid");
        assert_eq!(kept[0].key, "q1");
        assert_eq!(kept[0].text, "Name?");
        assert_eq!(kept[1].choices, ["S", "M"]);

        assert_eq!(questionnaire(vec![]), Err(FormError::Empty));
        let many = (0..=MAX_QUESTIONS).map(|_| q("", "x", &[])).collect();
        assert_eq!(
            questionnaire(many),
            Err(FormError::TooMany(MAX_QUESTIONS + 1))
        );
        assert!(matches!(
            questionnaire(vec![q("", " ", &[])]),
            Err(FormError::Text { index: 1, .. })
        ));
        assert_eq!(
            questionnaire(vec![q("a", "x", &[]), q("a", "y", &[])]),
            Err(FormError::DuplicateKey {
                index: 2,
                key: "a".into()
            })
        );
        assert_eq!(
            questionnaire(vec![q("", "x", &["Yes", "yes"])]),
            Err(FormError::Choices {
                index: 1,
                why: ChoiceError::Repeated { index: 2, first: 1 }
            })
        );
        assert!(matches!(
            questionnaire(vec![q("", "x", &["ok", ""])]),
            Err(FormError::Choices {
                index: 1,
                why: ChoiceError::Text { index: 2, .. }
            })
        ));
        let error = questionnaire(vec![q("k\u{7}", "x", &[])]).expect_err("control character");
        assert!(
            error.to_string().starts_with("question 1: the key"),
            "{error}"
        );
    }
}
