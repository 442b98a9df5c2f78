//! The tool registry: each tool's JSON schema, the least role that may run it, and whether it is
//! always offered to the model (`Essential`) or found through `list_tools` (`Discoverable`).
//!
//! `ask_user` is essential and always offered, whatever else is hidden: it is the agent's way out
//! when it lacks information. A call is checked before it runs: the tool exists, the task owner's
//! role is high enough (a tool never runs above it), and the arguments match the schema. A bad
//! call becomes an error result for the model, never a failed task.

use hark_core::domain::Role;
use serde_json::{Map, Value, json};

use crate::llm::ToolCall;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    Essential,
    Discoverable,
}

/// What running a tool takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    AskUser,
    SendMessage,
    ListTools,
    GetToolSchema,
    CurrentTime,
    WorkerInfo,
}

#[derive(Debug, Clone)]
pub struct Tool {
    pub name: &'static str,
    pub description: &'static str,
    pub parameters: Value,
    pub min_role: Role,
    pub visibility: Visibility,
    pub kind: Kind,
}

impl Tool {
    /// The tool in the OpenAI `tools` format.
    pub fn declaration(&self) -> Value {
        json!({"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}})
    }
}

/// A call that passed every check.
#[derive(Debug, Clone)]
pub struct Checked<'a> {
    pub tool: &'a Tool,
    pub arguments: Map<String, Value>,
}

#[derive(Debug, Clone)]
pub struct Registry {
    tools: Vec<Tool>,
}

impl Registry {
    pub fn builtin() -> Self {
        Self {
            tools: vec![
                Tool {
                    name: "ask_user",
                    description: "Ask the person who gave you this task a question and wait for the answer. \
                        Use it when you lack information only they have, or need their decision. \
                        The task pauses until they reply in their chat; the reply is this tool's result.",
                    parameters: json!({"type": "object", "properties": {
                        "question": {"type": "string", "description": "The question, short and specific."},
                        "context": {"type": "string", "description": "Optional background shown after the question."},
                        "timeout_s": {"type": "integer", "minimum": 10, "description": "Optional: seconds to wait for an answer."},
                        "choices": {"type": "array", "items": {"type": "string"}, "maxItems": 20,
                            "description": "Optional: the answers to choose from; the reply is then one of them."}
                    }, "required": ["question"], "additionalProperties": false}),
                    min_role: Role::User,
                    visibility: Visibility::Essential,
                    kind: Kind::AskUser,
                },
                Tool {
                    name: "send_message",
                    description: "Send a short progress note to the task owner's chat. Does not wait for a reply.",
                    parameters: json!({"type": "object", "properties": {
                        "text": {"type": "string"}
                    }, "required": ["text"], "additionalProperties": false}),
                    min_role: Role::User,
                    visibility: Visibility::Essential,
                    kind: Kind::SendMessage,
                },
                Tool {
                    name: "list_tools",
                    description: "List the further tools you can use, with their descriptions.",
                    parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
                    min_role: Role::Guest,
                    visibility: Visibility::Essential,
                    kind: Kind::ListTools,
                },
                Tool {
                    name: "get_tool_schema",
                    description: "Get the JSON schema of a tool's arguments, to call it.",
                    parameters: json!({"type": "object", "properties": {
                        "name": {"type": "string"}
                    }, "required": ["name"], "additionalProperties": false}),
                    min_role: Role::Guest,
                    visibility: Visibility::Essential,
                    kind: Kind::GetToolSchema,
                },
                Tool {
                    name: "current_time",
                    description: "The current date and time in UTC (RFC 3339).",
                    parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
                    min_role: Role::Guest,
                    visibility: Visibility::Discoverable,
                    kind: Kind::CurrentTime,
                },
                Tool {
                    name: "worker_info",
                    description: "Which worker runs this task (for operators).",
                    parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
                    min_role: Role::Admin,
                    visibility: Visibility::Discoverable,
                    kind: Kind::WorkerInfo,
                },
            ],
        }
    }

    /// The names of its tools.
    pub fn names(&self) -> Vec<&'static str> {
        self.tools.iter().map(|t| t.name).collect()
    }

    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// The tools offered to the model in every request: the essential ones, `ask_user` always.
    pub fn offered(&self) -> Vec<Value> {
        self.tools
            .iter()
            .filter(|t| t.visibility == Visibility::Essential)
            .map(Tool::declaration)
            .collect()
    }

    /// The discoverable tools the role may use, for `list_tools`.
    pub fn discoverable(&self, role: Role) -> Vec<&Tool> {
        self.tools
            .iter()
            .filter(|t| t.visibility == Visibility::Discoverable && t.min_role <= role)
            .collect()
    }

    /// Checks a call; the error is the text of the error result given to the model.
    pub fn check(&self, call: &ToolCall, role: Role) -> Result<Checked<'_>, String> {
        let tool = self.get(&call.name).ok_or_else(|| {
            format!(
                "error: there is no tool `{}`. Call list_tools to see what you can use.",
                call.name
            )
        })?;
        if role < tool.min_role {
            return Err(format!(
                "error: the tool `{}` needs the role {}, and this task runs with the role {role}.",
                tool.name, tool.min_role
            ));
        }
        let arguments = parse_arguments(&call.arguments).map_err(|e| format!("error: {e}"))?;
        validate(&tool.parameters, &arguments).map_err(|e| {
            format!(
                "error: bad arguments for `{}`: {e}. Its schema: {}",
                tool.name, tool.parameters
            )
        })?;
        Ok(Checked { tool, arguments })
    }
}

/// Arguments as the model gave them: a JSON string (possibly empty), or an object.
fn parse_arguments(raw: &Value) -> Result<Map<String, Value>, String> {
    let value = match raw {
        Value::Null => return Ok(Map::new()),
        Value::String(s) if s.trim().is_empty() => return Ok(Map::new()),
        Value::String(s) => {
            serde_json::from_str(s).map_err(|e| format!("the arguments are not valid JSON: {e}"))?
        }
        other => other.clone(),
    };
    match value {
        Value::Object(map) => Ok(map),
        other => Err(format!("the arguments must be a JSON object, not {other}")),
    }
}

/// A small JSON-schema check covering what tool schemas here use: object properties of type
/// string, integer, number, boolean, array or object; `required`; `additionalProperties: false`;
/// `minimum` for numbers.
pub fn validate(schema: &Value, arguments: &Map<String, Value>) -> Result<(), String> {
    let properties = schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for required in schema["required"].as_array().into_iter().flatten() {
        if let Some(name) = required.as_str()
            && !arguments.contains_key(name)
        {
            return Err(format!("`{name}` is required"));
        }
    }
    for (name, value) in arguments {
        let Some(property) = properties.get(name) else {
            if schema["additionalProperties"] == Value::Bool(false) {
                return Err(format!("unknown argument `{name}`"));
            }
            continue;
        };
        let expected = property["type"].as_str().unwrap_or("");
        let ok = match expected {
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            "array" => value.is_array(),
            "object" => value.is_object(),
            _ => true,
        };
        if !ok {
            return Err(format!("`{name}` must be of type {expected}, not {value}"));
        }
        if let (Some(min), Some(v)) = (property["minimum"].as_f64(), value.as_f64())
            && v < min
        {
            return Err(format!("`{name}` must be at least {min}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, arguments: Value) -> ToolCall {
        ToolCall {
            id: "c".into(),
            name: name.into(),
            arguments,
        }
    }

    #[test]
    fn ask_user_is_always_offered_and_discoverable_tools_are_not() {
        let registry = Registry::builtin();
        let offered: Vec<String> = registry
            .offered()
            .iter()
            .map(|t| {
                t["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        assert!(offered.contains(&"ask_user".to_owned()));
        assert!(!offered.contains(&"current_time".to_owned()));
        assert_eq!(registry.discoverable(Role::User).len(), 1);
        assert_eq!(registry.discoverable(Role::Admin).len(), 2);
    }

    #[test]
    fn calls_are_checked_for_name_role_and_arguments() {
        let registry = Registry::builtin();
        assert!(
            registry
                .check(
                    &call("ask_user", json!("{\"question\": \"Q?\"}")),
                    Role::User
                )
                .is_ok()
        );
        assert!(
            registry
                .check(&call("ask_user", json!({"question": "Q?"})), Role::User)
                .is_ok()
        );
        let err = registry
            .check(&call("ask_user", json!("{}")), Role::User)
            .unwrap_err();
        assert!(err.contains("`question` is required"), "{err}");
        let err = registry
            .check(&call("ask_user", json!("{not json")), Role::User)
            .unwrap_err();
        assert!(err.contains("not valid JSON"), "{err}");
        let err = registry
            .check(&call("ask_user", json!({"question": 3})), Role::User)
            .unwrap_err();
        assert!(err.contains("type string"), "{err}");
        let err = registry
            .check(
                &call("ask_user", json!({"question": "q", "timeout_s": 1})),
                Role::User,
            )
            .unwrap_err();
        assert!(err.contains("at least"), "{err}");
        let err = registry
            .check(
                &call("ask_user", json!({"question": "q", "mood": "x"})),
                Role::User,
            )
            .unwrap_err();
        assert!(err.contains("unknown argument"), "{err}");
        let err = registry
            .check(&call("rm_rf", json!("{}")), Role::Admin)
            .unwrap_err();
        assert!(err.contains("no tool"), "{err}");
        let err = registry
            .check(&call("worker_info", json!("")), Role::User)
            .unwrap_err();
        assert!(err.contains("needs the role admin"), "{err}");
        assert!(
            registry
                .check(&call("worker_info", json!("")), Role::Admin)
                .is_ok()
        );
    }
}
