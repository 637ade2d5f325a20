//! Unit tests of loading, defaults, environment overrides and validation.
// figment::Jail closures return figment::Error, which is large by design.
#![allow(clippy::result_large_err)]

use std::path::Path;
use std::time::Duration;

use figment::providers::{Format, Toml};
use figment::{Figment, Jail};

use super::load::{env_overrides, load_from};
use super::*;

mod schedules;
mod sentinel;
mod sinks;
mod topics;

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

/// The keys of the problems that refuse `toml`.
fn rejected_keys(jail: &mut Jail, toml: &str) -> Vec<String> {
    keys_of(load_in_jail(jail, toml).unwrap_err())
}

/// Asserts that the minimal configuration with `redis` as its `[redis]` table is refused with
/// the problems under `keys` exactly, in that order.
fn assert_redis_rejected(jail: &mut Jail, redis: &str, keys: &[&str]) {
    let toml = format!("{MINIMAL}\n[redis]\n{redis}");
    assert_eq!(rejected_keys(jail, &toml), keys, "{redis}");
}

/// Asserts that `toml` is refused with a problem under each of `keys` (others too, maybe).
fn assert_rejected_under(jail: &mut Jail, toml: &str, keys: &[&str]) {
    let rejected = rejected_keys(jail, toml);
    for key in keys {
        assert!(rejected.iter().any(|k| k == key), "{key} in {rejected:?}");
    }
}

#[test]
fn defaults_fill_everything_not_given() {
    Jail::expect_with(|jail| {
        let c = load_in_jail(jail, MINIMAL).unwrap();
        assert_eq!(c.redis.settings().url, "redis://127.0.0.1:6379/0");
        assert_eq!(c.metrics.listen.to_string(), "127.0.0.1:9464");
        assert_eq!(c.log.level, "info");
        assert_eq!(c.log.format, LogFormat::Text);
        assert_eq!(c.shutdown.timeout, Duration::from_secs(30));
        let t = &c.triggers[0];
        assert_eq!(t.workers(), 4);
        assert_eq!(t.batch(), 256);
        assert_eq!(t.lease(), Duration::from_secs(30));
        assert_eq!(t.guard_interval(), Duration::from_secs(1));
        assert_eq!(t.max_attempts(), 10);
        assert_eq!(t.backoff_initial(), Duration::from_secs(1));
        assert_eq!(t.backoff_max(), Duration::from_secs(300));
        assert_eq!(t.max_message_bytes(), 1 << 20);
        let Destination::Amqp(route) = t.destination() else {
            panic!("{:?}", t.destination());
        };
        assert_eq!(route.routing, AmqpRouting::Key(String::new()));
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
        assert_eq!(c.redis.settings().url, "redis://10.0.0.1:6380/2");
        assert_eq!(c.shutdown.timeout, Duration::from_secs(5));
        match c.sinks["r"].settings() {
            SinkConfig::Amqp(a) => assert_eq!(a.addresses(), ["amqp://u:p@mq:5672/%2f"]),
            SinkConfig::Kafka(_) | SinkConfig::Http(_) => panic!("wrong sink type"),
        }
        jail.set_env("DELAY_BRIDGE_REDIS__CONNECT_TIMEOUT", "soon");
        assert_eq!(rejected_keys(jail, MINIMAL), vec!["redis.connect_timeout"]);
        Ok(())
    });
}

#[test]
fn sink_fields_are_named_in_errors() {
    Jail::expect_with(|jail| {
        assert_eq!(
            rejected_keys(jail, &MINIMAL.replace("url = \"amqp", "url = 5\n#")),
            vec!["sinks.r.url"]
        );
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
            assert_eq!(
                rejected_keys(jail, &with(bad)),
                vec!["triggers[0].routing_key_pointer"],
                "{bad}"
            );
        }
        let kafka = "[sinks.k]\ntype = \"kafka\"\nbrokers = \"b:9092\"\n[[triggers]]\nname = \"k\"\nkey = \"k\"\nsink = \"k\"\ntopic = \"t\"\nrouting_key_pointer = \"/x\"\n";
        assert_eq!(
            rejected_keys(jail, kafka),
            vec!["triggers[0].routing_key_pointer"]
        );
        Ok(())
    });
}

#[test]
fn a_bad_log_filter_is_an_error() {
    Jail::expect_with(|jail| {
        assert_eq!(
            rejected_keys(jail, &format!("[log]\nlevel = \"info,[[[\"\n{MINIMAL}")),
            vec!["log.level"]
        );
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
        jail_result = c.triggers[0]
            .rate()
            .map(|rate| (rate.per_second(), rate.burst()));
        Ok(())
    });
    assert_eq!(jail_result, Some((1.5, 2)), "a second's worth, rounded up");
}

#[test]
fn cluster_mode_takes_seed_nodes_and_tagged_keys_only() {
    Jail::expect_with(|jail| {
        let ok = MINIMAL.to_string()
            + "\n[redis]\nmode = \"cluster\"\nnodes = [\"redis://127.0.0.1:7000\", \"redis://127.0.0.1:7001/0\"]\n";
        let c = load_in_jail(jail, &ok).unwrap();
        assert_eq!(c.redis.settings().mode, RedisMode::Cluster);
        assert_eq!(c.redis.settings().nodes.len(), 2);

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
        assert_rejected_under(
            jail,
            bad,
            &[
                "redis.url",
                "redis.nodes[0]",
                "redis.nodes[3]",
                "redis.nodes",
                "triggers[0].key",
            ],
        );

        assert_redis_rejected(jail, "mode = \"cluster\"\n", &["redis.nodes"]);
        let stray = "nodes = [\"redis://127.0.0.1:7000\"]\n";
        assert_redis_rejected(jail, stray, &["redis.nodes"]);
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
