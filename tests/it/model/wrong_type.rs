//! A script run while a key holds the wrong type: it fails and changes nothing.

use super::*;

use delay_bridge::parts::redis::store::StoreError;

impl Case {
    pub(super) async fn snapshot(&mut self, skip: &str) -> Snapshot {
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
    pub(super) async fn wrong_type(&mut self, key: Derived, script: Script) -> Step {
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
            self.rename(&target, &backup).await;
        }
        let _: () = redis::cmd("SET")
            .arg(&target)
            .arg("not a queue")
            .query_async(&mut self.conn)
            .await
            .unwrap();
        let before = self.snapshot(&target).await;
        let result = self.run_script(script).await;
        let after = self.snapshot(&target).await;
        if existed == 1 {
            // The key back in place of the string.
            self.rename(&backup, &target).await;
        } else {
            let _: () = redis::cmd("DEL")
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

    /// Renames `from` to `to`.
    async fn rename(&mut self, from: &str, to: &str) {
        let _: () = redis::cmd("RENAME")
            .arg(from)
            .arg(to)
            .query_async(&mut self.conn)
            .await
            .unwrap();
    }

    /// Runs `script` through the store, with arguments that would make it write.
    async fn run_script(&mut self, script: Script) -> Result<(), StoreError> {
        match script {
            Script::Claim => self.store.claim(4, LONG_LEASE).await.map(|_| ()),
            Script::Settle => {
                let b = &self.m.open[0];
                // Everything the settle script can do at once: ack, fail, dead-letter, put back.
                let mut s = Settlement::for_batch(b.items.len());
                for (i, c) in b.items.iter().enumerate() {
                    match i % 3 {
                        0 => s.ack(&c.member, Confirmed::unpublished()),
                        1 => s.fail(Failure {
                            member: &c.member,
                            retry_in: Duration::ZERO,
                            reason: "nack".into(),
                            permanent: i % 2 == 0,
                            detail: None,
                        }),
                        _ => s.put_back(c),
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
        }
    }
}
