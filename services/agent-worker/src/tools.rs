//! The tool registry: each tool's JSON schema, the least role that may run it, whether it waits
//! for its owner's approval, and how it is shown to the model: always (`Essential`), by name while
//! the list is short (`Offered`, the tools of MCP servers), or only through `list_tools`
//! (`Discoverable`).
//!
//! `ask_user` is essential and always offered, whatever else is hidden: it is the agent's way out
//! when it lacks information. A call is checked before it runs: the tool exists, the task owner's
//! role is high enough (a tool never runs above it), and the arguments match the schema. A bad
//! call becomes an error result for the model, never a failed task.

use hark_core::domain::Role;
use serde_json::{Map, Value, json, value::RawValue};

use crate::{limits, llm::ToolCall};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    /// In every request.
    Essential,
    /// In every request while the list of tools stays within `tools.max_offered`, else found
    /// through `list_tools`.
    Offered,
    /// Found through `list_tools`.
    Discoverable,
}

/// What running a tool takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    AskUser,
    SendMessage,
    ListTools,
    GetToolSchema,
    CurrentTime,
    WorkerInfo,
    ListMyTasks,
    CreateSubtask,
    FetchUrl,
    /// The tool `tool` of the MCP server `server` (its index in `tools.mcp`).
    Mcp {
        server: usize,
        tool: String,
    },
}

/// The names of the built-in tools, and `mcp` for every tool of an MCP server: the values of the
/// tool label of the worker's metrics.
pub const METRIC_NAMES: [&str; 10] = [
    "ask_user",
    "send_message",
    "list_tools",
    "get_tool_schema",
    "current_time",
    "worker_info",
    "list_my_tasks",
    "create_subtask",
    "fetch_url",
    "mcp",
];

#[derive(Debug, Clone)]
pub struct Tool {
    pub name: String,
    pub description: String,
    pub parameters: Value,
    pub min_role: Role,
    pub visibility: Visibility,
    pub kind: Kind,
    /// Whether a call waits for the owner's approval before it runs.
    pub approval: bool,
    /// Whose approval it waits for instead of the owner's, and how many of them must approve
    /// (`tools.mcp[].approvers`, `approvals_needed`).
    pub approvers: Vec<String>,
    pub approvals_needed: String,
}

impl Tool {
    fn builtin(
        name: &str,
        description: &str,
        parameters: Value,
        min_role: Role,
        visibility: Visibility,
        kind: Kind,
    ) -> Self {
        Self {
            name: name.to_owned(),
            description: description.to_owned(),
            parameters,
            min_role,
            visibility,
            kind,
            approval: false,
            approvers: Vec::new(),
            approvals_needed: String::new(),
        }
    }

    /// `fetch_url`, for tasks of `min_role` and above.
    pub fn fetch_url(min_role: Role) -> Self {
        Self::builtin(
            "fetch_url",
            "Fetch a web page or an API response with HTTP GET, from the hosts the operator allows. \
             Returns the status and the text (cut when long).",
            json!({"type": "object", "properties": {
                "url": {"type": "string", "description": "An http or https URL."}
            }, "required": ["url"], "additionalProperties": false}),
            min_role,
            Visibility::Offered,
            Kind::FetchUrl,
        )
    }

    /// The name its metrics are labelled with.
    pub fn metric_name(&self) -> &str {
        match self.kind {
            Kind::Mcp { .. } => "mcp",
            _ => &self.name,
        }
    }
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
    /// How many tools are offered by name at most (`tools.max_offered`).
    max_offered: usize,
    /// What [`Registry::offered`] gives each role (by [`role_slot`]), made on first use: the
    /// tools do not change while a registry is shared.
    offered: [std::sync::OnceLock<Option<Box<RawValue>>>; 3],
}

fn role_slot(role: Role) -> usize {
    match role {
        Role::Guest => 0,
        Role::User => 1,
        Role::Admin => 2,
    }
}

impl Registry {
    pub fn builtin() -> Self {
        let none = || json!({"type": "object", "properties": {}, "additionalProperties": false});
        Self {
            tools: vec![
                Tool::builtin(
                    "ask_user",
                    "Ask the person who gave you this task a question and wait for the answer. \
                     Use it when you lack information only they have, or need their decision. \
                     The task pauses until they reply in their chat; the reply is this tool's result.",
                    json!({"type": "object", "properties": {
                        "question": {"type": "string", "description": "The question, short and specific."},
                        "context": {"type": "string", "description": "Optional background shown after the question."},
                        "timeout_s": {"type": "integer", "minimum": 10, "description": "Optional: seconds to wait for an answer. \
                            A task with a deadline ends then, whatever its questions wait for."},
                        "kind": {"type": "string", "enum": ["text", "choice", "confirm", "form"],
                            "description": "Optional: what the answer is. text (the default): free text; \
                            choice: one of `choices` (or several with `multiple`), the result is {\"choice\": …} \
                            or {\"choices\": […]}; confirm: yes or no, the result is {\"confirmed\": true|false}; \
                            form: a value per field of `fields`, the result is an object."},
                        "choices": {"type": "array", "items": {"type": "string"}, "maxItems": 20,
                            "description": "For a choice: the answers to choose from."},
                        "multiple": {"type": "boolean", "description": "For a choice: several may be picked."},
                        "escalate_to": {"type": "array", "items": {"type": "string"}, "maxItems": 10,
                            "description": "Optional: who else to ask, in order, while nobody answers (\"qq:10002\", or a user id on \
                            this chat's platform). Each is asked in their own private chat; the first valid answer is the result."},
                        "ask_to": {"type": "array", "items": {"type": "string"}, "maxItems": 20,
                            "description": "Optional: ask these people at once instead of the task's owner (\"qq:10002\", \
                            or a user id on this chat's platform). In a group each is asked there; otherwise in their own chat. \
                            The result is {\"answers\": [{\"by\": …, \"answer\": …}]}."},
                        "need": {"type": "string", "description": "Optional, with ask_to: how many must answer before you go on: \
                            \"any\" (the default), \"all\", or a number such as \"2\"."},
                        "escalate_after_s": {"type": "integer", "minimum": 60,
                            "description": "Optional, with escalate_to: seconds without an answer before the next person is asked \
                            (default: at the first reminder before the deadline)."},
                        "fields": {"type": "array", "maxItems": 20, "description": "For a form: its fields.",
                            "items": {"type": "object", "properties": {
                                "key": {"type": "string"},
                                "title": {"type": "string"},
                                "type": {"type": "string", "enum": ["string", "integer", "number", "boolean"]},
                                "choices": {"type": "array", "items": {"type": "string"}},
                                "required": {"type": "boolean"}
                            }, "required": ["key", "type"]}}
                    }, "required": ["question"], "additionalProperties": false}),
                    Role::User,
                    Visibility::Essential,
                    Kind::AskUser,
                ),
                Tool::builtin(
                    "send_message",
                    "Send a short progress note to the task owner's chat. Does not wait for a reply.",
                    json!({"type": "object", "properties": {
                        "text": {"type": "string"}
                    }, "required": ["text"], "additionalProperties": false}),
                    Role::User,
                    Visibility::Essential,
                    Kind::SendMessage,
                ),
                Tool::builtin(
                    "list_tools",
                    "List the further tools you can use, with their descriptions.",
                    none(),
                    Role::Guest,
                    Visibility::Essential,
                    Kind::ListTools,
                ),
                Tool::builtin(
                    "get_tool_schema",
                    "Get the JSON schema of a tool's arguments, to call it.",
                    json!({"type": "object", "properties": {
                        "name": {"type": "string"}
                    }, "required": ["name"], "additionalProperties": false}),
                    Role::Guest,
                    Visibility::Essential,
                    Kind::GetToolSchema,
                ),
                Tool::builtin(
                    "current_time",
                    "The current date and time in UTC (RFC 3339).",
                    none(),
                    Role::Guest,
                    Visibility::Discoverable,
                    Kind::CurrentTime,
                ),
                Tool::builtin(
                    "list_my_tasks",
                    "List the tasks of the person this task is for, newest first: id, goal, state, \
                     when it was created, and its result or error once it ended.",
                    json!({"type": "object", "properties": {
                        "states": {"type": "array", "items": {"type": "string", "enum": [
                            "pending", "running", "waiting_input", "paused", "completed", "failed", "cancelled"]},
                            "description": "Optional: only tasks in these states."},
                        "limit": {"type": "integer", "minimum": 1, "description": "Optional: at most this many (50 at most)."}
                    }, "additionalProperties": false}),
                    Role::User,
                    Visibility::Offered,
                    Kind::ListMyTasks,
                ),
                Tool::builtin(
                    "create_subtask",
                    "Start another task for the same person and chat, run by its own agent. With \
                     wait, this task pauses until the subtask ends, and the result is how it ended \
                     ({\"task\", \"state\", \"result\" or \"error\"}); without, the result is its id at once.",
                    json!({"type": "object", "properties": {
                        "goal": {"type": "string", "description": "What the subtask is to do, on its own."},
                        "wait": {"type": "boolean", "description": "Optional: wait for it to end (default false)."},
                        "timeout_s": {"type": "integer", "minimum": 10, "description": "Optional, with wait: the longest wait in seconds."}
                    }, "required": ["goal"], "additionalProperties": false}),
                    Role::User,
                    Visibility::Offered,
                    Kind::CreateSubtask,
                ),
                Tool::builtin(
                    "worker_info",
                    "Which worker runs this task (for operators).",
                    none(),
                    Role::Admin,
                    Visibility::Discoverable,
                    Kind::WorkerInfo,
                ),
            ],
            max_offered: usize::MAX,
            offered: Default::default(),
        }
    }

    /// The built-in tools and `more` (the tools of MCP servers), of which at most `max_offered`
    /// in all are offered by name.
    pub fn with(mut self, more: impl IntoIterator<Item = Tool>, max_offered: usize) -> Self {
        self.tools.extend(more);
        self.max_offered = max_offered;
        self.offered = Default::default();
        self
    }

    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// Whether the `Offered` tools a role may use fit in the list offered by name.
    fn room_for_offered(&self, role: Role) -> bool {
        let shown = self
            .tools
            .iter()
            .filter(|t| t.visibility != Visibility::Discoverable && t.min_role <= role)
            .count();
        shown <= self.max_offered
    }

    /// The tools offered to the model in every request of a task run with `role`, as the JSON
    /// array the request carries: the essential ones (`ask_user` always), and the `Offered` ones
    /// it may use while they fit. `None` when there are none. Made once per registry and role,
    /// not for each run.
    pub fn offered(&self, role: Role) -> Option<&RawValue> {
        self.offered[role_slot(role)]
            .get_or_init(|| {
                let room = self.room_for_offered(role);
                let declarations: Vec<Value> = self
                    .tools
                    .iter()
                    .filter(|t| match t.visibility {
                        Visibility::Essential => true,
                        Visibility::Offered => room && t.min_role <= role,
                        Visibility::Discoverable => false,
                    })
                    .map(Tool::declaration)
                    .collect();
                (!declarations.is_empty()).then(|| {
                    serde_json::value::to_raw_value(&declarations)
                        .expect("a list of JSON values serializes")
                })
            })
            .as_deref()
    }

    /// The tools the role may use that are not offered by name, for `list_tools`.
    pub fn discoverable(&self, role: Role) -> Vec<&Tool> {
        let room = self.room_for_offered(role);
        self.tools
            .iter()
            .filter(|t| t.min_role <= role)
            .filter(|t| match t.visibility {
                Visibility::Essential => false,
                Visibility::Offered => !room,
                Visibility::Discoverable => true,
            })
            .collect()
    }

    /// Checks a call; the error is the text of the error result given to the model.
    pub fn check(&self, call: &ToolCall, role: Role) -> Result<Checked<'_>, String> {
        let tool = self.get(&call.name).ok_or_else(|| {
            format!(
                "error: there is no tool `{}`. Call list_tools to see what you can use.",
                limits::cut(&call.name, 64)
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

    /// The names of the tools offered, read from their JSON.
    fn names(offered: Option<&RawValue>) -> Vec<String> {
        let tools: Vec<Value> = offered.map_or_else(Vec::new, |json| {
            serde_json::from_str(json.get()).expect("a JSON array of declarations")
        });
        tools
            .iter()
            .map(|t| {
                t["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect()
    }

    fn mcp_tool(name: &str, min_role: Role) -> Tool {
        Tool {
            name: name.into(),
            description: "d".into(),
            parameters: json!({"type": "object"}),
            min_role,
            visibility: Visibility::Offered,
            kind: Kind::Mcp {
                server: 0,
                tool: name.into(),
            },
            approval: false,
            approvers: Vec::new(),
            approvals_needed: String::new(),
        }
    }

    #[test]
    fn ask_user_is_always_offered_and_discoverable_tools_are_not() {
        let registry = Registry::builtin();
        let offered = names(registry.offered(Role::User));
        assert!(offered.contains(&"ask_user".to_owned()));
        assert!(!offered.contains(&"current_time".to_owned()));
        assert_eq!(registry.discoverable(Role::User).len(), 1);
        assert_eq!(registry.discoverable(Role::Admin).len(), 2);
    }

    #[test]
    fn server_tools_are_offered_by_name_while_they_fit_then_listed() {
        let more = || {
            vec![
                mcp_tool("s__a", Role::User),
                mcp_tool("s__b", Role::User),
                mcp_tool("s__admin", Role::Admin),
            ]
        };
        // Four essential tools, list_my_tasks, create_subtask and two the user may use fit in
        // eight.
        // What a registry offered before more tools came is made again with them.
        let builtin = Registry::builtin();
        let before = names(builtin.offered(Role::User)).len();
        let roomy = builtin.with(more(), 8);
        let offered = names(roomy.offered(Role::User));
        assert_eq!(offered.len(), before + 2, "{offered:?}");
        assert!(offered.contains(&"s__a".to_owned()) && offered.contains(&"s__b".to_owned()));
        assert!(!offered.contains(&"s__admin".to_owned()), "{offered:?}");
        assert_eq!(roomy.discoverable(Role::User).len(), 1, "current_time only");
        // An admin may use nine: they no longer fit, and list_tools finds them.
        let offered = names(roomy.offered(Role::Admin));
        assert_eq!(offered.len(), 4, "{offered:?}");
        assert!(offered.contains(&"ask_user".to_owned()));
        let listed: Vec<&str> = roomy
            .discoverable(Role::Admin)
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(
            listed,
            [
                "current_time",
                "list_my_tasks",
                "create_subtask",
                "worker_info",
                "s__a",
                "s__b",
                "s__admin"
            ]
        );
        // A call above the owner's role is refused whether offered or not.
        let err = roomy
            .check(&call("s__admin", json!({})), Role::User)
            .unwrap_err();
        assert!(err.contains("needs the role admin"), "{err}");
        assert_eq!(roomy.get("s__a").map(Tool::metric_name), Some("mcp"));
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
