//! One case: its Redis connection and store, the model beside it, and how a step is run and read.

use super::*;

impl Case {
    pub(super) async fn now(&mut self) -> i64 {
        common::redis_now(&mut self.conn).await
    }

    pub(super) async fn zrange(&mut self, key: &str) -> Vec<(Vec<u8>, f64)> {
        redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut self.conn)
            .await
            .unwrap()
    }

    pub(super) async fn zscore(&mut self, key: &str, member: &[u8]) -> Option<f64> {
        redis::cmd("ZSCORE")
            .arg(key)
            .arg(member)
            .query_async(&mut self.conn)
            .await
            .unwrap()
    }

    /// Adopts the score a script gave `member` from the Redis clock, after checking it lies
    /// between the clock readings around the call.
    pub(super) async fn adopt_score(
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

    pub(super) async fn step(&mut self, op: &Op) -> Step {
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
            Op::EarlyAck { which, take } => self.early_ack(*which, *take).await,
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
}

pub(super) async fn run_case(
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
