//! What the logs carry: a call, its replay, a call whose outcome is
//! unknown, its resolution by hand and the delivery of their follow-on
//! jobs, on every store, with every target captured at TRACE (the `log`
//! crate's records too, which tokio-postgres and redis write), and none of
//! the arguments, responses, notes, job payloads or fingerprints found in
//! any of it: not as text, not as hex, not as a list of bytes, not as
//! base64.
//!
//! The one exception is the one docs/deploying.md names: the AWS SDK's
//! orchestrator (`aws_smithy_runtime::client::orchestrator`) writes each
//! response body it reads, and what it decodes from it, at TRACE, whatever
//! idem does; there, the test checks that it still does (so the warning is
//! still needed) and that nothing else does.
//!
//! One subscriber for the whole binary (a driver logs from threads and
//! tasks of its own, which a scoped subscriber would miss), and the tests
//! take turns, so each reads only its own capture.

mod durable;
mod dynamodb_emulator;
mod redis_server;

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use idem_runtime::follow_ons::{
    follow_on_fn, FollowOn, FollowOnConfig, FollowOnDispatcher, FollowOnHandlers, FollowOnRun,
};
use idem_runtime::maintenance::{resolve_by_hand, Outcome};
use idem_runtime::store::{Attempt, RecordStateKind};
use idem_runtime::{
    answer::Answer,
    executor::{Operation, ScopeSpec},
    Caller, Executor, IdempotencyStore, MemoryStore, PostgresStore, Reference, SqliteStore,
    ToolError,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;

/// Where the AWS SDK writes the response bodies it reads, at TRACE: the
/// target docs/deploying.md tells users to keep at DEBUG or below.
const SDK_BODIES: &str = "aws_smithy_runtime::client::orchestrator";

/// One captured record: a span's fields, a field recorded later, or an
/// event.
#[derive(Debug)]
struct Captured {
    level: Level,
    target: String,
    text: String,
}

static CAPTURED: Mutex<Vec<Captured>> = Mutex::new(Vec::new());

/// The tests take turns: the capture is the whole process's.
static TURN: Mutex<()> = Mutex::new(());

/// Records everything, every field formatted as a subscriber that prints
/// it would.
struct Capture;

struct Fields<'a> {
    text: &'a mut String,
    /// A `log` record's own target (tracing's is `log`).
    log_target: Option<String>,
}

impl<'a> Fields<'a> {
    fn new(text: &'a mut String) -> Self {
        Fields {
            text,
            log_target: None,
        }
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "log.target" {
            self.log_target = Some(value.to_owned());
        }
        let _ = write!(self.text, " {}={}", field.name(), value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.text, " {}={:?}", field.name(), value);
    }
}

fn keep(meta: &Metadata<'_>, fields: impl FnOnce(&mut Fields<'_>), mut text: String) {
    let mut visitor = Fields::new(&mut text);
    fields(&mut visitor);
    let target = visitor.log_target.take();
    let captured = Captured {
        level: *meta.level(),
        target: target.unwrap_or_else(|| meta.target().to_owned()),
        text,
    };
    CAPTURED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(captured);
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, _: &Id, _: Context<'_, S>) {
        let text = format!("span {}", attrs.metadata().name());
        keep(attrs.metadata(), |f| attrs.record(f), text);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let text = format!("record {}", span.name());
        keep(span.metadata(), |f| values.record(f), text);
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        keep(event.metadata(), |f| event.record(f), "event".into());
    }
}

/// Takes this test's turn, with the capture installed (once: the global
/// subscriber, and the `log` crate's records forwarded to it) and emptied.
fn turn() -> std::sync::MutexGuard<'static, ()> {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        tracing_subscriber::registry()
            .with(Capture)
            .try_init()
            .expect("the capture is this binary's only subscriber");
    });
    let turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
    CAPTURED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clear();
    turn
}

/// The capture so far, taken.
fn captured() -> Vec<Captured> {
    std::mem::take(&mut *CAPTURED.lock().unwrap_or_else(PoisonError::into_inner))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A value no log may carry, named for the report.
#[derive(Clone, Debug)]
struct Secret {
    what: &'static str,
    bytes: Vec<u8>,
}

/// 32 random hex digits.
fn marker() -> String {
    format!(
        "{:016x}{:016x}",
        Attempt::random().get(),
        Attempt::random().get()
    )
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn base64(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(B64[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

impl Secret {
    /// Every way a driver or a subscriber may write these bytes: as they
    /// are, escaped as Rust writes a byte string, as hex (PostgreSQL's
    /// bytea), as a `Debug` list of bytes, and as base64 (DynamoDB's
    /// binary attributes), at each of the three offsets a value can have in
    /// a longer base64 text.
    fn spellings(&self) -> Vec<String> {
        let b = &self.bytes;
        let mut out = vec![
            String::from_utf8_lossy(b).into_owned(),
            b.escape_ascii().to_string(),
            b.iter().map(|x| format!("{x:02x}")).collect(),
            b.iter().map(|x| format!("{x:02X}")).collect(),
            format!("{b:?}").trim_matches(['[', ']']).to_owned(),
        ];
        for skip in 0..3 {
            let whole = (b.len() - skip) / 3 * 3;
            let text = base64(&b[skip..skip + whole]);
            out.push(text.clone());
            out.push(text.replace('+', "-").replace('/', "_"));
        }
        out
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Receipt {
    charge_id: String,
}

const TENANT: &str = "acme";
const STATUS_TOOL: &str = "get_operation_status";
const JOB: &str = "send_receipt";

/// The far side: how many times each handler ran, and the jobs delivered.
#[derive(Default)]
struct Effects {
    charges: Mutex<Vec<String>>,
    mailed: Mutex<Vec<String>>,
}

/// A call, its replay, a call whose outcome is unknown, its resolution by
/// hand, a replay of that, the status read of both, and one round of the
/// follow-ons, on `store`. Returns the values no log may carry.
async fn call_replay_resolve(store: Arc<dyn IdempotencyStore>) -> Vec<Secret> {
    let card = marker();
    let charge = marker();
    let mail_to = marker();
    let other_card = marker();
    let why_unknown = marker();
    let resolved_charge = marker();
    let note = marker();
    let resolved_mail_to = marker();

    let executor = Executor::new(store.clone());
    let effects = Arc::new(Effects::default());
    let caller = Caller::new(TENANT, "alice");
    let pay = |card: &str| json!({"card": card, "amount_cents": 450});
    let (args, other_args) = (pay(&card), pay(&other_card));
    let op = |args| Operation {
        caller: &caller,
        tool: "pay",
        args,
        scope: ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: STATUS_TOOL,
    };
    let charged = |charge_id: String, mail_to: String| {
        let effects = effects.clone();
        move |_: idem_runtime::executor::OperationContext| async move {
            effects.charges.lock().unwrap().push(charge_id.clone());
            idem_runtime::follow_on(JOB, &json!({"to": mail_to}))
                .map_err(|e| ToolError::rejected(e.to_string()))?;
            Ok::<_, ToolError>(Receipt { charge_id })
        }
    };

    // A call, and its replay.
    let first = executor
        .run(op(&args), charged(charge.clone(), mail_to.clone()))
        .await;
    assert!(matches!(first, Answer::Executed { .. }), "{first:?}");
    let again = executor
        .run(op(&args), charged(charge.clone(), mail_to.clone()))
        .await;
    assert!(
        matches!(&again, Answer::Replayed { value, .. } if value.charge_id == charge),
        "{again:?}"
    );
    executor.drain(Duration::from_secs(10)).await;

    // A call whose outcome is unknown, resolved by hand.
    let lost = executor
        .run(op(&other_args), |_| async {
            Err::<Receipt, _>(ToolError::unknown(format!(
                "the processor timed out ({why_unknown})"
            )))
        })
        .await;
    let lost_ref = lost.reference().expect("an answer with a reference");
    let completed = Outcome::Completed {
        response: serde_json::to_string(&Receipt {
            charge_id: resolved_charge.clone(),
        })
        .unwrap(),
        follow_ons: vec![FollowOn::new(JOB, &json!({"to": resolved_mail_to})).unwrap()],
    };
    let resolved = resolve_by_hand(
        &*store,
        TENANT,
        &lost_ref,
        &completed,
        &format!("alice: the dashboard shows it ({note})"),
    )
    .await
    .expect("resolved");
    assert_eq!(resolved.state.kind(), RecordStateKind::Completed);
    let replayed = executor
        .run(op(&other_args), charged(marker(), marker()))
        .await;
    assert!(
        matches!(&replayed, Answer::Replayed { value, .. } if value.charge_id == resolved_charge),
        "{replayed:?}"
    );

    // The status tool's reads, and the jobs delivered.
    let first_ref = first.reference().expect("an answer with a reference");
    let mut fingerprints = Vec::new();
    for reference in [first_ref, lost_ref] {
        let status = executor
            .status(&caller, &reference.to_string())
            .await
            .unwrap()
            .expect("the operation reads by its reference");
        assert_eq!(status.state, RecordStateKind::Completed);
        fingerprints.push(fingerprint(&*store, &reference).await);
    }
    let mailer = effects.clone();
    let handlers = FollowOnHandlers::new().on(
        JOB,
        follow_on_fn(move |job: FollowOnRun| {
            let mailer = mailer.clone();
            async move {
                mailer.mailed.lock().unwrap().push(job.payload);
                Ok(())
            }
        }),
    );
    let report = FollowOnDispatcher::round(&*store, &handlers, &FollowOnConfig::default())
        .await
        .unwrap();
    assert_eq!(report.leased, 2, "{report:?}");

    // What happened at the far side: one charge, two mails.
    assert_eq!(*effects.charges.lock().unwrap(), vec![charge.clone()]);
    let mailed = effects.mailed.lock().unwrap().join(" ");
    assert!(
        mailed.contains(&mail_to) && mailed.contains(&resolved_mail_to),
        "{mailed}"
    );

    let mut secrets: Vec<Secret> = [
        ("an argument", card),
        ("a response", charge),
        ("a job's payload", mail_to),
        ("another call's argument", other_card),
        ("a handler's unknown outcome", why_unknown),
        ("a resolution's response", resolved_charge),
        ("a resolution's note", note),
        ("a resolution's job's payload", resolved_mail_to),
    ]
    .into_iter()
    .map(|(what, text)| Secret {
        what,
        bytes: text.into_bytes(),
    })
    .collect();
    secrets.extend(fingerprints.into_iter().map(|bytes| Secret {
        what: "a fingerprint of the arguments",
        bytes,
    }));
    secrets
}

/// The fingerprint of the operation `reference` names, as the store keeps it.
async fn fingerprint(store: &dyn IdempotencyStore, reference: &Reference) -> Vec<u8> {
    let record = store.lookup(TENANT, reference).await.unwrap().unwrap();
    record.key.fingerprint().to_vec()
}

/// The records that carry any spelling of any secret, except those
/// `allowed` lets through.
fn leaks<'a>(
    records: &'a [Captured],
    secrets: &[Secret],
    allowed: impl Fn(&Captured) -> bool,
) -> Vec<(&'static str, &'a Captured)> {
    let spellings: Vec<(&'static str, String)> = secrets
        .iter()
        .flat_map(|s| s.spellings().into_iter().map(|t| (s.what, t)))
        .collect();
    records
        .iter()
        .filter(|r| !allowed(r))
        .filter_map(|r| {
            spellings
                .iter()
                .find(|(_, t)| r.text.contains(t.as_str()))
                .map(|(what, _)| (*what, r))
        })
        .collect()
}

fn assert_no_leaks(records: &[Captured], secrets: &[Secret]) {
    let found = leaks(records, secrets, |_| false);
    assert!(
        found.is_empty(),
        "{} log records carry {}; the first: {:#?}",
        found.len(),
        found[0].0,
        found[0].1
    );
}

/// Idem's own span of a call was captured, with its fields: the capture
/// saw the calls.
fn assert_saw_the_calls(records: &[Captured]) {
    assert!(
        records
            .iter()
            .any(|r| r.text.starts_with("span idem.call") && r.text.contains("tool=pay")),
        "no idem.call span was captured"
    );
}

#[test]
fn memory_logs_carry_no_arguments_or_responses() {
    let _turn = turn();
    let secrets = runtime().block_on(call_replay_resolve(Arc::new(MemoryStore::new())));
    let records = captured();
    assert_saw_the_calls(&records);
    assert_no_leaks(&records, &secrets);
}

#[test]
fn sqlite_logs_carry_no_arguments_or_responses() {
    let _turn = turn();
    let dir = durable::temp_dir("logs");
    let secrets = runtime().block_on(async {
        let store = SqliteStore::open(dir.join("idem.sqlite3")).await.unwrap();
        call_replay_resolve(Arc::new(store)).await
    });
    let records = captured();
    assert_saw_the_calls(&records);
    assert_no_leaks(&records, &secrets);
}

/// On a fresh schema at `url`, through `build`'s store.
fn postgres(url: &str, build: impl FnOnce(&str, &str) -> PostgresStore) -> Vec<Captured> {
    let rt = runtime();
    let schema = rt.block_on(durable::PgSchema::open(
        url,
        &format!("t_{:016x}", Attempt::random().get()),
    ));
    let store = build(url, &schema.name);
    let secrets = rt.block_on(call_replay_resolve(Arc::new(store)));
    drop(rt);
    drop(schema);
    let records = captured();
    assert_saw_the_calls(&records);
    assert_no_leaks(&records, &secrets);
    records
}

/// Named statements (`direct_connection`): tokio-postgres writes every
/// statement's parameters at DEBUG.
#[test]
fn postgres_direct_logs_carry_no_arguments_or_responses() {
    let _turn = turn();
    let Some(url) = durable::url_from(
        "IDEM_TEST_DIRECT_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    ) else {
        return;
    };
    let records = postgres(&url, |url, schema| {
        PostgresStore::builder(url)
            .unwrap()
            .schema(schema)
            .direct_connection(true)
            .build()
            .unwrap()
    });
    assert!(
        records.iter().any(|r| r.level == Level::DEBUG
            && r.target.starts_with("tokio_postgres")
            && r.text.contains("with parameters")
            && r.text.contains("<redacted ")),
        "tokio-postgres's statements with their (redacted) parameters were not captured"
    );
}

/// Unnamed statements, on the server itself.
#[test]
fn postgres_logs_carry_no_arguments_or_responses() {
    let _turn = turn();
    let Some(url) = durable::url_from(
        "IDEM_TEST_DIRECT_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    ) else {
        return;
    };
    let records = postgres(&url, |url, schema| {
        PostgresStore::builder(url)
            .unwrap()
            .schema(schema)
            .build()
            .unwrap()
    });
    assert!(
        records
            .iter()
            .any(|r| r.level == Level::TRACE && r.target.starts_with("tokio_postgres")),
        "tokio-postgres's TRACE records were not captured"
    );
}

/// Unnamed statements, through PgBouncer in transaction mode.
#[test]
fn postgres_through_pgbouncer_logs_carry_no_arguments_or_responses() {
    let _turn = turn();
    let Some(url) = durable::url_from(
        "IDEM_TEST_PGBOUNCER_URL",
        "postgres://postgres@127.0.0.1:6432/test",
    ) else {
        return;
    };
    postgres(&url, |url, schema| {
        PostgresStore::builder(url)
            .unwrap()
            .schema(schema)
            .build()
            .unwrap()
    });
}

#[test]
fn redis_logs_carry_no_arguments_or_responses() {
    let _turn = turn();
    let Some(url) = redis_server::redis_url() else {
        return;
    };
    let rt = runtime();
    let secrets = rt.block_on(async {
        let prefixed = redis_server::Prefixed::on(&url, Duration::from_secs(5));
        call_replay_resolve(Arc::new(prefixed.store.clone())).await
    });
    drop(rt);
    let records = captured();
    assert_saw_the_calls(&records);
    assert_no_leaks(&records, &secrets);
}

/// Everything but the SDK's orchestrator at TRACE, which writes the
/// responses it reads: docs/deploying.md says to keep it at DEBUG.
#[test]
fn dynamodb_logs_carry_no_arguments_or_responses_outside_the_sdks_bodies() {
    let _turn = turn();
    let Some(endpoint) = dynamodb_emulator::endpoint() else {
        return;
    };
    let rt = runtime();
    let secrets = rt.block_on(async {
        let table = dynamodb_emulator::Table::on(&endpoint).await;
        let secrets = call_replay_resolve(Arc::new(table.store.clone())).await;
        drop(table);
        secrets
    });
    drop(rt);
    let records = captured();
    assert_saw_the_calls(&records);
    let bodies = |r: &Captured| r.level == Level::TRACE && r.target.starts_with(SDK_BODIES);
    let found = leaks(&records, &secrets, bodies);
    assert!(
        found.is_empty(),
        "{} log records outside {SDK_BODIES} at TRACE carry {}; the first: {:#?}",
        found.len(),
        found[0].0,
        found[0].1
    );
    // The exception docs/deploying.md names is still needed: if the SDK
    // stopped writing bodies, drop it from there and from this test.
    let in_bodies = leaks(&records, &secrets, |r| !bodies(r));
    assert!(
        !in_bodies.is_empty(),
        "the AWS SDK no longer writes the responses it reads at TRACE under {SDK_BODIES}"
    );
}

/// The spellings find a value inside a longer text, however a driver
/// encodes it: base64 at each offset, hex, a `Debug` list of bytes.
#[test]
fn the_spellings_find_a_value_wherever_it_sits() {
    assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    let secret = Secret {
        what: "a response",
        bytes: marker().into_bytes(),
    };
    let spellings = secret.spellings();
    for offset in 0..3 {
        let mut blob = b"{\"rs\":\"".to_vec();
        blob.extend(std::iter::repeat_n(b'x', offset));
        blob.extend(&secret.bytes);
        blob.extend(b"\"}");
        for text in [
            base64(&blob),
            blob.iter().map(|b| format!("{b:02x}")).collect(),
            format!("{blob:?}"),
        ] {
            assert!(
                spellings.iter().any(|s| text.contains(s.as_str())),
                "{text}"
            );
        }
    }
}
