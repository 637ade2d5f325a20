//! The bench's results: one table with ceilings, ratios and goals, or the same as JSON.

use serde::Serialize;

mod cost;
mod herd;
mod ingress;
mod instructions;
mod rabbit;
mod row;
mod rows;
mod scheduled;

pub use cost::Cost;
pub use herd::Herd;
pub use ingress::IngressRun;
pub use instructions::Instructions;
pub use rabbit::{AmqpCeilings, ClientRate};
pub use scheduled::{ScheduledRun, ScheduledSide};

pub use row::Row;
use row::{mib, millis, percent, rate, verdict, MIB};

/// Everything one bench run measured.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// What it ran with.
    pub settings: Settings,
    /// A plain publisher with the bridge's confirm semantics (the broker's limit; RabbitMQ:
    /// amqprs's rate of `amqp_ceilings`).
    pub broker_ceiling: Option<Rate>,
    /// RabbitMQ: the ceilings into the consumed queue, each by another publisher.
    pub amqp_ceilings: Option<AmqpCeilings>,
    /// The claim and settle scripts alone (Redis's limit).
    pub redis_ceiling: Option<Rate>,
    /// The bridge draining a backlog.
    pub forward: Option<Forward>,
    /// `--redis-cluster`: the ceilings and the forwarding on a Redis Cluster.
    pub cluster: Option<ClusterRun>,
    /// AMQP: a plain publisher filling a queue nobody consumes (amqprs's rate of
    /// `amqp_backlog_ceilings`).
    pub backlog_ceiling: Option<Rate>,
    /// AMQP: the ceilings into the queue nobody consumes.
    pub amqp_backlog_ceilings: Option<AmqpCeilings>,
    /// AMQP: the bridge draining a backlog into a queue nobody consumes.
    pub backlog: Option<Forward>,
    /// The bridge's CPU per message next to an independent publisher's (amqprs, a plain
    /// producer, the HTTP client alone) and the claim/settle client's.
    pub cost: Option<Cost>,
    /// Instructions per message (callgrind) of the bridge, the same independent publisher and
    /// the claim/settle client.
    pub instructions: Option<Instructions>,
    /// Steady load, with and without keyspace notifications.
    pub lateness: Vec<Lateness>,
    /// `--scheduled`: the steady load beside a large future schedule.
    pub scheduled: Option<ScheduledRun>,
    /// A herd due at once beside a trickle on another trigger of the same sink.
    pub herd: Option<Herd>,
    /// Nothing due.
    pub idle: Option<Idle>,
    /// The bridge SIGKILLed mid-drain.
    pub crash: Option<Crash>,
    /// A large schedule held in Redis.
    pub rss: Option<Rss>,
    /// AMQP: messages taken in through an ingress exchange.
    pub ingress: Option<IngressRun>,
    /// Phases that failed, with why.
    pub errors: Vec<PhaseError>,
    /// What the run left out, and why.
    pub notes: Vec<String>,
}

/// The machine and servers.
#[derive(Debug, Default, Serialize)]
pub struct Machine {
    /// Logical CPUs.
    pub cpus: usize,
    /// `model name` from /proc/cpuinfo.
    pub cpu_model: String,
    /// `INFO server` redis_version.
    pub redis_version: String,
}

/// The parameters of the run.
#[derive(Debug, Default, Serialize)]
pub struct Settings {
    /// `amqp` or `kafka`.
    pub sink: String,
    /// Messages in the backlog phases.
    pub messages: u64,
    /// Bytes per payload.
    pub payload_bytes: usize,
    /// Where bodies live and what they are: `inline/raw`, `hash/raw`, `inline/envelope`, ...
    pub shape: String,
    /// Worker tasks of the bench trigger (and publisher tasks of the ceiling).
    pub workers: usize,
    /// Claim batch of the bench trigger (and publish window of the sink alone).
    pub batch: usize,
    /// Steady load, messages per second (a run at each).
    pub rates: Vec<u64>,
    /// RabbitMQ's raw publishers: confirm-mode channels.
    pub ceiling_channels: u16,
    /// RabbitMQ's raw publishers: most messages unconfirmed, all channels together.
    pub ceiling_window: u32,
    /// Steady load duration, seconds.
    pub duration_s: f64,
}

/// What the Redis Cluster phase measured, `--messages` each.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterRun {
    /// Masters serving slots.
    pub masters: usize,
    /// Shards of the sharded trigger.
    pub shards: u32,
    /// How many of the shards each master serves, fewest first.
    pub spread: Vec<usize>,
    /// The claim and settle scripts alone, on one shard (one master).
    pub one_shard: Rate,
    /// The same on every shard at once.
    pub all_shards: Rate,
    /// A cluster-mode bridge draining a trigger of `shards` shards.
    pub forward: Rate,
}

/// Messages moved in some time.
#[derive(Debug, Clone, Serialize)]
pub struct Rate {
    /// Messages.
    pub messages: u64,
    /// Wall-clock seconds, until the consumer had every message.
    pub seconds: f64,
    /// messages / seconds.
    pub msg_per_s: f64,
}

impl Rate {
    /// `messages` in `seconds`.
    pub fn new(messages: u64, seconds: f64) -> Self {
        Self {
            messages,
            seconds,
            msg_per_s: messages as f64 / seconds.max(1e-9),
        }
    }
}

/// The bridge draining a backlog due now.
#[derive(Debug, Serialize)]
pub struct Forward {
    /// From the first due member to the consumer holding all of them and Redis empty.
    pub rate: Rate,
    /// Bridge CPU (user + system) over that time.
    pub cpu_seconds: f64,
    /// Bridge CPU per 100,000 messages.
    pub cpu_seconds_per_100k: f64,
    /// The Redis server's CPU per 100,000 messages over the same time (every client's
    /// commands; nothing but the bridge uses it meanwhile).
    pub redis_cpu_per_100k: Option<f64>,
    /// The broker's server process (RabbitMQ's `beam.smp`, tansu), when it runs on this
    /// machine: its CPU per 100,000 messages over the same time.
    pub broker_cpu_per_100k: Option<ProcessCpu>,
    /// Bridge peak RSS (VmHWM) at the end.
    pub peak_rss_bytes: u64,
    /// Messages the consumer received more than once.
    pub duplicates: u64,
}

/// Another process's CPU over a phase.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessCpu {
    /// Its name (/proc comm).
    pub process: String,
    /// User + system CPU per 100,000 messages.
    pub seconds_per_100k: f64,
}

/// Lateness under a steady load: consumer receive time minus due time.
#[derive(Debug, Serialize)]
pub struct Lateness {
    /// Keyspace notifications on (or the guard interval only).
    pub notifications: bool,
    /// Messages scheduled per second.
    pub rate: u64,
    /// Messages scheduled and received.
    pub messages: u64,
    /// Messages received more than once.
    pub duplicates: u64,
    /// Median, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile, milliseconds.
    pub p99_ms: f64,
    /// Worst, milliseconds.
    pub max_ms: f64,
    /// The bridge's own view: upper bound of the histogram bucket holding the 99th percentile
    /// of broker confirmation time minus due time, milliseconds (leaves out the consumer's path).
    pub confirm_p99_le_ms: Option<f64>,
    /// Messages scheduled earlier than the queue head (10 ms to 1 s ahead): they need a wake-up.
    pub early_messages: u64,
    /// 99th percentile lateness of those, milliseconds.
    pub early_p99_ms: f64,
    /// The trigger's guard interval, milliseconds.
    pub guard_interval_ms: f64,
    /// Bridge CPU seconds during the load.
    pub cpu_seconds: f64,
    /// The bridge's claims that found nothing due during the load
    /// (`delay_bridge_empty_claims_total`), and the messages it forwarded meanwhile.
    pub empty_claims: Option<Wakes>,
}

/// The bridge's own counts over a window of its run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Wakes {
    /// Claims that found nothing due.
    pub empty_claims: u64,
    /// Heads read after a wake-up instead of a claim (`delay_bridge_head_reads_total`).
    pub head_reads: u64,
    /// Messages confirmed by the broker.
    pub forwarded: u64,
    /// empty_claims / forwarded.
    pub per_message: f64,
    /// head_reads / forwarded.
    pub reads_per_message: f64,
}

impl Wakes {
    /// `empty_claims` and `head_reads` while `forwarded` messages went out.
    pub fn new(empty_claims: u64, head_reads: u64, forwarded: u64) -> Self {
        let per = |n: u64| n as f64 / forwarded.max(1) as f64;
        Self {
            empty_claims,
            head_reads,
            forwarded,
            per_message: per(empty_claims),
            reads_per_message: per(head_reads),
        }
    }
}

/// The bridge with nothing due.
#[derive(Debug, Serialize)]
pub struct Idle {
    /// Triggers configured.
    pub triggers: usize,
    /// Measurement window, seconds.
    pub window_s: f64,
    /// Redis commands the bridge sent in the window.
    pub commands: u64,
    /// commands / window.
    pub commands_per_s: f64,
    /// commands / window / triggers.
    pub commands_per_s_per_trigger: f64,
    /// `monitor` (the bridge's own connections) or `global` (every client of Redis).
    pub attribution: String,
    /// Bridge CPU seconds in the window.
    pub cpu_seconds: f64,
    /// cpu_seconds / window: the share of one core.
    pub cpu_share: f64,
    /// From spawning the bridge to `/readyz` answering 200, seconds.
    pub startup_s: f64,
    /// VmRSS at the end of the window.
    pub rss_bytes: u64,
}

/// The bridge SIGKILLed mid-drain and started again each time.
#[derive(Debug, Serialize)]
pub struct Crash {
    /// Messages due at once.
    pub messages: u64,
    /// SIGKILLs.
    pub kills: u32,
    /// Kills that landed before the consumer had every message.
    pub kills_mid_drain: u32,
    /// Messages the consumer received more than once.
    pub duplicates: u64,
    /// duplicates / kills.
    pub duplicates_per_kill: f64,
    /// The most a bridge holds claimed but not settled (workers x batches in flight x batch):
    /// what a kill could re-send if nothing were settled before its whole batch was confirmed.
    pub claimed_at_most: u64,
    /// From the first due member to the consumer holding all of them and Redis empty.
    pub seconds: f64,
}

/// Bridge memory while many messages wait in Redis.
#[derive(Debug, Serialize)]
pub struct Rss {
    /// Members scheduled in the future.
    pub scheduled: u64,
    /// VmRSS after the bridge ran a while.
    pub rss_bytes: u64,
    /// VmHWM at the same moment.
    pub peak_bytes: u64,
}

/// A phase that did not complete.
#[derive(Debug, Serialize)]
pub struct PhaseError {
    /// The phase.
    pub phase: String,
    /// What went wrong.
    pub error: String,
}

/// Goals (floors) the bench checks.
const AMQP_MIN_RATIO: f64 = 0.9;
const BACKLOG_MIN_RATIO: f64 = 0.9;
const KAFKA_MIN_RATIO: f64 = 0.8;
/// A cluster-mode bridge against the broker's ceiling.
const CLUSTER_MIN_RATIO: f64 = 0.8;
const KAFKA_MIN_RATE: f64 = 100_000.0;
const LATE_P99_MS: f64 = 5.0;
/// Claims that found nothing due, per message forwarded under a steady load.
const EMPTY_CLAIMS_PER_MESSAGE: f64 = 1.0;
const LATE_MAX_MS: f64 = 50.0;
const IDLE_CMDS_PER_TRIGGER: f64 = 0.2;
/// Idle CPU, as a share of one core.
const IDLE_CPU_SHARE: f64 = 0.02;
const IDLE_RSS_MIB: f64 = 128.0;
const IDLE_STARTUP_S: f64 = 2.0;
const RSS_LIMIT_MIB: f64 = 64.0;
/// Messages received twice per SIGKILL of a bridge draining at full speed.
const DUPLICATES_PER_KILL: f64 = 300.0;

impl Report {
    /// True when no goal was missed and no phase failed.
    pub fn all_passed(&self) -> bool {
        self.errors.is_empty() && self.rows().iter().all(|r| r.result != "MISS")
    }

    /// The human-readable report.
    pub fn table(&self) -> String {
        let m = &self.machine;
        let s = &self.settings;
        let mut out = format!(
            "delay-bridge bench: sink {}, {} messages of {} B ({}), workers {}, batch {}, steady {} msg/s for {}s\n\
             machine: {} CPUs, {}, Redis {}\n\n",
            s.sink, s.messages, s.payload_bytes, s.shape, s.workers, s.batch,
            s.rates.iter().map(u64::to_string).collect::<Vec<_>>().join(" and "), s.duration_s,
            m.cpus, m.cpu_model, m.redis_version
        );
        out.push_str(&row::render(self.rows()));
        for e in &self.errors {
            out.push_str(&format!("\nphase {} failed: {}\n", e.phase, e.error));
        }
        for note in &self.notes {
            out.push_str(&format!("\nnote: {note}\n"));
        }
        out
    }

    /// The report as JSON, with the table's goal lines under `goals`.
    pub fn json(&self) -> serde_json::Result<String> {
        let mut v = serde_json::to_value(self)?;
        let goals: Vec<Row> = self
            .rows()
            .into_iter()
            .filter(|r| !r.result.is_empty())
            .collect();
        v["goals"] = serde_json::to_value(goals)?;
        v["all_passed"] = self.all_passed().into();
        serde_json::to_string_pretty(&v)
    }
}

#[cfg(test)]
mod tests;
