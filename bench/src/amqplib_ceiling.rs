//! RabbitMQ's ceiling measured by a Node client: `bench/amqplib-ceiling.js` (amqplib) in a
//! child process, told what to publish on its input and answering once all is confirmed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::time::Instant;

use super::amqprs_ceiling::Unconfirmed;
use super::ceiling::Window;

/// The script, written next to the bench's other files at each run.
const SCRIPT: &str = include_str!("../amqplib-ceiling.js");
/// How long the script may take to connect and open its channels.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Where amqplib is unless `--node-modules` says otherwise: the producers' snippets' own
/// dependencies in the source tree (`npm install --prefix producers`).
pub fn default_node_modules() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../producers/node_modules")
}

/// Why the Node ceiling cannot run here, if it cannot: no `node`, or no amqplib.
pub fn missing(node_modules: &Path) -> Option<String> {
    let node = std::process::Command::new("node")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !node.is_ok_and(|s| s.success()) {
        return Some("node is not installed".into());
    }
    if !node_modules.join("amqplib/package.json").is_file() {
        return Some(format!(
            "amqplib is not in {} (npm install --prefix producers)",
            node_modules.display()
        ));
    }
    None
}

/// The running script.
pub struct NodePublisher {
    child: Child,
    input: ChildStdin,
    output: Lines<BufReader<ChildStdout>>,
}

impl NodePublisher {
    /// Writes the script into `dir` and starts it; returns once its channels are open.
    pub async fn start(
        dir: &Path,
        node_modules: &Path,
        target: (&str, &str, &str),
        u: Unconfirmed,
        payload_bytes: usize,
    ) -> anyhow::Result<Self> {
        let (url, exchange, routing_key) = target;
        let script = dir.join("amqplib-ceiling.js");
        std::fs::write(&script, SCRIPT)?;
        let mut child = Command::new("node")
            .arg(&script)
            .args([url, exchange, routing_key])
            .args([u.channels, u.window, payload_bytes].map(|n| n.to_string()))
            .env("NODE_PATH", node_modules)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("starting node")?;
        let input = child.stdin.take().context("the script's input")?;
        let output = BufReader::new(child.stdout.take().context("the script's output")?).lines();
        let mut publisher = Self {
            child,
            input,
            output,
        };
        match publisher.answer(START_TIMEOUT).await?.as_str() {
            "ready" => Ok(publisher),
            other => bail!("amqplib-ceiling.js said {other:?} instead of ready"),
        }
    }

    /// The script's CPU time so far (user + system), seconds.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let pid = self.child.id().context("the script exited")?;
        super::process::process_cpu_seconds(pid)
    }

    /// Publishes `w`'s messages and waits until the broker confirmed every one; returns
    /// when publishing started.
    pub async fn publish(&mut self, w: &Window, timeout: Duration) -> anyhow::Result<Instant> {
        let line = format!("{} {} {}\n", w.base, w.count, w.due_ms);
        let started = Instant::now();
        self.input.write_all(line.as_bytes()).await?;
        self.input.flush().await?;
        match self.answer(timeout).await?.as_str() {
            "ok" => Ok(started),
            other => bail!("amqplib: {other}"),
        }
    }

    async fn answer(&mut self, timeout: Duration) -> anyhow::Result<String> {
        match tokio::time::timeout(timeout, self.output.next_line()).await {
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) => Err(anyhow!("amqplib-ceiling.js exited")),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(anyhow!(
                "amqplib-ceiling.js did not answer within {timeout:?}"
            )),
        }
    }

    /// Ends the script's input (it closes its connection and exits), killing it if it
    /// lingers.
    pub async fn close(mut self) {
        drop(self.input);
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}
