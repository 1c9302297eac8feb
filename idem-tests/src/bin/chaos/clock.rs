//! The clock nemesis: each replica runs under a wall clock of its own, off
//! the machine's by an offset drawn from the seed and, with drift, running
//! at a rate of its own, through libfaketime preloaded into the replica's
//! process (Debian's `libfaketime`, installed by `scripts/libfaketime`).
//!
//! Only the wall clock is faked: Rust's `SystemTime::now()` is
//! `clock_gettime(CLOCK_REALTIME)`, which libfaketime answers, and
//! `Instant::now()` (tokio's timers, the executor's timeouts) is
//! `clock_gettime(CLOCK_MONOTONIC)`, left alone with
//! `FAKETIME_DONT_FAKE_MONOTONIC`, as NTP leaves it alone on a real host.
//! Each replica's clock is then read from outside, from its answers'
//! `Date` header, so a preload that did not take stops the run instead of
//! passing it unskewed.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::clients::Rng;

/// One replica's clock: how far it is off the machine's when the process
/// starts, and how fast it runs.
#[derive(Clone, Copy, Debug)]
pub struct Skew {
    /// Its offset at the process's start, in ms (positive: ahead).
    pub offset_ms: i64,
    /// How much faster than the machine's it runs, in parts per million
    /// (0: no drift).
    pub drift_ppm: i64,
}

impl Skew {
    /// libfaketime's `FAKETIME`: `+0.200`, or `-0.150 x1.000400` with drift.
    fn spec(&self) -> String {
        let offset = format!("{:+.3}", self.offset_ms as f64 / 1000.0);
        if self.drift_ppm == 0 {
            offset
        } else {
            format!("{offset} x{:.6}", 1.0 + self.drift_ppm as f64 / 1e6)
        }
    }

    /// The environment that runs a process under this clock, with the
    /// preload at `lib`.
    pub fn env(&self, lib: &Path) -> Vec<(String, String)> {
        [
            ("LD_PRELOAD", lib.display().to_string()),
            ("FAKETIME", self.spec()),
            // The monotonic clock stays the machine's: tokio's timers and
            // every timeout run on it, and a real host's skew is the wall
            // clock's only.
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".into()),
            // The spec is read at every call, never from a 10 s cache.
            ("FAKETIME_NO_CACHE", "1".into()),
            // Files' times stay real: the skew is the clock's, not the disk's.
            ("NO_FAKE_STAT", "1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }
}

/// The clocks of `replicas` replicas, drawn from `seed`, none off by more
/// than `max_ms` in the life of a process (`lifetime`): one replica ahead
/// by `max_ms` and another behind by as much (so two replicas differ by
/// twice the flag), the others anywhere between. With `drift`, each clock
/// runs from its offset to another drawn in the same range over
/// `lifetime`; a restarted replica starts again from its offset.
pub fn draw(replicas: usize, max_ms: u64, drift: bool, lifetime: Duration, seed: u64) -> Vec<Skew> {
    let mut rng = Rng::new(seed ^ 0x0063_6c6f_636b);
    let max = max_ms as i64;
    let within = |rng: &mut Rng| rng.below(2 * max_ms + 1) as i64 - max;
    let ahead = rng.below(replicas as u64) as usize;
    let behind = (ahead + 1 + rng.below(replicas as u64 - 1) as usize) % replicas;
    (0..replicas)
        .map(|r| {
            let offset_ms = match r {
                _ if max == 0 => 0,
                _ if r == ahead => max,
                _ if r == behind => -max,
                _ => within(&mut rng),
            };
            let drift_ppm = if drift && max > 0 {
                (within(&mut rng) - offset_ms) * 1_000_000 / lifetime.as_millis().max(1) as i64
            } else {
                0
            };
            Skew {
                offset_ms,
                drift_ppm,
            }
        })
        .collect()
}

/// A replica's clock as seen from outside: its offset from this process's
/// clock, in ms, and the half-width of the interval it lies in.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    pub offset_ms: f64,
    pub within_ms: f64,
}

fn unix_s(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// Reads the clock of the HTTP server at `base` (`http://host:port`) from
/// the `Date` header of its answers: hyper renders it from
/// `SystemTime::now()` and renews it when the second turns, so the answer
/// where the date first moves to second *s* puts the server's clock at *s*
/// between the request before it left and this answer came. Up to 3 s of
/// requests, back to back.
pub async fn observe(base: String) -> Result<Seen, String> {
    let client = reqwest::Client::new();
    let mut before: Option<(f64, i64)> = None;
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        let sent = unix_s(SystemTime::now());
        let answer = client
            .get(format!("{base}/"))
            .send()
            .await
            .map_err(|e| format!("{base}: {e}"))?;
        let came = unix_s(SystemTime::now());
        let date = answer
            .headers()
            .get("date")
            .and_then(|d| d.to_str().ok())
            .and_then(|d| httpdate::parse_http_date(d).ok())
            .ok_or_else(|| format!("{base} answered without a Date header"))?;
        let second = unix_s(date) as i64;
        match before {
            Some((left, last)) if second == last + 1 => {
                // The clock read `second` at some time in [left, came].
                let (early, late) = (second as f64 - came, second as f64 - left);
                return Ok(Seen {
                    offset_ms: (early + late) / 2.0 * 1000.0,
                    within_ms: (late - early) / 2.0 * 1000.0,
                });
            }
            // The same second, the first answer, or a jump (a pause
            // between two): this answer is the one before the next.
            _ => {}
        }
        before = Some((sent, second));
    }
    Err(format!(
        "{base}'s Date header did not move to the next second"
    ))
}
