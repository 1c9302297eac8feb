//! A child process for the follow-ons' process tests
//! (`tests/follow_ons_postgres_dispatchers.rs`): one [`FollowOnDispatcher`] on a
//! PostgresStore, whose `send_receipt` handler calls a stub mailer that keeps
//! its books in a directory shared by every process.
//!
//! ```text
//! pg_dispatcher <connection-string> <schema> <mailer-dir> <hold-ms>
//! ```
//!
//! The stub mailer, for each request it is given:
//!
//! - appends `start <downstream-key> <pid> <unix-ns>` to
//!   `<mailer-dir>/attempts.log` the moment the request arrives;
//! - dedupes by the downstream key, as a real mailer does: it creates
//!   `<mailer-dir>/sent/<downstream-key>` with `O_EXCL`, and only the request
//!   that created it is a delivery (its pid is written in the file); a repeat
//!   is dropped;
//! - holds the request for `<hold-ms>` (a slow mailer, so that two runs of
//!   one job would overlap), then appends `end <downstream-key> <pid>
//!   <unix-ns>`.
//!
//! The dispatcher runs until it is killed. It prints `READY` once it started.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_runtime::{
    follow_ons::{follow_on_fn, FollowOnConfig, FollowOnDispatcher, FollowOnHandlers, FollowOnRun},
    PostgresStore,
};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, schema, dir, hold] = &args[..] else {
        eprintln!("usage: pg_dispatcher <connection-string> <schema> <mailer-dir> <hold-ms>");
        std::process::exit(2);
    };
    let hold = Duration::from_millis(hold.parse().expect("hold-ms is a number"));
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(dir.join("sent")).unwrap();
    let store = PostgresStore::builder(url)
        .unwrap()
        .schema(schema)
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let handlers = FollowOnHandlers::new().on(
        "send_receipt",
        follow_on_fn(move |job: FollowOnRun| {
            let dir = dir.clone();
            async move {
                mail(&dir, &job.downstream_key, hold).await;
                Ok(())
            }
        }),
    );
    let config = FollowOnConfig::default()
        .with_interval(Duration::from_millis(50))
        .with_batch(8)
        .with_timeout(Duration::from_secs(2))
        .with_first_backoff(Duration::from_millis(100));
    let _dispatcher = FollowOnDispatcher::spawn(Arc::new(store), handlers, config)
        .expect("the store keeps follow-ons");
    println!("READY");
    std::io::stdout().flush().unwrap();
    std::future::pending::<()>().await;
}

/// The stub mailer (see the module's documentation).
async fn mail(dir: &Path, key: &str, hold: Duration) {
    log(dir, "start", key);
    let sent = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dir.join("sent").join(key));
    match sent {
        Ok(mut f) => write!(f, "{}", std::process::id()).unwrap(),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => panic!("the mailer's books: {e}"),
    }
    tokio::time::sleep(hold).await;
    log(dir, "end", key);
}

fn log(dir: &Path, what: &str, key: &str) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("attempts.log"))
        .unwrap();
    // One write per line: O_APPEND keeps lines of processes apart.
    let line = format!("{what} {key} {} {}\n", std::process::id(), now.as_nanos());
    f.write_all(line.as_bytes()).unwrap();
}
