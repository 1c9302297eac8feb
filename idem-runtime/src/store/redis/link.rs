//! The connection to Redis: one multiplexed connection that reconnects by
//! itself (standalone), or the Cluster client's connections to every node;
//! every call bounded by the store's timeout.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::sync::OnceCell;

use super::scripts::{Function, LIBRARY};
use crate::store::StoreError;

/// Where the store connects.
#[derive(Clone, Debug)]
pub(super) enum Target {
    /// One server (or a proxy in front of several).
    Single(redis::Client),
    /// A Redis Cluster, found from any of these nodes.
    Cluster(Vec<redis::ConnectionInfo>),
}

/// The store's connection, opened on first use and kept: later calls share
/// it, and it reconnects after a failure by itself.
pub(super) struct Link {
    target: Target,
    conn: OnceCell<Conn>,
    timeout: Duration,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("target", &self.target)
            .field("connected", &self.conn.initialized())
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// An open connection, cheap to clone (a handle on a shared connection).
#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Link {
    pub(super) fn new(target: Target, timeout: Duration) -> Self {
        Link {
            target,
            conn: OnceCell::new(),
            timeout,
        }
    }

    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `work` on the connection (opening it first if need be), within
    /// `timeout`. Errors: `Config` when the server refuses the store's user
    /// a command (`NOPERM`: an ACL to grant, which no retry fixes),
    /// `Unavailable` otherwise.
    pub(super) async fn call<T>(
        &self,
        timeout: Duration,
        work: impl AsyncFnOnce(&mut Conn) -> RedisResult<T>,
    ) -> Result<T, StoreError> {
        let out = tokio::time::timeout(timeout, async {
            let mut conn = self.conn.get_or_try_init(|| self.open()).await?.clone();
            work(&mut conn).await
        })
        .await;
        match out {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if refused_by_acl(&e) => Err(StoreError::Config(format!(
                "Redis refused the store's user a command (NOPERM: {}); grant the user what \
                 docs/deploying.md (\"Redis or Valkey\") gives its role: a server needs FCALL, \
                 the commands the library runs and the store's keys (`ACL SETUSER <user> reset \
                 on >PASSWORD ~<prefix>:* +ping +fcall +time +scan +get +set …`), and \
                 `+function|load`, unless the library {} is loaded by a user that may",
                e.detail().unwrap_or("no detail"),
                LIBRARY.name
            ))),
            Ok(Err(e)) => Err(StoreError::Unavailable(format!("Redis: {e}"))),
            Err(_) => Err(StoreError::Unavailable(format!(
                "Redis did not answer within {timeout:?}"
            ))),
        }
    }

    /// Runs `cmd`, an FCALL of one of the library's functions (see
    /// [`fcall`]), within the store's timeout; a server that does not have
    /// the library (a new one, one restarted without its data, a Cluster
    /// node that took over slots, or after `FUNCTION FLUSH`) is sent it, and
    /// the call repeated.
    pub(super) async fn run(&self, cmd: &Cmd) -> Result<Value, StoreError> {
        self.call(self.timeout, async |conn| {
            let mut reply = conn.req_packed_command(cmd).await;
            if no_function(&reply) {
                let loaded = load(conn).await;
                reply = conn.req_packed_command(cmd).await;
                if no_function(&reply) {
                    loaded?;
                }
            }
            match reply? {
                Value::ServerError(e) => Err(e.into()),
                reply => Ok(reply),
            }
        })
        .await
    }

    /// [`Link::run`], followed on the same connection, in the same write, by
    /// `WAIT replicas timeout`: the function's answer, and how many replicas
    /// acknowledged every write sent on that connection so far (this one
    /// included). `key` is one of the function's keys (a Cluster sends both
    /// to its node).
    pub(super) async fn run_and_wait(
        &self,
        cmd: &Cmd,
        key: &[u8],
        replicas: u32,
        timeout: Duration,
    ) -> Result<(Value, i64), StoreError> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(timeout.as_millis().max(1) as u64);
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone()).add_command(wait);
        self.call(self.timeout + timeout, async |conn| {
            let mut sent = pipelined(conn, &pipe, key).await?;
            if let [first, _] = &sent[..] {
                if no_function(&Ok(first.clone())) {
                    load(conn).await?;
                    sent = pipelined(conn, &pipe, key).await?;
                }
            }
            match <[Value; 2]>::try_from(sent) {
                Ok([Value::ServerError(e), _]) => Err(e.into()),
                Ok([reply, Value::Int(acked)]) => Ok((reply, acked)),
                // Not echoed: a function's reply may hold a stored response.
                _ => Err(RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "FCALL and WAIT answered something else than a reply and a count",
                ))),
            }
        })
        .await
    }

    /// Opens the connection. Reconnecting after a failure is the
    /// connection's own business from then on: the standalone manager
    /// reconnects in the background when a call finds the connection broken,
    /// the Cluster client when a node stops answering.
    async fn open(&self) -> RedisResult<Conn> {
        match &self.target {
            Target::Single(client) => {
                // One quick attempt per call: a call that finds the server
                // down fails at once (fail closed), and the next call tries
                // again.
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    .set_response_timeout(Some(self.timeout))
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(100));
                let manager = ConnectionManager::new_with_config(client.clone(), config).await?;
                Ok(Conn::Single(manager))
            }
            Target::Cluster(nodes) => {
                let client = ClusterClient::builder(nodes.clone())
                    .connection_timeout(self.timeout)
                    .response_timeout(self.timeout)
                    .retries(3)
                    .min_retry_wait(10)
                    .max_retry_wait(100)
                    .build()?;
                Ok(Conn::Cluster(client.get_async_connection().await?))
            }
        }
    }
}

/// Whether the server refused the store's user a command: `NOPERM` for a
/// command it sent, and for a command a function ran, Redis 7.0's `ERR The
/// user executing the script can't run this command` (later versions say
/// `NOPERM`): an ACL to grant, which no retry fixes.
fn refused_by_acl(e: &RedisError) -> bool {
    e.code() == Some("NOPERM")
        || e.detail()
            .is_some_and(|d| d.contains("user executing the script can't run this command"))
}

/// Whether the server answered that it does not have the function (whether
/// the client reports that as an error or as an error value): `ERR Function
/// not found`, which has no code of its own.
fn no_function(reply: &RedisResult<Value>) -> bool {
    let (code, detail) = match reply {
        Err(e) => (e.code(), e.detail()),
        Ok(Value::ServerError(e)) => (Some(e.code()), e.details()),
        Ok(_) => return false,
    };
    code == Some("ERR") && detail.is_some_and(|d| d.starts_with("Function not found"))
}

/// Sends the library to the server: on a Cluster, to every primary (the
/// client routes `FUNCTION LOAD` to all of them), so a node that took over
/// slots gets it too. `REPLACE`: a library of this name is this very code
/// (the name is its hash), so loading it again, from several processes at
/// once, changes nothing.
pub(super) async fn load(conn: &mut Conn) -> RedisResult<()> {
    redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(&LIBRARY.code)
        .exec_async(conn)
        .await
}

/// An FCALL of `function` over `keys`; the caller adds the arguments.
pub(super) fn fcall(function: &Function, keys: &[&[u8]]) -> Cmd {
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(function.name()).arg(keys.len()).arg(keys);
    cmd
}

/// Sends `pipe` on one connection: the standalone one, or the connection to
/// the node that holds `key` (the Cluster client's default would pick the
/// node from the first command, and send a keyless WAIT to every master).
async fn pipelined(conn: &mut Conn, pipe: &Pipeline, key: &[u8]) -> RedisResult<Vec<Value>> {
    match conn {
        Conn::Single(c) => c.req_packed_commands(pipe, 0, pipe.len()).await,
        Conn::Cluster(c) => {
            let node = Route::with_key(key, SlotAddr::Master);
            c.route_pipeline(
                pipe.clone(),
                0,
                pipe.len(),
                SingleNodeRoutingInfo::SpecificNode(node),
            )
            .await
        }
    }
}
