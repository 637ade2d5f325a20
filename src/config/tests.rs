//! Unit tests of loading, defaults, environment overrides and validation.
// figment::Jail closures return figment::Error, which is large by design.
#![allow(clippy::result_large_err)]

use std::path::Path;
use std::time::Duration;

use figment::providers::{Format, Toml};
use figment::{Figment, Jail};

use super::load::{env_overrides, load_from};
use super::*;

const MINIMAL: &str = r#"
[sinks.r]
type = "amqp"
url = "amqp://guest:guest@127.0.0.1:5672/%2f"

[[triggers]]
name = "t"
key = "delay:{t}"
sink = "r"
exchange = "ex"
"#;

fn load_in_jail(jail: &mut Jail, toml: &str) -> Result<Config, ConfigError> {
    jail.create_file("c.toml", toml).unwrap();
    let figment = Figment::new()
        .merge(Toml::file_exact("c.toml"))
        .merge(env_overrides());
    load_from(figment, Path::new("c.toml"))
}

fn keys_of(e: ConfigError) -> Vec<String> {
    e.problems.into_iter().map(|p| p.key).collect()
}

#[test]
fn defaults_fill_everything_not_given() {
    Jail::expect_with(|jail| {
        let c = load_in_jail(jail, MINIMAL).unwrap();
        assert_eq!(c.redis.url, "redis://127.0.0.1:6379/0");
        assert_eq!(c.metrics.listen.to_string(), "127.0.0.1:9464");
        assert_eq!(c.log.level, "info");
        assert_eq!(c.log.format, LogFormat::Text);
        assert_eq!(c.shutdown.timeout, Duration::from_secs(30));
        let t = &c.triggers[0];
        assert_eq!(t.workers, 4);
        assert_eq!(t.batch, 256);
        assert_eq!(t.lease, Duration::from_secs(30));
        assert_eq!(t.guard_interval, Duration::from_secs(1));
        assert_eq!(t.max_attempts, 10);
        assert_eq!(t.backoff_initial, Duration::from_secs(1));
        assert_eq!(t.backoff_max, Duration::from_secs(300));
        assert_eq!(t.max_message_bytes, 1 << 20);
        assert_eq!(t.routing_key, None);
        Ok(())
    });
}

#[test]
fn environment_overrides_the_file() {
    Jail::expect_with(|jail| {
        jail.set_env("DELAY_BRIDGE_REDIS__URL", "redis://10.0.0.1:6380/2");
        jail.set_env("DELAY_BRIDGE_SHUTDOWN__TIMEOUT", "5s");
        jail.set_env("DELAY_BRIDGE_SINKS__R__URL", "amqp://u:p@mq:5672/%2f");
        // Not overrides: the `--config` default and test-suite variables.
        jail.set_env("DELAY_BRIDGE_CONFIG", "other.toml");
        jail.set_env("DELAY_BRIDGE_TEST_KAFKA", "127.0.0.1:9092");
        let c = load_in_jail(jail, MINIMAL).unwrap();
        assert_eq!(c.redis.url, "redis://10.0.0.1:6380/2");
        assert_eq!(c.shutdown.timeout, Duration::from_secs(5));
        match &c.sinks["r"] {
            SinkConfig::Amqp(a) => assert_eq!(a.addresses(), ["amqp://u:p@mq:5672/%2f"]),
            SinkConfig::Kafka(_) | SinkConfig::Http(_) => panic!("wrong sink type"),
        }
        jail.set_env("DELAY_BRIDGE_REDIS__CONNECT_TIMEOUT", "soon");
        let e = load_in_jail(jail, MINIMAL).unwrap_err();
        assert_eq!(keys_of(e), vec!["redis.connect_timeout"]);
        Ok(())
    });
}

#[test]
fn sink_fields_are_named_in_errors() {
    Jail::expect_with(|jail| {
        let e = load_in_jail(jail, &MINIMAL.replace("url = \"amqp", "url = 5\n#")).unwrap_err();
        assert_eq!(keys_of(e), vec!["sinks.r.url"]);
        let e =
            load_in_jail(jail, &MINIMAL.replace("type = \"amqp\"", "type = \"smtp\"")).unwrap_err();
        assert_eq!(keys_of(e), vec!["sinks.r.type"]);
        let e = load_in_jail(
            jail,
            &MINIMAL.replace("type = \"amqp\"", "type = \"amqp\"\ncolour = 1"),
        )
        .unwrap_err();
        assert_eq!(keys_of(e), vec!["sinks.r.colour"]);
        Ok(())
    });
}

#[test]
fn an_unparsable_file_reports_only_the_parse_error() {
    Jail::expect_with(|jail| {
        let e = load_in_jail(
            jail,
            &format!("{MINIMAL}\nworkers = 99999999999999999999999\n"),
        )
        .unwrap_err();
        assert_eq!(e.problems.len(), 1, "{e}");
        Ok(())
    });
}

#[test]
fn routing_key_pointers_are_json_pointers_on_amqp_triggers_only() {
    Jail::expect_with(|jail| {
        let with = |p: &str| {
            MINIMAL.replace(
                "exchange = \"ex\"",
                &format!("exchange = \"ex\"\nrouting_key_pointer = \"{p}\""),
            )
        };
        assert!(load_in_jail(jail, &with("/meta/type")).is_ok());
        assert!(load_in_jail(jail, &with("/a~1b~0c")).is_ok());
        for bad in ["type", "", "/a~2"] {
            let e = load_in_jail(jail, &with(bad)).unwrap_err();
            assert_eq!(keys_of(e), vec!["triggers[0].routing_key_pointer"], "{bad}");
        }
        let kafka = "[sinks.k]\ntype = \"kafka\"\nbrokers = \"b:9092\"\n[[triggers]]\nname = \"k\"\nkey = \"k\"\nsink = \"k\"\ntopic = \"t\"\nrouting_key_pointer = \"/x\"\n";
        let e = load_in_jail(jail, kafka).unwrap_err();
        assert_eq!(keys_of(e), vec!["triggers[0].routing_key_pointer"]);
        Ok(())
    });
}

#[test]
fn a_bad_log_filter_is_an_error() {
    Jail::expect_with(|jail| {
        let e = load_in_jail(jail, &format!("[log]\nlevel = \"info,[[[\"\n{MINIMAL}")).unwrap_err();
        assert_eq!(keys_of(e), vec!["log.level"]);
        Ok(())
    });
}

fn amqp_sink(lines: &str) -> String {
    MINIMAL.replace("url = \"amqp://guest:guest@127.0.0.1:5672/%2f\"", lines)
}

#[test]
fn an_amqp_sink_takes_url_or_urls() {
    Jail::expect_with(|jail| {
        let c = load_in_jail(jail, MINIMAL).unwrap();
        let SinkConfig::Amqp(a) = &c.sinks["r"] else {
            panic!("wrong sink type")
        };
        assert_eq!(a.addresses(), ["amqp://guest:guest@127.0.0.1:5672/%2f"]);

        let cluster = amqp_sink(
            "urls = [\"amqp://app:pw@n1:5672/%2f\", \"amqp://app:pw@n2:5672/%2f\", \"amqp://app:pw@n3/%2f?heartbeat=5\"]",
        );
        let c = load_in_jail(jail, &cluster).unwrap();
        let SinkConfig::Amqp(a) = &c.sinks["r"] else {
            panic!("wrong sink type")
        };
        assert_eq!(a.addresses().len(), 3);

        for (lines, key) in [
            ("password_file = \"x\"", "sinks.r.url"),
            (
                "url = \"amqp://n1/%2f\"\nurls = [\"amqp://n2/%2f\"]",
                "sinks.r.urls",
            ),
            ("urls = []", "sinks.r.urls"),
            (
                "urls = [\"amqp://n1/%2f\", \"http://n2/\"]",
                "sinks.r.urls[1]",
            ),
            (
                "urls = [\"amqp://n1/%2f\", \"not a url\"]",
                "sinks.r.urls[1]",
            ),
            (
                "urls = [\"amqp://n1/%2f\", \"amqp://n1/%2f\"]",
                "sinks.r.urls[1]",
            ),
            (
                "urls = [\"amqp://n1/%2f\", \"amqps://n2/%2f\"]",
                "sinks.r.urls[1]",
            ),
            (
                "urls = [\"amqp://a@n1/%2f\", \"amqp://b@n2/%2f\"]",
                "sinks.r.urls[1]",
            ),
            (
                "urls = [\"amqp://a:x@n1/%2f\", \"amqp://a:y@n2/%2f\"]",
                "sinks.r.urls[1]",
            ),
            (
                "urls = [\"amqp://n1/%2f\", \"amqp://n2/other\"]",
                "sinks.r.urls[1]",
            ),
            ("urls = \"amqp://n1/%2f\"", "sinks.r.urls"),
        ] {
            let e = load_in_jail(jail, &amqp_sink(lines)).unwrap_err();
            assert_eq!(keys_of(e), vec![key], "{lines}");
        }
        let e = load_in_jail(
            jail,
            &amqp_sink("urls = [\"amqp://a:x@n1/%2f\", \"amqps://b:y@n2/v\"]"),
        )
        .unwrap_err();
        let text = e.to_string();
        for what in ["scheme", "user", "password", "vhost"] {
            assert!(text.contains(what), "{what}: {text}");
        }
        assert!(!text.contains(":x@") && !text.contains(":y@"), "{text}");
        Ok(())
    });
}

#[test]
fn urls_can_come_from_the_environment_as_a_list() {
    Jail::expect_with(|jail| {
        jail.set_env(
            "DELAY_BRIDGE_SINKS__R__URLS",
            "[\"amqp://n1:5672/%2f\", \"amqp://n2:5672/%2f\"]",
        );
        let e = load_in_jail(jail, MINIMAL).unwrap_err();
        assert_eq!(
            keys_of(e),
            vec!["sinks.r.urls"],
            "url and urls are exclusive"
        );
        let c = load_in_jail(jail, &amqp_sink("")).unwrap();
        let SinkConfig::Amqp(a) = &c.sinks["r"] else {
            panic!("wrong sink type")
        };
        assert_eq!(a.addresses(), ["amqp://n1:5672/%2f", "amqp://n2:5672/%2f"]);
        Ok(())
    });
}

#[test]
fn declared_queues_may_be_quorum_queues_or_streams() {
    Jail::expect_with(|jail| {
        let with = |declare: &str| {
            format!("{MINIMAL}\n[[sinks.r.declare]]\nexchange = \"ex\"\n{declare}\n")
        };
        for (line, expected) in [
            ("queue = \"q\"", None),
            (
                "queue = \"q\"\nqueue_type = \"quorum\"",
                Some(QueueType::Quorum),
            ),
            (
                "queue = \"q\"\nqueue_type = \"stream\"",
                Some(QueueType::Stream),
            ),
            (
                "queue = \"q\"\nqueue_type = \"classic\"",
                Some(QueueType::Classic),
            ),
        ] {
            let c = load_in_jail(jail, &with(line)).unwrap();
            let SinkConfig::Amqp(a) = &c.sinks["r"] else {
                panic!("wrong sink type")
            };
            assert_eq!(a.declare[0].queue_type, expected, "{line}");
        }
        for (line, key) in [
            (
                "queue = \"q\"\nqueue_type = \"mirrored\"",
                "sinks.r.declare[0].queue_type",
            ),
            ("queue_type = \"quorum\"", "sinks.r.declare[0].queue_type"),
        ] {
            let e = load_in_jail(jail, &with(line)).unwrap_err();
            assert_eq!(keys_of(e), vec![key], "{line}");
        }
        Ok(())
    });
}

#[test]
fn tls_settings_are_checked_with_their_files_and_every_problem_is_named() {
    Jail::expect_with(|jail| {
        jail.create_file("garbage.pem", "not a certificate")?;
        jail.create_file("client.key", "")?;
        let toml = format!(
            r#"
[redis]
url = "redis://127.0.0.1:6379/0#insecure"
[redis.tls]
ca_file = "missing-ca.pem"
cert_file = "garbage.pem"
[sinks.secure]
type = "amqp"
url = "amqp://guest:guest@127.0.0.1:5672/%2f"
[sinks.secure.tls]
key_file = "client.key"
ca_file = "garbage.pem"
server_name = "not a name"
insecure = true
[sinks.k]
type = "kafka"
brokers = "127.0.0.1:9092"
[sinks.k.properties]
"security.protocol" = "SSL"
"ssl.ca.location" = "nowhere/ca.pem"
{}"#,
            MINIMAL
        );
        let e = load_in_jail(jail, &toml).unwrap_err();
        let keys = keys_of(e);
        for key in [
            "redis.url",
            "redis.tls",
            "redis.tls.ca_file",
            "redis.tls.key_file",
            "sinks.secure.tls",
            "sinks.secure.tls.cert_file",
            "sinks.secure.tls.server_name",
            "sinks.secure.tls.insecure",
            "sinks.secure.tls.ca_file",
            "sinks.k.properties.ssl.ca.location",
        ] {
            assert!(
                keys.contains(&key.to_string()),
                "{key} missing from {keys:?}"
            );
        }
        Ok(())
    });
}

#[test]
fn a_certificate_file_without_certificates_is_refused() {
    Jail::expect_with(|jail| {
        jail.create_file("garbage.pem", "not a certificate")?;
        let toml = format!(
            "[redis]\nurl = \"rediss://127.0.0.1:6380/0\"\n[redis.tls]\nca_file = \"garbage.pem\"\n{MINIMAL}"
        );
        let e = load_in_jail(jail, &toml).unwrap_err();
        assert_eq!(keys_of(e), ["redis.tls.ca_file"]);
        Ok(())
    });
}

#[test]
fn kafka_ssl_files_are_checked_only_when_tls_is_on_and_probe_is_accepted() {
    Jail::expect_with(|jail| {
        let kafka = |protocol: &str, ca: &str| {
            format!(
                "[sinks.k]\ntype = \"kafka\"\nbrokers = \"127.0.0.1:9092\"\n[sinks.k.properties]\n\
                 \"security.protocol\" = \"{protocol}\"\n\"ssl.ca.location\" = \"{ca}\"\n{MINIMAL}"
            )
        };
        assert!(load_in_jail(jail, &kafka("PLAINTEXT", "nowhere.pem")).is_ok());
        assert!(load_in_jail(jail, &kafka("SASL_SSL", "probe")).is_ok());
        let e = load_in_jail(jail, &kafka("sasl_ssl", "nowhere.pem")).unwrap_err();
        assert_eq!(keys_of(e), ["sinks.k.properties.ssl.ca.location"]);
        Ok(())
    });
}

#[test]
fn insecure_and_shared_keys_are_warned_about() {
    Jail::expect_with(|jail| {
        let toml = format!(
            "[redis]\nurl = \"rediss://127.0.0.1:6380/0\"\n[redis.tls]\ninsecure = true\n{MINIMAL}"
        );
        let c = load_in_jail(jail, &toml).unwrap();
        let warnings = c.tls_warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].starts_with("redis.tls: insecure = true"));
        Ok(())
    });
}

#[test]
fn envelope_routing_on_the_default_exchange_is_warned_about() {
    Jail::expect_with(|jail| {
        let open = MINIMAL.replace(
            "exchange = \"ex\"",
            "exchange = \"\"\nformat = \"envelope\"",
        );
        let c = load_in_jail(jail, &open).unwrap();
        let warnings = c.warnings();
        assert!(
            warnings.iter().any(|w| w.contains("default exchange")),
            "{warnings:?}"
        );
        let fenced = open.replace(
            "format = \"envelope\"",
            "format = \"envelope\"\nallowed_routing_keys = [\"orders.*\"]",
        );
        let c = load_in_jail(jail, &fenced).unwrap();
        assert!(c.warnings().is_empty(), "{:?}", c.warnings());
        Ok(())
    });
}

#[test]
fn rates_are_per_second_minute_or_hour_with_a_burst_of_one_second() {
    assert_eq!(super::parse_rate("500/s"), Ok(500.0));
    assert_eq!(super::parse_rate(" 30 / min"), Ok(0.5));
    assert_eq!(super::parse_rate("90/m"), Ok(1.5));
    assert_eq!(super::parse_rate("7200/h"), Ok(2.0));
    assert_eq!(super::parse_rate("0.5/s"), Ok(0.5));
    for bad in [
        "500", "500/d", "/s", "x/s", "0/s", "-1/s", "NaN/s", "inf/s", "1e9/s",
    ] {
        assert!(super::parse_rate(bad).is_err(), "{bad}");
    }
    let mut jail_result = None;
    Jail::expect_with(|jail| {
        let toml = format!("{MINIMAL}rate_limit = \"90/m\"\n");
        let c = load_in_jail(jail, &toml).unwrap();
        jail_result = Some(c.triggers[0].rate());
        Ok(())
    });
    assert_eq!(
        jail_result,
        Some(Some((1.5, 2))),
        "a second's worth, rounded up"
    );
}

#[test]
fn cluster_mode_takes_seed_nodes_and_tagged_keys_only() {
    Jail::expect_with(|jail| {
        let ok = MINIMAL.to_string()
            + "\n[redis]\nmode = \"cluster\"\nnodes = [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001/0\"]\n";
        let c = load_in_jail(jail, &ok).unwrap();
        assert_eq!(c.redis.mode, RedisMode::Cluster);
        assert_eq!(c.redis.nodes.len(), 2);

        let bad = r#"
[redis]
mode = "cluster"
url = "redis://127.0.0.1:6379/0x"
nodes = ["redis://127.0.0.1:7000/3", "rediss://127.0.0.1:7001", "redis://127.0.0.1:7002", "http://x:1"]

[sinks.r]
type = "amqp"
url = "amqp://guest:guest@127.0.0.1:5672/%2f"

[[triggers]]
name = "t"
key = "delay:orders"
sink = "r"
exchange = "ex"
"#;
        let keys = keys_of(load_in_jail(jail, bad).unwrap_err());
        for key in [
            "redis.url",
            "redis.nodes[0]",
            "redis.nodes[3]",
            "redis.nodes",
            "triggers[0].key",
        ] {
            assert!(keys.iter().any(|k| k == key), "{key} in {keys:?}");
        }

        let empty = MINIMAL.to_string() + "\n[redis]\nmode = \"cluster\"\n";
        assert_eq!(
            keys_of(load_in_jail(jail, &empty).unwrap_err()),
            ["redis.nodes"]
        );
        let stray = MINIMAL.to_string() + "\n[redis]\nnodes = [\"redis://127.0.0.1:7000\"]\n";
        assert_eq!(
            keys_of(load_in_jail(jail, &stray).unwrap_err()),
            ["redis.nodes"]
        );
        Ok(())
    });
}

#[test]
fn a_suggested_tag_wraps_the_last_segment() {
    assert_eq!(validate::suggested_tag("delay:orders"), "delay:{orders}");
    assert_eq!(validate::suggested_tag("orders"), "{orders}");
}

#[test]
fn shards_need_a_hash_tag_and_a_sane_count() {
    Jail::expect_with(|jail| {
        let sharded = MINIMAL.replace("exchange = \"ex\"", "exchange = \"ex\"\nshards = 4");
        let c = load_in_jail(jail, &sharded).unwrap();
        let t = &c.triggers[0];
        assert_eq!(
            t.shard_keys(),
            ["delay:{t:0}", "delay:{t:1}", "delay:{t:2}", "delay:{t:3}"]
        );
        let draining = sharded.replace("shards = 4", "shards = 2\ndrain_shards = 1");
        let c = load_in_jail(jail, &draining).unwrap();
        assert_eq!(
            c.triggers[0].shard_keys(),
            ["delay:{t:0}", "delay:{t:1}", "delay:{t}"]
        );
        let bad = sharded
            .replace("key = \"delay:{t}\"", "key = \"delay:t\"")
            .replace("shards = 4", "shards = 4\ndrain_shards = 4");
        let e = load_in_jail(jail, &bad).unwrap_err();
        assert_eq!(
            keys_of(e),
            [
                "triggers[0].shards",
                "triggers[0].drain_shards",
                "triggers[0].drain_shards"
            ]
        );
        let zero = sharded.replace("shards = 4", "shards = 0");
        let e = load_in_jail(jail, &zero).unwrap_err();
        assert!(e.to_string().contains("between 1 and 1024"), "{e}");
        Ok(())
    });
}

#[test]
fn http_routes_resolve_and_a_timeout_past_publish_timeout_is_warned_about() {
    Jail::expect_with(|jail| {
        let toml = "[sinks.h]\ntype = \"http\"\ntimeout = \"10s\"\n\
            [[triggers]]\nname = \"t\"\nkey = \"k\"\nsink = \"h\"\n\
            url_pointer = \"/url\"\nallowed_urls = [\"https://*.hooks.internal/\"]\nmethod = \"PUT\"\n";
        let c = load_in_jail(jail, toml).unwrap();
        let Some(Destination::Http(route)) = &c.triggers[0].destination else {
            panic!("{:?}", c.triggers[0].destination);
        };
        assert_eq!(route.url, HttpTarget::Pointer("/url".into()));
        assert_eq!(route.method, "PUT");
        assert!(route.allows("https://a.hooks.internal/x"));
        assert!(!route.allows("https://hooks.internal/x"));
        assert!(
            c.warnings().iter().any(|w| w.contains("publish_timeout")),
            "{:?}",
            c.warnings()
        );
        let c = load_in_jail(jail, &format!("{toml}publish_timeout = \"15s\"\n")).unwrap();
        assert!(c.warnings().is_empty(), "{:?}", c.warnings());
        Ok(())
    });
}
