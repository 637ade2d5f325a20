//! Instructions per message, counted by callgrind on a fixed small workload, which two runs on a
//! noisy machine agree on: the bridge draining it, the sink's independent publisher sending it
//! and the claim/settle client draining it, each at `n` and `2n` messages so that start-up and
//! shutdown cancel out.

use std::path::{Path, PathBuf};

use super::*;
use crate::child;
use crate::report::Instructions;

/// How long a program under callgrind may take to get ready, to drain and to stop: it runs
/// some fifty times slower than natively.
const UNDER_CALLGRIND: Duration = Duration::from_secs(900);

impl Bench {
    /// Counts the three programs at `--instructions-messages` and twice as many; `None`, with
    /// a note, when valgrind is not installed.
    pub(super) async fn instructions(
        &self,
        notes: &mut Vec<String>,
    ) -> anyhow::Result<Option<Instructions>> {
        if let Some(why) = valgrind_missing() {
            let note = format!("instructions left out: {why}");
            eprintln!("bench: {note}");
            notes.push(note);
            return Ok(None);
        }
        let n = self.args.instructions_messages;
        let dir = self.args.callgrind_dir.as_ref().unwrap_or(&self.dir);
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut publisher_name = "";
        let (mut bridge, mut publisher, mut claim_settle) = ([0; 2], [0; 2], [0; 2]);
        for (i, m) in [n, 2 * n].into_iter().enumerate() {
            eprintln!("bench: instructions, the bridge under callgrind, {m} messages");
            let out = dir.join(format!("callgrind.bridge-{m}.out"));
            self.drain_under(&callgrind(&out), m).await?;
            bridge[i] = counted(&out)?;
            let p = self.publisher(m)?;
            eprintln!("bench: instructions, the {} under callgrind", p.name);
            let out = dir.join(format!("callgrind.publisher-{m}.out"));
            child::spawn(&callgrind(&out), p.args)
                .await
                .context(p.name)?;
            publisher[i] = counted(&out)?;
            publisher_name = p.name;
            eprintln!("bench: instructions, the claim/settle client under callgrind");
            let out = dir.join(format!("callgrind.claim-settle-{m}.out"));
            self.claim_settle_child(m, &callgrind(&out)).await?;
            claim_settle[i] = counted(&out)?;
        }
        Ok(Some(Instructions {
            messages: n,
            publisher_name,
            bridge,
            publisher,
            claim_settle,
        }))
    }

    /// A bridge started under `wrapper` draining `n` members due now, loaded and released as
    /// for the forwarding rate, then stopped.
    async fn drain_under(&self, wrapper: &[String], n: u64) -> anyhow::Result<()> {
        let what = format!("instructions-{n}");
        let staged = self.stage(&what, n).await?;
        let key = staged.key.clone();
        let (bridge, _) = self
            .start_bridge_under(wrapper, UNDER_CALLGRIND, &what, std::slice::from_ref(&key))
            .await?;
        self.tally.reset(staged.base, n);
        self.release(&staged).await?;
        let end = Instant::now() + UNDER_CALLGRIND;
        let drained = self
            .wait_drained(&self.conn, std::slice::from_ref(&key), n, &bridge, end)
            .await;
        let stopped = bridge.stop(UNDER_CALLGRIND).await;
        redis_ops::unlink_queue(&mut self.conn.clone(), &key).await?;
        drained.and(stopped)
    }
}

/// Why callgrind cannot run here, if it cannot.
fn valgrind_missing() -> Option<String> {
    match std::process::Command::new("valgrind")
        .arg("--version")
        .output()
    {
        Ok(out) if out.status.success() => None,
        _ => Some("valgrind not found (Debian's valgrind package)".into()),
    }
}

/// The command line that runs a program under callgrind, its counts written to `out`.
fn callgrind(out: &Path) -> Vec<String> {
    vec![
        "valgrind".into(),
        "--quiet".into(),
        "--tool=callgrind".into(),
        format!("--callgrind-out-file={}", out.display()),
    ]
}

/// The instructions callgrind counted in all, from its output file's `summary:` (or `totals:`)
/// line.
fn counted(out: &PathBuf) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(out)
        .with_context(|| format!("reading callgrind's {}", out.display()))?;
    total_of(&text).with_context(|| format!("no summary line in {}", out.display()))
}

fn total_of(text: &str) -> Option<u64> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("summary:"))
        .or_else(|| text.lines().find_map(|l| l.strip_prefix("totals:")))?;
    line.split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_total_is_read_from_the_summary_line() {
        let text = "version: 1\ncmd: x\nevents: Ir\nfl=(1) a\nfn=(1) f\n3 7\nsummary: 123456\n";
        assert_eq!(total_of(text), Some(123_456));
        assert_eq!(total_of("events: Ir\ntotals: 42\n"), Some(42));
        assert_eq!(total_of("events: Ir\n"), None);
    }
}
