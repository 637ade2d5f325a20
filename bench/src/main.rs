//! `delay-bridge-bench`: the load generator and measurement harness of delay-bridge (also run
//! as `delay-bridge bench`).
//!
//! Everything runs against the local Redis and one broker in a single run, so each bridge figure
//! sits next to the ceiling it is judged by: the bridge's own sink publishing with nothing else
//! (the broker's limit) and the claim/settle scripts alone (Redis's limit). The bridge under
//! test is the `delay-bridge` binary next to this one (or `--bridge`), started as
//! `run --config` in a child process, so its CPU time and memory come from /proc without the
//! load generator's and consumer's.

mod amqp;
mod ceiling;
mod cluster;
mod ingress;
mod kafka;
mod phases;
mod process;
mod redis_ops;
mod report;
mod shape;
mod tally;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use delay_bridge::config::{Config, Destination, SinkConfig, TriggerConfig};
use delay_bridge::secret::redact_url;
use redis::aio::MultiplexedConnection;

use self::amqp::AmqpBench;
use self::kafka::KafkaBench;
use self::report::Report;
use self::tally::Tally;

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
    /// The bridge's sink publishing on its own (broker ceiling).
    Broker,
    /// The claim and settle scripts alone (Redis ceiling).
    Redis,
    /// The bridge draining `--messages` due now.
    Forward,
    /// AMQP: the same into a queue nobody consumes, next to a plain publisher doing so.
    Backlog,
    /// The steady load and its lateness.
    Lateness,
    /// Redis commands and CPU with nothing due.
    Idle,
    /// The bridge SIGKILLed `--kills` times while draining `--crash-messages` due at once.
    Crash,
    /// AMQP: `--ingress-messages` published to an ingress exchange with a delay, taken in by
    /// the bridge and delivered (intake rate, end-to-end lateness).
    Ingress,
}

/// Measure delay-bridge's forwarding rate, lateness and idle cost against the local Redis and a
/// broker, next to what Redis and the broker do on their own.
#[derive(Debug, Parser)]
#[command(name = "delay-bridge-bench", version, about)]
pub struct BenchArgs {
    /// The `delay-bridge` binary under test (default: the one next to this executable).
    #[arg(long, value_name = "PATH")]
    pub bridge: Option<PathBuf>,
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
    /// Where message bodies live: `inline` (the member) or `hash` (ids, bodies in `K:bodies`).
    #[arg(long, value_enum, default_value = "inline")]
    pub payload: shape::PayloadArg,
    /// What the stored payload is: `raw` (the body) or `envelope` (a JSON envelope around it).
    #[arg(long, value_enum, default_value = "raw")]
    pub format: shape::FormatArg,
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
    #[arg(long, default_value_t = 10_000)]
    pub idle_triggers: usize,
    /// How long idle Redis commands and CPU are counted.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub idle_window: Duration,
    /// Also measure bridge RSS while `--big-messages` are scheduled in the future (slow to load).
    #[arg(long)]
    pub big: bool,
    /// Members scheduled for `--big`.
    #[arg(long, default_value_t = 1_000_000)]
    pub big_messages: u64,
    /// Also measure on a Redis Cluster through these seed nodes (comma-separated
    /// `redis://host:port`): the claim and settle ceiling on one shard and on `--shards`
    /// shards, and a cluster-mode bridge forwarding from a trigger of `--shards` shards.
    #[arg(long, value_delimiter = ',', value_name = "NODES")]
    pub redis_cluster: Vec<String>,
    /// Shards of the trigger the cluster phase measures (16 per master of a 3-master cluster
    /// spread evenly enough; slots are fixed by the keys' names).
    #[arg(long, default_value_t = 48)]
    pub shards: u32,
    /// Messages due at once in the crash phase.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub crash_messages: u64,
    /// SIGKILLs in the crash phase: each lands once `--crash-messages / (2 * kills)` more
    /// messages arrived since the last restart, so all of them land mid-drain.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub kills: u32,
    /// Messages published to the ingress exchange in the ingress phase (AMQP).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub ingress_messages: u64,
    /// Phases to leave out (repeat or comma-separate).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub skip: Vec<Phase>,
    /// Extra `key = value` TOML lines for every bench trigger, e.g. `--trigger-set 'batch = 512'`.
    #[arg(long = "trigger-set")]
    pub trigger_set: Vec<String>,
    /// Extra `key = value` TOML lines for the bench sink (the broker ceiling uses them too),
    /// e.g. `--sink-set 'properties = { "linger.ms" = "1" }'`.
    #[arg(long = "sink-set")]
    pub sink_set: Vec<String>,
    /// Log filter of the bridge under test.
    #[arg(long, default_value = "warn")]
    pub bridge_log_level: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

impl BenchArgs {
    /// The shape of the bench's messages.
    pub fn shape(&self) -> shape::Shape {
        shape::Shape {
            payload: self.payload,
            format: self.format,
            payload_bytes: self.payload_bytes,
        }
    }
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

    /// The bench route, or with `backlog` (AMQP) the one to a queue nobody consumes.
    fn route_toml(&self, backlog: bool) -> String {
        match self {
            Broker::Amqp(b) => b.route_toml(backlog),
            Broker::Kafka(b) => b.route_toml(),
        }
    }

    async fn cleanup(&self) -> anyhow::Result<()> {
        match self {
            Broker::Amqp(b) => b.cleanup().await,
            Broker::Kafka(b) => b.cleanup().await,
        }
    }
}

/// A broker's consumer task, stopped at cleanup.
struct ConsumerTask(Mutex<Option<tokio::task::JoinHandle<()>>>);

impl ConsumerTask {
    fn new(task: tokio::task::JoinHandle<()>) -> Self {
        Self(Mutex::new(Some(task)))
    }

    /// Stops consuming; awaited so the client is gone before the process exits
    /// (librdkafka's threads must not outlive the runtime).
    async fn stop(&self) {
        let task = self.0.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = task {
            t.abort();
            let _ = t.await;
        }
    }
}

/// What every phase shares, and what has to be undone at the end.
struct Bench {
    args: BenchArgs,
    /// The `delay-bridge` executable under test.
    bridge: PathBuf,
    run_id: String,
    client: redis::Client,
    conn: MultiplexedConnection,
    redis_port: u16,
    broker: Broker,
    tally: Arc<Tally>,
    dir: PathBuf,
    /// The bench trigger as the bridge resolves it (defaults plus `--trigger-set`).
    trigger: TriggerConfig,
    /// The bench sink and the trigger's destination as the bridge resolves them: the broker
    /// ceiling publishes through the same sink code to the same place.
    sink: SinkConfig,
    destination: Destination,
    /// AMQP: the destination of the backlog phase (a queue nobody consumes).
    backlog_destination: Option<Destination>,
    /// Queues created, deleted at the end.
    keys: Mutex<Vec<String>>,
    /// `notify-keyspace-events` before the run, restored at the end.
    original_flags: String,
    next_base: AtomicU64,
}

#[tokio::main]
async fn main() {
    let code = match run(BenchArgs::parse()).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

/// The bridge under test: `--bridge`, or `delay-bridge` next to this executable.
fn bridge_path(arg: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match arg {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()
            .context("locating delay-bridge-bench")?
            .with_file_name("delay-bridge"),
    };
    anyhow::ensure!(
        path.is_file(),
        "the bridge under test {} is missing: build it (cargo build --release) or name it with --bridge PATH",
        path.display()
    );
    // Absolute, so error messages name the very binary that was measured.
    Ok(path.canonicalize().unwrap_or(path))
}

/// Runs the benchmark; returns the process exit code (1 when a phase failed).
async fn run(args: BenchArgs) -> anyhow::Result<i32> {
    let bridge = bridge_path(args.bridge.as_deref())?;
    anyhow::ensure!(
        args.payload_bytes >= tally::SEQ_DIGITS,
        "--payload-bytes must be at least {}",
        tally::SEQ_DIGITS
    );
    anyhow::ensure!(
        args.idle_triggers >= 1,
        "--idle-triggers must be at least 1"
    );
    let bench = Bench::setup(args, bridge).await?;
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
    async fn setup(args: BenchArgs, bridge: PathBuf) -> anyhow::Result<Self> {
        let run_id = format!("{:08x}", rand::random::<u32>());
        let client = redis::Client::open(args.redis_url.as_str()).context("--redis-url")?;
        // The idle phase tells the bridge's Redis connections apart by this remote port.
        let redis_port = match client.get_connection_info().addr() {
            redis::ConnectionAddr::Tcp(_, port) | redis::ConnectionAddr::TcpTls { port, .. } => {
                *port
            }
            _ => 0,
        };
        // Loading a phase's members pipelines thousands of ZADDs: more than the client's
        // default 500 ms per reply on a busy machine.
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(10)))
            .set_response_timeout(Some(Duration::from_secs(60)));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
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
        let probe = |backlog: bool| {
            BridgeToml {
                args: &args,
                broker: &broker,
                keys: &["probe".to_string()],
                notifications: true,
                metrics_port: 0,
                backlog,
                cluster: &[],
                shards: 1,
            }
            .write(&dir, "probe")
        };
        let resolved = probe(false).and_then(|(_, mut c)| {
            let trigger = c.triggers.swap_remove(0);
            let sink = c.sinks.remove(&trigger.sink).context("the bench sink")?;
            let destination = trigger.destination.clone().context("the bench route")?;
            let backlog = match &broker {
                Broker::Amqp(_) => probe(true)?.1.triggers.swap_remove(0).destination,
                Broker::Kafka(_) => None,
            };
            Ok((trigger, sink, destination, backlog))
        });
        let (trigger, sink, destination, backlog_destination) = match resolved {
            Ok(r) => r,
            Err(e) => {
                let _ = broker.cleanup().await;
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        Ok(Self {
            args,
            bridge,
            run_id,
            client,
            conn,
            redis_port,
            broker,
            tally,
            dir,
            trigger,
            sink,
            destination,
            backlog_destination,
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
    /// AMQP: publish to the queue nobody consumes.
    backlog: bool,
    /// Seed nodes of a Redis Cluster to run on instead of `--redis-url` (none: standalone).
    cluster: &'a [String],
    /// Shards of each trigger (`keys` are then the triggers' keys, not the shards').
    shards: u32,
}

impl BridgeToml<'_> {
    fn render(&self) -> String {
        use self::amqp::toml_str;
        let redis = if self.cluster.is_empty() {
            format!("url = {}", toml_str(&self.args.redis_url))
        } else {
            let nodes: Vec<String> = self.cluster.iter().map(|n| toml_str(n)).collect();
            format!("mode = \"cluster\"\nnodes = [{}]", nodes.join(", "))
        };
        let mut out = format!(
            "[redis]\n{redis}\nenable_keyspace_events = {}\n\n\
             [metrics]\nlisten = \"127.0.0.1:{}\"\n\n\
             [log]\nlevel = {}\n\n\
             [shutdown]\ntimeout = \"10s\"\n\n{}",
            self.notifications,
            self.metrics_port,
            toml_str(&self.args.bridge_log_level),
            self.broker.sink_toml(),
        );
        for line in &self.args.sink_set {
            out.push_str(line);
            out.push('\n');
        }
        out.push('\n');
        for (i, key) in self.keys.iter().enumerate() {
            out.push_str(&format!(
                "[[triggers]]\nname = \"bench-{i}\"\nkey = {}\nsink = \"bench\"\n{}",
                toml_str(key),
                self.broker.route_toml(self.backlog)
            ));
            out.push_str(&self.args.shape().trigger_toml());
            if self.shards > 1 {
                out.push_str(&format!("shards = {}\n", self.shards));
                // One worker per shard at least, as the ceiling has one claimer per shard.
                let workers_set = self
                    .args
                    .trigger_set
                    .iter()
                    .any(|l| l.trim_start().starts_with("workers"));
                if !workers_set {
                    out.push_str(&format!("workers = {}\n", self.shards.max(4)));
                }
            }
            for line in &self.args.trigger_set {
                out.push_str(line);
                out.push('\n');
            }
            out.push('\n');
        }
        out
    }

    /// Writes the file `<dir>/<name>.toml` and loads it the way `run --config` will.
    fn write(&self, dir: &Path, name: &str) -> anyhow::Result<(PathBuf, Config)> {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, self.render())?;
        let config = delay_bridge::config::load(&path)
            .map_err(|e| anyhow::anyhow!("bench bridge config: {e}"))?;
        Ok((path, config))
    }
}
