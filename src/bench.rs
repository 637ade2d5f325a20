//! The load generator and measurement harness behind `delay-bridge bench`.
//!
//! Everything runs against the local Redis and one broker in a single run, so each bridge figure
//! sits next to the ceiling it is judged by: a plain publisher with the bridge's confirm
//! semantics (the broker's limit) and the claim/settle scripts alone (Redis's limit). The bridge
//! under test is this executable started as `run --config` in a child process, so its CPU time
//! and memory come from /proc without the load generator's and consumer's.

mod amqp;
mod kafka;
mod phases;
mod process;
mod redis_ops;
mod report;
mod tally;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use redis::aio::MultiplexedConnection;

use self::amqp::AmqpBench;
use self::kafka::KafkaBench;
use self::report::Report;
use self::tally::Tally;
use crate::config::TriggerConfig;
use crate::secret::redact_url;

/// Which broker the bridge forwards to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SinkKind {
    /// RabbitMQ.
    Amqp,
    /// Kafka.
    Kafka,
}

/// Phases that `--skip` can leave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Phase {
    /// The plain publisher (broker ceiling).
    Broker,
    /// The claim and settle scripts alone (Redis ceiling).
    Redis,
    /// The bridge draining `--messages` due now.
    Forward,
    /// The steady load and its lateness.
    Lateness,
    /// Redis commands and CPU with nothing due.
    Idle,
}

/// `delay-bridge bench` options.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Broker to forward to.
    #[arg(long, value_enum, default_value = "amqp")]
    pub sink: SinkKind,
    /// RabbitMQ URL (a durable exchange and queue named after the run are created and deleted).
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp_url: String,
    /// Kafka bootstrap servers (a topic named after the run is created and deleted).
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub kafka_brokers: String,
    /// Partitions of the bench topic.
    #[arg(long, default_value_t = 1)]
    pub kafka_partitions: i32,
    /// Redis URL (keys named after the run are created and deleted).
    #[arg(long, default_value = "redis://127.0.0.1:6379/0")]
    pub redis_url: String,
    /// Messages in the ceiling and forwarding phases.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub messages: u64,
    /// Bytes per payload (at least 16: the payload starts with its sequence number).
    #[arg(long, default_value_t = 100)]
    pub payload_bytes: usize,
    /// Steady load: messages scheduled per second.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub rate: u64,
    /// Steady load: how long to schedule for.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "20s")]
    pub duration: Duration,
    /// Also run the steady load with keyspace notifications off (changes
    /// notify-keyspace-events for every client of the Redis for that long).
    #[arg(long)]
    pub no_notify: bool,
    /// Triggers of the idle bridge.
    #[arg(long, default_value_t = 10)]
    pub idle_triggers: usize,
    /// How long idle Redis commands and CPU are counted.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub idle_window: Duration,
    /// Also measure bridge RSS while `--big-messages` are scheduled in the future (slow to load).
    #[arg(long)]
    pub big: bool,
    /// Members scheduled for `--big`.
    #[arg(long, default_value_t = 1_000_000)]
    pub big_messages: u64,
    /// Phases to leave out (repeat or comma-separate).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub skip: Vec<Phase>,
    /// Extra `key = value` TOML lines for every bench trigger, e.g. `--trigger-set 'batch = 512'`.
    #[arg(long = "trigger-set")]
    pub trigger_set: Vec<String>,
    /// Log filter of the bridge under test.
    #[arg(long, default_value = "warn")]
    pub bridge_log_level: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// The messages a ceiling publisher sends and how it pipelines them.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    /// Queue name the message ids are derived from, as the bridge does.
    key: String,
    /// First sequence number.
    base: u64,
    /// Messages.
    count: u64,
    /// Bytes per payload.
    payload_bytes: usize,
    /// The due time every header carries.
    due_ms: i64,
    /// Concurrent publishers (the bridge's workers).
    workers: usize,
    /// Messages published before awaiting their confirms (the bridge's batch); each
    /// publisher keeps `worker::MAX_IN_FLIGHT` such windows going, as a worker does.
    batch: usize,
}

/// The broker side of the bench.
enum Broker {
    Amqp(AmqpBench),
    Kafka(KafkaBench),
}

impl Broker {
    fn sink_toml(&self) -> String {
        match self {
            Broker::Amqp(b) => b.sink_toml(),
            Broker::Kafka(b) => b.sink_toml(),
        }
    }

    fn route_toml(&self) -> String {
        match self {
            Broker::Amqp(b) => b.route_toml(),
            Broker::Kafka(b) => b.route_toml(),
        }
    }

    async fn publish_ceiling(&self, w: &Window) -> anyhow::Result<tokio::time::Instant> {
        match self {
            Broker::Amqp(b) => b.publish_ceiling(w).await,
            Broker::Kafka(b) => b.publish_ceiling(w).await,
        }
    }

    async fn cleanup(&self) -> anyhow::Result<()> {
        match self {
            Broker::Amqp(b) => b.cleanup().await,
            Broker::Kafka(b) => b.cleanup().await,
        }
    }
}

/// What every phase shares, and what has to be undone at the end.
struct Bench {
    args: BenchArgs,
    run_id: String,
    client: redis::Client,
    conn: MultiplexedConnection,
    redis_port: u16,
    broker: Broker,
    tally: Arc<Tally>,
    dir: PathBuf,
    /// The bench trigger as the bridge resolves it (defaults plus `--trigger-set`).
    trigger: TriggerConfig,
    /// Queues created, deleted at the end.
    keys: Mutex<Vec<String>>,
    /// `notify-keyspace-events` before the run, restored at the end.
    original_flags: String,
    next_base: AtomicU64,
}

/// Runs the benchmark; returns the process exit code (1 when a phase failed).
pub async fn run(args: BenchArgs) -> anyhow::Result<i32> {
    anyhow::ensure!(
        args.payload_bytes >= tally::SEQ_DIGITS,
        "--payload-bytes must be at least {}",
        tally::SEQ_DIGITS
    );
    anyhow::ensure!(
        args.idle_triggers >= 1,
        "--idle-triggers must be at least 1"
    );
    let bench = Bench::setup(args).await?;
    let mut report = Report::default();
    let outcome = tokio::select! {
        () = bench.run_phases(&mut report) => Ok(()),
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    bench.cleanup().await;
    outcome?;
    if bench.args.json {
        println!("{}", report.json()?);
    } else {
        print!("{}", report.table());
    }
    Ok(if report.errors.is_empty() { 0 } else { 1 })
}

impl Bench {
    async fn setup(args: BenchArgs) -> anyhow::Result<Self> {
        let run_id = format!("{:08x}", rand::random::<u32>());
        let client = redis::Client::open(args.redis_url.as_str()).context("--redis-url")?;
        // The idle phase tells the bridge's Redis connections apart by this remote port.
        let redis_port = match &client.get_connection_info().addr {
            redis::ConnectionAddr::Tcp(_, port) | redis::ConnectionAddr::TcpTls { port, .. } => {
                *port
            }
            redis::ConnectionAddr::Unix(_) => 0,
        };
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .with_context(|| format!("connecting to {}", redact_url(&args.redis_url)))?;
        let original_flags = redis_ops::notify_flags(&mut conn)
            .await
            .context("reading notify-keyspace-events")?;
        let tally = Arc::new(Tally::default());
        let name = format!("delay-bridge-bench-{run_id}");
        let broker = match args.sink {
            SinkKind::Amqp => {
                Broker::Amqp(AmqpBench::setup(&args.amqp_url, &name, tally.clone()).await?)
            }
            SinkKind::Kafka => Broker::Kafka(
                KafkaBench::setup(
                    &args.kafka_brokers,
                    &name,
                    args.kafka_partitions,
                    tally.clone(),
                )
                .await?,
            ),
        };
        let dir = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(&dir)?;
        let probe = BridgeToml {
            args: &args,
            broker: &broker,
            keys: &["probe".to_string()],
            notifications: true,
            metrics_port: 0,
        }
        .write(&dir, "probe");
        let trigger = match probe {
            Ok((_, c)) => c.triggers[0].clone(),
            Err(e) => {
                let _ = broker.cleanup().await;
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        Ok(Self {
            args,
            run_id,
            client,
            conn,
            redis_port,
            broker,
            tally,
            dir,
            trigger,
            keys: Mutex::new(Vec::new()),
            original_flags,
            next_base: AtomicU64::new(1),
        })
    }

    /// A fresh queue key for `what`, deleted at the end.
    fn new_key(&self, what: &str) -> String {
        let key = format!("delay-bridge-bench:{{{}-{what}}}", self.run_id);
        self.keys
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(key.clone());
        key
    }

    /// First sequence number of a new phase: phases never share payloads.
    fn next_base(&self) -> u64 {
        self.next_base.fetch_add(1, Ordering::Relaxed) * 1_000_000_000_000
    }

    async fn cleanup(&self) {
        let keys = std::mem::take(&mut *self.keys.lock().unwrap_or_else(|e| e.into_inner()));
        let mut conn = self.conn.clone();
        for key in keys {
            let staging = format!("{key}:staging");
            let gone = async {
                redis_ops::unlink_queue(&mut conn, &key).await?;
                redis::cmd("UNLINK")
                    .arg(&staging)
                    .query_async::<()>(&mut conn)
                    .await
            };
            if let Err(e) = gone.await {
                eprintln!("warning: could not delete {key}: {e}");
            }
        }
        if let Ok(now) = redis_ops::notify_flags(&mut conn).await {
            if now != self.original_flags {
                if let Err(e) = redis_ops::set_notify_flags(&mut conn, &self.original_flags).await {
                    eprintln!(
                        "warning: could not restore notify-keyspace-events to {:?}: {e}",
                        self.original_flags
                    );
                }
            }
        }
        if let Err(e) = self.broker.cleanup().await {
            eprintln!("warning: could not delete the bench queue/topic: {e:#}");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The configuration of a bridge under test: one trigger per key on the bench sink.
struct BridgeToml<'a> {
    args: &'a BenchArgs,
    broker: &'a Broker,
    keys: &'a [String],
    notifications: bool,
    metrics_port: u16,
}

impl BridgeToml<'_> {
    fn render(&self) -> String {
        use self::amqp::toml_str;
        let mut out = format!(
            "[redis]\nurl = {}\nenable_keyspace_events = {}\n\n\
             [metrics]\nlisten = \"127.0.0.1:{}\"\n\n\
             [log]\nlevel = {}\n\n\
             [shutdown]\ntimeout = \"10s\"\n\n{}\n",
            toml_str(&self.args.redis_url),
            self.notifications,
            self.metrics_port,
            toml_str(&self.args.bridge_log_level),
            self.broker.sink_toml(),
        );
        for (i, key) in self.keys.iter().enumerate() {
            out.push_str(&format!(
                "[[triggers]]\nname = \"bench-{i}\"\nkey = {}\nsink = \"bench\"\n{}",
                toml_str(key),
                self.broker.route_toml()
            ));
            for line in &self.args.trigger_set {
                out.push_str(line);
                out.push('\n');
            }
            out.push('\n');
        }
        out
    }

    /// Writes the file `<dir>/<name>.toml` and loads it the way `run --config` will.
    fn write(
        &self,
        dir: &std::path::Path,
        name: &str,
    ) -> anyhow::Result<(PathBuf, crate::config::Config)> {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, self.render())?;
        let config =
            crate::config::load(&path).map_err(|e| anyhow::anyhow!("bench bridge config: {e}"))?;
        Ok((path, config))
    }
}
