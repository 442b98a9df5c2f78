//! Questions with choices, and questionnaires: tasks without an agent that ask their owner a
//! list of questions in turn and complete with the answers.

use serde::{Deserialize, Serialize};

use super::text;

/// The most questions one questionnaire asks.
pub const MAX_QUESTIONS: usize = 50;
/// The most bytes of one question's text.
pub const MAX_QUESTION_BYTES: usize = 8 * 1024;
/// The most choices one question offers.
pub const MAX_CHOICES: usize = 20;
/// The most bytes of one choice, and of one key.
pub const MAX_CHOICE_BYTES: usize = 256;

/// One question of a questionnaire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FormQuestion {
    /// The answer's key in the output.
    pub key: String,
    pub text: String,
    /// When not empty, the answer is one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
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
        kept.push(FormQuestion { key, text, choices });
    }
    Ok(kept)
}

/// The choice an answer picks: its number (from 1), or its text ignoring case and the space
/// around it. `None` when it picks none.
pub fn pick<'a>(choices: &'a [String], answer: &str) -> Option<&'a str> {
    let answer = answer.trim();
    let answer = answer
        .strip_suffix(['.', '。', ')', '）'])
        .unwrap_or(answer)
        .trim();
    if let Ok(n) = answer.parse::<usize>() {
        return n
            .checked_sub(1)
            .and_then(|i| choices.get(i))
            .map(String::as_str);
    }
    let lower = answer.to_lowercase();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn q(key: &str, text: &str, choices: &[&str]) -> FormQuestion {
        FormQuestion {
            key: key.into(),
            text: text.into(),
            choices: choices.iter().map(|c| (*c).to_owned()).collect(),
        }
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
