//! [`PostgresStoreBuilder`]: the connection, the pool and its timeouts.

use std::any::TypeId;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, QueueMode, RecyclingMethod, Runtime};
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{NoTls, Socket};

use super::exec::Canceller;
use super::migrate::Connector;
use super::statements::Statements;
use super::PostgresStore;
use crate::store::{PauseHook, Pauses, StoreError};

/// How long [`PostgresStore::migrate`] may take unless told: a migration
/// builds its indexes with `CREATE INDEX CONCURRENTLY`, which reads the
/// table twice without blocking its writes; a few seconds a million rows
/// (BENCHMARKS.md), minutes for tables of tens of millions.
const DEFAULT_MIGRATE_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// Configures a [`PostgresStore`]: schema, pool size, timeout, and how
/// durable a completion's commit is.
#[derive(Debug, Clone)]
pub struct PostgresStoreBuilder {
    config: tokio_postgres::Config,
    schema: String,
    pool_size: usize,
    timeout: Duration,
    migrate_timeout: Duration,
    relaxed_completions: bool,
    direct_connection: bool,
    batched_completions: bool,
    pauses: Pauses,
}

impl PostgresStoreBuilder {
    pub(super) fn new(config: tokio_postgres::Config) -> Self {
        PostgresStoreBuilder {
            config,
            schema: "public".into(),
            pool_size: 16,
            timeout: Duration::from_secs(5),
            migrate_timeout: DEFAULT_MIGRATE_TIMEOUT,
            relaxed_completions: true,
            direct_connection: false,
            batched_completions: true,
            pauses: Pauses::default(),
        }
    }

    /// The schema that holds the store's tables (default `public`). Tests use
    /// a fresh one each to run in parallel. Letters, digits and `_` only.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The most connections the pool opens (default 16).
    pub fn pool_size(mut self, size: usize) -> Self {
        self.pool_size = size.max(1);
        self
    }

    /// How long connecting, waiting for a pooled connection, and each
    /// statement may take before the call fails as `Unavailable` (default
    /// 5 s).
    ///
    /// A statement still running then is cancelled on the server, not
    /// only given up on: the store sends PostgreSQL a cancel request for
    /// it (behind PgBouncer, to PgBouncer, which forwards it to the server
    /// connection the store's was linked to) and waits for the statement
    /// to end, a second at most (the timeout, when that is shorter), before
    /// it answers and closes the connection. So a call fails within the
    /// timeout and at most a second more, and a statement it gave up on is
    /// not applied afterwards (a claim that waited on a row lock, which
    /// PostgreSQL would otherwise commit once the lock goes). Nothing of
    /// it runs on a call that answers in time.
    ///
    /// Without TLS ([`build`](Self::build), or `sslmode=disable`) and with
    /// one host, the cancel request is sent as libpq sends it, which
    /// PgBouncer forwards. With TLS, or several hosts, it is
    /// tokio-postgres's own, which PostgreSQL acts on and PgBouncer drops;
    /// there, behind PgBouncer, a claim applied after its caller gave up
    /// is retracted by the executor (it releases an unconfirmed claim
    /// until that claim's lease has run out). With
    /// [`direct_connection`](Self::direct_connection) the timeout is also
    /// the server's `statement_timeout`, and the client waits half a second
    /// more before it cancels.
    ///
    /// Keep it, plus that second, well below the executor's lease (30 s
    /// by default, `Executor::with_lease`): a claim answered after its
    /// lease is not trusted, and the executor watches an unconfirmed claim
    /// for one lease.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long [`migrate`](PostgresStore::migrate) may take in all, the
    /// wait for another starter's migration included (default 10
    /// minutes; `migrate_timeout=SECONDS` on a store URL).
    ///
    /// A migration builds its indexes with `CREATE INDEX CONCURRENTLY`,
    /// which reads the whole table (twice) while writes go on: seconds for
    /// a million records, minutes for tens of millions, so the bound is
    /// the migration's own, not the [`timeout`](Self::timeout) of a call.
    /// The changes that lock a table (adding a column, renaming one) each
    /// wait at most a quarter of that timeout for their lock, and are
    /// tried again until this bound: writes never queue behind a
    /// migration for longer. A migration that runs out is `Unavailable`
    /// and keeps what it finished: the next `migrate` goes on from the
    /// first migration not applied, and builds again an index whose
    /// build was cut off.
    pub fn migrate_timeout(mut self, timeout: Duration) -> Self {
        self.migrate_timeout = timeout;
        self
    }

    /// Whether completions that arrive while another is being written are
    /// written together, in one statement and one commit, each fenced by
    /// its own attempt (default on). A completion with nothing else in
    /// flight is written at once either way; under concurrency the batch
    /// saves the server a statement per call. Off, each completion is a
    /// statement of its own.
    pub fn batched_completions(mut self, on: bool) -> Self {
        self.batched_completions = on;
        self
    }

    /// Whether a completion (`complete`, `complete_with_follow_ons`: the
    /// COMPLETED record and its follow-ons) commits with
    /// `synchronous_commit = off` (default `true`), so that a call costs one
    /// durable commit, its claim's, instead of two.
    ///
    /// The claim always commits synchronously: it must be on disk before the
    /// handler's side effect. So do resolutions, sweeps, releases and every
    /// job change. What a relaxed completion risks: a crash (or failover) of
    /// the PostgreSQL server may lose the completions of its last moments
    /// (up to about 3 × `wal_writer_delay`, 600 ms by default). Each such
    /// record is IN_PROGRESS again: repeats answer "in progress" until its
    /// lease lapses, the sweep then marks it UNKNOWN and the reconciler (or an
    /// operator) finds the effect by its reference. The handler never runs a
    /// second time. `false` makes every completion wait for its flush, as
    /// the server's `synchronous_commit` says.
    pub fn relaxed_completions(mut self, relaxed: bool) -> Self {
        self.relaxed_completions = relaxed;
        self
    }

    /// Whether the store talks to PostgreSQL directly, with no transaction
    /// pooler between (default `false`: it works behind one).
    ///
    /// By default the store keeps nothing in a session, so that it works
    /// behind a pooler that lends a server connection for one transaction
    /// (PgBouncer in transaction mode, and the poolers in front of
    /// Supabase, Neon, Heroku and Azure): every statement is sent unnamed,
    /// in one round trip, and nothing is set at connection time.
    ///
    /// `true` uses what a direct connection keeps: each statement is
    /// prepared once per connection and cached (the server parses and
    /// plans it once), and the timeout is also sent as the session's
    /// `statement_timeout` (a startup option, which a transaction pooler
    /// refuses unless told to ignore it). Either way a statement still
    /// running at the [`timeout`](Self::timeout) is cancelled on the
    /// server. BENCHMARKS.md gives what it saves per call.
    ///
    /// Behind a transaction pooler it fails, on every call: a named
    /// statement lives on one server connection, and the next transaction
    /// gets another. The store's calls then fail with
    /// [`StoreError::Config`] ("prepared statement "s0" does not exist
    /// (26000)", or "already exists (42P05)", or the pooler's "unsupported
    /// startup parameter"), whose message says to turn this off.
    pub fn direct_connection(mut self, direct: bool) -> Self {
        self.direct_connection = direct;
        self
    }

    /// A hook the store asks how long to pause at each [`PausePoint`] in
    /// its own code (`None`: not at all), for a simulation that widens the
    /// gap between two statements of one call (BUGGIFY): the claim's read
    /// of a live record after its insert found one
    /// ([`PausePoint::PostgresClaimRead`]). Without one (the default),
    /// nothing is asked.
    ///
    /// [`PausePoint`]: crate::store::PausePoint
    /// [`PausePoint::PostgresClaimRead`]: crate::store::PausePoint::PostgresClaimRead
    pub fn pause_hook(mut self, hook: PauseHook) -> Self {
        self.pauses = Pauses::new(hook);
        self
    }

    /// The store, without TLS. Connects lazily: nothing is sent to the server
    /// until the first call. Errors: `Config` for an invalid schema name.
    pub fn build(self) -> Result<PostgresStore, StoreError> {
        self.build_with_tls(NoTls)
    }

    /// The store, connecting through `tls` (e.g. `postgres-native-tls` or
    /// `tokio-postgres-rustls`), for servers that require TLS.
    pub fn build_with_tls<T>(self, tls: T) -> Result<PostgresStore, StoreError>
    where
        T: MakeTlsConnect<Socket> + Clone + Sync + Send + 'static,
        T::Stream: Sync + Send,
        T::TlsConnect: Sync + Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let schema = quote_schema(&self.schema)?;
        let mut config = self.config;
        // Before the statement timeout below: a migration builds indexes
        // for longer than a call's statement may take.
        let mut migrating = config.clone();
        migrating.connect_timeout(self.timeout);
        if self.direct_connection {
            let statement_timeout =
                format!("-c statement_timeout={}", self.migrate_timeout.as_millis());
            let options = match migrating.get_options() {
                Some(o) if !o.is_empty() => format!("{o} {statement_timeout}"),
                _ => statement_timeout,
            };
            migrating.options(&options);
        }
        // Fail fast instead of hanging on an unreachable server; keepalives
        // find a silently dead peer on idle connections.
        config.connect_timeout(self.timeout);
        config.keepalives(true);
        config.keepalives_idle(Duration::from_secs(30));
        if self.direct_connection {
            let statement_timeout = format!("-c statement_timeout={}", self.timeout.as_millis());
            let options = match config.get_options() {
                Some(o) if !o.is_empty() => format!("{o} {statement_timeout}"),
                _ => statement_timeout,
            };
            config.options(&options);
        }
        // Sent without TLS where the connections use none (`NoTls` makes
        // none, `sslmode=disable` asks for none).
        let plain =
            TypeId::of::<T>() == TypeId::of::<NoTls>() || config.get_ssl_mode() == SslMode::Disable;
        let cancel = Canceller::new(&config, tls.clone(), plain);
        // A migration's connections are its own, outside the pool: one
        // holds the lock other starters wait on while the other builds.
        migrating.keepalives(true);
        migrating.keepalives_idle(Duration::from_secs(30));
        let migrate_tls = tls.clone();
        let migrations: Connector = Arc::new(move || {
            let (config, tls) = (migrating.clone(), migrate_tls.clone());
            Box::pin(async move {
                let (client, connection) = config.connect(tls).await?;
                tokio::spawn(connection);
                Ok(client)
            })
        });
        let manager = Manager::from_config(
            config,
            tls,
            ManagerConfig {
                // A connection that died is noticed (closed) when it is
                // recycled; one that stopped answering is dropped by `settle`.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(self.pool_size)
            // The most recently used connection first: a call's claim and its
            // completion land on the same warm server backend, and a quiet
            // pool keeps few backends busy. (FIFO would rotate every call
            // through every idle backend.)
            .queue_mode(QueueMode::Lifo)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(self.timeout))
            .create_timeout(Some(self.timeout))
            .recycle_timeout(Some(self.timeout))
            .build()
            .map_err(|e| StoreError::Config(format!("cannot build the pool: {e}")))?;
        Ok(PostgresStore {
            pool,
            cancel,
            sql: Arc::new(Statements::new(schema, self.relaxed_completions)),
            named_statements: self.direct_connection,
            combiner: self.batched_completions.then(Default::default),
            pauses: self.pauses,
            migrations,
            migrate_timeout: self.migrate_timeout,
            lock_timeout: (self.timeout / 4).max(Duration::from_millis(100)),
            bound: self.timeout,
            // On a direct connection, a little over the server's
            // statement_timeout, so that the server usually ends the
            // statement itself; the cancel stands behind it.
            timeout: if self.direct_connection {
                self.timeout + Duration::from_millis(500)
            } else {
                self.timeout
            },
        })
    }
}

fn quote_schema(schema: &str) -> Result<String, StoreError> {
    let valid = !schema.is_empty()
        && schema.len() <= 63
        && !schema.starts_with(|c: char| c.is_ascii_digit())
        && schema
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(format!("\"{schema}\""))
    } else {
        Err(StoreError::Config(format!(
            "invalid schema name {schema:?}: use letters, digits and _ (at most 63)"
        )))
    }
}
