//! Bad configurations exit 78 and name every offending key.

mod common;

use std::process::Command;

fn check(toml: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.toml");
    std::fs::write(&path, toml).unwrap();
    let out = Command::new(common::binary())
        .arg("check")
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("panicked"), "{text}");
    (
        out.status.code().unwrap_or(-1),
        text.replace(path.to_str().unwrap(), "FILE"),
    )
}

const SINK: &str = "[sinks.r]\ntype = \"amqp\"\nurl = \"amqp://guest:guest@127.0.0.1:5672/%2f\"\n";
const TRIGGER: &str = "[[triggers]]\nname = \"t\"\nkey = \"k\"\nsink = \"r\"\nexchange = \"\"\n";

#[test]
fn the_example_config_is_valid() {
    let out = Command::new(common::binary())
        .args([
            "check",
            "--config",
            concat!(env!("CARGO_MANIFEST_DIR"), "/config/example.toml"),
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("guest:***@"), "password redacted: {text}");
    assert!(!text.contains("guest:guest"), "{text}");
}

#[test]
fn unknown_key_is_named() {
    let (code, text) = check(&format!("{SINK}{TRIGGER}colour = \"red\"\n"));
    assert_eq!(code, 78, "{text}");
    assert!(
        text.contains("triggers[0].colour") && text.contains("(in FILE)"),
        "{text}"
    );
}

#[test]
fn missing_sink_is_named() {
    let (code, text) = check(&format!(
        "{SINK}[[triggers]]\nname = \"t\"\nkey = \"k\"\nsink = \"nope\"\nexchange = \"\"\n"
    ));
    assert_eq!(code, 78);
    assert!(
        text.contains("triggers[0].sink") && text.contains("nope"),
        "{text}"
    );
}

#[test]
fn bad_duration_is_named() {
    let (code, text) = check(&format!("{SINK}{TRIGGER}lease = \"soon\"\n"));
    assert_eq!(code, 78);
    assert!(text.contains("triggers[0].lease"), "{text}");
}

#[test]
fn bad_urls_are_named() {
    let (code, text) = check(&format!(
        "[redis]\nurl = \"http://localhost\"\n[sinks.r]\ntype = \"amqp\"\nurl = \"not a url\"\n{TRIGGER}"
    ));
    assert_eq!(code, 78);
    assert!(
        text.contains("redis.url") && text.contains("sinks.r.url"),
        "{text}"
    );
}

#[test]
fn every_problem_is_reported_at_once() {
    let (code, text) = check(&format!(
        "{SINK}[[triggers]]\nname = \"a\"\nkey = \"k\"\nsink = \"r\"\nexchange = \"\"\nworkers = 0\nbatch = 0\n\
         [[triggers]]\nname = \"b\"\nkey = \"x\"\nsink = \"r\"\nlease = \"1s\"\npublish_timeout = \"5s\"\ntopic = \"t\"\n\
         [[triggers]]\nname = \"c\"\nkey = \"y\"\nsink = \"r\"\nexchange = \"\"\nmax_attempts = \"many\"\n"
    ));
    assert_eq!(code, 78);
    for key in [
        "triggers[0].workers",
        "triggers[0].batch",
        "triggers[1].exchange",
        "triggers[1].lease",
        "triggers[1].topic",
        "triggers[2].max_attempts",
    ] {
        assert!(text.contains(key), "{key} missing from:\n{text}");
    }
}

#[test]
fn missing_file_and_missing_triggers_are_errors() {
    let out = Command::new(common::binary())
        .args(["check", "--config", "/nonexistent/x.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let (code, text) = check(SINK);
    assert_eq!(code, 78);
    assert!(text.contains("triggers"), "{text}");
}

#[test]
fn wrong_types_never_panic() {
    for body in [
        "redis = 3",
        "[redis]\nurl = 5",
        "[metrics]\nlisten = \"nowhere\"",
        "sinks = []",
        "triggers = \"x\"",
        "[sinks.r]\ntype = \"smtp\"",
        "[[triggers]]\nname = 1\nkey = []\nsink = {}\nworkers = -1\nbatch = 1e9",
        "[shutdown]\ntimeout = \"-1s\"",
    ] {
        let (code, text) = check(body);
        assert_eq!(code, 78, "{body}: {text}");
    }
}
