//! The bench's command line: which sink, which phases, how many messages of which shape.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use super::shape;

/// Which broker the bridge forwards to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SinkKind {
    /// RabbitMQ.
    Amqp,
    /// Kafka.
    Kafka,
    /// An HTTP endpoint the bench serves on loopback.
    Http,
}

/// Phases that `--skip` can leave out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Phase {
    /// The broker's ceiling (RabbitMQ: raw publishers on amqprs and amqplib, and the
    /// bridge's sink code alone; Kafka: the sink's producer alone; HTTP: its client alone).
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
    /// `--herd` members due at the same millisecond in one trigger while another trigger on
    /// the same sink receives `--herd-trickle` messages per second: the herd's drain rate
    /// and the trickle's lateness.
    Herd,
    /// AMQP and Kafka: `--ingress-messages` delayed messages waiting in the ingress queue
    /// (topic) taken in by the bridge, next to a plain consumer draining the same backlog,
    /// then delivered (intake rate, end-to-end lateness).
    Ingress,
    /// CPU per 100k of the bridge, of an independent publisher (RabbitMQ: amqprs; Kafka: a
    /// plain rdkafka producer; HTTP: the ceiling's client) and of the claim/settle client,
    /// each in a child process, with the Redis server's beside the bridge's and the scripts'.
    Cost,
    /// Instructions per message (callgrind, `--instructions-messages`) of the bridge, the
    /// same independent publisher and the claim/settle client; needs valgrind.
    Instructions,
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
    /// Steady load: messages scheduled per second; several (comma-separated) run the steady
    /// load once at each rate, e.g. `--rate 5,1000`.
    #[arg(long, default_value = "2000", value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..))]
    pub rate: Vec<u64>,
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
    /// Also run the steady load with N members scheduled over the next 24 hours in the same
    /// trigger, next to the same load with nothing scheduled, and Redis memory per member
    /// (`--scheduled` alone: 1,000,000).
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "1000000",
          value_parser = clap::value_parser!(u64).range(1..))]
    pub scheduled: Option<u64>,
    /// Messages of the instructions phase's smaller run (the larger has twice as many; the
    /// count per message is the difference over this many, so start-up cancels out).
    #[arg(long, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub instructions_messages: u64,
    /// Keep the instructions phase's callgrind files in this directory (for
    /// `callgrind_annotate`), instead of the run's own, which is removed at the end.
    #[arg(long, value_name = "DIR")]
    pub callgrind_dir: Option<PathBuf>,
    /// Messages due at once in the crash phase.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub crash_messages: u64,
    /// SIGKILLs in the crash phase: each lands once `--crash-messages / (2 * kills)` more
    /// messages arrived since the last restart, so all of them land mid-drain.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub kills: u32,
    /// Messages waiting in the ingress queue (AMQP) or topic (Kafka) in the ingress phase.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub ingress_messages: u64,
    /// Members due at the same millisecond in the herd phase's first trigger.
    #[arg(long, default_value_t = 500_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub herd: u64,
    /// Messages per second scheduled on the herd phase's second trigger while the herd drains.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub herd_trickle: u64,
    /// RabbitMQ ceilings: confirm-mode channels of the raw publishers (amqprs, amqplib).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub ceiling_channels: u16,
    /// RabbitMQ ceilings: most messages the raw publishers keep unconfirmed, all channels
    /// together.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..))]
    pub ceiling_window: u32,
    /// Where the amqplib ceiling finds amqplib (default: `producers/node_modules` of the
    /// source tree the bench was built from; `npm install --prefix producers`).
    #[arg(long, value_name = "PATH")]
    pub node_modules: Option<PathBuf>,
    /// Phases to leave out (repeat or comma-separate).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub skip: Vec<Phase>,
    /// Extra `key = value` TOML lines for every bench trigger, e.g. `--trigger-set 'batch = 512'`.
    #[arg(long = "trigger-set")]
    pub trigger_set: Vec<String>,
    /// Extra `key = value` TOML lines for the bench sink (the sink-alone and Kafka ceilings
    /// use them too), e.g. `--sink-set 'properties = { "linger.ms" = "1" }'`.
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
