//! How bench messages are stored: inline members or ids with bodies in the bodies hash, raw or wrapped in an envelope.

use delay_bridge::keys::QueueKeys;

use super::tally::payload;

/// Where the body of a bench message lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PayloadArg {
    /// The member is the payload (`payload = "inline"`).
    Inline,
    /// The member is an id, the payload is in `K:bodies` (`payload = "hash"`).
    Hash,
}

/// What the stored payload is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FormatArg {
    /// The payload is the body (`format = "raw"`).
    Raw,
    /// The payload is a JSON envelope around the body (`format = "envelope"`).
    Envelope,
}

/// The bench's message shape: its trigger lines and how one message is written.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub payload: PayloadArg,
    pub format: FormatArg,
    pub payload_bytes: usize,
}

impl Shape {
    /// The trigger lines that read messages of this shape.
    pub fn trigger_toml(&self) -> String {
        let mut out = String::new();
        if self.payload == PayloadArg::Hash {
            out.push_str("payload = \"hash\"\n");
        }
        if self.format == FormatArg::Envelope {
            out.push_str("format = \"envelope\"\n");
        }
        out
    }

    /// `inline/raw`, `hash/envelope`, ...
    pub fn label(&self) -> String {
        let p = match self.payload {
            PayloadArg::Inline => "inline",
            PayloadArg::Hash => "hash",
        };
        let f = match self.format {
            FormatArg::Raw => "raw",
            FormatArg::Envelope => "envelope",
        };
        format!("{p}/{f}")
    }

    /// What is stored for message `seq`: the payload the consumer gets, enveloped if asked.
    fn stored(&self, seq: u64) -> Vec<u8> {
        let body = payload(seq, self.payload_bytes);
        match self.format {
            FormatArg::Raw => body,
            FormatArg::Envelope => serde_json::json!({
                "body": String::from_utf8_lossy(&body),
                "headers": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
                "content_type": "text/plain",
            })
            .to_string()
            .into_bytes(),
        }
    }

    /// Adds to `pipe` the writes that schedule message `seq` at `due` on the sorted set
    /// `zset`, whose queue is `queue` (its bodies hash, in hash mode).
    pub fn schedule(
        &self,
        pipe: &mut redis::Pipeline,
        queue: &QueueKeys,
        zset: &str,
        seq: u64,
        due: i64,
    ) {
        self.schedule_many(pipe, queue, zset, seq..seq + 1, |_| due);
    }

    /// Adds to `pipe` the writes that schedule messages `seqs` at `due(seq)` in bulk: one
    /// `ZADD` (after one `HSET` of their bodies, so that no id is claimable before its body
    /// is there) for all of them.
    pub fn schedule_many(
        &self,
        pipe: &mut redis::Pipeline,
        queue: &QueueKeys,
        zset: &str,
        seqs: std::ops::Range<u64>,
        due: impl Fn(u64) -> i64,
    ) {
        let id = |seq: u64| format!("id-{seq}");
        if self.payload == PayloadArg::Hash {
            let hset = pipe.cmd("HSET").arg(&queue.bodies);
            for seq in seqs.clone() {
                hset.arg(id(seq)).arg(self.stored(seq));
            }
            hset.ignore();
        }
        let zadd = pipe.cmd("ZADD").arg(zset);
        for seq in seqs {
            match self.payload {
                PayloadArg::Inline => zadd.arg(due(seq)).arg(self.stored(seq)),
                PayloadArg::Hash => zadd.arg(due(seq)).arg(id(seq)),
            };
        }
        zadd.ignore();
    }
}
