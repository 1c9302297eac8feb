//! The operator's command line (`idem_runtime::cli`, the `idem` binary)
//! against stores a test fills: SQLite always, PostgreSQL when
//! `IDEM_TEST_DATABASE_URL` is set (see `durable::database_url`).
//!
//! One job, over 700 lines: the command line's cases, one function each.

mod durable;
mod dynamodb_emulator;

use std::sync::Arc;
use std::time::Duration;

use durable::{database_url, temp_dir};
use idem_runtime::cli::{EXIT_OK, EXIT_OPERATOR, EXIT_UNREACHABLE, EXIT_USAGE};
use idem_runtime::store::conformance::claim_request;
use idem_runtime::{
    store::{Claim, ClaimRequest, FollowOnStore, RecordState},
    IdempotencyStore, PostgresStore, SqliteStore,
};
use serde_json::{json, Value};

/// What one run of the command line did.
#[derive(Debug)]
struct Ran {
    code: u8,
    out: String,
    err: String,
}

impl Ran {
    fn json(&self) -> Value {
        serde_json::from_str(&self.out).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
}

async fn idem(store: &str, args: &[&str]) -> Ran {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let argv: Vec<&str> = ["idem", "--store", store]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let code = idem_runtime::cli::run(argv, &mut out, &mut err).await;
    Ran {
        code,
        out: String::from_utf8(out).unwrap(),
        err: String::from_utf8(err).unwrap(),
    }
}

/// Three records in one fresh tenant: a completed charge, an UNKNOWN one, a
/// running shipment; returned in that order.
async fn fill(store: &dyn IdempotencyStore) -> Vec<ClaimRequest> {
    let first = claim_request(Duration::from_secs(900));
    let tenant = first.tenant.clone();
    let mut reqs = vec![first];
    for tool in ["charge_card", "create_shipment"] {
        tokio::time::sleep(Duration::from_millis(5)).await;
        reqs.push(ClaimRequest {
            tenant: tenant.clone(),
            tool: tool.to_owned(),
            ..claim_request(Duration::from_secs(900))
        });
    }
    for req in &reqs {
        assert!(matches!(
            store.claim(req).await.unwrap(),
            Claim::Claimed { .. }
        ));
    }
    store
        .complete(
            &reqs[0].key,
            reqs[0].attempt,
            r#"{"charge_id":"ch_secret_card"}"#,
        )
        .await
        .unwrap();
    store
        .mark_unknown(&reqs[1].key, reqs[1].attempt, "the processor timed out")
        .await
        .unwrap();
    reqs
}

/// Everything an operator does, on a store behind `url` that `store` (the
/// same one) was filled through.
async fn operate(url: &str, store: &dyn IdempotencyStore) {
    let reqs = fill(store).await;
    let tenant = reqs[0].tenant.as_str();
    let refs: Vec<String> = reqs.iter().map(|r| r.reference.to_string()).collect();

    // list: the newest claim first, aligned, no response in it.
    let listed = idem(url, &["list", "--tenant", tenant]).await;
    assert_eq!(listed.code, EXIT_OK, "{listed:?}");
    let lines: Vec<&str> = listed.out.lines().collect();
    assert!(lines[0].starts_with("REFERENCE"), "{}", listed.out);
    assert_eq!(lines.len(), 4, "{}", listed.out);
    for (line, (reference, state)) in lines[1..].iter().zip([
        (&refs[2], "IN_PROGRESS"),
        (&refs[1], "UNKNOWN"),
        (&refs[0], "COMPLETED"),
    ]) {
        assert!(
            line.starts_with(reference.as_str()) && line.contains(state),
            "{line}"
        );
    }
    let tool_column = lines[0].find("TOOL").unwrap();
    assert!(
        lines[1..].iter().all(|l| l[tool_column..].starts_with("c")),
        "aligned: {}",
        listed.out
    );
    assert!(!listed.out.contains("ch_secret_card"));

    let unknown = idem(
        url,
        &["--json", "list", "--tenant", tenant, "--state", "unknown"],
    )
    .await;
    assert_eq!(unknown.code, EXIT_OK, "{unknown:?}");
    let unknown = unknown.json();
    assert_eq!(unknown.as_array().unwrap().len(), 1, "{unknown}");
    assert_eq!(unknown[0]["reference"], json!(refs[1]));
    assert_eq!(unknown[0]["note"], json!("the processor timed out"));
    let shipments = idem(
        url,
        &[
            "--json",
            "list",
            "--tenant",
            tenant,
            "--tool",
            "create_shipment",
            "--limit",
            "5",
        ],
    )
    .await;
    assert_eq!(shipments.json()[0]["reference"], json!(refs[2]));

    // show: the response only when asked.
    let shown = idem(url, &["show", &refs[0], "--tenant", tenant]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    assert!(
        shown.out.contains("COMPLETED") && !shown.out.contains("ch_secret_card"),
        "{}",
        shown.out
    );
    assert!(
        shown.out.contains("--response"),
        "says how to see it: {}",
        shown.out
    );
    let with_response = idem(
        url,
        &["--json", "show", &refs[0], "--tenant", tenant, "--response"],
    )
    .await;
    assert_eq!(
        with_response.json()["response"],
        json!({ "charge_id": "ch_secret_card" })
    );
    let elsewhere = idem(url, &["show", &refs[0], "--tenant", "another-tenant"]).await;
    assert_eq!(elsewhere.code, EXIT_OPERATOR, "{elsewhere:?}");
    assert!(
        elsewhere.err.contains("no operation with reference"),
        "{}",
        elsewhere.err
    );
    let malformed = idem(url, &["show", "not-a-reference", "--tenant", tenant]).await;
    assert_eq!(malformed.code, EXIT_USAGE, "{malformed:?}");

    // stats
    let stats = idem(url, &["--json", "stats"]).await;
    assert_eq!(stats.code, EXIT_OK, "{stats:?}");
    let stats = stats.json();
    for state in ["IN_PROGRESS", "COMPLETED", "UNKNOWN"] {
        assert!(stats[state].as_u64().unwrap() >= 1, "{stats}");
    }
    let table = idem(url, &["stats"]).await;
    assert!(
        table.out.starts_with("STATE") && table.out.contains("total"),
        "{}",
        table.out
    );

    // resolve: only an UNKNOWN record, with a note; read back through the store.
    let note = "ops: alice, the processor's dashboard shows ch_42";
    let resolved = idem(
        url,
        &[
            "resolve",
            &refs[1],
            "--tenant",
            tenant,
            "--completed",
            r#"{"charge_id":"ch_42"}"#,
            "--note",
            note,
        ],
    )
    .await;
    assert_eq!(resolved.code, EXIT_OK, "{resolved:?}");
    assert!(resolved.out.contains("COMPLETED"), "{}", resolved.out);
    let record = store
        .lookup(tenant, &reqs[1].reference)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.state,
        RecordState::Completed {
            response: idem_runtime::stored_response(rmcp::handler::server::wrapper::Json(
                json!({"charge_id": "ch_42"})
            ))
            .unwrap()
        },
        "the tool's result, as the tool would have returned it"
    );
    assert_eq!(record.resolution.as_deref(), Some(note));
    let not_unknown = idem(
        url,
        &[
            "resolve",
            &refs[0],
            "--tenant",
            tenant,
            "--not-performed",
            "--note",
            note,
        ],
    )
    .await;
    assert_eq!(not_unknown.code, EXIT_OPERATOR, "{not_unknown:?}");
    assert!(
        not_unknown.err.contains("not UNKNOWN"),
        "{}",
        not_unknown.err
    );
    let not_json = idem(
        url,
        &[
            "resolve",
            &refs[2],
            "--tenant",
            tenant,
            "--completed",
            "{oops",
            "--note",
            note,
        ],
    )
    .await;
    assert_eq!(not_json.code, EXIT_USAGE, "{not_json:?}");
    let both = idem(
        url,
        &[
            "resolve",
            &refs[2],
            "--tenant",
            tenant,
            "--completed",
            "1",
            "--not-performed",
            "--note",
            note,
        ],
    )
    .await;
    assert_eq!(both.code, EXIT_USAGE, "{both:?}");
    let neither = idem(
        url,
        &["resolve", &refs[2], "--tenant", tenant, "--note", note],
    )
    .await;
    assert_eq!(neither.code, EXIT_USAGE, "{neither:?}");

    let purged = idem(url, &["--json", "purge"]).await;
    assert_eq!(purged.code, EXIT_OK, "{purged:?}");
    assert!(purged.json()["purged"].is_u64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_works_on_a_sqlite_store() {
    let dir = temp_dir("cli-sqlite");
    let path = dir.join("idem.sqlite3");
    let store = SqliteStore::open(&path).await.unwrap();
    operate(&format!("sqlite:{}", path.display()), &store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_works_on_a_postgres_store() {
    let Some(url) = database_url() else { return };
    // A database of its own: the command line reads the default schema.
    let db = format!(
        "idem_cli_{:016x}",
        idem_runtime::store::Attempt::random().get()
    );
    let admin = durable::connect(&url).await;
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    let (base, _) = url.rsplit_once('/').unwrap();
    let url_db = format!("{base}/{db}");

    // Not migrated: the store says what to run, and it is "unreachable".
    let unmigrated = idem(&url_db, &["stats"]).await;
    assert_eq!(unmigrated.code, EXIT_UNREACHABLE, "{unmigrated:?}");
    assert!(unmigrated.err.contains("migrate"), "{}", unmigrated.err);

    let store = PostgresStore::connect(&url_db).await.unwrap();
    store.migrate().await.unwrap();
    let store = Arc::new(store);
    operate(&url_db, &*store).await;
    drop(store);
    admin
        .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .await
        .unwrap();
}

/// A server whose store is in a schema of its own
/// (`PostgresStore::builder(url)?.schema(..)`): the command line reads it
/// with `--schema` or `?schema=` on the URL, and without either says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_reads_a_postgres_store_in_its_own_schema() {
    let Some(url) = database_url() else { return };
    let schema = format!(
        "idem_cli_schema_{:016x}",
        idem_runtime::store::Attempt::random().get()
    );
    let store = PostgresStore::builder(&url)
        .unwrap()
        .schema(&schema)
        .build()
        .unwrap();
    store.migrate().await.unwrap();
    let reqs = fill(&store).await;
    let tenant = reqs[0].tenant.as_str();
    let unknown = reqs[1].reference.to_string();

    // In another database `public` may hold idem's tables: point the
    // default at a schema that cannot exist here, as `public` did not.
    let elsewhere = idem(&url, &["--schema", "idem_no_such_schema", "list"]).await;
    assert_eq!(elsewhere.code, EXIT_UNREACHABLE, "{elsewhere:?}");
    assert!(
        elsewhere.err.contains("\"idem_no_such_schema\"")
            && elsewhere.err.contains("--schema NAME"),
        "the error names the schema it read and how to name another: {}",
        elsewhere.err
    );

    let flag = idem(
        &url,
        &["--schema", &schema, "--json", "list", "--tenant", tenant],
    )
    .await;
    assert_eq!(flag.code, EXIT_OK, "{flag:?}");
    assert_eq!(flag.json().as_array().unwrap().len(), 3, "{}", flag.out);
    // After the command too (a global flag), and as the URL's parameter.
    let shown = idem(
        &url,
        &["show", &unknown, "--tenant", tenant, "--schema", &schema],
    )
    .await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    assert!(shown.out.contains("UNKNOWN"), "{}", shown.out);
    let joiner = if url.contains('?') { '&' } else { '?' };
    let in_url = format!("{url}{joiner}schema={schema}");
    let stats = idem(&in_url, &["--json", "stats"]).await;
    assert_eq!(stats.code, EXIT_OK, "{stats:?}");
    assert_eq!(stats.json()["total"], json!(3), "{}", stats.out);

    // Given twice, or to a store without schemas: refused, saying why.
    let twice = idem(&in_url, &["--schema", &schema, "stats"]).await;
    assert_eq!(twice.code, EXIT_USAGE, "{twice:?}");
    assert!(twice.err.contains("give it once"), "{}", twice.err);
    let sqlite = idem("sqlite:/tmp/x.sqlite3", &["--schema", "nc2", "stats"]).await;
    assert_eq!(sqlite.code, EXIT_USAGE, "{sqlite:?}");
    assert!(
        sqlite.err.contains("not a PostgreSQL store"),
        "{}",
        sqlite.err
    );

    durable::connect(&url)
        .await
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}

#[tokio::test]
async fn configuration_mistakes_say_what_to_do() {
    let missing = idem("sqlite:/nonexistent/idem.sqlite3", &["stats"]).await;
    assert_eq!(missing.code, EXIT_USAGE, "{missing:?}");
    assert!(
        missing.err.contains("give the path the server uses"),
        "{}",
        missing.err
    );
    let nonsense = idem("mysql://x", &["stats"]).await;
    assert_eq!(nonsense.code, EXIT_USAGE, "{nonsense:?}");
    assert!(nonsense.err.contains("sqlite:PATH"), "{}", nonsense.err);
    let memory = idem("memory", &["stats"]).await;
    assert_eq!(memory.code, EXIT_USAGE, "{memory:?}");
    // Nothing listens on port 1.
    let unreachable = idem("postgres://idem@127.0.0.1:1/idem", &["stats"]).await;
    assert_eq!(unreachable.code, EXIT_UNREACHABLE, "{unreachable:?}");
    let no_command = idem("memory", &[]).await;
    assert_eq!(no_command.code, EXIT_USAGE, "{no_command:?}");
    let help = idem("memory", &["--help"]).await;
    assert_eq!(help.code, EXIT_OK, "{help:?}");
    assert!(help.out.contains("Exit codes"), "{}", help.out);
}

/// The real binary, as `cargo install idem-runtime --features cli` gives
/// it: the root package builds the same source file as `idem_cli`.
#[test]
fn the_idem_binary_runs() {
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_idem_cli"));

    let dir = temp_dir("cli-bin");
    let path = dir.join("idem.sqlite3");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let reqs = runtime.block_on(async {
        let store = SqliteStore::open(&path).await.unwrap();
        fill(&store).await
    });
    let url = format!("sqlite:{}", path.display());
    let run = |args: &[&str]| {
        std::process::Command::new(&bin)
            .args(["--store", &url])
            .args(args)
            .output()
            .expect("idem runs")
    };
    let stats = run(&["--json", "stats"]);
    assert!(stats.status.success(), "{stats:?}");
    let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["total"], json!(3));
    let reference = reqs[1].reference.to_string();
    let not_found = run(&["show", &reference, "--tenant", "nobody"]);
    assert_eq!(not_found.status.code(), Some(1), "{not_found:?}");
    let usage = run(&["resolve", &reference]);
    assert_eq!(usage.status.code(), Some(2), "{usage:?}");
}

/// "Was the e-mail sent?": a delivered job is listed by `jobs --state
/// delivered` with when it was delivered and by which run, left out of the
/// default listing (the work to do), and `show` lists it with the
/// operation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivered_jobs_are_listed_and_shown() {
    let dir = temp_dir("cli-delivered");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    let req = claim_request(Duration::from_secs(900));
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    let jobs = ["send_receipt", "notify_warehouse"].map(|name| {
        idem_runtime::outbox::FollowOn::new(name, &json!({"to": "a@example.com"})).unwrap()
    });
    store
        .complete_with_follow_ons(&req.key, req.attempt, "\"paid\"", &jobs)
        .await
        .unwrap();
    let token = idem_runtime::store::Attempt::random();
    let leased = store
        .lease_jobs(&["send_receipt"], 1, Duration::from_secs(60), token)
        .await
        .unwrap();
    store.finish_job(&leased[0].id, token).await.unwrap();
    let reference = req.reference.to_string();

    let delivered = idem(&url, &["--json", "jobs", "--state", "delivered"]).await;
    assert_eq!(delivered.code, EXIT_OK, "{delivered:?}");
    let delivered = delivered.json();
    assert_eq!(delivered.as_array().map(Vec::len), Some(1), "{delivered}");
    assert_eq!(delivered[0]["name"], json!("send_receipt"));
    assert_eq!(delivered[0]["state"], json!("delivered"));
    assert_eq!(delivered[0]["runs"], json!(1));
    assert!(delivered[0]["delivered_at"].is_string(), "{delivered}");
    assert!(delivered[0]["kept_until"].is_string(), "{delivered}");
    let table = idem(&url, &["jobs", "--state", "delivered"]).await;
    assert!(
        table.out.contains(&reference) && table.out.contains("delivered"),
        "{}",
        table.out
    );

    let waiting = idem(&url, &["--json", "jobs"]).await.json();
    let names: Vec<&Value> = waiting
        .as_array()
        .unwrap()
        .iter()
        .map(|j| &j["name"])
        .collect();
    assert_eq!(names, [&json!("notify_warehouse")], "{waiting}");
    let by_state = idem(&url, &["--json", "jobs", "--state", "waiting"])
        .await
        .json();
    assert_eq!(by_state, waiting);
    let dead = idem(&url, &["--json", "jobs", "--state", "dead"])
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
        idem_runtime::outbox::FollowOn::new("send_receipt", &json!({"to": "a@example.com"}))
            .unwrap();
    store
        .complete_with_follow_ons(&req.key, req.attempt, "\"paid\"", &[receipt])
        .await
        .unwrap();
    let token = idem_runtime::store::Attempt::random();
    let leased = store
        .lease_jobs(&["send_receipt"], 1, Duration::from_secs(60), token)
        .await
        .unwrap();
    store
        .bury_job(&leased[0].id, token, "mailer bounced: no such address")
        .await
        .unwrap();
    let reference = req.reference.to_string();

    let live = idem(&url, &["--json", "jobs"]).await;
    assert_eq!(live.code, EXIT_OK, "{live:?}");
    assert_eq!(live.json(), json!([]));
    let dead = idem(&url, &["jobs", "--dead"]).await;
    assert_eq!(dead.code, EXIT_OK, "{dead:?}");
    assert!(
        dead.out.contains(&reference) && dead.out.contains("mailer bounced"),
        "{}",
        dead.out
    );
    let listed = idem(
        &url,
        &["--json", "jobs", "--dead", "--reference", &reference],
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
    assert!(again.err.contains("no dead job"), "{}", again.err);
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
        .lease_jobs(
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

/// A charge whose outcome the processor left unknown, through the executor
/// as the rmcp glue runs it (the tool's result is a `CallToolResult`), on a
/// SQLite file; returns its reference. `runs` counts the handler's runs.
async fn unknown_charge(
    executor: &idem_runtime::Executor,
    caller: &idem_runtime::Caller,
    cents: u64,
    runs: &std::sync::atomic::AtomicUsize,
) -> idem_runtime::Answer<rmcp::model::CallToolResult, idem_runtime::ToolError> {
    use std::sync::atomic::Ordering;
    let args = json!({"card": "4242", "cents": cents});
    let op = idem_runtime::Operation {
        caller,
        tool: "charge_card",
        args: &args,
        scope: idem_runtime::ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: "get_operation_status",
    };
    executor
        .run(op, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Err(idem_runtime::ToolError::unknown("the processor timed out"))
        })
        .await
}

/// `resolve --completed '{"charge_id":"ch_42"}'`, as the README writes it,
/// stores what the tool would have returned: a repeat of the call replays
/// that value as the tool's structured result, the handler does not run
/// again, and the status tool answers the same result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resolution_by_hand_is_replayed_as_the_tools_result() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = temp_dir("cli-replay");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = Arc::new(SqliteStore::open(&path).await.unwrap());
    let executor = idem_runtime::Executor::new(store.clone());
    let caller = idem_runtime::Caller::new("acme", "alice");
    let runs = AtomicUsize::new(0);
    let first = unknown_charge(&executor, &caller, 500, &runs).await;
    let reference = match &first {
        idem_runtime::Answer::Failed { reference, .. }
        | idem_runtime::Answer::Unknown { reference, .. } => reference.to_string(),
        other => panic!("{other:?}"),
    };
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let resolved = idem(
        &url,
        &[
            "resolve",
            &reference,
            "--tenant",
            "acme",
            "--completed",
            r#"{"charge_id":"ch_42"}"#,
            "--note",
            "alice: the processor's dashboard shows ch_42",
        ],
    )
    .await;
    assert_eq!(resolved.code, EXIT_OK, "{resolved:?}");

    let again = unknown_charge(&executor, &caller, 500, &runs).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler did not run again"
    );
    match again {
        idem_runtime::Answer::Replayed { value, .. } => {
            assert_eq!(
                value.structured_content,
                Some(json!({"charge_id": "ch_42"}))
            );
            assert_eq!(value.is_error, Some(false));
        }
        other => panic!("a repeat is replayed with the resolution: {other:?}"),
    }
    let status = executor
        .status(&caller, &reference)
        .await
        .unwrap()
        .expect("the status tool finds it");
    let response = status.response.expect("a completed status has a response");
    assert_eq!(response["structuredContent"], json!({"charge_id": "ch_42"}));

    // A text tool's whole result goes in --completed-result; what would not
    // replay is refused, and the record stays UNKNOWN.
    let other = unknown_charge(&executor, &caller, 700, &runs).await;
    let other = other.reference().unwrap();
    for (flag, given, says) in [
        ("--completed", r#""charged""#, "not a JSON object"),
        ("--completed", "[1, 2]", "not a JSON object"),
        ("--completed", "{oops", "not JSON"),
        (
            "--completed",
            r#"{"content":[{"type":"text","text":"charged"}]}"#,
            "--completed-result",
        ),
        (
            "--completed-result",
            r#"{"charge_id":"ch_43"}"#,
            "not a tool result",
        ),
    ] {
        let refused = idem(
            &url,
            &[
                "resolve",
                &other.to_string(),
                "--tenant",
                "acme",
                flag,
                given,
                "--note",
                "ops",
            ],
        )
        .await;
        assert_eq!(refused.code, EXIT_USAGE, "{flag} {given}: {refused:?}");
        assert!(
            refused.err.contains(says),
            "{flag} {given}: {}",
            refused.err
        );
        assert!(
            matches!(
                store.lookup("acme", &other).await.unwrap().unwrap().state,
                RecordState::Unknown { .. }
            ),
            "{flag} {given} changed the record"
        );
    }
    let whole = idem(
        &url,
        &[
            "resolve",
            &other.to_string(),
            "--tenant",
            "acme",
            "--completed-result",
            r#"{"content":[{"type":"text","text":"charged ch_43"}]}"#,
            "--note",
            "ops: ch_43 on the dashboard",
        ],
    )
    .await;
    assert_eq!(whole.code, EXIT_OK, "{whole:?}");
    match unknown_charge(&executor, &caller, 700, &runs).await {
        idem_runtime::Answer::Replayed { value, .. } => {
            assert_eq!(value.content.len(), 1);
            assert_eq!(
                value.content[0].as_text().map(|t| t.text.as_str()),
                Some("charged ch_43")
            );
        }
        other => panic!("a repeat is replayed with the resolution: {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "one run per operation");
}

/// `resolve --completed ... --follow-on NAME=JSON` writes the jobs the
/// handler would have declared, with the resolution; a dispatcher then runs
/// each once. With `--not-performed`, or malformed, the option is refused
/// and nothing is written: the record stays UNKNOWN and no job exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ons_are_written_with_a_resolution_by_hand() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = temp_dir("cli-follow-ons");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    let req = claim_request(Duration::from_secs(900));
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    store
        .mark_unknown(&req.key, req.attempt, "the processor timed out")
        .await
        .unwrap();
    let reference = req.reference.to_string();
    let tenant = req.tenant.as_str();
    let jobs = || async {
        store
            .list_jobs(&idem_runtime::store::JobFilter {
                tenant: Some(tenant.to_owned()),
                states: vec![
                    idem_runtime::store::JobState::Waiting,
                    idem_runtime::store::JobState::Running,
                    idem_runtime::store::JobState::Dead,
                ],
                limit: 10,
                ..idem_runtime::store::JobFilter::default()
            })
            .await
            .unwrap()
    };
    let resolve = |extra: &'static [&'static str]| {
        let mut args = vec![
            "resolve",
            reference.as_str(),
            "--tenant",
            tenant,
            "--note",
            "ops: ch_42 on the dashboard",
        ];
        args.extend_from_slice(extra);
        let url = url.clone();
        async move { idem(&url, &args).await }
    };

    for (extra, says) in [
        (
            &[
                "--not-performed",
                "--follow-on",
                r#"send_receipt={"to":"a@example.com"}"#,
            ][..],
            "cannot be used with",
        ),
        (
            &[
                "--completed",
                r#"{"charge_id":"ch_42"}"#,
                "--follow-on",
                "send_receipt",
            ][..],
            "NAME=JSON",
        ),
        (
            &[
                "--completed",
                r#"{"charge_id":"ch_42"}"#,
                "--follow-on",
                "send_receipt={to",
            ][..],
            "not JSON",
        ),
        (
            &[
                "--completed",
                r#"{"charge_id":"ch_42"}"#,
                "--follow-on",
                "send receipt=1",
            ][..],
            "A-Z a-z 0-9",
        ),
        (
            &[
                "--completed",
                r#"{"charge_id":"ch_42"}"#,
                "--follow-on",
                "send_receipt=1",
                "--follow-on",
                "send_receipt=2",
            ][..],
            "twice",
        ),
    ] {
        let refused = resolve(extra).await;
        assert_ne!(refused.code, EXIT_OK, "{extra:?}: {refused:?}");
        assert!(refused.err.contains(says), "{extra:?}: {}", refused.err);
        let record = store.lookup(tenant, &req.reference).await.unwrap();
        assert!(
            matches!(record.unwrap().state, RecordState::Unknown { .. }),
            "{extra:?} changed the record"
        );
        assert!(jobs().await.is_empty(), "{extra:?} wrote a job");
    }

    let resolved = resolve(&[
        "--completed",
        r#"{"charge_id":"ch_42"}"#,
        "--follow-on",
        r#"send_receipt={"to":"a@example.com","charge_id":"ch_42"}"#,
        "--follow-on",
        r#"notify_warehouse=["w1"]"#,
    ])
    .await;
    assert_eq!(resolved.code, EXIT_OK, "{resolved:?}");
    assert!(resolved.out.contains("send_receipt"), "{}", resolved.out);
    let written = jobs().await;
    let mut payloads: Vec<(String, Value)> = written
        .iter()
        .map(|j| (j.id.name.clone(), serde_json::from_str(&j.payload).unwrap()))
        .collect();
    payloads.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        payloads,
        [
            ("notify_warehouse".to_owned(), json!(["w1"])),
            (
                "send_receipt".to_owned(),
                json!({"to": "a@example.com", "charge_id": "ch_42"})
            ),
        ]
    );

    // The far side: a dispatcher runs each job once.
    let sent = Arc::new(AtomicUsize::new(0));
    let handler = || {
        let counted = sent.clone();
        idem_runtime::outbox::job_fn(move |_| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
        })
    };
    let handlers = idem_runtime::outbox::JobHandlers::new()
        .on("send_receipt", handler())
        .on("notify_warehouse", handler());
    let config = idem_runtime::outbox::OutboxConfig::default();
    for _ in 0..3 {
        idem_runtime::outbox::Outbox::round(&store, &handlers, &config)
            .await
            .unwrap();
    }
    assert_eq!(sent.load(Ordering::SeqCst), 2);
    assert!(jobs().await.is_empty(), "both delivered");
}

/// A note or a job's error from a far side may hold newlines and terminal
/// escape sequences: `show` and `jobs` print them escaped, one row each, so
/// they can neither forge a row (a `resolution:` the record does not have)
/// nor drive the operator's terminal; `--json` keeps them exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_escape_what_a_far_side_wrote() {
    let dir = temp_dir("cli-escape");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    let forged = "processor said: timeout\nresolution:  alice: refunded, all fine\u{1b}[2J\u{7}\r";
    let req = claim_request(Duration::from_secs(900));
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    let receipt =
        idem_runtime::outbox::FollowOn::new("send_receipt", &json!({"to": "a@b"})).unwrap();
    store
        .complete_with_follow_ons(&req.key, req.attempt, "\"paid\"", &[receipt])
        .await
        .unwrap();
    let token = idem_runtime::store::Attempt::random();
    let leased = store
        .lease_jobs(&["send_receipt"], 1, Duration::from_secs(60), token)
        .await
        .unwrap();
    store.bury_job(&leased[0].id, token, forged).await.unwrap();
    let unknown = ClaimRequest {
        tenant: req.tenant.clone(),
        ..claim_request(Duration::from_secs(900))
    };
    assert!(matches!(
        store.claim(&unknown).await.unwrap(),
        Claim::Claimed { .. }
    ));
    store
        .mark_unknown(&unknown.key, unknown.attempt, forged)
        .await
        .unwrap();
    let reference = unknown.reference.to_string();

    let shown = idem(&url, &["show", &reference, "--tenant", &req.tenant]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    let lines: Vec<&str> = shown.out.lines().collect();
    assert!(
        !lines.iter().any(|l| l.starts_with("resolution:")),
        "a forged row: {}",
        shown.out
    );
    let note = lines
        .iter()
        .find(|l| l.starts_with("note:"))
        .unwrap_or_else(|| panic!("{}", shown.out));
    assert!(
        note.contains(r"timeout\nresolution:") && note.contains(r"\u{1b}[2J\u{7}\r"),
        "{note}"
    );
    assert!(
        !shown.out.contains(['\u{1b}', '\u{7}', '\r']),
        "{:?}",
        shown.out
    );

    let dead = idem(&url, &["jobs", "--dead", "--tenant", &req.tenant]).await;
    assert_eq!(dead.code, EXIT_OK, "{dead:?}");
    assert_eq!(
        dead.out.lines().count(),
        2,
        "a header and one job: {}",
        dead.out
    );
    assert!(dead.out.contains(r"timeout\nresolution:"), "{}", dead.out);
    assert!(
        !dead.out.contains(['\u{1b}', '\u{7}', '\r']),
        "{:?}",
        dead.out
    );

    let exact = idem(
        &url,
        &["--json", "show", &reference, "--tenant", &req.tenant],
    )
    .await;
    assert_eq!(exact.json()["note"], json!(forged));
    let exact = idem(&url, &["--json", "jobs", "--dead", "--tenant", &req.tenant]).await;
    assert_eq!(exact.json()[0]["last_error"], json!(forged));
}

/// A tenant or a tool name may hold format characters that reorder or hide
/// what a terminal prints (U+061C, the tag characters): `show` and `list`
/// print them escaped; `--json` keeps them exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_escape_format_characters_in_tenants_and_tools() {
    let dir = temp_dir("cli-format");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    let base = claim_request(Duration::from_secs(900));
    let tenant = format!("{}\u{61c}acme\u{e0041}", base.tenant);
    let escaped_tenant = format!(r"{}\u{{61c}}acme\u{{e0041}}", base.tenant);
    let req = ClaimRequest {
        tenant: tenant.clone(),
        tool: "charge\u{e0041}_card\u{61c}".to_owned(),
        ..base
    };
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    store
        .complete(&req.key, req.attempt, "\"paid\"")
        .await
        .unwrap();
    let reference = req.reference.to_string();
    let escaped_tool = r"charge\u{e0041}_card\u{61c}";

    let shown = idem(&url, &["show", &reference, "--tenant", &tenant]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    assert!(shown.out.contains(escaped_tool), "{}", shown.out);
    assert!(shown.out.contains(&escaped_tenant), "{}", shown.out);
    assert!(
        !shown.out.contains(['\u{61c}', '\u{e0041}']),
        "{:?}",
        shown.out
    );

    let listed = idem(&url, &["list", "--tenant", &tenant]).await;
    assert_eq!(listed.code, EXIT_OK, "{listed:?}");
    assert_eq!(listed.out.lines().count(), 2, "{}", listed.out);
    assert!(listed.out.contains(escaped_tool), "{}", listed.out);
    assert!(
        !listed.out.contains(['\u{61c}', '\u{e0041}']),
        "{:?}",
        listed.out
    );

    let exact = idem(&url, &["--json", "show", &reference, "--tenant", &tenant]).await;
    assert_eq!(exact.json()["tool"], json!(req.tool));
    assert_eq!(exact.json()["tenant"], json!(tenant));
}

/// `show REF` finds the reference in whichever tenant holds it; asks for
/// `--tenant` only when two tenants hold it, and says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_finds_a_reference_without_its_tenant() {
    let dir = temp_dir("cli-show-anywhere");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    let reqs = fill(&store).await;
    let reference = reqs[1].reference.to_string();

    let shown = idem(&url, &["--json", "show", &reference]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    let shown = shown.json();
    assert_eq!(shown["tenant"], json!(reqs[1].tenant), "{shown}");
    assert_eq!(shown["state"], json!("UNKNOWN"), "{shown}");
    let table = idem(&url, &["show", &reference]).await;
    assert_eq!(table.code, EXIT_OK, "{table:?}");
    assert!(table.out.contains(&reqs[1].tenant), "{}", table.out);

    // Another tenant's record under the same reference (a reference is the
    // key's first eight bytes and the operation's tag): ambiguous.
    let mut bytes = *reqs[1].key.as_bytes();
    bytes[31] ^= 0xff;
    let key = idem_runtime::IdempotencyKey::from_parts(bytes, bytes);
    let copy = ClaimRequest {
        tenant: "globex".to_owned(),
        key,
        reference: idem_runtime::Reference::with_tag(&key, reqs[1].reference.tag()),
        ..claim_request(Duration::from_secs(900))
    };
    assert_eq!(copy.reference, reqs[1].reference);
    assert!(matches!(
        store.claim(&copy).await.unwrap(),
        Claim::Claimed { .. }
    ));
    let ambiguous = idem(&url, &["show", &reference]).await;
    assert_eq!(ambiguous.code, EXIT_USAGE, "{ambiguous:?}");
    assert!(
        ambiguous.err.contains("2 tenants")
            && ambiguous.err.contains("--tenant")
            && ambiguous.err.contains("\"globex\"")
            && ambiguous.err.contains(&format!("{:?}", reqs[1].tenant)),
        "{}",
        ambiguous.err
    );
    let chosen = idem(&url, &["--json", "show", &reference, "--tenant", "globex"]).await;
    assert_eq!(chosen.code, EXIT_OK, "{chosen:?}");
    assert_eq!(chosen.json()["state"], json!("IN_PROGRESS"));

    // A reference nobody holds.
    let nobody = claim_request(Duration::from_secs(900))
        .reference
        .to_string();
    let missing = idem(&url, &["show", &nobody]).await;
    assert_eq!(missing.code, EXIT_OPERATOR, "{missing:?}");
    assert!(missing.err.contains("in any tenant"), "{}", missing.err);
}

/// A delivered job after a re-drive: its runs are counted across the
/// re-drive, and the failure that buried it is shown as past, never as the
/// job's present trouble, even when a run since lapsed without an error; a
/// job delivered on a retry shows its earlier run's error as earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_show_an_old_failure_as_old() {
    let dir = temp_dir("cli-jobs-history");
    let path = dir.join("idem.sqlite3");
    let url = format!("sqlite:{}", path.display());
    let store = SqliteStore::open(&path).await.unwrap();
    let req = claim_request(Duration::from_secs(900));
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    let jobs = ["send_receipt", "notify_warehouse"].map(|name| {
        idem_runtime::outbox::FollowOn::new(name, &json!({"to": "a@example.com"})).unwrap()
    });
    store
        .complete_with_follow_ons(&req.key, req.attempt, "\"paid\"", &jobs)
        .await
        .unwrap();
    let lease_for = |name: &'static str, lease: Duration| {
        let store = &store;
        async move {
            let token = idem_runtime::store::Attempt::random();
            let leased = store.lease_jobs(&[name], 1, lease, token).await.unwrap();
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
        .bury_job(&id, token, "mailer bounced: no such address")
        .await
        .unwrap();
    assert!(store.redrive_job(&id).await.unwrap());
    let waiting = idem(&url, &["--json", "jobs", "--name", "send_receipt"])
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
    let running = idem(&url, &["--json", "jobs", "--name", "send_receipt"])
        .await
        .json();
    assert_eq!(running[0]["all_runs"], json!(2), "{running}");
    assert_eq!(
        running[0]["last_error_is_current"],
        json!(false),
        "{running}"
    );
    let (id, token) = lease("send_receipt").await;
    store.finish_job(&id, token).await.unwrap();
    // notify_warehouse: failed once, delivered on its retry.
    let (id, token) = lease("notify_warehouse").await;
    store
        .retry_job(&id, token, Duration::ZERO, "warehouse timed out")
        .await
        .unwrap();
    let (id, token) = lease("notify_warehouse").await;
    store.finish_job(&id, token).await.unwrap();

    let table = idem(&url, &["jobs", "--state", "delivered"]).await;
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

    let listed = idem(&url, &["--json", "jobs", "--state", "delivered"])
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

/// `create-table` makes a DynamoDB table the store can use at once (on the
/// emulator, `IDEM_TEST_DYNAMODB_ENDPOINT`); before it, the store is
/// refused; other stores are told they need no such step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_table_makes_a_dynamodb_table() {
    let not_dynamodb = idem("sqlite:/tmp/none.sqlite3", &["create-table"]).await;
    assert_eq!(not_dynamodb.code, EXIT_USAGE, "{not_dynamodb:?}");
    assert!(
        not_dynamodb.err.contains("not a dynamodb:// URL"),
        "{}",
        not_dynamodb.err
    );
    let Some(endpoint) = dynamodb_emulator::endpoint() else {
        return;
    };
    // The emulator takes any credentials.
    for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, "testing");
        }
    }
    let table = dynamodb_emulator::fresh_table();
    let url = format!("dynamodb://{table}?region=us-east-1&endpoint={endpoint}");

    let before = idem(&url, &["stats"]).await;
    assert_ne!(before.code, EXIT_OK, "no table yet: {before:?}");

    let made = idem(&url, &["create-table"]).await;
    assert_eq!(made.code, EXIT_OK, "{made:?}");
    assert!(made.out.contains(&table), "{}", made.out);
    let again = idem(&url, &["--json", "create-table"]).await;
    assert_eq!(again.code, EXIT_OK, "an existing table is kept: {again:?}");
    assert_eq!(again.json()["table"], json!(table));

    let stats = idem(&url, &["--json", "stats"]).await;
    assert_eq!(stats.code, EXIT_OK, "{stats:?}");
    assert_eq!(stats.json()["total"], json!(0));
    // The store works on it: a claim, seen by the command line.
    let store = idem_runtime::DynamoDbStore::from_url(&url)
        .unwrap()
        .build()
        .unwrap();
    let req = claim_request(Duration::from_secs(900));
    assert!(matches!(
        store.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    let shown = idem(&url, &["--json", "show", &req.reference.to_string()]).await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    assert_eq!(shown.json()["tenant"], json!(req.tenant));
    let _ = store.delete_table().await;
}
