//! The fencing token a claim owns its record with.

use std::time::SystemTime;

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

    /// A new random attempt: a per-thread SplitMix64 sequence seeded from the
    /// OS once, so drawing one costs no system call. Within a thread the
    /// sequence never repeats a value (SplitMix64 is a bijection of its
    /// counter); across threads the seeds are independent random 64-bit
    /// values.
    pub fn random() -> Self {
        let x = STATE.with(|s| {
            let next = s.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
            s.set(next);
            next
        });
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // Zero is kept free so that stores may use it as "no attempt".
        Attempt(z.max(1))
    }
}

thread_local! {
    /// This thread's SplitMix64 counter: attempts and reference tags.
    static STATE: std::cell::Cell<u64> = std::cell::Cell::new(seed());
}

/// Restarts this thread's sequence of attempts and reference tags from
/// `seed`, so that a single-threaded simulation replays exactly. For tests
/// only: two threads seeded alike draw the same tokens.
#[cfg(feature = "conformance")]
pub(crate) fn seed_this_thread(seed: u64) {
    STATE.with(|s| s.set(seed));
}

fn seed() -> u64 {
    let mut b = [0u8; 8];
    // getrandom only fails where the OS has no entropy source; a clock-,
    // thread- and address-mixed fallback still differs between threads.
    if getrandom::fill(&mut b).is_err() {
        let t = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        let here = &b as *const _ as u64;
        b = (t ^ here.rotate_left(32)).to_le_bytes();
    }
    u64::from_le_bytes(b)
}
