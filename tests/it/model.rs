//! Model-based property test: random producer and worker steps against the real scripts and an in-memory model.
//!
//! Every case runs in one of two payload modes. Inline: the member is the message. Hash: the
//! member is an id, its body lives in the bodies hash, and the producer follows its contract
//! (`HSET` + `ZADD` in one transaction, `ZADD XX` to reschedule, the cancel script it is given
//! in `src/scripts/cancel.lua`), with a rare producer bug thrown in (a `ZADD` with no body).

use crate::common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use delay_bridge::keys::QueueKeys;
use delay_bridge::redis_conn::Conn;
use delay_bridge::store::{
    Body, Claimed, DeadItem, DeadOutcome, DeadSettled, FailOutcome, Failure, Ingest, Purge,
    Settlement, Store,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redis::aio::MultiplexedConnection;

/// Members the steps pick from (ids in hash mode): few, so producer writes and claims collide
/// often. Includes the empty member and bytes that are not UTF-8.
const POOL: [&[u8]; 7] = [b"a", b"b", b"", b"\xff\x00\xfe", b"{\"id\":7}", b"c", b"a "];

/// Lease of a "short" claim: expired as soon as the Redis clock moves past the claim time.
const SHORT_LEASE: Duration = Duration::ZERO;
/// Lease of a "long" claim: never expires while a case runs.
const LONG_LEASE: Duration = Duration::from_secs(600);
/// Lease of a "short" forward of dead letters: expired once the Redis clock is a millisecond
/// past the claim. Not zero: the dead-letter claim takes a letter whose lease is due (`<=
/// now`) and gives it `now + lease` as is, so with a zero lease a letter claimed again in the
/// same millisecond would get the very deadline, the ownership token, of the claim before.
const SHORT_FORWARD_LEASE: Duration = Duration::from_millis(1);
/// The most dead letters one forward claim takes, whatever the limit asked.
const FORWARD_CAP: usize = 1000;
const RETRY_LATER: Duration = Duration::from_secs(3600);
/// Hash mode: the claim byte budget of the case's store, more than any batch's bodies.
const ROOMY: usize = 1 << 20;
/// The rate limit of [`Op::RateClaim`], per second: a case (tens of ms) refills a token or so.
const RATE: f64 = 20.0;
/// The token bucket's size for [`Op::RateClaim`].
const BURST: u32 = 2;

#[derive(Debug, Clone, Copy)]
enum When {
    /// Overdue by `1 + k` seconds.
    Past(u8),
    /// Due in an hour plus `k` seconds.
    Future(u8),
    NegInf,
    PosInf,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Disp {
    Ack,
    /// Retriable failure, due again at once.
    Retry,
    /// Retriable failure, due again in an hour.
    RetryLater,
    /// Permanent failure: dead-lettered at once.
    Dead,
    /// Never attempted: back with its original score.
    PutBack,
    /// Hash mode, never generated: what the worker does with a claimed id that has no body
    /// (dead-lettered as `missing_body`), whatever disposition was drawn, bar a put-back.
    Missing,
}

/// What the broker made of a forwarded dead letter.
#[derive(Debug, Clone, Copy, PartialEq)]
enum FDisp {
    /// Confirmed at the dead-letter destination: the dead letter leaves Redis.
    Confirmed,
    /// Confirmed, but kept (the remedy lives in Redis: `missing_body`): a dead letter
    /// never claimed again, as a refused one.
    Kept,
    /// Refused for good: kept as a dead letter, never claimed again.
    Refused,
    /// Never forwarded (a shutdown): free for the next claim at once.
    Released,
}

/// A key of the queue that a step gives the wrong type for one script call.
#[derive(Debug, Clone, Copy)]
enum Derived {
    Source,
    Inflight,
    Attempts,
    Dead,
    DeadReasons,
    /// Hash mode only.
    Bodies,
    Control,
    DeadInflight,
}

/// A script run while a key has the wrong type.
#[derive(Debug, Clone, Copy)]
enum Script {
    Claim,
    Settle,
    Recover,
    Requeue,
    Move,
    Purge,
    DeadClaim,
    DeadSettle,
    /// Hash mode only: an ingress's store.
    Ingest,
}

/// Hash mode: how an ingress stores a message (`ingest.lua`).
#[derive(Debug, Clone, Copy)]
enum HowIngest {
    /// Due in this many ms from now on the Redis clock (negative: now).
    In(i64),
    /// Due at the score `when` stands for (finite ones only).
    At(When),
    /// Refused: a dead letter with the reason [`INGEST_REASONS`]`[i]`.
    Dead(usize),
}

/// The reasons an ingress dead-letters with, and their details.
const INGEST_REASONS: [(&str, &str); 2] = [
    ("bad_delay", "x-delay: `soon` is not a number"),
    ("too_large", ""),
];

/// Hash mode: the body a producer writes.
#[derive(Debug, Clone, Copy)]
enum Payload {
    /// `id#version` and `pad` more bytes: every write is told apart from the others.
    Versioned(u8),
    Empty,
}

#[derive(Debug, Clone)]
enum Op {
    /// `ZADD`: a new message, or a reschedule when the member is already there. In hash mode
    /// this is the producer bug: an id scheduled with no `HSET` of its body.
    Schedule {
        member: usize,
        when: When,
    },
    /// `ZREM` on the source set; the cancel script in hash mode.
    Cancel {
        member: usize,
    },
    Claim {
        batch: usize,
        short: bool,
    },
    /// Hash mode: `MULTI; HSET bodies id body; ZADD source due id; EXEC`.
    Produce {
        member: usize,
        when: When,
        body: Payload,
    },
    /// Hash mode: `ZADD XX`, a new due time for an id only if it is scheduled.
    Reschedule {
        member: usize,
        when: When,
    },
    /// A claim by a store with the rate limit [`RATE`] (a token bucket of [`BURST`]).
    RateClaim {
        batch: usize,
        short: bool,
    },
    /// Hash mode: a claim whose bodies may total `budget` bytes (at least one member).
    ClaimBytes {
        batch: usize,
        short: bool,
        budget: usize,
    },
    /// Settles one open batch (picked by index) with one disposition per member (cycled).
    Settle {
        which: usize,
        disp: Vec<Disp>,
    },
    /// `delay-bridge pause` (true) or `resume` (false).
    Pause {
        on: bool,
    },
    /// A stray write to the control hash: field [`CONTROL`]`[field]` set to its stray value
    /// `value` (modulo their number), or deleted when `value` is that number.
    Stray {
        field: usize,
        value: usize,
    },
    /// `delay-bridge reschedule` (or `promote`, with `earlier`): a new due time for a
    /// scheduled member, its attempt count kept.
    Move {
        member: usize,
        when: When,
        earlier: bool,
    },
    /// `delay-bridge browse`: every page of `limit` entries, from the start.
    Browse {
        limit: usize,
    },
    /// `delay-bridge purge`: every dead letter, or the scheduled members due by `to`.
    Purge {
        dead: bool,
        to: When,
    },
    /// The console's purge by reason: the dead letters of one of the reasons present
    /// (`which` picks it), or only their count (`dry_run`).
    PurgeReason {
        which: usize,
        dry_run: bool,
    },
    /// Waits until every short lease, in flight or of a forwarded dead letter, is past its
    /// deadline on the Redis clock.
    Expire,
    Recover {
        limit: usize,
    },
    /// Sweeps the whole attempts hash of stale entries.
    Sweep,
    /// Requeues the named dead letters, or the oldest `limit` when none is named.
    Requeue {
        members: Vec<usize>,
        limit: usize,
    },
    /// Claims up to `limit` dead letters to forward, leased for [`SHORT_FORWARD_LEASE`] or
    /// [`LONG_LEASE`].
    ForwardClaim {
        limit: usize,
        short: bool,
    },
    /// Settles one open dead-letter claim (picked by index) with one outcome per letter
    /// (cycled).
    ForwardSettle {
        which: usize,
        disp: Vec<FDisp>,
    },
    /// Hash mode: an ingress stores a message taken from a broker, once per id.
    Ingest {
        member: usize,
        how: HowIngest,
        body: Payload,
    },
    /// Runs a script while `key` holds a string: it must fail and change nothing.
    WrongType {
        key: Derived,
        script: Script,
    },
}

fn when() -> impl Strategy<Value = When> {
    prop_oneof![
        4 => (0u8..4).prop_map(When::Past),
        2 => (0u8..4).prop_map(When::Future),
        1 => Just(When::NegInf),
        1 => Just(When::PosInf),
    ]
}

fn disp() -> impl Strategy<Value = Disp> {
    prop_oneof![
        4 => Just(Disp::Ack),
        2 => Just(Disp::Retry),
        1 => Just(Disp::RetryLater),
        1 => Just(Disp::Dead),
        2 => Just(Disp::PutBack),
    ]
}

/// Dispositions of a forwarding case's settles: most fail for good, making dead letters.
fn failing_disp() -> impl Strategy<Value = Disp> {
    prop_oneof![
        2 => Just(Disp::Ack),
        1 => Just(Disp::Retry),
        4 => Just(Disp::Dead),
        1 => Just(Disp::PutBack),
    ]
}

/// Outcomes of forwarded dead letters.
fn fdisp() -> impl Strategy<Value = FDisp> {
    prop_oneof![
        3 => Just(FDisp::Confirmed),
        1 => Just(FDisp::Kept),
        2 => Just(FDisp::Refused),
        2 => Just(FDisp::Released),
    ]
}

/// Dead-letter claim limits: mostly fewer than the pool holds, now and then none, or more
/// than the script's cap.
fn forward_limit() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => Just(0usize),
        8 => 1usize..4,
        1 => Just(FORWARD_CAP + 500),
    ]
}

fn derived() -> impl Strategy<Value = Derived> {
    prop_oneof![
        Just(Derived::Source),
        Just(Derived::Inflight),
        Just(Derived::Attempts),
        Just(Derived::Dead),
        Just(Derived::DeadReasons),
        Just(Derived::Control),
        Just(Derived::DeadInflight),
    ]
}

fn script() -> impl Strategy<Value = Script> {
    prop_oneof![
        Just(Script::Claim),
        Just(Script::Settle),
        Just(Script::Recover),
        Just(Script::Requeue),
        Just(Script::Move),
        Just(Script::Purge),
        Just(Script::DeadClaim),
        Just(Script::DeadSettle),
    ]
}

fn hash_derived() -> impl Strategy<Value = Derived> {
    prop_oneof![derived(), Just(Derived::Bodies)]
}

/// Hash mode: the scripts a wrong-typed key is tried with, the ingress's store included.
fn hash_script() -> impl Strategy<Value = Script> {
    prop_oneof![8 => script(), 1 => Just(Script::Ingest)]
}

fn how_ingest() -> impl Strategy<Value = HowIngest> {
    let finite = prop_oneof![
        (0u8..4).prop_map(When::Past),
        (0u8..4).prop_map(When::Future)
    ];
    prop_oneof![
        2 => prop_oneof![Just(-5_000i64), Just(0), Just(3_600_000)].prop_map(HowIngest::In),
        2 => finite.prop_map(HowIngest::At),
        1 => (0..INGEST_REASONS.len()).prop_map(HowIngest::Dead),
    ]
}

fn payload() -> impl Strategy<Value = Payload> {
    prop_oneof![
        6 => (0u8..12).prop_map(Payload::Versioned),
        1 => Just(Payload::Empty),
    ]
}

/// Budgets around the size of one body, so that claims are often cut short.
fn budget() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => Just(1usize),
        3 => 4usize..24,
        1 => Just(ROOMY),
    ]
}

/// The steps of a hash-mode case: those of an inline one, the producer's per its contract.
fn hash_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..POOL.len(), when(), payload())
            .prop_map(|(member, when, body)| Op::Produce { member, when, body }),
        1 => (0..POOL.len(), when()).prop_map(|(member, when)| Op::Reschedule { member, when }),
        1 => (0..POOL.len(), when()).prop_map(|(member, when)| Op::Schedule { member, when }),
        1 => (0..POOL.len()).prop_map(|member| Op::Cancel { member }),
        3 => (0..POOL.len(), how_ingest(), payload())
            .prop_map(|(member, how, body)| Op::Ingest { member, how, body }),
        4 => (1usize..6, any::<bool>(), budget())
            .prop_map(|(batch, short, budget)| Op::ClaimBytes { batch, short, budget }),
        28 => worker_and_operator_op(),
        1 => (hash_derived(), hash_script()).prop_map(|(key, script)| Op::WrongType { key, script }),
    ]
}

/// The control hash's fields, and values a stray write may leave in each: canonical ones,
/// out of range, NaN, infinities, words.
const CONTROL: [(&str, &[&str]); 3] = [
    ("paused", &["1", "0", "", "false", "no", "yes", "TRUE", "2"]),
    (
        "tokens",
        &[
            "-inf", "inf", "nan", "-1e12", "-1", "0", "0.5", "1.5", "3", "1e12", "1e400", "many",
        ],
    ),
    (
        "at",
        &["nan", "-inf", "inf", "9e18", "0", "1e12", "-5", "soon"],
    ),
];

/// `pause_value` in the prelude: whether a `paused` value pauses, and whether the claim
/// rewrites it (it is not canonical).
fn pause_value(v: &Option<String>) -> (bool, bool) {
    match v.as_deref() {
        None => (false, false),
        Some(v) if matches!(v.to_ascii_lowercase().as_str(), "0" | "false" | "no" | "") => {
            (false, true)
        }
        Some(v) => (true, v != "1"),
    }
}

/// A control value as the scripts read it: a finite number, or None.
fn finite(v: &Option<String>) -> Option<f64> {
    v.as_deref()?.parse::<f64>().ok().filter(|x| x.is_finite())
}

/// The steps both modes share, weighted among themselves (28 in all): settling, lease
/// expiry and recovery, rate-limited claims, forwarding dead letters, and the operator's
/// commands.
fn worker_and_operator_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<usize>(), vec(disp(), 1..4)).prop_map(|(which, disp)| Op::Settle { which, disp }),
        1 => Just(Op::Expire),
        4 => (1usize..5, any::<bool>()).prop_map(|(batch, short)| Op::RateClaim { batch, short }),
        1 => (0..POOL.len(), when(), any::<bool>())
            .prop_map(|(member, when, earlier)| Op::Move { member, when, earlier }),
        1 => (any::<bool>(), when()).prop_map(|(dead, to)| Op::Purge { dead, to }),
        1 => (any::<usize>(), any::<bool>())
            .prop_map(|(which, dry_run)| Op::PurgeReason { which, dry_run }),
        1 => (1usize..4).prop_map(|limit| Op::Browse { limit }),
        1 => Just(Op::Pause { on: true }),
        4 => Just(Op::Pause { on: false }),
        2 => (0usize..3, 0usize..13).prop_map(|(field, value)| Op::Stray { field, value }),
        2 => (0usize..4).prop_map(|limit| Op::Recover { limit }),
        1 => Just(Op::Sweep),
        2 => (vec(0..POOL.len(), 0..3), 0usize..3)
            .prop_map(|(members, limit)| Op::Requeue { members, limit }),
        2 => (forward_limit(), any::<bool>())
            .prop_map(|(limit, short)| Op::ForwardClaim { limit, short }),
        2 => (any::<usize>(), vec(fdisp(), 1..4))
            .prop_map(|(which, disp)| Op::ForwardSettle { which, disp }),
    ]
}

/// The steps of a case in the payload mode: [`hash_op`], or [`op`] inline.
fn mode_op(hash: bool) -> BoxedStrategy<Op> {
    if hash {
        hash_op().boxed()
    } else {
        op().boxed()
    }
}

/// A producer's step in the payload mode: its transaction in hash mode, a `ZADD` inline.
fn produce_op(hash: bool) -> BoxedStrategy<Op> {
    if hash {
        (0..POOL.len(), when(), payload())
            .prop_map(|(member, when, body)| Op::Produce { member, when, body })
            .boxed()
    } else {
        (0..POOL.len(), when())
            .prop_map(|(member, when)| Op::Schedule { member, when })
            .boxed()
    }
}

/// The steps of a forwarding case: those of the mode, with more producers, claims, settles
/// that mostly dead-letter, and forwards. A forward's paths need a dead letter first (a
/// message scheduled, claimed, then failed for good) and then a chain of their own (claim,
/// settle, claim again; an expiry, requeue, purge or new dead-lettering in between), which
/// the mode's mix alone makes only a few times in a round.
fn forwarding_op(hash: bool) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => mode_op(hash),
        3 => produce_op(hash),
        3 => (1usize..5, any::<bool>()).prop_map(|(batch, short)| Op::Claim { batch, short }),
        3 => (any::<usize>(), vec(failing_disp(), 1..4))
            .prop_map(|(which, disp)| Op::Settle { which, disp }),
        4 => (forward_limit(), any::<bool>())
            .prop_map(|(limit, short)| Op::ForwardClaim { limit, short }),
        3 => (any::<usize>(), vec(fdisp(), 1..4))
            .prop_map(|(which, disp)| Op::ForwardSettle { which, disp }),
    ]
}

/// A case's steps: three cases in four draw from the mode's mix, one from the forwarding
/// mix around it.
fn case_ops(hash: bool) -> impl Strategy<Value = Vec<Op>> {
    prop_oneof![
        3 => vec(mode_op(hash), 1..48),
        1 => vec(forwarding_op(hash), 1..48),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..POOL.len(), when()).prop_map(|(member, when)| Op::Schedule { member, when }),
        1 => (0..POOL.len()).prop_map(|member| Op::Cancel { member }),
        4 => (1usize..5, any::<bool>()).prop_map(|(batch, short)| Op::Claim { batch, short }),
        28 => worker_and_operator_op(),
        1 => (derived(), script()).prop_map(|(key, script)| Op::WrongType { key, script }),
    ]
}

/// Schedules: each producer `ZADD` of a member that is not scheduled starts one; a copy of
/// the member (scheduled, in flight or dead) carries the schedules it stands for.
type Schedules = Vec<u64>;

/// A claimed batch the "worker" has not settled yet.
#[derive(Debug, Clone)]
struct OpenBatch {
    id: u64,
    deadline: i64,
    items: Vec<Claimed>,
    /// The schedules each item stood for when claimed: delivered if its ack is confirmed.
    schedules: Vec<Schedules>,
}

#[derive(Debug, Clone, PartialEq)]
struct Scheduled {
    score: f64,
    /// Failed attempts carried by this copy.
    failures: i64,
    schedules: Schedules,
}

#[derive(Debug, Clone, PartialEq)]
struct Lease {
    batch: u64,
    deadline: i64,
    short: bool,
    failures: i64,
    schedules: Schedules,
}

/// Dead letters claimed for forwarding that the "forwarder" has not settled yet.
#[derive(Debug, Clone)]
struct OpenDeadClaim {
    id: u64,
    deadline: i64,
    items: Vec<DeadItem>,
    /// The schedules each letter stood for when claimed: delivered if its forward is confirmed.
    schedules: Vec<Schedules>,
}

/// Where a dead letter stands in being forwarded to the dead-letter destination.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Forward {
    /// Leased by dead-letter claim `claim` until `deadline` (taken again once that is due).
    Leased {
        claim: u64,
        deadline: i64,
        short: bool,
    },
    /// The broker refused it: no lease, its dead-letter score `+inf`, never claimed again.
    Refused,
}

impl Forward {
    /// Its score in the dead_inflight set, if it is there.
    fn lease(self) -> Option<f64> {
        match self {
            Forward::Leased { deadline, .. } => Some(deadline as f64),
            Forward::Refused => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
struct DeadEntry {
    at: f64,
    reason: String,
    /// What the failing settle said besides the label (`detail` in the reason JSON).
    detail: Option<String>,
    attempts: i64,
    schedules: Schedules,
    /// The forward holding it, if any: none when it was never claimed, or released.
    forward: Option<Forward>,
}

/// The fields of a dead letter's reason JSON: when, why, the detail, and the attempts.
type Reason = (f64, String, Option<String>, i64);

impl DeadEntry {
    /// Its score in the dead-letter set: when it was dead-lettered, `+inf` once refused.
    fn score(&self) -> f64 {
        match self.forward {
            Some(Forward::Refused) => f64::INFINITY,
            _ => self.at,
        }
    }

    /// The reason JSON's fields this entry should have.
    fn reason(&self) -> Reason {
        (
            self.at,
            self.reason.clone(),
            self.detail.clone(),
            self.attempts,
        )
    }
}

/// The fields of a reason JSON, as the dead_reasons hash holds it.
fn parse_reason(json: &str) -> Reason {
    let v: serde_json::Value = serde_json::from_str(json).expect("reason is JSON");
    (
        v["at"].as_f64().unwrap_or(f64::NAN),
        v["reason"].as_str().unwrap_or("?").to_string(),
        v["detail"].as_str().map(str::to_string),
        v["attempts"].as_i64().unwrap_or(-1),
    )
}

/// The detail a failing settle gives with `reason` (as a sink would: the broker's or the
/// parser's words for some failures, nothing for others), so the model sees both kinds.
fn detail_of(reason: &str) -> Option<&'static str> {
    match reason {
        "too_large" => Some("4 MiB over max_message_bytes \"quoted\"\n"),
        "returned" => Some("NO_ROUTE"),
        _ => None,
    }
}

/// The specification: what every step should do to the queue.
#[derive(Default, Debug)]
struct Model {
    source: HashMap<Vec<u8>, Scheduled>,
    inflight: HashMap<Vec<u8>, Lease>,
    dead: HashMap<Vec<u8>, DeadEntry>,
    /// Every schedule a producer started.
    started: Vec<u64>,
    /// Schedules whose message the broker confirmed at least once.
    delivered: HashSet<u64>,
    /// Schedules the producer cancelled (`ZREM`) before a claim.
    cancelled: HashSet<u64>,
    open: Vec<OpenBatch>,
    next_batch: u64,
    /// Dead-letter claims the forwarder has not settled yet.
    open_dead: Vec<OpenDeadClaim>,
    next_dead_claim: u64,
    next_schedule: u64,
    /// Hash mode only.
    bodies: Option<Bodies>,
    /// Failed-attempt entries gone stale with a count, by member: (count, stamp). The hash
    /// keeps one until a script rewrites or deletes the member's entry or a sweep removes it,
    /// and it counts again for a copy whose score comes back to its stamp.
    left: HashMap<Vec<u8>, (i64, f64)>,
    /// The control hash's `paused` field, as written (see [`pause_value`]).
    paused: Option<String>,
    /// The rate limit's bucket: the control hash's `tokens` and `at` fields, as written (by a
    /// rate-limited claim that took something or repaired them, or a stray write).
    tokens: Option<String>,
    at: Option<String>,
}

/// Hash mode: the bodies hash, and what the producer wrote to it.
#[derive(Default, Debug)]
struct Bodies {
    /// id -> body: what the bodies hash should hold.
    held: HashMap<Vec<u8>, Vec<u8>>,
    /// id -> the body of its latest `HSET`, remembered after the hash drops it.
    written: HashMap<Vec<u8>, Vec<u8>>,
    /// Ids the producer bug scheduled while they had no body, with no `HSET` since: the only
    /// ids that may be claimed as missing, or be queued without a body.
    bare: HashSet<Vec<u8>>,
    next_version: u64,
}

impl Model {
    /// The member's entry went stale carrying `failures` under `stamp`.
    fn leave(&mut self, member: &[u8], failures: i64, stamp: f64) {
        if failures > 0 {
            self.left.insert(member.to_vec(), (failures, stamp));
        }
    }

    /// The count the member's stale entry gives back to a copy scheduled at `score`.
    fn revive(&mut self, member: &[u8], score: f64) -> i64 {
        match self.left.get(member) {
            Some(&(count, stamp)) if stamp == score => {
                self.left.remove(member);
                count
            }
            _ => 0,
        }
    }

    /// A script deleted the member's entry (an ack or a dead letter): a scheduled copy's
    /// count, if it had one, went with it.
    fn entry_deleted(&mut self, member: &[u8]) {
        self.left.remove(member);
        if let Some(s) = self.source.get_mut(member) {
            s.failures = 0;
        }
    }

    /// The dead letters with their `K:dead` scores, in Redis's order.
    fn dead_by_score(&self) -> Vec<(Vec<u8>, f64)> {
        let mut dead: Vec<(Vec<u8>, f64)> = self
            .dead
            .iter()
            .map(|(m, e)| (m.clone(), e.score()))
            .collect();
        dead.sort_by(by_score);
        dead
    }

    /// Moves a copy that left its lease back to the source set, unless the producer
    /// scheduled the member again meanwhile: then that schedule stays and the two merge.
    /// Returns whether it merged.
    fn reschedule(
        &mut self,
        member: &[u8],
        score: f64,
        failures: i64,
        schedules: Schedules,
    ) -> bool {
        // The script rewrites the member's entry (or deletes it): nothing stale is left.
        self.left.remove(member);
        match self.source.get_mut(member) {
            Some(s) => {
                s.schedules.extend(schedules);
                s.failures = 0;
                true
            }
            None => {
                self.source.insert(
                    member.to_vec(),
                    Scheduled {
                        score,
                        failures,
                        schedules,
                    },
                );
                false
            }
        }
    }
}

/// Counts over all cases, to show the steps really exercised each path.
#[derive(Default)]
struct Tally {
    steps: AtomicU64,
    claimed: AtomicU64,
    skipped_in_flight: AtomicU64,
    acked: AtomicU64,
    acks_not_owned: AtomicU64,
    retried: AtomicU64,
    dead: AtomicU64,
    put_back: AtomicU64,
    merged: AtomicU64,
    not_owned: AtomicU64,
    recovered: AtomicU64,
    swept: AtomicU64,
    requeued: AtomicU64,
    wrong_type: AtomicU64,
    paused_claims: AtomicU64,
    rate_waits: AtomicU64,
    moved: AtomicU64,
    browsed: AtomicU64,
    purged: AtomicU64,
    cut_by_rate: AtomicU64,
    /// Dead letters claimed for forwarding.
    forward_claimed: AtomicU64,
    /// Of those, letters whose earlier lease had expired.
    forward_reclaimed: AtomicU64,
    forwards_confirmed: AtomicU64,
    forwards_refused: AtomicU64,
    forwards_kept: AtomicU64,
    forwards_released: AtomicU64,
    /// Forward outcomes for letters the claim no longer held.
    forwards_not_owned: AtomicU64,
    /// Forward claims that passed over a letter still leased, or refused.
    forward_skipped_leased: AtomicU64,
    forward_skipped_refused: AtomicU64,
    forward_claims_paused: AtomicU64,
    /// Stray writes to the control hash, and rate-limited claims that repaired the bucket.
    stray_writes: AtomicU64,
    bucket_repairs: AtomicU64,
    /// Hash mode from here on.
    bodies_claimed: AtomicU64,
    missing_claimed: AtomicU64,
    cut_by_budget: AtomicU64,
    ack_dropped_body: AtomicU64,
    ack_kept_body: AtomicU64,
    cancel_dropped_body: AtomicU64,
    cancel_kept_body: AtomicU64,
    forward_dropped_body: AtomicU64,
    forward_kept_body: AtomicU64,
    forward_missing_body: AtomicU64,
    /// Messages an ingress stored, found already held, dead-lettered.
    ingest_stored: AtomicU64,
    ingest_duplicates: AtomicU64,
    ingest_dead: AtomicU64,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Redis orders equal scores by member bytes.
fn by_score(a: &(Vec<u8>, f64), b: &(Vec<u8>, f64)) -> std::cmp::Ordering {
    a.1.total_cmp(&b.1).then_with(|| a.0.cmp(&b.0))
}

fn parse_score(raw: &[u8]) -> f64 {
    let s = std::str::from_utf8(raw).expect("scores are ASCII");
    match s {
        "inf" | "+inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        s => s.parse().expect("a number"),
    }
}

struct Case {
    conn: MultiplexedConnection,
    /// For stores with another claim byte budget.
    manager: Conn,
    store: Store,
    keys: QueueKeys,
    max_attempts: u32,
    /// Redis time when the case started: past and future scores are relative to it.
    base: i64,
    m: Model,
    tally: &'static Tally,
}

macro_rules! check {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(TestCaseError::fail(format!($($fmt)+)));
        }
    };
}

macro_rules! check_eq {
    ($a:expr, $b:expr, $($fmt:tt)+) => {
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err(TestCaseError::fail(format!(
                "{}: scripts {:?} != model {:?}", format!($($fmt)+), a, b
            )));
        }
    };
}

type Step = Result<(), TestCaseError>;

/// Everything the queue holds in Redis, for comparing before and after a failed call.
type Snapshot = Vec<(String, Vec<(Vec<u8>, Vec<u8>)>)>;

impl Case {
    async fn now(&mut self) -> i64 {
        common::redis_now(&mut self.conn).await
    }

    async fn zrange(&mut self, key: &str) -> Vec<(Vec<u8>, f64)> {
        redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut self.conn)
            .await
            .unwrap()
    }

    async fn zscore(&mut self, key: &str, member: &[u8]) -> Option<f64> {
        redis::cmd("ZSCORE")
            .arg(key)
            .arg(member)
            .query_async(&mut self.conn)
            .await
            .unwrap()
    }

    /// Adopts the score a script gave `member` from the Redis clock, after checking it lies
    /// between the clock readings around the call.
    async fn adopt_score(
        &mut self,
        key: &str,
        member: &[u8],
        lo: i64,
        hi: i64,
    ) -> Result<f64, TestCaseError> {
        let score = self.zscore(key, member).await;
        let Some(score) = score else {
            return Err(TestCaseError::fail(format!(
                "{member:?} missing from {key}"
            )));
        };
        check!(
            (lo as f64..=hi as f64).contains(&score),
            "{member:?} in {key} has score {score}, expected within [{lo}, {hi}]"
        );
        Ok(score)
    }

    async fn step(&mut self, op: &Op) -> Step {
        match op {
            Op::Schedule { member, when } => self.schedule(POOL[*member], *when).await,
            Op::Cancel { member } => self.cancel(POOL[*member]).await,
            Op::Claim { batch, short } => self.claim(*batch, *short, None, false).await,
            Op::RateClaim { batch, short } => self.claim(*batch, *short, None, true).await,
            Op::Produce { member, when, body } => self.produce(POOL[*member], *when, *body).await,
            Op::Reschedule { member, when } => self.reschedule(POOL[*member], *when).await,
            Op::ClaimBytes {
                batch,
                short,
                budget,
            } => self.claim(*batch, *short, Some(*budget), false).await,
            Op::Settle { which, disp } => self.settle(*which, disp).await,
            Op::Expire => self.expire().await,
            Op::Pause { on } => self.pause(*on).await,
            Op::Stray { field, value } => self.stray(*field, *value).await,
            Op::Move {
                member,
                when,
                earlier,
            } => self.move_due(POOL[*member], *when, *earlier).await,
            Op::Purge { dead, to } => self.purge(*dead, *to).await,
            Op::PurgeReason { which, dry_run } => self.purge_reason(*which, *dry_run).await,
            Op::Browse { limit } => self.browse(*limit).await,
            Op::Recover { limit } => self.recover(*limit).await,
            Op::Sweep => self.sweep().await,
            Op::Requeue { members, limit } => self.requeue(members, *limit).await,
            Op::ForwardClaim { limit, short } => self.forward_claim(*limit, *short).await,
            Op::ForwardSettle { which, disp } => self.forward_settle(*which, disp).await,
            Op::Ingest { member, how, body } => self.ingest(POOL[*member], *how, *body).await,
            Op::WrongType { key, script } => self.wrong_type(*key, *script).await,
        }
    }

    /// The score `when` stands for, and how a producer writes it.
    fn due(&self, when: When) -> (f64, String) {
        let score = match when {
            When::Past(k) => (self.base - 1000 - i64::from(k) * 1000) as f64,
            When::Future(k) => (self.base + 3_600_000 + i64::from(k) * 1000) as f64,
            When::NegInf => f64::NEG_INFINITY,
            When::PosInf => f64::INFINITY,
        };
        let arg = match when {
            When::NegInf => "-inf".to_string(),
            When::PosInf => "+inf".to_string(),
            _ => format!("{}", score as i64),
        };
        (score, arg)
    }

    /// The model of a producer `ZADD` of `member` at `score`.
    fn scheduled(&mut self, member: &[u8], score: f64) {
        match self.m.source.get_mut(member) {
            // A reschedule: the same schedule, a new time, a fresh count (the stamp no longer
            // matches, unless the producer happened to write the very score it had, or
            // writes back the score a stale count was stamped with).
            Some(s) => {
                if s.score != score {
                    let (failures, stamp) = (s.failures, s.score);
                    s.score = score;
                    self.m.leave(member, failures, stamp);
                    let revived = self.m.revive(member, score);
                    self.m.source.get_mut(member).expect("scheduled").failures = revived;
                }
            }
            None => {
                let id = self.m.next_schedule;
                self.m.next_schedule += 1;
                self.m.started.push(id);
                let failures = self.m.revive(member, score);
                self.m.source.insert(
                    member.to_vec(),
                    Scheduled {
                        score,
                        failures,
                        schedules: vec![id],
                    },
                );
            }
        }
    }

    async fn schedule(&mut self, member: &[u8], when: When) -> Step {
        let (score, arg) = self.due(when);
        let _: i64 = redis::cmd("ZADD")
            .arg(&self.keys.source)
            .arg(arg)
            .arg(member)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        self.scheduled(member, score);
        // Hash mode: the producer bug. An id that still has a body keeps it.
        if let Some(b) = &mut self.m.bodies {
            if !b.held.contains_key(member) {
                b.bare.insert(member.to_vec());
            }
        }
        Ok(())
    }

    /// The next body a producer (or an ingress) writes for `member`.
    fn next_body(&mut self, member: &[u8], payload: Payload) -> Vec<u8> {
        let b = self.m.bodies.as_mut().expect("hash mode");
        let body = match payload {
            Payload::Versioned(pad) => {
                let mut v = member.to_vec();
                v.extend_from_slice(format!("#{}", b.next_version).as_bytes());
                v.resize(v.len() + usize::from(pad), b'.');
                v
            }
            Payload::Empty => Vec::new(),
        };
        b.next_version += 1;
        body
    }

    async fn produce(&mut self, member: &[u8], when: When, payload: Payload) -> Step {
        let (score, arg) = self.due(when);
        let body = self.next_body(member, payload);
        let b = self.m.bodies.as_mut().expect("hash mode");
        let () = redis::pipe()
            .atomic()
            .cmd("HSET")
            .arg(&self.keys.bodies)
            .arg(member)
            .arg(&body)
            .ignore()
            .cmd("ZADD")
            .arg(&self.keys.source)
            .arg(arg)
            .arg(member)
            .ignore()
            .query_async(&mut self.conn)
            .await
            .unwrap();
        b.held.insert(member.to_vec(), body.clone());
        b.written.insert(member.to_vec(), body);
        b.bare.remove(member);
        self.scheduled(member, score);
        Ok(())
    }

    /// An ingress's store (`ingest.lua`), once per id: an id scheduled, in flight or dead
    /// changes nothing; otherwise its body is written, a stale attempt entry dropped, and the
    /// id scheduled (at a time, or a delay on the Redis clock) or dead-lettered.
    async fn ingest(&mut self, member: &[u8], how: HowIngest, payload: Payload) -> Step {
        let body = self.next_body(member, payload);
        let (reason, detail) = match how {
            HowIngest::Dead(i) => INGEST_REASONS[i],
            _ => ("", ""),
        };
        let at = match how {
            HowIngest::At(when) => self.due(when).0 as i64,
            _ => 0,
        };
        let call = match how {
            HowIngest::In(ms) => Ingest::In(ms),
            HowIngest::At(_) => Ingest::At(at),
            HowIngest::Dead(_) => Ingest::Dead { reason, detail },
        };
        let before = self.now().await;
        let done = self
            .store
            .ingest(member, &body, call)
            .await
            .map_err(|e| TestCaseError::fail(format!("ingest: {e}")))?;
        let after = self.now().await;
        let held = self
            .m
            .source
            .get(member)
            .map(|s| s.score)
            .or_else(|| self.m.inflight.get(member).map(|l| l.deadline as f64))
            .or_else(|| self.m.dead.get(member).map(DeadEntry::score));
        check_eq!(done.stored, held.is_none(), "ingest of {member:?}: stored");
        if let Some(score) = held {
            bump(&self.tally.ingest_duplicates, 1);
            if score.is_finite() {
                check_eq!(
                    done.at_ms,
                    score as i64,
                    "ingest of {member:?}: the time found"
                );
            }
            return Ok(());
        }
        self.m.left.remove(member);
        let b = self.m.bodies.as_mut().expect("hash mode");
        b.held.insert(member.to_vec(), body.clone());
        b.written.insert(member.to_vec(), body);
        b.bare.remove(member);
        match how {
            HowIngest::Dead(_) => {
                let dead = self.keys.dead.clone();
                let at = self.adopt_score(&dead, member, before, after).await?;
                check_eq!(
                    done.at_ms,
                    at as i64,
                    "ingest of {member:?}: dead-lettered at"
                );
                let id = self.m.next_schedule;
                self.m.next_schedule += 1;
                self.m.started.push(id);
                let entry = DeadEntry {
                    at,
                    reason: reason.to_string(),
                    detail: (!detail.is_empty()).then(|| detail.to_string()),
                    attempts: 0,
                    schedules: vec![id],
                    forward: None,
                };
                self.m.dead.insert(member.to_vec(), entry);
                bump(&self.tally.ingest_dead, 1);
            }
            HowIngest::In(ms) => {
                let d = ms.max(0);
                let source = self.keys.source.clone();
                let score = self
                    .adopt_score(&source, member, before + d, after + d)
                    .await?;
                check_eq!(done.at_ms, score as i64, "ingest of {member:?}: due");
                self.scheduled(member, score);
                bump(&self.tally.ingest_stored, 1);
            }
            HowIngest::At(_) => {
                check_eq!(done.at_ms, at, "ingest of {member:?}: due");
                self.scheduled(member, at as f64);
                bump(&self.tally.ingest_stored, 1);
            }
        }
        Ok(())
    }

    async fn reschedule(&mut self, member: &[u8], when: When) -> Step {
        let (score, arg) = self.due(when);
        let _: i64 = redis::cmd("ZADD")
            .arg(&self.keys.source)
            .arg("XX")
            .arg(arg)
            .arg(member)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        if self.m.source.contains_key(member) {
            self.scheduled(member, score);
        }
        Ok(())
    }

    async fn cancel(&mut self, member: &[u8]) -> Step {
        let n: i64 = if self.m.bodies.is_some() {
            // The producers' script as they run it: unschedules the id, and drops its body
            // unless a copy in flight or dead still needs it.
            static SCRIPT: std::sync::LazyLock<redis::Script> =
                std::sync::LazyLock::new(|| redis::Script::new(delay_bridge::store::CANCEL));
            SCRIPT
                .key(&self.keys.source)
                .key(&self.keys.inflight)
                .key(&self.keys.dead)
                .key(&self.keys.bodies)
                .arg(member)
                .invoke_async(&mut self.conn)
                .await
                .unwrap()
        } else {
            redis::cmd("ZREM")
                .arg(&self.keys.source)
                .arg(member)
                .query_async(&mut self.conn)
                .await
                .unwrap()
        };
        let was = self.m.source.remove(member);
        check_eq!(n == 1, was.is_some(), "ZREM of {member:?}");
        if let Some(s) = was {
            // The count stays in the hash under the cancelled score.
            self.m.leave(member, s.failures, s.score);
            self.m.cancelled.extend(s.schedules);
            if let Some(b) = &mut self.m.bodies {
                if self.m.inflight.contains_key(member) || self.m.dead.contains_key(member) {
                    bump(&self.tally.cancel_kept_body, 1);
                } else if b.held.remove(member).is_some() {
                    bump(&self.tally.cancel_dropped_body, 1);
                }
            }
        }
        Ok(())
    }

    /// Members a claim at `now` may take, earliest first: due and not in flight.
    fn claimable(&self, now: i64) -> Vec<(Vec<u8>, f64)> {
        let mut due: Vec<(Vec<u8>, f64)> = self
            .m
            .source
            .iter()
            .filter(|(m, s)| s.score <= now as f64 && !self.m.inflight.contains_key(*m))
            .map(|(m, s)| (m.clone(), s.score))
            .collect();
        due.sort_by(by_score);
        due
    }

    /// The operator's reschedule (promote with `earlier`): only a scheduled member moves,
    /// and its attempt count moves with it.
    async fn move_due(&mut self, member: &[u8], when: When, earlier: bool) -> Step {
        let (score, _) = self.due(when);
        if score.is_infinite() {
            // Operators give due times in epoch ms.
            return Ok(());
        }
        let changed = self
            .store
            .reschedule(&[member.to_vec()], Some(score as i64), earlier)
            .await
            .unwrap();
        let want = match self.m.source.get_mut(member) {
            Some(s) if s.score != score && (!earlier || s.score > score) => {
                s.score = score;
                // A count moves with the copy; without one, a stale count stamped with the
                // new score counts again.
                if s.failures == 0 {
                    let revived = self.m.revive(member, score);
                    self.m.source.get_mut(member).expect("scheduled").failures = revived;
                }
                true
            }
            _ => false,
        };
        check_eq!(changed, u64::from(want), "moved {member:?} to {score}");
        bump(&self.tally.moved, u64::from(want));
        Ok(())
    }

    /// Browsing page by page lists every scheduled member once, in Redis's order (score,
    /// then member bytes), with the attempts of its copy.
    async fn browse(&mut self, limit: usize) -> Step {
        let mut seen = Vec::new();
        let mut after = None;
        for _ in 0..=POOL.len() {
            let page = self
                .store
                .browse(None, None, after.as_ref(), limit)
                .await
                .unwrap();
            seen.extend(page.items.iter().map(|e| (e.member.clone(), e.attempts)));
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let mut want: Vec<(Vec<u8>, f64)> = self
            .m
            .source
            .iter()
            .map(|(m, s)| (m.clone(), s.score))
            .collect();
        want.sort_by(by_score);
        let want: Vec<(Vec<u8>, u32)> = want
            .into_iter()
            .map(|(m, _)| {
                let failures = self.m.source[&m].failures as u32;
                (m, failures)
            })
            .collect();
        check_eq!(
            seen,
            want,
            "browsed (member, attempts) with pages of {limit}"
        );
        bump(&self.tally.browsed, seen.len() as u64);
        Ok(())
    }

    /// The operator's purge: every dead letter, or every scheduled member due by `to`.
    /// Their schedules end there, like a cancel; in hash mode a body goes unless another
    /// copy of its id (scheduled, in flight or dead) still needs it.
    async fn purge(&mut self, dead: bool, to: When) -> Step {
        let (to_score, _) = self.due(to);
        let what = if dead {
            Purge::Dead
        } else {
            Purge::Scheduled {
                from: None,
                to: (to_score != f64::INFINITY).then(|| to_score.max(i64::MIN as f64) as i64),
            }
        };
        let deleted = self.store.purge(what).await.unwrap();
        let gone: Vec<Vec<u8>> = if dead {
            self.m.dead.keys().cloned().collect()
        } else {
            let limit = match what {
                Purge::Scheduled { to: Some(t), .. } => t as f64,
                _ => f64::INFINITY,
            };
            self.m
                .source
                .iter()
                .filter(|(_, s)| s.score <= limit)
                .map(|(m, _)| m.clone())
                .collect()
        };
        check_eq!(deleted, gone.len() as u64, "purged (dead: {dead})");
        self.purged(&gone, dead);
        Ok(())
    }

    /// The purge by reason: every dead letter whose reason is one of those present (or a
    /// reason none has), or only how many there are. The store reads the set a page at a
    /// time and the script checks each letter's reason again before deleting it.
    async fn purge_reason(&mut self, which: usize, dry_run: bool) -> Step {
        let mut reasons: Vec<String> = self.m.dead.values().map(|d| d.reason.clone()).collect();
        reasons.sort();
        reasons.dedup();
        reasons.push("no_such_reason".into());
        let reason = reasons[which % reasons.len()].clone();
        let n = self
            .store
            .purge_dead_reason(&reason, dry_run)
            .await
            .unwrap();
        let gone: Vec<Vec<u8>> = self
            .m
            .dead
            .iter()
            .filter(|(_, d)| d.reason == reason)
            .map(|(m, _)| m.clone())
            .collect();
        check_eq!(
            n,
            gone.len() as u64,
            "dead letters of reason {reason} (dry run: {dry_run})"
        );
        if !dry_run {
            self.purged(&gone, true);
        }
        Ok(())
    }

    /// The model after a purge deleted `gone`, dead letters or scheduled members: their
    /// schedules end there, like a cancel; in hash mode a body goes unless another copy of
    /// its id (scheduled, in flight or dead) still needs it.
    fn purged(&mut self, gone: &[Vec<u8>], dead: bool) {
        for m in gone {
            let schedules = if dead {
                // With its forward's lease, if any.
                self.m.dead.remove(m).map(|d| d.schedules)
            } else {
                if !self.m.inflight.contains_key(m) {
                    // Its entry goes too, stale or not; a copy in flight keeps its own.
                    self.m.left.remove(m);
                }
                self.m.source.remove(m).map(|s| s.schedules)
            };
            self.m.cancelled.extend(schedules.unwrap_or_default());
            if let Some(b) = &mut self.m.bodies {
                let needed = self.m.inflight.contains_key(m)
                    || self.m.source.contains_key(m)
                    || self.m.dead.contains_key(m);
                if !needed {
                    b.held.remove(m);
                }
            }
        }
        bump(&self.tally.purged, gone.len() as u64);
    }

    /// Pauses or resumes: the store says whether that changed anything.
    async fn pause(&mut self, on: bool) -> Step {
        let changed = self.store.set_paused(on).await.unwrap();
        check_eq!(
            changed,
            pause_value(&self.m.paused).0 != on,
            "pause({on}) changed"
        );
        self.m.paused = on.then(|| "1".to_string());
        Ok(())
    }

    /// Writes (or deletes) one control field behind the bridge's back.
    async fn stray(&mut self, field: usize, value: usize) -> Step {
        let (name, values) = CONTROL[field % CONTROL.len()];
        let value = values
            .get(value % (values.len() + 1))
            .map(|v| v.to_string());
        let mut cmd = redis::cmd(if value.is_some() { "HSET" } else { "HDEL" });
        cmd.arg(&self.keys.control).arg(name);
        if let Some(v) = &value {
            cmd.arg(v);
        }
        let _: i64 = cmd.query_async(&mut self.conn).await.unwrap();
        match name {
            "paused" => self.m.paused = value,
            "tokens" => self.m.tokens = value,
            _ => self.m.at = value,
        }
        bump(&self.tally.stray_writes, 1);
        Ok(())
    }

    /// Claims with the case's store, or in hash mode with one whose bodies may total `budget`.
    /// With `rated`, by a store with the rate limit [`RATE`].
    async fn claim(
        &mut self,
        batch: usize,
        short: bool,
        budget: Option<usize>,
        rated: bool,
    ) -> Step {
        let lease = if short { SHORT_LEASE } else { LONG_LEASE };
        let budget = self.m.bodies.as_ref().map(|_| budget.unwrap_or(ROOMY));
        let mut store = match budget {
            Some(budget) if budget != ROOMY => {
                Store::new(self.manager.clone(), self.keys.clone()).with_hash_bodies(budget)
            }
            _ => self.store.clone(),
        };
        if rated {
            store = store.with_rate_limit(RATE, BURST);
        }
        let got = store.claim(batch, lease).await.unwrap();
        let now = got.now_ms;
        // Every claim repairs a `paused` value that is not canonical.
        let (paused, odd) = pause_value(&self.m.paused);
        let mut repaired = 0;
        if odd {
            repaired += 1;
            self.m.paused = paused.then(|| "1".to_string());
        }
        check_eq!(got.paused, paused, "claim sees the pause");
        if paused {
            check_eq!(got.repaired, repaired, "repairs while paused");
            check!(got.items.is_empty(), "a paused queue gave {:?}", got.items);
            check_eq!(
                got.deadline_ms,
                now + lease.as_millis() as i64,
                "paused deadline"
            );
            check_eq!((got.skipped, got.next_head_ms), (0, None), "paused reply");
            bump(&self.tally.paused_claims, 1);
            return Ok(());
        }
        // The token bucket, as the script computes it on the Redis clock.
        let asked = batch;
        let mut tokens = None;
        let mut batch = batch;
        let per_ms = RATE / 1000.0;
        // A rate-limited claim checks the bucket: an invalid field empties it as of now.
        let bucket = rated.then(|| {
            let (held, at) = (finite(&self.m.tokens), finite(&self.m.at));
            let bad = u64::from(self.m.tokens.is_some() && !held.is_some_and(|h| h >= 0.0))
                + u64::from(self.m.at.is_some() && !at.is_some_and(|a| a <= now as f64));
            if bad > 0 {
                repaired += bad;
                self.m.tokens = Some("0".into());
                self.m.at = Some(now.to_string());
                bump(&self.tally.bucket_repairs, 1);
                return 0.0;
            }
            match (held, at) {
                (Some(held), Some(at)) => (BURST as f64).min(held + (now as f64 - at) * per_ms),
                _ => BURST as f64,
            }
        });
        check_eq!(got.repaired, repaired, "control fields repaired");
        if let Some(t) = bucket {
            if t < 1.0 {
                let wait = ((1.0 - t) / per_ms).ceil() as u64;
                check_eq!(
                    got.rate_wait,
                    Some(Duration::from_millis(wait)),
                    "rate wait"
                );
                check!(
                    got.items.is_empty(),
                    "claimed past the rate: {:?}",
                    got.items
                );
                check_eq!(
                    (got.skipped, got.next_head_ms),
                    (0, None),
                    "rate-limited reply"
                );
                bump(&self.tally.rate_waits, 1);
                return Ok(());
            }
            batch = batch.min(t.floor() as usize);
            tokens = Some(t);
        }
        check_eq!(got.rate_wait, None, "no rate wait");
        self.check_bodies(&got.items, budget)?;
        // now + lease, moved on a millisecond at a time while another lease has that deadline
        // (only when the claim takes something).
        let mut deadline = now + lease.as_millis() as i64;
        let any_due = !self.claimable(now).is_empty();
        if any_due {
            while self.m.inflight.values().any(|l| l.deadline == deadline) {
                deadline += 1;
            }
        }
        check_eq!(got.deadline_ms, deadline, "claim deadline");
        let skipped = self
            .m
            .source
            .iter()
            .filter(|(m, s)| s.score <= now as f64 && self.m.inflight.contains_key(*m))
            .count();
        // The claim looks at up to `batch` claimable members; held ones before the last of
        // those are skipped (and counted), any after it are not reached. In hash mode it stops
        // early, at the first member but the first whose body would take it past the budget.
        let mut due_all: Vec<(Vec<u8>, f64)> = self
            .m
            .source
            .iter()
            .filter(|(_, s)| s.score <= now as f64)
            .map(|(m, s)| (m.clone(), s.score))
            .collect();
        due_all.sort_by(by_score);
        let mut due: Vec<(Vec<u8>, f64)> = Vec::new();
        let mut seen_skipped = 0u64;
        let mut bytes = 0;
        for (m, score) in &due_all {
            if due.len() == batch {
                break;
            }
            if self.m.inflight.contains_key(m) {
                seen_skipped += 1;
                continue;
            }
            if let Some(budget) = budget {
                // A missing body weighs nothing, but cannot squeeze past a spent budget either.
                let size = self
                    .m
                    .bodies
                    .as_ref()
                    .and_then(|b| b.held.get(m))
                    .map_or(0, Vec::len);
                if !due.is_empty() && bytes + size > budget {
                    bump(&self.tally.cut_by_budget, 1);
                    break;
                }
                bytes += size;
            }
            due.push((m.clone(), *score));
        }
        check_eq!(got.skipped, seen_skipped, "members skipped as in flight");
        bump(&self.tally.skipped_in_flight, skipped as u64);

        let want: Vec<(Vec<u8>, f64, u32)> = due
            .iter()
            .map(|(m, s)| (m.clone(), *s, self.m.source[m].failures as u32 + 1))
            .collect();
        let seen: Vec<(Vec<u8>, f64, u32)> = got
            .items
            .iter()
            .map(|c| (c.member.clone(), parse_score(&c.due_raw), c.attempt))
            .collect();
        check_eq!(seen, want, "claimed (member, due, attempt) at now={now}");
        check!(
            !any_due || !got.items.is_empty(),
            "claimed nothing while members were due"
        );

        let mut schedules = Vec::new();
        for (m, _) in &due {
            let s = self.m.source.remove(m).expect("claimable");
            schedules.push(s.schedules.clone());
            self.m.inflight.insert(
                m.clone(),
                Lease {
                    batch: self.m.next_batch,
                    deadline: got.deadline_ms,
                    short,
                    failures: s.failures,
                    schedules: s.schedules,
                },
            );
        }
        // The next head is the earliest scheduled member that is not in flight.
        let mut rest: Vec<(Vec<u8>, f64)> = self
            .m
            .source
            .iter()
            .filter(|(m, _)| !self.m.inflight.contains_key(*m))
            .map(|(m, s)| (m.clone(), s.score))
            .collect();
        rest.sort_by(by_score);
        check_eq!(
            got.next_head_ms,
            rest.first().map(|(_, s)| *s),
            "next head after claim"
        );

        bump(&self.tally.claimed, due.len() as u64);
        if let Some(t) = tokens.filter(|_| !due.is_empty()) {
            self.m.tokens = Some((t - due.len() as f64).to_string());
            self.m.at = Some(now.to_string());
            if batch < asked && due.len() == batch {
                bump(&self.tally.cut_by_rate, 1);
            }
        }
        if !due.is_empty() {
            self.m.open.push(OpenBatch {
                id: self.m.next_batch,
                deadline: got.deadline_ms,
                items: got.items,
                schedules,
            });
        }
        self.m.next_batch += 1;
        Ok(())
    }

    /// The bodies a claim returned: in hash mode the latest body written for each id, missing
    /// only after the producer bug, and within the budget unless the claim took one member.
    fn check_bodies(&self, items: &[Claimed], budget: Option<usize>) -> Step {
        let Some(b) = &self.m.bodies else {
            for c in items {
                check_eq!(
                    c.body,
                    Body::Member,
                    "body of {:?} in inline mode",
                    c.member
                );
            }
            return Ok(());
        };
        for c in items {
            let modelled = match b.held.get(&c.member) {
                Some(body) => Body::Stored(body.clone()),
                None => Body::Missing,
            };
            check_eq!(c.body, modelled, "body claimed with {:?}", c.member);
            match &c.body {
                Body::Stored(body) => {
                    check!(
                        b.written.get(&c.member) == Some(body),
                        "{:?} claimed with {body:?}, but its latest body is {:?}",
                        c.member,
                        b.written.get(&c.member)
                    );
                    bump(&self.tally.bodies_claimed, 1);
                }
                _ => {
                    check!(
                        b.bare.contains(&c.member),
                        "{:?} claimed without a body, but the producer wrote {:?} last",
                        c.member,
                        b.written.get(&c.member)
                    );
                    bump(&self.tally.missing_claimed, 1);
                }
            }
        }
        let budget = budget.expect("hash mode has a budget");
        let bytes: usize = items
            .iter()
            .filter_map(|c| c.payload())
            .map(<[u8]>::len)
            .sum();
        check!(
            items.len() <= 1 || bytes <= budget,
            "claimed {} members with {bytes} body bytes, budget {budget}",
            items.len()
        );
        Ok(())
    }

    async fn settle(&mut self, which: usize, disp: &[Disp]) -> Step {
        if self.m.open.is_empty() {
            return Ok(());
        }
        let b = self.m.open.remove(which % self.m.open.len());
        let plan: Vec<Disp> = b
            .items
            .iter()
            .enumerate()
            .map(|(i, c)| match disp[i % disp.len()] {
                d if c.body != Body::Missing || d == Disp::PutBack => d,
                _ => Disp::Missing,
            })
            .collect();
        let mut s = Settlement::default();
        for (c, d) in b.items.iter().zip(&plan) {
            let fail = |retry_in, reason: &'static str, permanent| Failure {
                member: &c.member,
                retry_in,
                reason: reason.into(),
                permanent,
                detail: detail_of(reason).map(str::to_string),
            };
            match d {
                Disp::Ack => s.ack.push(&c.member),
                Disp::Retry => s.fail.push(fail(Duration::ZERO, "nack", false)),
                Disp::RetryLater => s.fail.push(fail(RETRY_LATER, "returned", false)),
                Disp::Dead => s.fail.push(fail(Duration::ZERO, "too_large", true)),
                Disp::PutBack => s.put_back.push(c),
                Disp::Missing => s.fail.push(fail(Duration::ZERO, "missing_body", true)),
            }
        }
        let t0 = self.now().await;
        let got = self
            .store
            .settle(b.deadline, self.max_attempts, &s)
            .await
            .unwrap();
        let t1 = self.now().await;

        let owns =
            |m: &Model, member: &[u8]| m.inflight.get(member).is_some_and(|l| l.batch == b.id);
        let mut released = 0;
        // Acks: the broker has the message, whoever holds the lease now; only this batch's
        // own leases end.
        let mut acked = 0;
        for ((c, d), schedules) in b.items.iter().zip(&plan).zip(&b.schedules) {
            if *d != Disp::Ack {
                continue;
            }
            self.m.delivered.extend(schedules.iter().copied());
            if owns(&self.m, &c.member) {
                self.m.inflight.remove(&c.member);
                self.m.entry_deleted(&c.member);
                acked += 1;
                // Hash mode: the body goes with the last copy of its id.
                if let Some(bodies) = &mut self.m.bodies {
                    if self.m.source.contains_key(&c.member) || self.m.dead.contains_key(&c.member)
                    {
                        bump(&self.tally.ack_kept_body, 1);
                    } else {
                        bodies.held.remove(&c.member);
                        bump(&self.tally.ack_dropped_body, 1);
                    }
                }
            } else {
                bump(&self.tally.acks_not_owned, 1);
            }
        }
        check_eq!(got.acked, acked, "acked count");
        bump(&self.tally.acked, acked);

        let mut outcomes = Vec::new();
        for (c, d) in b.items.iter().zip(&plan) {
            let member = &c.member;
            if !matches!(
                d,
                Disp::Retry | Disp::RetryLater | Disp::Dead | Disp::Missing
            ) {
                continue;
            }
            if !owns(&self.m, member) {
                outcomes.push(FailOutcome::NotOwned);
                bump(&self.tally.not_owned, 1);
                continue;
            }
            let lease = self.m.inflight.remove(member).expect("owned");
            let failures = lease.failures + 1;
            if matches!(d, Disp::Dead | Disp::Missing) || failures >= i64::from(self.max_attempts) {
                self.m.entry_deleted(member);
                let dead_key = self.keys.dead.clone();
                let at = self.adopt_score(&dead_key, member, t0, t1).await?;
                let reason = match d {
                    Disp::Dead => "too_large",
                    Disp::Missing => "missing_body",
                    Disp::Retry => "nack",
                    _ => "returned",
                };
                let mut schedules = lease.schedules;
                if let Some(old) = self.m.dead.remove(member) {
                    schedules.extend(old.schedules);
                }
                self.m.dead.insert(
                    member.clone(),
                    DeadEntry {
                        at,
                        reason: reason.into(),
                        detail: detail_of(reason).map(str::to_string),
                        attempts: failures,
                        schedules,
                        // A forward of the earlier dead copy no longer holds this one.
                        forward: None,
                    },
                );
                if self.m.source.contains_key(member) {
                    released += 1;
                }
                outcomes.push(FailOutcome::DeadLettered);
                bump(&self.tally.dead, 1);
            } else {
                let delay = if *d == Disp::RetryLater {
                    RETRY_LATER.as_millis() as i64
                } else {
                    0
                };
                let at = if self.m.source.contains_key(member) {
                    0.0
                } else {
                    let src = self.keys.source.clone();
                    self.adopt_score(&src, member, t0 + delay, t1 + delay)
                        .await?
                };
                if self.m.reschedule(member, at, failures, lease.schedules) {
                    released += 1;
                    bump(&self.tally.merged, 1);
                }
                outcomes.push(FailOutcome::Retried);
                bump(&self.tally.retried, 1);
            }
        }
        check_eq!(
            got.fail_outcomes,
            outcomes,
            "fail outcomes of batch {} ({plan:?})",
            b.id
        );

        let mut back = 0;
        for c in &s.put_back {
            if owns(&self.m, &c.member) {
                let lease = self.m.inflight.remove(&c.member).expect("owned");
                let score = parse_score(&c.due_raw);
                if self
                    .m
                    .reschedule(&c.member, score, lease.failures, lease.schedules)
                {
                    released += 1;
                    bump(&self.tally.merged, 1);
                }
                back += 1;
            }
        }
        check_eq!(got.put_back, back, "put back count");
        check_eq!(got.released, released, "released count");
        bump(&self.tally.put_back, back);
        Ok(())
    }

    /// Waits until every short lease, in flight or of a forwarded dead letter, is past.
    async fn expire(&mut self) -> Step {
        let forwards = self.m.dead.values().filter_map(|e| match e.forward {
            Some(Forward::Leased {
                deadline,
                short: true,
                ..
            }) => Some(deadline),
            _ => None,
        });
        let Some(last) = self
            .m
            .inflight
            .values()
            .filter(|l| l.short)
            .map(|l| l.deadline)
            .chain(forwards)
            .max()
        else {
            return Ok(());
        };
        let end = Instant::now() + Duration::from_secs(2);
        while self.now().await <= last {
            check!(
                Instant::now() < end,
                "Redis clock did not pass {last} within 2 s"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    async fn recover(&mut self, limit: usize) -> Step {
        let t0 = self.now().await;
        let got = self.store.recover(limit, None).await.unwrap();
        let t1 = self.now().await;
        let n = got.recovered as usize;
        check_eq!(got.swept, 0, "swept without a cursor");
        let mut leases: Vec<(Vec<u8>, f64)> = self
            .m
            .inflight
            .iter()
            .map(|(m, l)| (m.clone(), l.deadline as f64))
            .collect();
        leases.sort_by(by_score);
        // The script's clock reading lies in [t0, t1]: expired means deadline < now.
        let surely = leases.iter().filter(|(_, d)| *d < t0 as f64).count();
        check!(n <= limit, "recovered {n} > limit {limit}");
        check!(
            n >= surely.min(limit),
            "recovered {n}, but {surely} leases had expired (limit {limit})"
        );
        for (m, d) in &leases[..n] {
            check!(
                d.total_cmp(&(t1 as f64)).is_lt(),
                "recovered {m:?} whose lease {d} had not expired by {t1}"
            );
            let lease = self.m.inflight.remove(m).expect("leased");
            let at = if self.m.source.contains_key(m) {
                0.0
            } else {
                let src = self.keys.source.clone();
                self.adopt_score(&src, m, t0, t1).await?
            };
            if self
                .m
                .reschedule(m, at, lease.failures + 1, lease.schedules)
            {
                bump(&self.tally.merged, 1);
            }
        }
        bump(&self.tally.recovered, n as u64);
        Ok(())
    }

    async fn sweep(&mut self) -> Step {
        let mut cursor = "0".to_string();
        for _ in 0..100 {
            let got = self.store.recover(0, Some(&cursor)).await.unwrap();
            check_eq!(got.recovered, 0, "recovered with limit 0");
            bump(&self.tally.swept, got.swept);
            cursor = got.cursor;
            if cursor == "0" {
                break;
            }
        }
        check_eq!(cursor.as_str(), "0", "sweep finished a pass");
        self.m.left.clear();
        let stale = self.attempt_entries().await?.1;
        check!(
            stale.is_empty(),
            "stale attempt entries after a sweep: {stale:?}"
        );
        Ok(())
    }

    async fn requeue(&mut self, members: &[usize], limit: usize) -> Step {
        let named: Vec<Vec<u8>> = members.iter().map(|i| POOL[*i].to_vec()).collect();
        let t0 = self.now().await;
        let n = self.store.requeue_dead(&named, limit).await.unwrap();
        let t1 = self.now().await;
        let targets: Vec<Vec<u8>> = if named.is_empty() {
            self.m
                .dead_by_score()
                .into_iter()
                .take(limit)
                .map(|(m, _)| m)
                .collect()
        } else {
            named
        };
        let mut moved = 0;
        for m in targets {
            // Its forward's lease, if any, goes with it.
            let Some(entry) = self.m.dead.remove(&m) else {
                continue;
            };
            moved += 1;
            match self.m.source.get_mut(&m) {
                // `ZADD LT`: the earlier of the two due times; a moved score starts afresh.
                Some(s) => {
                    s.schedules.extend(entry.schedules);
                    if s.score > t0 as f64 {
                        let src = self.keys.source.clone();
                        let at = self.adopt_score(&src, &m, t0, t1).await?;
                        let s = self.m.source.get_mut(&m).expect("scheduled");
                        let (failures, stamp) = (s.failures, s.score);
                        s.score = at;
                        self.m.leave(&m, failures, stamp);
                        let revived = self.m.revive(&m, at);
                        self.m.source.get_mut(&m).expect("scheduled").failures = revived;
                    }
                }
                None => {
                    let src = self.keys.source.clone();
                    let at = self.adopt_score(&src, &m, t0, t1).await?;
                    let failures = self.m.revive(&m, at);
                    self.m.source.insert(
                        m,
                        Scheduled {
                            score: at,
                            failures,
                            schedules: entry.schedules,
                        },
                    );
                }
            }
        }
        check_eq!(
            n,
            moved,
            "requeued count (names {members:?}, limit {limit})"
        );
        bump(&self.tally.requeued, moved);
        Ok(())
    }

    /// The body a dead-letter claim should return with `member`: itself inline; in hash mode
    /// the body its id holds, if any.
    fn dead_body(&self, member: &[u8]) -> Body {
        match &self.m.bodies {
            None => Body::Member,
            Some(b) => b
                .held
                .get(member)
                .map_or(Body::Missing, |body| Body::Stored(body.clone())),
        }
    }

    /// Claims dead letters to forward: nothing while paused, else up to `limit` (at most
    /// [`FORWARD_CAP`]) of the oldest that no forward holds (never leased, released, or
    /// leased until no later than the claim's now; never a refused one), each leased to this
    /// claim. The letters stay dead, with their reasons and bodies.
    async fn forward_claim(&mut self, limit: usize, short: bool) -> Step {
        let lease = if short {
            SHORT_FORWARD_LEASE
        } else {
            LONG_LEASE
        };
        let t0 = self.now().await;
        let got = self.store.claim_dead(limit, lease).await.unwrap();
        let t1 = self.now().await;
        let now = got.now_ms;
        check!(
            (t0..=t1).contains(&now),
            "dead-letter claim at {now}, outside [{t0}, {t1}]"
        );
        check_eq!(
            got.deadline_ms,
            now + lease.as_millis() as i64,
            "dead-letter claim deadline"
        );
        if pause_value(&self.m.paused).0 {
            check!(
                got.items.is_empty(),
                "a paused queue gave dead letters {:?}",
                got.items
            );
            bump(&self.tally.forward_claims_paused, 1);
            return Ok(());
        }
        let dead = self.m.dead_by_score();
        let mut picked: Vec<Vec<u8>> = Vec::new();
        let (mut passed_leased, mut passed_refused) = (false, false);
        for (m, _) in &dead {
            if picked.len() == limit.min(FORWARD_CAP) {
                break;
            }
            match self.m.dead[m].forward {
                Some(Forward::Refused) => passed_refused = true,
                Some(Forward::Leased { deadline, .. }) if deadline > now => passed_leased = true,
                _ => picked.push(m.clone()),
            }
        }
        bump(&self.tally.forward_skipped_leased, u64::from(passed_leased));
        bump(
            &self.tally.forward_skipped_refused,
            u64::from(passed_refused),
        );

        type Letter = (Vec<u8>, i64, Option<Reason>, Body);
        let want: Vec<Letter> = picked
            .iter()
            .map(|m| {
                let e = &self.m.dead[m];
                (m.clone(), e.at as i64, Some(e.reason()), self.dead_body(m))
            })
            .collect();
        let seen: Vec<Letter> = got
            .items
            .iter()
            .map(|d| {
                let reason = d.reason.as_deref().map(parse_reason);
                (d.member.clone(), d.at_ms, reason, d.body.clone())
            })
            .collect();
        check_eq!(
            seen,
            want,
            "dead letters (member, at, reason, body) claimed at now={now}, limit {limit}"
        );
        if self.m.bodies.is_some() {
            let missing = got.items.iter().filter(|d| d.body == Body::Missing).count();
            bump(&self.tally.forward_missing_body, missing as u64);
        }

        let id = self.m.next_dead_claim;
        self.m.next_dead_claim += 1;
        let mut schedules = Vec::new();
        for m in &picked {
            let e = self.m.dead.get_mut(m).expect("picked from the dead");
            if e.forward.is_some() {
                bump(&self.tally.forward_reclaimed, 1);
            }
            e.forward = Some(Forward::Leased {
                claim: id,
                deadline: got.deadline_ms,
                short,
            });
            schedules.push(e.schedules.clone());
        }
        bump(&self.tally.forward_claimed, picked.len() as u64);
        if !picked.is_empty() {
            self.m.open_dead.push(OpenDeadClaim {
                id,
                deadline: got.deadline_ms,
                items: got.items,
                schedules,
            });
        }
        Ok(())
    }

    /// Settles one open dead-letter claim. Each outcome applies only to a letter this claim
    /// still holds: not one whose lease expired and was taken again, nor one requeued,
    /// purged or dead-lettered anew meanwhile. Confirmed: the letter leaves Redis (in hash
    /// mode its body too, unless its id is scheduled or in flight); refused: kept for good;
    /// released: free to claim at once.
    async fn forward_settle(&mut self, which: usize, disp: &[FDisp]) -> Step {
        if self.m.open_dead.is_empty() {
            return Ok(());
        }
        let c = self.m.open_dead.remove(which % self.m.open_dead.len());
        let plan: Vec<FDisp> = (0..c.items.len()).map(|i| disp[i % disp.len()]).collect();
        let with = |want: FDisp| -> Vec<&[u8]> {
            c.items
                .iter()
                .zip(&plan)
                .filter(|(_, d)| **d == want)
                .map(|(item, _)| item.member.as_slice())
                .collect()
        };
        let outcome = DeadOutcome {
            confirmed: with(FDisp::Confirmed),
            kept: with(FDisp::Kept),
            refused: with(FDisp::Refused),
            released: with(FDisp::Released),
        };
        let got = self.store.settle_dead(c.deadline, &outcome).await.unwrap();

        let mut want = DeadSettled::default();
        for ((item, d), schedules) in c.items.iter().zip(&plan).zip(&c.schedules) {
            let member = &item.member;
            if matches!(d, FDisp::Confirmed | FDisp::Kept) {
                // The dead-letter destination has it, whoever holds the letter now.
                self.m.delivered.extend(schedules.iter().copied());
            }
            let owned = self.m.dead.get(member).is_some_and(
                |e| matches!(e.forward, Some(Forward::Leased { claim, .. }) if claim == c.id),
            );
            if !owned {
                bump(&self.tally.forwards_not_owned, 1);
                continue;
            }
            match d {
                FDisp::Confirmed => {
                    let entry = self.m.dead.remove(member).expect("owned");
                    self.m.delivered.extend(entry.schedules);
                    want.confirmed += 1;
                    if let Some(b) = &mut self.m.bodies {
                        if self.m.source.contains_key(member)
                            || self.m.inflight.contains_key(member)
                        {
                            bump(&self.tally.forward_kept_body, 1);
                        } else {
                            b.held.remove(member);
                            bump(&self.tally.forward_dropped_body, 1);
                        }
                    }
                }
                FDisp::Kept => {
                    self.m.dead.get_mut(member).expect("owned").forward = Some(Forward::Refused);
                    want.kept += 1;
                }
                FDisp::Refused => {
                    self.m.dead.get_mut(member).expect("owned").forward = Some(Forward::Refused);
                    want.refused += 1;
                }
                FDisp::Released => {
                    self.m.dead.get_mut(member).expect("owned").forward = None;
                    want.released += 1;
                }
            }
        }
        check_eq!(got, want, "dead-letter settle of claim {} ({plan:?})", c.id);
        bump(&self.tally.forwards_confirmed, want.confirmed);
        bump(&self.tally.forwards_kept, want.kept);
        bump(&self.tally.forwards_refused, want.refused);
        bump(&self.tally.forwards_released, want.released);
        Ok(())
    }

    async fn snapshot(&mut self, skip: &str) -> Snapshot {
        let mut out = Vec::new();
        for key in self.keys.all() {
            if key == skip {
                continue;
            }
            let kind: String = redis::cmd("TYPE")
                .arg(key)
                .query_async(&mut self.conn)
                .await
                .unwrap();
            let cmd = if kind == "hash" { "HGETALL" } else { "ZRANGE" };
            let mut c = redis::cmd(cmd);
            c.arg(key);
            if kind != "hash" {
                c.arg(0).arg(-1).arg("WITHSCORES");
            }
            let entries: Vec<(Vec<u8>, Vec<u8>)> = if kind == "none" {
                Vec::new()
            } else {
                c.query_async(&mut self.conn).await.unwrap()
            };
            out.push((key.to_string(), entries));
        }
        out
    }

    /// Gives `key` the wrong type, runs `script`, and checks that the call failed with a
    /// wrong-type error and that every other key is exactly as it was; then restores `key`.
    async fn wrong_type(&mut self, key: Derived, script: Script) -> Step {
        let target = match key {
            Derived::Source => self.keys.source.clone(),
            Derived::Inflight => self.keys.inflight.clone(),
            Derived::Attempts => self.keys.attempts.clone(),
            Derived::Dead => self.keys.dead.clone(),
            Derived::DeadReasons => self.keys.dead_reasons.clone(),
            Derived::Bodies => self.keys.bodies.clone(),
            Derived::Control => self.keys.control.clone(),
            Derived::DeadInflight => self.keys.dead_inflight.clone(),
        };
        // Every one of these scripts starts with the prelude's `begin()`, which checks the
        // types of all eight keys before the first write: each must fail whatever `key` is.
        // A settle needs a claim to settle.
        let nothing_to_settle = match script {
            Script::Settle => self.m.open.is_empty(),
            Script::DeadSettle => self.m.open_dead.is_empty(),
            _ => false,
        };
        if nothing_to_settle {
            return Ok(());
        }
        let backup = format!("{target}:backup");
        let existed: i64 = redis::cmd("EXISTS")
            .arg(&target)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        if existed == 1 {
            let _: () = redis::cmd("RENAME")
                .arg(&target)
                .arg(&backup)
                .query_async(&mut self.conn)
                .await
                .unwrap();
        }
        let _: () = redis::cmd("SET")
            .arg(&target)
            .arg("not a queue")
            .query_async(&mut self.conn)
            .await
            .unwrap();
        let before = self.snapshot(&target).await;
        let result = match script {
            Script::Claim => self.store.claim(4, LONG_LEASE).await.map(|_| ()),
            Script::Settle => {
                let b = &self.m.open[0];
                // Everything the settle script can do at once: ack, fail, dead-letter, put back.
                let mut s = Settlement::default();
                for (i, c) in b.items.iter().enumerate() {
                    match i % 3 {
                        0 => s.ack.push(&c.member),
                        1 => s.fail.push(Failure {
                            member: &c.member,
                            retry_in: Duration::ZERO,
                            reason: "nack".into(),
                            permanent: i % 2 == 0,
                            detail: None,
                        }),
                        _ => s.put_back.push(c),
                    }
                }
                self.store
                    .settle(b.deadline, self.max_attempts, &s)
                    .await
                    .map(|_| ())
            }
            Script::Recover => self.store.recover(4, Some("0")).await.map(|_| ()),
            Script::Requeue => self.store.requeue_dead(&[], 4).await.map(|_| ()),
            Script::Move => self
                .store
                .reschedule(&[POOL[0].to_vec()], Some(self.base), false)
                .await
                .map(|_| ()),
            Script::Purge => self
                .store
                .purge(Purge::Scheduled {
                    from: None,
                    to: None,
                })
                .await
                .map(|_| ()),
            Script::DeadClaim => self.store.claim_dead(4, LONG_LEASE).await.map(|_| ()),
            Script::Ingest => self
                .store
                .ingest(POOL[0], b"x", Ingest::In(0))
                .await
                .map(|_| ()),
            Script::DeadSettle => {
                let c = &self.m.open_dead[0];
                // Every outcome at once: confirmed, kept, refused, released.
                let mut lists: [Vec<&[u8]>; 4] = Default::default();
                for (i, item) in c.items.iter().enumerate() {
                    lists[i % 4].push(&item.member);
                }
                let [confirmed, kept, refused, released] = lists;
                let outcome = DeadOutcome {
                    confirmed,
                    kept,
                    refused,
                    released,
                };
                self.store
                    .settle_dead(c.deadline, &outcome)
                    .await
                    .map(|_| ())
            }
        };
        let after = self.snapshot(&target).await;
        let _: () = redis::cmd("DEL")
            .arg(&target)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        if existed == 1 {
            let _: () = redis::cmd("RENAME")
                .arg(&backup)
                .arg(&target)
                .query_async(&mut self.conn)
                .await
                .unwrap();
        }
        match result {
            Err(e) => {
                check_eq!(e.kind(), "wrong_type", "error of {script:?} ({e})");
            }
            Ok(()) => {
                return Err(TestCaseError::fail(format!(
                    "{script:?} succeeded while {target} held a string"
                )))
            }
        }
        check!(
            before == after,
            "{script:?} failed on {target} but changed other keys:\n{before:?}\n{after:?}"
        );
        bump(&self.tally.wrong_type, 1);
        Ok(())
    }

    /// The attempts hash: (live entries by member, stale members). An entry is live when its
    /// stamp is the score of the member's scheduled copy or its lease.
    #[allow(clippy::type_complexity)]
    async fn attempt_entries(
        &mut self,
    ) -> Result<(BTreeMap<Vec<u8>, (i64, f64)>, Vec<Vec<u8>>), TestCaseError> {
        let raw: BTreeMap<Vec<u8>, String> = redis::cmd("HGETALL")
            .arg(&self.keys.attempts)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        let mut live = BTreeMap::new();
        let mut stale = Vec::new();
        for (m, v) in raw {
            let Some((count, stamp)) = v.split_once(':') else {
                return Err(TestCaseError::fail(format!("attempt entry {v:?}")));
            };
            let count: i64 = count.parse().expect("a count");
            let stamp = parse_score(stamp.as_bytes());
            let matches = self.m.source.get(&m).is_some_and(|s| s.score == stamp)
                || self
                    .m
                    .inflight
                    .get(&m)
                    .is_some_and(|l| l.deadline as f64 == stamp);
            if matches {
                live.insert(m, (count, stamp));
            } else {
                stale.push(m);
            }
        }
        Ok((live, stale))
    }

    /// Redis holds exactly the model's state, and every schedule is accounted for.
    async fn verify(&mut self) -> Step {
        let keys = self.keys.clone();
        let source: BTreeMap<Vec<u8>, f64> = self.zrange(&keys.source).await.into_iter().collect();
        let want: BTreeMap<Vec<u8>, f64> = self
            .m
            .source
            .iter()
            .map(|(m, s)| (m.clone(), s.score))
            .collect();
        check_eq!(source, want, "scheduled set");

        let inflight: BTreeMap<Vec<u8>, f64> =
            self.zrange(&keys.inflight).await.into_iter().collect();
        let want: BTreeMap<Vec<u8>, f64> = self
            .m
            .inflight
            .iter()
            .map(|(m, l)| (m.clone(), l.deadline as f64))
            .collect();
        check_eq!(inflight, want, "in-flight set");

        let dead: BTreeMap<Vec<u8>, f64> = self.zrange(&keys.dead).await.into_iter().collect();
        let want: BTreeMap<Vec<u8>, f64> = self
            .m
            .dead
            .iter()
            .map(|(m, e)| (m.clone(), e.score()))
            .collect();
        check_eq!(dead, want, "dead-letter set");

        // Forwarding leases: one per dead letter a forward holds, until its deadline, none
        // for a refused one (its dead-letter score is `+inf` instead), none without its dead
        // letter.
        let leases: BTreeMap<Vec<u8>, f64> =
            self.zrange(&keys.dead_inflight).await.into_iter().collect();
        for m in leases.keys() {
            check!(
                dead.contains_key(m),
                "{m:?} leased in {} but not a dead letter",
                keys.dead_inflight
            );
        }
        let want: BTreeMap<Vec<u8>, f64> = self
            .m
            .dead
            .iter()
            .filter_map(|(m, e)| Some((m.clone(), e.forward?.lease()?)))
            .collect();
        check_eq!(leases, want, "forwarding leases");

        // Failed-attempt counts: every copy that carries failures has its live entry.
        let (live, _stale) = self.attempt_entries().await?;
        let live: BTreeMap<Vec<u8>, i64> = live.into_iter().map(|(m, (c, _))| (m, c)).collect();
        let mut want: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
        for (m, s) in &self.m.source {
            if s.failures > 0 {
                want.insert(m.clone(), s.failures);
            }
        }
        for (m, l) in &self.m.inflight {
            if l.failures > 0 {
                check!(
                    !want.contains_key(m),
                    "{m:?} carries failures both scheduled and in flight"
                );
                want.insert(m.clone(), l.failures);
            }
        }
        check_eq!(live, want, "live attempt entries");

        let reasons: BTreeMap<Vec<u8>, String> = redis::cmd("HGETALL")
            .arg(&keys.dead_reasons)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        let reasons: BTreeMap<Vec<u8>, Reason> = reasons
            .into_iter()
            .map(|(m, json)| (m, parse_reason(&json)))
            .collect();
        let want: BTreeMap<Vec<u8>, Reason> = self
            .m
            .dead
            .iter()
            .map(|(m, e)| (m.clone(), e.reason()))
            .collect();
        check_eq!(reasons, want, "dead-letter reasons");
        self.verify_bodies().await?;
        self.verify_stats().await?;

        // Every schedule a producer started ends delivered at least once, dead-lettered
        // (dead copies hold theirs), or cancelled, or is still held by a copy in Redis.
        let mut held: HashSet<u64> = HashSet::new();
        for s in self.m.source.values() {
            held.extend(&s.schedules);
        }
        for l in self.m.inflight.values() {
            held.extend(&l.schedules);
        }
        for d in self.m.dead.values() {
            held.extend(&d.schedules);
        }
        for id in &self.m.started {
            check!(
                held.contains(id) || self.m.delivered.contains(id) || self.m.cancelled.contains(id),
                "schedule {id} was lost: not delivered, not dead-lettered, not cancelled, and in no set"
            );
        }
        Ok(())
    }

    /// The stats script's one reading agrees with the model: the sizes, the pause, and what
    /// the housekeeping acts on (the earliest lease, the attempt entries to sweep, the dead
    /// letters a forwarder may take).
    async fn verify_stats(&mut self) -> Step {
        let stats = self.store.stats().await.unwrap();
        let attempts: u64 = redis::cmd("HLEN")
            .arg(&self.keys.attempts)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        let m = &self.m;
        check_eq!(
            stats.due + stats.scheduled,
            m.source.len() as u64,
            "stats: scheduled and due"
        );
        check_eq!(stats.inflight, m.inflight.len() as u64, "stats: in flight");
        check_eq!(stats.dead, m.dead.len() as u64, "stats: dead");
        check_eq!(stats.paused, pause_value(&m.paused).0, "stats: paused");
        let earliest = m.inflight.values().map(|l| l.deadline).min();
        check_eq!(stats.earliest_lease_ms, earliest, "stats: earliest lease");
        check_eq!(stats.attempt_entries, attempts, "stats: attempt entries");
        let forwardable = m.dead.values().filter(|e| e.score().is_finite()).count();
        check_eq!(
            stats.dead_forwardable,
            forwardable as u64,
            "stats: dead letters a forwarder may take"
        );
        Ok(())
    }

    /// Hash mode: the bodies hash is as modelled, and it keeps the producer contract however
    /// the scripts get there: a body is held exactly while its id is scheduled, in flight or
    /// dead (no orphan, no loss; only the producer bug queues an id without one), and it is
    /// the latest body written.
    async fn verify_bodies(&mut self) -> Step {
        let Some(b) = &self.m.bodies else {
            return Ok(());
        };
        let held: BTreeMap<Vec<u8>, Vec<u8>> = redis::cmd("HGETALL")
            .arg(&self.keys.bodies)
            .query_async(&mut self.conn)
            .await
            .unwrap();
        let want: BTreeMap<Vec<u8>, Vec<u8>> =
            b.held.iter().map(|(m, v)| (m.clone(), v.clone())).collect();
        check_eq!(held, want, "bodies hash");
        let place = |id: &[u8]| {
            [
                ("scheduled", self.m.source.contains_key(id)),
                ("in flight", self.m.inflight.contains_key(id)),
                ("dead", self.m.dead.contains_key(id)),
            ]
            .into_iter()
            .filter_map(|(name, here)| here.then_some(name))
            .collect::<Vec<_>>()
        };
        for (id, body) in &held {
            check!(
                !place(id).is_empty(),
                "orphan body {body:?}: {id:?} is neither scheduled, in flight nor dead"
            );
            check!(
                b.written.get(id) == Some(body),
                "{id:?} holds {body:?}, but its latest body is {:?}",
                b.written.get(id)
            );
        }
        for id in POOL {
            let at = place(id);
            check!(
                at.is_empty() || held.contains_key(id) || b.bare.contains(id),
                "lost body: {id:?} is {at:?} without one (latest written {:?})",
                b.written.get(id)
            );
        }
        Ok(())
    }
}

async fn run_case(
    conn: &MultiplexedConnection,
    manager: &Conn,
    hash: bool,
    max_attempts: u32,
    ops: &[Op],
    tally: &'static Tally,
) -> Step {
    let key = if rand::random::<bool>() {
        format!("{}:{{m}}", common::unique("model"))
    } else {
        common::unique("model")
    };
    let keys = QueueKeys::derive(&key).unwrap();
    let mut conn = conn.clone();
    let base = common::redis_now(&mut conn).await;
    let store = Store::new(manager.clone(), keys.clone());
    let mut case = Case {
        conn: conn.clone(),
        manager: manager.clone(),
        store: if hash {
            store.with_hash_bodies(ROOMY)
        } else {
            store
        },
        keys: keys.clone(),
        max_attempts,
        base,
        m: Model {
            bodies: hash.then(Bodies::default),
            ..Model::default()
        },
        tally,
    };
    let mut result = Ok(());
    for (i, op) in ops.iter().enumerate() {
        bump(&tally.steps, 1);
        let r = match case.step(op).await {
            Ok(()) => case.verify().await,
            e => e,
        };
        if let Err(e) = r {
            result = Err(TestCaseError::fail(format!("step {i} {op:?}: {e}")));
            break;
        }
    }
    common::cleanup_keys(&mut conn, &key).await;
    let _: () = redis::cmd("DEL")
        .arg(&keys.bodies)
        .query_async(&mut conn)
        .await
        .unwrap();
    result
}

#[test]
fn scripts_agree_with_the_model() {
    run_model(false, case_ops(false));
}

#[test]
fn scripts_agree_with_the_model_in_hash_payload_mode() {
    run_model(true, case_ops(true));
}

/// Runs `MODEL_CASES` cases (256 by default) of steps drawn from `ops`, in hash payload mode
/// or inline.
fn run_model(hash: bool, ops: impl Strategy<Value = Vec<Op>>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (conn, manager) = rt.block_on(async {
        (
            common::redis().await,
            Conn::open(&common::redis_url())
                .await
                .expect("Redis must run on loopback"),
        )
    });
    let tally: &'static Tally = Box::leak(Box::default());
    let cases = std::env::var("MODEL_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(256);
    let started = Instant::now();
    // Another round of fresh cases while a path this test exists for was not taken yet (a
    // rare one can miss a round by chance); three rounds without it fail the test.
    let mut rounds = 0;
    let result = loop {
        rounds += 1;
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&(1u32..5, &ops), |(max_attempts, ops)| {
            rt.block_on(run_case(&conn, &manager, hash, max_attempts, &ops, tally))
        });
        if result.is_err() || rounds == 3 || missing_paths(tally, hash).is_empty() {
            break result;
        }
    };
    let t = tally;
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    eprintln!(
        "model{}: {} steps in {:?} ({rounds} rounds of {cases} cases): claimed {}, skipped in \
         flight {}, acked {}, acks not owned {}, retried {}, dead {}, put back {}, merged {}, \
         not owned {}, recovered {}, swept {}, \
         requeued {}, wrong-type calls {}, claims while paused {}, rate waits {}, claims cut \
         by the rate {}, moved {}, purged {}, browsed {}; forwards: claimed {}, claimed again \
         after expiry {}, confirmed {}, refused {}, kept {}, released {}, settles not owned {}, claims \
         skipping a leased letter {}, claims skipping a refused letter {}, claims while paused {}; \
         stray control writes {}, rate bucket repairs {}",
        if hash { " (hash payloads)" } else { "" },
        get(&t.steps),
        started.elapsed(),
        get(&t.claimed),
        get(&t.skipped_in_flight),
        get(&t.acked),
        get(&t.acks_not_owned),
        get(&t.retried),
        get(&t.dead),
        get(&t.put_back),
        get(&t.merged),
        get(&t.not_owned),
        get(&t.recovered),
        get(&t.swept),
        get(&t.requeued),
        get(&t.wrong_type),
        get(&t.paused_claims),
        get(&t.rate_waits),
        get(&t.cut_by_rate),
        get(&t.moved),
        get(&t.purged),
        get(&t.browsed),
        get(&t.forward_claimed),
        get(&t.forward_reclaimed),
        get(&t.forwards_confirmed),
        get(&t.forwards_refused),
        get(&t.forwards_kept),
        get(&t.forwards_released),
        get(&t.forwards_not_owned),
        get(&t.forward_skipped_leased),
        get(&t.forward_skipped_refused),
        get(&t.forward_claims_paused),
        get(&t.stray_writes),
        get(&t.bucket_repairs),
    );
    if hash {
        eprintln!(
            "bodies: claimed {}, missing {}, claims cut by the budget {}, dropped by an ack {}, \
             kept by an ack {}, dropped by a cancel {}, kept by a cancel {}, dropped by a \
             forward {}, kept by a forward {}, forwarded without one {}; ingests: stored {}, \
             already held {}, dead-lettered {}",
            get(&t.bodies_claimed),
            get(&t.missing_claimed),
            get(&t.cut_by_budget),
            get(&t.ack_dropped_body),
            get(&t.ack_kept_body),
            get(&t.cancel_dropped_body),
            get(&t.cancel_kept_body),
            get(&t.forward_dropped_body),
            get(&t.forward_kept_body),
            get(&t.forward_missing_body),
            get(&t.ingest_stored),
            get(&t.ingest_duplicates),
            get(&t.ingest_dead),
        );
    }
    if let Err(e) = result {
        panic!("{e}");
    }
    let missing = missing_paths(t, hash);
    assert!(
        missing.is_empty(),
        "no {missing:?} in {rounds} rounds of {cases} cases"
    );
}

/// The paths this test exists for that no step has taken yet.
fn missing_paths(t: &Tally, hash: bool) -> Vec<&'static str> {
    let mut paths = vec![
        ("claims", &t.claimed),
        ("in-flight skips", &t.skipped_in_flight),
        ("acks of a lost lease", &t.acks_not_owned),
        ("merges", &t.merged),
        ("wrong-type calls", &t.wrong_type),
        ("claims while paused", &t.paused_claims),
        ("claims that waited for the rate", &t.rate_waits),
        ("claims cut by the rate", &t.cut_by_rate),
        ("stray control writes", &t.stray_writes),
        ("rate bucket repairs", &t.bucket_repairs),
        ("operator moves", &t.moved),
        ("purged members", &t.purged),
        ("browsed members", &t.browsed),
        ("forward claims", &t.forward_claimed),
        ("forwards claimed again after expiry", &t.forward_reclaimed),
        ("forwards confirmed", &t.forwards_confirmed),
        ("forwards refused", &t.forwards_refused),
        ("forwards kept", &t.forwards_kept),
        ("forwards released", &t.forwards_released),
        ("forward settles not owned", &t.forwards_not_owned),
        (
            "forward claims skipping a leased letter",
            &t.forward_skipped_leased,
        ),
        (
            "forward claims skipping a refused letter",
            &t.forward_skipped_refused,
        ),
        ("forward claims while paused", &t.forward_claims_paused),
    ];
    if hash {
        paths.extend([
            ("claims of a missing body", &t.missing_claimed),
            ("claims cut by the budget", &t.cut_by_budget),
            ("bodies kept by an ack", &t.ack_kept_body),
            ("bodies dropped by a cancel", &t.cancel_dropped_body),
            ("bodies dropped by a forward", &t.forward_dropped_body),
            ("ingests stored", &t.ingest_stored),
            ("ingests of an id already held", &t.ingest_duplicates),
            ("ingests dead-lettered", &t.ingest_dead),
        ]);
    }
    paths
        .into_iter()
        .filter(|(_, c)| c.load(Ordering::Relaxed) == 0)
        .map(|(what, _)| what)
        .collect()
}

/// A count that went stale when the producer moved its copy counts again when the producer
/// writes the stamped score back (an entry belongs to the copy whose score it names).
#[tokio::test]
async fn a_stale_count_counts_again_when_its_score_comes_back() {
    let conn = common::redis().await;
    let manager = Conn::open(&common::redis_url())
        .await
        .expect("Redis must run on loopback");
    let tally: &'static Tally = Box::leak(Box::default());
    let schedule = |when| Op::Schedule { member: 0, when };
    let ops = [
        schedule(When::Past(0)),
        Op::Claim {
            batch: 1,
            short: true,
        },
        // The lease expires once the Redis clock passes the claim's millisecond.
        Op::Recover { limit: 1 },
        Op::Recover { limit: 1 },
        // One failed attempt, moved with the copy by the operator.
        Op::Move {
            member: 0,
            when: When::Past(1),
            earlier: false,
        },
        schedule(When::Future(0)),
        schedule(When::Past(1)),
        Op::Claim {
            batch: 1,
            short: false,
        },
    ];
    run_case(&conn, &manager, false, 3, &ops, tally)
        .await
        .unwrap();
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    assert_eq!(get(&tally.recovered), 1, "the expired lease was recovered");
    assert_eq!(get(&tally.moved), 1, "the operator moved the copy");
}
