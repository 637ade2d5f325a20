//! A trigger's held state as every bridge and tool sees it: `K:held`, written with an expiry while a bridge finds the trigger's destination failing.

use std::time::Duration;

use super::{Store, StoreError};

/// What a bridge that holds the trigger's destination wrote: why, and since when.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HeldNote {
    /// What the broker or endpoint said, naming the destination.
    pub reason: String,
    /// When the hold started, epoch ms (the bridge's clock).
    pub since_ms: i64,
}

impl Store {
    /// Notes that the destination is held, for `ttl` unless written again: a bridge that
    /// stops leaves no hold behind for long.
    pub async fn mark_held(&self, note: &HeldNote, ttl: Duration) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let value = serde_json::to_string(note).unwrap_or_default();
        let () = redis::cmd("SET")
            .arg(&self.keys.held)
            .arg(value)
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// The destination takes messages again.
    pub async fn clear_held(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: i64 = redis::cmd("DEL")
            .arg(&self.keys.held)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// The hold a bridge noted, if any (an unreadable note reads as none).
    pub async fn held(&self) -> Result<Option<HeldNote>, StoreError> {
        let mut conn = self.conn.clone();
        let value: Option<String> = redis::cmd("GET")
            .arg(&self.keys.held)
            .query_async(&mut conn)
            .await?;
        Ok(value.and_then(|v| serde_json::from_str(&v).ok()))
    }
}
