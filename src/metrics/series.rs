//! Each trigger's counters and gauges as plain atomics, made into series only when scraped.
//!
//! A series of the `prometheus` crate holds its own copy of its family's description and of
//! its labels; with tens of series per trigger and thousands of triggers that is most of an
//! idle bridge's memory. Here a trigger holds a few dozen bytes per series, and the series
//! exist only while `/metrics` is being answered.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Counter, Gauge, LabelPair, Metric, MetricFamily, MetricType};

/// A counter with a second label (a reason or a kind): its values by that label.
#[derive(Default)]
pub struct ByLabel(Mutex<Vec<(&'static str, u64)>>);

impl ByLabel {
    /// Makes the series of each of `labels` exist, at 0 if new.
    pub fn touch_all<'a>(&self, labels: impl ExactSizeIterator<Item = &'a str>) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .reserve_exact(labels.len());
        for label in labels {
            self.touch(label);
        }
    }

    /// Makes the series of `label` exist, at 0 if new.
    pub fn touch(&self, label: &str) {
        self.add(label, 0);
    }

    /// Adds `n` to the series of `label`.
    pub fn add(&self, label: &str, n: u64) {
        let mut values = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match values.iter_mut().find(|(l, _)| *l == label) {
            Some((_, v)) => *v += n,
            None => values.push((intern(label), n)),
        }
    }

    /// The value of `label`'s series (0 if it does not exist).
    pub fn get(&self, label: &str) -> u64 {
        let values = self.0.lock().unwrap_or_else(|e| e.into_inner());
        values
            .iter()
            .find(|(l, _)| *l == label)
            .map_or(0, |(_, v)| *v)
    }

    /// The sum over every label.
    pub fn total(&self) -> u64 {
        let values = self.0.lock().unwrap_or_else(|e| e.into_inner());
        values.iter().map(|(_, v)| *v).sum()
    }

    fn each(&self, out: Emit<'_>) {
        let values = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for (label, v) in values.iter() {
            out(Some(label), *v as f64);
        }
    }
}

/// `label` kept once for the whole process: reasons and kinds are a small, bounded set, shared
/// by every trigger.
fn intern(label: &str) -> &'static str {
    static SEEN: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(known) = seen.get(label) {
        return known;
    }
    let kept: &'static str = Box::leak(label.into());
    seen.insert(kept);
    kept
}

/// One trigger's counters and gauges.
#[derive(Default)]
pub struct Cells {
    trigger: String,
    sink: String,
    /// Messages confirmed by the broker and removed from Redis.
    pub forwarded: AtomicU64,
    /// Of those, messages whose due time was infinite (`-inf`: now, `+inf`: parked): they
    /// have no lateness and stay out of the lateness histogram.
    pub immediate: AtomicU64,
    /// Claimed messages returned unattempted or unconfirmed.
    pub put_back: AtomicU64,
    /// Expired leases put back.
    pub redelivered: AtomicU64,
    /// Claims that found nothing due.
    pub empty_claims: AtomicU64,
    /// Heads read after a wake-up, before claiming.
    pub head_reads: AtomicU64,
    /// Claims held by the rate limit.
    pub rate_limited_claims: AtomicU64,
    /// Control fields (pause, rate bucket) found out of range and repaired by a claim.
    pub control_repairs: AtomicU64,
    /// Idle waits ended by a keyspace notification.
    pub notify_wakeups: AtomicU64,
    /// Messages claimed after their expiry.
    pub expired: AtomicU64,
    /// Whether the trigger forwards dead letters (its forwarding series exist).
    pub forwards_dead_letters: AtomicBool,
    /// Dead letters the broker confirmed at the dead-letter destination.
    pub dead_letters_forwarded: AtomicU64,
    /// Retried messages by reason.
    pub retried: ByLabel,
    /// Dead-lettered messages by reason.
    pub dead_lettered: ByLabel,
    /// Dead letters not forwarded on a try, by reason.
    pub dead_letter_forward_failures: ByLabel,
    /// Failed Redis calls by kind.
    pub redis_errors: ByLabel,
    /// Members due, scheduled, in flight and dead.
    pub backlog: [AtomicI64; 4],
    /// Age of the oldest due member in seconds, as `f64` bits.
    pub oldest_due_age: AtomicU64,
    /// 1 while paused.
    pub paused: AtomicI64,
    /// 1 while the trigger's destination is held.
    pub held: AtomicI64,
    /// Members on the trigger's keys that its configuration does not serve.
    pub unserved: AtomicI64,
}

impl Cells {
    /// Sets the oldest due age, in seconds.
    pub fn set_oldest_due_age(&self, seconds: f64) {
        self.oldest_due_age.store(seconds.to_bits(), Relaxed);
    }
}

/// The states of `backlog_messages`, in the order of [`Cells::backlog`].
pub(super) const BACKLOG_STATES: [&str; 4] = ["due", "scheduled", "inflight", "dead"];

/// Receives one series: its second label's value (if the family has one) and its value.
type Emit<'a> = &'a mut dyn FnMut(Option<&str>, f64);

/// One exported family: its name (without the registry's prefix), help, type, labels (the
/// first is always `trigger`) and how a trigger's cells give its series.
struct Family {
    name: &'static str,
    help: &'static str,
    kind: MetricType,
    labels: &'static [&'static str],
    series: Series,
}

/// How a trigger's cells give a family's series.
enum Series {
    /// One series: the value of a counter cell.
    Count(fn(&Cells) -> &AtomicU64),
    /// One series: the value of a gauge cell.
    Gauge(fn(&Cells) -> &AtomicI64),
    /// One series per value of the second label.
    ByLabel(fn(&Cells) -> &ByLabel),
    /// Any other way.
    Each(fn(&Cells, Emit<'_>)),
}

impl Series {
    fn emit(&self, c: &Cells, out: Emit<'_>) {
        match self {
            Series::Count(cell) => out(None, load(cell(c))),
            Series::Gauge(cell) => out(None, cell(c).load(Relaxed) as f64),
            Series::ByLabel(cell) => cell(c).each(out),
            Series::Each(each) => each(c, out),
        }
    }
}

/// A counter family with the `trigger` label alone, from one counter cell.
const fn counter(name: &'static str, help: &'static str, cell: fn(&Cells) -> &AtomicU64) -> Family {
    Family {
        name,
        help,
        kind: MetricType::COUNTER,
        labels: &["trigger"],
        series: Series::Count(cell),
    }
}

/// A gauge family with the `trigger` label alone, from one gauge cell.
const fn gauge(name: &'static str, help: &'static str, cell: fn(&Cells) -> &AtomicI64) -> Family {
    Family {
        name,
        help,
        kind: MetricType::GAUGE,
        labels: &["trigger"],
        series: Series::Gauge(cell),
    }
}

/// A counter family with a second label, from a [`ByLabel`] cell.
const fn by_label(
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    cell: fn(&Cells) -> &ByLabel,
) -> Family {
    Family {
        name,
        help,
        kind: MetricType::COUNTER,
        labels,
        series: Series::ByLabel(cell),
    }
}

fn load(v: &AtomicU64) -> f64 {
    v.load(Relaxed) as f64
}

const FAMILIES: &[Family] = &[
    Family {
        name: "messages_forwarded_total",
        help: "Messages confirmed by the broker and removed from Redis",
        kind: MetricType::COUNTER,
        labels: &["trigger", "sink"],
        series: Series::Each(|c, out| out(Some(&c.sink), load(&c.forwarded))),
    },
    by_label("messages_retried_total", "Messages that failed and were scheduled again after a backoff", &["trigger", "reason"], |c| &c.retried),
    by_label("messages_dead_lettered_total", "Messages moved to the dead-letter set", &["trigger", "reason"], |c| &c.dead_lettered),
    Family {
        name: "dead_letters_forwarded_total",
        help: "Dead letters the broker confirmed at the trigger's dead-letter destination and that left Redis",
        kind: MetricType::COUNTER,
        labels: &["trigger"],
        series: Series::Each(|c, out| {
            if c.forwards_dead_letters.load(Relaxed) {
                out(None, load(&c.dead_letters_forwarded));
            }
        }),
    },
    by_label("dead_letter_forward_failures_total", "Dead letters that a forward did not deliver, by reason: tried again after the lease, or kept in Redis when the broker refuses them", &["trigger", "reason"], |c| &c.dead_letter_forward_failures),
    counter("messages_immediate_total", "Messages forwarded whose due time was infinite (-inf: now, ahead of every due time; +inf: parked): they have no lateness and are counted here instead of in the lateness histogram", |c| &c.immediate),
    counter("messages_expired_total", "Messages claimed after their expiry (expire_after, an envelope's expires_at_ms): dead-lettered as expired or dropped, never published", |c| &c.expired),
    counter("messages_redelivered_total", "In-flight messages whose lease expired and were put back to be delivered again", |c| &c.redelivered),
    counter("messages_put_back_total", "Claimed messages returned unattempted or unconfirmed (shutdown, broker connection lost)", |c| &c.put_back),
    counter("empty_claims_total", "Claims that found nothing due", |c| &c.empty_claims),
    counter("head_reads_total", "Queue heads read after a wake-up instead of a claim: a head not due yet is waited for, not claimed", |c| &c.head_reads),
    counter("rate_limited_claims_total", "Claims that took nothing because the trigger's rate limit was spent", |c| &c.rate_limited_claims),
    counter("control_repairs_total", "Control hash fields (paused, tokens, at) a claim found out of range and repaired", |c| &c.control_repairs),
    counter("notify_wakeups_total", "Idle waits ended early by a keyspace notification", |c| &c.notify_wakeups),
    by_label("redis_errors_total", "Failed Redis calls by kind", &["trigger", "kind"], |c| &c.redis_errors),
    Family {
        name: "backlog_messages",
        help: "Members per state: due, scheduled, inflight, dead",
        kind: MetricType::GAUGE,
        labels: &["trigger", "state"],
        series: Series::Each(|c, out| {
            for (state, v) in BACKLOG_STATES.iter().zip(&c.backlog) {
                out(Some(state), v.load(Relaxed) as f64);
            }
        }),
    },
    Family {
        name: "oldest_due_age_seconds",
        help: "Age of the oldest member that is due and not yet claimed",
        kind: MetricType::GAUGE,
        labels: &["trigger"],
        series: Series::Each(|c, out| out(None, f64::from_bits(c.oldest_due_age.load(Relaxed)))),
    },
    gauge("trigger_paused", "1 while an operator has paused the trigger's claims, else 0", |c| &c.paused),
    gauge("trigger_held", "1 while the trigger's destination is held (missing, refusing, unreachable: its messages wait in Redis, no attempt counted), else 0", |c| &c.held),
    gauge("unserved_members", "Members on the trigger's keys that its configuration does not serve (an earlier shard count's): nothing delivers them", |c| &c.unserved),
];

/// Every trigger's cells, by trigger and sink, and the collector that exports them.
pub struct TriggerSeries {
    cells: Mutex<BTreeMap<(String, String), Arc<Cells>>>,
    descs: Vec<Desc>,
}

impl TriggerSeries {
    pub(super) fn new() -> Self {
        let descs = FAMILIES
            .iter()
            .map(|f| {
                let labels = f.labels.iter().map(|l| l.to_string()).collect();
                Desc::new(f.name.into(), f.help.into(), labels, HashMap::new())
                    .expect("valid metric")
            })
            .collect();
        Self {
            cells: Mutex::new(BTreeMap::new()),
            descs,
        }
    }

    /// The cells of `trigger` publishing to `sink`, made at first use and kept (a reloaded
    /// trigger counts on).
    pub fn cells(&self, trigger: &str, sink: &str) -> Arc<Cells> {
        let mut map = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        map.entry((trigger.to_string(), sink.to_string()))
            .or_insert_with(|| {
                Arc::new(Cells {
                    trigger: trigger.to_string(),
                    sink: sink.to_string(),
                    ..Cells::default()
                })
            })
            .clone()
    }

    /// The cells of `trigger` (with any sink), if it has some.
    pub fn find(&self, trigger: &str) -> Option<Arc<Cells>> {
        let map = self.cells.lock().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .find(|((t, _), _)| t == trigger)
            .map(|(_, c)| c.clone())
    }
}

/// Registers `series` as a collector of a registry.
pub(super) struct Exporter(pub Arc<TriggerSeries>);

impl Collector for Exporter {
    fn desc(&self) -> Vec<&Desc> {
        self.0.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let cells: Vec<Arc<Cells>> = {
            let map = self.0.cells.lock().unwrap_or_else(|e| e.into_inner());
            map.values().cloned().collect()
        };
        FAMILIES
            .iter()
            .map(|f| {
                let mut mf = MetricFamily::default();
                mf.set_name(f.name.to_string());
                mf.set_help(f.help.to_string());
                mf.set_field_type(f.kind);
                let metrics = mf.mut_metric();
                for c in &cells {
                    f.series.emit(c, &mut |second, value| {
                        let mut labels = vec![label(f.labels[0], &c.trigger)];
                        if let (Some(name), Some(v)) = (f.labels.get(1), second) {
                            labels.push(label(name, v));
                        }
                        let mut m = Metric::from_label(labels);
                        if f.kind == MetricType::GAUGE {
                            let mut g = Gauge::default();
                            g.set_value(value);
                            m.set_gauge(g);
                        } else {
                            let mut counter = Counter::default();
                            counter.set_value(value);
                            m.set_counter(counter);
                        }
                        metrics.push(m);
                    });
                }
                mf
            })
            .collect()
    }
}

fn label(name: &str, value: &str) -> LabelPair {
    let mut l = LabelPair::default();
    l.set_name(name.to_string());
    l.set_value(value.to_string());
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_exported_with_their_labels_and_kept_per_trigger() {
        let series = Arc::new(TriggerSeries::new());
        let a = series.cells("a", "rabbit");
        a.forwarded.fetch_add(3, Relaxed);
        a.retried.touch("nacked");
        a.retried.add("timeout", 2);
        a.backlog[1].store(7, Relaxed);
        assert!(Arc::ptr_eq(&a, &series.cells("a", "rabbit")));
        let families = Exporter(series.clone()).collect();
        let find = |name: &str| families.iter().find(|f| f.name() == name).unwrap();
        let forwarded = &find("messages_forwarded_total").get_metric()[0];
        let labels: Vec<(&str, &str)> = forwarded
            .get_label()
            .iter()
            .map(|l| (l.name(), l.value()))
            .collect();
        assert_eq!(labels, [("trigger", "a"), ("sink", "rabbit")]);
        assert_eq!(forwarded.get_counter().get_value(), 3.0);
        let retried: Vec<(String, f64)> = find("messages_retried_total")
            .get_metric()
            .iter()
            .map(|m| {
                (
                    m.get_label()[1].value().to_string(),
                    m.get_counter().get_value(),
                )
            })
            .collect();
        assert_eq!(retried, [("nacked".into(), 0.0), ("timeout".into(), 2.0)]);
        assert!(std::ptr::eq(intern("nacked"), intern("nacked")));
        assert_eq!(find("backlog_messages").get_metric().len(), 4);
        assert!(find("dead_letters_forwarded_total").get_metric().is_empty());
    }
}
