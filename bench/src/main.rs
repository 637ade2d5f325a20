//! `delay-bridge-bench`: the load generator and measurement harness of delay-bridge (also run
//! as `delay-bridge bench`).
//!
//! Everything runs against the local Redis and one broker in a single run, so each bridge figure
//! sits next to the ceiling it is judged by: the broker's limit (RabbitMQ: raw publishers on
//! other clients than the bridge's, amqprs and amqplib; Kafka: the sink's producer alone) and
//! the claim/settle scripts alone (Redis's limit). The bridge under
//! test is the `delay-bridge` binary next to this one (or `--bridge`), started as
//! `run --config` in a child process, so its CPU time and memory come from /proc without the
//! load generator's and consumer's.

mod amqp;
mod amqplib_ceiling;
mod amqprs_ceiling;
mod args;
mod ceiling;
mod child;
mod cluster;
mod http;
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
use clap::Parser;
use delay_bridge::parts::config::{Config, Destination, Sink, Trigger};
use delay_bridge::parts::secret::redact_url;
use redis::aio::MultiplexedConnection;

use self::amqp::AmqpBench;
pub use self::args::{BenchArgs, Phase, SinkKind};
use self::http::HttpBench;
use self::kafka::KafkaBench;
use self::report::Report;
use self::tally::Tally;

/// The broker side of the bench.
enum Broker {
    Amqp(AmqpBench),
    Kafka(KafkaBench),
    Http(HttpBench),
}

impl Broker {
    fn sink_toml(&self) -> String {
        match self {
            Broker::Amqp(b) => b.sink_toml(),
            Broker::Kafka(b) => b.sink_toml(),
            Broker::Http(b) => b.sink_toml(),
        }
    }

    /// The bench route, or with `backlog` (AMQP) the one to a queue nobody consumes.
    fn route_toml(&self, backlog: bool) -> String {
        match self {
            Broker::Amqp(b) => b.route_toml(backlog),
            Broker::Kafka(b) => b.route_toml(),
            Broker::Http(b) => b.route_toml(),
        }
    }

    /// The broker server's process name, looked for on this machine (none for the bench's
    /// own HTTP endpoint).
    fn process_name(&self) -> Option<&'static str> {
        match self {
            Broker::Amqp(_) => Some("beam.smp"),
            Broker::Kafka(_) => Some("tansu"),
            Broker::Http(_) => None,
        }
    }

    async fn cleanup(&self) -> anyhow::Result<()> {
        match self {
            Broker::Amqp(b) => b.cleanup().await,
            Broker::Kafka(b) => b.cleanup().await,
            Broker::Http(b) => b.cleanup().await,
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
    trigger: Trigger,
    /// The bench sink and the trigger's destination as the bridge resolves them: the sink-alone
    /// ceiling publishes through the same sink code to the same place.
    sink: Sink,
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
    if let Some(code) = child::run_if_child().await {
        std::process::exit(code);
    }
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
            SinkKind::Http => Broker::Http(HttpBench::setup(tally.clone()).await?),
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
            let sink = c.sinks.remove(trigger.sink()).context("the bench sink")?;
            let destination = trigger.destination().clone();
            let backlog = match &broker {
                Broker::Amqp(_) => {
                    let backlog = probe(true)?.1.triggers.swap_remove(0);
                    Some(backlog.destination().clone())
                }
                Broker::Kafka(_) | Broker::Http(_) => None,
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
        let config = delay_bridge::parts::config::load(&path)
            .map_err(|e| anyhow::anyhow!("bench bridge config: {e}"))?;
        Ok((path, config))
    }
}
