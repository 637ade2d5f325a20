//! The producer snippets in `producers/` (redis-cli, Python, Node, Ruby), run as child processes
//! as users run them: against the real bridge, ids scheduled, rescheduled and cancelled and an
//! inline member added arrive exactly as expected; the keys they derive are the bridge's; the
//! cancel script they embed is `src/redis/scripts/cancel.lua`.

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::redis_cluster::RedisCluster;
use common::*;
use delay_bridge::keys::{shard_key, shard_of, QueueKeys};

/// How long one run of a snippet may take (a cold interpreter on a busy machine included).
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// One snippet: how to run it, and how to load it as a library without running it.
struct Snippet {
    file: &'static str,
    /// The interpreter that runs `file`.
    runtime: &'static str,
    /// What it needs installed, for the failure message.
    needs: &'static str,
    /// A command (followed by the snippet's path) that loads the snippet, its Redis client
    /// included, without running it, and prints its embedded cancel script.
    loader: &'static [&'static str],
}

const REDIS_CLI: Snippet = Snippet {
    file: "redis-cli.sh",
    runtime: "bash",
    needs: "bash and redis-cli",
    loader: &[
        "bash",
        "-c",
        "command -v redis-cli >/dev/null || { echo 'no redis-cli' >&2; exit 1; }
         source \"$1\" && printf %s \"$CANCEL_LUA\"",
        "-",
    ],
};

const PYTHON: Snippet = Snippet {
    file: "producer.py",
    runtime: "python3",
    needs: "python3 and redis-py",
    loader: &[
        "python3",
        "-c",
        "import runpy, sys; sys.stdout.write(runpy.run_path(sys.argv[1])['CANCEL_LUA'])",
    ],
};

const NODE: Snippet = Snippet {
    file: "producer.js",
    runtime: "node",
    needs: "node and producers/node_modules (npm install --prefix producers)",
    loader: &[
        "node",
        "-e",
        "process.stdout.write(require(process.argv[1]).CANCEL_LUA)",
    ],
};

const RUBY: Snippet = Snippet {
    file: "producer.rb",
    runtime: "ruby",
    needs: "ruby and ruby-redis",
    loader: &["ruby", "-e", "load ARGV[0]; print CANCEL_LUA"],
};

impl Snippet {
    fn path(&self) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("producers")
            .join(self.file)
    }

    /// Loads the snippet and returns its embedded cancel script; fails the test, saying how to
    /// install them, if its runtime or Redis client is missing.
    fn load(&self) -> String {
        let mut cmd = Command::new(self.loader[0]);
        cmd.args(&self.loader[1..]).arg(self.path());
        match run_bounded(cmd) {
            Ok(out) if out.code == 0 => out.stdout,
            Ok(out) => panic!(
                "{}: {} not installed? Run scripts/test.sh, which installs them.\n{}",
                self.file,
                self.needs,
                out.text()
            ),
            Err(e) => panic!(
                "{}: {} not installed? Run scripts/test.sh, which installs them ({e})",
                self.file, self.needs
            ),
        }
    }

    /// Runs `snippet ARGS` on the shared Redis.
    fn try_run(&self, args: &[&str]) -> Output {
        self.try_run_with(args, &[("REDIS_URL", &redis_url())])
    }

    /// Runs `snippet ARGS` with the environment variables `env`.
    fn try_run_with(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(self.runtime);
        cmd.arg(self.path()).args(args).envs(env.iter().copied());
        run_bounded(cmd).unwrap_or_else(|e| panic!("{} {args:?}: {e}", self.file))
    }

    /// Runs `snippet ARGS`, asserting that it succeeds; returns what it printed.
    fn run(&self, args: &[&str]) -> String {
        let out = self.try_run(args);
        assert_eq!(out.code, 0, "{} {args:?}: {}", self.file, out.text());
        out.stdout
    }
}

/// Runs `cmd` to its end, killing it after [`RUN_TIMEOUT`].
fn run_bounded(mut cmd: Command) -> Result<Output, String> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    match rx.recv_timeout(RUN_TIMEOUT) {
        Ok(out) => {
            let out = out.map_err(|e| e.to_string())?;
            Ok(Output {
                code: out.status.code().unwrap_or(-1),
                stdout: String::from_utf8_lossy(&out.stdout).to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).to_string(),
            })
        }
        Err(_) => {
            kill(pid as i32, 9);
            Err(format!("{cmd:?} did not finish within {RUN_TIMEOUT:?}"))
        }
    }
}

/// (body, trigger, due time) of every message `capture` received, sorted.
fn arrivals(capture: &AmqpCapture) -> Vec<(String, String, i64)> {
    let mut got: Vec<(String, String, i64)> = capture
        .snapshot()
        .into_iter()
        .map(|m| {
            (
                String::from_utf8(m.body).unwrap(),
                m.trigger.unwrap_or_default(),
                m.due_ms.unwrap_or_default(),
            )
        })
        .collect();
    got.sort();
    got
}

/// The bodies hash of `keys`.
async fn bodies(r: &mut Conn, keys: &QueueKeys) -> HashMap<String, String> {
    redis::cmd("HGETALL")
        .arg(&keys.bodies)
        .query_async(r)
        .await
        .unwrap()
}

/// Ids scheduled, rescheduled both ways and cancelled, and a member added inline, with the
/// bridge running: exactly the due ones arrive, with the due time the snippet gave; the
/// cancelled one never (not even after a reschedule, which must not revive it), the parked one
/// not yet; the bodies hash is left with the parked id's body only.
async fn delivers_through_the_bridge(snippet: &Snippet) {
    snippet.load();
    let mut r = redis().await;
    let capture = AmqpCapture::start("producers").await;
    let key = format!("delay:{{{}}}", unique("producers"));
    let keys = QueueKeys::derive(&key).unwrap();
    let inline_key = unique("producers-inline");
    let port = free_port();
    let config = base_config(port)
        + &amqp_trigger("byid", &key, &capture, "payload = \"hash\"")
        + &amqp_trigger("inline", &inline_key, &capture, "");
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(30))
        .await;

    let now = redis_now(&mut r).await;
    let (soon, later, far) = (now + 300, now + 30_000, now + 3_600_000);
    // Bodies that break naive quoting: quotes, backslashes, newlines, a leading dash, non-ASCII.
    let scheduled = [
        ("quotes", "say \"hi\" and 'bye' \\ `x` $HOME", soon),
        ("lines", "two\nlines\r\n", soon + 10),
        ("utf8", "ünïcødé ✓ 🚀", soon + 20),
        ("dash", "-n  spaces  ", soon + 30),
        ("parked", "rescheduled away", later),
        ("earlier", "rescheduled to soon", far),
        ("cancelled", "never sent", far),
    ];
    let body_of: HashMap<&str, &str> = scheduled.iter().map(|(id, b, _)| (*id, *b)).collect();
    for (id, body, due) in &scheduled {
        snippet.run(&["schedule", &key, id, body, &due.to_string()]);
    }
    let moved = |args: &[&str]| snippet.run(args).trim().to_string();
    assert_eq!(
        moved(&["reschedule", &key, "parked", &far.to_string()]),
        "1"
    );
    assert_eq!(
        moved(&["reschedule", &key, "earlier", &(soon + 40).to_string()]),
        "1"
    );
    assert_eq!(snippet.run(&["cancel", &key, "cancelled"]).trim(), "1");
    assert_eq!(snippet.run(&["cancel", &key, "cancelled"]).trim(), "0");
    assert_eq!(
        moved(&["reschedule", &key, "cancelled", &soon.to_string()]),
        "0",
        "a cancelled id is not revived, and the snippet says so"
    );
    let inline = "{\"inline\": \"the member is the message\"}";
    snippet.run(&["add", &inline_key, inline, &(soon + 50).to_string()]);

    // (body, trigger, due) of every message that must arrive.
    let mut want: Vec<(String, String, i64)> = [
        (body_of["quotes"], "byid", soon),
        (body_of["lines"], "byid", soon + 10),
        (body_of["utf8"], "byid", soon + 20),
        (body_of["dash"], "byid", soon + 30),
        (body_of["earlier"], "byid", soon + 40),
        (inline, "inline", soon + 50),
    ]
    .map(|(body, trigger, due)| (body.to_string(), trigger.to_string(), due))
    .to_vec();
    want.sort();

    bridge
        .expect_arrivals(want.len(), Duration::from_secs(30), || capture.count())
        .await;
    // Everything due is acked: only the parked id is left, nothing in flight.
    let (settled, state) = poll(
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || {
            (
                queue_sizes(&mut r, &key).await,
                queue_sizes(&mut r, &inline_key).await,
                zscore(&mut r, &key, "parked").await,
            )
        },
        |(byid, inline, parked)| *byid == (1, 0, 0) && *inline == (0, 0, 0) && parked.is_some(),
    )
    .await;
    assert!(settled, "{state:?}\n{}", bridge.log());
    assert_eq!(arrivals(&capture), want, "{}", bridge.log());
    assert_eq!(
        bodies(&mut r, &keys).await,
        HashMap::from([("parked".to_string(), body_of["parked"].to_string())]),
        "the bodies hash keeps the parked id's body only"
    );
    assert_eq!(zscore(&mut r, &key, "parked").await, Some(far as f64));
    finish(bridge, &mut r, &key).await;
    cleanup_keys(&mut r, &inline_key).await;
}

/// For a plain key, a tagged one and one whose tag is `{tag` (the first `{` to the next `}`):
/// bodies go to the bridge's bodies key, and cancel passes the bridge's in-flight and
/// dead-letter keys (a body whose id is there stays). A key with braces but no usable tag is
/// refused.
async fn derives_the_bridge_keys(snippet: &Snippet) {
    snippet.load();
    let mut r = redis().await;
    let shapes = [
        unique("plain"),
        format!("delay:{{{}}}", unique("tag")),
        format!("{}{{{{tag}}}}zap", unique("odd")),
    ];
    for key in &shapes {
        let keys = QueueKeys::derive(key).unwrap();
        let due = "4102444800000"; // 2100-01-01: never due
        for id in ["claimed", "dead", "plain"] {
            snippet.run(&["schedule", key, id, &format!("body of {id}"), due]);
        }
        assert_eq!(
            bodies(&mut r, &keys).await.len(),
            3,
            "{}: bodies of `{key}` belong in `{}`",
            snippet.file,
            keys.bodies
        );
        // Copies of the first two ids as if the bridge had claimed or dead-lettered them.
        zadd(&mut r, &keys.inflight, 1, "claimed").await;
        zadd(&mut r, &keys.dead, 1, "dead").await;
        for id in ["claimed", "dead", "plain"] {
            assert_eq!(snippet.run(&["cancel", key, id]).trim(), "1", "{key} {id}");
        }
        assert_eq!(zcard(&mut r, key).await, 0, "{key}");
        let mut left: Vec<String> = bodies(&mut r, &keys).await.into_keys().collect();
        left.sort();
        assert_eq!(
            left,
            ["claimed", "dead"],
            "{}: cancel must keep the bodies of ids in `{}` and `{}` and delete the other's",
            snippet.file,
            keys.inflight,
            keys.dead
        );
        cleanup_keys(&mut r, key).await;
    }
    let bad = format!("{}{{}}", unique("bad"));
    let out = snippet.try_run(&["schedule", &bad, "id", "body", "0"]);
    assert_ne!(out.code, 0, "{}: `{bad}` accepted", snippet.file);
    assert!(out.stderr.contains("braces"), "{}", out.text());
    assert_eq!(zcard(&mut r, &bad).await, 0);
}

/// The cancel script the snippet embeds is `src/redis/scripts/cancel.lua` (bash's `$(...)` drops the
/// final newline, so that one is not compared).
fn embeds_the_cancel_script(snippet: &Snippet) {
    let file = include_str!("../../src/redis/scripts/cancel.lua");
    assert_eq!(
        snippet.load().trim_end_matches('\n'),
        file.trim_end_matches('\n'),
        "{}: copy src/redis/scripts/cancel.lua into it again",
        snippet.file
    );
}

/// Every snippet on a private Redis Cluster (`REDIS_CLUSTER`) and triggers of 6 shards
/// (`SHARDS`): ids scheduled, rescheduled both ways and cancelled through the shard hash arrive
/// exactly as expected, on time, and none twice; each id the snippets left scheduled sits in
/// the shard the bridge's own hash names; the cancelled ones are gone from every shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_snippet_through_the_shard_hash_on_a_cluster() {
    const SHARDS: u32 = 6;
    let snippets = [REDIS_CLI, PYTHON, NODE, RUBY];
    for s in &snippets {
        s.load();
    }
    let cluster = RedisCluster::start().await;
    let mut r = cluster.conn().await;
    let capture = AmqpCapture::start("producers-cluster").await;
    let key = format!("delay:{{{}}}", unique("byid"));
    let inline_key = format!("delay:{{{}}}", unique("inline"));
    let port = free_port();
    let nodes: Vec<String> = cluster.seeds().iter().map(|s| quoted(s)).collect();
    let sharded = format!("shards = {SHARDS}\nworkers = 2");
    let config = ConfigToml::base(port)
        .without("redis")
        .set_str("redis", "mode", "cluster")
        .set("redis", "nodes", &format!("[{}]", nodes.join(", ")))
        .set("redis", "enable_keyspace_events", "true")
        .to_string()
        + &amqp_trigger(
            "byid",
            &key,
            &capture,
            &format!("payload = \"hash\"\n{sharded}"),
        )
        + &amqp_trigger("inline", &inline_key, &capture, &sharded);
    let bridge = Bridge::start(&config, port)
        .ready(Duration::from_secs(30))
        .await;
    let seeds = cluster.seeds().join(",");
    let shards = SHARDS.to_string();
    let env = [
        ("REDIS_CLUSTER", seeds.as_str()),
        ("SHARDS", shards.as_str()),
    ];

    let mut want: Vec<(String, String, i64)> = Vec::new();
    for s in &snippets {
        // A cold interpreter with a cluster client takes a while per call: the parked id is
        // due late enough to be moved before the bridge could claim it.
        let now = now_ms();
        let (soon, later, far) = (now + 1_500, now + 120_000, now + 3_600_000);
        let run = |args: &[&str]| {
            let out = s.try_run_with(args, &env);
            assert_eq!(out.code, 0, "{} {args:?}: {}", s.file, out.text());
            out.stdout.trim().to_string()
        };
        let id = |name: &str| format!("{}-{name}", s.file);
        for (name, due) in [
            ("a", soon),
            ("b", soon + 10),
            ("parked", later),
            ("earlier", far),
            ("cancelled", far),
        ] {
            run(&[
                "schedule",
                &key,
                &id(name),
                &format!("body of {}", id(name)),
                &due.to_string(),
            ]);
        }
        assert_eq!(
            run(&["reschedule", &key, &id("parked"), &far.to_string()]),
            "1"
        );
        assert_eq!(
            run(&["reschedule", &key, &id("earlier"), &(soon + 20).to_string()]),
            "1"
        );
        assert_eq!(run(&["cancel", &key, &id("cancelled")]), "1");
        assert_eq!(run(&["cancel", &key, &id("cancelled")]), "0");
        assert_eq!(
            run(&["reschedule", &key, &id("cancelled"), &soon.to_string()]),
            "0"
        );
        let member = format!("{} inline", s.file);
        run(&["add", &inline_key, &member, &(soon + 30).to_string()]);
        for (name, due) in [("a", soon), ("b", soon + 10), ("earlier", soon + 20)] {
            want.push((format!("body of {}", id(name)), "byid".into(), due));
        }
        want.push((member, "inline".into(), soon + 30));
    }
    want.sort();

    bridge
        .expect_arrivals(want.len(), Duration::from_secs(30), || capture.count())
        .await;
    // Time for a duplicate to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(arrivals(&capture), want, "{}", bridge.log());
    for s in &snippets {
        let parked = format!("{}-parked", s.file);
        let far: f64 = redis::cmd("ZSCORE")
            .arg(shard_key(&key, shard_of(parked.as_bytes(), SHARDS), SHARDS).unwrap())
            .arg(&parked)
            .query_async(&mut r)
            .await
            .unwrap();
        assert!(
            far > (now_ms() + 600_000) as f64,
            "{parked} moved far ahead: {far}"
        );
        for (name, score) in [("parked", Some(far)), ("cancelled", None)] {
            let id = format!("{}-{name}", s.file);
            let own = shard_key(&key, shard_of(id.as_bytes(), SHARDS), SHARDS).unwrap();
            let found = cluster_zscore(&mut r, &own, &id).await;
            assert_eq!(found, score, "{id} in {own}");
            for i in 0..SHARDS {
                let other = shard_key(&key, i, SHARDS).unwrap();
                if other != own {
                    let found = cluster_zscore(&mut r, &other, &id).await;
                    assert_eq!(found, None, "{id} in {other}, not its own shard {own}");
                }
            }
        }
    }
    bridge.assert_no_panic();
}

macro_rules! snippet_tests {
    ($($module:ident: $snippet:expr;)*) => {$(
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn delivers_through_the_bridge() {
                super::delivers_through_the_bridge(&$snippet).await;
            }

            #[tokio::test]
            async fn derives_the_bridge_keys() {
                super::derives_the_bridge_keys(&$snippet).await;
            }

            #[test]
            fn embeds_the_cancel_script() {
                super::embeds_the_cancel_script(&$snippet);
            }
        }
    )*};
}

snippet_tests! {
    redis_cli: REDIS_CLI;
    python: PYTHON;
    node: NODE;
    ruby: RUBY;
}

/// `ZSCORE key member` on a Redis Cluster.
async fn cluster_zscore(
    r: &mut redis::cluster_async::ClusterConnection,
    key: &str,
    member: &str,
) -> Option<f64> {
    redis::AsyncCommands::zscore(r, key, member).await.unwrap()
}
