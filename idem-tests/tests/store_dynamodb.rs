//! DynamoDbStore on a DynamoDB emulator (moto, `scripts/dynamodb-emulator`):
//! the conformance suite (records and follow-ons), what only this store has
//! (the sparse indexes, the TTL backstop, the declaration limit, errors
//! that say what to do), and faults injected around it. Each case runs on a
//! fresh table. Needs `IDEM_TEST_DYNAMODB_ENDPOINT`; skipped with a reason
//! without it, failed under `CI=true`.
//!
//! The tests run through the lagging proxy in front of the emulator
//! (`IDEM_TEST_DYNAMODB_LAGGING_ENDPOINT`, scripts/dynamodb-lagging-proxy.py),
//! whose `leases` index trails the writes a little (`Lag::cases`: the
//! conformance cases list what they have just written), and the walk's
//! own tests make its index or its reads trail by seconds. What the
//! emulator cannot show: DynamoDB's latency and its throttling.

mod dynamodb_emulator;
mod dynamodb_proxy;
#[path = "store_dynamodb/grants.rs"]
mod grants;
#[path = "store_dynamodb/migrate.rs"]
mod migrate;
mod rolling;
#[path = "store_dynamodb/rolling.rs"]
mod rolling_deploy;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dynamodb_emulator::{client, endpoint, lagging_endpoint, set_lag, Lag, Table, WalkHolds};
use idem_runtime::store::conformance::{self, claim_request, Call, Fault, FaultyStore};
use idem_runtime::store::{Inspect, Upkeep};
use idem_runtime::{
    answer::{Answer, Recording},
    executor::{Operation, OperationContext, ScopeSpec},
    follow_ons::{FollowOn, FollowOnError},
    maintenance::{reconcile, sweep, Reconciler, Reconciliation},
    store::{FollowOnStore, Record, RecordStateKind},
    Caller, DynamoDbStore, Executor, IdempotencyStore, StoreError, ToolError,
};

idem_runtime::conformance_tests!(Table::new().await);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_cases_share_one_table() {
    let Some(table) = Table::new().await else {
        return;
    };
    conformance::run_all(&table.store).await;
}

/// The item of a record, read raw, to see the attributes the indexes key on.
async fn raw_record(
    table: &Table,
    key: &idem_runtime::key::IdempotencyKey,
) -> std::collections::HashMap<String, aws_sdk_dynamodb::types::AttributeValue> {
    use aws_sdk_dynamodb::types::AttributeValue;
    let bytes = key.as_bytes();
    let mut sk = vec![b'r'];
    sk.extend_from_slice(&bytes[8..]);
    client(&table.endpoint)
        .get_item()
        .table_name(table.table())
        .key("pk", AttributeValue::B(bytes[..8].to_vec().into()))
        .key("sk", AttributeValue::B(sk.into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap()
        .item
        .expect("the record's item")
}

/// A record is in the `leases` index from its claim on, whatever its
/// state: a completion writes no index. It is in the `unknown` index only
/// while UNKNOWN, and in `expiry` only once NOT_PERFORMED (at its retention
/// end); the TTL is set only once it is COMPLETED, at its retention end,
/// however late it completed, and its window's end never moves.
#[tokio::test]
async fn index_keys_follow_the_state() {
    let Some(table) = Table::new().await else {
        return;
    };
    let req = claim_request(Duration::from_secs(60));
    table.claim(&req).await.unwrap();
    let item = raw_record(&table, &req.key).await;
    let shard = number(&item["mq"]);
    assert_eq!(shard, u64::from(req.key.as_bytes()[0] % 4));
    assert!(!item.contains_key("lq") && !item.contains_key("uq"));
    assert!(!item.contains_key("xq"), "a claim writes one index");
    assert!(!item.contains_key("tt"), "no TTL while IN_PROGRESS");

    table
        .mark_unknown(&req.key, req.attempt, "timeout")
        .await
        .unwrap();
    let item = raw_record(&table, &req.key).await;
    assert!(item.contains_key("mq") && item.contains_key("uq"));
    assert!(!item.contains_key("xq"));

    table
        .resolve(
            &req.key,
            req.attempt,
            idem_runtime::store::Resolution::Completed { response: "\"ok\"" },
            None,
        )
        .await
        .unwrap();
    let item = raw_record(&table, &req.key).await;
    assert!(item.contains_key("mq") && !item.contains_key("uq"));
    assert!(!item.contains_key("xq"), "its TTL deletes it");
    let late = table
        .lookup(&req.tenant, &req.reference)
        .await
        .unwrap()
        .unwrap();
    // A late completion keeps its window, and lives until its retention
    // ends, with its TTL then.
    assert_eq!(number(&item["ea"]), micros(late.expires_at));
    assert_eq!(
        number(&item["tt"]),
        micros(late.retain_until).div_ceil(1_000_000)
    );

    let fresh = claim_request(Duration::from_secs(60));
    table.claim(&fresh).await.unwrap();
    let claimed = raw_record(&table, &fresh.key).await;
    table
        .complete(&fresh.key, fresh.attempt, "\"ok\"")
        .await
        .unwrap();
    let item = raw_record(&table, &fresh.key).await;
    let record = table
        .lookup(&fresh.tenant, &fresh.reference)
        .await
        .unwrap()
        .unwrap();
    // Neither key of `leases` moved: the completion wrote no index.
    for a in ["mq", "lu"] {
        assert_eq!(item[a], claimed[a], "{a}");
    }
    assert!(!item.contains_key("xq") && !item.contains_key("uq"));
    assert!(record.expires_at < record.retain_until);
    assert_eq!(number(&item["ea"]), micros(record.expires_at));
    assert_eq!(
        number(&item["tt"]),
        micros(record.retain_until).div_ceil(1_000_000)
    );

    // Released into NOT_PERFORMED by a resolution: into `expiry` at its
    // retention end.
    let doubt = claim_request(Duration::from_secs(60));
    table.claim(&doubt).await.unwrap();
    table
        .mark_unknown(&doubt.key, doubt.attempt, "timeout")
        .await
        .unwrap();
    table
        .resolve(
            &doubt.key,
            doubt.attempt,
            idem_runtime::store::Resolution::NotPerformed {
                note: "no such charge",
                settle: Duration::ZERO,
            },
            None,
        )
        .await
        .unwrap();
    let item = raw_record(&table, &doubt.key).await;
    let record = table
        .lookup(&doubt.tenant, &doubt.reference)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(number(&item["xk"]), micros(record.retain_until));
}

/// A number attribute of a raw item.
fn number(value: &aws_sdk_dynamodb::types::AttributeValue) -> u64 {
    match value {
        aws_sdk_dynamodb::types::AttributeValue::N(n) => n.parse().unwrap(),
        other => panic!("not a number: {other:?}"),
    }
}

/// A time as the table keeps it: microseconds since the epoch.
fn micros(t: std::time::SystemTime) -> u64 {
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64
}

/// A COMPLETED record's item as the version before the window and the
/// retention were two lives wrote it (commit 8d26ab9): claimed now, its
/// `te` the window's end in whole seconds (rounded up); completed on time,
/// `xk` and `tt` at the window's end; completed late, the window moved to
/// the retention end (`ea = ra`, `xk = ra`) and no `tt`.
async fn write_old_completed(
    table: &Table,
    req: &idem_runtime::store::ClaimRequest,
    late: bool,
) -> std::time::SystemTime {
    use aws_sdk_dynamodb::types::AttributeValue::{B, N, S};
    let now = std::time::SystemTime::now();
    let (claimed, window_end) = (micros(now), micros(now + req.window));
    let retain = micros(now + req.retention);
    let te = window_end.div_ceil(1_000_000);
    let n = |v: u64| N(v.to_string());
    let bytes = req.key.as_bytes();
    let mut sk = vec![b'r'];
    sk.extend_from_slice(&bytes[8..]);
    let mut put = client(&table.endpoint)
        .put_item()
        .table_name(table.table())
        .item("pk", B(bytes[..8].to_vec().into()))
        .item("sk", B(sk.into()))
        .item("fp", B(req.key.fingerprint().to_vec().into()))
        .item("tn", S(req.tenant.clone()))
        .item("tl", S(req.tool.clone()))
        .item("rf", B(req.reference.as_bytes().to_vec().into()))
        .item("ak", n(req.attempt.get()))
        .item("st", N(RecordStateKind::Completed.code().to_string()))
        .item("rs", S("\"old\"".into()))
        .item("ca", n(claimed))
        .item("ua", n(claimed))
        .item("lu", n(micros(now + req.lease)))
        .item("ra", n(retain))
        .item("te", n(te))
        .item("xq", n(u64::from(bytes[0] % 4)));
    put = if late {
        put.item("ea", n(retain)).item("xk", n(retain))
    } else {
        put.item("ea", n(window_end))
            .item("xk", n(window_end))
            .item("tt", n(te))
    };
    put.send().await.unwrap();
    now
}

/// Items written before the window and the retention were two lives read
/// and behave under the current rules: a record completed on time is
/// found, replays inside its window, is taken over after it (and still
/// reads by its reference, as a superseded operation), and is purged at
/// its retention end, not at its window's end; the purge moves its
/// `expiry` index key to its retention end when it finds it early. A record
/// completed late holds its key only for the window it was claimed with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_of_the_earlier_layout_follow_the_current_rules() {
    use idem_runtime::store::{ClaimRequest, RecordState};
    let Some(table) = Table::new().await else {
        return;
    };
    let old = |window_ms, retention_ms| ClaimRequest {
        retention: Duration::from_millis(retention_ms),
        ..claim_request(Duration::from_millis(window_ms))
    };
    let new_operation = |req: &ClaimRequest| ClaimRequest {
        attempt: idem_runtime::store::Attempt::random(),
        reference: idem_runtime::Reference::new_operation(&req.key),
        ..req.clone()
    };
    let completed_old = |r: Option<Record>| {
        matches!(
            r.map(|r| r.state),
            Some(RecordState::Completed { response }) if response == "\"old\""
        )
    };
    // Taken over after its window; left alone until its retention ends.
    let (taken, alone) = (old(400, 2500), old(400, 2500));
    write_old_completed(&table, &taken, false).await;
    write_old_completed(&table, &alone, false).await;
    for req in [&taken, &alone] {
        assert!(completed_old(
            table.lookup(&req.tenant, &req.reference).await.unwrap()
        ));
        let Ok(idem_runtime::store::Claim::Existing { record }) =
            table.claim(&new_operation(req)).await
        else {
            panic!("a repeat inside the window replays");
        };
        assert_eq!(record.reference, req.reference);
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Past the window, inside the retention: the purge keeps both, and
    // moves the one left alone to its retention end in the index.
    table.purge_expired(1_000).await.unwrap();
    for req in [&taken, &alone] {
        assert!(completed_old(
            table.lookup(&req.tenant, &req.reference).await.unwrap()
        ));
    }
    let item = raw_record(&table, &alone.key).await;
    assert_eq!(number(&item["xk"]), number(&item["ra"]));
    assert_eq!(number(&item["tt"]), number(&item["ra"]).div_ceil(1_000_000));
    let later = new_operation(&taken);
    assert_eq!(
        table.claim(&later).await.unwrap(),
        idem_runtime::store::Claim::Claimed {
            reference: later.reference
        },
        "the same call after the window is a new operation"
    );
    assert!(
        completed_old(table.lookup(&taken.tenant, &taken.reference).await.unwrap()),
        "the earlier operation still reads by its reference"
    );
    // A record completed late holds its key for its claimed window only.
    let late = old(100, 60_000);
    let written = write_old_completed(&table, &late, true).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let record = table
        .lookup(&late.tenant, &late.reference)
        .await
        .unwrap()
        .unwrap();
    assert!(record.expires_at < written + Duration::from_secs(2));
    let after = new_operation(&late);
    assert_eq!(
        table.claim(&after).await.unwrap(),
        idem_runtime::store::Claim::Claimed {
            reference: after.reference
        },
        "a late completion of the earlier layout does not hold the key past its window"
    );
    assert!(completed_old(
        table.lookup(&late.tenant, &late.reference).await.unwrap()
    ));
    // Past the retention: both purged, the later operation kept.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    while table.purge_expired(1_000).await.unwrap() == 1_000 {}
    for req in [&taken, &alone] {
        assert_eq!(
            table.lookup(&req.tenant, &req.reference).await.unwrap(),
            None
        );
    }
    assert_eq!(
        table
            .lookup(&later.tenant, &later.reference)
            .await
            .unwrap()
            .map(|r| r.attempt),
        Some(later.attempt)
    );
}

/// The executor refuses the hundredth follow-on at its declaration,
/// while the handler can still act, and 99 are written with the completion
/// in one transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ons_are_limited_to_one_transaction() {
    let Some(table) = Table::new().await else {
        return;
    };
    assert_eq!(table.limits().max_follow_ons_per_completion, Some(99));
    let store = Arc::new(table.store.clone());
    let executor = Executor::new(store.clone());
    let caller = Caller::new("acme", "alice");
    let refused = Arc::new(std::sync::Mutex::new(None));
    let seen = refused.clone();
    let answer: Answer<String, ToolError> = executor
        .run(
            Operation {
                caller: &caller,
                tool: "fan_out",
                args: &serde_json::json!({"n": 100}),
                scope: ScopeSpec::Window(Duration::from_secs(900)),
                status_tool: "get_operation_status",
            },
            |_ctx: OperationContext| async move {
                for i in 0..100 {
                    if let Err(e) = idem_runtime::follow_on(&format!("job{i}"), &i) {
                        *seen.lock().unwrap() = Some(e);
                    }
                }
                Ok("done".to_owned())
            },
        )
        .await;
    let Answer::Executed { reference, .. } = answer else {
        panic!("the handler's own outcome stands: {answer:?}");
    };
    let refused = refused
        .lock()
        .unwrap()
        .take()
        .expect("the 100th is refused");
    assert!(
        matches!(refused, FollowOnError::TooMany { limit: 99, .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("at most 99"), "{refused}");
    let jobs = store
        .list_follow_ons(&idem_runtime::store::FollowOnFilter {
            reference: Some(reference),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(jobs.len(), 99);

    // The store itself refuses more than a transaction holds, writing
    // nothing.
    let req = claim_request(Duration::from_secs(60));
    table.claim(&req).await.unwrap();
    let jobs: Vec<FollowOn> = (0..100)
        .map(|i| FollowOn::new(&format!("j{i}"), &i).unwrap())
        .collect();
    let e = table
        .complete_with_follow_ons(
            &req.key,
            req.attempt,
            "\"ok\"",
            idem_runtime::store::FollowOns::new(&jobs).unwrap(),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Invalid(_)), "{e:?}");
    let record = table
        .lookup(&req.tenant, &req.reference)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state.kind(), RecordStateKind::InProgress);
}

/// A table that does not exist is a configuration error that says how to
/// create it, not an outage.
#[tokio::test]
async fn a_missing_table_says_how_to_create_it() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    let e = DynamoDbStore::connect(client(&endpoint), "idem-no-such-table")
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Config(_)), "{e:?}");
    assert!(e.to_string().contains("create_table"), "{e}");

    let store = DynamoDbStore::builder(client(&endpoint), "idem-no-such-table")
        .build()
        .unwrap();
    let e = store
        .claim(&claim_request(Duration::from_secs(60)))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Config(_)), "{e:?}");
}

/// An emulator that does not answer is `Unavailable` (the executor fails
/// closed), never a claim.
#[tokio::test]
async fn an_unreachable_endpoint_is_unavailable() {
    // A port nothing listens on.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let store = DynamoDbStore::builder(client(&format!("http://127.0.0.1:{port}")), "idem")
        .build()
        .unwrap();
    let e = store
        .claim(&claim_request(Duration::from_secs(60)))
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
}

/// `open_store` takes a `dynamodb://` URL; a bad one says what to write.
#[tokio::test]
async fn open_store_takes_a_dynamodb_url() {
    for bad in ["dynamodb://", "dynamodb://idem?colour=blue", "dynamodb://x"] {
        let e = idem_runtime::open_store(bad).await.unwrap_err();
        assert!(matches!(e, StoreError::Config(_)), "{bad}: {e:?}");
        let says = e.to_string();
        assert!(
            says.contains("dynamodb://TABLE") || says.contains("3 to 255 characters"),
            "{bad}: {e}"
        );
    }
    let Some(table) = Table::new().await else {
        return;
    };
    // Credentials come from the environment; the child process has its own.
    let url = format!(
        "dynamodb://{}?region=us-east-1&endpoint={}",
        table.table(),
        table.endpoint
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem_cli"))
        .args(["--store", &url, "stats"])
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "idem --store dynamodb://… stats: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem_cli"))
        .args(["--store", &url, "stats"])
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("AWS_ACCESS_KEY_ID"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The processor of the fault cases: it remembers what it charged.
#[derive(Debug, Default)]
struct Processor(std::sync::Mutex<Vec<String>>);

#[async_trait::async_trait]
impl Reconciler for Processor {
    async fn reconcile(
        &self,
        record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        let charged = self
            .0
            .lock()
            .unwrap()
            .contains(&record.reference.to_string());
        Ok(if charged {
            Reconciliation::completed("\"charged\"".to_owned())
        } else {
            Reconciliation::not_performed()
        })
    }
}

async fn charge(
    executor: &Executor,
    processor: &Processor,
    runs: &AtomicUsize,
) -> Answer<String, ToolError> {
    let caller = Caller::new("acme", "alice");
    executor
        .run(
            Operation {
                caller: &caller,
                tool: "charge_card",
                args: &serde_json::json!({"cents": 1999}),
                scope: ScopeSpec::Window(Duration::from_secs(900)),
                status_tool: "get_operation_status",
            },
            |ctx: OperationContext| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                processor
                    .0
                    .lock()
                    .unwrap()
                    .push(ctx.reference().to_string());
                Ok("charged".to_owned())
            },
        )
        .await
}

/// The store unreachable at the claim: the handler does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_claim_fails_closed() {
    let Some(table) = Table::new().await else {
        return;
    };
    let faulty = FaultyStore::new(table.store.clone(), |call| match call {
        Call::Claim => Fault::Unreachable,
        _ => Fault::None,
    });
    let executor = Executor::new(Arc::new(faulty));
    let (processor, runs) = (Processor::default(), AtomicUsize::new(0));
    let answer = charge(&executor, &processor, &runs).await;
    assert_eq!(answer.name(), "store_unavailable", "{answer:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// The completion write fails after the side effect: the caller still gets
/// the result; the record stays IN_PROGRESS until its lease runs out, the
/// sweep marks it UNKNOWN, the reconciler completes it, and a repeat
/// replays without running again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_write_fails_after_side_effect() {
    let Some(table) = Table::new().await else {
        return;
    };
    let lease = Duration::from_millis(400);
    let store: Arc<dyn IdempotencyStore> = Arc::new(table.store.clone());
    let faulty = FaultyStore::new(store.clone(), |call| match call {
        Call::Complete => Fault::Unreachable,
        _ => Fault::None,
    });
    let (processor, runs) = (Processor::default(), AtomicUsize::new(0));
    let failing = Executor::new(Arc::new(faulty)).with_lease(lease);
    let Answer::Executed { recording, .. } = charge(&failing, &processor, &runs).await else {
        panic!("the caller gets the real result");
    };
    assert_eq!(recording, Recording::Failed);
    let executor = Executor::new(store.clone()).with_lease(lease);
    assert_eq!(
        charge(&executor, &processor, &runs).await.name(),
        "in_progress"
    );

    tokio::time::sleep(lease + Duration::from_millis(150)).await;
    assert_eq!(sweep(&*store, 100).await.unwrap(), 1);
    let report = reconcile(&*store, &processor, &Default::default())
        .await
        .unwrap();
    assert_eq!(report.completed, 1);
    assert!(matches!(
        charge(&executor, &processor, &runs).await,
        Answer::Replayed { .. }
    ));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A claim whose answer was lost after it took effect: the executor
/// releases the orphaned claim (a fenced delete), so the retry the answer
/// invited runs, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_claim_answer_is_released_and_runs_once() {
    let Some(table) = Table::new().await else {
        return;
    };
    let lost = Arc::new(AtomicUsize::new(0));
    let count = lost.clone();
    let faulty = FaultyStore::new(table.store.clone(), move |call| match call {
        Call::Claim if count.fetch_add(1, Ordering::SeqCst) == 0 => Fault::AnswerLost,
        _ => Fault::None,
    });
    let executor = Executor::new(Arc::new(faulty));
    let (processor, runs) = (Processor::default(), AtomicUsize::new(0));
    let first = charge(&executor, &processor, &runs).await;
    assert_eq!(first.name(), "store_unavailable");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let started = std::time::Instant::now();
    let retry = loop {
        let answer = charge(&executor, &processor, &runs).await;
        if answer.name() != "in_progress" || started.elapsed() > Duration::from_secs(5) {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(retry.name(), "executed", "{retry:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The payments example on DynamoDB (`--store dynamodb://…`, as a user runs
/// it): it creates its table, a charge sent twice reaches the processor
/// once, and the repeat replays the receipt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_payments_example_runs_on_dynamodb() {
    use rmcp::model::CallToolRequestParams;
    use rmcp::ServiceExt;
    let Some(endpoint) = endpoint() else {
        return;
    };
    // A guard on the table the example creates, deleted afterwards.
    let guard = Table {
        store: DynamoDbStore::builder(client(&endpoint), dynamodb_emulator::fresh_table())
            .build()
            .unwrap(),
        endpoint: endpoint.clone(),
    };
    let url = format!(
        "dynamodb://{}?region=us-east-1&endpoint={endpoint}",
        guard.table()
    );
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/payments");
    let mut command = tokio::process::Command::new(bin);
    command
        .args(["--transport", "stdio", "--store", &url])
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing");
    let transport = rmcp::transport::TokioChildProcess::new(command).expect("the example starts");
    let client = ().serve(transport).await.expect("the client connects");
    let charge = || async {
        let serde_json::Value::Object(args) =
            serde_json::json!({ "card": "4242", "amount_cents": 1200 })
        else {
            unreachable!()
        };
        client
            .call_tool(CallToolRequestParams::new("charge_card").with_arguments(args))
            .await
            .expect("tools/call answers")
    };
    let state = |r: &rmcp::model::CallToolResult| {
        r.meta.as_ref().expect("_meta")[idem_runtime::mcp::RESULT_META_KEY]["state"].clone()
    };
    let first = charge().await;
    assert_eq!(state(&first), serde_json::json!("executed"), "{first:?}");
    let again = charge().await;
    assert_eq!(state(&again), serde_json::json!("replayed"), "{again:?}");
    assert_eq!(first.structured_content, again.structured_content);
    let ledger = client
        .call_tool(CallToolRequestParams::new("processor_ledger"))
        .await
        .unwrap()
        .structured_content
        .unwrap();
    assert_eq!(
        ledger["processor_requests"],
        serde_json::json!(1),
        "{ledger}"
    );
    assert_eq!(
        ledger["processor_charges"],
        serde_json::json!(1),
        "{ledger}"
    );
    let counts = guard.count_records().await.unwrap();
    assert_eq!(counts.completed, 1);
    client.cancel().await.ok();
}

/// A 420,000-byte response, over DynamoDB's 400 KB item: the executor does
/// not write it (over what the store's item leaves it), the caller gets its
/// result, the record reads UNKNOWN with a note that says why and a repeat
/// is told so, never "in progress" then "may have died"; one charge. The
/// emulator enforces the item limit itself: the same completion written to
/// the store directly is refused as invalid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_over_the_item_limit_reads_unknown() {
    let Some(table) = Table::new().await else {
        return;
    };
    assert_eq!(table.limits().max_response_bytes, None);
    let item = table.limits().item.expect("an item limit");
    assert_eq!(
        (
            item.max_bytes(),
            item.record_bytes(),
            item.follow_on_bytes()
        ),
        (400_000, 522, 1699)
    );
    assert_eq!(item.follow_on_key_bytes(), Some(1002));
    let store = Arc::new(table.store.clone());
    let executor = Executor::new(store.clone());
    let caller = Caller::new("acme", "alice");
    let charges = Arc::new(AtomicUsize::new(0));
    let args = serde_json::json!({"month": "2026-04"});
    let run = || {
        let charges = charges.clone();
        executor.run(
            Operation {
                caller: &caller,
                tool: "export_statement",
                args: &args,
                scope: ScopeSpec::Window(Duration::from_secs(900)),
                status_tool: "get_operation_status",
            },
            move |_ctx: OperationContext| async move {
                charges.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ToolError>("x".repeat(420_000 - 2))
            },
        )
    };
    let answer: Answer<String, ToolError> = run().await;
    let Answer::Executed {
        value,
        reference,
        recording: Recording::Failed,
    } = answer
    else {
        panic!("the result, not stored: {answer:?}");
    };
    assert_eq!(value.len(), 420_000 - 2);
    let record = table
        .lookup("acme", &reference)
        .await
        .unwrap()
        .expect("the record reads");
    let idem_runtime::store::RecordState::Unknown { note } = &record.state else {
        panic!("UNKNOWN: {record:?}");
    };
    assert!(
        note.starts_with(
            "the response could not be stored: 420000 bytes, over the store's limit of 399458 bytes; "
        ),
        "{note}"
    );
    let repeat: Answer<String, ToolError> = run().await;
    match repeat {
        Answer::Unknown {
            reference: told,
            note: repeated,
            ..
        } => {
            assert_eq!(told, reference);
            assert_eq!(&repeated, note);
        }
        other => panic!("outcome unknown: {other:?}"),
    }
    assert_eq!(charges.load(Ordering::SeqCst), 1);

    // The emulator's own limit, under the declared one.
    let req = claim_request(Duration::from_secs(60));
    table.claim(&req).await.unwrap();
    let big = format!("\"{}\"", "x".repeat(420_000 - 2));
    let e = table
        .complete(&req.key, req.attempt, &big)
        .await
        .unwrap_err();
    assert!(matches!(e, StoreError::Invalid(_)), "{e:?}");
    assert!(e.to_string().contains("maximum allowed size"), "{e}");
    // Not read back: the emulator (moto) applies part of the refused
    // update before it checks the size (the state is COMPLETED, the
    // response absent), where DynamoDB leaves the item as it was. The
    // executor never sends it one.
}

/// Seventy 60 KB follow-ons (4.2 MB, over DynamoDB's 4 MB transaction) are
/// refused at their declaration once their total passes the store's 3 MiB,
/// while the handler can still act; the ones that fit are written with the
/// completion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ons_past_the_transaction_size_are_refused_at_declaration() {
    let Some(table) = Table::new().await else {
        return;
    };
    assert_eq!(
        table.limits().max_follow_on_bytes_per_completion,
        Some(3 * 1024 * 1024)
    );
    let store = Arc::new(table.store.clone());
    let executor = Executor::new(store.clone());
    let caller = Caller::new("acme", "alice");
    let answer: Answer<Vec<String>, ToolError> = executor
        .run(
            Operation {
                caller: &caller,
                tool: "send_receipts",
                args: &serde_json::json!({"n": 70}),
                scope: ScopeSpec::Window(Duration::from_secs(900)),
                status_tool: "get_operation_status",
            },
            |_ctx: OperationContext| async move {
                let mut refused = Vec::new();
                for i in 0..70 {
                    let receipt = "x".repeat(60_000 - 2);
                    if let Err(e) = idem_runtime::follow_on(&format!("receipt{i}"), &receipt) {
                        refused.push(e);
                    }
                }
                Ok(refused.iter().map(ToString::to_string).collect())
            },
        )
        .await;
    let Answer::Executed {
        value: refused,
        reference,
        recording: Recording::Stored,
    } = answer
    else {
        panic!("the handler's own outcome stands: {answer:?}");
    };
    // 52 × 60,000 bytes fit in 3 MiB; the 53rd and later do not.
    assert_eq!(refused.len(), 70 - 52, "{refused:?}");
    assert!(
        refused[0].contains("3180000 bytes") && refused[0].contains("3145728 bytes"),
        "{}",
        refused[0]
    );
    let jobs = store
        .list_follow_ons(&idem_runtime::store::FollowOnFilter {
            reference: Some(reference),
            limit: 1000,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(jobs.len(), 52);
}

/// How many items the table holds, whatever they are.
async fn items(table: &Table) -> usize {
    let mut count = 0;
    let mut start = None;
    loop {
        let page = client(&table.endpoint)
            .scan()
            .table_name(table.table())
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .unwrap();
        count += page.items().len();
        start = page.last_evaluated_key;
        if start.is_none() {
            return count;
        }
    }
}

/// One call of `tool` by `caller` whose handler counts its runs in
/// `charges` and answers `size` bytes of JSON text.
async fn export(
    executor: &Executor,
    caller: &Caller,
    tool: &str,
    size: usize,
    charges: &AtomicUsize,
) -> Answer<String, ToolError> {
    executor
        .run(
            Operation {
                caller,
                tool,
                args: &serde_json::json!({"month": "2026-04"}),
                scope: ScopeSpec::Window(Duration::from_secs(900)),
                status_tool: "get_operation_status",
            },
            |_ctx: OperationContext| async move {
                charges.fetch_add(1, Ordering::SeqCst);
                Ok::<_, ToolError>("x".repeat(size - 2))
            },
        )
        .await
}

/// A tenant id of 400,000 bytes: its record would take the whole of
/// DynamoDB's 400 KB item, with no room for a response or a note (the
/// emulator would take the claim, run the handler, and refuse its 5,000-byte
/// response after the effect). The call is answered store_misconfigured
/// (the operator shortens the tenant id, not the caller) before the handler runs,
/// with a reason that says why, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_too_long_for_the_item_is_refused_before_the_handler_runs() {
    let Some(table) = Table::new().await else {
        return;
    };
    let executor = Executor::new(Arc::new(table.store.clone()));
    let caller = Caller::new("t".repeat(400_000), "alice");
    let charges = AtomicUsize::new(0);
    let answer = export(&executor, &caller, "charge_card", 5_000, &charges).await;
    // The server's to fix, not the caller's: misconfigured, with the
    // reason for the operator.
    let Answer::StoreMisconfigured { error } = &answer else {
        panic!("refused before the handler, not {}", answer.name());
    };
    let reason = error.to_string();
    assert!(
        reason.contains("tenant id (400000 bytes) and tool name (11 bytes) are too long"),
        "{reason}"
    );
    assert_eq!(charges.load(Ordering::SeqCst), 0, "the handler never ran");
    assert_eq!(items(&table).await, 0, "nothing was written");
    // A tenant id of a usual length runs.
    let answer = export(
        &executor,
        &Caller::new("acme", "alice"),
        "charge_card",
        5_000,
        &charges,
    )
    .await;
    assert_eq!(answer.name(), "executed");
    assert_eq!(charges.load(Ordering::SeqCst), 1);
}

/// A follow-on of 450,000 bytes is under the store's 3 MiB per
/// completion (and the executor's payload limit, raised to 1 MiB), but its
/// own item cannot exceed DynamoDB's 400 KB: it is refused at its
/// declaration, while the handler can still act, and the completion, with
/// the job that fits, is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_too_large_for_its_item_is_refused_at_declaration() {
    let Some(table) = Table::new().await else {
        return;
    };
    let store = Arc::new(table.store.clone());
    let executor = Executor::new(store.clone()).with_max_follow_on_payload(1 << 20);
    let caller = Caller::new("acme", "alice");
    let charges = AtomicUsize::new(0);
    let answer: Answer<Vec<String>, ToolError> = executor
        .run(
            Operation {
                caller: &caller,
                tool: "export_statement",
                args: &serde_json::json!({"month": "2026-04"}),
                scope: ScopeSpec::Window(Duration::from_secs(900)),
                status_tool: "get_operation_status",
            },
            |_ctx: OperationContext| async {
                let mut refused = Vec::new();
                let statement = "x".repeat(450_000 - 2);
                if let Err(e) = idem_runtime::follow_on("archive", &statement) {
                    refused.push(format!("{e:?}|{e}"));
                }
                if let Err(e) = idem_runtime::follow_on("notify", &"statement ready") {
                    refused.push(format!("{e:?}|{e}"));
                }
                // It still acts, knowing what was refused.
                charges.fetch_add(1, Ordering::SeqCst);
                Ok(refused)
            },
        )
        .await;
    let Answer::Executed {
        value: refused,
        reference,
        recording,
    } = answer
    else {
        panic!("the handler's own outcome stands: {answer:?}");
    };
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(
        refused[0].starts_with(r#"ItemTooLarge { name: "archive", size: 450000"#),
        "{refused:?}"
    );
    assert!(
        refused[0].contains("one follow-on holds on the dynamodb store"),
        "{refused:?}"
    );
    assert_eq!(recording, Recording::Stored);
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    let record = table.lookup("acme", &reference).await.unwrap().unwrap();
    assert_eq!(record.state.kind(), RecordStateKind::Completed);
    let jobs = store
        .list_follow_ons(&idem_runtime::store::FollowOnFilter {
            reference: Some(reference),
            ..Default::default()
        })
        .await
        .unwrap();
    let names: Vec<&str> = jobs.iter().map(|j| j.id.name.as_str()).collect();
    assert_eq!(names, ["notify"]);
}

/// A 310,000-byte response fits a record of tenant `acme`, but not one whose
/// tenant id takes 100,000 bytes (410 KB in all, over DynamoDB's item and
/// the emulator's): it is judged against its own record, with the record's
/// real tenant and tool, before the completion is written. The caller gets
/// its result, the record reads UNKNOWN with a note that gives the room
/// the record left, and the only write after the claim is that mark.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_is_judged_against_its_own_record() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    let proxy = dynamodb_proxy::Proxy::start(&endpoint).await;
    let table = Table::on(&proxy.url).await;
    let executor = Executor::new(Arc::new(table.store.clone()));
    let charges = AtomicUsize::new(0);
    let short = Caller::new("acme", "alice");
    let answer = export(&executor, &short, "export_statement", 310_000, &charges).await;
    assert!(
        matches!(
            answer,
            Answer::Executed {
                recording: Recording::Stored,
                ..
            }
        ),
        "{}",
        answer.name()
    );
    let long = Caller::new("t".repeat(100_000), "alice");
    proxy.reset_counts();
    let answer = export(&executor, &long, "export_statement", 310_000, &charges).await;
    let Answer::Executed {
        value,
        reference,
        recording: Recording::Failed,
    } = answer
    else {
        panic!("the result, not stored: {}", answer.name());
    };
    assert_eq!(value.len(), 310_000 - 2);
    let record = table
        .lookup(long.tenant(), &reference)
        .await
        .unwrap()
        .expect("the record reads");
    let idem_runtime::store::RecordState::Unknown { note } = &record.state else {
        panic!("UNKNOWN: {record:?}");
    };
    // 400,000 bytes, less the record's other attributes (522 bytes at
    // most), its tenant and its tool.
    let room = 400_000 - 522 - 100_000 - "export_statement".len();
    assert!(
        note.starts_with(&format!(
            "the response could not be stored: 310000 bytes, over the store's limit of {room} \
             bytes; "
        )),
        "{note}"
    );
    // The claim, and the mark: no completion was sent.
    assert_eq!(proxy.count("PutItem"), 1, "{:?}", proxy.counts());
    assert_eq!(proxy.count("UpdateItem"), 1, "{:?}", proxy.counts());
    assert_eq!(proxy.count("TransactWriteItems"), 0, "{:?}", proxy.counts());
    assert_eq!(charges.load(Ordering::SeqCst), 2);
}

/// A replica whose clock runs ahead of the one that marked a record UNKNOWN
/// by more than the settle period must not trust "not performed" at once:
/// a request may still be on its way to the processor. (DynamoDB takes
/// every time from the writing process's clock.) The settle period also
/// runs on the reconciling process's own monotonic clock, from when it
/// first saw the record UNKNOWN: the ahead replica puts the check off, and
/// resolves once it has seen the record for the settle period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_ahead_does_not_shorten_the_settle_period() {
    use idem_runtime::maintenance::{reconcile_with, ReconcileConfig, SettleClock};
    let Some(table) = Table::new().await else {
        return;
    };
    let skew = Duration::from_secs(5);
    let ahead = DynamoDbStore::builder(client(&table.endpoint), table.table())
        .clock(move || std::time::SystemTime::now() + skew)
        .build()
        .unwrap();
    let req = claim_request(Duration::from_secs(60));
    table.claim(&req).await.unwrap();
    table
        .mark_unknown(&req.key, req.attempt, "timed out")
        .await
        .unwrap();
    let config = ReconcileConfig::default()
        .with_settle(Duration::from_secs(2))
        .with_first_backoff(Duration::from_millis(100));
    // Nothing reached the processor (yet).
    let processor = Processor::default();
    let clock = SettleClock::new();
    let first = reconcile_with(&ahead, &processor, &config, &clock)
        .await
        .unwrap();
    assert_eq!(
        (first.not_performed, first.still_unknown),
        (0, 1),
        "a clock 5 s ahead trusted \"not performed\" at once: {first:?}"
    );
    let r = table.lookup(&req.tenant, &req.reference).await.unwrap();
    assert_eq!(r.map(|r| r.state.kind()), Some(RecordStateKind::Unknown));
    tokio::time::sleep(config.settle + Duration::from_millis(200)).await;
    let settled = reconcile_with(&ahead, &processor, &config, &clock)
        .await
        .unwrap();
    assert_eq!(settled.not_performed, 1, "{settled:?}");
    assert!(clock.is_empty(), "a resolved record is forgotten");
}

/// The keys of the records the sweep would mark now.
async fn lapsed_keys(store: &DynamoDbStore) -> Vec<idem_runtime::key::IdempotencyKey> {
    store
        .list_lapsed(100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect()
}

/// A table as versions before the `leases` index created it (08cdba9's
/// `TABLE_DEFINITION`): `lapsed` over `lq` and `lu` with every attribute,
/// and the other three indexes as today.
async fn create_table_before_leases(endpoint: &str) -> Table {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType,
        Projection, ProjectionType, ScalarAttributeType,
    };
    let name = dynamodb_emulator::fresh_table();
    let key = |name: &str, kind| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .unwrap()
    };
    let definition = |name: &str, kind| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(kind)
            .build()
            .unwrap()
    };
    let mut create = client(endpoint)
        .create_table()
        .table_name(&name)
        .billing_mode(BillingMode::PayPerRequest)
        .key_schema(key("pk", KeyType::Hash))
        .key_schema(key("sk", KeyType::Range))
        .attribute_definitions(definition("pk", ScalarAttributeType::B))
        .attribute_definitions(definition("sk", ScalarAttributeType::B));
    let indexes = [
        ("lapsed", "lq", "lu", None),
        ("unknown", "uq", "nc", None),
        (
            "expiry",
            "xq",
            "xk",
            Some(vec!["st".to_owned(), "lu".to_owned()]),
        ),
        ("due", "dq", "nr", None),
    ];
    for (index, hash, range, include) in indexes {
        for a in [hash, range] {
            create = create.attribute_definitions(definition(a, ScalarAttributeType::N));
        }
        let projection = match include {
            None => Projection::builder().projection_type(ProjectionType::All),
            Some(include) => Projection::builder()
                .projection_type(ProjectionType::Include)
                .set_non_key_attributes(Some(include)),
        };
        create = create.global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name(index)
                .key_schema(key(hash, KeyType::Hash))
                .key_schema(key(range, KeyType::Range))
                .projection(projection.build())
                .build()
                .unwrap(),
        );
    }
    create.send().await.expect("create the table as before");
    Table {
        store: DynamoDbStore::builder(client(endpoint), name)
            .build()
            .unwrap(),
        endpoint: endpoint.to_owned(),
    }
}

/// Rewrites a record's index keys as a version before `leases` left them:
/// IN_PROGRESS in `lapsed` (`lq`), or settled in `expiry` at its
/// retention end (`xq`, `xk`); never in `leases`.
async fn as_before_leases(
    table: &Table,
    key: &idem_runtime::key::IdempotencyKey,
    in_progress: bool,
) {
    use aws_sdk_dynamodb::types::AttributeValue::{B, N};
    let bytes = key.as_bytes();
    let mut sk = vec![b'r'];
    sk.extend_from_slice(&bytes[8..]);
    let update = if in_progress {
        "SET lq = :s REMOVE mq"
    } else {
        "SET xq = :s, xk = ra REMOVE mq"
    };
    client(&table.endpoint)
        .update_item()
        .table_name(table.table())
        .key("pk", B(bytes[..8].to_vec().into()))
        .key("sk", B(sk.into()))
        .update_expression(update)
        .expression_attribute_values(":s", N((bytes[0] % 4).to_string()))
        .send()
        .await
        .unwrap();
}

/// A table created before the `leases` index, with records in flight and
/// settled when it is migrated: `connect` refuses it until it is migrated,
/// saying how; `migrate` adds `leases` once (again, it changes nothing), and the migrated store keeps every promise over the
/// old records and the new: a claim whose replica died before the
/// upgrade, and one after, are both found by the sweep; a claim in flight
/// across the upgrade completes and is no longer listed; a record
/// completed before the upgrade is purged at its retention end; a new
/// claim completes writing no index; and once `lapsed` is deleted, the
/// running store's sweep goes on without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_from_before_leases_is_migrated_in_place() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    let table = create_table_before_leases(&endpoint).await;
    let short = |lease_ms: u64| {
        let mut req = claim_request(Duration::from_secs(60));
        req.lease = Duration::from_millis(lease_ms);
        req
    };
    // Before the upgrade: a claim whose replica died, one in flight, and
    // one completed whose retention ends soon.
    let (died, flight) = (short(150), short(60_000));
    let mut settled = claim_request(Duration::from_millis(200));
    settled.retention = Duration::from_millis(200);
    for req in [&died, &flight, &settled] {
        table.claim(req).await.unwrap();
    }
    table
        .complete(&settled.key, settled.attempt, "\"old\"")
        .await
        .unwrap();
    as_before_leases(&table, &died.key, true).await;
    as_before_leases(&table, &flight.key, true).await;
    as_before_leases(&table, &settled.key, false).await;

    match DynamoDbStore::connect(client(&endpoint), table.table()).await {
        Err(StoreError::Config(e)) => assert!(e.contains("migrate"), "{e}"),
        other => panic!("a table not migrated is a configuration error: {other:?}"),
    }
    assert!(table.migrate().await.unwrap(), "the index is added");
    DynamoDbStore::connect(client(&endpoint), table.table())
        .await
        .expect("migrated, it connects");
    assert!(
        !table.migrate().await.unwrap(),
        "a second run changes nothing"
    );

    // After it: a claim whose replica died, and the flight completes.
    let died_after = short(150);
    table.claim(&died_after).await.unwrap();
    table
        .complete(&flight.key, flight.attempt, "\"ok\"")
        .await
        .unwrap();
    let fresh = claim_request(Duration::from_secs(60));
    table.claim(&fresh).await.unwrap();
    let claimed = raw_record(&table, &fresh.key).await;
    table
        .complete(&fresh.key, fresh.attempt, "\"ok\"")
        .await
        .unwrap();
    let completed = raw_record(&table, &fresh.key).await;
    for a in ["mq", "lu"] {
        assert_eq!(completed[a], claimed[a], "no index written: {a}");
    }
    assert!(!completed.contains_key("lq") && !completed.contains_key("xq"));
    tokio::time::sleep(Duration::from_millis(400)).await;

    let lapsed = lapsed_keys(&table).await;
    assert!(
        lapsed.contains(&died.key),
        "died before the upgrade: listed"
    );
    assert!(lapsed.contains(&died_after.key), "died after it: listed");
    assert_eq!(lapsed.len(), 2, "nothing else: {lapsed:?}");
    assert_eq!(sweep(&table.store, 100).await.unwrap(), 2);
    assert!(table.list_lapsed(100).await.unwrap().is_empty());
    let flown = raw_record(&table, &flight.key).await;
    assert!(!flown.contains_key("lq"), "out of `lapsed` once completed");

    let mut purged = 0;
    while let n @ 1.. = table.purge_expired(100).await.unwrap() {
        purged += n;
    }
    assert_eq!(purged, 1, "the record completed before the upgrade");
    let raw = client(&endpoint)
        .get_item()
        .table_name(table.table())
        .set_key(Some(
            [("pk", 0..8), ("sk", 8..32)]
                .into_iter()
                .map(|(a, r)| {
                    let mut v = if a == "sk" { vec![b'r'] } else { vec![] };
                    v.extend_from_slice(&settled.key.as_bytes()[r]);
                    (
                        a.to_owned(),
                        aws_sdk_dynamodb::types::AttributeValue::B(v.into()),
                    )
                })
                .collect(),
        ))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    assert!(raw.item.is_none(), "deleted, not just hidden");

    // `lapsed` is empty now, and the operator deletes it: the running
    // store notices, and its sweep goes on over `leases` alone.
    use aws_sdk_dynamodb::types::{DeleteGlobalSecondaryIndexAction, GlobalSecondaryIndexUpdate};
    client(&endpoint)
        .update_table()
        .table_name(table.table())
        .global_secondary_index_updates(
            GlobalSecondaryIndexUpdate::builder()
                .delete(
                    DeleteGlobalSecondaryIndexAction::builder()
                        .index_name("lapsed")
                        .build()
                        .unwrap(),
                )
                .build(),
        )
        .send()
        .await
        .unwrap();
    let died_last = short(150);
    table.claim(&died_last).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lapsed = lapsed_keys(&table).await;
    assert_eq!(lapsed, vec![died_last.key]);
}

/// The sweep finds a dead replica's claim among many completed records,
/// in every round it is still IN_PROGRESS, and one that lapses after the
/// walk went past the completed ones; a completed record past its
/// retention reads as gone, though only its TTL deletes it; and the records
/// completed on time are listed by no round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_finds_every_lapsed_claim_among_completed_records() {
    let Some(table) = Table::new().await else {
        return;
    };
    let short = |lease_ms: u64, retention_ms: u64| {
        let mut req = claim_request(Duration::from_millis(retention_ms));
        req.lease = Duration::from_millis(lease_ms);
        req.retention = Duration::from_millis(retention_ms);
        req
    };
    let done: Vec<_> = (0..300).map(|_| short(100, 60_000)).collect();
    let died = short(100, 60_000);
    let gone = short(100, 300);
    for (i, req) in done.iter().enumerate() {
        table.claim(req).await.unwrap();
        table.complete(&req.key, req.attempt, "1").await.unwrap();
        if i == 150 {
            table.claim(&died).await.unwrap();
            table.claim(&gone).await.unwrap();
            table.complete(&gone.key, gone.attempt, "1").await.unwrap();
        }
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    for round in 0..2 {
        let lapsed = table.list_lapsed(100).await.unwrap();
        let keys: Vec<_> = lapsed.iter().map(|r| r.key).collect();
        assert_eq!(keys, vec![died.key], "round {round}");
    }
    assert_eq!(
        table.lookup(&gone.tenant, &gone.reference).await.unwrap(),
        None,
        "past its retention: gone"
    );
    assert!(
        raw_record(&table, &gone.key).await.contains_key("tt"),
        "its TTL deletes it"
    );
    assert_eq!(sweep(&table.store, 100).await.unwrap(), 1);
    // The walk went past every completed record; a claim that lapses
    // now is still found.
    let later = short(100, 60_000);
    table.claim(&later).await.unwrap();
    assert!(table.list_lapsed(100).await.unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let keys = lapsed_keys(&table).await;
    assert_eq!(keys, vec![later.key]);
    let counts = table.count_records().await.unwrap();
    assert_eq!(
        counts.completed, 300,
        "the one past its retention is not counted"
    );
}

/// A walker whose clock runs behind the one that last moved the cursor
/// (by more than the walk's rewind) finds nothing due behind it, and says
/// so without an error; a claim that lapses later is still found. (DynamoDB
/// refuses a `BETWEEN` whose lower bound is above its upper one with a
/// `ValidationException`, which the walk must never send; moto answers it
/// with nothing, so here only the outcome is checked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_walker_behind_the_cursor_finds_nothing_due() {
    let Some(table) = Table::new().await else {
        return;
    };
    let ahead = DynamoDbStore::builder(client(&table.endpoint), table.table())
        .clock(|| std::time::SystemTime::now() + Duration::from_secs(5))
        .build()
        .unwrap();
    let done = claim_request(Duration::from_secs(60));
    table.claim(&done).await.unwrap();
    table.complete(&done.key, done.attempt, "1").await.unwrap();
    // Four claims, so every shard's cursor has something to pass.
    for _ in 0..16 {
        let req = claim_request(Duration::from_secs(60));
        table.claim(&req).await.unwrap();
        table.complete(&req.key, req.attempt, "1").await.unwrap();
    }
    assert!(ahead.list_lapsed(100).await.unwrap().is_empty());
    assert!(table.list_lapsed(100).await.unwrap().is_empty());
    let mut late = claim_request(Duration::from_secs(60));
    late.lease = Duration::from_millis(100);
    table.claim(&late).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let keys = lapsed_keys(&ahead).await;
    assert_eq!(keys, vec![late.key]);
}

/// Among 40 records, one is found by its reference (`idem show REF`
/// without `--tenant`) with one query of its partition, and its jobs with
/// one more: DynamoDB is never asked for a Scan, which reads (and bills)
/// the whole table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_and_its_jobs_are_found_without_a_scan() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    let proxy = dynamodb_proxy::Proxy::start(&endpoint).await;
    let table = Table::on(&proxy.url).await;
    let reqs: Vec<_> = (0..40)
        .map(|_| claim_request(Duration::from_secs(900)))
        .collect();
    for req in &reqs {
        table.claim(req).await.unwrap();
    }
    let jobs = [FollowOn::new("receipt", &7).unwrap()];
    table
        .complete_with_follow_ons(
            &reqs[7].key,
            reqs[7].attempt,
            "\"ok\"",
            idem_runtime::store::FollowOns::new(&jobs).unwrap(),
        )
        .await
        .unwrap();
    proxy.reset_counts();
    let found = table.find_by_reference(&reqs[7].reference).await.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(
        (found[0].tenant.as_str(), found[0].attempt),
        (reqs[7].tenant.as_str(), reqs[7].attempt)
    );
    let listed = table
        .list_follow_ons(&idem_runtime::store::FollowOnFilter {
            reference: Some(reqs[7].reference),
            ..Default::default()
        })
        .await
        .unwrap();
    let names: Vec<&str> = listed.iter().map(|j| j.id.name.as_str()).collect();
    assert_eq!(names, ["receipt"]);
    let counts = proxy.counts();
    assert_eq!(proxy.count("Scan"), 0, "{counts:?}");
    assert_eq!(proxy.count("Query"), 2, "{counts:?}");
    assert_eq!(counts.values().sum::<usize>(), 2, "{counts:?}");
}

/// A client for `endpoint` that gives up on a request after `timeout`, and
/// tries each once (the SDK would otherwise send the claim again).
fn impatient_client(endpoint: &str, timeout: Duration) -> aws_sdk_dynamodb::Client {
    use aws_sdk_dynamodb::config::{
        retry::RetryConfig, timeout::TimeoutConfig, BehaviorVersion, Credentials, Region,
    };
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .retry_config(RetryConfig::standard().with_max_attempts(1))
        .timeout_config(
            TimeoutConfig::builder()
                .operation_attempt_timeout(timeout)
                .build(),
        )
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// The claim of the first call is held by a proxy in front of the emulator
/// and forwarded 2.5 s after it was sent, after the store's client gave up
/// on it at 1 s (a request DynamoDB applies after its answer was lost); the
/// lease is 4 s. The first call is told nothing ran; from the landing on,
/// every repeat is told the operation is in progress, with a retry-after
/// that ends within two leases of the first call's send, until the
/// executor's watch has retracted the orphan and a repeat runs the charge:
/// once. At the end the table holds that charge's record and no other, and
/// nothing reads UNKNOWN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_lands_after_its_caller_gave_up_is_retracted() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    let lease = Duration::from_secs(4);
    let proxy = dynamodb_proxy::Proxy::start(&endpoint).await;
    let table = Table::on(&proxy.url).await;
    let store = DynamoDbStore::builder(
        impatient_client(&proxy.url, Duration::from_secs(1)),
        table.table(),
    )
    .build()
    .unwrap();
    let executor = Executor::new(Arc::new(store)).with_lease(lease);
    let (processor, runs) = (Processor::default(), AtomicUsize::new(0));

    // The claim: a PutItem whose condition admits an absent record.
    proxy.hold_next(
        |operation, body| operation == "PutItem" && body.contains("attribute_not_exists(pk)"),
        Duration::from_millis(2_500),
    );
    let sent = tokio::time::Instant::now();
    let first = charge(&executor, &processor, &runs).await;
    assert_eq!(first.name(), "store_unavailable", "{first:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    let landed = proxy.landed(Duration::from_secs(5)).await;
    assert_eq!(landed.status, 200, "the held claim was applied: {landed:?}");
    assert!(sent.elapsed() >= Duration::from_millis(2_400));

    let bound = sent + lease * 2;
    let mut in_progress = 0;
    let executed = loop {
        let answer = charge(&executor, &processor, &runs).await;
        let now = tokio::time::Instant::now();
        match answer {
            Answer::Executed { reference, .. } => break reference,
            Answer::InProgress { retry_after, .. } => {
                in_progress += 1;
                assert!(
                    now + retry_after <= bound,
                    "told to come back {retry_after:?} after {:?}, past two leases",
                    now - sent
                );
                tokio::time::sleep(retry_after).await;
            }
            other => panic!(
                "{:?} after the first call was told nothing ran: {other:?}",
                now - sent
            ),
        }
    };
    assert!(tokio::time::Instant::now() <= bound);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "charged once");

    // Once the watch has ended: the charge's record, and no other.
    tokio::time::sleep_until(sent + lease + Duration::from_millis(500)).await;
    let records = table
        .list_records(&idem_runtime::store::RecordFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let seen: Vec<_> = records
        .iter()
        .map(|r| (r.reference, r.state.kind()))
        .collect();
    assert_eq!(
        seen,
        [(executed, RecordStateKind::Completed)],
        "{in_progress} repeats were told in progress"
    );
    assert_eq!(items(&table).await, 1, "no item of the orphan is left");
}

/// A store on a fresh table behind the lagging proxy, lagging as `lag`
/// says, and a walker on it whose walk rewinds only 50 ms behind its cursor
/// (one clock here), so a walk that passed an entry it should have held is
/// not saved by the rewind. `None` without the proxy (outside CI).
async fn lagging_table(lag: Lag) -> Option<(Table, DynamoDbStore)> {
    let proxy = lagging_endpoint()?;
    let table = Table::on(&proxy).await;
    set_lag(&proxy, table.table(), &lag);
    let walker = DynamoDbStore::builder(client(&proxy), table.table())
        .clock_spread(Duration::from_millis(50))
        .build()
        .unwrap();
    Some((table, walker))
}

/// A claim with its own lease, of a key in the `leases` index's shard 0:
/// one cursor walks every entry of a case.
fn leased(lease_ms: u64) -> idem_runtime::store::ClaimRequest {
    loop {
        let mut req = claim_request(Duration::from_secs(60));
        if req.key.as_bytes()[0].is_multiple_of(4) {
            req.lease = Duration::from_millis(lease_ms);
            return req;
        }
    }
}

/// Sweeps with `walker` until `req`'s record is UNKNOWN; false if it is
/// not by `deadline`.
async fn swept_by(
    walker: &DynamoDbStore,
    req: &idem_runtime::store::ClaimRequest,
    deadline: tokio::time::Instant,
) -> bool {
    while tokio::time::Instant::now() < deadline {
        sweep(walker, 100).await.unwrap();
        let r = walker.lookup(&req.tenant, &req.reference).await.unwrap();
        if r.map(|r| r.state.kind()) == Some(RecordStateKind::Unknown) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

/// The index lags the table: every write reaches `leases` 2.5 s late. Two
/// heartbeats move their records' leases, one by 300 ms (then its handler
/// dies), one by an hour; past the moved short lease and past a settled
/// record's later one, the walk still meets both entries at their old
/// leases. It lists neither (the live one must never be), and holds its
/// cursor there: once the index shows the moved entry, behind the settled
/// one the walk has read since, the walk finds the lapsed claim and the
/// sweep marks it. The live record stays IN_PROGRESS.
#[test]
fn the_walk_holds_its_cursor_while_the_index_lags() {
    let holds = WalkHolds::default();
    holds.run(async {
        let Some((table, walker)) = lagging_table(Lag::fixed(2_500, 0)).await else {
            return;
        };
        let (dies, lives, done) = (leased(2_800), leased(2_800), leased(3_500));
        for req in [&dies, &lives, &done] {
            table.claim(req).await.unwrap();
        }
        let claimed = tokio::time::Instant::now();
        table.complete(&done.key, done.attempt, "1").await.unwrap();
        // The index shows the three claims; then both heartbeats move their
        // lease, and the index shows the old one for 2.5 s more.
        tokio::time::sleep_until(claimed + Duration::from_millis(2_600)).await;
        table
            .heartbeat(&dies.key, dies.attempt, Duration::from_millis(300))
            .await
            .unwrap();
        table
            .heartbeat(&lives.key, lives.attempt, Duration::from_secs(3600))
            .await
            .unwrap();
        // The case: the moved short lease ends before the settled record's.
        let lease = |item: &std::collections::HashMap<_, _>| number(&item["lu"]);
        let (moved, settled) = (
            lease(&raw_record(&table, &dies.key).await),
            lease(&raw_record(&table, &done.key).await),
        );
        assert!(
            moved + 100_000 < settled,
            "the heartbeat came too late for this test (a machine too slow?): its lease ends \
             {} ms after the settled record's",
            (moved as i64 - settled as i64) / 1_000
        );
        // Past both, while the index still shows the old entries.
        tokio::time::sleep_until(claimed + Duration::from_millis(3_700)).await;
        let lapsed = lapsed_keys(&walker).await;
        assert!(!lapsed.contains(&lives.key), "a live record listed");
        assert!(
            holds.counts().0 >= 2,
            "the walk met no entry at a lease its record no longer has (the index caught \
             up before the walk: a machine too slow for this test?): {:?}",
            holds.counts()
        );
        assert!(
            swept_by(&walker, &dies, claimed + Duration::from_secs(12)).await,
            "the lapsed claim was never found: the walk passed its old entry, and the moved \
             one reached the index behind the cursor"
        );
        let alive = table.lookup(&lives.tenant, &lives.reference).await.unwrap();
        assert_eq!(
            alive.map(|r| r.state.kind()),
            Some(RecordStateKind::InProgress)
        );
    });
}

/// The read lags the index: every eventually consistent read sees the
/// table as it stood 2 s ago, and the index shows every write at once. A
/// claim whose handler died lapses, then a completed record's lease ends
/// after it; the walk meets both entries before their records read at all,
/// lists nothing and holds its cursor, and finds the lapsed claim once the
/// reads catch up.
#[test]
fn the_walk_holds_its_cursor_while_the_read_lags() {
    let holds = WalkHolds::default();
    holds.run(async {
        let Some((table, walker)) = lagging_table(Lag::fixed(0, 2_000)).await else {
            return;
        };
        let (dies, done) = (leased(200), leased(600));
        for req in [&dies, &done] {
            table.claim(req).await.unwrap();
        }
        let claimed = tokio::time::Instant::now();
        table.complete(&done.key, done.attempt, "1").await.unwrap();
        // Past both leases, long before the reads show either claim.
        tokio::time::sleep_until(claimed + Duration::from_millis(700)).await;
        assert_eq!(lapsed_keys(&walker).await, vec![]);
        assert!(
            holds.counts().1 >= 2,
            "the walk met no entry whose record did not read yet (a machine too slow for \
             this test?): {:?}",
            holds.counts()
        );
        assert!(
            swept_by(&walker, &dies, claimed + Duration::from_secs(8)).await,
            "the lapsed claim was never found: the walk passed its entry before its record \
             could be read"
        );
        let settled = table.lookup(&done.tenant, &done.reference).await.unwrap();
        assert_eq!(
            settled.map(|r| r.state.kind()),
            Some(RecordStateKind::Completed)
        );
    });
}
