//! The Lua scripts by name: each begins with the prelude (`scripts/prelude.lua`, its
//! helpers and the keys' order), and each text is found by its SHA1 for a server that lost
//! its script cache (NOSCRIPT).

use redis::Script;

/// Helpers every script starts with.
const PRELUDE: &str = include_str!("scripts/prelude.lua");

/// Declares the scripts that start with [`PRELUDE`], each by name and file, once: the
/// [`Scripts`] fields, their texts for [`script_text`], and [`SCRIPTS`].
macro_rules! scripts {
    ($($name:ident: $file:literal,)*) => {
        /// The scripts the store calls, each by name.
        pub(crate) struct Scripts {
            $(pub $name: Script,)*
            pub cancel: Script,
        }

        /// The bodies of the scripts that start with [`PRELUDE`].
        const WITH_PRELUDE: &[&str] = &[$(include_str!($file)),*];

        /// Every script, made once.
        pub(crate) static SCRIPTS: std::sync::LazyLock<Scripts> =
            std::sync::LazyLock::new(|| Scripts {
                $($name: script(include_str!($file)),)*
                // The producers' own script: standalone, so that it reads the same wherever
                // it is used.
                cancel: Script::new(CANCEL),
            });
    };
}

scripts! {
    claim: "scripts/claim.lua",
    settle: "scripts/settle.lua",
    recover: "scripts/recover.lua",
    requeue: "scripts/requeue.lua",
    stats: "scripts/stats.lua",
    browse: "scripts/browse.lua",
    reschedule: "scripts/reschedule.lua",
    purge: "scripts/purge.lua",
    dead_claim: "scripts/dead_claim.lua",
    dead_settle: "scripts/dead_settle.lua",
    ingest: "scripts/ingest.lua",
    schedule: "scripts/schedule.lua",
    schedule_read: "scripts/schedule_read.lua",
}

/// The cancel script of hash payload mode, as producers run it (KEYS: source, inflight,
/// dead, bodies; ARGV: id).
pub const CANCEL: &str = include_str!("scripts/cancel.lua");

fn script(body: &str) -> Script {
    Script::new(&with_prelude(body))
}

/// A script's full text: [`PRELUDE`], then its body.
fn with_prelude(body: &str) -> String {
    format!("{PRELUDE}\n{body}")
}

/// The full text of every script the bridge runs (the engine check loads each).
pub(crate) fn all_texts() -> Vec<String> {
    let mut texts: Vec<String> = WITH_PRELUDE.iter().map(|body| with_prelude(body)).collect();
    texts.push(CANCEL.to_string());
    texts
}

/// The text of one of the bridge's scripts by its SHA1, for sending it in full to a server
/// that does not have it cached.
pub(crate) fn script_text(sha: &str) -> Option<&'static str> {
    static TEXTS: std::sync::LazyLock<std::collections::HashMap<String, String>> =
        std::sync::LazyLock::new(|| {
            all_texts()
                .into_iter()
                .map(|text| (Script::new(&text).get_hash().to_string(), text))
                .collect()
        });
    TEXTS.get(sha).map(String::as_str)
}
