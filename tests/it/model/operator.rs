//! The operator's steps: move, browse, purge, purge by reason, pause and stray control writes.

use super::*;

impl Case {
    /// The operator's reschedule (promote with `earlier`): only a scheduled member moves,
    /// and its attempt count moves with it.
    pub(super) async fn move_due(&mut self, member: &[u8], when: When, earlier: bool) -> Step {
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
    pub(super) async fn browse(&mut self, limit: usize) -> Step {
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
    pub(super) async fn purge(&mut self, dead: bool, to: When) -> Step {
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
    pub(super) async fn purge_reason(&mut self, which: usize, dry_run: bool) -> Step {
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
    pub(super) fn purged(&mut self, gone: &[Vec<u8>], dead: bool) {
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
    pub(super) async fn pause(&mut self, on: bool) -> Step {
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
    pub(super) async fn stray(&mut self, field: usize, value: usize) -> Step {
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
}
