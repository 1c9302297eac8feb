//! How a statement reaches the server: unnamed by default, so that nothing
//! outlives the statement's own transaction and the store works behind a
//! transaction pooler (PgBouncer in transaction mode, the poolers of
//! Supabase, Neon, Heroku and Azure), or named and cached per connection
//! ([`PostgresStoreBuilder::direct_connection`](super::PostgresStoreBuilder::direct_connection)),
//! for a direct connection; and how a statement that did not answer in
//! time is cancelled on the server ([`bounded`]).
//!
//! An unnamed statement is Parse, Bind, Describe, Execute and Sync in one
//! message: one round trip, as a cached named statement's Bind and Execute
//! are, with the server parsing and planning it each time. A named
//! statement lives on one server connection, and a transaction pooler hands
//! the next transaction another one (`prepared statement "s71" does not
//! exist`, or another client's `"s15" already exists`).
//!
//! An unnamed statement carries its parameters' types: each parameter gives
//! its own ([`Param`]), from its Rust type, as the named statement's
//! prepare would have found them.
//!
//! tokio-postgres logs a named statement's parameters at DEBUG level, each
//! by its `Debug`: a parameter that carries what a call brought or left
//! goes in a [`Redacted`], which logs its size alone.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use deadpool_postgres::Object;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio_postgres::config::Host;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::types::{Format, IsNull, ToSql, Type};
use tokio_postgres::{CancelToken, Config, Error, NoTls, Row, Socket};

/// A statement's parameter: a value and its PostgreSQL type.
pub(super) trait Param: ToSql + Sync {
    /// The type the statement is parsed with for this parameter.
    fn pg_type(&self) -> Type;
}

/// The PostgreSQL type of a Rust type the store binds.
trait PgType {
    const TYPE: Type;
}

macro_rules! pg_types {
    ($($rust:ty => $pg:ident,)*) => {
        $(impl PgType for $rust {
            const TYPE: Type = Type::$pg;
        })*
    };
}

pg_types! {
    bool => BOOL,
    i16 => INT2,
    i32 => INT4,
    i64 => INT8,
    String => TEXT,
    &str => TEXT,
    Vec<u8> => BYTEA,
    &[u8] => BYTEA,
    Vec<&str> => TEXT_ARRAY,
    &[&str] => TEXT_ARRAY,
    Vec<&[u8]> => BYTEA_ARRAY,
    Vec<i64> => INT8_ARRAY,
    std::time::SystemTime => TIMESTAMPTZ,
}

impl<T: PgType> PgType for Option<T> {
    const TYPE: Type = T::TYPE;
}

impl<T: PgType + ToSql + Sync> Param for T {
    fn pg_type(&self) -> Type {
        T::TYPE
    }
}

/// A parameter that carries what a call brought or left (a response, a
/// note, the fingerprint of its arguments, a job's payload or error): bound
/// as its value, and shown by `Debug` as `<redacted N bytes>`, so that no
/// log of the driver's carries it. It holds the value as the statement
/// would (a slice, mostly): nothing is copied.
pub(super) struct Redacted<T>(pub(super) T);

impl<T: Size> fmt::Debug for Redacted<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<redacted {} bytes>", self.0.size())
    }
}

impl<T: ToSql + Size> ToSql for Redacted<T> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        self.0.to_sql(ty, out)
    }

    fn accepts(ty: &Type) -> bool {
        T::accepts(ty)
    }

    fn to_sql_checked(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        self.0.to_sql_checked(ty, out)
    }

    fn encode_format(&self, ty: &Type) -> Format {
        self.0.encode_format(ty)
    }
}

impl<T: PgType> PgType for Redacted<T> {
    const TYPE: Type = T::TYPE;
}

/// How many bytes a redacted value holds: all its `Debug` shows.
pub(super) trait Size {
    fn size(&self) -> usize;
}

impl Size for &[u8] {
    fn size(&self) -> usize {
        self.len()
    }
}

impl Size for &str {
    fn size(&self) -> usize {
        self.len()
    }
}

impl<T: Size> Size for Option<T> {
    fn size(&self) -> usize {
        self.as_ref().map_or(0, Size::size)
    }
}

impl<T: Size> Size for Vec<T> {
    fn size(&self) -> usize {
        self.iter().map(Size::size).sum()
    }
}

/// A pooled connection and how it sends statements.
pub(super) struct Db<'a> {
    client: &'a Object,
    named: bool,
}

impl<'a> Db<'a> {
    pub(super) fn new(client: &'a Object, named: bool) -> Self {
        Db { client, named }
    }

    /// Every row `sql` returns.
    pub(super) async fn query(&self, sql: &str, params: &[&dyn Param]) -> Result<Vec<Row>, Error> {
        if self.named {
            let stmt = self.client.prepare_cached(sql).await?;
            return self.client.query(&stmt, &untyped(params)).await;
        }
        self.client.query_typed(sql, &typed(params)).await
    }

    /// The one row `sql` returns, if any (more than one is an error).
    pub(super) async fn query_opt(
        &self,
        sql: &str,
        params: &[&dyn Param],
    ) -> Result<Option<Row>, Error> {
        if self.named {
            let stmt = self.client.prepare_cached(sql).await?;
            return self.client.query_opt(&stmt, &untyped(params)).await;
        }
        self.client.query_typed_opt(sql, &typed(params)).await
    }

    /// The one row `sql` returns (none, or more than one, is an error).
    pub(super) async fn query_one(&self, sql: &str, params: &[&dyn Param]) -> Result<Row, Error> {
        if self.named {
            let stmt = self.client.prepare_cached(sql).await?;
            return self.client.query_one(&stmt, &untyped(params)).await;
        }
        self.client.query_typed_one(sql, &typed(params)).await
    }

    /// How many rows `sql` changed.
    pub(super) async fn execute(&self, sql: &str, params: &[&dyn Param]) -> Result<u64, Error> {
        if self.named {
            let stmt = self.client.prepare_cached(sql).await?;
            return self.client.execute(&stmt, &untyped(params)).await;
        }
        self.client.execute_typed(sql, &typed(params)).await
    }
}

/// The parameters with their types, for an unnamed statement.
pub(super) fn typed<'p>(params: &[&'p dyn Param]) -> Vec<(&'p (dyn ToSql + Sync), Type)> {
    params
        .iter()
        .map(|p| (*p as &(dyn ToSql + Sync), p.pg_type()))
        .collect()
}

/// The parameters alone, for a named statement whose prepare found their
/// types.
fn untyped<'p>(params: &[&'p dyn Param]) -> Vec<&'p (dyn ToSql + Sync)> {
    params.iter().map(|p| *p as &(dyn ToSql + Sync)).collect()
}

/// How long a store call waits, once its time is up, for the cancel
/// request to be sent and for the cancelled statement to end on the server
/// (at most the timeout itself, when that is shorter). The server ends a
/// cancelled statement within milliseconds; the wait is there so that the
/// connection (and, behind PgBouncer, the client's link to its server
/// connection, through which the cancel is forwarded) is closed only once
/// the statement is over.
pub(super) const CANCEL_WAIT: Duration = Duration::from_secs(1);

/// How long a cancel request's own connection is held at most, waiting
/// for the other side to close it ([`send_held`]), past the call that sent
/// it: PgBouncer's own `cancel_wait_timeout` (10 s by default) bounds how
/// long it tries to forward one.
const CANCEL_HELD: Duration = Duration::from_secs(15);

/// A cancel request's send: one connection to the server (or the pooler),
/// one message.
/// Its error says why it could not be sent.
type Sending = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Sends a cancel request for the statement a connection is running. Kept
/// from [`build_with_tls`](super::PostgresStoreBuilder::build_with_tls),
/// whose TLS type it hides; used only when a statement did not answer in
/// time: nothing of it runs on a call that does.
#[derive(Clone)]
pub(super) struct Canceller(Arc<dyn Fn(CancelToken) -> Sending + Send + Sync>);

impl Canceller {
    /// How the store cancels, for connections made with `config` through
    /// `tls`; `plain`: the connections never use TLS (`NoTls`, or
    /// `sslmode=disable`).
    ///
    /// Without TLS, to the one host of `config`: as libpq sends it
    /// ([`send_held`]), which PgBouncer forwards. With TLS, or several
    /// hosts: tokio-postgres's own cancel
    /// ([`CancelToken::cancel_query`]), encrypted and to the address the
    /// connection was made to, which a server acts on but PgBouncer drops
    /// (it closes its connection as soon as the request is written).
    pub(super) fn new<T>(config: &Config, tls: T, plain: bool) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
        T::Stream: Sync + Send,
        T::TlsConnect: Sync + Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        if let Some(to) = plain.then(|| Address::of(config)).flatten() {
            let to = Arc::new(to);
            return Canceller(Arc::new(move |token: CancelToken| {
                let to = to.clone();
                Box::pin(async move { send_held(token, &to).await })
            }));
        }
        Canceller(Arc::new(move |token: CancelToken| {
            let tls = tls.clone();
            Box::pin(async move { token.cancel_query(tls).await.map_err(|e| e.to_string()) })
        }))
    }

    /// Asks the server to cancel what the connection of `token` is running.
    fn cancel(&self, token: CancelToken) -> Sending {
        (self.0)(token)
    }
}

/// Where a configuration with one host connects: its `hostaddr` or its
/// host, and its port. `None` for several hosts (which one a connection
/// reached is the connection's to know).
#[derive(Debug)]
enum Address {
    Tcp(String, u16),
    #[cfg(unix)]
    Unix(std::path::PathBuf),
}

impl Address {
    fn of(config: &Config) -> Option<Self> {
        let (hosts, addrs) = (config.get_hosts(), config.get_hostaddrs());
        if hosts.len().max(addrs.len()) != 1 {
            return None;
        }
        let port = config.get_ports().first().copied().unwrap_or(5432);
        Some(match (addrs.first(), hosts.first()) {
            (Some(ip), _) => Address::Tcp(ip.to_string(), port),
            (None, Some(Host::Tcp(host))) => Address::Tcp(host.clone(), port),
            #[cfg(unix)]
            (None, Some(Host::Unix(dir))) => Address::Unix(dir.join(format!(".s.PGSQL.{port}"))),
            (None, None) => return None,
        })
    }
}

/// A cancel request as libpq sends it: on a new plain connection to `to`,
/// and the connection then held open until the other side closes it.
/// PostgreSQL acts on the request as soon as it has read it; PgBouncer
/// forwards it on a server connection of its own, and drops it if its
/// sender has gone by then, which tokio-postgres's own cancel has (it
/// closes as soon as the request is written).
async fn send_held(token: CancelToken, to: &Address) -> Result<(), String> {
    let mut held: Held = match to {
        Address::Tcp(host, port) => Held::Tcp(
            tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .map_err(|e| e.to_string())?,
        ),
        #[cfg(unix)]
        Address::Unix(path) => Held::Unix(
            tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| e.to_string())?,
        ),
    };
    token
        .cancel_query_raw(&mut held, NoTls)
        .await
        .map_err(|e| e.to_string())?;
    // The other side closes once it has acted on (or forwarded) the
    // request; nothing else comes.
    let mut rest = [0u8; 64];
    while matches!(held.read(&mut rest).await, Ok(n) if n > 0) {}
    Ok(())
}

/// A connection that a cancel request is written on, whose shutdown does
/// nothing: the connection stays open until its other side closes it, or
/// it is dropped.
enum Held {
    Tcp(tokio::net::TcpStream),
    #[cfg(unix)]
    Unix(tokio::net::UnixStream),
}

impl AsyncRead for Held {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Held::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(unix)]
            Held::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Held {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Held::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(unix)]
            Held::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Held::Tcp(s) => Pin::new(s).poll_flush(cx),
            #[cfg(unix)]
            Held::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// How a statement bounded by the store's timeout ended, when it did not
/// answer in time.
#[derive(Debug)]
pub(super) struct TimedOut {
    /// The statement ended with an error after the server was asked to
    /// cancel it, within [`CANCEL_WAIT`]: it was not applied. Otherwise it
    /// may still be running, and be applied later.
    pub(super) ended: bool,
}

/// `work`, a statement (or a few) on one connection, within `limit`. When
/// it has not answered by then, the server is asked to cancel what the
/// connection runs (`token` gives the connection's cancel key, read only
/// then), and the statement is waited for, [`CANCEL_WAIT`] at most, before
/// the caller drops the connection: a statement that waited on a lock ends
/// with the cancel's error instead of being applied once the lock goes,
/// after the caller was told it failed. Through PgBouncer the cancel goes
/// to PgBouncer, which forwards it to the server connection its client is
/// linked to.
///
/// The cancel is sent by a task of its own, which holds its connection
/// until the other side closes it ([`send_held`], [`CANCEL_HELD`] at
/// most), also past this call: PgBouncer 1.18 stops with a fatal error
/// when a cancel's sender goes while it forwards the request.
///
/// A statement that still answers with a result after the cancel (it was
/// applied just before the cancel reached it) gives that result: the truth,
/// late. Any error after the cancel is the time running out
/// ([`TimedOut`]).
pub(super) async fn bounded<T, E>(
    canceller: &Canceller,
    token: impl FnOnce() -> CancelToken,
    limit: Duration,
    work: impl Future<Output = Result<T, E>>,
) -> Result<Result<T, E>, TimedOut> {
    let mut work = std::pin::pin!(work);
    if let Ok(out) = tokio::time::timeout(limit, work.as_mut()).await {
        return Ok(out);
    }
    let sending = canceller.cancel(token());
    let mut cancel = tokio::spawn(async move {
        match tokio::time::timeout(CANCEL_HELD, sending).await {
            Ok(sent) => sent,
            // Sent, but neither acted on nor refused in that time.
            Err(_) => Ok(()),
        }
    });
    let deadline = tokio::time::sleep(CANCEL_WAIT.min(limit));
    tokio::pin!(deadline);
    // The statement ends (with the cancel's error) and the cancel's
    // connection is closed, in either order: the call waits for both.
    let (mut ended, mut sent) = (None, false);
    while ended.is_none() || !sent {
        tokio::select! {
            out = &mut cancel, if !sent => {
                sent = true;
                let failed = match out {
                    Ok(Ok(())) => None,
                    Ok(Err(error)) => Some(error),
                    Err(error) => Some(error.to_string()),
                };
                if let Some(error) = failed {
                    tracing::warn!(%error, "could not ask PostgreSQL to cancel a statement that did not answer in time");
                    if ended.is_none() {
                        return Err(TimedOut { ended: false });
                    }
                }
            }
            out = work.as_mut(), if ended.is_none() => ended = Some(out),
            () = &mut deadline => break,
        }
    }
    match ended {
        Some(Ok(v)) => Ok(Ok(v)),
        Some(Err(_)) => Err(TimedOut { ended: true }),
        None => Err(TimedOut { ended: false }),
    }
}
