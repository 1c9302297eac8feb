//! Key derivation beside a bare SHA-256 of the same canonical bytes.
//!
//! `IdempotencyKey::derive` canonicalizes the arguments and hashes them in
//! one pass; the baseline only hashes bytes that were canonicalized ahead of
//! time. The ratio of the two throughputs is the cost of canonicalization.
//!
//! Run: `cargo bench --bench keys -- --warm-up-time 1 --measurement-time 3`
//!
//! After criterion's groups, the same pairs are timed alternately, batch by
//! batch (about a millisecond of SHA-256, then as many `derive` calls, 61
//! rounds) in this thread's CPU time, and a table of the medians and the
//! median of each round's ratio is printed: on a shared machine the load
//! shifts between criterion's groups, but not within one round, and time
//! spent waiting for a core is not counted.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use idem_runtime::{
    key::canonical::canonical_json,
    key::{IdempotencyKey, Scope},
    Caller,
};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

/// A small deterministic generator (xorshift64*), so every run benches the
/// same arguments.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const WORDS: &[&str] = &[
    "order",
    "shipment",
    "invoice",
    "customer",
    "priority",
    "express",
    "warehouse",
    "Zürich",
    "café",
    "naïve",
    "€",
    "payment",
    "refund",
    "pending",
    "délai",
    "東京",
    "🚚",
    "note",
    "address",
    "street",
    "line",
    "amount",
    "currency",
    "reference",
];

/// Text of `words` words, with the odd quote or newline that needs escaping.
fn text(rng: &mut Rng, words: u64) -> String {
    let mut s = String::new();
    for i in 0..words {
        if i > 0 {
            s.push(if rng.below(40) == 0 { '\n' } else { ' ' });
        }
        s.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
        if rng.below(60) == 0 {
            s.push_str("\"quoted\"");
        }
    }
    s
}

/// Makes the `index`th member of the arguments: its name and its value.
type Record = fn(&mut Rng, usize) -> (String, Value);

/// Arguments of mostly text: records with names, descriptions and tags.
fn string_heavy(rng: &mut Rng, index: usize) -> (String, Value) {
    let words = 2 + rng.below(6);
    let description_words = 8 + rng.below(24);
    let tag_count = rng.below(4);
    let record = json!({
        "name": text(rng, words),
        "description": text(rng, description_words),
        "tags": (0..tag_count).map(|_| text(rng, 1)).collect::<Vec<_>>(),
        "sku": format!("SKU-{:08}", rng.below(100_000_000)),
    });
    (format!("item_{index:05}"), record)
}

/// Arguments of mostly numbers: integer ids and counts, prices and
/// coordinates as floats.
fn number_heavy(rng: &mut Rng, index: usize) -> (String, Value) {
    let record = json!({
        "id": rng.next() >> 11,
        "qty": rng.below(1000),
        "delta": -(rng.below(1 << 40) as i64),
        "price": rng.below(10_000_000) as f64 / 100.0,
        "lat": (rng.below(180_000_000) as f64 / 1e6) - 90.0,
        "lon": (rng.below(360_000_000) as f64 / 1e6) - 180.0,
        "weight": f64::from_bits(0x3ff0_0000_0000_0000 | (rng.next() >> 12)),
    });
    (format!("row_{index:05}"), record)
}

/// An object of records, grown until its canonical form is at least
/// `size` bytes.
fn args(size: usize, record: Record) -> Value {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut members = Map::new();
    members.insert("request".into(), json!("bench"));
    let mut value = Value::Object(members.clone());
    while canonical_json(&value).unwrap().len() < size {
        let (name, record) = record(&mut rng, members.len());
        members.insert(name, record);
        value = Value::Object(members.clone());
    }
    value
}

fn bench_keys(c: &mut Criterion) {
    let caller = Caller::new("acme", "alice");
    let scope = Scope::Window(Duration::from_secs(900));
    let kinds: [(&str, Record); 2] = [
        ("string-heavy", string_heavy),
        ("number-heavy", number_heavy),
    ];
    for (kind, record) in kinds {
        let mut group = c.benchmark_group(format!("key/{kind}"));
        for size in [200, 4 << 10, 64 << 10] {
            let value = args(size, record);
            let canonical = canonical_json(&value).unwrap().into_bytes();
            group.throughput(Throughput::Bytes(canonical.len() as u64));
            group.bench_with_input(BenchmarkId::new("derive", size), &value, |b, value| {
                b.iter(|| IdempotencyKey::derive(&caller, "charge", value, &scope).unwrap())
            });
            group.bench_with_input(
                BenchmarkId::new("sha256", size),
                &canonical,
                |b, canonical| b.iter(|| Sha256::digest(canonical)),
            );
        }
        group.finish();
    }
}

/// `derive` and SHA-256 of the same canonical bytes, alternating batch by
/// batch; prints one row per corpus and size.
fn alternating_table() {
    let caller = Caller::new("acme", "alice");
    let scope = Scope::Window(Duration::from_secs(900));
    let kinds: [(&str, Record); 2] = [
        ("string-heavy", string_heavy),
        ("number-heavy", number_heavy),
    ];
    println!();
    println!(
        "alternating, {ROUNDS} rounds, thread CPU time (load average {})",
        load()
    );
    println!("| args | canonical bytes | derive ns | sha256 ns | derive MB/s | sha256 MB/s | ratio (median of rounds) |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for (kind, record) in kinds {
        for size in [200, 4 << 10, 64 << 10] {
            let value = args(size, record);
            let canonical = canonical_json(&value).unwrap().into_bytes();
            // About 1 ms of hashing a batch.
            let batch = (1_000_000 / canonical.len()).clamp(10, 20_000);
            let time = |f: &dyn Fn()| {
                let start = thread_cpu_ns();
                for _ in 0..batch {
                    f();
                }
                (thread_cpu_ns() - start) as f64 / batch as f64
            };
            let derive = || {
                black_box(
                    IdempotencyKey::derive(&caller, "charge", black_box(&value), &scope).unwrap(),
                );
            };
            let sha = || {
                black_box(Sha256::digest(black_box(&canonical)));
            };
            time(&derive);
            time(&sha);
            let (mut d, mut h, mut r) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                let (dn, hn) = (time(&derive), time(&sha));
                d.push(dn);
                h.push(hn);
                r.push(hn / dn);
            }
            let median = |v: &mut Vec<f64>| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            };
            let (dn, hn, ratio) = (median(&mut d), median(&mut h), median(&mut r));
            let bytes = canonical.len() as f64;
            println!(
                "| {kind}, ~{size} B | {} | {dn:.0} | {hn:.0} | {:.0} | {:.0} | {ratio:.2} |",
                canonical.len(),
                bytes / dn * 1e3,
                bytes / hn * 1e3,
            );
        }
    }
}

const ROUNDS: usize = 61;

/// This thread's time on a CPU, in nanoseconds: a batch preempted by
/// another process is not charged for the time it waited.
fn thread_cpu_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec for the call's duration.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

criterion_group!(benches, bench_keys);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    alternating_table();
}
