//! `show REF` without `--tenant` on the stores that find a reference where
//! a lookup reads: DynamoDB (its requests counted through a proxy) and
//! Redis (the commands a server of the test's own ran). Neither is asked to
//! read every record: no Scan, no SCAN.

use std::time::Duration;

use idem_cli::EXIT_OK;
use idem_runtime::follow_ons::FollowOn;
use idem_runtime::store::conformance::claim_request;
use idem_runtime::store::FollowOns;
use idem_runtime::{IdempotencyStore, RedisStore};
use serde_json::json;

use crate::operator::{fill, idem};
use crate::{dynamodb_emulator, dynamodb_proxy, redis_server};

/// Among other records, `show REF` finds the UNKNOWN one of `fill` and its
/// jobs, in its tenant, as JSON.
async fn shown_anywhere(url: &str, store: &dyn IdempotencyStore) -> serde_json::Value {
    for _ in 0..20 {
        store
            .claim(&claim_request(Duration::from_secs(900)))
            .await
            .unwrap();
    }
    let reqs = fill(store).await;
    let jobs = [FollowOn::new("receipt", &1).unwrap()];
    store
        .follow_ons()
        .unwrap()
        .complete_with_follow_ons(
            &reqs[2].key,
            reqs[2].attempt,
            "\"shipped\"",
            FollowOns::new(&jobs).unwrap(),
        )
        .await
        .unwrap();
    let shown = idem(url, &["--json", "show", &reqs[2].reference.to_string()]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    let shown = shown.json();
    assert_eq!(shown["tenant"], json!(reqs[2].tenant), "{shown}");
    assert_eq!(shown["state"], json!("COMPLETED"), "{shown}");
    assert_eq!(shown["jobs"][0]["name"], json!("receipt"), "{shown}");
    shown
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_on_dynamodb_reads_no_scan() {
    let Some(endpoint) = dynamodb_emulator::endpoint() else {
        return;
    };
    for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, "testing");
        }
    }
    let proxy = dynamodb_proxy::Proxy::start(&endpoint).await;
    let table = dynamodb_emulator::Table::on(&proxy.url).await;
    let url = format!(
        "dynamodb://{}?region=us-east-1&endpoint={}",
        table.table(),
        proxy.url
    );
    // The store the command line opens checks its table first.
    let before = proxy.counts();
    shown_anywhere(&url, &table.store).await;
    let after = proxy.counts();
    assert_eq!(proxy.count("Scan"), 0, "{before:?} then {after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_on_redis_runs_no_scan() {
    let Some(server) = redis_server::Server::start(&[]) else {
        return;
    };
    let store = RedisStore::builder(&server.url()).unwrap().build().unwrap();
    let before = commandstats(&server.url()).await;
    shown_anywhere(&server.url(), &store).await;
    let after = commandstats(&server.url()).await;
    let scans = |stats: &std::collections::BTreeMap<String, u64>| {
        stats.get("scan").copied().unwrap_or(0) + stats.get("keys").copied().unwrap_or(0)
    };
    assert_eq!(scans(&after), scans(&before), "{before:?} then {after:?}");
}

/// How many times the server ran each command so far, by name.
async fn commandstats(url: &str) -> std::collections::BTreeMap<String, u64> {
    let info: String = redis_server::command(url, redis::cmd("INFO").arg("commandstats")).await;
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
