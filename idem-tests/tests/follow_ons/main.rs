//! Follow-ons end to end, in one process: what the executor writes (only
//! with a completion, never for a replay, a rejection, an unknown outcome or
//! a panic; bad declarations refused where they are made), and what the
//! dispatcher does with it (retries with backoff, the dead letter and its
//! re-drive, jobs nobody handles, two dispatchers on one store). Every
//! assertion is about what a mailer stub saw: it counts attempts, dedupes by
//! the downstream key from the moment a request arrives, and counts how many
//! runs of one key overlap.
//!
//! One test binary: here the mailer stub and what the cases share; `writes`
//! holds what the executor writes, `dispatch` what the dispatcher does.

#[path = "../durable/mod.rs"]
mod durable;

mod dispatch;
mod writes;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::{
    answer::Answer,
    executor::{Operation, ScopeSpec},
    follow_on,
    follow_ons::{follow_on_fn, FollowOnConfig, FollowOnHandlers, FollowOnRun},
    store::{FollowOnFilter, FollowOnState},
    Caller, Executor, IdempotencyStore, MemoryStore, ToolError,
};
use serde_json::{json, Value};

const STATUS_TOOL: &str = "get_operation_status";

/// What the mailer saw of one downstream key.
#[derive(Clone, Debug, Default)]
struct Seen {
    /// Requests that arrived, failed ones included.
    attempts: usize,
    /// Mails actually sent: at most one per key, whatever arrives.
    deliveries: usize,
    /// Runs of this key in flight right now, and the most ever at once.
    in_flight: usize,
    max_in_flight: usize,
    /// When each request arrived.
    arrivals: Vec<Instant>,
    /// The attempt numbers the dispatcher gave.
    attempt_numbers: Vec<u32>,
}

/// A mailer stand-in: dedupes by the downstream key, fails the first
/// `fail_first` requests of each key, takes `delay` per request.
#[derive(Clone, Default)]
struct Mailer {
    seen: Arc<Mutex<BTreeMap<String, Seen>>>,
    fail_first: Arc<AtomicUsize>,
    delay: Duration,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
}

impl Mailer {
    fn new(delay: Duration, fail_first: usize) -> Self {
        Mailer {
            delay,
            fail_first: Arc::new(AtomicUsize::new(fail_first)),
            ..Mailer::default()
        }
    }

    async fn send(
        &self,
        job: FollowOnRun,
    ) -> Result<(), idem_runtime::follow_ons::FollowOnHandlerError> {
        let attempts = {
            let mut seen = self.seen.lock().unwrap();
            let s = seen.entry(job.downstream_key.clone()).or_default();
            s.attempts += 1;
            s.in_flight += 1;
            s.max_in_flight = s.max_in_flight.max(s.in_flight);
            s.arrivals.push(Instant::now());
            s.attempt_numbers.push(job.run);
            s.attempts
        };
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        let mut seen = self.seen.lock().unwrap();
        let s = seen.get_mut(&job.downstream_key).unwrap();
        s.in_flight -= 1;
        if attempts <= self.fail_first.load(Ordering::SeqCst) {
            return Err(format!("mailer down (request {attempts})").into());
        }
        // Deduped by the downstream key: a repeat is acknowledged, not sent.
        if s.deliveries == 0 {
            s.deliveries = 1;
        }
        Ok(())
    }

    fn handlers(&self) -> FollowOnHandlers {
        let mailer = self.clone();
        FollowOnHandlers::new().on(
            "send_receipt",
            follow_on_fn(move |job| {
                let mailer = mailer.clone();
                async move { mailer.send(job).await }
            }),
        )
    }

    fn seen(&self) -> BTreeMap<String, Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn deliveries(&self) -> usize {
        self.seen().values().map(|s| s.deliveries).sum()
    }
}

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

fn operation<'a>(caller: &'a Caller, args: &'a Value) -> Operation<'a, Value> {
    Operation {
        caller,
        tool: "charge_card",
        args,
        scope: ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: STATUS_TOOL,
    }
}

fn memory() -> Arc<dyn IdempotencyStore> {
    Arc::new(MemoryStore::new())
}

/// The jobs not delivered yet: waiting, running or dead.
async fn jobs(store: &dyn IdempotencyStore) -> Vec<idem_runtime::store::FollowOnRecord> {
    store
        .follow_ons()
        .expect("the store keeps jobs")
        .list_follow_ons(&FollowOnFilter {
            states: vec![
                FollowOnState::Waiting,
                FollowOnState::Running,
                FollowOnState::Dead,
            ],
            limit: 1000,
            ..FollowOnFilter::default()
        })
        .await
        .unwrap()
}

/// A charge that declares a receipt, through the free function.
async fn charge(
    executor: &Executor,
    args: &Value,
    charges: &AtomicUsize,
) -> Answer<String, ToolError> {
    let caller = alice();
    executor
        .run(operation(&caller, args), |ctx| async move {
            charges.fetch_add(1, Ordering::SeqCst);
            follow_on(
                "send_receipt",
                &json!({"to": "alice@example.com", "ref": ctx.reference().to_string()}),
            )
            .map_err(|e| ToolError::unknown(e.to_string()))?;
            Ok("charged".to_owned())
        })
        .await
}

fn config() -> FollowOnConfig {
    FollowOnConfig::default()
        .with_interval(Duration::from_millis(20))
        .with_batch(8)
        .with_timeout(Duration::from_secs(5))
        .with_max_runs(5)
        .with_first_backoff(Duration::from_millis(100))
        .with_max_backoff(Duration::from_secs(2))
}

async fn wait_until(what: &str, deadline: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(
            started.elapsed() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
