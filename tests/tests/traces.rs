//! Traces over OTLP from separate `hark gateway`, `hark control` and `hark worker` processes,
//! received by a real OTLP/gRPC trace collector inside the test (the collector service of
//! `opentelemetry-proto` on tonic): one chat message's work is one trace across the three
//! services, the NATS spans follow the messaging conventions, the model call the GenAI ones, and
//! the run the answer resumes links the span that asked.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use hark_e2e::{Env, bot::Bot};
use hark_worker::scripted::{Script, ScriptedLlm, Step};
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::{KeyValue, any_value},
    trace::v1::Span,
};

const WAIT: Duration = Duration::from_secs(30);

/// One received span and the service that sent it.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    /// `deployment.environment` of the resource that sent it.
    environment: Option<String>,
    span: Span,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<String> {
        value_of(&self.span.attributes, key)
    }
}

fn value_of(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?;
    Some(match value.value.as_ref()? {
        any_value::Value::StringValue(s) => s.clone(),
        any_value::Value::IntValue(n) => n.to_string(),
        any_value::Value::BoolValue(b) => b.to_string(),
        any_value::Value::DoubleValue(d) => d.to_string(),
        other => format!("{other:?}"),
    })
}

#[derive(Debug, Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap_or_else(|p| p.into_inner());
        for resource in request.into_inner().resource_spans {
            let of = |key: &str| {
                resource
                    .resource
                    .as_ref()
                    .and_then(|r| value_of(&r.attributes, key))
            };
            let service = of("service.name").unwrap_or_default();
            let environment = of("deployment.environment");
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push(Received {
                        service: service.clone(),
                        environment: environment.clone(),
                        span,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits until the spans received hold `holds`, and returns what it found.
    async fn until<T>(&self, what: &str, holds: impl Fn(&[Received]) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if let Some(found) = holds(&self.spans()) {
                return found;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "never: {what}; received {:#?}",
                self.spans()
                    .iter()
                    .map(|r| (&r.service, &r.span.name))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test]
async fn one_chat_round_trip_is_traced_across_the_three_services_and_the_resume_links_the_ask() {
    hark_core::install_crypto();
    let collector = Collector::default();
    // Bound before any process starts, so that no export finds nothing listening.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port for the collector");
    let port = listener.local_addr().expect("addr").port();
    {
        let collector = collector.clone();
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(collector))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
                .await
                .expect("the collector serves");
        });
    }
    let llm = ScriptedLlm::with_default(Script::new(vec![
        Step::ask("Which city?"),
        Step::say("The weather in {answer} is sunny."),
    ]))
    .await
    .expect("scripted LLM");
    let mut env = Env::new().await;
    env.set("HARK_LLM__BASE_URL", &llm.base_url());
    env.set("HARK_LLM__MODEL", "scripted-model");
    env.set("HARK_GATEWAY__ONEBOT__ACCESS_TOKEN", "tok");
    // The standard variables, as any OpenTelemetry user sets them.
    env.set(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        &format!("http://127.0.0.1:{port}"),
    );
    env.set("OTEL_BSP_SCHEDULE_DELAY", "100");
    env.set("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=e2e");
    env.set("HARK_LOG__FORMAT", "json");
    env.set("HARK_LOG__FILTER", "info,hark_control=debug");
    let mut control = env.spawn(&["control"], &[]);
    env.client().await;
    let mut gateway = env.spawn(&["gateway"], &[]);
    let mut worker = env.spawn(&["worker", "--id", "w1"], &[]);
    let mut bot = Bot::connect(env.gateway_port().await, 42, "tok").await;

    bot.group_message(777, 100, "/task new check the weather")
        .await;
    let question = bot
        .expect("the question", WAIT, |s| s.text.contains("Which city?"))
        .await;
    bot.group_message_quoting(777, 100, "Paris", Some(question.message_id))
        .await;
    bot.expect("the result", WAIT, |s| s.text.contains("sunny"))
        .await;

    // The chat message that started the task starts one trace, and its work in every service
    // is in it.
    let services = ["hark-gateway", "hark-control", "hark-worker"];
    let trace = collector
        .until(
            "one trace across the gateway, task-control and the worker",
            |spans| {
                spans
                    .iter()
                    .filter(|r| r.service == "hark-gateway" && r.span.name == "receive qq message")
                    .map(|r| r.span.trace_id.clone())
                    .find(|trace| {
                        services.iter().all(|service| {
                            spans
                                .iter()
                                .any(|r| &r.service == service && &r.span.trace_id == trace)
                        })
                    })
            },
        )
        .await;
    // A span is exported when it ends, a parent after its children: wait until every parent in the
    // trace has arrived (none dangles), across the processes, and the trace has one root.
    let sends = [
        ("hark-control", format!("send {}.task.run", env.namespace)),
        // The worker takes the run job in the trace, whether the job came through the run
        // queue or was handed to its poll, and its control requests are sends of their own.
        ("hark-worker", format!("process {}.task.run", env.namespace)),
        ("hark-worker", format!("send {}.control.ask", env.namespace)),
        (
            "hark-control",
            format!("send {}.chat.out.qq.42", env.namespace),
        ),
    ];
    let spans = collector
        .until(
            "every span of the trace, its parents and its sends",
            |spans| {
                let in_trace: Vec<&Received> =
                    spans.iter().filter(|r| r.span.trace_id == trace).collect();
                let ids: Vec<&Vec<u8>> = in_trace.iter().map(|r| &r.span.span_id).collect();
                let whole = in_trace.iter().all(|r| {
                    r.span.parent_span_id.is_empty() || ids.contains(&&r.span.parent_span_id)
                });
                let roots = in_trace
                    .iter()
                    .filter(|r| r.span.parent_span_id.is_empty())
                    .count();
                let sent = sends.iter().all(|(service, name)| {
                    in_trace
                        .iter()
                        .any(|r| r.service == *service && &r.span.name == name)
                });
                (whole && roots == 1 && sent).then(|| spans.to_vec())
            },
        )
        .await;
    let in_trace: Vec<&Received> = spans.iter().filter(|r| r.span.trace_id == trace).collect();

    // JSON logs name the trace and the span they were written in.
    let hex: String = trace.iter().map(|b| format!("{b:02x}")).collect();
    let logged = control
        .wait_for_output(&format!("\"trace_id\":\"{hex}\""), WAIT)
        .await;
    let line = logged
        .lines()
        .find(|l| l.contains(&hex))
        .expect("a log line of the trace");
    let line: serde_json::Value = serde_json::from_str(line).expect("a JSON log line");
    let span_ids: Vec<String> = in_trace
        .iter()
        .map(|r| r.span.span_id.iter().map(|b| format!("{b:02x}")).collect())
        .collect();
    let logged_span = line["span"]["span_id"]
        .as_str()
        .or_else(|| {
            line["spans"]
                .as_array()
                .and_then(|s| s.iter().find_map(|s| s["span_id"].as_str()))
        })
        .expect("the line names its span");
    assert!(
        span_ids.iter().any(|id| id == logged_span),
        "{logged_span} is a span of the trace"
    );

    // NATS spans by the messaging conventions.
    let process = in_trace
        .iter()
        .find(|r| r.service == "hark-control" && r.span.name.starts_with("process "))
        .expect("task-control processes the chat message");
    assert_eq!(
        process.attribute("messaging.system").as_deref(),
        Some("nats")
    );
    assert_eq!(
        process.attribute("messaging.operation.type").as_deref(),
        Some("process")
    );
    assert!(
        process
            .attribute("messaging.destination.name")
            .is_some_and(|d| d.contains(".chat.in.qq")),
        "{:?}",
        process.attribute("messaging.destination.name")
    );
    assert!(
        in_trace.iter().any(|r| r.service == "hark-gateway"
            && r.span.name.starts_with("send ")
            && r.attribute("messaging.operation.type").as_deref() == Some("send")),
        "the gateway's publish to CHAT_IN is a send span"
    );
    // The model call by the GenAI conventions.
    let chat = collector
        .until("a model call span", |spans| {
            spans
                .iter()
                .find(|r| r.service == "hark-worker" && r.span.name == "chat scripted-model")
                .cloned()
        })
        .await;
    assert_eq!(
        chat.attribute("gen_ai.operation.name").as_deref(),
        Some("chat")
    );
    assert_eq!(
        chat.attribute("gen_ai.request.model").as_deref(),
        Some("scripted-model")
    );
    assert_eq!(
        chat.attribute("gen_ai.provider.name").as_deref(),
        Some("127.0.0.1")
    );
    assert!(chat.attribute("gen_ai.usage.input_tokens").is_some());
    let agent = collector
        .until("an invoke_agent span", |spans| {
            spans
                .iter()
                .find(|r| r.span.name == "invoke_agent hark")
                .cloned()
        })
        .await;
    assert_eq!(
        agent.attribute("gen_ai.operation.name").as_deref(),
        Some("invoke_agent")
    );

    // The wait for a person is a link: the run the answer resumes links the span that asked.
    let (asked, resumed) = collector
        .until("the resume's link to the ask", |spans| {
            let asks: Vec<&Received> = spans
                .iter()
                .filter(|r| r.service == "hark-control" && r.span.name.ends_with(".control.ask"))
                .collect();
            spans
                .iter()
                .filter(|r| r.span.name == "invoke_agent hark")
                .find_map(|run| {
                    let link = run.span.links.first()?;
                    let ask = asks.iter().find(|a| {
                        a.span.span_id == link.span_id && a.span.trace_id == link.trace_id
                    })?;
                    Some(((*ask).clone(), run.clone()))
                })
        })
        .await;
    assert_ne!(
        asked.span.trace_id, resumed.span.trace_id,
        "the resume runs in the answer's trace, not in the ask's"
    );
    assert!(
        in_trace
            .iter()
            .all(|r| r.environment.as_deref() == Some("e2e")),
        "OTEL_RESOURCE_ATTRIBUTES reaches every service's resource"
    );

    worker.stop().await;
    gateway.stop().await;
    control.stop().await;
    drop(llm);
    env.cleanup().await;
}
