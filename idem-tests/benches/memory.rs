//! Memory per record held by MemoryStore, without the response: heap bytes
//! counted by a wrapping global allocator, divided by the record count.
//!
//! `cargo bench --bench memory`

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use idem_runtime::{
    key::IdempotencyKey,
    store::{Attempt, ClaimRequest},
    IdempotencyStore, MemoryStore,
};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn key(i: u64) -> IdempotencyKey {
    let mut k = [0u8; 32];
    // Spread over the shards the way SHA-256 keys do.
    let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    k[..8].copy_from_slice(&h.to_be_bytes());
    k[8..16].copy_from_slice(&i.to_be_bytes());
    IdempotencyKey::from_parts(k, k)
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    println!("| records | state | heap bytes per record |");
    println!("| ---: | --- | ---: |");
    for n in [10_000u64, 100_000, 1_000_000] {
        for complete in [false, true] {
            let store = MemoryStore::new();
            let before = LIVE.load(Ordering::Relaxed);
            rt.block_on(async {
                for i in 0..n {
                    let key = key(i);
                    let req = ClaimRequest {
                        key,
                        reference: idem_runtime::Reference::new_operation(&key),
                        tenant: "acme".to_owned(),
                        tool: "charge_card".to_owned(),
                        attempt: Attempt::random(),
                        lease: Duration::from_secs(30),
                        window: Duration::from_secs(900),
                        retention: Duration::from_secs(48 * 3600),
                    };
                    store.claim(&req).await.unwrap();
                    if complete {
                        // An empty response: the figure is the record without it.
                        store.complete(&req.key, req.attempt, "").await.unwrap();
                    }
                }
            });
            let used = LIVE.load(Ordering::Relaxed) - before;
            println!(
                "| {n} | {} | {} |",
                if complete { "COMPLETED" } else { "IN_PROGRESS" },
                used / n as isize
            );
            drop(store);
        }
    }
    println!(
        "\nsize_of::<Record>() = {} bytes (inline part; tenant and tool strings add their heap copies)",
        std::mem::size_of::<idem_runtime::store::Record>()
    );
}
