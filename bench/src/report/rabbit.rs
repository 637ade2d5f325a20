//! RabbitMQ's ceilings in the report: each publisher's rate and cost, and the bridge's ratio
//! to each.

use super::*;

/// RabbitMQ's ceilings into one queue, each measured by another publisher.
#[derive(Debug, Default, Clone, Serialize)]
pub struct AmqpCeilings {
    /// amqprs, a raw publisher on another client crate than the bridge's (the ceiling the
    /// goals name first).
    pub amqprs: Option<ClientRate>,
    /// amqplib (Node) in a child process, with the same messages and window.
    pub amqplib: Option<ClientRate>,
    /// The bridge's own sink code publishing without Redis: not independent of the bridge,
    /// it shows what Redis and claiming cost the bridge.
    pub sink_alone: Option<ClientRate>,
    /// amqprs forwarding through the bridge's claim and settle scripts: the bridge's Redis
    /// work around another client's publishing, what the bridge's own code is judged by.
    pub with_scripts: Option<ClientRate>,
}

/// One publisher's rate, and into the queue nobody consumes its CPU.
#[derive(Debug, Clone, Serialize)]
pub struct ClientRate {
    /// Messages over the time until every one was confirmed (and consumed, if consumed).
    pub rate: Rate,
    /// CPU seconds per 100,000 messages of the publishing process (the bench's own for
    /// amqprs and the sink alone), measured into the queue nobody consumes only.
    pub cpu_seconds_per_100k: Option<f64>,
}

impl AmqpCeilings {
    /// The publishers, labelled as the table names them.
    fn clients(&self) -> [(&'static str, Option<&ClientRate>); 4] {
        [
            ("amqprs", self.amqprs.as_ref()),
            ("amqplib", self.amqplib.as_ref()),
            ("the sink alone", self.sink_alone.as_ref()),
            ("amqprs with the scripts", self.with_scripts.as_ref()),
        ]
    }

    /// The ceilings' lines, `what` being `broker` or `backlog`.
    pub(super) fn ceiling_rows(&self, s: &Settings, what: &str) -> Vec<Row> {
        let window = format!(
            "{} channels, <= {} unconfirmed",
            s.ceiling_channels, s.ceiling_window
        );
        let mut rows = Vec::new();
        for (name, c) in self.clients() {
            let Some(c) = c else { continue };
            let how = match name {
                "the sink alone" => format!(
                    "the bridge's sink code without Redis, {} publishers, batch {}; not independent",
                    s.workers, s.batch
                ),
                "amqprs with the scripts" => format!(
                    "amqprs raw publisher, {window}, claiming and settling with the bridge's \
                     scripts, batch {}; not independent of the scripts",
                    s.batch
                ),
                _ => format!("{name} raw publisher, {window}"),
            };
            rows.push(Row::ceiling(
                format!("{what} ceiling ({how})"),
                rate(c.rate.msg_per_s),
            ));
        }
        rows
    }

    /// The bridge's rate `v` against amqplib (with the goal), against the sink alone and
    /// against amqprs with the scripts (amqprs's line is the phase's main one).
    pub(super) fn ratio_rows(&self, what: &str, v: f64, min_ratio: f64) -> Vec<Row> {
        let mut rows = Vec::new();
        if let Some(c) = &self.amqplib {
            rows.push(Row::against(
                format!("{what} vs amqplib"),
                v,
                Some(c.rate.msg_per_s),
                min_ratio,
                &format!("bridge >= {:.0}% of amqplib", 100.0 * min_ratio),
            ));
        }
        for (name, c) in [
            ("the sink alone", &self.sink_alone),
            ("amqprs with the scripts", &self.with_scripts),
        ] {
            if let Some(c) = c {
                rows.push(Row::versus(
                    format!("{what} vs {name}"),
                    v,
                    c.rate.msg_per_s,
                ));
            }
        }
        rows
    }

    /// CPU per 100,000 messages into the queue nobody consumes: the bridge's next to each
    /// publisher's.
    pub(super) fn cpu_rows(&self, bridge: f64) -> Vec<Row> {
        let mut rows = vec![Row::shown(
            "CPU per 100k messages into the queue nobody consumes",
            format!("{bridge:.2} s"),
        )];
        for (name, c) in self.clients() {
            if let Some(cpu) = c.and_then(|c| c.cpu_seconds_per_100k) {
                rows.push(Row {
                    measurement: format!("  {name} (its process)"),
                    ceiling: format!("{cpu:.2} s"),
                    ratio: format!("{:.1}x", bridge / cpu.max(1e-9)),
                    ..Row::default()
                });
            }
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ceilings(amqplib: f64) -> AmqpCeilings {
        let at = |r: f64| ClientRate {
            rate: Rate::new(r as u64, 1.0),
            cpu_seconds_per_100k: Some(0.5),
        };
        AmqpCeilings {
            amqprs: Some(at(1000.0)),
            amqplib: Some(at(amqplib)),
            sink_alone: Some(at(900.0)),
            with_scripts: Some(at(800.0)),
        }
    }

    #[test]
    fn the_bridge_is_judged_against_amqplib_too_and_only_compared_with_the_other_ceilings() {
        let rows = ceilings(1100.0).ratio_rows("forwarding rate", 950.0, 0.9);
        assert_eq!(rows.len(), 3);
        assert_eq!(
            (rows[0].ratio.as_str(), rows[0].result.as_str()),
            ("86%", "MISS")
        );
        assert_eq!(
            (rows[1].ratio.as_str(), rows[1].result.as_str()),
            ("106%", "")
        );
        assert_eq!(
            (rows[2].ratio.as_str(), rows[2].result.as_str()),
            ("119%", "")
        );
        let pass = ceilings(1000.0).ratio_rows("forwarding rate", 950.0, 0.9);
        assert_eq!(pass[0].result, "PASS");
    }

    #[test]
    fn cpu_is_shown_next_to_each_publisher() {
        let rows = ceilings(1000.0).cpu_rows(1.0);
        assert_eq!(rows.len(), 5);
        assert_eq!(rows[1].ratio, "2.0x");
    }
}
