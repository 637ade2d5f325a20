//! The report's rows: each measurement next to its ceiling, goal and verdict.

use super::*;

impl Report {
    /// The cluster phase's lines: its ceilings next to the standalone one, and its
    /// forwarding next to the broker's ceiling.
    fn cluster_rows(&self, c: &ClusterRun, broker: Option<f64>, redis: Option<f64>) -> Vec<Row> {
        let kafka = self.settings.sink == "kafka";
        let one = c.one_shard.msg_per_s;
        let spread = c.all_shards.msg_per_s;
        let mut rows = vec![Row {
            measurement: "cluster redis ceiling, 1 shard (1 master)".into(),
            ceiling: rate(one),
            ratio: redis.map_or(String::new(), |r| {
                format!("{:.0}% of standalone", 100.0 * one / r)
            }),
            ..Row::default()
        }];
        rows.push(Row {
            measurement: format!(
                "cluster redis ceiling, {} shards on {} masters ({:?} per master)",
                c.shards, c.masters, c.spread
            ),
            ceiling: rate(spread),
            ratio: redis.map_or(String::new(), |r| {
                format!("{:.0}% of standalone", 100.0 * spread / r)
            }),
            goal: redis.map_or(String::new(), |_| ">= standalone ceiling".into()),
            result: redis.map_or(String::new(), |r| verdict(spread >= r)),
            ..Row::default()
        });
        let v = c.forward.msg_per_s;
        let (ceiling, min_ratio, goal) = if kafka {
            (
                broker.map(|b| b.min(spread)),
                KAFKA_MIN_RATIO,
                "bridge >= 80% of lower ceiling",
            )
        } else {
            (broker, CLUSTER_MIN_RATIO, "bridge >= 80% of broker ceiling")
        };
        rows.push(Row {
            measurement: format!(
                "cluster forwarding rate ({} shards, {} messages)",
                c.shards, c.forward.messages
            ),
            bridge: rate(v),
            ceiling: ceiling.map(rate).unwrap_or_default(),
            ratio: ceiling.map_or(String::new(), |b| format!("{:.0}%", 100.0 * v / b)),
            goal: ceiling.map_or(String::new(), |_| goal.into()),
            result: ceiling.map_or(String::new(), |b| verdict(v >= min_ratio * b)),
        });
        rows
    }

    /// The table's lines; the ones with a goal carry PASS or MISS.
    pub fn rows(&self) -> Vec<Row> {
        let mut rows = Vec::new();
        let broker = self.broker_ceiling.as_ref().map(|r| r.msg_per_s);
        let redis = self.redis_ceiling.as_ref().map(|r| r.msg_per_s);
        if let Some(c) = &self.amqp_ceilings {
            rows.extend(c.ceiling_rows(&self.settings, "broker"));
        } else if let Some(b) = broker {
            rows.push(Row {
                measurement: match self.settings.sink.as_str() {
                    "http" => "broker ceiling (the http client alone)".to_string(),
                    sink => format!("broker ceiling ({sink} plain publisher)"),
                },
                ceiling: rate(b),
                ..Row::default()
            });
        }
        if let Some(r) = redis {
            rows.push(Row {
                measurement: "redis ceiling (claim + settle scripts only)".into(),
                ceiling: rate(r),
                ..Row::default()
            });
        }
        if let Some(c) = &self.cluster {
            rows.extend(self.cluster_rows(c, broker, redis));
        }
        if let Some(f) = &self.forward {
            rows.extend(self.forward_rows(f, broker, redis));
        }
        if let Some(c) = &self.kafka_cost {
            rows.extend(c.rows());
        }
        if let Some(f) = &self.backlog {
            rows.extend(self.backlog_rows(f));
        }
        for l in &self.lateness {
            rows.extend(lateness_rows(l));
        }
        if let Some(s) = &self.scheduled {
            rows.extend(s.rows());
        }
        if let Some(h) = &self.herd {
            rows.extend(h.rows(broker));
        }
        if let Some(i) = &self.idle {
            rows.extend(idle_rows(i));
        }
        if let Some(c) = &self.crash {
            rows.push(Row {
                measurement: format!(
                    "duplicates per SIGKILL ({} kills, {} mid-drain, {} messages due at once)",
                    c.kills, c.kills_mid_drain, c.messages
                ),
                bridge: format!("{:.0}", c.duplicates_per_kill),
                ceiling: format!("{} claimed at most", c.claimed_at_most),
                ratio: format!(
                    "{:.0}%",
                    100.0 * c.duplicates_per_kill / c.claimed_at_most.max(1) as f64
                ),
                goal: format!("<= {DUPLICATES_PER_KILL:.0}"),
                result: verdict(
                    c.duplicates_per_kill <= DUPLICATES_PER_KILL && c.kills_mid_drain == c.kills,
                ),
            });
        }
        if let Some(i) = &self.ingress {
            rows.extend(i.rows());
        }
        if let Some(r) = &self.rss {
            rows.push(Row {
                measurement: format!("bridge RSS with {} scheduled", r.scheduled),
                bridge: mib(r.rss_bytes.max(r.peak_bytes)),
                goal: format!("< {RSS_LIMIT_MIB} MiB"),
                result: verdict((r.rss_bytes.max(r.peak_bytes) as f64) < RSS_LIMIT_MIB * MIB),
                ..Row::default()
            });
        }
        rows
    }

    /// The forwarding phase against the broker (and Redis) ceilings, with its cost.
    fn forward_rows(&self, f: &Forward, broker: Option<f64>, redis: Option<f64>) -> Vec<Row> {
        let kafka = self.settings.sink == "kafka";
        let mut rows = Vec::new();
        let v = f.rate.msg_per_s;
        let lower = match (broker, redis) {
            (Some(b), Some(r)) => Some(b.min(r)),
            (b, r) => b.or(r),
        };
        let (ceiling, min_ratio, goal) = if kafka {
            (lower, KAFKA_MIN_RATIO, "bridge >= 80% of lower ceiling")
        } else {
            let goal = if self.amqp_ceilings.is_some() {
                "bridge >= 90% of amqprs"
            } else {
                "bridge >= 90% of broker ceiling"
            };
            (broker, AMQP_MIN_RATIO, goal)
        };
        rows.push(Row {
            measurement: format!("forwarding rate ({} messages)", f.rate.messages),
            bridge: rate(v),
            ceiling: ceiling.map(rate).unwrap_or_default(),
            ratio: ceiling.map_or(String::new(), |c| format!("{:.0}%", 100.0 * v / c)),
            goal: ceiling.map_or(String::new(), |_| goal.into()),
            result: ceiling.map_or(String::new(), |c| verdict(v >= min_ratio * c)),
        });
        if kafka {
            rows.push(Row {
                measurement: "forwarding rate, absolute".into(),
                bridge: rate(v),
                goal: format!(">= {KAFKA_MIN_RATE:.0} msg/s"),
                result: verdict(v >= KAFKA_MIN_RATE),
                ..Row::default()
            });
        } else if let Some(c) = &self.amqp_ceilings {
            rows.extend(c.ratio_rows("forwarding rate", v, AMQP_MIN_RATIO));
        }
        if let (false, Some(r)) = (kafka, redis) {
            rows.push(Row {
                measurement: "forwarding rate vs redis ceiling".into(),
                bridge: rate(v),
                ceiling: rate(r),
                ratio: format!("{:.0}%", 100.0 * v / r),
                ..Row::default()
            });
        }
        if f.duplicates > 0 {
            rows.push(Row {
                measurement: "duplicates received while forwarding".into(),
                bridge: f.duplicates.to_string(),
                ..Row::default()
            });
        }
        rows.push(Row {
            measurement: "bridge CPU per 100k messages".into(),
            bridge: format!("{:.2} s", f.cpu_seconds_per_100k),
            ..Row::default()
        });
        rows.extend(others_cpu_rows(f));
        rows.push(Row {
            measurement: "bridge peak RSS while forwarding".into(),
            bridge: mib(f.peak_rss_bytes),
            ..Row::default()
        });
        rows
    }

    /// The backlog phase (a queue nobody consumes) against its own ceiling.
    fn backlog_rows(&self, f: &Forward) -> Vec<Row> {
        let mut rows = Vec::new();
        let v = f.rate.msg_per_s;
        let ceiling = self.backlog_ceiling.as_ref().map(|r| r.msg_per_s);
        if let Some(c) = &self.amqp_backlog_ceilings {
            rows.extend(c.ceiling_rows(&self.settings, "backlog"));
        }
        rows.push(Row {
            measurement: format!(
                "backlog rate ({} messages into a queue nobody consumes)",
                f.rate.messages
            ),
            bridge: rate(v),
            ceiling: ceiling.map(rate).unwrap_or_default(),
            ratio: ceiling.map_or(String::new(), |c| format!("{:.0}%", 100.0 * v / c)),
            goal: ceiling.map_or(String::new(), |_| {
                let of = if self.amqp_backlog_ceilings.is_some() {
                    "amqprs"
                } else {
                    "backlog ceiling"
                };
                format!("bridge >= {:.0}% of {of}", 100.0 * BACKLOG_MIN_RATIO)
            }),
            result: ceiling.map_or(String::new(), |c| verdict(v >= BACKLOG_MIN_RATIO * c)),
        });
        if let Some(c) = &self.amqp_backlog_ceilings {
            rows.extend(c.ratio_rows("backlog rate", v, BACKLOG_MIN_RATIO));
            rows.extend(c.cpu_rows(f.cpu_seconds_per_100k));
        }
        rows.extend(others_cpu_rows(f));
        rows
    }
}

/// One lateness run: p50, p99 against its goal, the early messages' p99, the broker-side
/// histogram's bound, the max.
fn lateness_rows(l: &Lateness) -> Vec<Row> {
    let mut rows = Vec::new();
    let label = format!(
        "notifications {}, {} msg/s",
        if l.notifications { "on" } else { "off" },
        l.rate
    );
    rows.push(Row {
        measurement: format!("lateness p50 ({label}, {} msgs)", l.messages),
        bridge: format!("{:.1} ms", l.p50_ms),
        ..Row::default()
    });
    let (goal, pass) = if l.notifications {
        (format!("<= {LATE_P99_MS} ms"), l.p99_ms <= LATE_P99_MS)
    } else {
        (
            format!("<= guard interval {} ms", l.guard_interval_ms),
            l.p99_ms <= l.guard_interval_ms,
        )
    };
    rows.push(Row {
        measurement: format!("lateness p99 ({label})"),
        bridge: format!("{:.1} ms", l.p99_ms),
        goal,
        result: verdict(pass),
        ..Row::default()
    });
    rows.push(Row {
        measurement: format!(
            "  p99 of the {} scheduled before the head ({label})",
            l.early_messages
        ),
        bridge: format!("{:.1} ms", l.early_p99_ms),
        ..Row::default()
    });
    if let Some(c) = l.confirm_p99_le_ms {
        rows.push(Row {
            measurement: format!("  p99 at broker confirm, bridge histogram ({label})"),
            bridge: format!("<= {c} ms"),
            ..Row::default()
        });
    }
    let mut max = Row {
        measurement: format!("lateness max ({label})"),
        bridge: format!("{:.1} ms", l.max_ms),
        ..Row::default()
    };
    if l.notifications {
        max.goal = format!("<= {LATE_MAX_MS} ms");
        max.result = verdict(l.max_ms <= LATE_MAX_MS);
    }
    rows.push(max);
    if let Some(w) = &l.empty_claims {
        rows.push(Row {
            measurement: format!(
                "empty claims per forwarded message ({label}: {} empty, {} forwarded; head reads instead of claims {:.2} per message)",
                w.empty_claims, w.forwarded, w.reads_per_message
            ),
            bridge: format!("{:.2}", w.per_message),
            goal: format!("<= {EMPTY_CLAIMS_PER_MESSAGE}"),
            result: verdict(w.per_message <= EMPTY_CLAIMS_PER_MESSAGE),
            ..Row::default()
        });
    }
    rows
}

/// The idle phase: Redis commands, CPU, RSS and start-up of many idle triggers.
fn idle_rows(i: &Idle) -> Vec<Row> {
    let mut rows = Vec::new();
    rows.push(Row {
        measurement: format!(
            "idle redis commands/s per trigger ({} triggers, {})",
            i.triggers, i.attribution
        ),
        bridge: format!("{:.2}", i.commands_per_s_per_trigger),
        goal: format!("<= {IDLE_CMDS_PER_TRIGGER}"),
        result: verdict(i.commands_per_s_per_trigger <= IDLE_CMDS_PER_TRIGGER),
        ..Row::default()
    });
    rows.push(Row {
        measurement: "idle bridge CPU (share of one core)".into(),
        bridge: format!("{:.2}%", 100.0 * i.cpu_share),
        goal: format!("<= {:.0}%", 100.0 * IDLE_CPU_SHARE),
        result: verdict(i.cpu_share <= IDLE_CPU_SHARE),
        ..Row::default()
    });
    rows.push(Row {
        measurement: format!("idle bridge RSS ({} triggers)", i.triggers),
        bridge: mib(i.rss_bytes),
        goal: format!("<= {IDLE_RSS_MIB} MiB"),
        result: verdict(i.rss_bytes as f64 <= IDLE_RSS_MIB * MIB),
        ..Row::default()
    });
    rows.push(Row {
        measurement: format!("start-up to ready ({} triggers)", i.triggers),
        bridge: format!("{:.2} s", i.startup_s),
        goal: format!("<= {IDLE_STARTUP_S} s"),
        result: verdict(i.startup_s <= IDLE_STARTUP_S),
        ..Row::default()
    });
    rows
}

/// Where else the machine's CPU went while the bridge forwarded: the Redis server and the
/// broker's process, per 100k messages (on a machine of two cores, every second they take
/// is one the others do not get).
fn others_cpu_rows(f: &Forward) -> Vec<Row> {
    let mut rows = Vec::new();
    if let Some(s) = f.redis_cpu_per_100k {
        rows.push(Row {
            measurement: "  redis server CPU per 100k messages, meanwhile".into(),
            bridge: format!("{s:.2} s"),
            ..Row::default()
        });
    }
    if let Some(b) = &f.broker_cpu_per_100k {
        rows.push(Row {
            measurement: format!("  broker CPU per 100k messages, meanwhile ({})", b.process),
            bridge: format!("{:.2} s", b.seconds_per_100k),
            ..Row::default()
        });
    }
    rows
}
