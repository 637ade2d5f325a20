//! After every step: Redis holds exactly the model's state.

use super::*;

impl Case {
    /// The attempts hash: (live entries by member, stale members). An entry is live when its
    /// stamp is the score of the member's scheduled copy or its lease.
    #[allow(clippy::type_complexity)]
    pub(super) async fn attempt_entries(
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
    pub(super) async fn verify(&mut self) -> Step {
        self.verify_sets().await?;
        self.verify_attempts_and_reasons().await?;
        self.verify_bodies().await?;
        self.verify_stats().await?;
        self.verify_schedules()
    }

    /// The scheduled, in-flight and dead-letter sets, and the forwarding leases.
    async fn verify_sets(&mut self) -> Step {
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
        let want = self.m.dead_with(DeadEntry::score);
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
        Ok(())
    }

    /// The live failed-attempt counts, and the dead letters' reasons.
    async fn verify_attempts_and_reasons(&mut self) -> Step {
        let keys = self.keys.clone();
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
        let want = self.m.dead_with(DeadEntry::reason);
        check_eq!(reasons, want, "dead-letter reasons");
        Ok(())
    }

    /// Every schedule a producer started is accounted for.
    fn verify_schedules(&self) -> Step {
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
    pub(super) async fn verify_stats(&mut self) -> Step {
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
    pub(super) async fn verify_bodies(&mut self) -> Step {
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
