//! A reference found without its tenant (`find_by_reference`, what
//! `idem show REF` asks): where a lookup reads, never a SCAN of the
//! keyspace. Counted on a server of the test's own, by the commands it ran
//! (`INFO commandstats`).

use std::collections::BTreeMap;
use std::time::Duration;

use idem_runtime::store::conformance::claim_request;
use idem_runtime::{IdempotencyStore, RedisStore};

use crate::redis_server::{command, Server};
use idem_runtime::store::Inspect;

/// How many times the server ran each command so far, by name
/// (`cmdstat_scan` is `scan`), commands run by scripts and functions
/// included.
pub(crate) async fn commandstats(url: &str) -> BTreeMap<String, u64> {
    let info: String = command(url, redis::cmd("INFO").arg("commandstats")).await;
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats
                .split(',')
                .find_map(|s| s.strip_prefix("calls="))?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .collect()
}

/// What the server ran between two readings, by name.
pub(crate) fn ran(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(name, n)| (name.clone(), n - before.get(name).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Among 64 records, one is found by its reference with one function call
/// that reads its keys: no SCAN, no KEYS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_is_found_without_a_scan() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let store = RedisStore::builder(&server.url()).unwrap().build().unwrap();
    let reqs: Vec<_> = (0..64)
        .map(|_| claim_request(Duration::from_secs(900)))
        .collect();
    for req in &reqs {
        store.claim(req).await.unwrap();
    }
    let before = commandstats(&server.url()).await;
    let found = store.find_by_reference(&reqs[7].reference).await.unwrap();
    let after = commandstats(&server.url()).await;
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].tenant.as_str(), found[0].attempt),
        (reqs[7].tenant.as_str(), reqs[7].attempt)
    );
    let ran = ran(&before, &after);
    assert!(
        !ran.contains_key("scan") && !ran.contains_key("keys"),
        "{ran:?}"
    );
    // The reading of the stats itself, and one function call.
    assert_eq!(ran.get("fcall"), Some(&1), "{ran:?}");
    assert!(ran.get("get").is_some_and(|n| *n <= 3), "{ran:?}");
}
