//! RedisStore: the conformance suite, what only Redis has (server time,
//! native expiry, the key layout), the durability option, races between
//! separate clients, and faults on servers of the tests' own: a restart
//! mid-run, CLIENT PAUSE, connections killed. The shared-server cases need
//! `IDEM_TEST_REDIS_URL`; the fault cases start `redis-server` themselves.
//!
//! One job, over 700 lines: what only the Redis store has, one case each.

mod durable;
mod redis_server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use idem_runtime::store::conformance::{again, claim_request, new_operation};
use idem_runtime::{
    store::{conformance, Claim, ClaimRequest, FollowOnStore, RecordState, Resolution},
    Answer, Caller, Executor, IdempotencyKey, IdempotencyStore, Operation, RedisStore, ScopeSpec,
    StoreError, ToolError,
};
use redis_server::{command, Prefixed, Server};

// Each case under a fresh key prefix of its own, deleted at the end.
idem_runtime::conformance_tests!(Prefixed::new().await);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_cases_share_one_store() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    conformance::run_all(&redis.store).await;
}

/// The server's clock in microseconds.
async fn server_time(url: &str) -> SystemTime {
    let (secs, micros): (u64, u64) = command(url, &redis::cmd("TIME")).await;
    UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros)
}

/// Times come from the server's `TIME`: a claim's times fall between two
/// readings of it, and its lease and window are exact.
#[tokio::test]
async fn times_come_from_the_server() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let req = durable::request(Duration::from_secs(30), Duration::from_secs(60));
    let before = server_time(&redis.url).await;
    redis.claim(&req).await.unwrap();
    let after = server_time(&redis.url).await;
    let record = redis
        .lookup(&req.tenant, &req.reference)
        .await
        .unwrap()
        .unwrap();
    assert!(before <= record.claimed_at && record.claimed_at <= after);
    assert!(record.claimed_at <= record.observed_at);
    let since_claim = |t: SystemTime| t.duration_since(record.claimed_at).unwrap();
    assert_eq!(since_claim(record.lease_until), Duration::from_secs(30));
    assert_eq!(since_claim(record.expires_at), Duration::from_secs(60));
}

/// The record's key, as the store names it (see the layout's table).
fn record_key(prefix: &str, key: &IdempotencyKey) -> String {
    let hex = |b: &[u8]| b.iter().map(|b| format!("{b:02x}")).collect::<String>();
    // Under the key's first eight bytes, which every reference of it starts
    // with.
    let prefix8 = &key.as_bytes()[..8];
    format!("{prefix}:{{{:02x}}}:r:{}", prefix8[0] % 64, hex(prefix8))
}

/// When Redis will delete a key, in ms since the epoch.
async fn expire_time(url: &str, key: &str) -> i64 {
    command(url, redis::cmd("PEXPIRETIME").arg(key)).await
}

fn ms_ceil(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
        .div_ceil(1000) as i64
}

/// Redis deletes a record at the end of its life, by a native TTL that every
/// transition sets: an IN_PROGRESS or UNKNOWN record when both its retention
/// and its lease are over, a COMPLETED one at `retain_until` (its window,
/// `expires_at`, ends the key's hold, not the record).
#[tokio::test]
async fn native_ttl_follows_the_record_life() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let req = ClaimRequest {
        lease: Duration::from_secs(30),
        window: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
        ..claim_request(Duration::from_secs(60))
    };
    let key = record_key(&redis.prefix, &req.key);
    let read = async || {
        redis
            .lookup(&req.tenant, &req.reference)
            .await
            .unwrap()
            .unwrap()
    };
    redis.claim(&req).await.unwrap();
    let r = read().await;
    assert_eq!(expire_time(&redis.url, &key).await, ms_ceil(r.retain_until));

    // A lease renewed past the retention keeps the record as long.
    redis
        .heartbeat(&req.key, req.attempt, Duration::from_secs(7200))
        .await
        .unwrap();
    let r = read().await;
    assert!(r.lease_until > r.retain_until);
    assert_eq!(expire_time(&redis.url, &key).await, ms_ceil(r.lease_until));

    redis
        .mark_unknown(&req.key, req.attempt, "timeout")
        .await
        .unwrap();
    assert_eq!(expire_time(&redis.url, &key).await, ms_ceil(r.lease_until));

    redis
        .resolve(
            &req.key,
            req.attempt,
            Resolution::Completed { response: "1" },
            None,
        )
        .await
        .unwrap();
    let r = read().await;
    assert!(r.expires_at < r.retain_until);
    assert_eq!(expire_time(&redis.url, &key).await, ms_ceil(r.retain_until));
}

/// The sorted sets of the shard the record lives in.
fn sets(prefix: &str, key: &IdempotencyKey) -> [String; 2] {
    let shard = key.as_bytes()[0] % 64;
    [
        format!("{prefix}:{{{shard:02x}}}:lapsed"),
        format!("{prefix}:{{{shard:02x}}}:unknown"),
    ]
}

async fn members(url: &str, set: &str) -> usize {
    command(url, redis::cmd("ZCARD").arg(set)).await
}

/// Once Redis deleted expired IN_PROGRESS and UNKNOWN records, purge drops
/// their entries in the sorted sets and counts them; COMPLETED records were
/// never listed, so they cost purge nothing.
#[tokio::test]
async fn purge_drops_the_entries_of_deleted_records() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let short = Duration::from_millis(100);
    let lapsed = durable::request(short, short);
    let unknown = durable::request(short, short);
    let completed = durable::request(short, short);
    for req in [&lapsed, &unknown, &completed] {
        redis.claim(req).await.unwrap();
    }
    redis
        .mark_unknown(&unknown.key, unknown.attempt, "timeout")
        .await
        .unwrap();
    redis
        .complete(&completed.key, completed.attempt, "1")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    for req in [&lapsed, &unknown, &completed] {
        let gone = redis.lookup(&req.tenant, &req.reference).await.unwrap();
        assert_eq!(gone, None, "Redis deleted the record at its end");
    }
    assert_eq!(
        members(&redis.url, &sets(&redis.prefix, &lapsed.key)[0]).await,
        1
    );
    assert_eq!(
        members(&redis.url, &sets(&redis.prefix, &unknown.key)[1]).await,
        1
    );
    assert_eq!(redis.purge_expired(1).await.unwrap(), 1, "a batch of one");
    assert_eq!(redis.purge_expired(100).await.unwrap(), 1);
    assert_eq!(redis.purge_expired(100).await.unwrap(), 0);
    assert_eq!(
        members(&redis.url, &sets(&redis.prefix, &lapsed.key)[0]).await,
        0
    );
    assert_eq!(
        members(&redis.url, &sets(&redis.prefix, &unknown.key)[1]).await,
        0
    );
}

/// Two operations whose keys share their first eight bytes (where their
/// references start) are still two records: each is claimed, completed,
/// found by its own reference and released on its own, whichever tenant
/// they are in.
#[tokio::test]
async fn a_reference_collision_keeps_two_records() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let first = claim_request(Duration::from_secs(900));
    let mut bytes = *first.key.as_bytes();
    bytes[31] ^= 1;
    for same_tenant in [false, true] {
        let first = again(&first);
        let key = IdempotencyKey::from_parts(bytes, [7; 32]);
        let second = ClaimRequest {
            key,
            reference: idem_runtime::Reference::new_operation(&key),
            tenant: if same_tenant {
                first.tenant.clone()
            } else {
                format!("{}-other", first.tenant)
            },
            ..claim_request(Duration::from_secs(900))
        };
        assert_eq!(first.reference.key_prefix(), second.reference.key_prefix());
        assert!(matches!(
            redis.claim(&first).await.unwrap(),
            Claim::Claimed { .. }
        ));
        assert!(matches!(
            redis.claim(&second).await.unwrap(),
            Claim::Claimed { .. }
        ));
        redis
            .complete(&second.key, second.attempt, "\"second\"")
            .await
            .unwrap();
        let Claim::Existing { record } = redis.claim(&again(&first)).await.unwrap() else {
            panic!("the first is still claimed");
        };
        assert_eq!(record.state, RecordState::InProgress);
        let Claim::Existing { record } = redis.claim(&again(&second)).await.unwrap() else {
            panic!("the second is completed");
        };
        assert_eq!(
            record.state,
            RecordState::Completed {
                response: "\"second\"".into()
            }
        );
        let found = redis
            .lookup(&second.tenant, &second.reference)
            .await
            .unwrap()
            .unwrap();
        // Each reference names its own operation, in one tenant or two.
        assert_eq!(found.key, second.key);
        let found = redis
            .lookup(&first.tenant, &first.reference)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(found.key, first.key);
        redis.release(&first.key, first.attempt).await.unwrap();
        assert!(matches!(
            redis.release(&second.key, second.attempt).await,
            Err(StoreError::WrongState { .. })
        ));
        // With the first gone, the second is still there, under its own key.
        let Claim::Existing { record } = redis.claim(&again(&second)).await.unwrap() else {
            panic!("the second outlives the first");
        };
        assert_eq!(record.key, second.key);
        assert_eq!(
            redis.lookup(&first.tenant, &first.reference).await.unwrap(),
            None,
            "the first's reference never names the second"
        );
        // The first runs again, and the records are still apart.
        let next = again(&first);
        assert!(matches!(
            redis.claim(&next).await.unwrap(),
            Claim::Claimed { .. }
        ));
        redis.release(&next.key, next.attempt).await.unwrap();
        bytes[30] ^= 1;
    }
}

/// A claim sent twice (the client resent it after its answer was lost) is
/// the same claim: the second answer says it is claimed, by that attempt.
#[tokio::test]
async fn a_resent_claim_is_the_same_claim() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let req = claim_request(Duration::from_secs(900));
    assert!(matches!(
        redis.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    assert!(matches!(
        redis.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    assert!(matches!(
        redis.claim(&again(&req)).await.unwrap(),
        Claim::Existing { .. }
    ));
}

/// A server that is not there fails fast and says so.
#[tokio::test]
async fn unreachable_server_fails_fast() {
    // Port 1 on loopback: nothing listens there.
    let store = RedisStore::builder("redis://127.0.0.1:1")
        .unwrap()
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = store
        .claim(&claim_request(Duration::from_secs(60)))
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        matches!(err, StoreError::Unavailable(ref m) if m.contains("Redis")),
        "{err}"
    );
    let err = RedisStore::connect("redis://127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_)), "{err}");
}

/// Configuration mistakes are `Config`, and never echo a password.
#[test]
fn bad_configuration_is_refused() {
    let err = RedisStore::builder("http://user:secret@host").unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err}");
    assert!(!err.to_string().contains("secret"), "{err}");
    let err = RedisStore::builder("redis://127.0.0.1")
        .unwrap()
        .prefix("a{b}")
        .build()
        .unwrap_err();
    assert!(matches!(err, StoreError::Config(_)), "{err}");
    let no_nodes: [&str; 0] = [];
    assert!(matches!(
        RedisStore::cluster_builder(no_nodes),
        Err(StoreError::Config(_))
    ));
}

/// The operation of the executor tests: a charge with a counting handler.
async fn charge(
    executor: &Executor,
    amount_cents: u64,
    runs: &AtomicUsize,
) -> Answer<u64, ToolError> {
    let caller = Caller::new("acme", "alice");
    let args = serde_json::json!({ "card": "tok_visa", "amount_cents": amount_cents });
    executor
        .run(
            Operation {
                caller: &caller,
                tool: "charge_card",
                args: &args,
                scope: ScopeSpec::Window(Duration::from_secs(900)),
                status_tool: "get_operation_status",
            },
            |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(amount_cents)
            },
        )
        .await
}

/// Four clients (a connection each), eight tasks on each, one operation at
/// once: the handler runs once; the other calls are told it is in progress,
/// or replay it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn separate_clients_racing_charge_once() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let runs = Arc::new(AtomicUsize::new(0));
    let executors: Vec<Executor> = (0..4)
        .map(|_| {
            let store = RedisStore::builder(&redis.url)
                .unwrap()
                .prefix(&redis.prefix)
                .build()
                .unwrap();
            Executor::new(Arc::new(store))
        })
        .collect();
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let tasks: Vec<_> = (0..32)
        .map(|i| {
            let (executor, runs) = (executors[i % 4].clone(), runs.clone());
            tokio::spawn(async move {
                tokio::time::sleep_until(start).await;
                charge(&executor, 1999, &runs).await.name()
            })
        })
        .collect();
    let mut kinds = Vec::new();
    for t in tasks {
        kinds.push(t.await.unwrap());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "executed").count(), 1);
    assert!(
        kinds
            .iter()
            .all(|k| ["executed", "in_progress", "replayed"].contains(k)),
        "{kinds:?}"
    );
}

/// With `wait_for_replicas`, a claim is answered only once a replica has
/// it; a claim no replica acknowledged is released and answered
/// `Unavailable`, and the handler does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_wait_for_replicas() {
    let Some(primary) = Server::start(&[]) else {
        return;
    };
    let port = primary.port.to_string();
    let mut replica = Server::start(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let started = Instant::now();
    loop {
        let info: String = command(&replica.url(), redis::cmd("INFO").arg("replication")).await;
        if info.contains("master_link_status:up") {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{info}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let store = RedisStore::builder(&primary.url())
        .unwrap()
        .wait_for_replicas(1, Duration::from_millis(500))
        .timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let executor = Executor::new(Arc::new(store.clone()));
    let runs = AtomicUsize::new(0);
    assert_eq!(charge(&executor, 1, &runs).await.name(), "executed");
    let req = claim_request(Duration::from_secs(900));
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    let copy: Vec<Vec<u8>> = command(&replica.url(), redis::cmd("KEYS").arg("idem:*")).await;
    assert!(!copy.is_empty(), "the replica has the claims");
    assert_eq!(
        libraries(&replica.url()).await,
        [RedisStore::library_name()],
        "the replica has the library (a promoted replica needs no load)"
    );

    replica.kill();
    let req = claim_request(Duration::from_secs(900));
    let err = store.claim(&req).await.unwrap_err();
    assert!(
        matches!(err, StoreError::Unavailable(ref m) if m.contains("0 of 1 replicas")),
        "{err}"
    );
    assert_eq!(
        store.lookup(&req.tenant, &req.reference).await.unwrap(),
        None,
        "the unacknowledged claim was released"
    );
    assert_eq!(
        charge(&executor, 2, &runs).await.name(),
        "store_unavailable"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler did not run");

    replica.restart();
    let started = Instant::now();
    loop {
        let answer = charge(&executor, 2, &runs).await;
        if answer.name() == "executed" {
            break;
        }
        assert_eq!(answer.name(), "store_unavailable", "{answer:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(charge(&executor, 2, &runs).await.name(), "replayed");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// Repeats `charge` until it executes (answers in between must say the
/// store is away, or, for a claim that landed but never ran, that it is in
/// progress until released), within `within`.
async fn until_executed(
    executor: &Executor,
    amount_cents: u64,
    runs: &AtomicUsize,
    within: Duration,
) {
    let started = Instant::now();
    loop {
        let answer = charge(executor, amount_cents, runs).await;
        match answer.name() {
            "executed" => return,
            "store_unavailable" | "in_progress" => {}
            _ => panic!("{answer:?}"),
        }
        assert!(
            started.elapsed() < within,
            "still {answer:?} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Redis killed mid-run and started again (with `appendfsync always`, so the
/// records survive): while it is down, claims fail closed and fast and the
/// handler never runs; once it is back, the same store (no restart of the
/// process) serves again, runs the new charge once and replays the old one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_redis_fails_closed_and_recovers() {
    let Some(mut server) = Server::start(&["--appendonly", "yes", "--appendfsync", "always"])
    else {
        return;
    };
    let timeout = Duration::from_millis(500);
    let store = RedisStore::builder(&server.url())
        .unwrap()
        .timeout(timeout)
        .build()
        .unwrap();
    let executor = Executor::new(Arc::new(store));
    let runs = AtomicUsize::new(0);
    assert_eq!(charge(&executor, 1, &runs).await.name(), "executed");

    server.kill();
    for _ in 0..3 {
        let started = Instant::now();
        let answer = charge(&executor, 2, &runs).await;
        assert_eq!(answer.name(), "store_unavailable", "{answer:?}");
        assert!(started.elapsed() < timeout * 3, "{:?}", started.elapsed());
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler never ran");

    server.restart();
    until_executed(&executor, 2, &runs, Duration::from_secs(10)).await;
    assert_eq!(charge(&executor, 2, &runs).await.name(), "replayed");
    assert_eq!(
        charge(&executor, 1, &runs).await.name(),
        "replayed",
        "the first charge's record survived the restart"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The libraries a server holds, by name (`FUNCTION LIST`).
async fn libraries(url: &str) -> Vec<String> {
    let listed: Vec<redis::Value> = command(url, redis::cmd("FUNCTION").arg("LIST")).await;
    listed
        .iter()
        .filter_map(|library| match library {
            // RESP2: a flat list of field names and values.
            redis::Value::Array(fields) => fields
                .chunks(2)
                .find(|kv| matches!(&kv[0], redis::Value::BulkString(k) if k == b"library_name"))
                .and_then(|kv| match &kv[1] {
                    redis::Value::BulkString(name) => String::from_utf8(name.clone()).ok(),
                    _ => None,
                }),
            _ => None,
        })
        .collect()
}

/// The store's scripts are a Redis Functions library, loaded by the first
/// call that finds it missing: on a new server, after `FUNCTION FLUSH`
/// (claims with and without a pipelined `WAIT` reload it), and after a
/// restart that kept no data. Another version's library on the same server
/// (its functions named after its own library) is left alone and not called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_library_is_loaded_again() {
    let Some(mut server) = Server::start(&[]) else {
        return;
    };
    let url = server.url();
    let library = RedisStore::library_name();
    assert!(
        library.starts_with("idem_") && library.len() == 21,
        "{library}"
    );
    // An older version's library, whose claim would answer an error.
    let older = "idem_0000000000000000";
    let _: String = command(
        &url,
        redis::cmd("FUNCTION").arg("LOAD").arg(format!(
            "#!lua name={older}\n\
             redis.register_function('{older}_claim', function() return redis.error_reply('old') end)"
        )),
    )
    .await;
    assert_eq!(libraries(&url).await, [older]);

    let store = RedisStore::builder(&url).unwrap().build().unwrap();
    let waiting = RedisStore::builder(&url)
        .unwrap()
        .wait_for_replicas(0, Duration::from_millis(10))
        .build()
        .unwrap();
    let (executor, waiting) = (
        Executor::new(Arc::new(store)),
        Executor::new(Arc::new(waiting)),
    );
    let runs = AtomicUsize::new(0);
    assert_eq!(charge(&executor, 1, &runs).await.name(), "executed");
    let mut found = libraries(&url).await;
    found.sort();
    assert_eq!(found, [older, library], "loaded beside the older one");

    for (i, executor) in [&executor, &waiting].into_iter().enumerate() {
        let _: () = command(&url, redis::cmd("FUNCTION").arg("FLUSH")).await;
        assert!(libraries(&url).await.is_empty());
        let amount = 10 + i as u64;
        assert_eq!(charge(executor, amount, &runs).await.name(), "executed");
        assert_eq!(charge(executor, amount, &runs).await.name(), "replayed");
        assert_eq!(charge(executor, 1, &runs).await.name(), "replayed");
        assert_eq!(libraries(&url).await, [library]);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    // No persistence: the restart loses the records and the library alike.
    server.restart();
    until_executed(&executor, 1, &runs, Duration::from_secs(10)).await;
    assert_eq!(charge(&executor, 1, &runs).await.name(), "replayed");
    assert_eq!(libraries(&url).await, [library]);
    assert_eq!(runs.load(Ordering::SeqCst), 4);
}

/// A failover: the replica, promoted once its primary is gone, already has
/// the library (functions are replicated with the data), so the store on it
/// replays the charge made on the primary and runs a new one without
/// loading anything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_replica_has_the_library() {
    let Some(mut primary) = Server::start(&[]) else {
        return;
    };
    let port = primary.port.to_string();
    let replica = Server::start(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let on_primary = Executor::new(Arc::new(
        RedisStore::builder(&primary.url())
            .unwrap()
            .wait_for_replicas(1, Duration::from_secs(2))
            .timeout(Duration::from_secs(3))
            .build()
            .unwrap(),
    ));
    let runs = AtomicUsize::new(0);
    let started = Instant::now();
    // Until the replica is in sync, claims that no replica acknowledged are
    // released and refused.
    until_executed(&on_primary, 1, &runs, Duration::from_secs(20)).await;
    assert!(started.elapsed() < Duration::from_secs(20));

    primary.kill();
    let _: () = command(&replica.url(), redis::cmd("REPLICAOF").arg("NO").arg("ONE")).await;
    let _: () = command(&replica.url(), redis::cmd("CONFIG").arg("RESETSTAT")).await;
    let on_replica = Executor::new(Arc::new(
        RedisStore::builder(&replica.url())
            .unwrap()
            .build()
            .unwrap(),
    ));
    assert_eq!(charge(&on_replica, 1, &runs).await.name(), "replayed");
    assert_eq!(charge(&on_replica, 2, &runs).await.name(), "executed");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let stats: String = command(&replica.url(), redis::cmd("INFO").arg("commandstats")).await;
    assert!(stats.contains("cmdstat_fcall:"), "{stats}");
    assert!(
        !stats.contains("cmdstat_function"),
        "the promoted replica was sent the library: {stats}"
    );
}

/// CLIENT PAUSE holds every write: a claim made meanwhile times out and
/// fails closed; once the pause ends, the store serves again, and the paused
/// charge runs once (its claim, if it landed after the pause, is released by
/// the executor first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_fails_closed_then_serves() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let timeout = Duration::from_millis(300);
    let store = RedisStore::builder(&server.url())
        .unwrap()
        .timeout(timeout)
        .build()
        .unwrap();
    let executor = Executor::new(Arc::new(store));
    let runs = AtomicUsize::new(0);
    assert_eq!(charge(&executor, 1, &runs).await.name(), "executed");

    let _: () = command(
        &server.url(),
        redis::cmd("CLIENT").arg("PAUSE").arg(1500).arg("WRITE"),
    )
    .await;
    let started = Instant::now();
    let answer = charge(&executor, 2, &runs).await;
    assert_eq!(answer.name(), "store_unavailable", "{answer:?}");
    assert!(started.elapsed() < timeout * 3, "{:?}", started.elapsed());
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler did not run");

    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(charge(&executor, 3, &runs).await.name(), "executed");
    until_executed(&executor, 2, &runs, Duration::from_secs(10)).await;
    assert_eq!(charge(&executor, 2, &runs).await.name(), "replayed");
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// The store's connections killed by the server (CLIENT KILL): a call may
/// find its connection gone and fail closed; the store reconnects by itself
/// and each charge runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_reconnect() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let store = RedisStore::builder(&server.url())
        .unwrap()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let executor = Executor::new(Arc::new(store));
    let runs = AtomicUsize::new(0);
    for round in 1..=3u64 {
        assert_eq!(
            charge(&executor, round * 10, &runs).await.name(),
            "executed"
        );
        let killed: i64 = command(
            &server.url(),
            redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg("normal")
                .arg("SKIPME")
                .arg("yes"),
        )
        .await;
        assert!(killed >= 1, "the store's connection was killed");
        until_executed(&executor, round * 10 + 1, &runs, Duration::from_secs(5)).await;
        assert_eq!(
            charge(&executor, round * 10, &runs).await.name(),
            "replayed"
        );
        assert_eq!(
            charge(&executor, round * 10 + 1, &runs).await.name(),
            "replayed"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2 * round as usize);
    }
}

/// A follow-on job has no TTL and outlives its record: the record Redis
/// deletes at the end of its window leaves its job in place, listed and
/// leased. The job sits on its record's slot (the same hash tag).
#[tokio::test]
async fn jobs_outlive_their_record() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let short = Duration::from_millis(300);
    let req = ClaimRequest {
        lease: short,
        window: short,
        retention: short,
        ..claim_request(short)
    };
    let name = format!("receipt_{}", idem_runtime::store::Attempt::random().get());
    redis.claim(&req).await.unwrap();
    let job =
        idem_runtime::outbox::FollowOn::new(&name, &serde_json::json!({ "to": "a@b" })).unwrap();
    redis
        .complete_with_follow_ons(
            &req.key,
            req.attempt,
            "1",
            idem_runtime::store::FollowOns::new(&[job]).unwrap(),
        )
        .await
        .unwrap();
    let record = record_key(&redis.prefix, &req.key);
    let tenant_hex: String = req.tenant.bytes().map(|b| format!("{b:02x}")).collect();
    let (tag, _) = record
        .strip_prefix(&format!("{}:", redis.prefix))
        .unwrap()
        .split_once(":r:")
        .unwrap();
    // Under the operation's whole reference.
    let reference: String = req
        .reference
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let job_key = format!("{}:{tag}:j:{reference}:{tenant_hex}:{name}", redis.prefix);
    assert_eq!(
        expire_time(&redis.url, &job_key).await,
        -1,
        "the job exists, without a TTL"
    );

    tokio::time::sleep(Duration::from_millis(600)).await;
    let exists: i64 = command(&redis.url, redis::cmd("EXISTS").arg(&record)).await;
    assert_eq!(
        exists, 0,
        "Redis deleted the record at the end of its window"
    );
    let leased = redis
        .lease_jobs(
            &[name.as_str()],
            10,
            Duration::from_secs(60),
            idem_runtime::store::Attempt::random(),
        )
        .await
        .unwrap();
    assert_eq!(leased.len(), 1, "the job outlived its record");
    assert_eq!(leased[0].id.reference, req.reference);
}

/// A record as an earlier version of the store wrote it: a hash of these
/// fields, times in µs on the server's clock.
async fn write_hash_record(url: &str, key: &str, req: &ClaimRequest, state: &str, body: &str) {
    let now = server_time(url).await.duration_since(UNIX_EPOCH).unwrap();
    let at = |d: Duration| (now + d).as_micros().to_string();
    let micros_now = now.as_micros().to_string();
    let mut hset = redis::cmd("HSET");
    hset.arg(key)
        .arg("k")
        .arg(&req.key.as_bytes()[..])
        .arg("f")
        .arg(&req.key.fingerprint()[..])
        .arg("t")
        .arg(&req.tenant)
        .arg("o")
        .arg(&req.tool)
        .arg("s")
        .arg(state)
        .arg("a")
        .arg(req.attempt.get().to_string())
        .arg("c")
        .arg(&micros_now)
        .arg("u")
        .arg(&micros_now)
        .arg("l")
        .arg(at(req.lease))
        .arg("e")
        .arg(at(req.window))
        .arg("r")
        .arg(at(req.retention))
        .arg("n")
        .arg(&micros_now)
        .arg("x")
        .arg("0")
        .arg("b")
        .arg(body);
    let _: i64 = command(url, &hset).await;
    let _: i64 = command(url, redis::cmd("PEXPIRE").arg(key).arg(3_600_000)).await;
}

/// Records that an earlier version of the store wrote as hashes are still
/// read after an upgrade: a completed one answers a repeat with its response
/// (no second run), an in-progress one is completed by its attempt, and the
/// change writes it back in the current form.
#[tokio::test]
async fn records_written_as_hashes_are_read_after_an_upgrade() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let done = claim_request(Duration::from_secs(900));
    write_hash_record(
        &redis.url,
        &record_key(&redis.prefix, &done.key),
        &done,
        "1",
        r#"{"receipt":"r-1"}"#,
    )
    .await;
    match redis.claim(&again(&done)).await.unwrap() {
        Claim::Existing { record } => {
            assert_eq!(record.attempt, done.attempt);
            assert_eq!(record.tenant, done.tenant);
            assert_eq!(
                record.state,
                RecordState::Completed {
                    response: r#"{"receipt":"r-1"}"#.to_owned()
                }
            );
        }
        other => panic!("a repeat of a completed hash record claimed it: {other:?}"),
    }

    let running = claim_request(Duration::from_secs(900));
    let key = record_key(&redis.prefix, &running.key);
    write_hash_record(&redis.url, &key, &running, "0", "").await;
    assert!(matches!(
        redis.claim(&again(&running)).await.unwrap(),
        Claim::Existing { .. }
    ));
    redis
        .complete(&running.key, running.attempt, "2")
        .await
        .unwrap();
    let kind: String = command(&redis.url, redis::cmd("TYPE").arg(&key)).await;
    assert_eq!(kind, "string");
    // Written before references had tags: its reference is the key's first
    // eight bytes, as it was printed then, and it keeps it.
    let legacy = idem_runtime::Reference::with_tag(&running.key, 0);
    assert_eq!(legacy.to_string().len(), "idem_".len() + 16);
    let record = redis
        .lookup(&running.tenant, &legacy)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.reference, legacy);
    assert_eq!(
        record.state,
        RecordState::Completed {
            response: "2".to_owned()
        }
    );
}

/// The store's library as version 8d26ab9 loaded it (its `FUNCTION LOAD`
/// text, byte for byte): the scripts that extended a late completion's
/// window to its retention, and gave a COMPLETED record its native expiry at
/// the end of its window.
const LIBRARY_8D26AB9: &str = include_str!("data/redis/library-8d26ab9.lua");

/// The library name in the first line of a library's code.
fn library_name_of(code: &str) -> &str {
    code.lines()
        .next()
        .and_then(|l| l.strip_prefix("#!lua name="))
        .unwrap()
}

/// One call of a function of 8d26ab9's library over the record of `req`:
/// `ARGV[1]` packs the key, the key in hex and `tail`, as that version's
/// store did.
async fn call_8d26ab9(
    url: &str,
    prefix: &str,
    function: &str,
    req: &ClaimRequest,
    tail: &[u8],
    args: &[&str],
) -> redis::Value {
    let hex: String = req
        .key
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let packed = [&req.key.as_bytes()[..], hex.as_bytes(), tail].concat();
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(format!("{}_{function}", library_name_of(LIBRARY_8D26AB9)))
        .arg(1)
        .arg(record_key(prefix, &req.key))
        .arg(packed)
        .arg(args);
    command(url, &cmd).await
}

/// A text as 8d26ab9's scripts unpack it (`i4c0`).
fn packed_text(text: &str) -> Vec<u8> {
    [&(text.len() as u32).to_le_bytes()[..], text.as_bytes()].concat()
}

/// 8d26ab9's claim of `req`, then its completion (`late`: after the sweep
/// marked it UNKNOWN and its window ended, which extended its window to its
/// retention), both by that version's own scripts.
async fn completed_by_8d26ab9(url: &str, prefix: &str, req: &ClaimRequest, late: bool) {
    let micros = |d: Duration| (d.as_micros() as f64).to_le_bytes();
    let attempt = packed_text(&req.attempt.get().to_string());
    let claim = [
        &req.key.fingerprint()[..],
        &packed_text(&req.tenant),
        &packed_text(&req.tool),
        &attempt,
        &micros(req.lease),
        &micros(req.window),
        &micros(req.retention),
        &req.reference.tag().to_be_bytes(),
    ]
    .concat();
    let reply = call_8d26ab9(url, prefix, "claim", req, &claim, &[]).await;
    assert!(
        matches!(&reply, redis::Value::Array(a) if a.first() == Some(&redis::Value::Int(5))),
        "claimed by 8d26ab9's script: {reply:?}"
    );
    if late {
        call_8d26ab9(
            url,
            prefix,
            "mark_unknown",
            req,
            &attempt,
            &["timeout", "0"],
        )
        .await;
        tokio::time::sleep(req.window + Duration::from_millis(100)).await;
    }
    let reply = call_8d26ab9(url, prefix, "complete", req, &attempt, &["\"old\""]).await;
    assert_eq!(reply, redis::Value::Array(vec![redis::Value::Int(0)]));
}

/// A server that holds 8d26ab9's library and records its scripts wrote: the
/// store loads its own library beside it (its name is a hash of its code,
/// so a new version's first call finds its functions missing) and reads
/// those records under the new rules. A record completed on time answers
/// repeats for its window; the purge moves its native expiry from the end of
/// its window to its retention; after the window the same call is a new
/// operation, and the old one still reads by its reference. A record
/// completed late, whose window 8d26ab9 moved to its retention, holds its
/// key as that version promised (its first window was not kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_8d26ab9_read_and_are_taken_over_under_the_new_rules() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let url = server.url();
    let old = library_name_of(LIBRARY_8D26AB9);
    assert_ne!(
        old,
        RedisStore::library_name(),
        "the library's name changed"
    );
    let _: String = command(
        &url,
        redis::cmd("FUNCTION").arg("LOAD").arg(LIBRARY_8D26AB9),
    )
    .await;
    let prefix = "upgraded";
    let on_time = ClaimRequest {
        window: Duration::from_millis(1500),
        retention: Duration::from_secs(3600),
        ..claim_request(Duration::from_millis(1500))
    };
    let late = ClaimRequest {
        lease: Duration::from_millis(100),
        window: Duration::from_millis(200),
        retention: Duration::from_secs(3600),
        ..claim_request(Duration::from_millis(200))
    };
    completed_by_8d26ab9(&url, prefix, &on_time, false).await;
    completed_by_8d26ab9(&url, prefix, &late, true).await;
    let key = record_key(prefix, &on_time.key);
    let ttl_then = expire_time(&url, &key).await;

    let store = RedisStore::builder(&url)
        .unwrap()
        .prefix(prefix)
        .build()
        .unwrap();
    let Claim::Existing { record } = store.claim(&new_operation(&on_time)).await.unwrap() else {
        panic!("a repeat inside the window of 8d26ab9's completion claimed it");
    };
    assert_eq!(record.reference, on_time.reference);
    assert_eq!(
        record.state,
        RecordState::Completed {
            response: "\"old\"".into()
        }
    );
    assert_eq!(ttl_then, ms_ceil(record.expires_at), "8d26ab9's expiry");
    let mut found = libraries(&url).await;
    found.sort();
    let mut want = vec![old.to_owned(), RedisStore::library_name().to_owned()];
    want.sort();
    assert_eq!(found, want, "the new library loaded beside the old one");

    // The purge migrates the shards one SCAN step each: until every shard
    // is done, the record gets its retention as native expiry.
    let mut rounds = 0;
    while expire_time(&url, &key).await != ms_ceil(record.retain_until) {
        store.purge_expired(1000).await.unwrap();
        rounds += 1;
        assert!(rounds < 100, "the purge never moved the expiry");
    }

    // The late one holds its key for its (moved) window, as 8d26ab9 said.
    let Claim::Existing { record: held } = store.claim(&new_operation(&late)).await.unwrap() else {
        panic!("8d26ab9's late completion no longer holds its key");
    };
    assert_eq!(held.reference, late.reference);
    assert_eq!(held.expires_at, held.retain_until);

    // After the window: a new operation, and the old one reads as it was.
    let wait = record
        .expires_at
        .duration_since(server_time(&url).await)
        .unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(100)).await;
    let later = new_operation(&on_time);
    let Claim::Claimed { reference } = store.claim(&later).await.unwrap() else {
        panic!("the same call after the window did not run");
    };
    assert_eq!(reference, later.reference);
    let first = store
        .lookup(&on_time.tenant, &on_time.reference)
        .await
        .unwrap()
        .expect("8d26ab9's operation reads by its reference after the takeover");
    assert_eq!(
        (first.attempt, first.state, first.retain_until),
        (
            on_time.attempt,
            RecordState::Completed {
                response: "\"old\"".into()
            },
            record.retain_until
        )
    );
    let superseded = format!(
        "{prefix}:{{{:02x}}}:o:{}",
        on_time.key.as_bytes()[0] % 64,
        on_time
            .reference
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    assert_eq!(
        expire_time(&url, &superseded).await,
        ms_ceil(record.retain_until),
        "kept until its retention, by Redis' own expiry"
    );
    let now = store.lookup(&later.tenant, &later.reference).await.unwrap();
    assert_eq!(now.map(|r| r.attempt), Some(later.attempt));
    assert!(matches!(
        store.complete(&on_time.key, on_time.attempt, "1").await,
        Err(StoreError::Fenced)
    ));
}

/// A user the server does not allow to load the store's library (no
/// `FUNCTION LOAD` in its ACL) is a configuration error that says which
/// permissions to grant, not an outage to retry: `Config`, from the claim
/// (with and without a pipelined `WAIT`) and from a lookup. With the
/// permission granted, the same store serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_function_load_is_a_configuration_error() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let url = server.url();
    let user = format!(
        "idem-noload-{:016x}",
        idem_runtime::store::Attempt::random().get()
    );
    let _: () = command(
        &url,
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&user)
            .arg("on")
            .arg(">secret")
            .arg("~*")
            .arg("+@all")
            .arg("-function"),
    )
    .await;
    let as_user = format!("redis://{user}:secret@127.0.0.1:{}", server.port);
    let store = RedisStore::builder(&as_user).unwrap().build().unwrap();
    let waiting = RedisStore::builder(&as_user)
        .unwrap()
        .wait_for_replicas(0, Duration::from_millis(10))
        .build()
        .unwrap();
    let req = claim_request(Duration::from_secs(60));
    for err in [
        store.claim(&req).await.unwrap_err(),
        waiting.claim(&req).await.unwrap_err(),
        store.lookup(&req.tenant, &req.reference).await.unwrap_err(),
    ] {
        let StoreError::Config(message) = &err else {
            panic!("not a configuration error: {err:?}");
        };
        assert!(message.contains("NOPERM"), "{message}");
        assert!(message.contains("'function|load'"), "{message}");
        assert!(message.contains("ACL SETUSER <user> +fcall"), "{message}");
        assert!(message.contains(RedisStore::library_name()), "{message}");
    }
    assert!(libraries(&url).await.is_empty(), "nothing was loaded");

    let _: () = command(
        &url,
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg(&user)
            .arg("+function|load"),
    )
    .await;
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    let _: i64 = command(&url, redis::cmd("ACL").arg("DELUSER").arg(&user)).await;
}
