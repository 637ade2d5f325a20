//! The command line: the daemon, `check`, and the commands that read or change a queue.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::config::{self, Config, ConfigError, LogFormat};
use crate::secret::redact_url;

/// `println!` that ignores a closed stdout (`delay-bridge stats | head`) instead of panicking.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// Exit code for a bad configuration (EX_CONFIG).
pub(crate) const EXIT_CONFIG: i32 = 78;

mod bytes;
mod check;
mod connect;
mod health;
mod operate;
mod queue;
mod reach;
mod schedule;
mod schedule_runtime;
mod show;
mod stats;
mod text;
mod when;

use queue::{cancel, consume, dead_list, dead_requeue, enqueue, pause};
use stats::stats;

/// delay-bridge: Redis sorted sets in, RabbitMQ / Kafka messages out, on time.
#[derive(Debug, Parser)]
#[command(
    name = "delay-bridge",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("DELAY_BRIDGE_REVISION"), ")"),
    about
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon.
    Run(ConfigArg),
    /// Validate a config and print the resolved triggers (secrets redacted).
    Check {
        #[command(flatten)]
        config: ConfigArg,
        /// Also connect with the config's credentials and report every destination that is
        /// missing or unreachable, and keyspace notifications that cannot be turned on
        /// (exit 69 if any).
        #[arg(long)]
        connect: bool,
    },
    /// Print the backlog of every trigger.
    Stats {
        #[command(flatten)]
        config: ConfigArg,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Also print each shard of a sharded trigger.
        #[arg(long)]
        shards: bool,
    },
    /// Schedule a message the way a producer would (`ZADD key due member`): the payload
    /// given, from standard input (`-`), from --file, or in --base64.
    Enqueue(queue::EnqueueArgs),
    /// Cancel a scheduled message: by id in hash payload mode (the body goes too, unless a
    /// copy is in flight or dead), by its exact payload in inline mode.
    Cancel(queue::CancelArgs),
    /// Stop claiming a trigger's messages on every bridge (they stay scheduled in Redis;
    /// producers keep writing), until `resume`.
    Pause {
        #[command(flatten)]
        config: ConfigArg,
        /// Trigger to pause.
        #[arg(long, short)]
        trigger: String,
    },
    /// Claim a paused trigger's messages again.
    Resume {
        #[command(flatten)]
        config: ConfigArg,
        /// Trigger to resume.
        #[arg(long, short)]
        trigger: String,
    },
    /// List scheduled messages by due time, a page at a time.
    Browse(operate::BrowseArgs),
    /// Show where one message is (scheduled, in flight, dead), found by its member, its id in
    /// hash mode or the id consumers were sent, with that id and its body in hash mode.
    Show(show::ShowArgs),
    /// List the messages in flight (claimed, not yet confirmed) with the end of their lease.
    InFlight(show::InFlightArgs),
    /// Count the messages falling due per minute (or --bucket) from now on.
    Forecast(operate::ForecastArgs),
    /// Make scheduled messages due now (those due later; others are left alone).
    Promote(operate::PromoteArgs),
    /// Give scheduled messages a new due time (--at or --delay).
    Reschedule(operate::RescheduleArgs),
    /// Delete scheduled messages (--scheduled, optionally a due range) or every dead letter
    /// (--dead); needs --yes, else prints how many it would delete.
    Purge(operate::PurgeArgs),
    /// Inspect and replay dead letters.
    #[command(subcommand)]
    DeadLetter(DeadLetter),
    /// Recurring schedules: check an expression's next fire times; add, list and remove a
    /// trigger's schedules at run time.
    #[command(subcommand)]
    Schedule(schedule::ScheduleCommand),
    /// Measure forwarding rate, lateness and idle cost against the local Redis and a broker
    /// (runs `delay-bridge-bench` from the same directory with these arguments; `bench --help`).
    #[command(disable_help_flag = true)]
    Bench {
        /// Arguments of `delay-bridge-bench`, passed on verbatim.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Ask a running bridge's `/healthz` whether it is alive: exit 0 on 200, else 1 (for
    /// container and service health checks).
    Health(health::HealthArgs),
    /// Print messages arriving on a RabbitMQ queue with their lateness (for trying the bridge out).
    Consume {
        /// AMQP URL.
        #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
        url: String,
        /// Queue to consume from.
        #[arg(long)]
        queue: String,
        /// Stop after this many messages.
        #[arg(long)]
        count: Option<u64>,
        /// Stop after this long without a message.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
        idle: Duration,
    },
}

/// `dead-letter` subcommands.
#[derive(Debug, Subcommand)]
pub enum DeadLetter {
    /// List dead letters, oldest first, with their reason.
    List {
        #[command(flatten)]
        config: ConfigArg,
        /// Trigger to look at.
        #[arg(long, short)]
        trigger: String,
        /// At most this many (fewer when their members reach 1 MiB).
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Move dead letters back to the queue, due now.
    Requeue {
        #[command(flatten)]
        config: ConfigArg,
        /// Trigger to requeue for.
        #[arg(long, short)]
        trigger: String,
        /// Members to requeue (default: the oldest `--limit`); `-` reads one from standard
        /// input.
        #[arg(long = "member", allow_hyphen_values = true)]
        members: Vec<std::ffi::OsString>,
        #[command(flatten)]
        bytes: bytes::ByteForms,
        /// At most this many when no member is named.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Confirms a requeue of more than one letter: without it, only the count is printed.
        #[arg(long)]
        yes: bool,
    },
}

/// `--config FILE`.
#[derive(Debug, Clone, Args)]
pub struct ConfigArg {
    /// Path of the TOML configuration. Without one (or `--config` alone), the first that
    /// exists of `$DELAY_BRIDGE_CONFIG`, `./delay-bridge.toml`, `/etc/delay-bridge/config.toml`.
    #[arg(long, short, value_name = "FILE", num_args = 0..=1)]
    pub config: Option<Option<PathBuf>>,
}

impl ConfigArg {
    /// The file named on the command line, if any.
    pub fn explicit(&self) -> Option<&std::path::Path> {
        self.config.as_ref().and_then(|c| c.as_deref())
    }

    /// The file to load: the one named, else the first found on the search path; prints the
    /// paths tried and returns the EX_CONFIG exit code when none exists.
    pub fn resolve(&self) -> Result<PathBuf, i32> {
        config::find_config(self.explicit()).map_err(|e| {
            eprintln!("error: {e}");
            EXIT_CONFIG
        })
    }
}

/// Finds and loads the config, or prints every problem and returns the EX_CONFIG exit code.
pub(crate) fn find_and_load(arg: &ConfigArg) -> Result<(PathBuf, Config), i32> {
    let path = arg.resolve()?;
    let config = load_or_exit(&path)?;
    Ok((path, config))
}

/// Loads the config or prints every problem and returns the EX_CONFIG exit code.
pub(crate) fn load_or_exit(path: &std::path::Path) -> Result<Config, i32> {
    config::load(path).map_err(|e: ConfigError| {
        eprintln!("error: {}: {e}", path.display());
        EXIT_CONFIG
    })
}

/// Sets up tracing to stderr: `RUST_LOG` wins over `[log] level`.
pub(crate) fn init_tracing(format: LogFormat, level: &str) {
    use tracing_subscriber::EnvFilter;
    let mut filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    // lapin logs returned messages with their bodies and channel closes as errors; the
    // bridge reports those itself, without payloads, so lapin stays quiet unless asked.
    let asked = std::env::var("RUST_LOG").unwrap_or_else(|_| level.to_string());
    if !asked.contains("lapin") {
        if let Ok(d) = "lapin=off".parse() {
            filter = filter.add_directive(d);
        }
    }
    // The Redis Cluster client warns once per failed reconnection, hundreds a second while
    // a master is down; the bridge logs the outage itself, at growing gaps.
    if !asked.contains("redis") {
        if let Ok(d) = "redis=error".parse() {
            filter = filter.add_directive(d);
        }
    }
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

/// Runs a parsed command line; returns the process exit code.
pub async fn dispatch(cli: Cli) -> i32 {
    let result = match cli.command {
        Command::Run(c) => return run(&c).await,
        Command::Check { config, connect } => return check::check(&config, connect).await,
        Command::Stats {
            config,
            json,
            shards,
        } => with_config(&config, |c| stats(c, json, shards)).await,
        Command::Enqueue(a) => {
            let config = a.config.clone();
            with_config(&config, |c| enqueue(c, a)).await
        }
        Command::Cancel(a) => {
            let config = a.config.clone();
            with_config(&config, |c| cancel(c, a)).await
        }
        Command::Browse(a) => with_target(a, operate::browse).await,
        Command::Show(a) => with_target(a, show::show).await,
        Command::InFlight(a) => with_target(a, show::in_flight).await,
        Command::Forecast(a) => with_target(a, operate::forecast).await,
        Command::Promote(a) => with_target(a, operate::promote).await,
        Command::Reschedule(a) => with_target(a, |c, a| operate::reschedule(c, a, false)).await,
        Command::Purge(a) => with_target(a, operate::purge).await,
        Command::Pause { config, trigger } => {
            with_config(&config, |c| pause(c, trigger, true)).await
        }
        Command::Resume { config, trigger } => {
            with_config(&config, |c| pause(c, trigger, false)).await
        }
        Command::DeadLetter(DeadLetter::List {
            config,
            trigger,
            limit,
            json,
        }) => with_config(&config, |c| dead_list(c, trigger, limit, json)).await,
        Command::DeadLetter(DeadLetter::Requeue {
            config,
            trigger,
            members,
            bytes,
            limit,
            yes,
        }) => match bytes.values(&members) {
            Ok(members) => {
                with_config(&config, |c| dead_requeue(c, trigger, members, limit, yes)).await
            }
            Err(e) => Err(e),
        },
        Command::Schedule(c) => schedule::schedule(c).await,
        Command::Health(args) => return health::health(args).await,
        Command::Bench { args } => bench(args),
        Command::Consume {
            url,
            queue,
            count,
            idle,
        } => consume(url, queue, count, idle).await,
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            1
        }
    }
}

/// An error and its causes on one line, each said once: a cause whose words the line already
/// holds (clients often repeat their source in their own message) is left out.
pub(crate) fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// Hands over to `delay-bridge-bench` next to this executable (it is its own crate, so the
/// daemon does not carry the load generator), passing its exit code through.
fn bench(args: Vec<String>) -> anyhow::Result<i32> {
    let exe = std::env::current_exe()
        .context("locating delay-bridge")?
        .with_file_name("delay-bridge-bench");
    anyhow::ensure!(
        exe.is_file(),
        "{} is missing: build it with cargo build --release --workspace",
        exe.display()
    );
    let mut command = std::process::Command::new(&exe);
    command.args(args);
    #[cfg(unix)]
    {
        // Replaces this process, so Ctrl-C reaches the bench alone and it cleans up.
        use std::os::unix::process::CommandExt;
        let e = command.exec();
        Err(e).with_context(|| format!("running {}", exe.display()))
    }
    #[cfg(not(unix))]
    {
        let status = command
            .status()
            .with_context(|| format!("running {}", exe.display()))?;
        Ok(status.code().unwrap_or(1))
    }
}

async fn with_config<F, Fut>(arg: &ConfigArg, f: F) -> anyhow::Result<i32>
where
    F: FnOnce(Config) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<i32>>,
{
    match find_and_load(arg) {
        Ok((_, c)) => f(c).await,
        Err(code) => Ok(code),
    }
}

/// Runs a command on one trigger's queue with the configuration its `--config` names.
async fn with_target<A, F, Fut>(a: A, f: F) -> anyhow::Result<i32>
where
    A: operate::Targeted,
    F: FnOnce(Config, A) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<i32>>,
{
    let config = a.config_arg().clone();
    with_config(&config, |c| f(c, a)).await
}

async fn run(arg: &ConfigArg) -> i32 {
    let (path, config) = match find_and_load(arg) {
        Ok(found) => found,
        Err(code) => return code,
    };
    init_tracing(config.log.format, &config.log.level);
    tracing::info!(config = %path.display(), version = env!("CARGO_PKG_VERSION"),
        revision = crate::metrics::REVISION,
        worker_threads = tokio::runtime::Handle::current().metrics().num_workers(), "starting");
    let reload = crate::bridge::Reload {
        path: path.clone(),
        requested: Default::default(),
    };
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let requested = reload.requested.clone();
        let mut hup = signal(SignalKind::hangup()).expect("install SIGHUP handler");
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading the configuration");
                requested.notify_one();
            }
        });
    }
    let shutdown = crate::bridge::Shutdown {
        reload: Some(reload),
        ..Default::default()
    };
    let stop = shutdown.stop.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("signal received; send another to exit at once");
        stop.cancel();
        wait_for_signal().await;
        tracing::warn!("second signal: exiting now; unconfirmed leases will be recovered");
        std::process::exit(130);
    });
    match crate::bridge::run(config, crate::metrics::Metrics::new(), shutdown).await {
        Ok(()) => 0,
        Err(e) => {
            let line = one_line(&e);
            tracing::error!(error = %line, "delay-bridge failed");
            eprintln!("error: {line}");
            // Keys that hold members and that the configuration would not serve: its fault.
            let stranded = e
                .downcast_ref::<crate::redis::queue::LayoutRefused>()
                .is_some_and(|r| {
                    r.0.iter()
                        .any(|l| matches!(l, crate::redis::queue::LayoutError::Stranded { .. }))
                });
            let refused = e
                .downcast_ref::<crate::redis::engine::EngineRefused>()
                .is_some();
            if stranded || refused {
                EXIT_CONFIG
            } else {
                1
            }
        }
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
