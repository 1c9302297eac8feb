//! Follow-ons on the command line: `jobs` in each state, `redrive`, the
//! jobs `show` lists with their operation, and a job's history across
//! re-drives.

use std::time::Duration;

use idem_cli::{EXIT_OK, EXIT_OPERATOR, EXIT_USAGE};
use idem_runtime::store::conformance::claim_request;
use idem_runtime::{
    store::{Claim, FollowOnStore},
    IdempotencyStore, SqliteStore,
};
use serde_json::{json, Value};

use crate::durable::temp_dir;
use crate::operator::idem;

/// A SQLite store in a fresh directory (kept while the returned guard
/// lives; its URL for the command line) with one operation completed, its
/// follow-ons `send_receipt` and `notify_warehouse` due and not yet run.
async fn paid_with_two_follow_ons(
    dir: &str,
) -> (
    crate::durable::TempDir,
    String,
    SqliteStore,
    idem_runtime::store::ClaimRequest,
) {
    let dir = temp_dir(dir);
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    let req = claim_request(Duration::from_secs(900));
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    let jobs = ["send_receipt", "notify_warehouse"].map(|name| {
        idem_runtime::follow_ons::FollowOn::new(name, &json!({"to": "a@example.com"})).unwrap()
    });
    store
        .complete_with_follow_ons(
            &req.key,
            req.attempt,
            "\"paid\"",
            idem_runtime::store::FollowOns::new(&jobs).unwrap(),
        )
        .await
        .unwrap();
    (dir, url, store, req)
}

/// "Was the e-mail sent?": a delivered job is listed by `jobs --state
/// delivered` with when it was delivered and by which run, left out of the
/// default listing (the work to do), and `show` lists it with the
/// operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_jobs_are_listed_and_shown() {
    let (_dir, url, store, req) = paid_with_two_follow_ons("cli-delivered").await;
    let token = idem_runtime::store::Attempt::random();
    let leased = store
        .lease_follow_ons(&["send_receipt"], 1, Duration::from_secs(60), token)
        .await
        .unwrap();
    store.finish_follow_on(&leased[0].id, token).await.unwrap();
    let reference = req.reference.to_string();

    let delivered = idem(&url, &["--json", "follow-ons", "--state", "delivered"]).await;
    assert_eq!(delivered.code, EXIT_OK, "{delivered:?}");
    let delivered = delivered.json();
    assert_eq!(delivered.as_array().map(Vec::len), Some(1), "{delivered}");
    assert_eq!(delivered[0]["name"], json!("send_receipt"));
    assert_eq!(delivered[0]["state"], json!("delivered"));
    assert_eq!(delivered[0]["runs"], json!(1));
    assert!(delivered[0]["delivered_at"].is_string(), "{delivered}");
    assert!(delivered[0]["kept_until"].is_string(), "{delivered}");
    let table = idem(&url, &["follow-ons", "--state", "delivered"]).await;
    assert!(
        table.out.contains(&reference) && table.out.contains("delivered"),
        "{}",
        table.out
    );

    let waiting = idem(&url, &["--json", "follow-ons"]).await.json();
    let names: Vec<&Value> = waiting
        .as_array()
        .unwrap()
        .iter()
        .map(|j| &j["name"])
        .collect();
    assert_eq!(names, [&json!("notify_warehouse")], "{waiting}");
    let by_state = idem(&url, &["--json", "follow-ons", "--state", "waiting"])
        .await
        .json();
    assert_eq!(by_state, waiting);
    let dead = idem(&url, &["--json", "follow-ons", "--state", "dead"])
        .await
        .json();
    assert_eq!(dead, json!([]));

    let shown = idem(&url, &["show", &reference, "--tenant", &req.tenant]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    let line = shown
        .out
        .lines()
        .find(|l| l.starts_with("send_receipt"))
        .unwrap_or_else(|| panic!("show lists the delivered job: {}", shown.out));
    let at = delivered[0]["delivered_at"].as_str().unwrap();
    assert!(line.contains("delivered") && line.contains(at), "{line}");
    assert!(
        shown
            .out
            .lines()
            .any(|l| l.starts_with("notify_warehouse") && l.contains("waiting")),
        "{}",
        shown.out
    );
}

/// `jobs --dead` lists the dead letter, `redrive` takes a job out of it (and
/// refuses one that is not there), and the job is due again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_jobs_are_listed_and_redriven() {
    let dir = temp_dir("cli-jobs");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    let req = claim_request(Duration::from_secs(900));
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    let receipt =
        idem_runtime::follow_ons::FollowOn::new("send_receipt", &json!({"to": "a@example.com"}))
            .unwrap();
    store
        .complete_with_follow_ons(
            &req.key,
            req.attempt,
            "\"paid\"",
            idem_runtime::store::FollowOns::new(&[receipt]).unwrap(),
        )
        .await
        .unwrap();
    let token = idem_runtime::store::Attempt::random();
    let leased = store
        .lease_follow_ons(&["send_receipt"], 1, Duration::from_secs(60), token)
        .await
        .unwrap();
    store
        .bury_follow_on(&leased[0].id, token, "mailer bounced: no such address")
        .await
        .unwrap();
    let reference = req.reference.to_string();

    let live = idem(&url, &["--json", "follow-ons"]).await;
    assert_eq!(live.code, EXIT_OK, "{live:?}");
    assert_eq!(live.json(), json!([]));
    let dead = idem(&url, &["follow-ons", "--dead"]).await;
    assert_eq!(dead.code, EXIT_OK, "{dead:?}");
    assert!(
        dead.out.contains(&reference) && dead.out.contains("mailer bounced"),
        "{}",
        dead.out
    );
    let listed = idem(
        &url,
        &["--json", "follow-ons", "--dead", "--reference", &reference],
    )
    .await;
    let listed = listed.json();
    assert_eq!(
        listed[0]["downstream_key"],
        json!(format!("{reference}:send_receipt"))
    );
    assert_eq!(listed[0]["runs"], json!(1));
    assert_eq!(listed[0]["payload"], json!({"to": "a@example.com"}));
    assert_eq!(listed[0]["state"], json!("dead"));

    // `show` lists the operation's jobs with their state.
    let shown = idem(&url, &["show", &reference, "--tenant", &req.tenant]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    let job_line = shown
        .out
        .lines()
        .find(|l| l.starts_with("send_receipt"))
        .unwrap_or_else(|| panic!("show lists the job: {}", shown.out));
    assert!(
        job_line.contains("dead") && job_line.contains("mailer bounced"),
        "{job_line}"
    );
    let shown = idem(
        &url,
        &["--json", "show", &reference, "--tenant", &req.tenant],
    )
    .await
    .json();
    assert_eq!(shown["jobs"][0]["name"], json!("send_receipt"), "{shown}");
    assert_eq!(shown["jobs"][0]["state"], json!("dead"), "{shown}");

    let ran = idem(
        &url,
        &[
            "redrive",
            &reference,
            "send_receipt",
            "--tenant",
            &req.tenant,
        ],
    )
    .await;
    assert_eq!(ran.code, EXIT_OK, "{ran:?}");
    assert!(ran.out.contains("runs again"), "{}", ran.out);
    let again = idem(
        &url,
        &[
            "redrive",
            &reference,
            "send_receipt",
            "--tenant",
            &req.tenant,
        ],
    )
    .await;
    assert_eq!(again.code, EXIT_OPERATOR, "{again:?}");
    assert!(again.err.contains("no dead follow-on"), "{}", again.err);
    let elsewhere = idem(
        &url,
        &["redrive", &reference, "send_receipt", "--tenant", "other"],
    )
    .await;
    assert_eq!(elsewhere.code, EXIT_OPERATOR, "{elsewhere:?}");
    let bad = idem(
        &url,
        &["redrive", "nope", "send_receipt", "--tenant", &req.tenant],
    )
    .await;
    assert_eq!(bad.code, EXIT_USAGE, "{bad:?}");

    let due = store
        .lease_follow_ons(
            &["send_receipt"],
            1,
            Duration::from_secs(60),
            idem_runtime::store::Attempt::random(),
        )
        .await
        .unwrap();
    assert_eq!(due.len(), 1, "re-driven, the job is due");
    assert_eq!(due[0].runs, 1, "from its first attempt");
}

/// A delivered job after a re-drive: its runs are counted across the
/// re-drive, and the failure that buried it is shown as past, never as the
/// job's present trouble, even when a run since lapsed without an error; a
/// job delivered on a retry shows its earlier run's error as earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_show_an_old_failure_as_old() {
    let (_dir, url, store, req) = paid_with_two_follow_ons("cli-jobs-history").await;
    let lease_for = |name: &'static str, lease: Duration| {
        let store = &store;
        async move {
            let token = idem_runtime::store::Attempt::random();
            let leased = store
                .lease_follow_ons(&[name], 1, lease, token)
                .await
                .unwrap();
            assert_eq!(leased.len(), 1, "{name} is due");
            (leased[0].id.clone(), token)
        }
    };
    let lease = |name: &'static str| lease_for(name, Duration::from_secs(60));
    // send_receipt: buried on its first run, re-driven; its next run's
    // lease lapses (the dispatcher died: no error), and the run after
    // delivers it. Three runs in all, two since the re-drive.
    let (id, token) = lease("send_receipt").await;
    store
        .bury_follow_on(&id, token, "mailer bounced: no such address")
        .await
        .unwrap();
    assert!(store.redrive_follow_on(&id).await.unwrap());
    let waiting = idem(&url, &["--json", "follow-ons", "--name", "send_receipt"])
        .await
        .json();
    assert_eq!(waiting[0]["state"], json!("waiting"), "{waiting}");
    assert_eq!(
        waiting[0]["last_error_is_current"],
        json!(false),
        "{waiting}"
    );
    let _lapsed = lease_for("send_receipt", Duration::from_millis(1)).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let running = idem(&url, &["--json", "follow-ons", "--name", "send_receipt"])
        .await
        .json();
    assert_eq!(running[0]["all_runs"], json!(2), "{running}");
    assert_eq!(
        running[0]["last_error_is_current"],
        json!(false),
        "{running}"
    );
    let (id, token) = lease("send_receipt").await;
    store.finish_follow_on(&id, token).await.unwrap();
    // notify_warehouse: failed once, delivered on its retry.
    let (id, token) = lease("notify_warehouse").await;
    store
        .retry_follow_on(&id, token, Duration::ZERO, "warehouse timed out")
        .await
        .unwrap();
    let (id, token) = lease("notify_warehouse").await;
    store.finish_follow_on(&id, token).await.unwrap();

    let table = idem(&url, &["follow-ons", "--state", "delivered"]).await;
    assert_eq!(table.code, EXIT_OK, "{table:?}");
    let line = |name: &str| {
        table
            .out
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("{name} is listed: {}", table.out))
            .to_owned()
    };
    let receipt = line("send_receipt");
    assert!(receipt.contains("3 (2 since a re-drive)"), "{receipt}");
    assert!(
        receipt.contains("before the re-drive: mailer bounced"),
        "{receipt}"
    );
    let notice = line("notify_warehouse");
    assert!(
        notice.contains("an earlier run: warehouse timed out"),
        "{notice}"
    );
    assert!(!notice.contains("re-drive"), "{notice}");

    let listed = idem(&url, &["--json", "follow-ons", "--state", "delivered"])
        .await
        .json();
    for job in listed.as_array().unwrap() {
        assert_eq!(job["last_error_is_current"], json!(false), "{job}");
        let redriven = job["name"] == json!("send_receipt");
        assert_eq!(job["redriven"], json!(redriven), "{job}");
        assert_eq!(
            job["all_runs"],
            json!(if redriven { 3 } else { 2 }),
            "{job}"
        );
    }
    let shown = idem(&url, &["show", &req.reference.to_string()]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    assert!(
        shown.out.contains("before the re-drive: mailer bounced"),
        "{}",
        shown.out
    );
}
