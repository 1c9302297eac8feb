//! What the store benches share: requests and latency statistics.
#![allow(dead_code)]

use std::time::Duration;

use idem_runtime::{Attempt, ClaimRequest, IdempotencyKey};

/// A claim of a fresh random key, as the executor would make it.
pub fn request() -> ClaimRequest {
    let mut key = [0u8; 32];
    for chunk in key.chunks_mut(8) {
        chunk.copy_from_slice(&Attempt::random().0.to_le_bytes());
    }
    let mut fingerprint = key;
    fingerprint.reverse();
    ClaimRequest {
        key: IdempotencyKey::from_parts(key, fingerprint),
        tenant: "acme".into(),
        tool: "charge_card".into(),
        attempt: Attempt::random(),
        lease: Duration::from_secs(30),
        window: Duration::from_secs(900),
        retention: Duration::from_secs(48 * 3600),
    }
}

/// A typical small response.
pub const RESPONSE: &str =
    r#"{"charge_id":"ch_3f9a0c1d2e4b5a69","amount_cents":1999,"status":"succeeded"}"#;

/// Median and p99 of a sample, in microseconds.
pub fn median_p99(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1e6
    };
    (at(0.5), at(0.99))
}
