//! The follow-on dispatcher under SIGKILL, with real processes on one SQLite file
//! (`src/bin/follow_ons_worker.rs`): a process killed after the completion and
//! before any dispatch leaves a job that runs after the restart; a process
//! killed in the middle of a job leaves it to run again, with the same
//! downstream key. The mailer stub logs one line per request (`O_APPEND`,
//! fsync'd), so requests are counted across processes and kills.

mod durable;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use durable::temp_dir;
use idem_runtime::{
    store::{FollowOnFilter, FollowOnState, FollowOnStore},
    SqliteStore,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const WORKER: &str = env!("CARGO_BIN_EXE_follow_ons_worker");

/// Starts a worker and waits for the line starting with `marker`; returns
/// the child and the rest of that line.
async fn start_until(args: &[&str], marker: &str) -> (Child, String) {
    let mut child = Command::new(WORKER)
        .args(args)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix(marker) {
                return rest.trim().to_owned();
            }
        }
        panic!("the worker ended without printing {marker}");
    })
    .await
    .unwrap_or_else(|_| panic!("no {marker} from the worker within 30 s"));
    (child, line)
}

/// SIGKILL, and reap.
async fn kill(mut child: Child) {
    child.kill().await.unwrap();
}

/// The mailer's log: `(downstream key, attempt, pid)` per request.
fn requests(log: &Path) -> Vec<(String, u32, String)> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut parts = l.split(' ');
            let key = parts.next().unwrap().to_owned();
            let attempt = parts.next().unwrap().parse().unwrap();
            (key, attempt, parts.next().unwrap().to_owned())
        })
        .collect()
}

async fn live_jobs(db: &Path) -> usize {
    let store = SqliteStore::open(db).await.unwrap();
    store
        .list_follow_ons(&FollowOnFilter {
            states: vec![
                FollowOnState::Waiting,
                FollowOnState::Running,
                FollowOnState::Dead,
            ],
            limit: 100,
            ..FollowOnFilter::default()
        })
        .await
        .unwrap()
        .len()
}

async fn wait_for(what: &str, mut done: impl AsyncFnMut() -> bool) {
    let started = Instant::now();
    while !done().await {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Killed after the completion, before any dispatch: the job is in the file
/// and a dispatcher started afterwards delivers it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_after_the_completion_the_job_runs_after_restart() {
    let dir = temp_dir("outbox-kill-completed");
    let (db, log) = (dir.join("idem.sqlite3"), dir.join("mailer.log"));
    let (charger, line) = start_until(&["charge", db.to_str().unwrap()], "COMPLETED").await;
    kill(charger).await;
    let (reference, kind) = line.split_once(' ').unwrap();
    assert_eq!(kind, "executed", "{line}");
    assert_eq!(
        live_jobs(&db).await,
        1,
        "the receipt job was written with the completion"
    );
    assert!(
        requests(&log).is_empty(),
        "nothing was dispatched before the kill"
    );

    let dispatcher = Command::new(WORKER)
        .args([
            "dispatch",
            db.to_str().unwrap(),
            log.to_str().unwrap(),
            "ok",
        ])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_for("the job to be finished", async || live_jobs(&db).await == 0).await;
    kill(dispatcher).await;
    let seen = requests(&log);
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, format!("{reference}:send_receipt"));
    assert_eq!(seen[0].1, 1);
}

/// Killed in the middle of a job: after its lease runs out another process
/// runs it again, as its second attempt, with the same downstream key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_during_a_job_it_runs_again_with_the_same_key() {
    let dir = temp_dir("outbox-kill-in-job");
    let (db, log) = (dir.join("idem.sqlite3"), dir.join("mailer.log"));
    let (charger, line) = start_until(&["charge", db.to_str().unwrap()], "COMPLETED").await;
    kill(charger).await;
    let reference = line.split(' ').next().unwrap().to_owned();

    let args = ["dispatch", db.to_str().unwrap(), log.to_str().unwrap()];
    let (hanging, key) = start_until(&[args[0], args[1], args[2], "hang"], "IN_JOB").await;
    assert_eq!(key, format!("{reference}:send_receipt"));
    kill(hanging).await;
    assert_eq!(live_jobs(&db).await, 1, "the killed run left its job");

    let dispatcher = Command::new(WORKER)
        .args([args[0], args[1], args[2], "ok"])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_for("the job to be finished", async || live_jobs(&db).await == 0).await;
    kill(dispatcher).await;
    let seen = requests(&log);
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!(seen[0].0, key);
    assert_eq!(seen[1].0, key, "the same downstream key on the second run");
    assert_eq!((seen[0].1, seen[1].1), (1, 2));
    assert_ne!(seen[0].2, seen[1].2, "two processes");
}
