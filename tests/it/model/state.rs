//! What a case holds: its connection and store, the model of the queue (scheduled copies,
//! leases, dead letters, open batches and claims), and the counts over all cases.

use super::*;

pub(super) struct Case {
    pub(super) conn: MultiplexedConnection,
    /// For stores with another claim byte budget.
    pub(super) manager: Conn,
    pub(super) store: Store,
    pub(super) keys: QueueKeys,
    pub(super) max_attempts: u32,
    /// Redis time when the case started: past and future scores are relative to it.
    pub(super) base: i64,
    pub(super) m: Model,
    pub(super) tally: &'static Tally,
}

/// The specification: what every step should do to the queue.
#[derive(Default, Debug)]
pub(super) struct Model {
    pub(super) source: HashMap<Vec<u8>, Scheduled>,
    pub(super) inflight: HashMap<Vec<u8>, Lease>,
    pub(super) dead: HashMap<Vec<u8>, DeadEntry>,
    /// Every schedule a producer started.
    pub(super) started: Vec<u64>,
    /// Schedules whose message the broker confirmed at least once.
    pub(super) delivered: HashSet<u64>,
    /// Schedules the producer cancelled (`ZREM`) before a claim.
    pub(super) cancelled: HashSet<u64>,
    pub(super) open: Vec<OpenBatch>,
    pub(super) next_batch: u64,
    /// Dead-letter claims the forwarder has not settled yet.
    pub(super) open_dead: Vec<OpenDeadClaim>,
    pub(super) next_dead_claim: u64,
    pub(super) next_schedule: u64,
    /// Hash mode only.
    pub(super) bodies: Option<Bodies>,
    /// Failed-attempt entries gone stale with a count, by member: (count, stamp). The hash
    /// keeps one until a script rewrites or deletes the member's entry or a sweep removes it,
    /// and it counts again for a copy whose score comes back to its stamp.
    pub(super) left: HashMap<Vec<u8>, (i64, f64)>,
    /// The control hash's `paused` field, as written (see [`pause_value`]).
    pub(super) paused: Option<String>,
    /// The rate limit's bucket: the control hash's `tokens` and `at` fields, as written (by a
    /// rate-limited claim that took something or repaired them, or a stray write).
    pub(super) tokens: Option<String>,
    pub(super) at: Option<String>,
}

/// Hash mode: the bodies hash, and what the producer wrote to it.
#[derive(Default, Debug)]
pub(super) struct Bodies {
    /// id -> body: what the bodies hash should hold.
    pub(super) held: HashMap<Vec<u8>, Vec<u8>>,
    /// id -> the body of its latest `HSET`, remembered after the hash drops it.
    pub(super) written: HashMap<Vec<u8>, Vec<u8>>,
    /// Ids the producer bug scheduled while they had no body, with no `HSET` since: the only
    /// ids that may be claimed as missing, or be queued without a body.
    pub(super) bare: HashSet<Vec<u8>>,
    pub(super) next_version: u64,
}

/// What a claim took and has not settled yet.
#[derive(Debug, Clone)]
pub(super) struct Open<T> {
    pub(super) id: u64,
    pub(super) deadline: i64,
    pub(super) items: Vec<T>,
    /// The schedules each item stood for when claimed: delivered if its ack (or forward) is
    /// confirmed.
    pub(super) schedules: Vec<Schedules>,
}

/// A claimed batch the "worker" has not settled yet.
pub(super) type OpenBatch = Open<Claimed>;

/// Dead letters claimed for forwarding that the "forwarder" has not settled yet.
pub(super) type OpenDeadClaim = Open<DeadItem>;

impl<T> Open<T> {
    /// A claim with this one's id and lease deadline and no items.
    pub(super) fn empty_like(&self) -> Self {
        Open {
            id: self.id,
            deadline: self.deadline,
            items: Vec::new(),
            schedules: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Scheduled {
    pub(super) score: f64,
    /// Failed attempts carried by this copy.
    pub(super) failures: i64,
    pub(super) schedules: Schedules,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Lease {
    pub(super) batch: u64,
    pub(super) deadline: i64,
    pub(super) short: bool,
    pub(super) failures: i64,
    pub(super) schedules: Schedules,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct DeadEntry {
    pub(super) at: f64,
    pub(super) reason: String,
    /// What the failing settle said besides the label (`detail` in the reason JSON).
    pub(super) detail: Option<String>,
    pub(super) attempts: i64,
    pub(super) schedules: Schedules,
    /// The forward holding it, if any: none when it was never claimed, or released.
    pub(super) forward: Option<Forward>,
}

/// Counts over all cases, to show the steps really exercised each path.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) steps: AtomicU64,
    pub(super) claimed: AtomicU64,
    pub(super) skipped_in_flight: AtomicU64,
    pub(super) acked: AtomicU64,
    pub(super) acks_not_owned: AtomicU64,
    /// Acks of part of a batch, its other members left leased.
    pub(super) early_acks: AtomicU64,
    pub(super) retried: AtomicU64,
    pub(super) dead: AtomicU64,
    pub(super) put_back: AtomicU64,
    pub(super) merged: AtomicU64,
    pub(super) not_owned: AtomicU64,
    pub(super) recovered: AtomicU64,
    pub(super) swept: AtomicU64,
    pub(super) requeued: AtomicU64,
    pub(super) wrong_type: AtomicU64,
    pub(super) paused_claims: AtomicU64,
    pub(super) rate_waits: AtomicU64,
    pub(super) moved: AtomicU64,
    pub(super) browsed: AtomicU64,
    pub(super) purged: AtomicU64,
    pub(super) cut_by_rate: AtomicU64,
    /// Claims whose clock (µs) fell inside a millisecond.
    pub(super) sub_ms_clocks: AtomicU64,
    /// Dead letters claimed for forwarding.
    pub(super) forward_claimed: AtomicU64,
    /// Of those, letters whose earlier lease had expired.
    pub(super) forward_reclaimed: AtomicU64,
    pub(super) forwards_confirmed: AtomicU64,
    pub(super) forwards_refused: AtomicU64,
    pub(super) forwards_kept: AtomicU64,
    pub(super) forwards_released: AtomicU64,
    /// Forward outcomes for letters the claim no longer held.
    pub(super) forwards_not_owned: AtomicU64,
    /// Forward claims that passed over a letter still leased, or refused.
    pub(super) forward_skipped_leased: AtomicU64,
    pub(super) forward_skipped_refused: AtomicU64,
    pub(super) forward_claims_paused: AtomicU64,
    /// Stray writes to the control hash, and rate-limited claims that repaired the bucket.
    pub(super) stray_writes: AtomicU64,
    pub(super) bucket_repairs: AtomicU64,
    /// Hash mode from here on.
    pub(super) bodies_claimed: AtomicU64,
    pub(super) missing_claimed: AtomicU64,
    pub(super) cut_by_budget: AtomicU64,
    pub(super) ack_dropped_body: AtomicU64,
    pub(super) ack_kept_body: AtomicU64,
    pub(super) cancel_dropped_body: AtomicU64,
    pub(super) cancel_kept_body: AtomicU64,
    pub(super) forward_dropped_body: AtomicU64,
    pub(super) forward_kept_body: AtomicU64,
    pub(super) forward_missing_body: AtomicU64,
    /// Messages an ingress stored, found already held, dead-lettered.
    pub(super) ingest_stored: AtomicU64,
    pub(super) ingest_duplicates: AtomicU64,
    pub(super) ingest_dead: AtomicU64,
}
