//! The bridge under test as a child process (`delay-bridge run`), and what /proc says about it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::time::Instant;

/// A running `delay-bridge run --config FILE`; killed if dropped while running.
pub struct BridgeProcess {
    child: Child,
    /// A profiler's command line the bridge runs under, or nothing.
    wrapper: Vec<String>,
    exe: PathBuf,
    config: PathBuf,
    port: u16,
    log: PathBuf,
    /// When the process was spawned.
    started: Instant,
}

/// Memory of the process from /proc/PID/status.
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    /// Resident set size now (VmRSS).
    pub rss_bytes: u64,
    /// Peak resident set size (VmHWM).
    pub peak_bytes: u64,
}

/// A command running `exe`, or, with a `wrapper` (a profiler's command line), the wrapper with
/// `exe` after it.
pub fn wrapped(wrapper: &[String], exe: &Path) -> Command {
    match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(exe);
            c
        }
        None => Command::new(exe),
    }
}

/// A loopback port that was free a moment ago, for the child's metrics listener.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

impl BridgeProcess {
    /// Starts the bridge `exe` as `run --config <config>`, logging to `log`; `port` is its
    /// metrics port.
    pub fn spawn(exe: &Path, config: &Path, port: u16, log: &Path) -> anyhow::Result<Self> {
        Self::spawn_under(&[], exe, config, port, log)
    }

    /// [`Self::spawn`] under `wrapper`, a command line that runs the program after it (a
    /// profiler); the process id is then the wrapper's, which valgrind keeps for the program.
    pub fn spawn_under(
        wrapper: &[String],
        exe: &Path,
        config: &Path,
        port: u16,
        log: &Path,
    ) -> anyhow::Result<Self> {
        let child = wrapped(wrapper, exe)
            .arg("run")
            .arg("--config")
            .arg(config)
            // The config's log level applies: verbose logging would be measured as bridge cost.
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .with_context(|| format!("starting {} run", exe.display()))?;
        Ok(Self {
            child,
            wrapper: wrapper.to_vec(),
            exe: exe.to_path_buf(),
            config: config.to_path_buf(),
            port,
            log: log.to_path_buf(),
            started: Instant::now(),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for `/readyz` to answer 200; returns how long after spawning it did.
    pub async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<Duration> {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(status) = self.child.try_wait()? {
                bail!("the bridge exited with {status}: {}", self.log_tail());
            }
            if matches!(http_get(self.port, "/readyz").await, Some((200, _))) {
                return Ok(self.started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!(
            "the bridge was not ready within {timeout:?}: {}",
            self.log_tail()
        )
    }

    /// The bridge's `/metrics` text.
    pub async fn metrics(&self) -> Option<String> {
        http_get(self.port, "/metrics").await.map(|(_, body)| body)
    }

    /// User plus system CPU time so far, in seconds.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        process_cpu_seconds(self.pid())
    }

    /// Current and peak resident memory.
    pub fn memory(&self) -> anyhow::Result<Memory> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        let kib = |field: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .map(|k| k * 1024)
        };
        Ok(Memory {
            rss_bytes: kib("VmRSS:").context("VmRSS missing")?,
            peak_bytes: kib("VmHWM:").context("VmHWM missing")?,
        })
    }

    /// Local ports of the process's TCP connections to `remote_port` (its Redis connections).
    pub fn ports_to(&self, remote_port: u16) -> HashSet<u16> {
        let mut inodes = HashSet::new();
        if let Ok(fds) = std::fs::read_dir(format!("/proc/{}/fd", self.pid())) {
            for fd in fds.flatten() {
                if let Ok(target) = std::fs::read_link(fd.path()) {
                    let t = target.to_string_lossy();
                    if let Some(inode) =
                        t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']'))
                    {
                        inodes.insert(inode.to_string());
                    }
                }
            }
        }
        let mut ports = HashSet::new();
        for table in ["tcp", "tcp6"] {
            let Ok(text) = std::fs::read_to_string(format!("/proc/{}/net/{table}", self.pid()))
            else {
                continue;
            };
            ports.extend(local_ports_to(&text, remote_port, &inodes));
        }
        ports
    }

    /// SIGTERM, then waits for a clean exit (SIGKILL after `timeout`).
    pub async fn stop(mut self, timeout: Duration) -> anyhow::Result<()> {
        // `kill` avoids a libc dependency for one signal.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("the bridge exited with {status}: {}", self.log_tail());
                }
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("the bridge did not stop within {timeout:?}; killed it")
    }

    /// SIGKILL: the process dies wherever it was, as in a crash or an OOM kill.
    pub fn kill(&mut self) -> anyhow::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// A new process of the same binary and configuration, logging to `log`.
    pub fn respawn(&self, log: &Path) -> anyhow::Result<Self> {
        Self::spawn_under(&self.wrapper, &self.exe, &self.config, self.port, log)
    }

    /// The last lines of the bridge's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n");
        format!("log {}:\n{tail}", self.log.display())
    }
}

impl Drop for BridgeProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// User plus system CPU time of process `pid` so far, in seconds.
pub fn process_cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    cpu_seconds_from_stat(&stat, clock_ticks()).context("parsing /proc/PID/stat")
}

/// The local process named `name` (its /proc comm) that has used the most CPU, if any: the
/// broker's server process when it runs on this machine.
pub fn find_process(name: &str) -> Option<u32> {
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let comm = &stat[stat.find('(')? + 1..stat.rfind(')')?];
            if comm != name {
                return None;
            }
            Some((pid, cpu_seconds_from_stat(&stat, clock_ticks())?))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(pid, _)| pid)
}

/// Kernel clock ticks per second for /proc times (USER_HZ, 100 on every common Linux).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
            .filter(|t: &f64| *t > 0.0)
            .unwrap_or(100.0)
    })
}

/// utime + stime from the text of /proc/PID/stat (fields 14 and 15; the name may hold spaces).
fn cpu_seconds_from_stat(stat: &str, ticks: f64) -> Option<f64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / ticks)
}

/// Local ports in a /proc/net/tcp table of sockets in `inodes` connected to `remote_port`.
fn local_ports_to(table: &str, remote_port: u16, inodes: &HashSet<String>) -> Vec<u16> {
    let port = |addr: &str| u16::from_str_radix(addr.rsplit(':').next()?, 16).ok();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (local, remote, inode) = (f.get(1)?, f.get(2)?, f.get(9)?);
            (port(remote)? == remote_port && inodes.contains(*inode)).then_some(port(local)?)
        })
        .collect()
}

/// Status code and body of a GET on the loopback port, None when it does not answer.
async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let io = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(Duration::from_secs(5), io)
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&buf);
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Some((status, body.to_string()))
}

/// The sum of a Prometheus counter or gauge over its label sets; None when absent.
pub fn metric_sum(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        let value: f64 = rest.rsplit_once(' ')?.1.parse().ok()?;
        *found.get_or_insert(0.0) += value;
    }
    found
}

/// Upper bound of the bucket holding the `q` quantile of a Prometheus histogram, summed over
/// its label sets; None without observations.
pub fn histogram_bound(text: &str, name: &str, q: f64) -> Option<f64> {
    let prefix = format!("{name}_bucket{{");
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    for line in text.lines().filter(|l| l.starts_with(&prefix)) {
        let (series, value) = line.rsplit_once(' ')?;
        let le = series.split("le=\"").nth(1)?.split('"').next()?;
        let le: f64 = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().ok()?
        };
        let value: f64 = value.parse().ok()?;
        match buckets.iter_mut().find(|(b, _)| *b == le) {
            Some((_, n)) => *n += value,
            None => buckets.push((le, value)),
        }
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, n)| *n >= q * total)
        .map(|(le, _)| *le)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        let stat = "42 (delay bridge) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 5 0";
        assert_eq!(cpu_seconds_from_stat(stat, 100.0), Some(3.0));
        assert_eq!(cpu_seconds_from_stat("garbage", 100.0), None);
    }

    #[test]
    fn histogram_quantiles_are_bucket_bounds_summed_over_labels() {
        let text = "# HELP x\n\
            h_bucket{trigger=\"a\",le=\"0.001\"} 50\n\
            h_bucket{trigger=\"a\",le=\"0.002\"} 90\n\
            h_bucket{trigger=\"a\",le=\"+Inf\"} 100\n\
            h_bucket{trigger=\"b\",le=\"0.001\"} 0\n\
            h_bucket{trigger=\"b\",le=\"0.002\"} 0\n\
            h_bucket{trigger=\"b\",le=\"+Inf\"} 100\n\
            h_sum 1\n";
        assert_eq!(histogram_bound(text, "h", 0.25), Some(0.001));
        assert_eq!(histogram_bound(text, "h", 0.45), Some(0.002));
        assert_eq!(histogram_bound(text, "h", 0.99), Some(f64::INFINITY));
        assert_eq!(histogram_bound("", "h", 0.5), None);
    }

    #[test]
    fn counters_are_summed_over_their_labels() {
        let text =
            "# HELP c x\nc_total{trigger=\"a\"} 2\nc_total{trigger=\"b\"} 3\nc_total_more 9\nd 1\n";
        assert_eq!(metric_sum(text, "c_total"), Some(5.0));
        assert_eq!(metric_sum(text, "d"), Some(1.0));
        assert_eq!(metric_sum(text, "e"), None);
    }

    #[test]
    fn redis_connections_are_found_by_inode_and_remote_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
           0: 0100007F:D431 0100007F:18EB 01 00000000:00000000 00:00000000 00000000     0        0 111 1\n\
           1: 0100007F:D432 0100007F:1628 01 00000000:00000000 00:00000000 00000000     0        0 112 1\n\
           2: 0100007F:D433 0100007F:18EB 01 00000000:00000000 00:00000000 00000000     0        0 999 1\n";
        let inodes: HashSet<String> = ["111".to_string(), "112".to_string()].into();
        assert_eq!(local_ports_to(table, 6379, &inodes), vec![0xD431]);
    }
}
