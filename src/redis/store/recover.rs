//! Leases that expired go back to the source set, and stale attempt entries are swept (`recover.lua`).

use super::{Store, StoreError, SCRIPTS};

/// What one recover call did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Members whose expired lease went back to the source set.
    pub recovered: u64,
    /// Where the sweep of stale attempt entries goes on (`"0"`: a pass just ended).
    pub cursor: String,
    /// Stale attempt entries removed.
    pub swept: u64,
}

impl Store {
    /// Moves up to `limit` members with an expired lease back to the source set, then
    /// sweeps one page of stale attempt entries from `sweep` (a cursor, `"0"` to start a
    /// pass; `None` sweeps nothing).
    pub async fn recover(
        &self,
        limit: usize,
        sweep: Option<&str>,
    ) -> Result<Recovered, StoreError> {
        let mut conn = self.conn.clone();
        let (recovered, cursor, swept): (u64, String, u64) = self
            .keyed(&SCRIPTS.recover)
            .arg(limit)
            .arg(sweep.unwrap_or(""))
            .invoke_async(&mut conn)
            .await?;
        Ok(Recovered {
            recovered,
            cursor,
            swept,
        })
    }
}
