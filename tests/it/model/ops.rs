//! The steps a case draws: what a producer, a worker, a forwarder and an operator do, and their strategies.

use super::*;

#[derive(Debug, Clone, Copy)]
pub(super) enum When {
    /// Overdue by `1 + k` seconds.
    Past(u8),
    /// Due in an hour plus `k` seconds.
    Future(u8),
    NegInf,
    PosInf,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Disp {
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
pub(super) enum FDisp {
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
pub(super) enum Derived {
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
pub(super) enum Script {
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
pub(super) enum HowIngest {
    /// Due in this many ms from now on the Redis clock (negative: now).
    In(i64),
    /// Due at the score `when` stands for (finite ones only).
    At(When),
    /// Refused: a dead letter with the reason [`INGEST_REASONS`]`[i]`.
    Dead(usize),
}

/// The reasons an ingress dead-letters with, and their details.
pub(super) const INGEST_REASONS: [(&str, &str); 2] = [
    ("bad_delay", "x-delay: `soon` is not a number"),
    ("too_large", ""),
];

/// Hash mode: the body a producer writes.
#[derive(Debug, Clone, Copy)]
pub(super) enum Payload {
    /// `id#version` and `pad` more bytes: every write is told apart from the others.
    Versioned(u8),
    Empty,
}

#[derive(Debug, Clone)]
pub(super) enum Op {
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
    /// Acks the first members of one open batch (picked by index), leaving it open with the
    /// rest, as a worker does while the broker confirms a batch.
    EarlyAck {
        which: usize,
        take: usize,
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

pub(super) fn when() -> impl Strategy<Value = When> {
    prop_oneof![
        4 => (0u8..4).prop_map(When::Past),
        2 => (0u8..4).prop_map(When::Future),
        1 => Just(When::NegInf),
        1 => Just(When::PosInf),
    ]
}

pub(super) fn disp() -> impl Strategy<Value = Disp> {
    prop_oneof![
        4 => Just(Disp::Ack),
        2 => Just(Disp::Retry),
        1 => Just(Disp::RetryLater),
        1 => Just(Disp::Dead),
        2 => Just(Disp::PutBack),
    ]
}

/// Dispositions of a forwarding case's settles: most fail for good, making dead letters.
pub(super) fn failing_disp() -> impl Strategy<Value = Disp> {
    prop_oneof![
        2 => Just(Disp::Ack),
        1 => Just(Disp::Retry),
        4 => Just(Disp::Dead),
        1 => Just(Disp::PutBack),
    ]
}

/// Outcomes of forwarded dead letters.
pub(super) fn fdisp() -> impl Strategy<Value = FDisp> {
    prop_oneof![
        3 => Just(FDisp::Confirmed),
        1 => Just(FDisp::Kept),
        2 => Just(FDisp::Refused),
        2 => Just(FDisp::Released),
    ]
}

/// Dead-letter claim limits: mostly fewer than the pool holds, now and then none, or more
/// than the script's cap.
pub(super) fn forward_limit() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => Just(0usize),
        8 => 1usize..4,
        1 => Just(FORWARD_CAP + 500),
    ]
}

/// Any key but the bodies hash (inline mode has none), each as likely.
pub(super) fn derived() -> impl Strategy<Value = Derived> {
    use Derived::*;
    proptest::sample::select(vec![
        Source,
        Inflight,
        Attempts,
        Dead,
        DeadReasons,
        Control,
        DeadInflight,
    ])
}

pub(super) fn script() -> impl Strategy<Value = Script> {
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

pub(super) fn hash_derived() -> impl Strategy<Value = Derived> {
    prop_oneof![derived(), Just(Derived::Bodies)]
}

/// Hash mode: the scripts a wrong-typed key is tried with, the ingress's store included.
pub(super) fn hash_script() -> impl Strategy<Value = Script> {
    prop_oneof![8 => script(), 1 => Just(Script::Ingest)]
}

pub(super) fn how_ingest() -> impl Strategy<Value = HowIngest> {
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

pub(super) fn payload() -> impl Strategy<Value = Payload> {
    prop_oneof![
        6 => (0u8..12).prop_map(Payload::Versioned),
        1 => Just(Payload::Empty),
    ]
}

/// Budgets around the size of one body, so that claims are often cut short.
pub(super) fn budget() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => Just(1usize),
        3 => 4usize..24,
        1 => Just(ROOMY),
    ]
}

/// The steps of a hash-mode case: those of an inline one, the producer's per its contract.
pub(super) fn hash_op() -> impl Strategy<Value = Op> {
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
        30 => worker_and_operator_op(),
        1 => (hash_derived(), hash_script()).prop_map(|(key, script)| Op::WrongType { key, script }),
    ]
}

/// The steps both modes share, weighted among themselves (30 in all): settling, early acks, lease
/// expiry and recovery, rate-limited claims, forwarding dead letters, and the operator's
/// commands.
pub(super) fn worker_and_operator_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<usize>(), vec(disp(), 1..4)).prop_map(|(which, disp)| Op::Settle { which, disp }),
        2 => (any::<usize>(), 1usize..4).prop_map(|(which, take)| Op::EarlyAck { which, take }),
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
pub(super) fn mode_op(hash: bool) -> BoxedStrategy<Op> {
    if hash {
        hash_op().boxed()
    } else {
        op().boxed()
    }
}

/// A producer's step in the payload mode: its transaction in hash mode, a `ZADD` inline.
pub(super) fn produce_op(hash: bool) -> BoxedStrategy<Op> {
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
pub(super) fn forwarding_op(hash: bool) -> impl Strategy<Value = Op> {
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
pub(super) fn case_ops(hash: bool) -> impl Strategy<Value = Vec<Op>> {
    prop_oneof![
        3 => vec(mode_op(hash), 1..48),
        1 => vec(forwarding_op(hash), 1..48),
    ]
}

pub(super) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..POOL.len(), when()).prop_map(|(member, when)| Op::Schedule { member, when }),
        1 => (0..POOL.len()).prop_map(|member| Op::Cancel { member }),
        4 => (1usize..5, any::<bool>()).prop_map(|(batch, short)| Op::Claim { batch, short }),
        30 => worker_and_operator_op(),
        1 => (derived(), script()).prop_map(|(key, script)| Op::WrongType { key, script }),
    ]
}
