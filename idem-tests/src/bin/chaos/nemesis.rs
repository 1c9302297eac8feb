//! The nemesis: one fault at a time, drawn at random, each undone before
//! the next: kill -9 and restart of a replica, SIGSTOP past the lease, the
//! proxies between the replicas and the store or the processor (cut, delay,
//! hold, drop the answers), a crash of the store server (not the DynamoDB
//! emulator's), of the processor and of the mailer. The replicas' skewed
//! clocks are set at their start (`clock.rs`), not dealt here.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;

use crate::clients::Rng;
use crate::proxy::{Mode, Proxy};
use crate::Cluster;

/// Faults done so far, by kind.
pub type Counts = BTreeMap<String, u32>;

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// One proxy fault, undone at its end (held or dropped answers leave the
/// connections' streams cut short, so they are cut).
async fn turn(proxy: &Proxy, rng: &mut Rng) -> &'static str {
    match rng.below(4) {
        0 => {
            proxy.cut();
            "cut"
        }
        1 => {
            proxy.set(Mode::Delay(Duration::from_millis(200 + rng.below(1300))));
            sleep_ms(1000 + rng.below(2000)).await;
            proxy.set(Mode::Pass);
            "delay"
        }
        2 => {
            proxy.set(Mode::Hold);
            sleep_ms(500 + rng.below(2500)).await;
            proxy.set(Mode::Pass);
            proxy.cut();
            "hold"
        }
        _ => {
            proxy.set(Mode::DropAnswers);
            sleep_ms(500 + rng.below(2000)).await;
            proxy.set(Mode::Pass);
            proxy.cut();
            "drop_answers"
        }
    }
}

/// Runs faults until `running` is cleared; a pause of `gap_ms` (up to
/// twice that) between two.
pub async fn run(
    cluster: Arc<Mutex<Cluster>>,
    running: Arc<AtomicBool>,
    seed: u64,
    lease_ms: u64,
    gap_ms: u64,
) -> Counts {
    let mut rng = Rng::new(seed ^ 0x006e_656d_6573_6973);
    let mut counts = Counts::new();
    while running.load(Ordering::SeqCst) {
        sleep_ms(gap_ms + rng.below(gap_ms)).await;
        if !running.load(Ordering::SeqCst) {
            break;
        }
        let mut c = cluster.lock().await;
        let r = rng.below(c.replicas.len() as u64) as usize;
        // SQLite has no network between replica and store; the DynamoDB
        // emulator is cut off, never crashed (it keeps its tables in memory).
        let kinds = match (!c.store_proxies.is_empty(), c.server.crashes()) {
            (false, _) => 6,
            (true, false) => 8,
            (true, true) => 9,
        };
        let kind = match rng.below(kinds) {
            0 | 1 => {
                c.replicas[r].kill().await;
                drop(c);
                sleep_ms(300 + rng.below(1700)).await;
                // As a supervisor does: a replica that cannot open its
                // store at start (a cut or a pooler restart in progress)
                // exits, and is started again.
                for attempt in 1..=5 {
                    let mut c = cluster.lock().await;
                    match c.replicas[r].restart().await {
                        Ok(()) => break,
                        Err(e) if attempt == 5 => {
                            eprintln!("chaos: replica {r} did not come back: {e}")
                        }
                        Err(_) => {
                            drop(c);
                            sleep_ms(1000).await;
                        }
                    }
                }
                "kill_replica".to_owned()
            }
            2 => {
                c.replicas[r].freeze();
                drop(c);
                // Past the lease: its claims lapse while it sleeps.
                sleep_ms(lease_ms + 300 + rng.below(lease_ms)).await;
                cluster.lock().await.replicas[r].thaw();
                "sigstop_replica".to_owned()
            }
            3 => {
                let proxy = c.processor_proxies[r].clone();
                drop(c);
                format!("processor_{}", turn(&proxy, &mut rng).await)
            }
            4 => {
                if let Err(e) = c.processor.restart().await {
                    eprintln!("chaos: the processor did not come back: {e}");
                }
                "kill_processor".to_owned()
            }
            5 => {
                if let Err(e) = c.mailer.restart().await {
                    eprintln!("chaos: the mailer did not come back: {e}");
                }
                "kill_mailer".to_owned()
            }
            6 | 7 => {
                let proxy = c.store_proxies[r].clone();
                drop(c);
                format!("store_{}", turn(&proxy, &mut rng).await)
            }
            // On PostgreSQL, every other server restart is PgBouncer's.
            _ if rng.below(2) == 0 => match c.server.crash_restart_pooler().await {
                Ok(true) => "restart_pgbouncer".to_owned(),
                Ok(false) => {
                    if let Err(e) = c.server.crash_restart().await {
                        eprintln!("chaos: the store server did not come back: {e}");
                    }
                    "restart_store_server".to_owned()
                }
                Err(e) => {
                    eprintln!("chaos: PgBouncer did not come back: {e}");
                    "restart_pgbouncer".to_owned()
                }
            },
            _ => {
                if let Err(e) = c.server.crash_restart().await {
                    eprintln!("chaos: the store server did not come back: {e}");
                }
                "restart_store_server".to_owned()
            }
        };
        *counts.entry(kind).or_default() += 1;
    }
    counts
}
