//! The book keeps up with the code: every configuration key the loader accepts, with the bounds
//! the validator enforces, is in `docs/configuration.md`; every command and flag of the command
//! line is in `docs/cli.md`; every alert's runbook and every link of the README into the book
//! names a heading that exists.

use crate::common::assert_none_found;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use figment::providers::{Format, Toml};
use figment::Figment;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// A field name no section accepts nor comes near, so serde lists every valid one.
const PROBE: &str = "zzzz_not_a_key";

/// One table of the configuration file: the TOML that opens it (with `{P}` where a probed line
/// goes), the dotted key its problems are reported under, and the heading of its reference.
struct Section {
    toml: &'static str,
    key: &'static str,
    heading: &'static str,
}

const AMQP: &str = "[sinks.rabbit]\ntype = \"amqp\"\nurl = \"amqp://127.0.0.1:5672/%2f\"\n";

fn sections() -> Vec<Section> {
    vec![
        Section {
            toml: "[redis]\n{P}\n",
            key: "redis",
            heading: "`[redis]`",
        },
        Section {
            toml: "[redis.tls]\n{P}\n",
            key: "redis.tls",
            heading: "TLS",
        },
        Section {
            toml: "[metrics]\n{P}\n",
            key: "metrics",
            heading: "`[metrics]`",
        },
        Section {
            toml: "[admin]\n{P}\n",
            key: "admin",
            heading: "`[admin]`",
        },
        Section {
            toml: "[log]\n{P}\n",
            key: "log",
            heading: "`[log]`",
        },
        Section {
            toml: "[shutdown]\n{P}\n",
            key: "shutdown",
            heading: "`[shutdown]`",
        },
        Section {
            toml: "[sinks.rabbit]\ntype = \"amqp\"\nurl = \"amqp://127.0.0.1:5672/%2f\"\n{P}\n",
            key: "sinks.rabbit",
            heading: "`[sinks.NAME]` with `type = \"amqp\"`",
        },
        Section {
            toml: "[sinks.rabbit]\ntype = \"amqp\"\nurl = \"amqp://127.0.0.1:5672/%2f\"\n[sinks.rabbit.tls]\n{P}\n",
            key: "sinks.rabbit.tls",
            heading: "TLS",
        },
        Section {
            toml: "[sinks.rabbit]\ntype = \"amqp\"\nurl = \"amqp://127.0.0.1:5672/%2f\"\n[[sinks.rabbit.declare]]\nexchange = \"x\"\n{P}\n",
            key: "sinks.rabbit.declare[0]",
            heading: "`[[sinks.NAME.declare]]`",
        },
        Section {
            toml: "[sinks.events]\ntype = \"kafka\"\nbrokers = \"127.0.0.1:9092\"\n{P}\n",
            key: "sinks.events",
            heading: "`[sinks.NAME]` with `type = \"kafka\"`",
        },
        Section {
            toml: "[sinks.hooks]\ntype = \"http\"\n{P}\n",
            key: "sinks.hooks",
            heading: "`[sinks.NAME]` with `type = \"http\"`",
        },
        Section {
            toml: "[sinks.hooks]\ntype = \"http\"\n[sinks.hooks.tls]\n{P}\n",
            key: "sinks.hooks.tls",
            heading: "TLS",
        },
        Section {
            toml: "[[triggers]]\nname = \"t\"\nkey = \"delay:{t}\"\nsink = \"rabbit\"\nexchange = \"\"\n{P}\n",
            key: "triggers[0]",
            heading: "`[[triggers]]`",
        },
        Section {
            toml: "[[triggers]]\nname = \"t\"\nkey = \"delay:{t}\"\nsink = \"rabbit\"\nexchange = \"\"\n[triggers.ingress]\nexchange = \"d\"\n{P}\n",
            key: "triggers[0].ingress",
            heading: "`[triggers.ingress]`",
        },
        Section {
            toml: "[[triggers]]\nname = \"t\"\nkey = \"delay:{t}\"\nsink = \"rabbit\"\nexchange = \"\"\n[[triggers.schedules]]\nname = \"s\"\ncron = \"* * * * *\"\nbody = \"\"\n{P}\n",
            key: "triggers[0].schedules[0]",
            heading: "`[[triggers.schedules]]`",
        },
    ]
}

/// The problems the library's loader (what `check` runs) reports for `section` with `line` in it;
/// a line the template already sets replaces the template's.
fn problems(section: &Section, line: &str) -> Vec<delay_bridge::parts::config::Problem> {
    let field = line.split('=').next().unwrap_or("").trim();
    let table: String = section
        .toml
        .lines()
        .filter(|l| l.split('=').next().unwrap_or("").trim() != field)
        .map(|l| format!("{}\n", l.replace("{P}", line)))
        .collect();
    let needs_sink = section.key.starts_with("triggers");
    let text = if needs_sink {
        format!("{AMQP}\n{table}")
    } else {
        table
    };
    let figment = Figment::new().merge(Toml::string(&text));
    match delay_bridge::parts::config::load_from(figment, Path::new("probe.toml")) {
        Ok(_) => Vec::new(),
        Err(e) => e.problems,
    }
}

/// Every field the section's table accepts, as serde lists them for an unknown one.
fn fields(section: &Section) -> Vec<String> {
    let key = format!("{}.{PROBE}", section.key);
    let found = problems(section, &format!("{PROBE} = 1"));
    let problem = found
        .iter()
        .find(|p| p.key == key)
        .unwrap_or_else(|| panic!("no unknown-field problem for {key}: {found:?}"));
    let (_, list) = problem
        .message
        .split_once("expected one of: ")
        .unwrap_or_else(|| panic!("no list of fields in {:?}", problem.message));
    list.split(", ")
        .map(|f| f.trim_matches('`').to_string())
        .collect()
}

/// Values outside every range the validator checks: zero, huge, tiny and huge durations, a long
/// AMQP name, a rate over the limit. Those of the wrong type are refused by serde, not by a bound.
fn probe_values() -> Vec<String> {
    vec![
        "0".into(),
        "1000000000000000".into(),
        "\"0s\"".into(),
        "\"1ms\"".into(),
        "\"100000d\"".into(),
        format!("\"{}\"", "x".repeat(300)),
        "\"10000000/s\"".into(),
    ]
}

/// The numbers in a validator's "between A and B", "at least A", "at most B" (the value it got
/// left out).
fn bounds(message: &str) -> Vec<String> {
    let message = message.split(", got").next().unwrap_or(message);
    let token = |rest: &str| -> Option<String> {
        let t: String = rest
            .chars()
            .take_while(|c| !c.is_whitespace() && !matches!(c, ',' | ')' | ';'))
            .collect();
        t.starts_with(|c: char| c.is_ascii_digit()).then_some(t)
    };
    let mut out = Vec::new();
    for (i, _) in message.match_indices("between ") {
        let rest = &message[i + "between ".len()..];
        out.extend(token(rest));
        if let Some((_, b)) = rest.split_once(" and ") {
            out.extend(token(b));
        }
    }
    for marker in ["at least ", "at most "] {
        for (i, _) in message.match_indices(marker) {
            out.extend(token(&message[i + marker.len()..]));
        }
    }
    out
}

/// `text` with thousands separators removed (`1,024` -> `1024`).
fn without_separators(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::new();
    for (i, c) in chars.iter().enumerate() {
        let digit = |j: usize| chars.get(j).is_some_and(|c| c.is_ascii_digit());
        if *c == ',' && i > 0 && digit(i - 1) && digit(i + 1) {
            continue;
        }
        out.push(*c);
    }
    out
}

/// Whether `text` holds `bound` as a whole token, also with a space before its unit
/// (`10ms` as `10 ms`, `1day` as `1 day`).
fn mentions_bound(text: &str, bound: &str) -> bool {
    let digits = bound.chars().take_while(|c| c.is_ascii_digit()).count();
    let spaced = format!("{} {}", &bound[..digits], &bound[digits..]);
    [bound.to_string(), spaced].iter().any(|form| {
        text.match_indices(form.as_str()).any(|(i, _)| {
            let before = text[..i].chars().next_back();
            let after = text[i + form.len()..].chars().next();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '.')
                && !after.is_some_and(|c| c.is_alphanumeric())
        })
    })
}

/// The text under the first heading that contains `needle`, up to the next heading of the same
/// or a higher level.
fn section_text<'a>(doc: &'a str, needle: &str) -> Option<&'a str> {
    let mut start = None;
    let mut level = 0;
    let mut offset = 0;
    for line in doc.split_inclusive('\n') {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        let heading = hashes > 0 && line[hashes..].starts_with(' ');
        match start {
            None if heading && line.contains(needle) => {
                start = Some(offset + line.len());
                level = hashes;
            }
            Some(s) if heading && hashes <= level => return Some(&doc[s..offset]),
            _ => {}
        }
        offset += line.len();
    }
    start.map(|s| &doc[s..])
}

/// The table row of a key: a line starting with ``| `key` |``.
fn row<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let start = format!("| `{key}` |");
    text.lines().find(|l| l.starts_with(&start))
}

#[test]
fn the_configuration_reference_names_every_key_and_its_bounds() {
    let doc = read("docs/configuration.md");
    let mut missing = Vec::new();
    let mut checked = 0;
    for section in sections() {
        let Some(text) = section_text(&doc, section.heading) else {
            missing.push(format!(
                "{}: no heading containing {}",
                section.key, section.heading
            ));
            continue;
        };
        for field in fields(&section) {
            checked += 1;
            let Some(row) = row(text, &field) else {
                missing.push(format!(
                    "{}.{field}: no row | `{field}` | under {}",
                    section.key, section.heading
                ));
                continue;
            };
            let row = without_separators(row);
            let key = format!("{}.{field}", section.key);
            let mut wanted = BTreeSet::new();
            for value in probe_values() {
                for p in problems(&section, &format!("{field} = {value}")) {
                    if p.key == key {
                        wanted.extend(bounds(&p.message));
                    }
                }
            }
            for bound in wanted {
                if !mentions_bound(&row, &bound) {
                    missing.push(format!(
                        "{key}: the validator's bound {bound} is not in its row"
                    ));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} keys found: is the probe broken?"
    );
    assert_none_found("docs/configuration.md is behind the code", &missing);
}

/// A command's flags: `--long`, and `-s` when it has a short form.
type Flags = Vec<(String, Option<String>)>;

/// Every command path (`dead-letter list`) with the flags it takes.
fn commands(cmd: &clap::Command, path: &str, out: &mut Vec<(String, Flags)>) {
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        let path = format!("{path} {}", sub.get_name()).trim().to_string();
        let flags = sub
            .get_arguments()
            .filter_map(|a| {
                let long = a.get_long()?;
                (!matches!(long, "help" | "version"))
                    .then(|| (format!("--{long}"), a.get_short().map(|s| format!("-{s}"))))
            })
            .collect();
        if sub.has_subcommands() {
            commands(sub, &path, out);
        } else {
            out.push((path, flags));
        }
    }
}

#[test]
fn the_command_line_reference_names_every_command_and_flag() {
    let doc = read("docs/cli.md");
    let mut all = Vec::new();
    commands(&delay_bridge::Cli::command(), "", &mut all);
    assert!(all.len() > 15, "only {} commands found", all.len());
    let mut missing = Vec::new();
    for (path, flags) in all {
        let name = format!("`delay-bridge {path}");
        let Some(row) = doc.lines().find(|l| {
            l.starts_with("| ")
                && l.find(&name).is_some_and(|i| {
                    let after = &l[i + name.len()..];
                    after.starts_with(' ') || after.starts_with('`')
                })
        }) else {
            missing.push(format!("delay-bridge {path}: no row"));
            continue;
        };
        for (long, short) in flags {
            let mentioned = |f: &str| {
                row.match_indices(f).any(|(i, _)| {
                    !row[i + f.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '-')
                })
            };
            if !mentioned(&long) && !short.as_deref().is_some_and(mentioned) {
                missing.push(format!("delay-bridge {path} {long}: not in its row"));
            }
        }
    }
    assert_none_found("docs/cli.md is behind the code", &missing);
}

/// The anchors MkDocs gives a page's headings: lowercase, punctuation dropped, spaces as `-`.
fn anchors(doc: &str) -> BTreeSet<String> {
    doc.lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            let text = l.trim_start_matches('#').trim().to_lowercase();
            let kept: String = text
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .collect();
            kept.split([' ', '-'])
                .filter(|w| !w.is_empty())
                .collect::<Vec<_>>()
                .join("-")
        })
        .collect()
}

/// Every `docs/PAGE.md#anchor` target in `text`, after `prefix` (which ends in `docs/`), that
/// names no file or no heading of its page.
fn broken_links(text: &str, prefix: &str) -> Vec<String> {
    let mut broken = Vec::new();
    for (i, _) in text.match_indices(prefix) {
        let target: String = text[i + prefix.len() - "docs/".len()..]
            .chars()
            .take_while(|c| !matches!(c, ')' | '"' | '\'' | ' ' | '\n'))
            .collect();
        let (page, anchor) = target.split_once('#').unwrap_or((&target, ""));
        let Ok(doc) = std::fs::read_to_string(repo(page)) else {
            broken.push(format!("{target}: no such page"));
            continue;
        };
        if !anchor.is_empty() && !anchors(&doc).contains(anchor) {
            broken.push(format!("{target}: no such heading"));
        }
    }
    broken
}

#[test]
fn every_runbook_url_and_readme_link_names_a_heading_of_the_book() {
    let alerts = read("docker/alerts.yml");
    let runbooks = alerts.matches("runbook_url:").count();
    assert!(runbooks >= 7, "only {runbooks} runbook_url lines");
    assert_eq!(
        alerts
            .matches("runbook_url: \"docs/operations.md#runbook-")
            .count(),
        runbooks,
        "every runbook_url points at a runbook of docs/operations.md"
    );
    let mut broken = broken_links(&alerts, "\"docs/");
    broken.extend(broken_links(
        &read("tests/static/alerts_test.yml"),
        "\"docs/",
    ));
    broken.extend(broken_links(&read("README.md"), "](docs/"));
    assert_none_found("broken links", &broken);
}
