//! Schedules added at run time: their definitions (JSON, by name) in the hash
//! `K:schedules:defs` beside the marks, and a counter moved by every change: the score of the
//! one member of the sorted set `K:schedules:rev`, so that the keyspace notifications the
//! bridges already hear (sorted-set events) tell them of a change.

use redis::AsyncCommands;

use super::{Store, StoreError};

impl Store {
    /// The hash of the schedules added at run time (`K:schedules:defs`): name -> JSON.
    pub fn schedule_defs_key(&self) -> String {
        format!("{}:defs", self.schedules_key())
    }

    /// The sorted set whose one score counts the run-time schedule changes (`K:schedules:rev`).
    pub fn schedule_rev_key(&self) -> String {
        format!("{}:rev", self.schedules_key())
    }

    /// The counter of run-time schedule changes (0 before the first).
    pub async fn schedule_rev(&self) -> Result<i64, StoreError> {
        let mut conn = self.conn.clone();
        let rev: Option<f64> = conn.zscore(self.schedule_rev_key(), "rev").await?;
        Ok(rev.unwrap_or(0.0) as i64)
    }

    /// The run-time schedules: name and JSON definition, by name.
    pub async fn schedule_defs(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut conn = self.conn.clone();
        let mut defs: Vec<(String, Vec<u8>)> = conn.hgetall(self.schedule_defs_key()).await?;
        defs.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(defs)
    }

    /// Stores run-time schedule `name` unless one of that name is stored; true if stored.
    pub async fn add_schedule_def(&self, name: &str, json: &[u8]) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let added: bool = conn.hset_nx(self.schedule_defs_key(), name, json).await?;
        if added {
            // A new schedule starts from its next tick, whatever an older one of its name did.
            let _: () = conn.hdel(self.schedules_key(), name).await?;
            let _: f64 = conn.zincr(self.schedule_rev_key(), "rev", 1).await?;
        }
        Ok(added)
    }

    /// Removes run-time schedule `name` and its mark (a tick already enqueued still fires);
    /// true if it was stored.
    pub async fn remove_schedule_def(&self, name: &str) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let removed: bool = conn.hdel(self.schedule_defs_key(), name).await?;
        if removed {
            let _: f64 = conn.zincr(self.schedule_rev_key(), "rev", 1).await?;
            let _: () = conn.hdel(self.schedules_key(), name).await?;
        }
        Ok(removed)
    }
}
