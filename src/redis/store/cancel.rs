//! A message scheduled under an id cancelled with the producers' own script (`cancel.lua`).

use super::{Store, StoreError, SCRIPTS};

impl Store {
    /// Cancels the message scheduled under `id` (hash payload mode) with the producers'
    /// cancel script; returns whether it was scheduled.
    pub async fn cancel_by_id(&self, id: &[u8]) -> Result<bool, StoreError> {
        let mut conn = self.conn.clone();
        let removed: i64 = SCRIPTS
            .cancel
            .key(&self.keys.source)
            .key(&self.keys.inflight)
            .key(&self.keys.dead)
            .key(&self.keys.bodies)
            .arg(id)
            .invoke_async(&mut conn)
            .await?;
        Ok(removed == 1)
    }
}
