//! The crate's one source of randomness: a per-thread SplitMix64 sequence
//! seeded from the OS once, for claims' fencing tokens
//! ([`Attempt`](crate::store::Attempt)) and references' operation tags
//! ([`Reference`](crate::store::Reference)). Drawing a value costs no system
//! call.

use std::time::SystemTime;

/// A random 64-bit value, never zero (zero is kept free so that stores may
/// use it as "none"). Within a thread the sequence never repeats a value
/// (SplitMix64 is a bijection of its counter); across threads the seeds are
/// independent random 64-bit values.
pub(crate) fn nonzero_u64() -> u64 {
    let x = STATE.with(|s| {
        let next = s.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        s.set(next);
        next
    });
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    z.max(1)
}

thread_local! {
    /// This thread's SplitMix64 counter.
    static STATE: std::cell::Cell<u64> = std::cell::Cell::new(seed());
}

/// Restarts this thread's sequence from `seed`, so that a single-threaded
/// simulation replays exactly. For tests only: two threads seeded alike
/// draw the same values.
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
