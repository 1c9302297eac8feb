//! A far side for the payments example to call over HTTP: a card processor
//! or a mailer, each keyed by the idempotency key it is sent, with its ledger
//! in SQLite so that a `kill -9` loses nothing it acknowledged.
//!
//! ```text
//! cargo run --bin farside -- processor|mailer [FLAGS]
//!
//!   --listen 127.0.0.1:PORT     address (default 127.0.0.1:0; the address is printed)
//!   --db PATH                   the ledger's SQLite file (required)
//!   --keys-kept-ms N            how long a key is kept from its first request (default 24 h)
//!   --latency-ms N              how long a request takes before its effect (default 50)
//!   --jitter-ms N               up to this much more, at random (default 0)
//!   --lookup-lag-ms N           lookups see the ledger as it was N ms ago: eventual
//!                               consistency (default 0)
//!   --lookup-latency-ms N       how long a lookup takes to answer (default 0)
//!   --failure-rate F            this fraction of requests gets 503 before anything is
//!                               recorded (default 0)
//!   --stall-rate F              this fraction of requests has its effect made but its answer
//!                               held back for --stall-ms: the caller times out (default 0)
//!   --stall-ms N                (default 30000)
//!   --seed N                    the random draws' seed (default: the clock)
//! ```
//!
//! The API, as a card processor's (Stripe's) is:
//!
//! - `POST /charges` (processor) or `POST /messages` (mailer), with an
//!   `Idempotency-Key` header and a JSON body. The key is registered the
//!   moment the request arrives. A new key: the effect is made after the
//!   latency, and the answer is `{"id", "key", "request"}` (200). A key
//!   already done: the first answer, byte for byte. A key still in flight:
//!   409, nothing done. The same key with another body: 422. A drawn failure:
//!   503 `{"performed": false}`, nothing recorded.
//! - `GET /charges/{key}` or `GET /messages/{key}`: `{"status":
//!   "not_found" | "in_flight" | "done", "answer"}`, subject to the lag,
//!   answered after the lookup latency. Every lookup is counted.
//! - `GET /ledger`: requests, effects, overlapping requests (a request that
//!   arrived while its key was in flight) and mismatched bodies, per key and
//!   in total; and lookups and overlapping lookups (one that arrived while
//!   another of its key was being answered) and lookups within one check
//!   (one that arrived less than 400 ms after the previous one of its key
//!   was answered), in total and per key (`lookups_by_key`).
//! - `POST /faults` `{"failure_rate", "stall_rate", "latency_ms"}`: change
//!   the injected faults while running (each field optional).
//!
//! A request accepted before a kill is finished when the service starts
//! again: an accepted charge is made, as a real processor's would be.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};

const USAGE: &str = "usage: farside processor|mailer --db PATH [--listen ADDR] [--keys-kept-ms N] \
[--latency-ms N] [--jitter-ms N] [--lookup-lag-ms N] [--lookup-latency-ms N] [--failure-rate F] [--stall-rate F] \
[--stall-ms N] [--seed N]";

#[derive(Clone, Copy, Debug)]
struct Faults {
    latency_ms: u64,
    jitter_ms: u64,
    failure_rate: f64,
    stall_rate: f64,
    stall_ms: u64,
}

struct Service {
    /// `ch` or `msg`: the effects' ids.
    prefix: &'static str,
    db: Mutex<Connection>,
    keys_kept_ms: u64,
    lookup_lag_ms: u64,
    lookup_latency_ms: u64,
    faults: Mutex<Faults>,
    rng: Mutex<u64>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

fn fail(problem: &str) -> ! {
    eprintln!("farside: {problem}\n{USAGE}");
    std::process::exit(2)
}

impl Service {
    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn faults(&self) -> Faults {
        *self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A draw in [0, 1): xorshift64*, enough for fault injection.
    fn draw(&self) -> f64 {
        let mut state = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        let mut x = *state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        *state = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    fn open(path: &str) -> rusqlite::Result<Connection> {
        let db = Connection::open(path)?;
        // Acknowledged means on disk: WAL, synced at every commit.
        db.pragma_update(None, "journal_mode", "wal")?;
        db.pragma_update(None, "synchronous", "full")?;
        db.busy_timeout(Duration::from_secs(5))?;
        db.execute_batch(
            "CREATE TABLE IF NOT EXISTS requests (
                 id INTEGER PRIMARY KEY AUTOINCREMENT,
                 key TEXT NOT NULL,
                 body TEXT NOT NULL,
                 answer TEXT NOT NULL,
                 arrived_ms INTEGER NOT NULL,
                 done_ms INTEGER,
                 requests INTEGER NOT NULL,
                 effects INTEGER NOT NULL,
                 overlaps INTEGER NOT NULL,
                 mismatches INTEGER NOT NULL
             );
             CREATE INDEX IF NOT EXISTS requests_by_key ON requests (key, id);
             CREATE TABLE IF NOT EXISTS lookups (
                 id INTEGER PRIMARY KEY AUTOINCREMENT,
                 key TEXT NOT NULL,
                 at_ms INTEGER NOT NULL,
                 answered_ms INTEGER,
                 overlapped INTEGER NOT NULL
             );
             CREATE INDEX IF NOT EXISTS lookups_by_key ON lookups (key, answered_ms);",
        )?;
        Ok(db)
    }

    /// Finishes what was accepted before a kill: its effect is made. The
    /// lookups being answered then were cut off: they end now.
    fn finish_accepted(&self) -> rusqlite::Result<usize> {
        let db = self.db();
        db.execute(
            "UPDATE lookups SET answered_ms = ?1 WHERE answered_ms IS NULL",
            params![now_ms() as i64],
        )?;
        db.execute(
            "UPDATE requests SET done_ms = ?1, effects = 1 WHERE done_ms IS NULL",
            params![now_ms() as i64],
        )
    }

    /// The newest entry of `key` still kept: (id, body, answer, done).
    fn find(
        &self,
        db: &Connection,
        key: &str,
        now: u64,
    ) -> rusqlite::Result<Option<(i64, String, String, bool)>> {
        db.query_row(
            "SELECT id, body, answer, done_ms IS NOT NULL FROM requests
             WHERE key = ?1 AND arrived_ms > ?2 ORDER BY id DESC LIMIT 1",
            params![key, now.saturating_sub(self.keys_kept_ms) as i64],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()
    }
}

type Shared = Arc<Service>;

/// How soon after the previous lookup of a key was answered another one
/// counts as asked within the same check (`GET /ledger`).
const SAME_CHECK_MS: i64 = 400;

fn text(status: StatusCode, body: String) -> Response {
    (status, [("content-type", "application/json")], body).into_response()
}

fn internal(e: rusqlite::Error) -> Response {
    text(
        StatusCode::INTERNAL_SERVER_ERROR,
        json!({ "error": e.to_string() }).to_string(),
    )
}

async fn submit(State(svc): State<Shared>, headers: HeaderMap, body: String) -> Response {
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .filter(|k| !k.is_empty())
        .map(str::to_owned)
    else {
        return text(
            StatusCode::BAD_REQUEST,
            json!({ "error": "an Idempotency-Key header is required" }).to_string(),
        );
    };
    let request: Value = match serde_json::from_str(&body) {
        Ok(v) => v,
        Err(e) => {
            return text(
                StatusCode::BAD_REQUEST,
                json!({ "error": e.to_string() }).to_string(),
            )
        }
    };
    let faults = svc.faults();
    // A front end's failure: nothing is recorded, nothing is done.
    if svc.draw() < faults.failure_rate {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "error": "unavailable", "performed": false }).to_string(),
        );
    }
    let now = now_ms();
    let id = {
        let db = svc.db();
        match svc.find(&db, &key, now) {
            Err(e) => return internal(e),
            Ok(Some((id, first, answer, done))) => {
                let column = if first != body {
                    "mismatches"
                } else if done {
                    "requests"
                } else {
                    "overlaps"
                };
                let also = match column {
                    "requests" => String::new(),
                    other => format!(", {other} = {other} + 1"),
                };
                let counted = db.execute(
                    &format!("UPDATE requests SET requests = requests + 1{also} WHERE id = ?1"),
                    params![id],
                );
                if let Err(e) = counted {
                    return internal(e);
                }
                return match column {
                    "mismatches" => text(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        json!({ "error": "this key was used with other parameters" }).to_string(),
                    ),
                    "requests" => text(StatusCode::OK, answer),
                    _ => text(
                        StatusCode::CONFLICT,
                        json!({ "error": "a request with this key is in progress" }).to_string(),
                    ),
                };
            }
            Ok(None) => {
                // Registered, with its answer, in one commit: from here on
                // the request is accepted and its effect will be made.
                let accepted = db.unchecked_transaction().and_then(|tx| {
                    tx.execute(
                        "INSERT INTO requests (key, body, answer, arrived_ms, requests, effects, \
                         overlaps, mismatches) VALUES (?1, ?2, '', ?3, 1, 0, 0, 0)",
                        params![key, body, now as i64],
                    )?;
                    let id = tx.last_insert_rowid();
                    let answer = json!({
                        "id": format!("{}_{id:07}", svc.prefix),
                        "key": key,
                        "request": request,
                    })
                    .to_string();
                    tx.execute(
                        "UPDATE requests SET answer = ?2 WHERE id = ?1",
                        params![id, answer],
                    )?;
                    tx.commit()?;
                    Ok(id)
                });
                match accepted {
                    Ok(id) => id,
                    Err(e) => return internal(e),
                }
            }
        }
    };
    // The work goes on without the caller: a caller that gives up does not
    // stop the effect.
    let worker = svc.clone();
    let done = tokio::spawn(async move {
        let jitter = if faults.jitter_ms > 0 {
            (worker.draw() * faults.jitter_ms as f64) as u64
        } else {
            0
        };
        tokio::time::sleep(Duration::from_millis(faults.latency_ms + jitter)).await;
        let db = worker.db();
        db.execute(
            "UPDATE requests SET done_ms = ?2, effects = 1 WHERE id = ?1 AND done_ms IS NULL",
            params![id, now_ms() as i64],
        )?;
        db.query_row(
            "SELECT answer FROM requests WHERE id = ?1",
            params![id],
            |r| r.get::<_, String>(0),
        )
    });
    let answer = match done.await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => return internal(e),
        Err(e) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({ "error": e.to_string() }).to_string(),
            )
        }
    };
    if svc.draw() < faults.stall_rate {
        // Done, but the answer comes too late for the caller.
        tokio::time::sleep(Duration::from_millis(faults.stall_ms)).await;
    }
    text(StatusCode::OK, answer)
}

/// Counts a lookup of `key` arriving now: its row's id, once it is known
/// whether another lookup of the key was being answered.
fn lookup_arrived(svc: &Service, key: &str) -> rusqlite::Result<i64> {
    let db = svc.db();
    let overlapped: bool = db.query_row(
        "SELECT EXISTS (SELECT 1 FROM lookups WHERE key = ?1 AND answered_ms IS NULL)",
        params![key],
        |r| r.get(0),
    )?;
    db.execute(
        "INSERT INTO lookups (key, at_ms, answered_ms, overlapped) VALUES (?1, ?2, NULL, ?3)",
        params![key, now_ms() as i64, overlapped],
    )?;
    Ok(db.last_insert_rowid())
}

/// A lookup being answered: it ends when its answer is sent, or when the
/// caller went away first (hyper drops the handler's future then).
struct Answering {
    svc: Shared,
    id: i64,
}

impl Drop for Answering {
    fn drop(&mut self) {
        if let Err(e) = self.svc.db().execute(
            "UPDATE lookups SET answered_ms = ?2 WHERE id = ?1",
            params![self.id, now_ms() as i64],
        ) {
            eprintln!("farside: a lookup's end was not recorded: {e}");
        }
    }
}

async fn lookup(State(svc): State<Shared>, Path(key): Path<String>) -> Response {
    let id = match lookup_arrived(&svc, &key) {
        Ok(id) => id,
        Err(e) => return internal(e),
    };
    let _answering = Answering {
        svc: svc.clone(),
        id,
    };
    let answer = look_up(&svc, &key);
    if svc.lookup_latency_ms > 0 {
        tokio::time::sleep(Duration::from_millis(svc.lookup_latency_ms)).await;
    }
    answer
}

/// What a lookup of `key` answers, as the ledger was `lookup_lag_ms` ago.
fn look_up(svc: &Service, key: &str) -> Response {
    let seen = now_ms().saturating_sub(svc.lookup_lag_ms);
    let db = svc.db();
    let found = db
        .query_row(
            "SELECT answer, done_ms FROM requests
             WHERE key = ?1 AND arrived_ms > ?2 AND arrived_ms <= ?3 ORDER BY id DESC LIMIT 1",
            params![
                key,
                now_ms().saturating_sub(svc.keys_kept_ms) as i64,
                seen as i64
            ],
            |r| Ok((r.get::<_, String>(0)?, r.get::<_, Option<i64>>(1)?)),
        )
        .optional();
    match found {
        Err(e) => internal(e),
        Ok(None) => text(StatusCode::OK, json!({ "status": "not_found" }).to_string()),
        Ok(Some((answer, done))) => match done {
            Some(done) if done as u64 <= seen => {
                let answer: Value = serde_json::from_str(&answer).unwrap_or(Value::Null);
                text(
                    StatusCode::OK,
                    json!({ "status": "done", "answer": answer }).to_string(),
                )
            }
            _ => text(StatusCode::OK, json!({ "status": "in_flight" }).to_string()),
        },
    }
}

async fn ledger(State(svc): State<Shared>) -> Response {
    let db = svc.db();
    // Per key: lookups, overlapping ones, and repeats within one check: a
    // lookup that arrived less than `SAME_CHECK_MS` after the previous one
    // of its key was answered, sooner than any replica asks again after an
    // answer (the harness's shortest backoff is 500 ms).
    let lookups = db
        .prepare(
            "SELECT key, COUNT(*), SUM(overlapped), SUM(at_ms < prev + ?1) FROM ( \
               SELECT key, overlapped, at_ms, \
                 LAG(answered_ms) OVER (PARTITION BY key ORDER BY at_ms, id) AS prev \
               FROM lookups) \
             GROUP BY key",
        )
        .and_then(|mut statement| {
            statement
                .query_map([SAME_CHECK_MS], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, Option<i64>>(3)?.unwrap_or(0),
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
        });
    let lookups = match lookups {
        Ok(rows) => rows,
        Err(e) => return internal(e),
    };
    let rows = db
        .prepare(
            "SELECT key, requests, effects, overlaps, mismatches, answer, body, arrived_ms, done_ms
             FROM requests ORDER BY id",
        )
        .and_then(|mut statement| {
            statement
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        json!({
                            "requests": r.get::<_, i64>(1)?,
                            "effects": r.get::<_, i64>(2)?,
                            "overlaps": r.get::<_, i64>(3)?,
                            "mismatches": r.get::<_, i64>(4)?,
                            "answer": serde_json::from_str::<Value>(&r.get::<_, String>(5)?)
                                .unwrap_or(Value::Null),
                            "request": serde_json::from_str::<Value>(&r.get::<_, String>(6)?)
                                .unwrap_or(Value::Null),
                            "arrived_ms": r.get::<_, i64>(7)?,
                            "done_ms": r.get::<_, Option<i64>>(8)?,
                        }),
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
        });
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => return internal(e),
    };
    // A key forgotten and used again has one entry per use.
    let mut keys: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let (mut requests, mut effects, mut overlaps, mut mismatches) = (0, 0, 0, 0);
    for (key, entry) in rows {
        requests += entry["requests"].as_i64().unwrap_or(0);
        effects += entry["effects"].as_i64().unwrap_or(0);
        overlaps += entry["overlaps"].as_i64().unwrap_or(0);
        mismatches += entry["mismatches"].as_i64().unwrap_or(0);
        keys.entry(key).or_default().push(entry);
    }
    text(
        StatusCode::OK,
        json!({
            "keys": keys,
            "requests": requests,
            "effects": effects,
            "overlaps": overlaps,
            "mismatches": mismatches,
            "lookups": lookups.iter().map(|l| l.1).sum::<i64>(),
            "lookup_overlaps": lookups.iter().map(|l| l.2).sum::<i64>(),
            "lookups_within_a_check": lookups.iter().map(|l| l.3).sum::<i64>(),
            "lookups_by_key": lookups
                .iter()
                .map(|(key, n, overlaps, repeats)| {
                    let entry = json!({ "lookups": n, "overlaps": overlaps, "within_a_check": repeats });
                    (key.clone(), entry)
                })
                .collect::<serde_json::Map<_, _>>(),
        })
        .to_string(),
    )
}

async fn set_faults(State(svc): State<Shared>, body: String) -> Response {
    let change: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let mut faults = svc.faults.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(f) = change["failure_rate"].as_f64() {
        faults.failure_rate = f;
    }
    if let Some(f) = change["stall_rate"].as_f64() {
        faults.stall_rate = f;
    }
    if let Some(n) = change["latency_ms"].as_u64() {
        faults.latency_ms = n;
    }
    text(StatusCode::OK, format!("{:?}", *faults))
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (prefix, collection) = match args.next().as_deref() {
        Some("processor") => ("ch", "charges"),
        Some("mailer") => ("msg", "messages"),
        Some("--help" | "-h") => {
            println!("{USAGE}");
            return;
        }
        _ => fail("the first argument is processor or mailer"),
    };
    let mut listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let mut db_path = None;
    let mut keys_kept_ms = 24 * 3600 * 1000;
    let mut lookup_lag_ms = 0;
    let mut lookup_latency_ms = 0;
    let mut seed = now_ms() | 1;
    let mut faults = Faults {
        latency_ms: 50,
        jitter_ms: 0,
        failure_rate: 0.0,
        stall_rate: 0.0,
        stall_ms: 30_000,
    };
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .unwrap_or_else(|| fail(&format!("{flag} needs a value")));
        let int = || {
            value
                .parse::<u64>()
                .unwrap_or_else(|_| fail(&format!("{flag} takes a whole number, not {value:?}")))
        };
        let rate = || {
            value
                .parse::<f64>()
                .ok()
                .filter(|f| (0.0..=1.0).contains(f))
                .unwrap_or_else(|| fail(&format!("{flag} takes a fraction, not {value:?}")))
        };
        match flag.as_str() {
            "--listen" => {
                listen = value
                    .parse()
                    .unwrap_or_else(|_| fail(&format!("--listen takes HOST:PORT, not {value:?}")))
            }
            "--db" => db_path = Some(value.clone()),
            "--keys-kept-ms" => keys_kept_ms = int(),
            "--latency-ms" => faults.latency_ms = int(),
            "--jitter-ms" => faults.jitter_ms = int(),
            "--lookup-lag-ms" => lookup_lag_ms = int(),
            "--lookup-latency-ms" => lookup_latency_ms = int(),
            "--failure-rate" => faults.failure_rate = rate(),
            "--stall-rate" => faults.stall_rate = rate(),
            "--stall-ms" => faults.stall_ms = int(),
            "--seed" => seed = int() | 1,
            other => fail(&format!("unknown flag {other:?}")),
        }
    }
    let db_path = db_path.unwrap_or_else(|| fail("--db is required"));
    let db = Service::open(&db_path).unwrap_or_else(|e| {
        eprintln!("farside: cannot open {db_path}: {e}");
        std::process::exit(1)
    });
    let svc = Arc::new(Service {
        prefix,
        db: Mutex::new(db),
        keys_kept_ms,
        lookup_lag_ms,
        lookup_latency_ms,
        faults: Mutex::new(faults),
        rng: Mutex::new(seed),
    });
    match svc.finish_accepted() {
        Ok(0) => {}
        Ok(n) => eprintln!("farside: finished {n} request(s) accepted before the last stop"),
        Err(e) => {
            eprintln!("farside: cannot finish the accepted requests: {e}");
            std::process::exit(1)
        }
    }
    let app = axum::Router::new()
        .route(&format!("/{collection}"), post(submit))
        .route(&format!("/{collection}/{{key}}"), get(lookup))
        .route("/ledger", get(ledger))
        .route("/faults", post(set_faults))
        .with_state(svc);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .unwrap_or_else(|e| {
            eprintln!("farside: cannot listen on {listen}: {e}");
            std::process::exit(1)
        });
    eprintln!(
        "farside: serving {collection} on http://{}",
        listener.local_addr().expect("a bound address")
    );
    if let Err(e) = axum::serve(listener, app).await {
        eprintln!("farside: {e}");
        std::process::exit(1);
    }
}
