//! Unit tests of `allowed_topics`: compiled on a Kafka trigger, each bad pattern named under
//! its key with every other problem, refused on the other sinks' triggers and when it
//! would send records back to the ingress.
#![allow(clippy::result_large_err)]

use super::*;

const KAFKA: &str = "[sinks.k]\ntype = \"kafka\"\nbrokers = \"b:9092\"\n\
    [[triggers]]\nname = \"kt\"\nkey = \"delay:{kt}\"\nsink = \"k\"\ntopic = \"orders\"\n";

#[test]
fn a_kafka_trigger_takes_patterns_matched_against_whole_names() {
    Jail::expect_with(|jail| {
        let toml = format!("{KAFKA}allowed_topics = ['orders\\..*', 'billing']\n");
        let c = load_in_jail(jail, &toml).unwrap();
        let Destination::Kafka(route) = c.triggers[0].destination() else {
            panic!("{:?}", c.triggers[0].destination());
        };
        assert!(route.allows("orders.eu"));
        assert!(route.allows("billing"));
        assert!(!route.allows("orders"));
        assert!(!route.allows("billing.eu"));
        let c = load_in_jail(jail, KAFKA).unwrap();
        let Destination::Kafka(route) = c.triggers[0].destination() else {
            panic!("{:?}", c.triggers[0].destination());
        };
        assert!(!route.allows("orders"), "unset: records cannot choose");
        Ok(())
    });
}

#[test]
fn every_bad_pattern_is_named_with_the_other_problems() {
    Jail::expect_with(|jail| {
        let toml = format!("{KAFKA}allowed_topics = ['ok', 'orders(', '[z-a]']\nworkers = 0\n");
        let e = load_in_jail(jail, &toml).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("`orders(`") && text.contains("`[z-a]`"),
            "{text}"
        );
        let mut keys = keys_of(e);
        keys.sort();
        assert_eq!(
            keys,
            [
                "triggers[0].allowed_topics",
                "triggers[0].allowed_topics",
                "triggers[0].workers"
            ]
        );
        assert_eq!(
            rejected_keys(jail, &format!("{KAFKA}allowed_topics = []\n")),
            ["triggers[0].allowed_topics"]
        );
        Ok(())
    });
}

#[test]
fn only_kafka_triggers_take_allowed_topics() {
    Jail::expect_with(|jail| {
        let amqp = MINIMAL.replace(
            "exchange = \"ex\"",
            "exchange = \"ex\"\nallowed_topics = ['orders\\..*']",
        );
        let e = load_in_jail(jail, &amqp).unwrap_err();
        assert!(e.to_string().contains("only for kafka sinks"), "{e}");
        assert_eq!(keys_of(e), ["triggers[0].allowed_topics"]);
        let http = "[sinks.h]\ntype = \"http\"\n[[triggers]]\nname = \"t\"\nkey = \"k\"\n\
            sink = \"h\"\nurl = \"https://hooks.internal/\"\nallowed_topics = ['x']\n";
        assert_eq!(rejected_keys(jail, http), ["triggers[0].allowed_topics"]);
        Ok(())
    });
}

#[test]
fn patterns_must_not_allow_the_ingress_topic() {
    Jail::expect_with(|jail| {
        let toml = |pattern: &str| {
            format!("{KAFKA}allowed_topics = ['{pattern}']\n[triggers.ingress]\ntopic = \"orders.delayed\"\n")
        };
        assert!(load_in_jail(jail, &toml("orders\\.(eu|us)")).is_ok());
        let e = load_in_jail(jail, &toml("orders\\..*")).unwrap_err();
        assert!(e.to_string().contains("come back to the ingress"), "{e}");
        assert_eq!(keys_of(e), ["triggers[0].allowed_topics"]);
        Ok(())
    });
}
