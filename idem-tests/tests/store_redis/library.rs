//! The store's scripts, a Redis Functions library: loaded again when a
//! server lost it, already on a promoted replica, and a user not allowed to
//! load it, and the users docs/deploying.md gives.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::store::conformance::claim_request;
use idem_runtime::{store::Claim, Executor, IdempotencyStore, RedisStore, StoreError};

use crate::redis_server::{command, documented_user, Server};
use crate::{charge, libraries, until_executed};

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
        assert!(message.contains("ACL SETUSER <user> reset"), "{message}");
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

/// The users docs/deploying.md gives: a server's (`idem-server`), which may
/// not load the library, finds it missing as a configuration error that
/// names what to grant; the deploy step's (`idem-loader`) loads it and may
/// do nothing else; then the server's serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_users_load_the_library_and_serve() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let url = server.url();
    let as_server = documented_user(&url, "idem-server", "idem:*").await;
    let as_loader = documented_user(&url, "idem-loader", "idem:*").await;
    let store = RedisStore::builder(&as_server).unwrap().build().unwrap();
    let req = claim_request(Duration::from_secs(60));
    match store.claim(&req).await {
        Err(StoreError::Config(message)) => {
            assert!(message.contains("function|load"), "{message}")
        }
        other => panic!("the library missing: {other:?}"),
    }
    let loader = RedisStore::builder(&as_loader).unwrap().build().unwrap();
    match loader.claim(&req).await {
        Err(StoreError::Config(message)) => assert!(message.contains("NOPERM"), "{message}"),
        other => panic!("the loader may not call the library: {other:?}"),
    }
    loader.load_library().await.unwrap();
    assert_eq!(libraries(&url).await, [RedisStore::library_name()]);
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
}
