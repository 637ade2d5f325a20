//! Bridge configs as TOML: the sections every test bridge shares, with any setting changed,
//! plus sinks and triggers.

use std::fmt;

use super::{amqp_url, redis_url, AmqpCapture};

/// The smallest valid `[sinks.r]`, for configs that only have to pass validation.
pub const MINIMAL_SINK: &str =
    "[sinks.r]\ntype = \"amqp\"\nurl = \"amqp://guest:guest@127.0.0.1:5672/%2f\"\n";
/// The smallest valid trigger on [`MINIMAL_SINK`].
pub const MINIMAL_TRIGGER: &str =
    "[[triggers]]\nname = \"t\"\nkey = \"k\"\nsink = \"r\"\nexchange = \"\"\n";

/// The URL of a RabbitMQ on loopback `port` as user `guest` (nobody need listen there).
pub fn loopback_amqp(port: u16) -> String {
    format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
}

/// A TOML basic string.
pub fn quoted(value: &str) -> String {
    format!("\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\""))
}

/// The settings sections of a config (`[redis]`, `[sinks.NAME]`, ...), each a list of
/// `key = value` lines in the order first set; `Display` writes the TOML. Triggers are
/// appended to that text.
#[derive(Debug, Clone)]
pub struct ConfigToml {
    sections: Vec<(String, Vec<(String, String)>)>,
}

impl ConfigToml {
    /// What a test bridge runs with: the shared Redis with keyspace events, metrics on
    /// `metrics_port`, debug logs, a 10 s shutdown and the shared RabbitMQ as sink `rabbit`.
    pub fn base(metrics_port: u16) -> Self {
        Self {
            sections: Vec::new(),
        }
        .set_str("redis", "url", &redis_url())
        .set("redis", "enable_keyspace_events", "true")
        .set_str("metrics", "listen", &format!("127.0.0.1:{metrics_port}"))
        .set_str("metrics", "backlog_interval", "200ms")
        .set_str("log", "level", "info,delay_bridge=debug")
        .set_str("shutdown", "timeout", "10s")
        .amqp_sink("rabbit", &amqp_url())
    }

    /// Sets `key` in `[section]` (added at the end if missing) to `value`, written as TOML.
    pub fn set(mut self, section: &str, key: &str, value: &str) -> Self {
        let index = match self.sections.iter().position(|(s, _)| s == section) {
            Some(i) => i,
            None => {
                self.sections.push((section.to_string(), Vec::new()));
                self.sections.len() - 1
            }
        };
        let lines = &mut self.sections[index].1;
        match lines.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value.to_string(),
            None => lines.push((key.to_string(), value.to_string())),
        }
        self
    }

    /// Sets `key` in `[section]` to the string `value`.
    pub fn set_str(self, section: &str, key: &str, value: &str) -> Self {
        self.set(section, key, &quoted(value))
    }

    /// Removes `key` from `[section]`.
    pub fn unset(mut self, section: &str, key: &str) -> Self {
        if let Some((_, lines)) = self.sections.iter_mut().find(|(s, _)| s == section) {
            lines.retain(|(k, _)| k != key);
        }
        self
    }

    /// Leaves `[section]` out (its settings take their defaults).
    pub fn without(mut self, section: &str) -> Self {
        self.sections.retain(|(s, _)| s != section);
        self
    }

    /// Adds `[sinks.NAME]` of type `amqp` at `url`, reconnecting within a second.
    pub fn amqp_sink(self, name: &str, url: &str) -> Self {
        let section = format!("sinks.{name}");
        self.set_str(&section, "type", "amqp")
            .set_str(&section, "url", url)
            .set_str(&section, "reconnect_max", "1s")
    }

    /// Adds `[sinks.NAME]` of type `kafka` at `brokers`, with librdkafka `properties`.
    pub fn kafka_sink(self, name: &str, brokers: &str, properties: &[(&str, &str)]) -> Self {
        let section = format!("sinks.{name}");
        let mut me = self
            .set_str(&section, "type", "kafka")
            .set_str(&section, "brokers", brokers);
        for (k, v) in properties {
            me = me.set_str(&format!("{section}.properties"), &quoted(k), v);
        }
        me
    }
}

impl ConfigToml {
    /// Adds `[sinks.NAME]` of type `http` with the given `key = value` lines (TOML values).
    pub fn http_sink(mut self, name: &str, settings: &[(&str, &str)]) -> Self {
        let section = format!("sinks.{name}");
        self = self.set_str(&section, "type", "http");
        for (k, v) in settings {
            self = self.set(&section, k, v);
        }
        self
    }
}

impl fmt::Display for ConfigToml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (section, lines) in &self.sections {
            write!(f, "\n[{section}]\n")?;
            for (k, v) in lines {
                writeln!(f, "{k} = {v}")?;
            }
        }
        Ok(())
    }
}

/// [`ConfigToml::base`] as text.
pub fn base_config(metrics_port: u16) -> String {
    ConfigToml::base(metrics_port).to_string()
}

/// A `[[triggers]]` entry on `sink`, plus `lines` (its destination and any other setting).
pub fn trigger(name: &str, key: &str, sink: &str, lines: &str) -> String {
    format!("\n[[triggers]]\nname = \"{name}\"\nkey = \"{key}\"\nsink = \"{sink}\"\n{lines}\n")
}

/// A `[[triggers]]` entry publishing to `capture`'s exchange through sink `rabbit`, plus extra lines.
pub fn amqp_trigger(name: &str, key: &str, capture: &AmqpCapture, extra: &str) -> String {
    trigger(name, key, "rabbit", &(capture.destination() + extra))
}

/// A `[[triggers]]` entry producing to `topic` on sink `sink`, plus extra lines.
pub fn kafka_trigger(name: &str, key: &str, sink: &str, topic: &str, extra: &str) -> String {
    trigger(name, key, sink, &format!("topic = \"{topic}\"\n{extra}"))
}
