//! Faults: a server that is not there, a replica that does not acknowledge
//! (the durability option), and servers of the tests' own restarted mid-run,
//! paused (CLIENT PAUSE) or killing the store's connections.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::store::conformance::claim_request;
use idem_runtime::{store::Claim, Executor, IdempotencyStore, RedisStore, StoreError};

use crate::redis_server::{command, Server};
use crate::{charge, libraries, until_executed};

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
