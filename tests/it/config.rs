//! Bad configurations make the binary exit 78, naming every offending key (with its file or
//! variable). The loader itself is fuzzed field by field in tests/it/config_load.rs.

use crate::common;

use std::path::Path;

use common::{check, check_with_env, run_cli, MINIMAL_SINK as SINK, MINIMAL_TRIGGER as TRIGGER};

/// Asserts that `check` accepts the example config `config/{file}` saying each of `needles`;
/// returns what it said.
fn example_checked(file: &str, needles: &[&str]) -> String {
    let example = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config")
        .join(file);
    let out = run_cli(&["check"], &example, &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    for needle in needles {
        assert!(
            out.stdout.contains(needle),
            "{needle} missing:\n{}",
            out.stdout
        );
    }
    out.stdout
}

/// Asserts that `check` refuses `config` (exit 78) saying each of `needles`; returns what it
/// said.
fn refused_saying(config: &str, needles: &[&str]) -> String {
    let (code, text) = check(config);
    assert_eq!(code, 78, "{text}");
    for needle in needles {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
    text
}

#[test]
fn the_kafka_example_config_is_valid() {
    example_checked("kafka.toml", &["sink kafka: kafka", "trigger reminders:"]);
}

#[test]
fn the_http_example_config_is_valid() {
    example_checked("http.toml", &["sink hooks: http", "trigger webhooks:"]);
}

#[test]
fn http_sink_problems_are_named_with_their_keys() {
    let config = "[sinks.hooks]\ntype = \"http\"\ntimeout = \"0s\"\nmax_concurrency = 0\n\
        follow_redirects = 11\nconnect_timeout = \"20s\"\n\
        signing_secret_file = \"/nonexistent/hook-key\"\n\
        [sinks.hooks.tls]\nserver_name = \"hooks.internal\"\n\
        [[triggers]]\nname = \"a\"\nkey = \"ka\"\nsink = \"hooks\"\nurl_pointer = \"/url\"\n\
        method = \"GET\"\nexchange = \"x\"\n\
        [[triggers]]\nname = \"b\"\nkey = \"kb\"\nsink = \"hooks\"\nurl = \"ftp://x/\"\n\
        allowed_urls = [\"https://u:p@x/\"]\n\
        [[triggers]]\nname = \"c\"\nkey = \"kc\"\nsink = \"hooks\"\n\
        url = \"http://x/\"\nurl_pointer = \"/u\"\n\
        [[triggers]]\nname = \"d\"\nkey = \"kd\"\nsink = \"hooks\"\n";
    let (code, text) = check(&format!("{config}{SINK}{TRIGGER}url = \"http://x/\"\n"));
    assert_eq!(code, 78, "{text}");
    for key in [
        "sinks.hooks.timeout",
        "sinks.hooks.max_concurrency",
        "sinks.hooks.follow_redirects",
        "sinks.hooks.connect_timeout",
        "sinks.hooks.signing_secret_file",
        "sinks.hooks.tls.server_name",
        "triggers[0].url_pointer",
        "triggers[0].method",
        "triggers[0].exchange",
        "triggers[1].url",
        "triggers[1].allowed_urls",
        "triggers[2].url_pointer",
        "triggers[3].url",
        "triggers[4].url",
    ] {
        assert!(text.contains(key), "{key} not named:\n{text}");
    }
}

/// The first-run config needs nothing but Redis and RabbitMQ.
#[test]
fn the_example_config_is_valid() {
    // The password redacted.
    let text = example_checked("example.toml", &["guest:***@"]);
    assert!(!text.contains("guest:guest"), "{text}");
    assert!(
        !text.contains("kafka"),
        "no Kafka in the first-run config: {text}"
    );
}

#[test]
fn unknown_key_is_named() {
    let config = format!("{SINK}{TRIGGER}colour = \"red\"\n");
    // SINK is 3 lines, TRIGGER 5: the unknown key is on line 9, column 1.
    refused_saying(&config, &["triggers[0].colour", "(in FILE:9:1)"]);
}

/// A field of the wrong type hides none of the trigger's other problems, and each points at
/// its line and column.
#[test]
fn a_type_error_hides_no_other_problem_of_its_trigger() {
    let trigger = "[[triggers]]\nname = \"t\"\nkey = \"k\"\nsink = \"nope\"\n\
        exchange = \"\"\n  batch = \"many\"\nlease = \"soon\"\nmax_attempts = 0\n";
    let text = refused_saying(
        &format!("{SINK}{trigger}"),
        &[
            "triggers[0].batch",
            "(in FILE:9:3)",
            "triggers[0].lease",
            "(in FILE:10:1)",
            "triggers[0].sink",
            "nope",
            "(in FILE:7:1)",
            "triggers[0].max_attempts",
            "(in FILE:11:1)",
        ],
    );
    assert!(text.contains("4 problems"), "{text}");
}

#[test]
fn missing_sink_is_named() {
    let trigger = "[[triggers]]\nname = \"t\"\nkey = \"k\"\nsink = \"nope\"\nexchange = \"\"\n";
    refused_saying(&format!("{SINK}{trigger}"), &["triggers[0].sink", "nope"]);
}

#[test]
fn bad_duration_is_named() {
    let config = format!("{SINK}{TRIGGER}lease = \"soon\"\n");
    refused_saying(&config, &["triggers[0].lease"]);
}

#[test]
fn bad_urls_are_named() {
    let config = format!(
        "[redis]\nurl = \"http://localhost\"\n[sinks.r]\ntype = \"amqp\"\nurl = \"not a url\"\n{TRIGGER}"
    );
    refused_saying(&config, &["redis.url", "sinks.r.url"]);
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
    let out = run_cli(&["check"], Path::new("/nonexistent/x.toml"), &[]);
    assert_eq!(out.code, 78);
    let (code, text) = check(SINK);
    assert_eq!(code, 78);
    assert!(text.contains("triggers"), "{text}");
}

#[test]
fn a_bad_environment_override_exits_78_naming_its_variable() {
    let (code, text) = check_with_env(
        &format!("{SINK}{TRIGGER}"),
        &[("DELAY_BRIDGE_REDIS__CONNECT_TIMEOUT", "soon")],
    );
    assert_eq!(code, 78, "{text}");
    assert!(text.contains("redis.connect_timeout"), "{text}");
    assert!(
        text.contains("DELAY_BRIDGE_") || text.contains("environment"),
        "source named: {text}"
    );
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

fn trigger(name: &str, key: &str) -> String {
    common::trigger(name, key, "r", "exchange = \"\"")
}

#[test]
fn triggers_sharing_a_key_are_refused_naming_both() {
    // `x` and `{x}` derive the same `{x}:inflight`; `{y}:dead` is y's dead-letter set;
    // two triggers on one key would split its messages.
    for (a, b) in [("x", "{x}"), ("y", "{y}:dead"), ("z", "z")] {
        let (code, text) = check(&format!("{SINK}{}{}", trigger("one", a), trigger("two", b)));
        assert_eq!(code, 78, "{a} / {b}: {text}");
        assert!(
            text.contains("triggers[1].key") && text.contains("`one`") && text.contains("`two`"),
            "{a} / {b}: {text}"
        );
    }
    let (code, text) = check(&format!(
        "{SINK}{}{}",
        trigger("one", "x"),
        trigger("two", "{x}:other")
    ));
    assert_eq!(code, 0, "distinct keys in one slot are fine: {text}");
}

#[test]
fn kafka_properties_that_void_confirmations_need_an_explicit_opt_in() {
    let kafka = |props: &str, extra: &str| {
        format!(
            "[sinks.k]\ntype = \"kafka\"\nbrokers = \"127.0.0.1:9092\"\n{extra}\n[sinks.k.properties]\n{props}\n\
             [[triggers]]\nname = \"t\"\nkey = \"k\"\nsink = \"k\"\ntopic = \"t\"\n"
        )
    };
    for (props, key) in [
        ("acks = \"1\"", "sinks.k.properties.acks"),
        ("acks = \"0\"", "sinks.k.properties.acks"),
        (
            "\"request.required.acks\" = \"1\"",
            "sinks.k.properties.request.required.acks",
        ),
        (
            "\"enable.idempotence\" = \"false\"",
            "sinks.k.properties.enable.idempotence",
        ),
    ] {
        let (code, text) = check(&kafka(props, ""));
        assert_eq!(code, 78, "{props}: {text}");
        assert!(
            text.contains(key) && text.contains("accept_possible_loss"),
            "{props}: {text}"
        );
        let (code, text) = check(&kafka(props, "accept_possible_loss = true"));
        assert_eq!(code, 0, "{props} with the opt-in: {text}");
    }
    let (code, text) = check(&kafka(
        "acks = \"all\"\n\"enable.idempotence\" = \"true\"",
        "",
    ));
    assert_eq!(code, 0, "{text}");
}

#[test]
fn amqp_names_longer_than_a_short_string_are_refused() {
    let long = "e".repeat(256);
    let fits = "e".repeat(255);
    let (code, text) = check(&format!(
        "[sinks.r]\ntype = \"amqp\"\nurl = \"amqp://h/%2f\"\n\
         [[sinks.r.declare]]\nexchange = \"{long}\"\nqueue = \"{long}\"\nbinding_key = \"{long}\"\n\
         [[triggers]]\nname = \"t\"\nkey = \"k\"\nsink = \"r\"\nexchange = \"{long}\"\nrouting_key = \"{long}\"\n"
    ));
    assert_eq!(code, 78, "{text}");
    for key in [
        "sinks.r.declare[0].exchange",
        "sinks.r.declare[0].queue",
        "sinks.r.declare[0].binding_key",
        "triggers[0].exchange",
        "triggers[0].routing_key",
    ] {
        assert!(text.contains(key), "{key} missing from:\n{text}");
    }
    let (code, text) = check(&format!(
        "{SINK}[[triggers]]\nname = \"t\"\nkey = \"k\"\nsink = \"r\"\nexchange = \"{fits}\"\nrouting_key = \"{fits}\"\n"
    ));
    assert_eq!(code, 0, "255 bytes fit: {text}");
}

#[test]
fn durations_and_sizes_are_bounded() {
    let (code, text) = check(&format!(
        "[redis]\nconnect_timeout = \"100000000years\"\nresponse_timeout = \"2h\"\n\
         [shutdown]\ntimeout = \"100000000000years\"\n\
         [sinks.r]\ntype = \"amqp\"\nurl = \"amqp://h/%2f\"\nreconnect_max = \"1000years\"\n\
         {TRIGGER}lease = \"100000000000years\"\nguard_interval = \"100000000000years\"\n\
         publish_timeout = \"2h\"\nbackoff_initial = \"2days\"\nbackoff_max = \"100000000000years\"\n\
         max_message_bytes = 1000000000\n"
    ));
    assert_eq!(code, 78, "{text}");
    for key in [
        "redis.connect_timeout",
        "redis.response_timeout",
        "shutdown.timeout",
        "sinks.r.reconnect_max",
        "triggers[0].lease",
        "triggers[0].guard_interval",
        "triggers[0].publish_timeout",
        "triggers[0].backoff_initial",
        "triggers[0].backoff_max",
        "triggers[0].max_message_bytes",
    ] {
        assert!(text.contains(key), "{key} missing from:\n{text}");
    }
}

#[test]
fn a_cluster_sink_shows_every_address_redacted() {
    let urls = "urls = [\"amqp://app:pw-one@n1:5672/%2f\", \"amqp://app:pw-one@n2:5673/%2f\", \"amqp://app:pw-one@n3/%2f?heartbeat=5\"]";
    let sink = SINK.replace("url = \"amqp://guest:guest@127.0.0.1:5672/%2f\"", urls);
    let (code, text) = check(&format!("{sink}{TRIGGER}"));
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(
            "sink r: amqp amqp://app:***@n1:5672/%2f, amqp://app:***@n2:5673/%2f, amqp://app:***@n3/%2f?heartbeat=5"
        ),
        "{text}"
    );
    assert!(!text.contains("pw-one"), "{text}");
}

#[test]
fn an_amqp_sink_needs_url_or_urls_but_not_both() {
    let both = SINK.replace(
        "type = \"amqp\"",
        "type = \"amqp\"\nurls = [\"amqp://n2/%2f\"]",
    );
    let neither = "[sinks.r]\ntype = \"amqp\"\n";
    for (sink, key) in [(both.as_str(), "sinks.r.urls"), (neither, "sinks.r.url")] {
        let (code, text) = check(&format!("{sink}{TRIGGER}"));
        assert_eq!(code, 78, "{text}");
        assert!(text.contains(key) && text.contains("urls"), "{key}: {text}");
    }
}

#[test]
fn urls_are_checked_by_the_clients_that_use_them() {
    let config = format!(
        "[redis]\nurl = \"redis:/127.0.0.1:16401\"\n[sinks.r]\ntype = \"amqp\"\nurl = \"amqp:/127.0.0.1:5672\"\n{TRIGGER}"
    );
    refused_saying(&config, &["redis.url", "names no host", "sinks.r.url"]);
}

#[test]
fn every_bad_field_of_a_table_is_reported_with_the_nearest_key_for_a_typo() {
    let config = format!("{SINK}{TRIGGER}workers = \"four\"\nlease = 30\nworkrs = 4\n");
    let keys = [
        "triggers[0].workers",
        "triggers[0].lease",
        "triggers[0].workrs",
    ];
    let text = refused_saying(&config, &keys);
    assert!(text.contains("did you mean `workers`?"), "{text}");
    assert!(!text.contains("``"), "{text}");
    let config = format!("[redis]\nconect_timeout = \"1s\"\nurl = 7\n{SINK}{TRIGGER}");
    refused_saying(&config, &["did you mean `connect_timeout`?", "redis.url"]);
}

/// `check` in `dir` without `--config`, with `DELAY_BRIDGE_CONFIG` set to `env` (or unset).
fn check_searching(dir: &Path, env: Option<&Path>, args: &[&str]) -> (i32, String) {
    let mut command = std::process::Command::new(common::binary());
    command
        .arg("check")
        .args(args)
        .current_dir(dir)
        .env_remove("DELAY_BRIDGE_CONFIG");
    if let Some(env) = env {
        command.env("DELAY_BRIDGE_CONFIG", env);
    }
    let out = command.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn without_config_the_variable_then_the_working_directory_is_searched() {
    let dir = tempfile::tempdir().unwrap();
    let example = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/example.toml"));
    let missing = dir.path().join("missing.toml");
    let system = Path::new("/etc/delay-bridge/config.toml");

    // Nothing anywhere: every path tried is named (unless this machine has a system config).
    if !system.exists() {
        for args in [&[][..], &["--config"][..]] {
            let (code, text) = check_searching(dir.path(), Some(&missing), args);
            assert_eq!(code, 78, "{text}");
            assert!(
                text.contains(&format!(
                    "tried {}, delay-bridge.toml, /etc/delay-bridge/config.toml",
                    missing.display()
                )),
                "{text}"
            );
        }
    }
    // The variable names a file: it is used.
    let (code, text) = check_searching(dir.path(), Some(example), &[]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(&format!("config {} is valid", example.display())),
        "{text}"
    );
    // ./delay-bridge.toml comes after a variable naming a missing file.
    std::fs::copy(example, dir.path().join("delay-bridge.toml")).unwrap();
    let (code, text) = check_searching(dir.path(), Some(&missing), &["--config"]);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("config delay-bridge.toml is valid"), "{text}");
    // An explicit file wins and is not searched for.
    let (code, text) = check_searching(
        dir.path(),
        Some(example),
        &["--config", missing.to_str().unwrap()],
    );
    assert_eq!(code, 78, "{text}");
    assert!(text.contains(&missing.display().to_string()), "{text}");
}
