//! A rolling deploy from each earlier library version in the repository
//! to this one (`tests/rolling`), on the shared server, both replicas
//! connected as the user docs/deploying.md gives a server: the old replica
//! is this version's store speaking as that version did (`earlier.rs` says
//! how, and why that is faithful).

use std::sync::Arc;

use idem_runtime::RedisStore;

use crate::earlier::{AsEarlier, Earlier, EARLIER};
use crate::redis_server::{command, redis_url, serving_url, Prefixed};
use crate::rolling::{rolling_deploy, Replica, World};

/// `url` (`redis://[user:password@]host:port`) with `host:port` in place
/// of its own.
fn at(url: &str, host: &str) -> String {
    let rest = url.trim_start_matches("redis://");
    match rest.rsplit_once('@') {
        Some((user, _)) => format!("redis://{user}@{host}"),
        None => format!("redis://{host}"),
    }
}

/// One deploy from `earlier`, under a fresh prefix.
async fn deploy_from(url: String, earlier: Earlier) {
    // That version's replica loads its library at its first call; a
    // server's user may not, so the administrator loads it, as the deploy
    // step that loaded it then did.
    let _: String = command(
        &url,
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(earlier.code),
    )
    .await;
    let new = Prefixed::new().await.unwrap();
    let host = url.trim_start_matches("redis://");
    let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
    let proxy = AsEarlier::start(host, earlier).await;
    let old = RedisStore::builder(&at(
        &new.store_url,
        proxy.url.trim_start_matches("redis://"),
    ))
    .unwrap()
    .prefix(&new.prefix)
    .build()
    .unwrap();
    let world = Arc::new(World::default());
    let start_new = async { Replica::new("this version", Arc::new(new.store.clone()), &world) };
    let mut old = Replica::new(earlier.commit, Arc::new(old), &world);
    if earlier.window_only {
        old = old.window_only();
    }
    rolling_deploy(old, start_new, world.clone()).await;
    assert!(
        proxy.made.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "{}: nothing went through its library",
        earlier.commit
    );
}

/// From each earlier library at once (each under a prefix of its own):
/// every one of them and this version serve together, and the deploy loses
/// nothing and runs nothing twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_from_each_earlier_library_loses_nothing() {
    let Some(url) = redis_url() else {
        return;
    };
    serving_url(&url).await;
    let deploys: Vec<_> = EARLIER
        .into_iter()
        .map(|earlier| {
            (
                earlier.commit,
                tokio::spawn(deploy_from(url.clone(), earlier)),
            )
        })
        .collect();
    let mut failed = Vec::new();
    for (commit, deploy) in deploys {
        if let Err(e) = deploy.await {
            let panic = e.into_panic();
            let said = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failed.push(format!("from {commit}: {said}"));
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}
