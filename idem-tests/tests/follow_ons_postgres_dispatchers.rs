//! The follow-on dispatcher on PostgreSQL with real processes: dispatcher processes
//! (`src/bin/pg_dispatcher.rs`) drain follow-ons through a stub mailer
//! that keeps its books in a shared directory and dedupes by the downstream
//! key, as a real mailer does.
//!
//! - Two dispatchers on one PostgreSQL: at no moment does one job run in two
//!   processes, and the mailer delivers every job exactly once.
//! - The store cut off during dispatch: nothing is lost, and dispatch resumes
//!   once the store is back.
//!
//! Needs `IDEM_TEST_DATABASE_URL` (see `durable::database_url`): skipped with
//! a message without it, failed under `CI=true`.

mod durable;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use durable::{temp_dir, Link, PgSchema, Proxy};
use idem_runtime::{
    follow_ons::FollowOn,
    store::{FollowOnFilter, FollowOnState},
    IdempotencyStore,
};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const DISPATCHER: &str = env!("CARGO_BIN_EXE_pg_dispatcher");

/// Completes `n` fresh operations, each with one `send_receipt` job; returns
/// the jobs' downstream keys.
async fn completed_with_receipts(store: &dyn IdempotencyStore, n: usize) -> Vec<String> {
    let mut keys = Vec::new();
    for i in 0..n {
        let req = durable::request(Duration::from_secs(60), Duration::from_secs(900));
        store.claim(&req).await.unwrap();
        let job = FollowOn::new("send_receipt", &serde_json::json!({ "receipt": i })).unwrap();
        store
            .follow_ons()
            .expect("the store keeps jobs")
            .complete_with_follow_ons(
                &req.key,
                req.attempt,
                "\"paid\"",
                idem_runtime::store::FollowOns::new(&[job]).unwrap(),
            )
            .await
            .unwrap();
        keys.push(format!("{}:send_receipt", req.reference));
    }
    keys
}

/// Starts a dispatcher process on `url` and waits until it says it runs.
async fn dispatcher(url: &str, schema: &str, mailer: &Path, hold_ms: u64) -> Child {
    let mut child = Command::new(DISPATCHER)
        .args([url, schema, mailer.to_str().unwrap(), &hold_ms.to_string()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the pg_dispatcher binary starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
    assert_eq!(
        ready
            .expect("the dispatcher says READY")
            .unwrap()
            .as_deref(),
        Some("READY")
    );
    child
}

/// Jobs left in the store: waiting, running or dead (not delivered).
async fn jobs_left(store: &dyn IdempotencyStore) -> usize {
    store
        .follow_ons()
        .expect("the store keeps jobs")
        .list_follow_ons(&FollowOnFilter {
            states: vec![
                FollowOnState::Waiting,
                FollowOnState::Running,
                FollowOnState::Dead,
            ],
            limit: 100_000,
            ..FollowOnFilter::default()
        })
        .await
        .unwrap()
        .len()
}

async fn wait_until_drained(store: &dyn IdempotencyStore, within: Duration) {
    let started = Instant::now();
    loop {
        let left = jobs_left(store).await;
        if left == 0 {
            return;
        }
        assert!(
            started.elapsed() < within,
            "{left} jobs still waiting after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One run of a job at the mailer: which process, from when to when (ns
/// since the epoch, the machine's one clock).
#[derive(Clone, Copy, Debug)]
struct Run {
    pid: u32,
    start: u128,
    end: u128,
}

/// The mailer's books: every run by downstream key, and the delivered keys
/// with the process that delivered each.
struct Books {
    runs: BTreeMap<String, Vec<Run>>,
    delivered: BTreeMap<String, u32>,
}

fn books(mailer: &Path) -> Books {
    let mut log = std::fs::read_to_string(mailer.join("attempts.log")).unwrap_or_default();
    // A line being appended right now is left for the next read.
    log.truncate(log.rfind('\n').map_or(0, |i| i + 1));
    let mut open: BTreeMap<(String, u32), Vec<u128>> = BTreeMap::new();
    let mut runs: BTreeMap<String, Vec<Run>> = BTreeMap::new();
    for line in log.lines() {
        let [what, key, pid, at] = line.split(' ').collect::<Vec<_>>()[..] else {
            panic!("a torn line in the mailer's log: {line:?}");
        };
        let (pid, at): (u32, u128) = (pid.parse().unwrap(), at.parse().unwrap());
        match what {
            "start" => open.entry((key.to_owned(), pid)).or_default().push(at),
            "end" => {
                let starts = open.get_mut(&(key.to_owned(), pid)).unwrap();
                let start = starts.remove(0);
                runs.entry(key.to_owned()).or_default().push(Run {
                    pid,
                    start,
                    end: at,
                });
            }
            other => panic!("unknown line {other}"),
        }
    }
    // A run still open (its process was killed mid-run) counts as running
    // until now.
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    for ((key, pid), starts) in open {
        for start in starts {
            runs.entry(key.clone()).or_default().push(Run {
                pid,
                start,
                end: now,
            });
        }
    }
    let mut delivered = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir(mailer.join("sent")) {
        for entry in dir {
            let entry = entry.unwrap();
            // The mailer creates the file, then writes its pid: a file read
            // in between (or whose writer was killed in between) is empty.
            // It is a delivery all the same (`create_new` made it once); its
            // pid is unknown, 0.
            let pid = std::fs::read_to_string(entry.path()).unwrap();
            delivered.insert(
                entry.file_name().into_string().unwrap(),
                if pid.is_empty() {
                    0
                } else {
                    pid.parse().unwrap()
                },
            );
        }
    }
    Books { runs, delivered }
}

/// No two runs of one job overlap in time, in one process or two.
fn assert_never_twice_at_once(books: &Books) {
    for (key, runs) in &books.runs {
        let mut runs = runs.clone();
        runs.sort_by_key(|r| r.start);
        for pair in runs.windows(2) {
            assert!(
                pair[0].end <= pair[1].start,
                "job {key} ran twice at once: {:?} and {:?}",
                pair[0],
                pair[1]
            );
        }
    }
}

/// Every expected job delivered exactly once, and nothing else.
fn assert_each_delivered_once(books: &Books, expected: &[String]) {
    let expected: BTreeSet<&String> = expected.iter().collect();
    let delivered: BTreeSet<&String> = books.delivered.keys().collect();
    assert_eq!(
        delivered.len(),
        expected.len(),
        "deliveries: {} of {}",
        delivered.len(),
        expected.len()
    );
    assert_eq!(delivered, expected);
    for key in expected {
        assert!(
            books.runs.contains_key(key),
            "{key} delivered without a run"
        );
    }
}

/// Two dispatcher processes on one PostgreSQL drain 240 jobs together: at
/// no moment does one job run in two processes, both do their share, and
/// the mailer delivers each job exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_dispatcher_processes_share_no_job() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let mailer = temp_dir("pg-dispatchers");
    let expected = completed_with_receipts(&pg.store, 240).await;
    let (one, two) = tokio::join!(
        dispatcher(&pg.url, &pg.name, &mailer, 30),
        dispatcher(&pg.url, &pg.name, &mailer, 30)
    );
    wait_until_drained(&pg.store, Duration::from_secs(120)).await;
    drop((one, two));

    let books = books(&mailer);
    assert_never_twice_at_once(&books);
    assert_each_delivered_once(&books, &expected);
    // Both processes ran jobs, and at the same time: the leases really
    // competed.
    let pids: BTreeSet<u32> = books.delivered.values().copied().collect();
    assert_eq!(pids.len(), 2, "one process did all the work");
    let all: Vec<Run> = books.runs.values().flatten().copied().collect();
    let concurrent = all.iter().any(|a| {
        all.iter()
            .any(|b| a.pid != b.pid && a.start < b.end && b.start < a.end)
    });
    assert!(concurrent, "the two processes never ran jobs at once");
    let runs: usize = books.runs.values().map(Vec::len).sum();
    eprintln!(
        "two dispatchers: {} jobs, {runs} runs, {} delivered by each: {:?}",
        expected.len(),
        books.delivered.len(),
        pids.iter()
            .map(|p| books.delivered.values().filter(|d| *d == p).count())
            .collect::<Vec<_>>()
    );
}

/// The store goes away while a dispatcher process drains jobs (its
/// connections reset, new ones refused): no job runs while it is away, none
/// is lost (the jobs written meanwhile included), and once it is back
/// dispatch resumes and the mailer delivers every job exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_cut_off_during_dispatch_loses_nothing() {
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
    // The same login, through the proxy, as key=value pairs.
    let mut through = format!("host=127.0.0.1 port={}", proxy.port);
    if let Some(user) = config.get_user() {
        through += &format!(" user={user}");
    }
    if let Some(password) = config.get_password() {
        through += &format!(" password={}", String::from_utf8_lossy(password));
    }
    if let Some(db) = config.get_dbname() {
        through += &format!(" dbname={db}");
    }

    let mailer = temp_dir("pg-dispatch-cut");
    let mut expected = completed_with_receipts(&pg.store, 150).await;
    let child = dispatcher(&through, &pg.name, &mailer, 20).await;
    let started = Instant::now();
    while books(&mailer).delivered.len() < 20 {
        assert!(started.elapsed() < Duration::from_secs(60), "no deliveries");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    proxy.set(Link::Down);
    let cut = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    // Jobs keep being written while the dispatcher cannot reach the store.
    expected.extend(completed_with_receipts(&pg.store, 50).await);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = books(&mailer);
    // A lease answered just before the cut may still start its runs; no
    // lease is answered after it.
    let grace = Duration::from_millis(500).as_nanos();
    let late: Vec<_> = during
        .runs
        .iter()
        .flat_map(|(k, runs)| runs.iter().map(move |r| (k, r)))
        .filter(|(_, r)| r.start > cut + grace)
        .collect();
    assert!(late.is_empty(), "jobs ran with the store away: {late:?}");
    let waiting = jobs_left(&pg.store).await;
    assert!(
        waiting >= 50 && during.delivered.len() + waiting >= expected.len(),
        "{waiting} jobs waiting, {} delivered, of {}",
        during.delivered.len(),
        expected.len()
    );

    proxy.set(Link::Up);
    let back = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    wait_until_drained(&pg.store, Duration::from_secs(120)).await;
    drop(child);

    let books = books(&mailer);
    assert_never_twice_at_once(&books);
    assert_each_delivered_once(&books, &expected);
    let resumed = books
        .runs
        .values()
        .flatten()
        .filter(|r| r.start >= back)
        .count();
    assert!(
        resumed >= 50,
        "only {resumed} runs after the store came back"
    );
    let runs: usize = books.runs.values().map(Vec::len).sum();
    eprintln!(
        "cut off: {} jobs, {runs} runs ({} repeated and dropped by the mailer), {resumed} after the store came back",
        expected.len(),
        runs - books.delivered.len()
    );
}
