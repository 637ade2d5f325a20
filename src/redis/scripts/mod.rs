//! The Lua scripts by name: each begins with the prelude (`scripts/prelude.lua`, its
//! helpers and the keys' order), and each text is found by its SHA1 for a server that lost
//! its script cache (NOSCRIPT).

use redis::Script;

/// The scripts the store calls, each by name.
pub(crate) struct Scripts {
    pub claim: Script,
    pub settle: Script,
    pub recover: Script,
    pub requeue: Script,
    pub stats: Script,
    pub cancel: Script,
    pub browse: Script,
    pub reschedule: Script,
    pub purge: Script,
    pub dead_claim: Script,
    pub dead_settle: Script,
    pub ingest: Script,
}

/// Helpers every script starts with.
const PRELUDE: &str = include_str!("prelude.lua");

const CLAIM: &str = include_str!("claim.lua");
const SETTLE: &str = include_str!("settle.lua");
const RECOVER: &str = include_str!("recover.lua");
const REQUEUE: &str = include_str!("requeue.lua");
const STATS: &str = include_str!("stats.lua");
const BROWSE: &str = include_str!("browse.lua");
const RESCHEDULE: &str = include_str!("reschedule.lua");
const PURGE: &str = include_str!("purge.lua");
const DEAD_CLAIM: &str = include_str!("dead_claim.lua");
const DEAD_SETTLE: &str = include_str!("dead_settle.lua");
const INGEST: &str = include_str!("ingest.lua");

/// The bodies of the scripts that start with [`PRELUDE`].
const WITH_PRELUDE: [&str; 11] = [
    CLAIM,
    SETTLE,
    RECOVER,
    REQUEUE,
    STATS,
    BROWSE,
    RESCHEDULE,
    PURGE,
    DEAD_CLAIM,
    DEAD_SETTLE,
    INGEST,
];

/// The cancel script of hash payload mode, as producers run it (KEYS: source, inflight,
/// dead, bodies; ARGV: id).
pub const CANCEL: &str = include_str!("cancel.lua");

fn script(body: &str) -> Script {
    Script::new(&with_prelude(body))
}

/// A script's full text: [`PRELUDE`], then its body.
fn with_prelude(body: &str) -> String {
    format!("{PRELUDE}\n{body}")
}

/// Every script, made once.
pub(crate) static SCRIPTS: std::sync::LazyLock<Scripts> = std::sync::LazyLock::new(|| Scripts {
    claim: script(CLAIM),
    settle: script(SETTLE),
    recover: script(RECOVER),
    requeue: script(REQUEUE),
    stats: script(STATS),
    browse: script(BROWSE),
    reschedule: script(RESCHEDULE),
    purge: script(PURGE),
    dead_claim: script(DEAD_CLAIM),
    dead_settle: script(DEAD_SETTLE),
    ingest: script(INGEST),
    // The producers' own script: standalone, so that it reads the same wherever it is used.
    cancel: Script::new(CANCEL),
});

/// The text of one of the bridge's scripts by its SHA1, for sending it in full to a server
/// that does not have it cached.
pub(crate) fn script_text(sha: &str) -> Option<&'static str> {
    static TEXTS: std::sync::LazyLock<std::collections::HashMap<String, String>> =
        std::sync::LazyLock::new(|| {
            let mut texts: Vec<String> =
                WITH_PRELUDE.iter().map(|body| with_prelude(body)).collect();
            texts.push(CANCEL.to_string());
            texts
                .into_iter()
                .map(|text| (Script::new(&text).get_hash().to_string(), text))
                .collect()
        });
    TEXTS.get(sha).map(String::as_str)
}
