//! The bench's child processes (`delay-bridge-bench __child ...`): a plain rdkafka producer, an
//! amqprs publisher, the HTTP client alone and the claim/settle client alone, each in a process of
//! its own so that /proc gives its CPU time without the load generator's, the consumer's or the
//! bridge's.

use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use delay_bridge::wire::{HEADER_ATTEMPT, HEADER_DUE_MS, HEADER_ID, HEADER_TRIGGER};
use futures_util::stream::{FuturesUnordered, StreamExt};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::future_producer::OwnedDeliveryResult;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::amqprs_ceiling::{RawPublisher, Unconfirmed};
use super::ceiling::Window;
use super::process::process_cpu_seconds;
use super::redis_ops;
use super::shape::{FormatArg, PayloadArg, Shape};
use super::tally::payload;

/// The first argument that makes the bench a child process.
const CHILD: &str = "__child";
/// Messages produced before the timing starts (connections, metadata, first batches).
const WARM_UP: u64 = 1000;

#[derive(Debug, Parser)]
#[command(name = "delay-bridge-bench __child")]
struct ChildArgs {
    #[command(subcommand)]
    command: ChildCommand,
}

/// What a publishing child sends: how many messages, their payload size, and the sequence
/// number of the first.
#[derive(Debug, clap::Args)]
struct Sent {
    #[arg(long)]
    messages: u64,
    #[arg(long)]
    payload_bytes: usize,
    #[arg(long)]
    base: u64,
}

#[derive(Debug, Subcommand)]
enum ChildCommand {
    /// Produce `messages` records like the bridge's (payload, its four headers, no key) with a
    /// plain `FutureProducer`, at most `window` awaiting their delivery report.
    KafkaProducer {
        #[arg(long)]
        brokers: String,
        #[arg(long)]
        topic: String,
        #[command(flatten)]
        sent: Sent,
        #[arg(long)]
        window: usize,
        /// librdkafka properties, `name=value`.
        #[arg(long = "property")]
        properties: Vec<String>,
    },
    /// Publish `messages` messages like the bridge's (persistent, mandatory, its headers and
    /// message id) with the raw amqprs publisher and publisher confirms, on `channels` channels
    /// with at most `window` unconfirmed.
    AmqprsPublisher {
        #[arg(long)]
        url: String,
        #[arg(long)]
        exchange: String,
        #[arg(long)]
        routing_key: String,
        #[command(flatten)]
        sent: Sent,
        #[arg(long)]
        channels: usize,
        #[arg(long)]
        window: usize,
        /// The bridge's batch: messages published before their confirms are awaited.
        #[arg(long)]
        batch: usize,
    },
    /// POST `messages` bench payloads to `url` with the HTTP ceiling's client, as many at once
    /// as the bench sink's `max_concurrency`.
    HttpClient {
        #[arg(long)]
        url: String,
        #[command(flatten)]
        sent: Sent,
    },
    /// Drain the loaded queue `key` with the claim and settle scripts alone.
    ClaimSettle {
        #[arg(long)]
        redis_url: String,
        #[arg(long)]
        key: String,
        #[arg(long)]
        hash: bool,
        #[arg(long)]
        workers: usize,
        #[arg(long)]
        batch: usize,
        #[arg(long)]
        messages: u64,
    },
}

/// What a child measured: its own CPU time over the timed part.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct ChildRun {
    /// Messages produced or drained.
    pub messages: u64,
    /// Wall-clock seconds of the timed part.
    pub seconds: f64,
    /// User + system CPU of the child process over the same part.
    pub cpu_seconds: f64,
}

impl ChildRun {
    /// Runs `work` (`messages` messages), timed by the clock and by this process's CPU.
    async fn measure<T>(
        messages: u64,
        work: impl std::future::Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<(Self, T)> {
        let pid = std::process::id();
        let cpu = process_cpu_seconds(pid)?;
        let start = Instant::now();
        let out = work.await?;
        let seconds = start.elapsed().as_secs_f64();
        let run = ChildRun {
            messages,
            seconds,
            cpu_seconds: process_cpu_seconds(pid)? - cpu,
        };
        Ok((run, out))
    }

    /// CPU seconds per 100,000 messages.
    pub fn cpu_per_100k(&self) -> f64 {
        self.cpu_seconds * 100_000.0 / self.messages.max(1) as f64
    }
}

/// When this process is a child, runs it and returns its exit code.
pub async fn run_if_child() -> Option<i32> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) != Some(CHILD) {
        return None;
    }
    let child = ChildArgs::parse_from(&args[1..]);
    let result = match child.command {
        ChildCommand::KafkaProducer {
            brokers,
            topic,
            sent,
            window,
            properties,
        } => {
            let producer = Plain {
                brokers,
                topic,
                payload_bytes: sent.payload_bytes,
                window,
                properties,
            };
            producer.run(sent.base, sent.messages).await
        }
        ChildCommand::AmqprsPublisher {
            url,
            exchange,
            routing_key,
            sent,
            channels,
            window,
            batch,
        } => {
            let u = Unconfirmed { channels, window };
            let target = (url.as_str(), exchange.as_str(), routing_key.as_str());
            amqprs_publisher(target, &sent, u, batch).await
        }
        ChildCommand::HttpClient { url, sent } => http_client(&url, &sent).await,
        ChildCommand::ClaimSettle {
            redis_url,
            key,
            hash,
            workers,
            batch,
            messages,
        } => claim_settle(&redis_url, &key, hash, workers, batch, messages).await,
    };
    Some(match result.and_then(|r| Ok(serde_json::to_string(&r)?)) {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    })
}

/// Runs this executable as a child with `args`, under `wrapper` (nothing, or a profiler's
/// command line that runs the program after it); returns what it measured.
pub async fn spawn(wrapper: &[String], args: Vec<String>) -> anyhow::Result<ChildRun> {
    let exe = std::env::current_exe().context("locating delay-bridge-bench")?;
    let mut command = super::process::wrapped(wrapper, &exe);
    command.arg(CHILD).args(&args).stdin(Stdio::null());
    let out = tokio::task::spawn_blocking(move || command.output()).await??;
    if !out.status.success() {
        bail!(
            "the child exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().context("the child printed nothing")?;
    Ok(serde_json::from_str(line)?)
}

/// A plain rdkafka producer.
struct Plain {
    brokers: String,
    topic: String,
    payload_bytes: usize,
    window: usize,
    properties: Vec<String>,
}

impl Plain {
    async fn run(&self, base: u64, n: u64) -> anyhow::Result<ChildRun> {
        let mut cc = ClientConfig::new();
        for p in &self.properties {
            let (k, v) = p.split_once('=').context("a property is name=value")?;
            cc.set(k, v);
        }
        cc.set("bootstrap.servers", &self.brokers);
        let producer: FutureProducer = cc.create().context("creating the producer")?;
        self.produce(&producer, base, WARM_UP.min(n)).await?;
        let timed = self.produce(&producer, base + WARM_UP, n);
        let (run, ()) = ChildRun::measure(n, timed).await?;
        producer.flush(Duration::from_secs(10))?;
        Ok(run)
    }

    /// Produces `n` records from sequence `base`, each confirmed by its delivery report.
    async fn produce(&self, producer: &FutureProducer, base: u64, n: u64) -> anyhow::Result<()> {
        let mut pending = FuturesUnordered::new();
        let (mut due, mut id) = (String::new(), String::new());
        let due_ms = super::tally::now_us() / 1000;
        for seq in base..base + n {
            let body = payload(seq, self.payload_bytes);
            due.clear();
            due.push_str(&due_ms.to_string());
            id.clear();
            id.push_str(&format!("{seq:016x}"));
            let headers = OwnedHeaders::new_with_capacity(4)
                .insert(Header {
                    key: HEADER_TRIGGER,
                    value: Some("bench-0"),
                })
                .insert(Header {
                    key: HEADER_DUE_MS,
                    value: Some(&due),
                })
                .insert(Header {
                    key: HEADER_ATTEMPT,
                    value: Some("1"),
                })
                .insert(Header {
                    key: HEADER_ID,
                    value: Some(&id),
                });
            let mut record = FutureRecord::<(), [u8]>::to(&self.topic)
                .payload(&body)
                .headers(headers);
            loop {
                if pending.len() >= self.window {
                    settle(pending.next().await)?;
                }
                match producer.send_result(record) {
                    Ok(delivery) => {
                        pending.push(delivery);
                        break;
                    }
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                        record = back;
                        match pending.next().await {
                            Some(d) => settle(Some(d))?,
                            None => tokio::time::sleep(Duration::from_millis(1)).await,
                        }
                    }
                    Err((e, _)) => return Err(e.into()),
                }
            }
        }
        while let Some(d) = pending.next().await {
            settle(Some(d))?;
        }
        Ok(())
    }
}

/// A delivery report: Ok when the broker has the record.
fn settle<E>(report: Option<Result<OwnedDeliveryResult, E>>) -> anyhow::Result<()> {
    match report {
        Some(Ok(Ok(_))) | None => Ok(()),
        Some(Ok(Err((e, _)))) => Err(e.into()),
        Some(Err(_)) => bail!("a delivery report was dropped"),
    }
}

/// Drains `key` with the claim and settle scripts, timed from the first claim.
async fn claim_settle(
    redis_url: &str,
    key: &str,
    hash: bool,
    workers: usize,
    batch: usize,
    n: u64,
) -> anyhow::Result<ChildRun> {
    let conn = delay_bridge::parts::redis::conn::Conn::open(redis_url).await?;
    let shape = Shape {
        payload: if hash {
            PayloadArg::Hash
        } else {
            PayloadArg::Inline
        },
        format: FormatArg::Raw,
        payload_bytes: 0,
    };
    let timed = redis_ops::claim_ceiling(conn, key, &shape, workers, batch);
    let (run, claimed) = ChildRun::measure(n, timed).await?;
    anyhow::ensure!(claimed == n, "claimed {claimed} of {n} members");
    Ok(run)
}

/// The HTTP ceiling's client alone: `WARM_UP` requests (connections), then `sent` timed.
async fn http_client(url: &str, sent: &Sent) -> anyhow::Result<ChildRun> {
    let (n, payload_bytes, base) = (sent.messages, sent.payload_bytes, sent.base);
    let client = super::http::client()?;
    let due_ms = super::tally::now_us() / 1000;
    super::http::post_all(&client, url, base, WARM_UP.min(n), payload_bytes, due_ms).await?;
    let timed = super::http::post_all(&client, url, base + WARM_UP, n, payload_bytes, due_ms);
    Ok(ChildRun::measure(n, timed).await?.0)
}

/// The amqprs publisher alone: `WARM_UP` messages (connection, channels, the queue's first
/// writes), then `sent` timed until the broker confirmed every one.
async fn amqprs_publisher(
    (url, exchange, routing_key): (&str, &str, &str),
    sent: &Sent,
    u: Unconfirmed,
    batch: usize,
) -> anyhow::Result<ChildRun> {
    let n = sent.messages;
    let window = |base, count| Window {
        key: "delay-bridge-bench:cost".to_string(),
        base,
        count,
        payload_bytes: sent.payload_bytes,
        due_ms: super::tally::now_us() / 1000,
        batch,
    };
    let timeout = Duration::from_secs(60) + Duration::from_millis(n);
    let mut publisher = RawPublisher::connect(url, exchange, routing_key, u).await?;
    publisher
        .publish(&window(sent.base, WARM_UP.min(n)), timeout)
        .await?;
    let timed_window = window(sent.base + WARM_UP, n);
    let timed = publisher.publish(&timed_window, timeout);
    let (run, _) = ChildRun::measure(n, timed).await?;
    publisher.close().await;
    Ok(run)
}
