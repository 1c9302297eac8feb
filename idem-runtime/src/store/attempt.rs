//! The fencing token a claim owns its record with.

/// The fencing token of one claim. Every claim draws a fresh random one, so
/// a worker that lost its claim (its lease ran out, the record was taken over
/// or purged and claimed again) can never complete, release or mark the new
/// owner's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Attempt(u64);

impl Attempt {
    /// The attempt as a store keeps it (an unsigned 64-bit value, never zero
    /// for a drawn attempt).
    pub fn get(self) -> u64 {
        self.0
    }

    /// The attempt a store read back from where it kept it; only a store
    /// should build one this way.
    pub fn from_stored(value: u64) -> Self {
        Attempt(value)
    }

    /// A new random attempt, from the crate's per-thread sequence
    /// (`random::nonzero_u64`): never zero, never repeated within a thread.
    pub fn random() -> Self {
        Attempt(crate::random::nonzero_u64())
    }
}
