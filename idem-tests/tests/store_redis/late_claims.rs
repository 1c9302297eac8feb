//! A claim the server applies after the store gave up on it: the call was
//! told nothing ran, so the executor must retract the claim when it lands,
//! and a repeat that meets it before is told to come back within two
//! leases of the first call, never that its outcome is unknown.
//!
//! On one connection Redis runs commands in the order they came, so a
//! release sent after a claim always finds it (a `CLIENT PAUSE` holds
//! both, and the release still runs second). A claim lands after its
//! releases when its connection is lost while the claim is still on its way
//! or in the server's buffer, and the store reconnects: the releases go on
//! the new connection, the claim arrives on the old one. A proxy between
//! the store and a server of the test's own does exactly that: it holds the
//! claim's bytes past the store's timeout, closes the store's side of the
//! connection, and sends the claim to the server later.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::store::{RecordFilter, RecordStateKind};
use idem_runtime::{answer::Answer, Executor, IdempotencyStore, RedisStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::charge;
use crate::redis_server::Server;

/// A TCP proxy in front of a Redis server that passes every byte, except
/// the next claim (an `FCALL` of the library's `claim` function) once
/// armed: it holds it, closes the client's side of its connection
/// `reset_after` later, and sends it to the server `land_after` after it
/// came, reporting the server's reply.
struct ClaimHold {
    url: String,
    armed: Arc<AtomicBool>,
    landed: watch::Receiver<Option<Vec<u8>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ClaimHold {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ClaimHold {
    async fn start(upstream: u16, reset_after: Duration, land_after: Duration) -> ClaimHold {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("redis://{}", listener.local_addr().unwrap());
        let armed = Arc::new(AtomicBool::new(false));
        let (tell, landed) = watch::channel(None);
        let tell = Arc::new(tell);
        let arms = armed.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let (armed, tell) = (arms.clone(), tell.clone());
                tokio::spawn(async move {
                    let server = TcpStream::connect(("127.0.0.1", upstream)).await.unwrap();
                    let _ = relay(client, server, &armed, reset_after, land_after, &tell).await;
                });
            }
        });
        ClaimHold {
            url,
            armed,
            landed,
            task,
        }
    }

    /// Holds the next claim.
    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// The server's reply to the held claim, once it has landed.
    async fn landed(&self, timeout: Duration) -> Vec<u8> {
        let mut landed = self.landed.clone();
        let reply = tokio::time::timeout(timeout, landed.wait_for(Option::is_some))
            .await
            .expect("the held claim is sent in time")
            .unwrap();
        reply.clone().unwrap()
    }
}

/// One client connection, relayed to `server` until either side closes.
async fn relay(
    client: TcpStream,
    server: TcpStream,
    armed: &AtomicBool,
    reset_after: Duration,
    land_after: Duration,
    tell: &watch::Sender<Option<Vec<u8>>>,
) -> std::io::Result<()> {
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    // The server's replies go back until the relay is told to stop; then
    // the reading half is handed back, for the held claim's reply.
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let back = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            tokio::select! {
                _ = &mut stopped => return Some(from_server),
                read = from_server.read(&mut buf) => match read {
                    Ok(0) | Err(_) => return None,
                    Ok(n) => {
                        if to_client.write_all(&buf[..n]).await.is_err() {
                            return None;
                        }
                    }
                },
            }
        }
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from_client.read(&mut buf).await?;
        if n == 0 {
            back.abort();
            return Ok(());
        }
        let chunk = &buf[..n];
        let is_claim = chunk.windows(8).any(|w| w == b"_claim\r\n");
        if !(is_claim && armed.swap(false, Ordering::SeqCst)) {
            to_server.write_all(chunk).await?;
            continue;
        }
        // The claim is on its way: the client gives up on it (its
        // timeout), its connection is lost, and the server gets the claim
        // only later, alone on this connection.
        let held = chunk.to_vec();
        tokio::time::sleep(reset_after).await;
        let _ = stop.send(());
        let from_server = back.await.ok().flatten();
        // Both halves of the client's side gone: its connection is lost.
        drop(from_client);
        tokio::time::sleep(land_after.saturating_sub(reset_after)).await;
        to_server.write_all(&held).await?;
        let Some(mut from_server) = from_server else {
            return Ok(());
        };
        let mut reply = vec![0u8; 1024];
        let n = from_server.read(&mut reply).await?;
        tell.send_replace(Some(reply[..n].to_vec()));
        return Ok(());
    }
}

/// The claim of the first call lands 2 s after it was sent, after the store
/// (timeout 500 ms) gave up on it at 0.5 s and lost its connection at 0.7 s;
/// the lease is 4 s. The first call is told nothing ran; from the landing
/// on, every repeat is told the operation is in progress, with a
/// retry-after that ends within two leases of the first call's send, until
/// the executor's watch has retracted the orphan and a repeat runs the
/// charge: once. At the end the store holds that charge's record and no
/// other, and nothing reads UNKNOWN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_lands_after_its_caller_gave_up_is_retracted() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let lease = Duration::from_secs(4);
    let proxy = ClaimHold::start(
        server.port,
        Duration::from_millis(700),
        Duration::from_millis(2_000),
    )
    .await;
    let store = RedisStore::builder(&proxy.url)
        .unwrap()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let store: Arc<dyn IdempotencyStore> = Arc::new(store);
    let executor = Executor::new(store.clone()).with_lease(lease);
    let runs = AtomicUsize::new(0);
    // The library is loaded, and the connection open, before the claim.
    assert!(store
        .find_by_reference(&idem_runtime::Reference::new_operation(
            &idem_runtime::store::conformance::claim_request(lease).key
        ))
        .await
        .unwrap()
        .is_empty());

    proxy.arm();
    let sent = tokio::time::Instant::now();
    let first = charge(&executor, 1999, &runs).await;
    assert_eq!(first.name(), "store_unavailable", "{first:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    let reply = proxy.landed(Duration::from_secs(5)).await;
    assert!(
        reply.starts_with(b"*2\r\n:5\r\n"),
        "the held claim was applied: {:?}",
        String::from_utf8_lossy(&reply)
    );
    let landed = tokio::time::Instant::now();
    assert!(
        landed - sent >= Duration::from_millis(1_900),
        "{:?}",
        landed - sent
    );

    let executed = repeats_until_executed(&executor, &runs, sent, lease).await;
    only_record(&*store, executed, sent + lease).await;
}

/// Repeats the charge until it runs: every answer before is "in progress",
/// with a retry-after that ends within two leases of `sent` (the first
/// call's); the charge runs once. The reference it ran under.
async fn repeats_until_executed(
    executor: &Executor,
    runs: &AtomicUsize,
    sent: tokio::time::Instant,
    lease: Duration,
) -> idem_runtime::Reference {
    let bound = sent + lease * 2;
    loop {
        let answer = charge(executor, 1999, runs).await;
        let now = tokio::time::Instant::now();
        match answer {
            Answer::Executed { reference, .. } => {
                assert!(now <= bound, "ran {:?} after the first call", now - sent);
                assert_eq!(runs.load(Ordering::SeqCst), 1, "charged once");
                return reference;
            }
            Answer::InProgress { retry_after, .. } => {
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
    }
}

/// Once the unconfirmed claim's watch has ended (`watched`): the store holds
/// the charge's record (`executed`), COMPLETED, and no other.
async fn only_record(
    store: &dyn IdempotencyStore,
    executed: idem_runtime::Reference,
    watched: tokio::time::Instant,
) {
    tokio::time::sleep_until(watched + Duration::from_millis(500)).await;
    let records = store
        .list_records(&RecordFilter {
            limit: 100,
            ..RecordFilter::default()
        })
        .await
        .unwrap();
    let seen: Vec<_> = records
        .iter()
        .map(|r| (r.reference, r.state.kind()))
        .collect();
    assert_eq!(seen, [(executed, RecordStateKind::Completed)]);
}

/// The same late claim without a lost connection: `CLIENT PAUSE WRITE`
/// holds the claim on the server for 2 s, past the store's 500 ms timeout,
/// and it lands when the pause ends. The releases the executor sent after
/// it on the same connection were held too, and run after it, in order: the
/// orphan is deleted as it lands, and the retry runs the charge once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_held_by_a_paused_server_is_released_after_it_lands() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let lease = Duration::from_secs(4);
    let store = RedisStore::builder(&server.url())
        .unwrap()
        .timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let store: Arc<dyn IdempotencyStore> = Arc::new(store);
    let executor = Executor::new(store.clone()).with_lease(lease);
    let runs = AtomicUsize::new(0);
    assert_eq!(charge(&executor, 5, &runs).await.name(), "executed");
    runs.store(0, Ordering::SeqCst);
    let before = crate::by_reference::commandstats(&server.url()).await;

    let _: () = crate::redis_server::command(
        &server.url(),
        redis::cmd("CLIENT").arg("PAUSE").arg(2_000).arg("WRITE"),
    )
    .await;
    let sent = tokio::time::Instant::now();
    let first = charge(&executor, 1999, &runs).await;
    assert_eq!(first.name(), "store_unavailable", "{first:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran");
    tokio::time::sleep_until(sent + Duration::from_millis(2_100)).await;
    let executed = repeats_until_executed(&executor, &runs, sent, lease).await;
    only_two_records(&*store, executed, sent + lease).await;
    // The paused claim ran (a SET of its record), and so did releases.
    let after = crate::by_reference::commandstats(&server.url()).await;
    let ran = crate::by_reference::ran(&before, &after);
    assert!(ran.get("set").is_some_and(|n| *n >= 3), "{ran:?}");
    assert!(ran.get("del").is_some_and(|n| *n >= 1), "{ran:?}");
}

/// [`only_record`], beside the first charge of 5 cents.
async fn only_two_records(
    store: &dyn IdempotencyStore,
    executed: idem_runtime::Reference,
    watched: tokio::time::Instant,
) {
    tokio::time::sleep_until(watched + Duration::from_millis(500)).await;
    let records = store
        .list_records(&RecordFilter {
            limit: 100,
            ..RecordFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(records.len(), 2, "{records:?}");
    assert!(records
        .iter()
        .all(|r| r.state.kind() == RecordStateKind::Completed));
    assert!(records.iter().any(|r| r.reference == executed));
}
