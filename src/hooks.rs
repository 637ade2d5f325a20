//! What only the benchmark reaches (the `bench-hooks` feature): the scripts' ceiling.

use crate::proof::Confirmed;
use crate::redis::store::{ClaimBatch, Settled, Settlement, Store, StoreError};

/// Acks every member of `batch` without anything having been published, in one settle
/// call: what the claim and settle scripts alone can do, the benchmark's Redis ceiling.
/// Never part of delivery (the daemon's builds leave this module out).
pub async fn ack_unpublished(
    store: &Store,
    batch: &ClaimBatch,
    max_attempts: u32,
) -> Result<Settled, StoreError> {
    let mut s = Settlement::for_batch(batch.items.len());
    for c in &batch.items {
        s.ack(&c.member, Confirmed::unpublished());
    }
    store.settle(batch.deadline_ms, max_attempts, &s).await
}
