//! Per-subgroup counters and batch-size histograms (spindle Fig. 7).
//! Fixed size, no allocation when recording.

use serde::Serialize;

/// Batch sizes in power-of-two buckets: bucket `i` counts batches of size
/// in `[2^i, 2^(i+1))`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BatchHistogram {
    /// Counts per bucket.
    pub buckets: [u64; 24],
    /// Number of batches.
    pub batches: u64,
    /// Sum of batch sizes.
    pub items: u64,
    /// Largest batch.
    pub max: u64,
}

impl BatchHistogram {
    /// Records one batch of `size ≥ 1`.
    #[inline]
    pub fn record(&mut self, size: u64) {
        debug_assert!(size >= 1);
        let b = (63 - size.max(1).leading_zeros() as usize).min(self.buckets.len() - 1);
        self.buckets[b] += 1;
        self.batches += 1;
        self.items += size;
        self.max = self.max.max(size);
    }

    /// Mean batch size (0 with no batches).
    pub fn mean(&self) -> f64 {
        if self.batches == 0 { 0.0 } else { self.items as f64 / self.batches as f64 }
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &BatchHistogram) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += b;
        }
        self.batches += other.batches;
        self.items += other.items;
        self.max = self.max.max(other.max);
    }
}

/// What one member's engine did in one subgroup.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SubgroupStats {
    /// Application messages this member published.
    pub messages_sent: u64,
    /// Their payload bytes.
    pub bytes_sent: u64,
    /// Null rounds this member sent (spindle §III-B).
    pub nulls_sent: u64,
    /// Slots used to carry nulls (each carries a count).
    pub null_slots: u64,
    /// Application messages delivered to this member.
    pub messages_delivered: u64,
    /// Their payload bytes.
    pub bytes_delivered: u64,
    /// Pushes emitted (each becomes one write per peer).
    pub pushes: u64,
    /// Writes those pushes amount to (pushes × peers).
    pub writes: u64,
    /// Messages per send push.
    pub send_batches: BatchHistogram,
    /// Messages per receive-predicate batch (all senders).
    pub receive_batches: BatchHistogram,
    /// Messages (application and null rounds) per delivery batch.
    pub delivery_batches: BatchHistogram,
}
