//! What the durable store tests share: fresh stores, keys, and the checks
//! specific to durable stores (the conformance suite covers the contract).
#![allow(dead_code)]

use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use idem_runtime::store::conformance::claim_request;
use idem_runtime::store::PauseHook;
use idem_runtime::{
    store::{Attempt, ClaimRequest},
    PostgresStore,
};

/// A claim of a fresh key in a fresh tenant with this lease and window
/// (retention = window).
pub fn request(lease: Duration, window: Duration) -> ClaimRequest {
    ClaimRequest {
        lease,
        window,
        retention: window,
        ..claim_request(window)
    }
}

/// A card processor stand-in: idempotent by the key it is given (the
/// operation's reference) for 24 h, counting every request it receives
/// and every charge it makes.
#[derive(Clone, Debug, Default)]
pub struct Processor {
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    charges:
        std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>>,
}

impl Processor {
    /// Charges once per key (for 24 h); a repeat of a key gets the same
    /// charge back.
    pub async fn charge(&self, key: String) -> Result<String, idem_runtime::ToolError> {
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut charges = self.charges.lock().unwrap();
        let day = Duration::from_secs(24 * 3600);
        charges.retain(|_, at| at.elapsed() < day);
        charges
            .entry(key.clone())
            .or_insert_with(std::time::Instant::now);
        Ok(format!("ch_{key}"))
    }

    /// How many requests reached it.
    pub fn requests(&self) -> usize {
        self.requests.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// How many charges it made.
    pub fn charges(&self) -> usize {
        self.charges.lock().unwrap().len()
    }
}

/// The arguments of [`charge`] for `card`.
fn charge_args(card: &str) -> serde_json::Value {
    serde_json::json!({"card": card, "amount_cents": 500})
}

/// The window of [`charge`].
const CHARGE_WINDOW: Duration = Duration::from_secs(900);

/// alice of acme charges 500 cents to `card` through `executor`, at
/// `processor`, keyed by the operation's reference.
pub async fn charge(
    executor: &idem_runtime::Executor,
    processor: &Processor,
    card: &str,
) -> idem_runtime::answer::Answer<String, idem_runtime::ToolError> {
    let caller = idem_runtime::Caller::new("acme", "alice");
    let args = charge_args(card);
    let op = idem_runtime::executor::Operation {
        caller: &caller,
        tool: "charge_card",
        args: &args,
        scope: idem_runtime::executor::ScopeSpec::Window(CHARGE_WINDOW),
        status_tool: "get_operation_status",
    };
    executor
        .run(op, |ctx| async move {
            processor.charge(ctx.reference().to_string()).await
        })
        .await
}

/// The key of [`charge`]'s operation for `card`.
pub fn charge_key(card: &str) -> idem_runtime::key::IdempotencyKey {
    idem_runtime::key::IdempotencyKey::derive(
        &idem_runtime::Caller::new("acme", "alice"),
        "charge_card",
        &charge_args(card),
        &idem_runtime::key::Scope::Window(CHARGE_WINDOW),
    )
    .unwrap()
}

/// A PostgreSQL connection of the test's own, beside the store's pool. When
/// `url` is PgBouncer's (`IDEM_TEST_PGBOUNCER_URL`'s host and port) and
/// `IDEM_TEST_DIRECT_DATABASE_URL` names the server behind it, it goes to
/// the server itself: tokio-postgres names the statements of its `query`
/// and `execute`, which a transaction pooler hands to whichever server
/// connection is free (the store is what must work behind one, and does).
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let mut config: tokio_postgres::Config = url
        .parse()
        .unwrap_or_else(|e| panic!("{url} is not a PostgreSQL URL: {e}"));
    let address = |c: &tokio_postgres::Config| (c.get_hosts().to_vec(), c.get_ports().to_vec());
    let parse = |var: &str| {
        std::env::var(var)
            .ok()
            .and_then(|u| u.parse::<tokio_postgres::Config>().ok())
    };
    if let (Some(pooler), Some(mut direct)) = (
        parse("IDEM_TEST_PGBOUNCER_URL"),
        parse("IDEM_TEST_DIRECT_DATABASE_URL"),
    ) {
        if address(&config) == address(&pooler) {
            // The server's address, this URL's database, user and password.
            if let Some(db) = config.get_dbname() {
                direct.dbname(db);
            }
            if let Some(user) = config.get_user() {
                direct.user(user);
            }
            if let Some(password) = config.get_password() {
                direct.password(password);
            }
            config = direct;
        }
    }
    let (client, conn) = config
        .connect(tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    tokio::spawn(conn);
    client
}

/// A fresh temporary directory, removed (with its files) when dropped.
#[derive(Debug)]
pub struct TempDir(std::path::PathBuf);

/// A fresh temporary directory for one test.
pub fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("idem-{name}-{:016x}", Attempt::random().get()));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

impl std::ops::Deref for TempDir {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The Postgres server the tests use, from `IDEM_TEST_DATABASE_URL`. `None`
/// (after saying so on stderr) when it is unset outside CI; under `CI=true` a
/// missing variable is a failure.
pub fn database_url() -> Option<String> {
    match std::env::var("IDEM_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").as_deref() == Ok("true") => panic!(
            "IDEM_TEST_DATABASE_URL is not set, and CI=true: the PostgresStore tests \
             need a server (e.g. postgres://postgres@127.0.0.1:5432/test)"
        ),
        _ => {
            // Straight to the process's stderr: the test harness captures
            // eprintln! of passing tests, and a skip must be seen.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: the PostgresStore tests did not run: IDEM_TEST_DATABASE_URL is \
                     not set. Set it to a server the tests may create schemas in, e.g. \
                     IDEM_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test"
                );
            });
            None
        }
    }
}

/// A second PostgreSQL URL the tests read from `var`, beside
/// `IDEM_TEST_DATABASE_URL`: `IDEM_TEST_DIRECT_DATABASE_URL` (the server
/// itself, for what only a direct connection keeps) or
/// `IDEM_TEST_PGBOUNCER_URL` (PgBouncer in transaction mode in front of it,
/// `scripts/pgbouncer`). `None` (said on stderr) when unset outside CI; a
/// failure under `CI=true`.
pub fn url_from(var: &str, example: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{var} is not set, and CI=true: set it (e.g. {var}={example})")
        }
        _ => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: a test did not run: {var} is not set (e.g. {var}={example})"
            );
            None
        }
    }
}

/// A PostgresStore in a fresh schema of its own, migrated; the schema is
/// dropped when this is dropped (also when the test panicked).
#[derive(Debug)]
pub struct PgSchema {
    pub store: PostgresStore,
    pub url: String,
    pub name: String,
}

impl PgSchema {
    /// `None` when the tests are skipped (see [`database_url`]).
    pub async fn new() -> Option<PgSchema> {
        let url = database_url()?;
        let name = format!("t_{:016x}", Attempt::random().get());
        Some(Self::open(&url, &name).await)
    }

    /// [`new`](Self::new), with `hook` asked at the store's pause points.
    pub async fn paused(hook: Option<PauseHook>) -> Option<PgSchema> {
        let url = database_url()?;
        let name = format!("t_{:016x}", Attempt::random().get());
        Some(Self::open_with(&url, &name, hook).await)
    }

    /// A store on an existing (or new) schema, migrated.
    pub async fn open(url: &str, name: &str) -> PgSchema {
        Self::open_with(url, name, None).await
    }

    async fn open_with(url: &str, name: &str, hook: Option<PauseHook>) -> PgSchema {
        let mut builder = PostgresStore::builder(url).unwrap().schema(name);
        if let Some(hook) = hook {
            builder = builder.pause_hook(hook);
        }
        let store = builder.build().unwrap();
        if let Err(e) = store.migrate().await {
            panic!("the Postgres server at IDEM_TEST_DATABASE_URL={url} is not usable: {e}");
        }
        PgSchema {
            store,
            url: url.into(),
            name: name.into(),
        }
    }
}

impl std::ops::Deref for PgSchema {
    type Target = PostgresStore;

    fn deref(&self) -> &PostgresStore {
        &self.store
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        // On a thread of its own: Drop may run inside a runtime, which must
        // not be blocked on, and also after a panic.
        let (url, name) = (self.url.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok((client, conn)) =
                    tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                {
                    tokio::spawn(conn);
                    let _ = client
                        .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE"))
                        .await;
                }
            });
        })
        .join();
    }
}

/// How the proxy treats traffic.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Link {
    /// Forwards both ways.
    Up,
    /// Accepts connections and holds them, silent: the server "hangs".
    Silent,
    /// Resets every connection.
    Down,
}

/// A TCP proxy to the Postgres server that a test can cut and restore,
/// without touching the shared server.
pub struct Proxy {
    /// The loopback port the proxy listens on.
    pub port: u16,
    link: watch::Sender<Link>,
}

impl Proxy {
    /// A proxy on a free loopback port, forwarding to `upstream`.
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (link, _) = watch::channel(Link::Up);
        let watcher = link.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(Self::serve(client, upstream.clone(), watcher.subscribe()));
            }
        });
        Proxy { port, link }
    }

    async fn serve(mut client: TcpStream, upstream: String, mut link: watch::Receiver<Link>) {
        loop {
            let now = *link.borrow_and_update();
            match now {
                Link::Down => return,
                // Hold the socket without a byte either way, until the link changes.
                Link::Silent => {
                    if link.changed().await.is_err() {
                        return;
                    }
                }
                Link::Up => break,
            }
        }
        let Ok(mut server) = TcpStream::connect(&upstream).await else {
            return;
        };
        let cut = tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => false,
            _ = link.wait_for(|l| *l != Link::Up) => true,
        };
        // Cut mid-connection: stop forwarding; Silent holds both sockets open
        // (a hung server) until the link changes, Down closes them.
        if cut {
            let _ = link.wait_for(|l| *l != Link::Silent).await;
        }
    }

    /// Changes how traffic is treated from now on, for open connections too.
    pub fn set(&self, link: Link) {
        self.link.send_replace(link);
    }
}

/// A record completed with a `send_receipt_<n>` job, as a store wrote it;
/// the caller then rewrites its rows to what a store wrote before
/// references had tags, and [`legacy_rows_still_work`] checks them.
pub async fn completed_with_a_job(
    store: &dyn idem_runtime::store::FollowOnStore,
) -> (ClaimRequest, String) {
    let req = request(Duration::from_secs(30), Duration::from_secs(900));
    let name = format!("send_receipt_{}", Attempt::random().get());
    store.claim(&req).await.unwrap();
    let job =
        idem_runtime::follow_ons::FollowOn::new(&name, &serde_json::json!({"to": "a@b"})).unwrap();
    store
        .complete_with_follow_ons(
            &req.key,
            req.attempt,
            "\"paid\"",
            idem_runtime::store::FollowOns::new(&[job]).unwrap(),
        )
        .await
        .unwrap();
    (req, name)
}

/// A record and a job written before references had tags keep their
/// 16-digit reference: a lookup by it finds the record, a repeat answers
/// with it, and the job keeps its downstream key and still runs.
pub async fn legacy_rows_still_work(
    store: &dyn idem_runtime::store::FollowOnStore,
    req: &ClaimRequest,
    name: &str,
) {
    use idem_runtime::{
        store::{Claim, FollowOnFilter},
        Reference,
    };
    let legacy = Reference::with_tag(&req.key, 0);
    let text = legacy.to_string();
    assert_eq!(text.len(), "idem_".len() + 16, "{text}");
    assert_eq!(Reference::parse(&text), Some(legacy));
    let record = store
        .lookup(&req.tenant, &legacy)
        .await
        .unwrap()
        .expect("the record is found by its old reference");
    assert_eq!(record.reference, legacy);
    match store
        .claim(&idem_runtime::store::conformance::new_operation(req))
        .await
        .unwrap()
    {
        Claim::Existing { record } => assert_eq!(record.reference, legacy),
        other => panic!("a repeat of a completed record claimed it: {other:?}"),
    }
    let jobs = store
        .list_follow_ons(&FollowOnFilter {
            tenant: Some(req.tenant.clone()),
            reference: Some(legacy),
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0].id.downstream_key(), format!("{text}:{name}"));
    let token = Attempt::random();
    let leased = store
        .lease_follow_ons(&[name], 10, Duration::from_secs(30), token)
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);
    assert_eq!(leased[0].id.reference, legacy);
    store.finish_follow_on(&leased[0].id, token).await.unwrap();
    // Delivered, and kept as long as its record, found by its old reference.
    let delivered = store
        .list_follow_ons(&FollowOnFilter {
            tenant: Some(req.tenant.clone()),
            states: vec![idem_runtime::store::FollowOnState::Delivered],
            ..FollowOnFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(delivered.len(), 1, "{delivered:?}");
    assert!(delivered[0].delivered_at.is_some());
    assert_eq!(delivered[0].kept_until, Some(record.expires_at));
}

/// A record as a store at migration 5 (before superseded operations) wrote
/// it: its claim, state code, body, and times in milliseconds from now.
pub struct OldRow {
    pub req: ClaimRequest,
    pub state: i16,
    pub body: Option<&'static str>,
    pub claimed_at: i64,
    pub lease_until: i64,
    pub expires_at: i64,
    pub retain_until: i64,
}

/// The operations written by a store at migration 5, one per case the
/// upgrade must handle.
pub struct OldRecords {
    /// COMPLETED, inside its window.
    pub on_time: ClaimRequest,
    /// UNKNOWN past its window, then completed late by that store's
    /// resolution, which moved its expires_at to its retain_until.
    pub extended: ClaimRequest,
    /// COMPLETED, its window over, its retention not.
    pub past_window: ClaimRequest,
    /// COMPLETED, its retention over: for the purge.
    pub expired: ClaimRequest,
}

/// The late completion's response of [`OldRecords::extended`].
pub const LATE: &str = "\"late\"";

impl OldRecords {
    /// Fresh operations, and the rows to write for them (`extended` as
    /// UNKNOWN: the caller then runs that store's own resolution on it).
    pub fn new() -> (OldRecords, Vec<OldRow>) {
        let req = || request(Duration::from_secs(30), Duration::from_secs(900));
        let old = OldRecords {
            on_time: req(),
            extended: req(),
            past_window: req(),
            expired: req(),
        };
        let row = |req: &ClaimRequest, state, body, times: [i64; 4]| OldRow {
            req: req.clone(),
            state,
            body,
            claimed_at: times[0],
            lease_until: times[1],
            expires_at: times[2],
            retain_until: times[3],
        };
        let rows = vec![
            row(
                &old.on_time,
                1,
                Some("\"on time\""),
                [-1_000, -900, 60_000, 60_000],
            ),
            row(
                &old.extended,
                2,
                Some("timeout"),
                [-5_000, -4_900, -4_000, 2_500],
            ),
            row(
                &old.past_window,
                1,
                Some("\"past\""),
                [-5_000, -4_900, -4_000, 60_000],
            ),
            row(
                &old.expired,
                1,
                Some("\"gone\""),
                [-5_000, -4_900, -4_000, -3_000],
            ),
        ];
        (old, rows)
    }
}

/// After the upgrade, records written before it: read as they were, the
/// late-completed one keeps its key until its retention ends (its window
/// cannot be told from a business key's), a record past its window is kept
/// as a superseded operation when a new one takes its key, the purge finds
/// what ended, and a fresh claim works.
pub async fn old_records_still_work(store: &dyn idem_runtime::IdempotencyStore, old: &OldRecords) {
    use idem_runtime::store::{conformance::new_operation, Claim, RecordState};
    let completed = |s: &str| RecordState::Completed { response: s.into() };
    let read = async |req: &ClaimRequest| store.lookup(&req.tenant, &req.reference).await.unwrap();

    let on_time = read(&old.on_time).await.expect("an old record reads");
    assert_eq!(on_time.state, completed("\"on time\""));
    match store.claim(&new_operation(&old.on_time)).await.unwrap() {
        Claim::Existing { record } => assert_eq!(record.reference, old.on_time.reference),
        other => panic!("a repeat inside the window claimed: {other:?}"),
    }

    let extended = read(&old.extended).await.expect("the late record reads");
    assert_eq!(extended.state, completed(LATE));
    assert_eq!(
        extended.expires_at, extended.retain_until,
        "moved by the old store"
    );
    match store.claim(&new_operation(&old.extended)).await.unwrap() {
        Claim::Existing { record } => assert_eq!(record.reference, old.extended.reference),
        other => panic!("an extended record holds its key until its retention: {other:?}"),
    }

    let later = new_operation(&old.past_window);
    assert_eq!(
        store.claim(&later).await.unwrap(),
        Claim::Claimed {
            reference: later.reference
        },
        "past its window: a new operation"
    );
    let kept = read(&old.past_window).await.expect("kept as superseded");
    assert_eq!(kept.state, completed("\"past\""));
    assert_eq!(read(&later).await.unwrap().attempt, later.attempt);

    assert!(store.purge_expired(100_000).await.unwrap() >= 1);
    assert_eq!(read(&old.expired).await, None, "purged at its retention");
    assert!(read(&old.on_time).await.is_some());

    let fresh = request(Duration::from_secs(30), Duration::from_secs(900));
    assert_eq!(
        store.claim(&fresh).await.unwrap(),
        Claim::Claimed {
            reference: fresh.reference
        }
    );

    // The extended record's retention ends: the key is free, and the old
    // operation is not kept (nothing is left to read).
    let end = extended.retain_until + Duration::from_millis(200);
    while std::time::SystemTime::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let after = new_operation(&old.extended);
    assert_eq!(
        store.claim(&after).await.unwrap(),
        Claim::Claimed {
            reference: after.reference
        }
    );
    assert_eq!(read(&old.extended).await, None);
}

/// Issue 33 through `Executor::run`, on `store`: a charge whose outcome was
/// unknown, then found completed by the reconciler inside its window,
/// replays inside the window; the same charge after the window runs as a
/// new operation (a second charge, its own reference), and the first
/// reference still reads as completed.
pub async fn late_truth_frees_the_key_through_the_executor(
    store: std::sync::Arc<dyn idem_runtime::IdempotencyStore>,
) {
    use idem_runtime::store::{RecordStateKind, Resolution};
    use idem_runtime::{
        answer::Answer,
        executor::{Operation, ScopeSpec},
        Caller, Executor, ToolError,
    };
    use std::sync::atomic::{AtomicUsize, Ordering};
    let exec = Executor::new(store.clone());
    let caller = Caller::new(format!("t{}", Attempt::random().get()), "alice");
    let args = serde_json::json!({"amount_cents": 500, "card": Attempt::random().get()});
    let charges = std::sync::Arc::new(AtomicUsize::new(0));
    let charge = |timeout: bool| {
        let charges = charges.clone();
        let op = Operation {
            caller: &caller,
            tool: "charge_card",
            args: &args,
            scope: ScopeSpec::Window(Duration::from_millis(400)),
            status_tool: "get_operation_status",
        };
        exec.run(op, move |_ctx| async move {
            let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
            if timeout {
                Err(ToolError::unknown("the processor timed out"))
            } else {
                Ok(format!("ch_{n}"))
            }
        })
    };
    let first = match charge(true).await {
        Answer::Failed { reference, .. } => reference,
        other => panic!("{other:?}"),
    };
    // The reconciler finds the charge made.
    let record = store.list_unknown(100).await.unwrap();
    let record = record
        .iter()
        .find(|r| r.reference == first)
        .expect("UNKNOWN");
    store
        .resolve(
            &record.key,
            record.attempt,
            Resolution::Completed {
                response: "\"ch_1\"",
            },
            None,
        )
        .await
        .unwrap();
    match charge(false).await {
        Answer::Replayed {
            value, reference, ..
        } => assert_eq!((value.as_str(), reference), ("ch_1", first)),
        other => panic!("inside the window: {other:?}"),
    }
    let end = record.expires_at + Duration::from_millis(150);
    while std::time::SystemTime::now() < end {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    match charge(false).await {
        Answer::Executed {
            value, reference, ..
        } => {
            assert_eq!(value, "ch_2", "the wanted second charge ran");
            assert_ne!(reference, first);
        }
        other => panic!("after the window, the same charge is a new operation: {other:?}"),
    }
    assert_eq!(charges.load(Ordering::SeqCst), 2);
    let status = exec
        .status(&caller, &first.to_string())
        .await
        .unwrap()
        .expect("the first reference still reads");
    assert_eq!(status.state, RecordStateKind::Completed);
}
