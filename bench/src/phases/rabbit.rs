//! RabbitMQ's ceilings, each measured by a publisher that is not the bridge: amqprs and
//! amqplib publishing the bridge's messages, and beside them the bridge's sink code alone
//! and amqprs forwarding through the bridge's claim and settle scripts.

use super::*;
use crate::amqplib_ceiling::{self, NodePublisher};
use crate::amqprs_ceiling::{RawPublisher, Unconfirmed};
use crate::report::{AmqpCeilings, ClientRate};
use crate::shape::{FormatArg, Shape};
use delay_bridge::parts::redis::store::Store;

/// A publisher a ceiling is measured with.
enum Client {
    Amqprs(RawPublisher),
    Amqplib(Box<NodePublisher>),
    SinkAlone(Ceiling),
    WithScripts(Box<WithScripts>),
}

/// amqprs forwarding what the claim script hands out, settling with the settle script: the
/// Redis work of the bridge around another client's publishing.
struct WithScripts {
    publisher: RawPublisher,
    store: Store,
    key: String,
    conn: redis::aio::MultiplexedConnection,
    /// The window's messages as stored: raw, inline or in the bodies hash as the bench's.
    shape: Shape,
    batch: usize,
}

impl WithScripts {
    /// Schedules `w`'s messages as already due (not timed), then forwards them; returns when
    /// forwarding started.
    async fn publish(&mut self, w: &Window, timeout: Duration) -> anyhow::Result<Instant> {
        let due = now_ms() - 1000;
        let key = &self.key;
        redis_ops::load(
            &mut self.conn,
            &self.shape,
            key,
            key,
            w.base,
            w.count,
            |_| due,
        )
        .await?;
        let started = Instant::now();
        let n = self
            .publisher
            .forward_claimed(&self.store, &w.key, self.batch, timeout)
            .await?;
        if n != w.count {
            bail!("forwarded {n} of {} messages", w.count);
        }
        Ok(started)
    }
}

impl Client {
    /// Publishes `w` and waits until the broker confirmed all of it; returns when
    /// publishing started.
    async fn publish(&mut self, w: &Window, timeout: Duration) -> anyhow::Result<Instant> {
        match self {
            Client::Amqprs(p) => p.publish(w, timeout).await,
            Client::Amqplib(p) => p.publish(w, timeout).await,
            Client::SinkAlone(c) => c.publish(w).await,
            Client::WithScripts(p) => p.publish(w, timeout).await,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Client::Amqprs(_) => "amqprs",
            Client::Amqplib(_) => "amqplib",
            Client::SinkAlone(_) => "the bridge's sink alone",
            Client::WithScripts(_) => "amqprs with the claim and settle scripts",
        }
    }

    /// CPU seconds of the process publishing (the bench's own for the Rust clients).
    fn cpu_seconds(&self) -> anyhow::Result<f64> {
        match self {
            Client::Amqplib(p) => p.cpu_seconds(),
            Client::Amqprs(_) | Client::SinkAlone(_) | Client::WithScripts(_) => {
                super::super::process::process_cpu_seconds(std::process::id())
            }
        }
    }

    async fn close(self) {
        match self {
            Client::Amqprs(p) => p.close().await,
            Client::Amqplib(p) => p.close().await,
            Client::SinkAlone(c) => c.close().await,
            Client::WithScripts(p) => p.publisher.close().await,
        }
    }
}

impl Bench {
    /// The raw publishers' window.
    pub(super) fn unconfirmed(&self) -> Unconfirmed {
        Unconfirmed {
            channels: self.args.ceiling_channels.into(),
            window: self.args.ceiling_window as usize,
        }
    }

    /// RabbitMQ's ceilings into the consumed queue, or with `backlog` into the queue nobody
    /// consumes: amqprs, then amqplib (noted and left out when node or amqplib is missing),
    /// then the bridge's sink alone. A client that fails is an error of the phase; the others
    /// still run.
    pub(super) async fn amqp_ceilings(
        &self,
        backlog: bool,
        notes: &mut Vec<String>,
    ) -> (AmqpCeilings, Vec<anyhow::Error>) {
        let mut out = AmqpCeilings::default();
        let mut errors = Vec::new();
        let crate::Broker::Amqp(b) = &self.broker else {
            return (out, errors);
        };
        let (url, exchange, key) = b.target(backlog);
        let u = self.unconfirmed();
        let amqprs = RawPublisher::connect(url, exchange, &key, u).await;
        match self.ceiling_of(amqprs.map(Client::Amqprs), backlog).await {
            Ok(r) => out.amqprs = Some(r),
            Err(e) => errors.push(e.context("amqprs ceiling")),
        }
        let node_modules = self
            .args
            .node_modules
            .clone()
            .unwrap_or_else(amqplib_ceiling::default_node_modules);
        if let Some(why) = amqplib_ceiling::missing(&node_modules) {
            let note = format!("amqplib ceiling left out: {why}");
            eprintln!("bench: {note}");
            if !notes.contains(&note) {
                notes.push(note);
            }
        } else {
            let target = (url, exchange, key.as_str());
            let bytes = self.args.payload_bytes;
            let node = NodePublisher::start(&self.dir, &node_modules, target, u, bytes).await;
            match self
                .ceiling_of(node.map(|n| Client::Amqplib(Box::new(n))), backlog)
                .await
            {
                Ok(r) => out.amqplib = Some(r),
                Err(e) => errors.push(e.context("amqplib ceiling")),
            }
        }
        let destination = if backlog {
            self.backlog_destination.as_ref()
        } else {
            Some(&self.destination)
        };
        if let Some(destination) = destination {
            let (workers, timeout) = (self.trigger.workers(), self.trigger.publish_timeout());
            let sink = Ceiling::connect(&self.sink, destination, workers, timeout).await;
            match self.ceiling_of(sink.map(Client::SinkAlone), backlog).await {
                Ok(r) => out.sink_alone = Some(r),
                Err(e) => errors.push(e.context("the sink alone")),
            }
        }
        let scripted = self.with_scripts(url, exchange, &key, u).await;
        match self.ceiling_of(scripted, backlog).await {
            Ok(r) => out.with_scripts = Some(r),
            Err(e) => errors.push(e.context("amqprs with the scripts")),
        }
        (out, errors)
    }

    /// amqprs connected as for its own ceiling, with a queue of its own for the scripts.
    async fn with_scripts(
        &self,
        url: &str,
        exchange: &str,
        routing_key: &str,
        u: Unconfirmed,
    ) -> anyhow::Result<Client> {
        let key = self.new_key("with-scripts");
        let conn = delay_bridge::parts::redis::conn::Conn::open(&self.args.redis_url).await?;
        let shape = Shape {
            format: FormatArg::Raw,
            ..self.args.shape()
        };
        let store = redis_ops::ceiling_store(conn, &key, &shape)?;
        let publisher = RawPublisher::connect(url, exchange, routing_key, u).await?;
        Ok(Client::WithScripts(Box::new(WithScripts {
            publisher,
            store,
            key,
            conn: self.conn.clone(),
            shape,
            batch: self.trigger.batch(),
        })))
    }

    /// One client's rate: into the consumed queue after an untimed warm-up, timed until the
    /// consumer has every message; into the queue nobody consumes, timed until the broker
    /// confirmed every message, the queue purged after. Closes the client.
    async fn ceiling_of(
        &self,
        client: anyhow::Result<Client>,
        backlog: bool,
    ) -> anyhow::Result<ClientRate> {
        let mut client = client?;
        let into = if backlog {
            "into a queue nobody consumes"
        } else {
            "consumed"
        };
        let n = self.args.messages;
        eprintln!(
            "bench: RabbitMQ ceiling, {}, {n} messages {into}",
            client.name()
        );
        let timed = self.timed(&mut client, backlog).await;
        client.close().await;
        let purged = if backlog {
            Some(self.purge_backlog().await)
        } else {
            None
        };
        let rate = timed?;
        if let Some(purged) = purged {
            check_backlog(purged?, self.args.messages)?;
        }
        Ok(rate)
    }

    async fn timed(&self, client: &mut Client, backlog: bool) -> anyhow::Result<ClientRate> {
        let n = self.args.messages;
        let what = if backlog { "backlog" } else { "ceiling" };
        let window = |base, count| Window {
            key: format!("delay-bridge-bench:{what}"),
            base,
            count,
            payload_bytes: self.args.payload_bytes,
            due_ms: now_ms(),
            batch: self.trigger.batch(),
        };
        if !backlog {
            // The consumer's first fetch and the broker's first writes to a new queue are
            // not the broker's rate.
            let warm = n.min(1000);
            let base = self.next_base();
            self.tally.reset(base, warm);
            client.publish(&window(base, warm), budget(warm)).await?;
            self.wait_received(warm, budget(warm)).await?;
        }
        let base = self.next_base();
        if !backlog {
            self.tally.reset(base, n);
        }
        let cpu = client.cpu_seconds()?;
        let start = client.publish(&window(base, n), budget(n)).await?;
        if !backlog {
            self.wait_received(n, budget(n)).await?;
        }
        let secs = start.elapsed().as_secs_f64();
        let cpu = client.cpu_seconds()? - cpu;
        Ok(ClientRate {
            rate: Rate::new(n, secs),
            // Into the consumed queue the bench's own CPU holds its consumer's too.
            cpu_seconds_per_100k: backlog.then(|| cpu * 100_000.0 / n as f64),
        })
    }
}
