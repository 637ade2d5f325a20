//! The report's rows: each measurement next to its ceiling, goal and verdict.

use super::*;

impl Report {
    /// The cluster phase's lines: its ceilings next to the standalone one, and its
    /// forwarding next to the broker's ceiling.
    fn cluster_rows(&self, c: &ClusterRun, broker: Option<f64>, redis: Option<f64>) -> Vec<Row> {
        let kafka = self.settings.sink == "kafka";
        let one = c.one_shard.msg_per_s;
        let spread = c.all_shards.msg_per_s;
        let of_standalone = |v: f64| {
            redis.map_or(String::new(), |r| {
                format!("{} of standalone", percent(v, r))
            })
        };
        let mut rows = vec![Row {
            ratio: of_standalone(one),
            ..Row::ceiling("cluster redis ceiling, 1 shard (1 master)", rate(one))
        }];
        let measurement = format!(
            "cluster redis ceiling, {} shards on {} masters ({:?} per master)",
            c.shards, c.masters, c.spread
        );
        rows.push(Row {
            ratio: of_standalone(spread),
            goal: redis.map_or(String::new(), |_| ">= standalone ceiling".into()),
            result: redis.map_or(String::new(), |r| verdict(spread >= r)),
            ..Row::ceiling(measurement, rate(spread))
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
        let measurement = format!(
            "cluster forwarding rate ({} shards, {} messages)",
            c.shards, c.forward.messages
        );
        rows.push(Row::against(measurement, v, ceiling, min_ratio, goal));
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
            let measurement = match self.settings.sink.as_str() {
                "http" => "broker ceiling (the http client alone)".to_string(),
                sink => format!("broker ceiling ({sink} plain publisher)"),
            };
            rows.push(Row::ceiling(measurement, rate(b)));
        }
        if let Some(r) = redis {
            rows.push(Row::ceiling(
                "redis ceiling (claim + settle scripts only)",
                rate(r),
            ));
        }
        if let Some(c) = &self.cluster {
            rows.extend(self.cluster_rows(c, broker, redis));
        }
        if let Some(f) = &self.forward {
            rows.extend(self.forward_rows(f, broker, redis));
        }
        if let Some(c) = &self.cost {
            rows.extend(c.rows());
        }
        if let Some(i) = &self.instructions {
            rows.extend(i.rows());
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
            rows.push(crash_row(c));
        }
        if let Some(i) = &self.ingress {
            rows.extend(i.rows());
        }
        if let Some(r) = &self.rss {
            let most = r.rss_bytes.max(r.peak_bytes);
            rows.push(Row::judged(
                format!("bridge RSS with {} scheduled", r.scheduled),
                mib(most),
                format!("< {RSS_LIMIT_MIB} MiB"),
                (most as f64) < RSS_LIMIT_MIB * MIB,
            ));
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
        let measurement = format!("forwarding rate ({} messages)", f.rate.messages);
        rows.push(Row::against(measurement, v, ceiling, min_ratio, goal));
        if kafka {
            rows.push(Row::judged(
                "forwarding rate, absolute",
                rate(v),
                format!(">= {KAFKA_MIN_RATE:.0} msg/s"),
                v >= KAFKA_MIN_RATE,
            ));
        } else if let Some(c) = &self.amqp_ceilings {
            rows.extend(c.ratio_rows("forwarding rate", v, AMQP_MIN_RATIO));
        }
        if let (false, Some(r)) = (kafka, redis) {
            rows.push(Row::versus("forwarding rate vs redis ceiling", v, r));
        }
        if f.duplicates > 0 {
            rows.push(Row::shown(
                "duplicates received while forwarding",
                f.duplicates.to_string(),
            ));
        }
        rows.push(Row::shown(
            "bridge CPU per 100k messages",
            format!("{:.2} s", f.cpu_seconds_per_100k),
        ));
        rows.extend(others_cpu_rows(f));
        rows.push(Row::shown(
            "bridge peak RSS while forwarding",
            mib(f.peak_rss_bytes),
        ));
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
        let measurement = format!(
            "backlog rate ({} messages into a queue nobody consumes)",
            f.rate.messages
        );
        let of = if self.amqp_backlog_ceilings.is_some() {
            "amqprs"
        } else {
            "backlog ceiling"
        };
        let goal = format!("bridge >= {:.0}% of {of}", 100.0 * BACKLOG_MIN_RATIO);
        rows.push(Row::against(
            measurement,
            v,
            ceiling,
            BACKLOG_MIN_RATIO,
            &goal,
        ));
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
    rows.push(Row::shown(
        format!("lateness p50 ({label}, {} msgs)", l.messages),
        millis(l.p50_ms),
    ));
    let (goal, pass) = if l.notifications {
        (format!("<= {LATE_P99_MS} ms"), l.p99_ms <= LATE_P99_MS)
    } else {
        (
            format!("<= guard interval {} ms", l.guard_interval_ms),
            l.p99_ms <= l.guard_interval_ms,
        )
    };
    rows.push(Row::judged(
        format!("lateness p99 ({label})"),
        millis(l.p99_ms),
        goal,
        pass,
    ));
    rows.push(Row::shown(
        format!(
            "  p99 of the {} scheduled before the head ({label})",
            l.early_messages
        ),
        millis(l.early_p99_ms),
    ));
    if let Some(c) = l.confirm_p99_le_ms {
        rows.push(Row::shown(
            format!("  p99 at broker confirm, bridge histogram ({label})"),
            format!("<= {c} ms"),
        ));
    }
    let mut max = Row::shown(format!("lateness max ({label})"), millis(l.max_ms));
    if l.notifications {
        max.goal = format!("<= {LATE_MAX_MS} ms");
        max.result = verdict(l.max_ms <= LATE_MAX_MS);
    }
    rows.push(max);
    if let Some(w) = &l.empty_claims {
        rows.push(Row::judged(
            format!(
                "empty claims per forwarded message ({label}: {} empty, {} forwarded; head reads instead of claims {:.2} per message)",
                w.empty_claims, w.forwarded, w.reads_per_message
            ),
            format!("{:.2}", w.per_message),
            format!("<= {EMPTY_CLAIMS_PER_MESSAGE}"),
            w.per_message <= EMPTY_CLAIMS_PER_MESSAGE,
        ));
    }
    rows
}

/// Duplicates per SIGKILL against what a bridge can hold claimed, and the goal.
fn crash_row(c: &Crash) -> Row {
    Row {
        measurement: format!(
            "duplicates per SIGKILL ({} kills, {} mid-drain, {} messages due at once)",
            c.kills, c.kills_mid_drain, c.messages
        ),
        bridge: format!("{:.0}", c.duplicates_per_kill),
        ceiling: format!("{} claimed at most", c.claimed_at_most),
        ratio: percent(c.duplicates_per_kill, c.claimed_at_most.max(1) as f64),
        goal: format!("<= {DUPLICATES_PER_KILL:.0}"),
        result: verdict(
            c.duplicates_per_kill <= DUPLICATES_PER_KILL && c.kills_mid_drain == c.kills,
        ),
    }
}

/// The idle phase: Redis commands, CPU, RSS and start-up of many idle triggers.
fn idle_rows(i: &Idle) -> Vec<Row> {
    let n = i.triggers;
    [
        (
            format!(
                "idle redis commands/s per trigger ({n} triggers, {})",
                i.attribution
            ),
            format!("{:.2}", i.commands_per_s_per_trigger),
            format!("<= {IDLE_CMDS_PER_TRIGGER}"),
            i.commands_per_s_per_trigger <= IDLE_CMDS_PER_TRIGGER,
        ),
        (
            "idle bridge CPU (share of one core)".into(),
            format!("{:.2}%", 100.0 * i.cpu_share),
            format!("<= {:.0}%", 100.0 * IDLE_CPU_SHARE),
            i.cpu_share <= IDLE_CPU_SHARE,
        ),
        (
            format!("idle bridge RSS ({n} triggers)"),
            mib(i.rss_bytes),
            format!("<= {IDLE_RSS_MIB} MiB"),
            i.rss_bytes as f64 <= IDLE_RSS_MIB * MIB,
        ),
        (
            format!("start-up to ready ({n} triggers)"),
            format!("{:.2} s", i.startup_s),
            format!("<= {IDLE_STARTUP_S} s"),
            i.startup_s <= IDLE_STARTUP_S,
        ),
    ]
    .into_iter()
    .map(|(measurement, bridge, goal, pass)| Row::judged(measurement, bridge, goal, pass))
    .collect()
}

/// Where else the machine's CPU went while the bridge forwarded: the Redis server and the
/// broker's process, per 100k messages (on a machine of two cores, every second they take
/// is one the others do not get).
fn others_cpu_rows(f: &Forward) -> Vec<Row> {
    let redis = f.redis_cpu_per_100k.map(|s| {
        Row::shown(
            "  redis server CPU per 100k messages, meanwhile",
            format!("{s:.2} s"),
        )
    });
    let broker = f.broker_cpu_per_100k.as_ref().map(|b| {
        Row::shown(
            format!("  broker CPU per 100k messages, meanwhile ({})", b.process),
            format!("{:.2} s", b.seconds_per_100k),
        )
    });
    redis.into_iter().chain(broker).collect()
}
