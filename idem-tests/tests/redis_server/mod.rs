//! What the Redis tests share: the shared server (`IDEM_TEST_REDIS_URL`),
//! stores under fresh key prefixes whose keys are deleted afterwards,
//! connected as the user docs/deploying.md gives a server, and
//! `redis-server` processes of the tests' own, on free loopback ports.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use idem_runtime::{store::Attempt, RedisStore};

/// Whether this run is CI's, where a missing service fails instead of skipping.
fn under_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Says once, on the process's stderr (the harness captures `eprintln!` of
/// passing tests, and a skip must be seen), that some tests did not run.
fn skipped(what: &str) {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        let _ = writeln!(std::io::stderr(), "SKIPPED: {what}");
    });
}

/// The shared Redis server, from `IDEM_TEST_REDIS_URL`. `None` (after
/// saying so on stderr) when it is unset outside CI; under `CI=true` a
/// missing variable is a failure.
pub fn redis_url() -> Option<String> {
    match std::env::var("IDEM_TEST_REDIS_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if under_ci() => panic!(
            "IDEM_TEST_REDIS_URL is not set, and CI=true: the RedisStore tests need a \
             server (e.g. redis://127.0.0.1:6379)"
        ),
        _ => {
            skipped(
                "the RedisStore tests on the shared server did not run: IDEM_TEST_REDIS_URL \
                 is not set. Set it to a server the tests may write keys to (they use keys \
                 of their own prefixes and delete them), e.g. \
                 IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379",
            );
            None
        }
    }
}

/// A fresh key prefix: parallel tests never see each other's records.
pub fn fresh_prefix() -> String {
    format!("t-{:016x}", Attempt::random().get())
}

/// A RedisStore under a fresh prefix on the shared server; the prefix's keys
/// are deleted when this is dropped (never the server's other keys).
#[derive(Debug)]
pub struct Prefixed {
    pub store: RedisStore,
    /// The server, as its administrator: for the tests' own commands.
    pub url: String,
    /// The server as the store's user: for the tests' other stores.
    pub store_url: String,
    pub prefix: String,
}

impl Prefixed {
    /// `None` when the tests are skipped (see [`redis_url`]). The store
    /// connects as the user docs/deploying.md gives every replica
    /// ([`serving_url`]).
    pub async fn new() -> Option<Prefixed> {
        let url = redis_url()?;
        let as_server = serving_url(&url).await;
        Some(Self::as_user(&url, &as_server, Duration::from_secs(5)))
    }

    /// A store under a fresh prefix on the server at `url`, as its
    /// administrator.
    pub fn on(url: &str, timeout: Duration) -> Prefixed {
        Self::as_user(url, url, timeout)
    }

    /// A store under a fresh prefix, connected to `store_url`, on the server
    /// whose administrator is at `url`.
    fn as_user(url: &str, store_url: &str, timeout: Duration) -> Prefixed {
        let prefix = fresh_prefix();
        let store = RedisStore::builder(store_url)
            .unwrap()
            .prefix(&prefix)
            .timeout(timeout)
            .build()
            .unwrap();
        Prefixed {
            store,
            url: url.into(),
            store_url: store_url.into(),
            prefix,
        }
    }
}

/// The rules docs/deploying.md gives the Redis user `user` in its
/// `ACL SETUSER user …` command: the words after the name, its continuation
/// lines joined.
pub fn documented_acl(user: &str) -> Vec<String> {
    let docs = include_str!("../../../docs/deploying.md");
    let start = format!("ACL SETUSER {user} ");
    let at = docs
        .find(&start)
        .unwrap_or_else(|| panic!("docs/deploying.md gives no `{start}…`"));
    let mut words = Vec::new();
    for line in docs[at + start.len()..].lines() {
        let (line, more) = match line.trim_end().strip_suffix('\\') {
            Some(line) => (line, true),
            None => (line, false),
        };
        words.extend(line.split_whitespace().map(str::to_owned));
        if !more {
            return words;
        }
    }
    words
}

/// The password of the tests' users.
const PASSWORD: &str = "idem-tests";

/// A user of the server at `url` (its administrator's) with exactly the
/// rules docs/deploying.md gives `user`, for the keys `keys` (where the
/// docs say `idem:*`, the default prefix's: the tests' prefixes are `t-*`),
/// or for none when the docs name none: the server's URL as that user.
/// Named after its rules, so that processes sharing a server and the same
/// docs share the user and set it alike.
pub async fn documented_user(url: &str, user: &str, keys: &str) -> String {
    use sha2::Digest;
    let rules: Vec<String> = documented_acl(user)
        .into_iter()
        .map(|word| match word.as_str() {
            "~idem:*" => format!("~{keys}"),
            ">PASSWORD" => format!(">{PASSWORD}"),
            _ => word,
        })
        .collect();
    assert!(
        rules.first().is_some_and(|w| w == "reset"),
        "{user}'s documented rules start from `reset`: {rules:?}"
    );
    let digest = sha2::Sha256::digest(rules.join(" ").as_bytes());
    let name = format!(
        "{user}-{}",
        digest[..4]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    let _: () = command(url, redis::cmd("ACL").arg("SETUSER").arg(&name).arg(&rules)).await;
    let host = url.trim_start_matches("redis://");
    let host = host.rsplit_once('@').map_or(host, |(_, host)| host);
    format!("redis://{name}:{PASSWORD}@{host}")
}

/// The shared server at `url` as the user docs/deploying.md gives every
/// replica (`idem-server`), with this version's library loaded by the
/// administrator (that user may not load it): set up once per process.
pub async fn serving_url(url: &str) -> String {
    static SERVING: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    SERVING
        .get_or_init(|| async {
            let as_server = documented_user(url, "idem-server", "t-*").await;
            RedisStore::builder(url)
                .unwrap()
                .build()
                .unwrap()
                .load_library()
                .await
                .expect("the administrator loads the library");
            as_server
        })
        .await
        .clone()
}

impl std::ops::Deref for Prefixed {
    type Target = RedisStore;

    fn deref(&self) -> &RedisStore {
        &self.store
    }
}

impl Drop for Prefixed {
    fn drop(&mut self) {
        // On a thread of its own: Drop may run inside a runtime, and after a
        // panic.
        let (url, pattern) = (self.url.clone(), format!("{}:*", self.prefix));
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let Ok(mut conn) = connect(&url).await else {
                    return;
                };
                let mut cursor = 0u64;
                loop {
                    let Ok((next, keys)): redis::RedisResult<(u64, Vec<Vec<u8>>)> =
                        redis::cmd("SCAN")
                            .arg(cursor)
                            .arg("MATCH")
                            .arg(&pattern)
                            .arg("COUNT")
                            .arg(1000)
                            .query_async(&mut conn)
                            .await
                    else {
                        return;
                    };
                    if !keys.is_empty() {
                        let _: redis::RedisResult<i64> =
                            redis::cmd("UNLINK").arg(&keys).query_async(&mut conn).await;
                    }
                    if next == 0 {
                        return;
                    }
                    cursor = next;
                }
            });
        })
        .join();
    }
}

/// A connection of the test's own, beside the store's.
pub async fn connect(url: &str) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
    redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await
}

/// Runs one command on a connection of its own.
pub async fn command<T: redis::FromRedisValue>(url: &str, cmd: &redis::Cmd) -> T {
    let mut conn = connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to {url}: {e}"));
    cmd.query_async(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}

/// Whether `redis-server` can be started here. `None` (after saying so)
/// when it is not installed outside CI; under `CI=true` that is a failure.
pub fn redis_server_installed() -> Option<()> {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some(());
    }
    if under_ci() {
        panic!("redis-server is not installed, and CI=true: the Redis fault and Cluster tests start servers of their own");
    }
    skipped(
        "the Redis fault and Cluster tests did not run: redis-server is not installed \
         (apt-get install redis-server)",
    );
    None
}

/// A loopback port nothing listens on (nor on `port + offset`, for a Cluster
/// node's bus).
pub fn free_port(offset: u16) -> u16 {
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let bus_free = offset == 0
            || port
                .checked_add(offset)
                .is_some_and(|bus| TcpListener::bind(("127.0.0.1", bus)).is_ok());
        if bus_free {
            return port;
        }
    }
}

/// A `redis-server` of the test's own, in a temporary directory, killed when
/// dropped.
#[derive(Debug)]
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    dir: crate::durable::TempDir,
    args: Vec<String>,
}

impl Server {
    /// Starts a server on a free port with `args` after the defaults (no
    /// snapshots, no AOF), and waits until it answers. `None` when
    /// redis-server is not installed (see [`redis_server_installed`]).
    pub fn start(args: &[&str]) -> Option<Server> {
        Self::start_on(free_port(0), args)
    }

    /// [`Server::start`] on `port`.
    pub fn start_on(port: u16, args: &[&str]) -> Option<Server> {
        redis_server_installed()?;
        let mut server = Server {
            child: None,
            port,
            dir: crate::durable::temp_dir("redis"),
            args: args.iter().map(|a| a.to_string()).collect(),
        };
        server.spawn();
        Some(server)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        let log = self.dir.join("redis.log");
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&*self.dir)
            .arg("--logfile")
            .arg(&log)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let started = Instant::now();
        while !self.answers() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server on port {port} did not answer within 10 s; its log: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the server answers PING (and is done loading its data).
    pub fn answers(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let mut reply = [0u8; 5];
        s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut reply).is_ok() && &reply == b"+PONG"
    }

    /// Kills the server (SIGKILL: no shutdown, no last save).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again, on the same port and directory.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
