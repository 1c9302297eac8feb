//! The same schedules against the durable stores, in real time.

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use idem_runtime::{IdempotencyStore, SqliteStore};

use super::scenario::{self, Report};
use super::timing::Timing;
use super::world::Sabotage;

/// A store for one schedule, and what keeps it alive (a schema to drop).
type Made = (Arc<dyn IdempotencyStore>, Box<dyn std::any::Any + Send>);

/// Runs the seeds, `parallel` schedules at a time, each on a fresh store.
fn run<F, Fut>(store: &str, test: &str, default: u64, parallel: usize, make: F)
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<Made>> + Send,
{
    let (seeds, single) = crate::seeds(default);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let make = Arc::new(make);
    let results = rt.block_on(async move {
        let gate = Arc::new(tokio::sync::Semaphore::new(parallel));
        let mut tasks = Vec::new();
        for &seed in &seeds {
            let (gate, make) = (gate.clone(), make.clone());
            tasks.push(tokio::spawn(async move {
                let _permit = gate.acquire_owned().await.expect("open");
                let (inner, keep) = make().await?;
                let clock: Arc<dyn Fn() -> SystemTime + Send + Sync> = Arc::new(SystemTime::now);
                let report =
                    scenario::run(seed, Timing::real(), Sabotage::None, single, inner, clock).await;
                drop(keep);
                Some((seed, report))
            }));
        }
        let mut results = Vec::new();
        for (task, seed) in tasks.into_iter().zip(&seeds) {
            match task.await {
                Ok(Some(r)) => results.push(r),
                Ok(None) => return None,
                Err(e) => results.push((
                    *seed,
                    Report {
                        violations: vec![format!("the schedule failed: {e}")],
                        ..Report::default()
                    },
                )),
            }
        }
        Some((results, seeds.len()))
    });
    let Some((results, n)) = results else {
        println!("simulation: {store}: skipped (no store to run against, see above)");
        return;
    };
    let violations = crate::summarize(store, test, &results, n, single);
    assert_eq!(violations, 0, "the simulation found violations (see above)");
}

pub fn sqlite() {
    run("sqlite", "simulation_sqlite", 60, 20, || async {
        let store = SqliteStore::open_in_memory()
            .await
            .expect("an in-memory SQLite store");
        Some((
            Arc::new(store) as Arc<dyn IdempotencyStore>,
            Box::new(()) as Box<dyn std::any::Any + Send>,
        ))
    });
}

pub fn postgres() {
    run("postgres", "simulation_postgres", 20, 10, || async {
        let schema = crate::durable::PgSchema::new().await?;
        let store: Arc<dyn IdempotencyStore> = Arc::new(schema.store.clone());
        Some((store, Box::new(schema) as Box<dyn std::any::Any + Send>))
    });
}
