//! Config fuzzing in-process: every field of the file given a value of the wrong type or out of
//! range, and bad environment overrides, through the library's loader (what `delay-bridge
//! check` runs). Each must be refused naming its key, and never panic. That the binary turns a
//! refusal into exit code 78 is tests/it/config.rs's business.
//!
//! Every test runs in a `figment::Jail` (its own working directory, environment restored
//! afterwards), which also keeps them from running at the same time.
// figment::Jail closures return figment::Error, which is large by design.
#![allow(clippy::result_large_err)]

use crate::common;

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use common::{MINIMAL_SINK as SINK, MINIMAL_TRIGGER as TRIGGER};
use figment::Jail;

const KAFKA_SINK: &str = "[sinks.k]\ntype = \"kafka\"\nbrokers = \"127.0.0.1:9092\"\n";
const KAFKA_TRIGGER: &str =
    "[[triggers]]\nname = \"kt\"\nkey = \"kk\"\nsink = \"k\"\ntopic = \"x\"\n";

/// What loading a config file came to.
enum Loaded {
    Valid,
    /// Refused, with every problem as `delay-bridge check` prints them.
    Refused(String),
    /// The loader panicked: never acceptable.
    Panicked(String),
}

impl fmt::Debug for Loaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loaded::Valid => write!(f, "accepted"),
            Loaded::Refused(text) => write!(f, "refused:\n{text}"),
            Loaded::Panicked(text) => write!(f, "PANICKED: {text}"),
        }
    }
}

/// Writes `toml` into the jail and loads it with `delay_bridge::parts::config::load`, environment
/// overrides included, as `delay-bridge check` does.
fn load(jail: &Jail, toml: &str) -> Loaded {
    jail.create_file("c.toml", toml).unwrap();
    let loaded = catch_unwind(AssertUnwindSafe(|| {
        delay_bridge::parts::config::load(Path::new("c.toml"))
    }));
    match loaded {
        Ok(Ok(_)) => Loaded::Valid,
        Ok(Err(e)) => Loaded::Refused(e.to_string()),
        Err(panic) => Loaded::Panicked(
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
        ),
    }
}

/// Wrong values for a field, by the field's type.
fn wrong_values(kind: &str) -> Vec<&'static str> {
    let mut v = vec!["{ a = 1 }", "[1, 2]"];
    v.extend(match kind {
        "string" => vec!["42", "true", "1.5"],
        "duration" => vec!["42", "\"soon\"", "\"-1s\"", "true", "\"1 fortnight\""],
        "count" => vec!["-1", "\"four\"", "1.5", "99999999999999999999999", "true"],
        "bool" => vec!["\"yes\"", "1"],
        "addr" => vec![
            "\"nonsense\"",
            "9464",
            "\"127.0.0.1\"",
            "\"127.0.0.1:99999\"",
        ],
        "enum" => vec!["\"xml\"", "1"],
        "list" => vec!["42", "true", "\"amqp://h/%2f\"", "[]"],
        "table" => vec!["1", "\"x\""],
        _ => unreachable!("{kind}"),
    });
    v
}

/// The valid base config with `line` set in `section` (replacing the field if already set).
fn with_line(section: &str, line: &str) -> String {
    let mut parts: Vec<(&str, String)> = vec![
        ("redis", "[redis]\n".into()),
        ("metrics", "[metrics]\n".into()),
        ("log", "[log]\n".into()),
        ("shutdown", "[shutdown]\n".into()),
        ("sinks.r", SINK.into()),
        ("sinks.k", KAFKA_SINK.into()),
        ("triggers", TRIGGER.into()),
        ("kafka_triggers", KAFKA_TRIGGER.into()),
    ];
    let part = &mut parts
        .iter_mut()
        .find(|(name, _)| *name == section)
        .unwrap()
        .1;
    let field = format!("{} =", line.split('=').next().unwrap().trim());
    let kept: Vec<&str> = part.lines().filter(|l| !l.starts_with(&field)).collect();
    *part = format!("{}\n{line}\n", kept.join("\n"));
    parts.into_iter().map(|(_, p)| p).collect()
}

/// The key a problem with `field` in `section` of [`with_line`]'s config is reported under.
fn key_of(section: &str, field: &str) -> String {
    match section {
        "triggers" => format!("triggers[0].{field}"),
        "kafka_triggers" => format!("triggers[1].{field}"),
        _ => format!("{section}.{field}"),
    }
}

/// Every field of the config, a section a line: `section: field=type ...`.
const FIELDS: &str = include_str!("config_load/fields.txt");

/// Out-of-range numbers and values that parse but cannot work, a line each:
/// `section: line`, reported under the line's field (see [`key_of`]) unless `=> key` says.
const OUT_OF_RANGE: &str = include_str!("config_load/out_of_range.txt");

#[test]
fn every_field_with_a_wrong_type_or_range_is_refused_naming_the_key() {
    Jail::expect_with(|jail| {
        let base = load(jail, &with_line("redis", ""));
        assert!(matches!(base, Loaded::Valid), "the base config: {base:?}");

        let mut failures = Vec::new();
        let mut runs = 0;
        let mut probe = |section: &str, line: String, key: &str| {
            runs += 1;
            let loaded = load(jail, &with_line(section, &line));
            // A number TOML itself cannot hold fails parsing: the error names the line, not a
            // key path, and must not be followed by problems about a config never read.
            let named = |text: &str| {
                if line.contains("99999999999999999999999") {
                    let field = line.split('=').next().unwrap().trim();
                    text.contains(field) && text.contains("line") && !text.contains("at least one")
                } else {
                    text.contains(key)
                }
            };
            if !matches!(&loaded, Loaded::Refused(text) if named(text)) {
                failures.push(format!("`{line}` in [{section}], key {key}: {loaded:?}"));
            }
        };
        for row in FIELDS.lines().filter(|l| !l.is_empty()) {
            let (section, fields) = row.split_once(": ").unwrap();
            for (field, kind) in fields.split(' ').filter_map(|f| f.split_once('=')) {
                for value in wrong_values(kind) {
                    probe(
                        section,
                        format!("{field} = {value}"),
                        &key_of(section, field),
                    );
                }
            }
        }
        for row in OUT_OF_RANGE.lines().filter(|l| !l.is_empty()) {
            let (section, rest) = row.split_once(": ").unwrap();
            let (line, key) = match rest.split_once(" => ") {
                Some((line, key)) => (line, key.to_string()),
                None => (rest, key_of(section, rest.split(" =").next().unwrap())),
            };
            probe(section, line.to_string(), &key);
        }
        // Whole sections of the wrong shape.
        for (toml, key) in [
            (format!("redis = 1\n{SINK}{TRIGGER}"), "redis"),
            (format!("sinks = \"r\"\n{TRIGGER}"), "sinks"),
            (format!("triggers = 1\n{SINK}"), "triggers"),
            (format!("triggers = [1, 2]\n{SINK}"), "triggers[0]"),
            (format!("{SINK}[triggers]\nname = \"t\"\n"), "triggers"),
            (
                format!("{SINK}{TRIGGER}[[triggers]]\nname = \"t2\"\n"),
                "triggers[1].key",
            ),
            ("[[triggers]\nname = ".to_string(), ""),
            ("\u{0}\u{1}binary \u{7f}".to_string(), ""),
        ] {
            runs += 1;
            let loaded = load(jail, &toml);
            if !matches!(&loaded, Loaded::Refused(text) if text.contains(key)) {
                failures.push(format!("{toml:?}, key {key}: {loaded:?}"));
            }
        }
        assert!(
            failures.is_empty(),
            "{} of {runs} bad configs were not reported properly:\n\n{}",
            failures.len(),
            failures.join("\n\n")
        );
        Ok(())
    });
}

#[test]
fn a_bad_environment_override_is_named_with_its_variable() {
    for (var, value, key) in [
        (
            "DELAY_BRIDGE_REDIS__CONNECT_TIMEOUT",
            "soon",
            "redis.connect_timeout",
        ),
        ("DELAY_BRIDGE_METRICS__LISTEN", "nowhere", "metrics.listen"),
        ("DELAY_BRIDGE_SHUTDOWN__TIMEOUT", "0s", "shutdown.timeout"),
        ("DELAY_BRIDGE_REDIS__URL", "ftp://x", "redis.url"),
        (
            "DELAY_BRIDGE_SINKS__R__URLS",
            "[\"amqp://n1/%2f\", \"amqp://n2/%2f\"]",
            "sinks.r.urls",
        ),
    ] {
        // A jail each: only this variable is set.
        Jail::expect_with(|jail| {
            jail.set_env(var, value);
            match load(jail, &format!("{SINK}{TRIGGER}")) {
                Loaded::Refused(text) => {
                    assert!(text.contains(key), "{var}={value}: {text}");
                    assert!(
                        text.contains("DELAY_BRIDGE_") || text.contains("environment"),
                        "{var}: source named: {text}"
                    );
                }
                other => panic!("{var}={value}: {other:?}"),
            }
            Ok(())
        });
    }
}
