//! The same schedules against the durable stores, in real time.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem_runtime::store::{PauseHook, PausePoint};
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
                let report = scenario::run(
                    seed,
                    Timing::real(),
                    Sabotage::None,
                    single,
                    inner,
                    clock,
                    vec![],
                )
                .await;
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

/// BUGGIFY inside PostgresStore's claim (`ClaimRead`): between its insert,
/// which found a live record, and its read of that record, a quarter of the
/// claims pause up to 150 ms, so a window that ends in between is seen. One
/// hook for every schedule's store (the schedules share the runtime's
/// threads), its decisions from a generator seeded from the first seed.
fn pause_claim_reads(seed: u64) -> Option<PauseHook> {
    if !super::buggify::enabled_by_env() {
        return None;
    }
    let rng = std::sync::Mutex::new(super::rng::Rng::new(seed ^ 0xC1A1_4EAD));
    let hook: PauseHook = Arc::new(move |point| {
        let mut rng = rng.lock().unwrap_or_else(|e| e.into_inner());
        (point == PausePoint::PostgresClaimRead && rng.chance(0.25))
            .then(|| rng.between(Duration::ZERO, Duration::from_millis(150)))
    });
    Some(hook)
}

pub fn postgres() {
    let first = crate::seeds(0).0.first().copied().unwrap_or(0);
    let hook = pause_claim_reads(first);
    run("postgres", "simulation_postgres", 20, 10, move || {
        let hook = hook.clone();
        async move {
            let schema = crate::durable::PgSchema::paused(hook).await?;
            let store: Arc<dyn IdempotencyStore> = Arc::new(schema.store.clone());
            Some((store, Box::new(schema) as Box<dyn std::any::Any + Send>))
        }
    });
}

/// RedisStore on the shared server (`IDEM_TEST_REDIS_URL`), each schedule
/// under a fresh key prefix, deleted afterwards.
pub fn redis() {
    run("redis", "simulation_redis", 20, 10, || async {
        let redis = crate::redis_server::Prefixed::new().await?;
        let store: Arc<dyn IdempotencyStore> = Arc::new(redis.store.clone());
        Some((store, Box::new(redis) as Box<dyn std::any::Any + Send>))
    });
}

/// DynamoDbStore on the emulator behind the lagging proxy
/// (`IDEM_TEST_DYNAMODB_LAGGING_ENDPOINT`; the emulator itself, whose
/// indexes never lag, when it is not set outside CI), each schedule on a
/// fresh table: every index and every eventually consistent read trails
/// the writes (`Lag::simulation`). Fewer seeds than PostgreSQL, since
/// every store call is an HTTP request to moto, which answers them one at
/// a time, and two schedules at once (not four) keep its queue short
/// enough for the maintenance rounds the oracles time. Prints how often
/// the walk met the lag (an entry whose record read at another lease, or
/// not at all).
pub fn dynamodb() {
    let holds = crate::dynamodb_emulator::WalkHolds::default();
    let counted = holds.install();
    run("dynamodb", "simulation_dynamodb", 8, 2, || async {
        let table =
            crate::dynamodb_emulator::Table::lagging(crate::dynamodb_emulator::Lag::simulation())
                .await?;
        // The clocks are one here: the sweep's walk rewinds 50 ms, not the
        // 1 s a deployment keeps, so a walk that passed a lapsed claim is
        // not saved by reading it again at the next rounds (mutant 29).
        // The index's lag stays under the 450 ms lease: a claim's entry
        // shows before its lease ends, so it never lands behind the cursor
        // (a read may lag longer: the walk waits for it).
        let store = idem_runtime::DynamoDbStore::builder(
            crate::dynamodb_emulator::client(&table.endpoint),
            table.table(),
        )
        .clock_spread(Duration::from_millis(50))
        .build()
        .expect("a store on the table");
        let store: Arc<dyn IdempotencyStore> = Arc::new(store);
        Some((store, Box::new(table) as Box<dyn std::any::Any + Send>))
    });
    if counted {
        let (other_lease, unread) = holds.counts();
        say!(
            "simulation: dynamodb: the walk held its cursor at {other_lease} entries whose record \
             read at another lease and {unread} whose record did not read yet"
        );
    }
}
