//! What the DynamoDB tests share: the emulator (`IDEM_TEST_DYNAMODB_ENDPOINT`)
//! and the lagging proxy in front of it (`IDEM_TEST_DYNAMODB_LAGGING_ENDPOINT`,
//! `scripts/dynamodb-lagging-proxy.py`: its indexes and eventually
//! consistent reads trail the writes, as DynamoDB's do), a client for
//! them, and stores on fresh tables deleted afterwards.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::time::Duration;

use idem_runtime::{store::Attempt, DynamoDbStore};

/// Whether this run is CI's, where a missing emulator fails instead of
/// skipping.
fn under_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// The emulator's endpoint, from `IDEM_TEST_DYNAMODB_ENDPOINT`. `None`
/// (after saying so on stderr, once) when it is unset outside CI; under
/// `CI=true` a missing variable is a failure.
pub fn endpoint() -> Option<String> {
    match std::env::var("IDEM_TEST_DYNAMODB_ENDPOINT") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if under_ci() => panic!(
            "IDEM_TEST_DYNAMODB_ENDPOINT is not set, and CI=true: the DynamoDbStore tests need \
             an emulator (scripts/dynamodb-emulator start, then \
             IDEM_TEST_DYNAMODB_ENDPOINT=http://127.0.0.1:4567)"
        ),
        _ => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED: the DynamoDbStore tests did not run: IDEM_TEST_DYNAMODB_ENDPOINT is \
                     not set. Start the emulator with scripts/dynamodb-emulator start and set \
                     IDEM_TEST_DYNAMODB_ENDPOINT=http://127.0.0.1:4567 (scripts/test does both \
                     when the emulator answers)"
                );
            });
            None
        }
    }
}

/// The lagging proxy's endpoint, from
/// `IDEM_TEST_DYNAMODB_LAGGING_ENDPOINT`. `None` (after saying so on
/// stderr, once) when it is unset outside CI; under `CI=true` a missing
/// variable is a failure.
pub fn lagging_endpoint() -> Option<String> {
    match std::env::var("IDEM_TEST_DYNAMODB_LAGGING_ENDPOINT") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if under_ci() => panic!(
            "IDEM_TEST_DYNAMODB_LAGGING_ENDPOINT is not set, and CI=true: the DynamoDbStore tests \
             run through the lagging proxy (scripts/dynamodb-emulator start starts it, then \
             IDEM_TEST_DYNAMODB_LAGGING_ENDPOINT=$(scripts/dynamodb-emulator lagging-url))"
        ),
        _ => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                let _ = writeln!(
                    std::io::stderr(),
                    "NOTE: IDEM_TEST_DYNAMODB_LAGGING_ENDPOINT is not set: the DynamoDbStore tests \
                     run on the emulator itself, whose indexes never lag, and the tests of a \
                     lagging index are skipped. scripts/dynamodb-emulator start starts the \
                     lagging proxy; scripts/dynamodb-emulator lagging-url prints its endpoint \
                     (scripts/test sets it when the proxy answers)"
                );
            });
            None
        }
    }
}

/// How the lagging proxy delays one table's writes, as its lag specs
/// (scripts/dynamodb-lagging-proxy.py: `[MIN_MS..]MAX_MS[,TAIL_P,TAIL_MAX_MS]`):
/// when a write reaches the indexes, and how far behind an eventually
/// consistent read is; `None` keeps the proxy's own. `exact` names the
/// indexes that show every write at once.
#[derive(Clone, Debug)]
pub struct Lag {
    pub index: Option<String>,
    pub read: Option<String>,
    pub exact: &'static [&'static str],
}

impl Lag {
    /// Every index and every eventually consistent read lags, as the
    /// simulation has them: an index up to 200 ms behind, and one write in
    /// seven up to 440 ms, under the simulation's 450 ms lease (so a claim
    /// shows in `leases` before its lease ends); a read up to 100 ms
    /// behind, and one in ten up to 1 s, past the lease.
    pub fn simulation() -> Lag {
        Lag {
            index: Some("200,0.15,440".into()),
            read: Some("100,0.1,1000".into()),
            exact: &[],
        }
    }

    /// The conformance cases' (and every test's on [`Table::new`]): the
    /// sweep's index, `leases`, up to 100 ms behind; the other indexes and
    /// every read exact. The cases wait no longer than that before they
    /// list a lapsed claim, and they assert on what they list right after
    /// they wrote it (a record just marked is no longer lapsed, one just
    /// made due is listed), which DynamoDB's eventually consistent indexes
    /// and reads do not promise: the store acts on what it lists with
    /// conditional writes, and the simulation lags them all.
    pub fn cases() -> Lag {
        Lag {
            index: Some("100".into()),
            read: Some("0".into()),
            exact: &["unknown", "expiry", "due"],
        }
    }

    /// Fixed delays: every write reaches the indexes `index_ms` late, and
    /// every eventually consistent read sees the table as it stood
    /// `read_ms` ago.
    pub fn fixed(index_ms: u64, read_ms: u64) -> Lag {
        Lag {
            index: Some(format!("{index_ms}..{index_ms}")),
            read: Some(format!("{read_ms}..{read_ms}")),
            exact: &[],
        }
    }
}

/// Sets `table`'s lag at the lagging proxy at `proxy`.
pub fn set_lag(proxy: &str, table: &str, lag: &Lag) {
    let mut body = format!("{{\"table\": \"{table}\", \"exact\": {:?}", lag.exact);
    for (name, spec) in [("index", &lag.index), ("read", &lag.read)] {
        if let Some(spec) = spec {
            body += &format!(", \"{name}\": \"{spec}\"");
        }
    }
    body += "}";
    let host = proxy.trim_start_matches("http://").trim_end_matches('/');
    let mut conn = std::net::TcpStream::connect(host).expect("the lagging proxy answers");
    write!(
        conn,
        "POST /__lag HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send the lag");
    let mut reply = String::new();
    conn.read_to_string(&mut reply).expect("the proxy's answer");
    assert!(
        reply.starts_with("HTTP/1.1 200") || reply.starts_with("HTTP/1.0 200"),
        "the lagging proxy refused {body}: {reply}"
    );
}

/// A client for the emulator at `endpoint`: test credentials, plain HTTP,
/// short timeouts.
pub fn client(endpoint: &str) -> aws_sdk_dynamodb::Client {
    use aws_sdk_dynamodb::config::{timeout::TimeoutConfig, BehaviorVersion, Credentials, Region};
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("testing", "testing", None, None, "tests"))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .timeout_config(
            TimeoutConfig::builder()
                .operation_attempt_timeout(Duration::from_secs(10))
                .build(),
        )
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
}

/// A fresh table name: parallel tests never see each other's records.
pub fn fresh_table() -> String {
    format!("idem-t-{:016x}", Attempt::random().get())
}

/// A DynamoDbStore on a fresh table of the emulator, deleted when this is
/// dropped.
#[derive(Debug)]
pub struct Table {
    pub store: DynamoDbStore,
    pub endpoint: String,
}

impl Table {
    /// A store on a fresh table behind the lagging proxy, lagging as the
    /// conformance cases allow ([`Lag::cases`]); on the emulator itself
    /// when the proxy is not set (outside CI). `None` when the tests are
    /// skipped (see [`endpoint`]).
    pub async fn new() -> Option<Table> {
        Self::lagging(Lag::cases()).await
    }

    /// A store on a fresh table behind the lagging proxy, lagging as
    /// `lag` says; on the emulator itself when the proxy is not set
    /// (outside CI).
    pub async fn lagging(lag: Lag) -> Option<Table> {
        match lagging_endpoint() {
            Some(proxy) => {
                let table = Self::on(&proxy).await;
                set_lag(&proxy, table.table(), &lag);
                Some(table)
            }
            None => Some(Self::on(&endpoint()?).await),
        }
    }

    /// A store on a fresh table at `endpoint`, created.
    pub async fn on(endpoint: &str) -> Table {
        let store = DynamoDbStore::builder(client(endpoint), fresh_table())
            .build()
            .unwrap();
        store.create_table().await.expect("create the table");
        Table {
            store,
            endpoint: endpoint.to_owned(),
        }
    }
}

impl std::ops::Deref for Table {
    type Target = DynamoDbStore;
    fn deref(&self) -> &DynamoDbStore {
        &self.store
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        // The table goes with the test, on a thread of its own: drop may
        // run inside a runtime, which cannot block on another. With a
        // client of its own: the store's keeps connections that the
        // runtime blocked here drives (a current-thread test's), and the
        // delete would wait on one of them until its timeout.
        let (endpoint, table) = (self.endpoint.clone(), self.store.table().to_owned());
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                let delete = client(&endpoint).delete_table().table_name(table).send();
                let _ = rt
                    .block_on(async { tokio::time::timeout(Duration::from_secs(5), delete).await });
            }
        })
        .join();
    }
}

/// What the sweep's walk said held its cursor, from its debug lines:
/// entries whose record read at another lease than the entry's (the index
/// lags the table) and entries whose record did not read at all (the read
/// lags the index).
#[derive(Clone, Debug, Default)]
pub struct WalkHolds(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl Write for WalkHolds {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl WalkHolds {
    /// A subscriber that writes the walk's debug lines here, and nothing else.
    fn subscriber(&self) -> impl tracing_subscriber::util::SubscriberInitExt {
        let lines = self.clone();
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(
                "idem_runtime::store::dynamodb::walk=debug",
            ))
            .with_writer(move || lines.clone())
            .with_ansi(false)
            .without_time()
            .finish()
    }

    /// Runs `test` on a runtime of this thread's, counting what the walk
    /// says here.
    pub fn run<F: std::future::Future>(&self, test: F) -> F::Output {
        use tracing_subscriber::util::SubscriberInitExt;
        let _counted = self.subscriber().set_default();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
            .block_on(test)
    }

    /// Counts what the walk says anywhere in this process from now on
    /// (the first one installed wins; `false` when another was).
    pub fn install(&self) -> bool {
        use tracing_subscriber::util::SubscriberInitExt;
        self.subscriber().try_init().is_ok()
    }

    /// (entries read at another lease, entries not read) so far.
    pub fn counts(&self) -> (usize, usize) {
        let lines = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let field = |line: &str, name: &str| -> usize {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
                .unwrap_or(0)
        };
        String::from_utf8_lossy(&lines)
            .lines()
            .filter(|l| l.contains("holds its cursor"))
            .fold((0, 0), |(other, unread), l| {
                (other + field(l, "other_lease"), unread + field(l, "unread"))
            })
    }
}
