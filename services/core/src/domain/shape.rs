//! The shape of the answer a question takes: free text, one or several of numbered choices, a
//! yes or no, or a form of a few named fields (the subset of JSON schema that MCP elicitation
//! uses: a flat object of strings, numbers, integers, booleans and enums).
//!
//! An answer is read the same way on every surface, from what a person types in a chat:
//! `2` or the choice's text, `1,3` for several, `yes`/`no` or `是`/`否`/`好`/`不`, and for a form
//! one `key: value` per line (or a JSON object). An answer that does not fit is refused with what
//! was wrong ([`Misfit`]), and the question stays open. What the agent reads is JSON:
//! `{"choice": …}`, `{"choices": […]}`, `{"confirmed": true}`, or the form's object.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use hark_proto::v1 as pb;

use super::form::{self, ChoiceError};

/// The most fields one form has.
pub const MAX_FIELDS: usize = 20;

/// What a question accepts.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Shape {
    /// Any text.
    #[default]
    Text,
    /// One of the choices, or several with `multiple`.
    Choice {
        choices: Vec<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        multiple: bool,
    },
    /// Yes or no.
    Confirm,
    /// A value per field.
    Form { fields: Vec<Field> },
    /// An approval of a call: one of its three `choices` (approve, deny, approve for the rest of
    /// the task, in the asker's language), a denial with a reason after it, or changed
    /// `arguments` as `key: value` lines, which approve the call with them.
    Approval {
        choices: Vec<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        arguments: Vec<String>,
    },
}

/// One field of a form.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Field {
    pub key: String,
    /// What a person reads; the key when empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub title: String,
    #[serde(rename = "type")]
    pub kind: FieldKind,
    /// The values it takes, for a field of choices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
    /// What a person reads for each choice, when not the value itself.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// With choices: several may be picked, and the value is a list.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub multiple: bool,
    #[serde(default)]
    pub required: bool,
    /// The value taken when the field is left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FieldKind {
    #[default]
    String,
    Integer,
    Number,
    Boolean,
}

impl Field {
    /// The field as the API and the control requests carry it.
    pub fn to_proto(&self) -> pb::FormField {
        pb::FormField {
            key: self.key.clone(),
            title: self.title.clone(),
            r#type: match self.kind {
                FieldKind::String => "string",
                FieldKind::Integer => "integer",
                FieldKind::Number => "number",
                FieldKind::Boolean => "boolean",
            }
            .to_owned(),
            choices: self.choices.clone(),
            required: self.required,
            labels: self.labels.clone(),
            multiple: self.multiple,
            default_json: self
                .default
                .as_ref()
                .map(Value::to_string)
                .unwrap_or_default(),
        }
    }

    /// A field as a request gives it (`index` from 1, to name it when it is wrong).
    pub fn from_proto(field: &pb::FormField, index: usize) -> Result<Self, ShapeError> {
        let kind = match field.r#type.as_str() {
            "" | "string" => FieldKind::String,
            "integer" => FieldKind::Integer,
            "number" => FieldKind::Number,
            "boolean" => FieldKind::Boolean,
            other => {
                return Err(ShapeError::Field {
                    index,
                    why: format!(
                        "type `{}` is not one of string, integer, number, boolean",
                        super::ids::shown(other)
                    ),
                });
            }
        };
        let default = match field.default_json.trim() {
            "" => None,
            raw => Some(serde_json::from_str(raw).map_err(|e| ShapeError::Field {
                index,
                why: format!("default_json is not JSON: {e}"),
            })?),
        };
        Ok(Self {
            key: field.key.clone(),
            title: field.title.clone(),
            kind,
            choices: field.choices.clone(),
            labels: field.labels.clone(),
            multiple: field.multiple,
            required: field.required,
            default,
        })
    }
}

/// Why an answer does not fit its question; the question stays open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Misfit {
    #[error("it is not one of the choices")]
    NotAChoice,
    #[error("it is not yes or no")]
    NotYesOrNo,
    #[error("field `{0}` is missing")]
    Missing(String),
    #[error("field `{field}`: {why}")]
    BadField { field: String, why: String },
    #[error("`{0}` is not a field of this form")]
    UnknownField(String),
    #[error("it is not approve, deny (with a reason after it), or changed arguments")]
    NotAnApproval,
}

/// Why a shape was refused when a question was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("choices: {0}")]
    Choices(#[from] ChoiceError),
    #[error("a question of kind choice needs at least one choice")]
    NoChoices,
    #[error("a form needs between 1 and {MAX_FIELDS} fields")]
    Fields,
    #[error("an approval has three choices: approve, deny, approve for the rest of the task")]
    ApprovalChoices,
    #[error("field {index}: {why}")]
    Field { index: usize, why: String },
}

const YES: [&str; 9] = ["yes", "y", "是", "好", "对", "确认", "同意", "ok", "1"];
const NO: [&str; 7] = ["no", "n", "否", "不", "不要", "取消", "2"];

impl Shape {
    /// The shape of a question asked with these parts, checked: `kind` is `text`, `choice`,
    /// `confirm` or `form` (empty: `choice` when there are choices, else `text`).
    pub fn of(
        kind: &str,
        choices: &[String],
        multiple: bool,
        fields: Vec<Field>,
    ) -> Result<Self, ShapeError> {
        let kind = match kind {
            "" if !choices.is_empty() => "choice",
            "" => "text",
            kind => kind,
        };
        match kind {
            "choice" => {
                let choices = form::choices(choices)?;
                if choices.is_empty() {
                    return Err(ShapeError::NoChoices);
                }
                Ok(Self::Choice { choices, multiple })
            }
            "confirm" => Ok(Self::Confirm),
            "approval" => {
                let choices = form::choices(choices)?;
                if choices.len() != 3 {
                    return Err(ShapeError::ApprovalChoices);
                }
                Ok(Self::Approval {
                    choices,
                    arguments: fields.into_iter().map(|f| f.key).collect(),
                })
            }
            "form" => {
                if fields.is_empty() || fields.len() > MAX_FIELDS {
                    return Err(ShapeError::Fields);
                }
                let mut kept: Vec<Field> = Vec::with_capacity(fields.len());
                for (i, mut field) in fields.into_iter().enumerate() {
                    let bad = |why: String| ShapeError::Field { index: i + 1, why };
                    field.key = super::text::key(field.key.trim())
                        .map_err(|e| bad(format!("the key {e}")))?
                        .to_owned();
                    if kept.iter().any(|f| f.key == field.key) {
                        return Err(bad(format!("the key `{}` is used twice", field.key)));
                    }
                    field.title = field.title.trim().to_owned();
                    field.choices =
                        form::choices(&field.choices).map_err(|e| bad(e.to_string()))?;
                    if !field.labels.is_empty() && field.labels.len() != field.choices.len() {
                        return Err(bad("labels must name each choice".into()));
                    }
                    if field.multiple && field.choices.is_empty() {
                        return Err(bad("only a field of choices takes several".into()));
                    }
                    kept.push(field);
                }
                Ok(Self::Form { fields: kept })
            }
            _ => Ok(Self::Text),
        }
    }

    /// The shape of a question as a request gives its parts.
    pub fn from_proto(
        kind: &str,
        choices: &[String],
        multiple: bool,
        fields: &[pb::FormField],
    ) -> Result<Self, ShapeError> {
        let fields = fields
            .iter()
            .enumerate()
            .map(|(i, f)| Field::from_proto(f, i + 1))
            .collect::<Result<Vec<_>, _>>()?;
        Self::of(kind, choices, multiple, fields)
    }

    /// The shape's parts as a request or a question carries them: kind, choices, multiple,
    /// fields.
    pub fn to_proto(&self) -> (String, Vec<String>, bool, Vec<pb::FormField>) {
        (
            self.kind().to_owned(),
            self.choices().to_vec(),
            matches!(self, Self::Choice { multiple: true, .. }),
            match self {
                Self::Form { fields } => fields.iter().map(Field::to_proto).collect(),
                Self::Approval { arguments, .. } => arguments
                    .iter()
                    .map(|key| pb::FormField {
                        key: key.clone(),
                        r#type: "string".into(),
                        ..Default::default()
                    })
                    .collect(),
                _ => Vec::new(),
            },
        )
    }

    /// The form of an MCP elicitation's `requestedSchema`: a flat object of strings (plain,
    /// or one of an `enum`, titled by `enumNames` or by `oneOf` `const`/`title`), numbers,
    /// integers, booleans and lists of choices. `None` for a schema outside that subset.
    pub fn from_schema(schema: &Value) -> Option<Self> {
        let properties = schema.get("properties")?.as_object()?;
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut fields = Vec::new();
        for (key, property) in properties {
            let (kind, multiple, (choices, labels)) = match property["type"].as_str()? {
                "string" => (FieldKind::String, false, schema_choices(property)),
                "array" => (FieldKind::String, true, schema_choices(&property["items"])),
                "integer" => (FieldKind::Integer, false, Default::default()),
                "number" => (FieldKind::Number, false, Default::default()),
                "boolean" => (FieldKind::Boolean, false, Default::default()),
                _ => return None,
            };
            if multiple && choices.is_empty() {
                return None;
            }
            fields.push(Field {
                key: key.clone(),
                title: property["title"]
                    .as_str()
                    .or(property["description"].as_str())
                    .unwrap_or_default()
                    .to_owned(),
                kind,
                choices,
                labels,
                multiple,
                required: required.contains(&key.as_str()),
                default: property.get("default").cloned(),
            });
        }
        Self::of("form", &[], false, fields).ok()
    }

    /// What it expects, in English, for an error a program reads.
    pub fn expects(&self) -> String {
        match self {
            Self::Text => "any text".into(),
            Self::Choice {
                choices,
                multiple: false,
            } => format!("one of {}", form::numbered(choices)),
            Self::Choice {
                choices,
                multiple: true,
            } => format!("one or more of {}", form::numbered(choices)),
            Self::Confirm => "yes or no".into(),
            Self::Form { fields } => {
                let fields: Vec<String> = fields
                    .iter()
                    .map(|f| {
                        format!(
                            "{} ({:?}{})",
                            f.key,
                            f.kind,
                            if f.required { ", required" } else { "" }
                        )
                        .to_lowercase()
                    })
                    .collect();
                format!("a value per field: {}", fields.join(", "))
            }
            Self::Approval { choices, arguments } => format!(
                "one of {}, a reason after {}, or `key: value` lines changing {}",
                form::numbered(choices),
                choices.get(1).map_or("2", String::as_str),
                if arguments.is_empty() {
                    "no argument (it has none)".to_owned()
                } else {
                    arguments.join(", ")
                }
            ),
        }
    }

    /// One of `choices` (as [`form::choices`] checked them), or any text when there are none.
    pub fn choosing(choices: Vec<String>) -> Self {
        if choices.is_empty() {
            Self::Text
        } else {
            Self::Choice {
                choices,
                multiple: false,
            }
        }
    }

    /// `text`, `choice`, `confirm` or `form`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Choice { .. } => "choice",
            Self::Confirm => "confirm",
            Self::Form { .. } => "form",
            Self::Approval { .. } => "approval",
        }
    }

    /// The choices it offers; empty unless it is a choice.
    pub fn choices(&self) -> &[String] {
        match self {
            Self::Choice { choices, .. } | Self::Approval { choices, .. } => choices,
            _ => &[],
        }
    }

    /// Whether it takes free text.
    pub fn is_text(&self) -> bool {
        matches!(self, Self::Text)
    }

    /// Reads an answer as a person typed it; the value is what the answer means, as JSON.
    pub fn read(&self, answer: &str) -> Result<Value, Misfit> {
        match self {
            Self::Text => Ok(Value::String(answer.to_owned())),
            Self::Choice {
                choices,
                multiple: false,
            } => pick(choices, answer).map(|c| json!(c)),
            Self::Choice {
                choices,
                multiple: true,
            } => {
                let mut picked: Vec<&str> = Vec::new();
                for part in answer.split([',', '，', '、', ';', '；']) {
                    if part.trim().is_empty() {
                        continue;
                    }
                    let choice = pick(choices, part)?;
                    if !picked.contains(&choice) {
                        picked.push(choice);
                    }
                }
                if picked.is_empty() {
                    return Err(Misfit::NotAChoice);
                }
                Ok(json!(picked))
            }
            Self::Confirm => yes_or_no(answer).map(Value::Bool).ok_or(Misfit::NotYesOrNo),
            Self::Form { fields } => read_form(fields, answer).map(Value::Object),
            Self::Approval { choices, arguments } => read_approval(choices, arguments, answer),
        }
    }

    /// Checks a value given as JSON (over the API) and returns it as [`Shape::read`] would.
    pub fn check(&self, value: &Value) -> Result<Value, Misfit> {
        match (self, value) {
            (Self::Text, Value::String(_)) => Ok(value.clone()),
            (Self::Confirm, Value::Bool(_)) => Ok(value.clone()),
            (
                Self::Choice {
                    choices,
                    multiple: true,
                },
                Value::Array(items),
            ) => {
                // Each item is one choice, which may itself hold a comma.
                let mut picked: Vec<&str> = Vec::new();
                for item in items {
                    let item = item.as_str().ok_or(Misfit::NotAChoice)?;
                    let choice =
                        form::named(choices, item).map_or_else(|| pick(choices, item), Ok)?;
                    if !picked.contains(&choice) {
                        picked.push(choice);
                    }
                }
                if picked.is_empty() {
                    return Err(Misfit::NotAChoice);
                }
                Ok(json!(picked))
            }
            (Self::Form { .. }, Value::Object(_)) => self.read(&value.to_string()),
            (Self::Approval { arguments, .. }, Value::Object(_)) => {
                check_approval(arguments, value)
            }
            // A value names its choice by its text first, even one that reads as a number.
            (
                Self::Choice {
                    choices,
                    multiple: false,
                },
                Value::String(text),
            ) => form::named(choices, text).map_or_else(|| self.read(text), |c| Ok(json!(c))),
            (_, Value::String(text)) => self.read(text),
            (Self::Confirm, _) => Err(Misfit::NotYesOrNo),
            (Self::Approval { .. }, _) => Err(Misfit::NotAnApproval),
            _ => Err(Misfit::NotAChoice),
        }
    }

    /// The answer as the agent reads it, from its value.
    pub fn for_model(&self, value: &Value) -> String {
        match (self, value) {
            (Self::Text, Value::String(text)) => text.clone(),
            (
                Self::Choice {
                    multiple: false, ..
                },
                v,
            ) => json!({"choice": v}).to_string(),
            (Self::Choice { multiple: true, .. }, v) => json!({"choices": v}).to_string(),
            (Self::Confirm, v) => json!({"confirmed": v}).to_string(),
            (_, v) => v.to_string(),
        }
    }

    /// The value of an answer as the agent reads it (see [`Shape::for_model`]).
    pub fn value_of(&self, for_model: &str) -> Value {
        let parsed: Option<Value> = serde_json::from_str(for_model).ok();
        match (self, parsed) {
            (Self::Text, _) | (_, None) => Value::String(for_model.to_owned()),
            (
                Self::Choice {
                    multiple: false, ..
                },
                Some(v),
            ) => v["choice"].clone(),
            (Self::Choice { multiple: true, .. }, Some(v)) => v["choices"].clone(),
            (Self::Confirm, Some(v)) => v["confirmed"].clone(),
            (Self::Form { .. } | Self::Approval { .. }, Some(v)) => v,
        }
    }
}

/// The words of an approval, as a person types them (lowercase), longest first within each.
const APPROVE_FOR_TASK: [&str; 5] = [
    "approve for the rest of this task",
    "本任务内都批准",
    "always",
    "总是批准",
    "3",
];
const APPROVE: [&str; 12] = [
    "approve", "approved", "批准", "同意", "可以", "好的", "是的", "yes", "ok", "好", "是", "1",
];
const DENY: [&str; 12] = [
    "不同意",
    "不要",
    "拒绝",
    "不行",
    "deny",
    "denied",
    "reject",
    "no",
    "否",
    "不",
    "n",
    "2",
];

/// What a person decided about a call: the value is `{"decision": "approve" |
/// "approve_for_task" | "deny"}`, with the `reason` of a denial and the changed `arguments` of an
/// edited approval when given.
fn read_approval(choices: &[String], arguments: &[String], answer: &str) -> Result<Value, Misfit> {
    let text = answer.trim();
    let label = |i: usize| choices.get(i).map_or("", String::as_str);
    if let Ok(value @ Value::Object(_)) = serde_json::from_str::<Value>(text) {
        return check_approval(arguments, &value);
    }
    // Only changed arguments: approved with them.
    if let Some(changed) = changed_arguments(arguments, text)? {
        return Ok(json!({"decision": "approve", "arguments": changed}));
    }
    let lower = text.to_lowercase();
    let lower = lower.trim_end_matches(['.', '。', '!', '！']);
    if APPROVE_FOR_TASK.contains(&lower) || lower == label(2).to_lowercase() {
        return Ok(json!({"decision": "approve_for_task"}));
    }
    let approve: Vec<&str> = std::iter::once(label(0)).chain(APPROVE).collect();
    let deny: Vec<&str> = std::iter::once(label(1)).chain(DENY).collect();
    if let Some(rest) = after_word(&approve, text) {
        return match changed_arguments(arguments, rest)? {
            _ if rest.is_empty() => Ok(json!({"decision": "approve"})),
            Some(changed) => Ok(json!({"decision": "approve", "arguments": changed})),
            None => Err(Misfit::NotAnApproval),
        };
    }
    if let Some(reason) = after_word(&deny, text) {
        return Ok(match reason {
            "" => json!({"decision": "deny"}),
            reason => json!({"decision": "deny", "reason": reason}),
        });
    }
    Err(Misfit::NotAnApproval)
}

/// What follows one of `words` at the start of `text`, after a separator; `None` when it does
/// not start with one. A Chinese word needs no separator after it (`拒绝太贵了`).
fn after_word<'a>(words: &[&str], text: &'a str) -> Option<&'a str> {
    words.iter().filter(|w| !w.is_empty()).find_map(|word| {
        let head = text.get(..word.len())?;
        if !head.eq_ignore_ascii_case(word) {
            return None;
        }
        let rest = &text[word.len()..];
        let separated = rest.is_empty()
            || !word.is_ascii()
            || rest.starts_with(|c: char| c.is_whitespace() || ":：,，;；-—.。".contains(c));
        separated.then(|| {
            rest.trim_start_matches(|c: char| c.is_whitespace() || ":：,，;；-—.。".contains(c))
                .trim_end()
        })
    })
}

/// `text` as changed arguments: one `key: value` per line, each key one of `arguments`. `None`
/// when its first line is no such change; a later line that is none is refused.
fn changed_arguments(
    arguments: &[String],
    text: &str,
) -> Result<Option<Map<String, Value>>, Misfit> {
    let mut changed = Map::new();
    for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let known = line
            .split_once([':', '：', '='])
            .map(|(key, value)| (key.trim(), value.trim()))
            .filter(|(key, _)| arguments.iter().any(|a| a == key));
        match known {
            Some((key, value)) => {
                // A value that reads as JSON (a number, true, a list) is taken as it reads.
                let value = serde_json::from_str::<Value>(value)
                    .ok()
                    .filter(|v| !v.is_string())
                    .unwrap_or_else(|| Value::String(value.to_owned()));
                changed.insert(key.to_owned(), value);
            }
            None if i == 0 => return Ok(None),
            None => {
                let key = line.split_once([':', '：', '=']).map_or(line, |(k, _)| k);
                return Err(Misfit::UnknownField(key.trim().to_owned()));
            }
        }
    }
    Ok((!changed.is_empty()).then_some(changed))
}

/// An approval given as JSON: `{"decision": …, "reason"?: …, "arguments"?: {…}}`.
fn check_approval(arguments: &[String], value: &Value) -> Result<Value, Misfit> {
    let decision = value["decision"].as_str().unwrap_or_default();
    let mut out = Map::new();
    match decision {
        "approve" | "approve_for_task" | "deny" => {
            out.insert("decision".into(), json!(decision));
        }
        _ => return Err(Misfit::NotAnApproval),
    }
    if let Some(reason) = value.get("reason").filter(|r| !r.is_null()) {
        let reason = reason.as_str().ok_or(Misfit::NotAnApproval)?;
        if decision != "deny" {
            return Err(Misfit::NotAnApproval);
        }
        out.insert("reason".into(), json!(reason));
    }
    if let Some(changed) = value.get("arguments").filter(|a| !a.is_null()) {
        let changed = changed.as_object().ok_or(Misfit::NotAnApproval)?;
        if decision == "deny" {
            return Err(Misfit::NotAnApproval);
        }
        if let Some(unknown) = changed.keys().find(|k| !arguments.contains(k)) {
            return Err(Misfit::UnknownField(unknown.clone()));
        }
        out.insert("arguments".into(), Value::Object(changed.clone()));
    }
    Ok(Value::Object(out))
}

/// The choices of a schema property, with their titles: an `enum` (titled by `enumNames`), or
/// `oneOf`/`anyOf` of `const` with `title`.
fn schema_choices(property: &Value) -> (Vec<String>, Vec<String>) {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    if property["enum"].is_array() {
        return (strings(&property["enum"]), strings(&property["enumNames"]));
    }
    let titled = property["oneOf"]
        .as_array()
        .or(property["anyOf"].as_array());
    let mut choices = Vec::new();
    let mut labels = Vec::new();
    for option in titled.into_iter().flatten() {
        if let Some(value) = option["const"].as_str() {
            choices.push(value.to_owned());
            labels.push(option["title"].as_str().unwrap_or(value).to_owned());
        }
    }
    (choices, labels)
}

/// The choice an answer picks: its number (from 1), or its text ignoring case.
fn pick<'a>(choices: &'a [String], answer: &str) -> Result<&'a str, Misfit> {
    form::pick(choices, answer).ok_or(Misfit::NotAChoice)
}

/// `true` for yes, `false` for no, in English or Chinese; `None` for anything else.
pub fn yes_or_no(answer: &str) -> Option<bool> {
    let answer = answer
        .trim()
        .trim_end_matches(['.', '。', '!', '！'])
        .to_lowercase();
    if YES.contains(&answer.as_str()) || answer == "true" {
        Some(true)
    } else if NO.contains(&answer.as_str()) || answer == "false" {
        Some(false)
    } else {
        None
    }
}

/// A form's answer: a JSON object, or one `key: value` per line (`：` too); keys may be given by
/// the field's title. Missing optional fields are left out.
fn read_form(fields: &[Field], answer: &str) -> Result<Map<String, Value>, Misfit> {
    let given: Vec<(String, Value)> = match serde_json::from_str::<Value>(answer.trim()) {
        Ok(Value::Object(object)) => object.into_iter().collect(),
        _ => answer
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| {
                let (key, value) = line
                    .split_once([':', '：', '='])
                    .ok_or_else(|| Misfit::UnknownField(line.trim().to_owned()))?;
                Ok((
                    key.trim().to_owned(),
                    Value::String(value.trim().to_owned()),
                ))
            })
            .collect::<Result<_, Misfit>>()?,
    };
    let mut out = Map::new();
    for (key, value) in given {
        let field = fields
            .iter()
            .find(|f| f.key == key || (!f.title.is_empty() && f.title.eq_ignore_ascii_case(&key)))
            .ok_or_else(|| Misfit::UnknownField(key.clone()))?;
        let bad = |why: &str| Misfit::BadField {
            field: field.key.clone(),
            why: why.to_owned(),
        };
        let text = match &value {
            Value::String(s) => s.trim().to_owned(),
            other => other.to_string(),
        };
        let value = match field.kind {
            FieldKind::String if !field.choices.is_empty() => {
                let pick_one = |part: &str| {
                    field_choice(field, part).ok_or_else(|| {
                        bad(&format!("must be one of {}", form::numbered(field.shown())))
                    })
                };
                if field.multiple {
                    let parts: Vec<String> = match &value {
                        Value::Array(items) => items
                            .iter()
                            .map(|v| {
                                v.as_str()
                                    .map(str::to_owned)
                                    .unwrap_or_else(|| v.to_string())
                            })
                            .collect(),
                        _ => text
                            .split([',', '，', '、', ';', '；'])
                            .filter(|p| !p.trim().is_empty())
                            .map(str::to_owned)
                            .collect(),
                    };
                    json!(
                        parts
                            .iter()
                            .map(|p| pick_one(p))
                            .collect::<Result<Vec<_>, _>>()?
                    )
                } else {
                    json!(pick_one(&text)?)
                }
            }
            FieldKind::String => json!(text),
            FieldKind::Integer => json!(
                text.parse::<i64>()
                    .map_err(|_| bad("must be a whole number"))?
            ),
            FieldKind::Number => {
                let n = text.parse::<f64>().map_err(|_| bad("must be a number"))?;
                serde_json::Number::from_f64(n)
                    .map(Value::Number)
                    .ok_or_else(|| bad("must be a finite number"))?
            }
            FieldKind::Boolean => json!(yes_or_no(&text).ok_or_else(|| bad("must be yes or no"))?),
        };
        out.insert(field.key.clone(), value);
    }
    for field in fields {
        if !out.contains_key(&field.key)
            && let Some(default) = &field.default
        {
            out.insert(field.key.clone(), default.clone());
        }
    }
    if let Some(missing) = fields
        .iter()
        .find(|f| f.required && !out.contains_key(&f.key))
    {
        return Err(Misfit::Missing(missing.key.clone()));
    }
    Ok(out)
}

/// The value of a field's choice that `answer` picks: by number, value or label.
fn field_choice(field: &Field, answer: &str) -> Option<String> {
    if let Some(value) = form::pick(&field.choices, answer) {
        return Some(value.to_owned());
    }
    let index = form::pick(&field.labels, answer)
        .and_then(|label| field.labels.iter().position(|l| l == label))?;
    field.choices.get(index).cloned()
}

impl Field {
    /// Its choices as a person reads them: the labels when it has them.
    pub fn shown(&self) -> &[String] {
        if self.labels.len() == self.choices.len() {
            &self.labels
        } else {
            &self.choices
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choices(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    fn field(key: &str, kind: FieldKind, required: bool) -> Field {
        Field {
            key: key.into(),
            title: String::new(),
            kind,
            choices: Vec::new(),
            labels: Vec::new(),
            multiple: false,
            required,
            default: None,
        }
    }

    #[test]
    fn choices_are_read_by_number_or_text_one_or_several() {
        let one = Shape::of("", &choices(&["Red", "蓝色", "Green"]), false, vec![]).expect("ok");
        assert_eq!(one.kind(), "choice");
        assert_eq!(one.read("2"), Ok(json!("蓝色")));
        assert_eq!(one.read(" red "), Ok(json!("Red")));
        assert_eq!(one.read("4"), Err(Misfit::NotAChoice));
        assert_eq!(one.for_model(&json!("Red")), r#"{"choice":"Red"}"#);

        let several =
            Shape::of("choice", &choices(&["Red", "蓝色", "Green"]), true, vec![]).expect("ok");
        assert_eq!(several.read("2,3"), Ok(json!(["蓝色", "Green"])));
        assert_eq!(several.read("1，red、3"), Ok(json!(["Red", "Green"])));
        assert_eq!(several.read("1, 9"), Err(Misfit::NotAChoice));
        assert_eq!(several.read(" , "), Err(Misfit::NotAChoice));
        assert_eq!(
            several.check(&json!(["Green", "1"])),
            Ok(json!(["Green", "Red"]))
        );
        let model = several.for_model(&json!(["Red"]));
        assert_eq!(model, r#"{"choices":["Red"]}"#);
        assert_eq!(several.value_of(&model), json!(["Red"]));
        assert!(matches!(
            Shape::of("choice", &[], false, vec![]),
            Err(ShapeError::NoChoices)
        ));
    }

    #[test]
    fn an_approval_takes_a_choice_a_denial_with_its_reason_or_changed_arguments() {
        let approval = Shape::of(
            "approval",
            &choices(&["批准", "拒绝", "本任务内都批准"]),
            false,
            vec![
                field("path", FieldKind::String, true),
                field("count", FieldKind::Integer, false),
            ],
        )
        .expect("an approval");
        let read = |answer: &str| approval.read(answer);
        for (answer, decision) in [
            ("1", "approve"),
            ("批准", "approve"),
            ("Approve.", "approve"),
            ("好的", "approve"),
            ("3", "approve_for_task"),
            ("本任务内都批准", "approve_for_task"),
            ("2", "deny"),
            ("不要", "deny"),
            ("deny", "deny"),
        ] {
            assert_eq!(read(answer), Ok(json!({"decision": decision})), "{answer}");
        }
        assert_eq!(
            read("拒绝：太贵了"),
            Ok(json!({"decision": "deny", "reason": "太贵了"}))
        );
        assert_eq!(
            read("拒绝太贵了"),
            Ok(json!({"decision": "deny", "reason": "太贵了"}))
        );
        assert_eq!(
            read("deny - not on a Friday"),
            Ok(json!({"decision": "deny", "reason": "not on a Friday"}))
        );
        assert_eq!(
            read("path: /tmp/b\ncount: 3"),
            Ok(json!({"decision": "approve", "arguments": {"path": "/tmp/b", "count": 3}}))
        );
        assert_eq!(
            read("批准\npath：/tmp/c"),
            Ok(json!({"decision": "approve", "arguments": {"path": "/tmp/c"}}))
        );
        assert_eq!(
            read("path: /tmp/b\nsize: 3"),
            Err(Misfit::UnknownField("size".into()))
        );
        assert_eq!(read("maybe"), Err(Misfit::NotAnApproval));
        assert_eq!(read("nope"), Err(Misfit::NotAnApproval));
        assert_eq!(read("批准\nwhatever"), Err(Misfit::NotAnApproval));
        // Over the API, as JSON.
        assert_eq!(
            approval.check(&json!({"decision": "deny", "reason": "no"})),
            Ok(json!({"decision": "deny", "reason": "no"}))
        );
        assert_eq!(
            approval.check(&json!({"decision": "deny", "arguments": {"path": "/x"}})),
            Err(Misfit::NotAnApproval)
        );
        assert_eq!(
            approval.check(&json!({"decision": "approve", "arguments": {"mode": "x"}})),
            Err(Misfit::UnknownField("mode".into()))
        );
        // What the agent reads, and back.
        let value = json!({"decision": "deny", "reason": "太贵了"});
        assert_eq!(approval.value_of(&approval.for_model(&value)), value);
        // Carried as its kind, its choices and its arguments as fields.
        let (kind, shown, _, fields) = approval.to_proto();
        assert_eq!(kind, "approval");
        assert_eq!(shown, ["批准", "拒绝", "本任务内都批准"]);
        assert_eq!(
            Shape::from_proto(&kind, &shown, false, &fields),
            Ok(approval.clone())
        );
        assert_eq!(
            Shape::of("approval", &choices(&["yes", "no"]), false, vec![]),
            Err(ShapeError::ApprovalChoices)
        );
    }

    #[test]
    fn a_confirm_takes_yes_or_no_in_english_or_chinese() {
        let confirm = Shape::of("confirm", &[], false, vec![]).expect("ok");
        for yes in ["yes", "Y", "是", "好", "好。", "1"] {
            assert_eq!(confirm.read(yes), Ok(json!(true)), "{yes}");
        }
        for no in ["no", "否", "不", "2"] {
            assert_eq!(confirm.read(no), Ok(json!(false)), "{no}");
        }
        assert_eq!(confirm.read("maybe"), Err(Misfit::NotYesOrNo));
        assert_eq!(confirm.check(&json!(true)), Ok(json!(true)));
        assert_eq!(confirm.check(&json!(3)), Err(Misfit::NotYesOrNo));
        assert_eq!(confirm.for_model(&json!(true)), r#"{"confirmed":true}"#);
    }

    #[test]
    fn a_form_is_read_from_lines_or_json_and_checked_field_by_field() {
        let mut size = field("size", FieldKind::String, true);
        size.choices = choices(&["S", "M", "L"]);
        size.title = "尺码".into();
        let form = Shape::of(
            "form",
            &[],
            false,
            vec![
                field("name", FieldKind::String, true),
                field("age", FieldKind::Integer, false),
                size,
                field("vip", FieldKind::Boolean, false),
            ],
        )
        .expect("ok");
        assert_eq!(
            form.read("name: 小明\n尺码：2\nvip: 是"),
            Ok(json!({"name": "小明", "size": "M", "vip": true}))
        );
        assert_eq!(
            form.read(r#"{"name": "Ada", "age": 36, "size": "l"}"#),
            Ok(json!({"name": "Ada", "age": 36, "size": "L"}))
        );
        assert_eq!(form.read("name: Ada"), Err(Misfit::Missing("size".into())));
        assert!(matches!(
            form.read("name: Ada\nsize: M\nage: old"),
            Err(Misfit::BadField { field, .. }) if field == "age"
        ));
        assert_eq!(
            form.read("name: Ada\nsize: M\nshoe: 42"),
            Err(Misfit::UnknownField("shoe".into()))
        );
        assert_eq!(
            form.read("just text"),
            Err(Misfit::UnknownField("just text".into()))
        );
        let model = form.for_model(&json!({"name": "Ada"}));
        assert_eq!(form.value_of(&model), json!({"name": "Ada"}));
    }

    #[test]
    fn an_elicitation_schema_becomes_a_form_when_it_is_flat() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string", "title": "Name"},
            "color": {"type": "string", "enum": ["red", "blue"]},
            "count": {"type": "integer", "minimum": 1, "default": 42},
            "ok": {"type": "boolean"},
            "hero": {"type": "string", "oneOf": [
                {"const": "hero-1", "title": "Superman"}, {"const": "hero-2", "title": "Green Lantern"}]},
            "pet": {"type": "string", "enum": ["pet-1", "pet-2"], "enumNames": ["Cats", "Dogs"]},
            "fish": {"type": "array", "items": {"anyOf": [
                {"const": "fish-1", "title": "Tuna"}, {"const": "fish-2", "title": "Salmon"}]}}
        }, "required": ["name"]});
        let Some(form) = Shape::from_schema(&schema) else {
            panic!("a form")
        };
        let Shape::Form { fields } = &form else {
            panic!("a form")
        };
        assert_eq!(fields.len(), 7);
        let color = fields.iter().find(|f| f.key == "color").expect("color");
        assert_eq!(color.choices, ["red", "blue"]);
        assert!(
            fields
                .iter()
                .find(|f| f.key == "name")
                .expect("name")
                .required
        );
        // Choices by label or number, several for a list, and defaults for what is left out.
        assert_eq!(
            form.read("name: Ada\nhero: green lantern\npet: 2\nfish: Tuna, 2"),
            Ok(json!({"name": "Ada", "hero": "hero-2", "pet": "pet-2",
                "fish": ["fish-1", "fish-2"], "count": 42}))
        );
        assert!(matches!(
            form.read("name: Ada\nhero: Batman"),
            Err(Misfit::BadField { field, why }) if field == "hero" && why.contains("1) Superman")
        ));
        let nested = json!({"type": "object", "properties": {"a": {"type": "object"}}});
        assert_eq!(Shape::from_schema(&nested), None);
    }

    #[test]
    fn shapes_are_stored_as_json_with_their_kind() {
        let shape = Shape::Choice {
            choices: choices(&["a"]),
            multiple: true,
        };
        let stored = serde_json::to_value(&shape).expect("json");
        assert_eq!(
            stored,
            json!({"kind": "choice", "choices": ["a"], "multiple": true})
        );
        assert_eq!(
            serde_json::from_value::<Shape>(json!({"kind": "confirm"})).expect("reads"),
            Shape::Confirm
        );
    }
}
