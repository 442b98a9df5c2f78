//! W1, resume latency: one task at a time asks at once; once it waits, the bench answers and
//! times until the worker's next LLM request, carrying the answer, reaches the scripted server.
//! The answer goes over gRPC `AnswerQuestion`, or as a OneBot message frame to the gateway.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::{SinkExt, StreamExt};
use hark_proto::v1 as pb;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};

use super::{Bench, Report, summary};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Grpc,
    OneBot,
}

const BOT: &str = "90001";
const USER: &str = "70001";
const WAIT: Duration = Duration::from_secs(30);

/// A OneBot bot for the bench: confirms every send and reports it.
struct Bot {
    frames: mpsc::Sender<String>,
    sends: mpsc::Receiver<()>,
    next_id: u64,
}

impl Bot {
    async fn connect(bench: &Bench) -> anyhow::Result<Self> {
        let addr = hark_core::config::dial(bench.config.gateway.listen);
        let mut request = format!("ws://{addr}/onebot/v11/ws").into_client_request()?;
        request.headers_mut().insert("x-self-id", BOT.parse()?);
        let token = &bench.config.gateway.onebot.access_token;
        if !token.is_empty() {
            request.headers_mut().insert(
                "authorization",
                format!("Bearer {}", token.expose()).parse()?,
            );
        }
        let (socket, _) = tokio_tungstenite::connect_async_with_config(request, None, true)
            .await
            .with_context(|| format!("cannot connect a bot to the gateway at {addr}"))?;
        let (mut sink, mut stream) = socket.split();
        let (frames, mut outgoing) = mpsc::channel::<String>(64);
        let (sends_tx, sends) = mpsc::channel(64);
        let replies = frames.clone();
        tokio::spawn(async move {
            while let Some(text) = outgoing.recv().await {
                if sink.send(Message::text(text)).await.is_err() {
                    return;
                }
            }
        });
        tokio::spawn(async move {
            let mut id = 1_000_000u64;
            while let Some(Ok(frame)) = stream.next().await {
                let Message::Text(text) = frame else { continue };
                let Ok(action) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                if action.get("action").is_none() {
                    continue;
                }
                id += 1;
                let ok = json!({"status": "ok", "retcode": 0, "data": {"message_id": id}, "echo": action["echo"]});
                let _ = replies.send(ok.to_string()).await;
                let _ = sends_tx.send(()).await;
            }
        });
        Ok(Self {
            frames,
            sends,
            next_id: 1,
        })
    }

    async fn private_message(&mut self, text: &str) -> anyhow::Result<()> {
        self.next_id += 1;
        let event = json!({"time": 1_700_000_000u64, "self_id": BOT, "post_type": "message",
            "message_type": "private", "message_id": self.next_id, "user_id": USER,
            "message": [{"type": "text", "data": {"text": text}}]});
        self.frames
            .send(event.to_string())
            .await
            .context("the bot's connection closed")
    }
}

pub async fn run(
    bench: &mut Bench,
    via: Via,
    warmup: usize,
    rounds: usize,
) -> anyhow::Result<Report> {
    let mut bot = match via {
        Via::OneBot => Some(Bot::connect(bench).await?),
        Via::Grpc => None,
    };
    bench.events.count_only(false);
    let name = match via {
        Via::Grpc => "w1-grpc",
        Via::OneBot => "w1-onebot",
    };
    let mut samples = Vec::with_capacity(rounds);
    for round in 0..warmup + rounds {
        let token = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        let (owner, chat) = match via {
            Via::Grpc => ("bench:w1".to_owned(), None),
            Via::OneBot => (
                format!("qq:{USER}"),
                Some(pb::ChatRoute {
                    platform: "qq".into(),
                    bot_id: BOT.into(),
                    stream: format!("private:{USER}"),
                    origin_message_id: String::new(),
                }),
            ),
        };
        let task = bench
            .api
            .create_task(pb::CreateTaskRequest {
                owner,
                goal: format!("[script:w1] {name} round {round} {token}"),
                chat,
                ..Default::default()
            })
            .await?
            .into_inner()
            .task
            .context("no task")?;
        let waiting = bench.events.when(&task.id, pb::TaskState::WaitingInput);
        let completed = bench.events.when(&task.id, pb::TaskState::Completed);
        tokio::time::timeout(WAIT, waiting)
            .await
            .context("a W1 task did not reach waiting_input within 30s")??;
        if let Some(bot) = &mut bot {
            // The owner answers after seeing the question.
            tokio::time::timeout(WAIT, bot.sends.recv())
                .await
                .context("the question did not reach the bot within 30s")?;
        }
        let answer = format!("yes-{token}");
        let arrival = bench.arrivals.when(&answer);
        let t0 = Instant::now();
        match &mut bot {
            None => {
                bench
                    .api
                    .answer_question(pb::AnswerQuestionRequest {
                        task_id: task.id.clone(),
                        answer: answer.clone(),
                        ..Default::default()
                    })
                    .await?;
            }
            Some(bot) => bot.private_message(&answer).await?,
        }
        let t1 = tokio::time::timeout(WAIT, arrival)
            .await
            .context("the resumed LLM call did not arrive within 30s")??;
        tokio::time::timeout(WAIT, completed)
            .await
            .context("a W1 task did not complete within 30s")??;
        if let Some(bot) = &mut bot {
            // The final answer is posted too.
            let _ = tokio::time::timeout(Duration::from_secs(5), bot.sends.recv()).await;
        }
        if round >= warmup {
            samples.push(t1.saturating_duration_since(t0));
        }
    }
    let stats = summary(&mut samples);
    let mut json = json!({"workload": name, "rounds": rounds, "warmup": warmup});
    if let (Some(obj), Some(s)) = (json.as_object_mut(), stats.as_object()) {
        obj.extend(s.clone());
    }
    let how = match via {
        Via::Grpc => "answer over gRPC",
        Via::OneBot => "answer as a OneBot frame",
    };
    let rows = vec![(
        name.to_owned(),
        format!("resume latency, {how} → next LLM request (p50 / p90 / p99)"),
        format!(
            "{} / {} / {} ms",
            stats["p50_ms"], stats["p90_ms"], stats["p99_ms"]
        ),
    )];
    Ok(Report { json, rows })
}
