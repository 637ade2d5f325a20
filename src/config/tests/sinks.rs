//! Unit tests of the sinks' sections: AMQP addresses and topology, TLS files, Kafka's
//! `ssl.*` files, HTTP routes, and the warnings they give.
#![allow(clippy::result_large_err)]

use super::*;

fn amqp_sink(lines: &str) -> String {
    MINIMAL.replace("url = \"amqp://guest:guest@127.0.0.1:5672/%2f\"", lines)
}

#[test]
fn an_amqp_sink_takes_url_or_urls() {
    Jail::expect_with(|jail| {
        let c = load_in_jail(jail, MINIMAL).unwrap();
        let SinkConfig::Amqp(a) = c.sinks["r"].settings() else {
            panic!("wrong sink type")
        };
        assert_eq!(a.addresses(), ["amqp://guest:guest@127.0.0.1:5672/%2f"]);

        let cluster = amqp_sink(
            "urls = [\"amqp://app:pw@n1:5672/%2f\", \"amqp://app:pw@n2:5672/%2f\", \"amqp://app:pw@n3/%2f?heartbeat=5\"]",
        );
        let c = load_in_jail(jail, &cluster).unwrap();
        let SinkConfig::Amqp(a) = c.sinks["r"].settings() else {
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
            assert_eq!(rejected_keys(jail, &amqp_sink(lines)), vec![key], "{lines}");
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
        let SinkConfig::Amqp(a) = c.sinks["r"].settings() else {
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
            let SinkConfig::Amqp(a) = c.sinks["r"].settings() else {
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
            assert_eq!(rejected_keys(jail, &with(line)), vec![key], "{line}");
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
        assert_eq!(rejected_keys(jail, &toml), ["redis.tls.ca_file"]);
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
        assert_eq!(
            rejected_keys(jail, &kafka("sasl_ssl", "nowhere.pem")),
            ["sinks.k.properties.ssl.ca.location"]
        );
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
fn http_routes_resolve_and_a_timeout_past_publish_timeout_is_warned_about() {
    Jail::expect_with(|jail| {
        let toml = "[sinks.h]\ntype = \"http\"\ntimeout = \"10s\"\n\
            [[triggers]]\nname = \"t\"\nkey = \"k\"\nsink = \"h\"\n\
            url_pointer = \"/url\"\nallowed_urls = [\"https://*.hooks.internal/\"]\nmethod = \"PUT\"\n";
        let c = load_in_jail(jail, toml).unwrap();
        let Destination::Http(route) = c.triggers[0].destination() else {
            panic!("{:?}", c.triggers[0].destination());
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
