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
            SinkConfig::Amqp(a) => assert_eq!(a.url, "amqp://u:p@mq:5672/%2f"),
            SinkConfig::Kafka(_) => panic!("wrong sink type"),
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
