//! The triggers a bridge runs: started, stopped and replaced when the configuration is reloaded.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::admin::{AdminTrigger, AdminTriggers};
use crate::config::{Config, Trigger};
use crate::health::Health;
use crate::housekeeping;
use crate::metrics::Metrics;
use crate::redis::conn::Conn;
use crate::redis::notify;
use crate::redis::queue::Queue;
use crate::schedule::wake::{Changes, Checker, Launch};
use crate::sink::Sink;
use crate::trigger::{Shard, Startup};
use crate::worker::{self, First};

/// What every trigger of the bridge shares.
pub(super) struct Services {
    pub conn: Conn,
    pub sinks: BTreeMap<String, Arc<Sink>>,
    pub metrics: Metrics,
    pub health: Health,
    /// Every worker of every trigger, for the shutdown's drain.
    pub workers: TaskTracker,
    /// Housekeeping tasks (recovery, backlog gauges, notifications).
    pub tasks: TaskTracker,
    /// The bridge's stop and abort; each trigger's are children of these.
    pub stop: CancellationToken,
    pub abort: CancellationToken,
    pub notifications: bool,
    /// `[redis] enable_keyspace_events`: a cluster's nodes get `Kz` again after a topology change.
    pub enable_keyspace_events: bool,
    /// The triggers the admin API sees.
    pub admin: AdminTriggers,
}

struct Entry {
    trigger: Arc<Trigger>,
    /// The trigger's queue over its shards.
    queue: Queue,
    /// One per shard.
    shards: Vec<Arc<Shard>>,
    stop: CancellationToken,
    abort: CancellationToken,
    workers: TaskTracker,
    /// Hears of changes to the schedules stored at run time.
    schedule_changes: Arc<Changes>,
}

/// The running triggers by name, the notification listener that wakes them and the
/// housekeeping that reads their sizes.
pub(super) struct Running {
    shared: Services,
    entries: BTreeMap<String, Entry>,
    notify_stop: CancellationToken,
    housekeeping_stop: CancellationToken,
    /// The gate the triggers started until the next [`Self::publish`] wait for, and the
    /// turns of every worker's first claim.
    startup: Startup,
    /// Reads the change counters of triggers without a schedule task.
    schedule_checker: Checker,
}

impl Running {
    pub(super) fn new(shared: Services) -> Self {
        Self {
            startup: Startup::new(shared.notifications),
            schedule_checker: Checker::start(&shared.tasks, shared.stop.clone()),
            shared,
            entries: BTreeMap::new(),
            notify_stop: CancellationToken::new(),
            housekeeping_stop: CancellationToken::new(),
        }
    }

    /// [`Self::start`]; when it fails, the gate opens for the triggers started so far.
    fn start_or_open(&mut self, trigger: &Trigger) -> Result<(), String> {
        self.start(Arc::new(trigger.clone()))
            .inspect_err(|_| self.startup.open())
    }

    /// Starts `trigger`'s workers; [`Self::publish`] adds it to the housekeeping. Its settings are
    /// held once, shared by its shards, workers and the admin API.
    pub(super) fn start(&mut self, trigger: Arc<Trigger>) -> Result<(), String> {
        let s = &self.shared;
        let sink = s.sinks.get(trigger.sink()).ok_or_else(|| {
            format!(
                "trigger {}: sink {} is not connected (no trigger used it at start): restart to add it",
                trigger.name(), trigger.sink()
            )
        })?;
        let queue = Queue::new(&trigger, s.conn.clone()).map_err(|e| format!("{e:#}"))?;
        let trigger = &trigger;
        let shards = Shard::shards(trigger, &queue, sink.clone(), &s.metrics, s.health.clone());
        let (stop, abort) = (s.stop.child_token(), s.abort.child_token());
        let workers = TaskTracker::new();
        // One worker per shard starts now; a shard's others when it first has a backlog.
        let leads = shards.len().min(trigger.workers());
        let mut deferred: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        let pass = self.startup.pass();
        for (w, served) in worker::assign(&shards, trigger.workers())
            .into_iter()
            .enumerate()
        {
            if w < leads {
                let (first, pass) = (First::Claim, pass.clone());
                let run = worker::run(served, w, first, pass, stop.clone(), abort.clone());
                s.workers.spawn(workers.track_future(run));
            } else {
                deferred.entry(w % shards.len()).or_default().push(w);
            }
        }
        for (shard, ids) in deferred {
            let (stop, abort, pass) = (stop.clone(), abort.clone(), pass.clone());
            let (all, own) = (s.workers.clone(), workers.clone());
            shards[shard].defer_workers(Box::new(move |shard: &Arc<Shard>| {
                for id in ids {
                    let (served, first) = (vec![shard.clone()], First::Wait);
                    let run =
                        worker::run(served, id, first, pass.clone(), stop.clone(), abort.clone());
                    all.spawn(own.track_future(run));
                }
            }));
        }
        if trigger.dead_letter().is_some() {
            for shard in &shards {
                let forward =
                    housekeeping::forward_dead_letters(shard.clone(), stop.clone(), abort.clone());
                s.workers.spawn(workers.track_future(forward));
            }
        }
        if trigger.ingress().is_some() {
            let ingress = crate::ingress::Ingress::new(
                trigger.clone(),
                queue.clone(),
                shards.clone(),
                s.metrics.clone(),
                s.health.clone(),
            );
            let run = ingress.run(sink.clone(), stop.clone());
            s.workers.spawn(workers.track_future(run));
        }
        // In the first shard's slot: the marks and the ticks live beside its queue. Schedules
        // can be added at run time: a trigger without any gets its task once one is.
        let schedule_changes = Changes::start(Launch {
            trigger: trigger.name().to_string(),
            store: shards[0].store().clone(),
            schedules: trigger.schedules().to_vec(),
            notifications: s.notifications,
            metrics: s.metrics.schedules.clone(),
            stop: stop.clone(),
            trackers: [s.workers.clone(), workers.clone()],
            checker: self.schedule_checker.clone(),
        });
        workers.close();
        self.entries.insert(
            trigger.name().to_string(),
            Entry {
                trigger: trigger.clone(),
                queue,
                shards,
                stop,
                abort,
                workers,
                schedule_changes,
            },
        );
        Ok(())
    }

    /// Stops claiming for trigger `name`; its batches in flight confirm and settle as at
    /// shutdown, within `timeout`, after which the rest is put back.
    fn stop(&mut self, name: &str, timeout: Duration) {
        let Some(e) = self.entries.remove(name) else {
            return;
        };
        e.stop.cancel();
        self.shared.health.set_paused(name, false);
        for schedule in e.trigger.schedules() {
            self.shared.metrics.schedules.remove(name, &schedule.name);
        }
        for schedule in e.schedule_changes.running() {
            self.shared.metrics.schedules.remove(name, &schedule);
        }
        self.shared.tasks.spawn(async move {
            if tokio::time::timeout(timeout, e.workers.wait())
                .await
                .is_err()
            {
                e.abort.cancel();
                e.workers.wait().await;
            }
            tracing::info!(trigger = %e.trigger.name(), "stopped: its batches in flight are settled");
        });
    }

    /// (Re)starts the housekeeping (reading sizes every `backlog_interval`) and the
    /// keyspace-notification listener for the triggers now running, and shows them to the
    /// admin API.
    pub(super) fn publish(&mut self, backlog_interval: Duration) {
        self.housekeeping_stop.cancel();
        self.housekeeping_stop = self.shared.stop.child_token();
        let triggers = self.all_shards();
        self.shared.tasks.spawn(housekeeping::maintain(
            triggers,
            backlog_interval,
            self.housekeeping_stop.clone(),
        ));
        let queues = self
            .entries
            .values()
            .map(|e| (e.queue.clone(), e.shards[0].clone()))
            .collect();
        self.shared.tasks.spawn(housekeeping::watch_unserved(
            queues,
            backlog_interval,
            self.housekeeping_stop.clone(),
        ));
        let admin: BTreeMap<String, AdminTrigger> = self
            .entries
            .values()
            .map(|e| {
                let t = AdminTrigger {
                    config: e.trigger.clone(),
                    queue: e.queue.clone(),
                };
                (e.trigger.name().to_string(), t)
            })
            .collect();
        self.shared.admin.replace(admin);
        if !self.shared.notifications {
            return;
        }
        self.notify_stop.cancel();
        self.notify_stop = self.shared.stop.child_token();
        let listeners = self
            .all_shards()
            .into_iter()
            .map(|shard| shard as Arc<dyn notify::Listener>)
            .chain(
                self.entries
                    .values()
                    .map(|e| e.schedule_changes.clone() as Arc<dyn notify::Listener>),
            )
            .collect();
        let s = &self.shared;
        s.tasks.spawn(notify::listen(
            s.conn.clone(),
            s.enable_keyspace_events,
            listeners,
            Arc::new(s.health.clone()),
            self.startup.listening(),
            self.notify_stop.clone(),
        ));
    }

    /// Applies a newly loaded configuration: triggers added start, removed ones stop, changed
    /// ones are replaced (the old workers finish their batches while the new ones claim:
    /// claims are atomic, so the two never share a message). Anything but triggers needs a
    /// restart: such a configuration changes nothing. Returns a summary or why not.
    pub(super) fn apply(&mut self, old: &Config, new: &Config) -> Result<String, String> {
        let sections = [
            ("redis", section(&old.redis) != section(&new.redis)),
            ("sinks", section(&old.sinks) != section(&new.sinks)),
            ("metrics", section(&old.metrics) != section(&new.metrics)),
            ("admin", section(&old.admin) != section(&new.admin)),
            ("log", section(&old.log) != section(&new.log)),
            ("shutdown", section(&old.shutdown) != section(&new.shutdown)),
        ];
        let changed: Vec<&str> = sections
            .iter()
            .filter(|(_, differs)| *differs)
            .map(|(name, _)| *name)
            .collect();
        if !changed.is_empty() {
            return Err(format!(
                "[{}] changed: only [[triggers]] reload; restart the bridge to apply the rest",
                changed.join("], [")
            ));
        }
        for trigger in &new.triggers {
            if !self.shared.sinks.contains_key(trigger.sink()) {
                return Err(format!(
                    "triggers.{}: sink {} is not connected (no trigger used it at start): restart to add it",
                    trigger.name(), trigger.sink()
                ));
            }
        }
        self.startup.renew();
        let wanted: BTreeMap<&str, &Trigger> = new.triggers.iter().map(|t| (t.name(), t)).collect();
        let (mut added, mut removed, mut replaced) = (Vec::new(), Vec::new(), Vec::new());
        let names: Vec<String> = self.entries.keys().cloned().collect();
        for name in names {
            match wanted.get(name.as_str()) {
                None => {
                    self.stop(&name, new.shutdown.timeout);
                    removed.push(name);
                }
                Some(trigger) if **trigger != *self.entries[&name].trigger => {
                    self.stop(&name, new.shutdown.timeout);
                    self.start_or_open(trigger)?;
                    replaced.push(name);
                }
                Some(_) => {}
            }
        }
        for trigger in &new.triggers {
            if !self.entries.contains_key(trigger.name()) {
                self.start_or_open(trigger)?;
                added.push(trigger.name().to_string());
            }
        }
        let destinations: Vec<&crate::config::Destination> = new
            .triggers
            .iter()
            .flat_map(|t| std::iter::once(t.destination()).chain(t.dead_letter()))
            .collect();
        for sink in self.shared.sinks.values() {
            sink.keep_endpoints(&destinations);
        }
        self.publish(new.metrics.backlog_interval);
        Ok(format!(
            "added {added:?}, removed {removed:?}, replaced {replaced:?}"
        ))
    }

    /// The triggers of `new` that are not running as they are configured there.
    pub(super) fn changed<'a>(&self, new: &'a Config) -> Vec<&'a Trigger> {
        new.triggers
            .iter()
            .filter(|trigger| {
                self.entries
                    .get(trigger.name())
                    .is_none_or(|e| **trigger != *e.trigger)
            })
            .collect()
    }

    /// The bridge's Redis connection.
    pub(super) fn conn(&self) -> &Conn {
        &self.shared.conn
    }

    /// Every shard of every running trigger.
    fn all_shards(&self) -> Vec<Arc<Shard>> {
        self.entries
            .values()
            .flat_map(|e| e.shards.iter().cloned())
            .collect()
    }

    /// Workers running now, over every trigger.
    pub(super) fn worker_count(&self) -> usize {
        self.entries.values().map(|e| e.trigger.workers()).sum()
    }
}

/// A configuration section as JSON, to tell whether a reload changed it.
fn section<T: serde::Serialize>(value: &T) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}
