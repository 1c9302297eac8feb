//! [`RedisStoreBuilder`]: where to connect, the key prefix, the timeout, and
//! how durable a claim must be before it is answered.

use std::sync::Arc;
use std::time::Duration;

use redis::IntoConnectionInfo;

use super::layout::Layout;
use super::link::{Link, Target};
use super::RedisStore;
use crate::store::StoreError;

/// Configures a [`RedisStore`]: key prefix, timeout, and the replicas a claim
/// waits for.
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    target: Target,
    prefix: String,
    timeout: Duration,
    replicas: Option<(u32, Duration)>,
}

impl RedisStoreBuilder {
    pub(super) fn single(url: &str) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(|e| invalid(url, e))?;
        Ok(Self::new(Target::Single(client)))
    }

    pub(super) fn cluster<S: AsRef<str>>(
        nodes: impl IntoIterator<Item = S>,
    ) -> Result<Self, StoreError> {
        let nodes = nodes
            .into_iter()
            .map(|n| {
                n.as_ref()
                    .into_connection_info()
                    .map_err(|e| invalid(n.as_ref(), e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if nodes.is_empty() {
            return Err(StoreError::Config(
                "a Redis Cluster needs at least one node to start from".into(),
            ));
        }
        Ok(Self::new(Target::Cluster(nodes)))
    }

    fn new(target: Target) -> Self {
        RedisStoreBuilder {
            target,
            prefix: "idem".into(),
            timeout: Duration::from_secs(5),
            replicas: None,
        }
    }

    /// The prefix of every key the store writes (default `idem`). Stores
    /// with different prefixes share a server without seeing each other's
    /// records; tests use a fresh one each. Letters, digits and `:_-.` only.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long connecting and each call may take before the call fails as
    /// `Unavailable` (default 5 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Answers a claim only once `replicas` replicas acknowledged it: the
    /// claim is followed by `WAIT replicas timeout` on the same connection,
    /// in the same write. A claim fewer replicas acknowledged within
    /// `timeout` is released again and answered `Unavailable`, so the handler
    /// does not run on a claim that a failover could lose.
    ///
    /// Every claim then costs the replicas' acknowledgement on top of its
    /// round trip, and, since `WAIT` blocks the connection it is sent on,
    /// the store's other calls queue behind it meanwhile. See the
    /// durability section of [`RedisStore`].
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = (replicas > 0).then_some((replicas, timeout.max(Duration::from_millis(1))));
        self
    }

    /// The store. Connects lazily: nothing is sent to the server until the
    /// first call. Errors: `Config` for an invalid prefix.
    pub fn build(self) -> Result<RedisStore, StoreError> {
        let layout = Layout::new(&self.prefix).map_err(StoreError::Config)?;
        Ok(RedisStore {
            link: Arc::new(Link::new(self.target, self.timeout)),
            layout: Arc::new(layout),
            replicas: self.replicas,
        })
    }
}

fn invalid(url: &str, e: redis::RedisError) -> StoreError {
    StoreError::Config(format!("invalid Redis URL ({}): {e}", scheme(url)))
}

/// What an invalid URL started with, never its password.
fn scheme(url: &str) -> &str {
    url.split_once("://").map_or("no scheme", |(s, _)| s)
}
