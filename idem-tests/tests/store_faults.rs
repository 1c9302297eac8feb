//! Faults against the durable stores, with real processes and a real server:
//! processes racing on one operation, a process killed mid-handler, the store
//! cut off mid-run, and a completion write that fails after the side effect.
//!
//! The processor stub appends one line per invocation to a file (`O_APPEND`,
//! fsync'd before the handler goes on), so invocations are counted across
//! processes and kills. The child processes are `src/bin/store_worker.rs`.
//! The Postgres cases need `IDEM_TEST_DATABASE_URL` (see `durable`).

mod durable;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use durable::{temp_dir, Link, PgSchema, Proxy};
use idem_runtime::store::conformance::{Call, Fault, FaultyStore};
use idem_runtime::{
    answer::{Answer, Recording},
    executor::{Operation, OperationContext, ScopeSpec},
    maintenance::{reconcile, sweep, Reconciler, Reconciliation},
    store::Record,
    Caller, Executor, IdempotencyStore, PostgresStore, SqliteStore, ToolError,
};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const WORKER: &str = env!("CARGO_BIN_EXE_store_worker");
const STATUS_TOOL: &str = "get_operation_status";

/// The worker's operation, to repeat it from the test process.
#[derive(Debug, Serialize, Deserialize)]
struct Charge {
    card: String,
    amount_cents: u64,
}

/// The worker's receipt.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Receipt {
    charge_id: String,
    processor_reference: String,
}

/// The lines of the processor's invocation log: `<reference> <pid>`.
fn invocations(file: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let (r, p) = l.split_once(' ').unwrap();
            (r.to_owned(), p.to_owned())
        })
        .collect()
}

/// The processor, asked by reference: the charge in its log, or none.
#[derive(Debug)]
struct LogReconciler(PathBuf);

#[async_trait]
impl Reconciler for LogReconciler {
    async fn reconcile(
        &self,
        record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        let reference = record.reference.to_string();
        Ok(
            match invocations(&self.0)
                .into_iter()
                .find(|(r, _)| *r == reference)
            {
                Some((r, pid)) => Reconciliation::completed(serde_json::to_string(&Receipt {
                    charge_id: format!("ch_{pid}"),
                    processor_reference: r,
                })?),
                None => Reconciliation::not_performed(),
            },
        )
    }
}

/// The worker's charge, from this process, with a handler that counts.
async fn charge_again(executor: &Executor, runs: &AtomicUsize) -> Answer<Receipt, ToolError> {
    let caller = Caller::new("acme", "alice");
    let args = Charge {
        card: "tok_visa".into(),
        amount_cents: 1999,
    };
    executor
        .run(
            Operation {
                caller: &caller,
                tool: "charge_card",
                args: &args,
                scope: ScopeSpec::Window(Duration::from_secs(900)),
                status_tool: STATUS_TOOL,
            },
            |ctx: OperationContext| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(Receipt {
                    charge_id: "ch_again".into(),
                    processor_reference: ctx.reference().to_string(),
                })
            },
        )
        .await
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

fn pg_spec(pg: &PgSchema) -> String {
    format!("postgres:{}:{}", pg.name, pg.url)
}

/// Six processes, four concurrent calls each, fire one operation at one
/// store: the processor is invoked exactly once; every other call is told it
/// is in progress or gets the replay, with the same reference.
async fn processes_racing(spec: &str, log: &Path) {
    let start = (now_ms() + 1500).to_string();
    let children: Vec<_> = (0..6)
        .map(|_| {
            Command::new(WORKER)
                .args(["race", spec, log.to_str().unwrap(), &start, "4"])
                .stdout(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap()
        })
        .collect();
    let mut answers = Vec::new();
    for child in children {
        let out = child.wait_with_output().await.unwrap();
        assert!(out.status.success(), "a worker failed: {out:?}");
        answers.extend(
            String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(str::to_owned),
        );
    }
    assert_eq!(answers.len(), 24);
    assert_eq!(
        invocations(log).len(),
        1,
        "the processor ran once: {answers:?}"
    );
    let executed = answers
        .iter()
        .filter(|a| a.starts_with("executed "))
        .count();
    assert_eq!(executed, 1, "{answers:?}");
    let reference = answers[0].split(' ').nth(1).unwrap();
    for a in &answers {
        let (kind, r) = a.split_once(' ').unwrap();
        assert!(
            ["executed", "in_progress", "replayed"].contains(&kind),
            "{a}"
        );
        assert_eq!(r, reference);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_racing_on_postgres_charge_once() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let dir = temp_dir("race");
    processes_racing(&pg_spec(&pg), &dir.join("invocations")).await;
}

/// The same on one SQLite file: six processes, six writer threads, one lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_racing_on_sqlite_charge_once() {
    let dir = temp_dir("race-sqlite");
    let db = dir.join("idem.sqlite3");
    drop(SqliteStore::open(&db).await.unwrap());
    processes_racing(
        &format!("sqlite:{}", db.display()),
        &dir.join("invocations"),
    )
    .await;
}

/// SIGKILL in the middle of the handler, then a "restarted" process on the
/// same store: the call is not run again (in flight, then unknown, with the
/// reference); sweep and the reconciler resolve it from the processor's log,
/// the status lookup shows COMPLETED, and a repeat replays the real receipt.
async fn killed_mid_handler(
    spec: &str,
    reopen: impl AsyncFnOnce() -> Arc<dyn IdempotencyStore>,
    log: &Path,
) {
    let lease = Duration::from_millis(1500);
    let mut child = Command::new(WORKER)
        .args(["hang", spec, log.to_str().unwrap()])
        .env("IDEM_WORKER_LEASE_MS", lease.as_millis().to_string())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the worker reached its handler")
        .unwrap()
        .unwrap();
    let reference = line.strip_prefix("IN_HANDLER ").unwrap().to_owned();
    child.start_kill().unwrap(); // SIGKILL
    let status = child.wait().await.unwrap();
    assert!(!status.success());
    let killed_at = Instant::now();

    // The restarted process opens the store anew.
    let store = reopen().await;
    let executor = Executor::new(store.clone()).with_lease(lease);
    let runs = AtomicUsize::new(0);
    // The dead process's lease may still run: in flight or unknown, never run.
    let answer = charge_again(&executor, &runs).await;
    assert!(
        matches!(answer.name(), "in_progress" | "unknown"),
        "{answer:?}"
    );
    assert_eq!(answer.reference().unwrap().to_string(), reference);
    tokio::time::sleep((lease + Duration::from_millis(200)).saturating_sub(killed_at.elapsed()))
        .await;
    let answer = charge_again(&executor, &runs).await;
    assert_eq!(answer.name(), "unknown", "{answer:?}");
    assert_eq!(answer.reference().unwrap().to_string(), reference);
    let message = answer.message().unwrap();
    assert!(message.contains(&reference), "{message}");

    assert_eq!(sweep(&*store, 100).await.unwrap(), 1);
    let caller = Caller::new("acme", "alice");
    let status = executor.status(&caller, &reference).await.unwrap().unwrap();
    assert_eq!(status.state, idem_runtime::store::RecordStateKind::Unknown);
    let report = reconcile(&*store, &LogReconciler(log.to_owned()), &Default::default())
        .await
        .unwrap();
    assert_eq!(report.completed, 1, "{report:?}");
    let status = executor.status(&caller, &reference).await.unwrap().unwrap();
    assert_eq!(
        status.state,
        idem_runtime::store::RecordStateKind::Completed
    );
    let pid = &invocations(log)[0].1;
    let expected = Receipt {
        charge_id: format!("ch_{pid}"),
        processor_reference: reference.clone(),
    };
    assert_eq!(
        serde_json::from_value::<Receipt>(status.response.clone().unwrap()).unwrap(),
        expected
    );
    match charge_again(&executor, &runs).await {
        Answer::Replayed { value, .. } => assert_eq!(value, expected),
        other => panic!("expected the replay, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "never run again");
    assert_eq!(invocations(log).len(), 1, "the processor ran once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_killed_mid_handler_is_not_run_again() {
    let dir = temp_dir("kill-sqlite");
    let db = dir.join("idem.sqlite3");
    // The schema exists before the child opens it; then the child writes.
    drop(SqliteStore::open(&db).await.unwrap());
    let spec = format!("sqlite:{}", db.display());
    let log = dir.join("invocations");
    let reopen = async || -> Arc<dyn IdempotencyStore> {
        let store: Arc<dyn IdempotencyStore> = Arc::new(SqliteStore::open(&db).await.unwrap());
        store
    };
    killed_mid_handler(&spec, reopen, &log).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_killed_mid_handler_is_not_run_again() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let dir = temp_dir("kill-pg");
    let log = dir.join("invocations");
    let reopen = async || -> Arc<dyn IdempotencyStore> {
        let store = PostgresStore::builder(&pg.url)
            .unwrap()
            .schema(&pg.name)
            .build()
            .unwrap();
        let store: Arc<dyn IdempotencyStore> = Arc::new(store);
        store
    };
    killed_mid_handler(&pg_spec(&pg), reopen, &log).await;
}

/// Charges with a counting handler on `executor`, a fresh amount each time.
async fn charge_counted(
    executor: &Executor,
    amount_cents: u64,
    runs: &AtomicUsize,
) -> Answer<u64, ToolError> {
    let caller = Caller::new("acme", "alice");
    let args = Charge {
        card: "tok_visa".into(),
        amount_cents,
    };
    executor
        .run(
            Operation {
                caller: &caller,
                tool: "charge_card",
                args: &args,
                scope: ScopeSpec::Window(Duration::from_secs(900)),
                status_tool: STATUS_TOOL,
            },
            |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(amount_cents)
            },
        )
        .await
}

/// The store's server becomes unreachable mid-run (first silent, then
/// refusing): claims fail closed and fast, the handler never runs; once the
/// link is back, the same store (same pool, same process) serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_cut_off_fails_closed_and_recovers() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let config: tokio_postgres::Config = pg.url.parse().unwrap();
    let upstream = match (config.get_hosts().first(), config.get_ports().first()) {
        (Some(tokio_postgres::config::Host::Tcp(h)), Some(p)) => format!("{h}:{p}"),
        (Some(tokio_postgres::config::Host::Tcp(h)), None) => format!("{h}:5432"),
        _ => panic!("the cut-off test needs a TCP address in IDEM_TEST_DATABASE_URL"),
    };
    let proxy = Proxy::start(upstream).await;
    // The same login, through the proxy (Config::host adds a host, so build anew).
    let mut through = tokio_postgres::Config::new();
    through.host("127.0.0.1").port(proxy.port);
    if let Some(user) = config.get_user() {
        through.user(user);
    }
    if let Some(password) = config.get_password() {
        through.password(password);
    }
    if let Some(db) = config.get_dbname() {
        through.dbname(db);
    }
    let timeout = Duration::from_secs(2);
    let store = PostgresStore::builder_from_config(through)
        .schema(&pg.name)
        .pool_size(4)
        .timeout(timeout)
        .build()
        .unwrap();
    let executor = Executor::new(Arc::new(store));
    let runs = AtomicUsize::new(0);

    assert_eq!(charge_counted(&executor, 1, &runs).await.name(), "executed");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    for link in [Link::Silent, Link::Down] {
        proxy.set(link);
        let started = Instant::now();
        let answer = charge_counted(&executor, 2, &runs).await;
        assert_eq!(answer.name(), "store_unavailable", "{link:?}: {answer:?}");
        assert!(
            started.elapsed() < timeout * 3,
            "{link:?}: failing took {:?}",
            started.elapsed()
        );
        let message = answer.message().unwrap();
        assert!(
            message.contains("not") || message.contains("nothing"),
            "{message}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler never ran");
    }

    proxy.set(Link::Up);
    // Connections that broke during the cut were dropped from the pool (or
    // are found closed when recycled): the first call after it is served.
    let answer = charge_counted(&executor, 2, &runs).await;
    assert_eq!(answer.name(), "executed", "{answer:?}");
    assert_eq!(charge_counted(&executor, 1, &runs).await.name(), "replayed");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The completion write fails after the side effect: the caller still gets
/// the real receipt; the record stays IN_PROGRESS until the lease runs out,
/// then sweep and the reconciler resolve it, and repeats replay the receipt.
async fn completion_write_fails(store: Arc<dyn IdempotencyStore>, dir: &Path) {
    let log = dir.join("invocations");
    let lease = Duration::from_millis(400);
    // Completion writes fail, as if the server went away right after the
    // side effect.
    let completion_fails = FaultyStore::new(store.clone(), |call| match call {
        Call::Complete => Fault::Unreachable,
        _ => Fault::None,
    });
    let failing = Executor::new(Arc::new(completion_fails)).with_lease(lease);
    let processor_log = log.clone();
    let caller = Caller::new("acme", "alice");
    let args = Charge {
        card: "tok_visa".into(),
        amount_cents: 1999,
    };
    let answer: Answer<Receipt, ToolError> = failing
        .run(
            Operation {
                caller: &caller,
                tool: "charge_card",
                args: &args,
                scope: ScopeSpec::Window(Duration::from_secs(900)),
                status_tool: STATUS_TOOL,
            },
            |ctx: OperationContext| async move {
                let line = format!("{} {}\n", ctx.reference(), std::process::id());
                std::fs::write(&processor_log, line).unwrap();
                Ok(Receipt {
                    charge_id: format!("ch_{}", std::process::id()),
                    processor_reference: ctx.reference().to_string(),
                })
            },
        )
        .await;
    let Answer::Executed {
        value,
        reference,
        recording,
    } = answer
    else {
        panic!("the caller gets the real result: {answer:?}");
    };
    assert_eq!(recording, Recording::Failed);
    let expected = Receipt {
        charge_id: format!("ch_{}", std::process::id()),
        processor_reference: reference.to_string(),
    };
    assert_eq!(value, expected);

    let executor = Executor::new(store.clone()).with_lease(lease);
    let runs = AtomicUsize::new(0);
    let status = executor
        .status(&caller, &reference.to_string())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        status.state,
        idem_runtime::store::RecordStateKind::InProgress
    );
    assert_eq!(charge_again(&executor, &runs).await.name(), "in_progress");

    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    assert_eq!(sweep(&*store, 100).await.unwrap(), 1);
    let report = reconcile(&*store, &LogReconciler(log.clone()), &Default::default())
        .await
        .unwrap();
    assert_eq!(report.completed, 1);
    let status = executor
        .status(&caller, &reference.to_string())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        status.state,
        idem_runtime::store::RecordStateKind::Completed
    );
    match charge_again(&executor, &runs).await {
        Answer::Replayed { value, .. } => assert_eq!(value, expected),
        other => panic!("expected the replay, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(invocations(&log).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_completion_write_fails_after_side_effect() {
    let dir = temp_dir("complete-fails");
    let store = SqliteStore::open(dir.join("idem.sqlite3")).await.unwrap();
    completion_write_fails(Arc::new(store), &dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_completion_write_fails_after_side_effect() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let dir = temp_dir("complete-fails-pg");
    completion_write_fails(Arc::new(pg.store.clone()), &dir).await;
}
