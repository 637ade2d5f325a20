//! Dead letters: requeue, and the forwarder's claim and settle.

use super::*;

impl Case {
    pub(super) async fn requeue(&mut self, members: &[usize], limit: usize) -> Step {
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
    pub(super) fn dead_body(&self, member: &[u8]) -> Body {
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
    pub(super) async fn forward_claim(&mut self, limit: usize, short: bool) -> Step {
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
    pub(super) async fn forward_settle(&mut self, which: usize, disp: &[FDisp]) -> Step {
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
}
