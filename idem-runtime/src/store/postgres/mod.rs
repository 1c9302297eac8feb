//! [`PostgresStore`]: records in PostgreSQL, shared by several replicas.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, QueueMode, RecyclingMethod, Runtime,
};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{NoTls, Row, Socket};

use crate::durable::key_range;
use crate::key::{IdempotencyKey, Reference};
use crate::store::{
    Attempt, Claim, ClaimRequest, IdempotencyStore, Record, RecordState, StoreError,
};

/// State codes in the `state` column.
const IN_PROGRESS: i16 = 0;
const COMPLETED: i16 = 1;
const UNKNOWN: i16 = 2;

/// The shipped migrations, in order; `{schema}` is replaced by the quoted
/// schema name. A version, once shipped, is never edited: add a new one.
const MIGRATIONS: &[(i32, &str)] = &[(1, include_str!("../migrations/postgres/0001_records.sql"))];

/// Every column of a record, in the order [`row_to_record`] reads them.
const COLUMNS: &str = "key, fingerprint, tenant, tool, state, attempt, claimed_at, \
                       updated_at, lease_until, expires_at, retain_until, body";

/// `Record::is_expired`, in SQL, for the row named `r`. `r.expires_at <=
/// now()` comes first so the index on `expires_at` can find the candidates: an
/// IN_PROGRESS or UNKNOWN record is kept past its window, never before it.
fn expired(r: &str) -> String {
    format!(
        "{r}.expires_at <= now() AND ({r}.state = 1 \
         OR ({r}.retain_until <= now() AND {r}.lease_until <= now()))"
    )
}

/// Records in a PostgreSQL database, for several server replicas.
///
/// Every time (claimed, lease, expiry) comes from the server's `now()`, never
/// from the process clock, so replicas whose clocks disagree still agree on
/// which lease ran out. Every change is one statement; a claim is one
/// `INSERT … ON CONFLICT … DO UPDATE … WHERE <expired>`.
///
/// Calls fail fast with [`StoreError::Unavailable`] when the server cannot be
/// reached: connecting, waiting for a pooled connection and each statement are
/// bounded by the builder's timeout, and a connection that broke or stopped
/// answering is dropped from the pool, which opens fresh ones once the server
/// is back (no restart needed).
///
/// ```no_run
/// # async fn f() -> Result<(), idem_runtime::StoreError> {
/// let store = idem_runtime::PostgresStore::builder("postgres://app@db/app")?
///     .schema("idem")
///     .build()?;
/// store.migrate().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    sql: Arc<Statements>,
    timeout: Duration,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("schema", &self.sql.schema)
            .field("pool", &self.pool.status())
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// Configures a [`PostgresStore`]: schema, pool size and timeout.
#[derive(Debug, Clone)]
pub struct PostgresStoreBuilder {
    config: tokio_postgres::Config,
    schema: String,
    pool_size: usize,
    timeout: Duration,
}

impl PostgresStoreBuilder {
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
    /// 5 s). It is also the server's `statement_timeout`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The store, without TLS. Connects lazily: nothing is sent to the server
    /// until the first call. Errors: `Unavailable` for an invalid schema name.
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
        // Fail fast instead of hanging on an unreachable server; keepalives
        // find a silently dead peer on idle connections.
        config.connect_timeout(self.timeout);
        config.keepalives(true);
        config.keepalives_idle(Duration::from_secs(30));
        let statement_timeout = format!("-c statement_timeout={}", self.timeout.as_millis());
        let options = match config.get_options() {
            Some(o) if !o.is_empty() => format!("{o} {statement_timeout}"),
            _ => statement_timeout,
        };
        config.options(&options);
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
            .map_err(|e| StoreError::Unavailable(format!("cannot build the pool: {e}")))?;
        Ok(PostgresStore {
            pool,
            sql: Arc::new(Statements::new(schema)),
            // A little over the server's statement_timeout, so that the server
            // usually reports the timeout itself.
            timeout: self.timeout + Duration::from_millis(500),
        })
    }
}

impl PostgresStore {
    /// A builder from a connection string: a URL
    /// (`postgres://user@host:5432/db`) or `key=value` pairs.
    /// Errors: `Unavailable` when the string does not parse.
    pub fn builder(url: &str) -> Result<PostgresStoreBuilder, StoreError> {
        let config = url
            .parse::<tokio_postgres::Config>()
            .map_err(|e| StoreError::Unavailable(format!("invalid connection string: {e}")))?;
        Ok(Self::builder_from_config(config))
    }

    /// A builder from a parsed configuration.
    pub fn builder_from_config(config: tokio_postgres::Config) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            config,
            schema: "public".into(),
            pool_size: 16,
            timeout: Duration::from_secs(5),
        }
    }

    /// A store with the default settings, after checking that the server
    /// answers. Errors: `Unavailable`.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let store = Self::builder(url)?.build()?;
        let client = store.client().await?;
        let out = tokio::time::timeout(store.timeout, client.simple_query("SELECT 1")).await;
        store.settle(client, out).map(|_| store)
    }

    /// The schema's name, quoted as it appears in SQL.
    pub fn schema(&self) -> &str {
        &self.sql.schema
    }

    /// The connection pool, for running SQL beside the store (a benchmark's
    /// baseline, a test's cleanup).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The claim and completion statements exactly as the store runs them,
    /// so a benchmark can run the same SQL raw over the same pool. Parameters:
    /// claim `($1 key, $2 fingerprint, $3 tenant, $4 tool, $5 attempt,
    /// $6 lease µs, $7 window µs, $8 retention µs)`; complete `($1 key,
    /// $2 attempt, $3 response bytes)`.
    #[doc(hidden)]
    pub fn claim_and_complete_sql(&self) -> (&str, &str) {
        (&self.sql.claim, &self.sql.complete)
    }

    /// Creates the schema and applies the shipped migrations not applied yet,
    /// recording each in `idem_migrations`. Idempotent, and safe when several
    /// processes migrate at once: they take turns on an advisory lock, and the
    /// later ones find nothing left to do. Errors: `Unavailable`.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let schema = self.sql.schema.clone();
        let out = tokio::time::timeout(self.timeout * 4, async {
            let tx = client.transaction().await?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&lock_id(&schema)])
                .await?;
            tx.batch_execute(&format!(
                "CREATE SCHEMA IF NOT EXISTS {schema}; \
                 CREATE TABLE IF NOT EXISTS {schema}.idem_migrations ( \
                   version integer PRIMARY KEY, \
                   applied_at timestamptz NOT NULL DEFAULT now())"
            ))
            .await?;
            let applied: Vec<i32> = tx
                .query(
                    &format!("SELECT version FROM {schema}.idem_migrations"),
                    &[],
                )
                .await?
                .iter()
                .map(|r| r.get(0))
                .collect();
            for (version, sql) in MIGRATIONS {
                if applied.contains(version) {
                    continue;
                }
                tx.batch_execute(&sql.replace("{schema}", &schema)).await?;
                tx.execute(
                    &format!("INSERT INTO {schema}.idem_migrations (version) VALUES ($1)"),
                    &[version],
                )
                .await?;
            }
            tx.commit().await
        })
        .await;
        self.settle(client, out)
    }

    /// A pooled connection, or `Unavailable` within the timeout.
    async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(|e| {
            StoreError::Unavailable(format!("cannot get a PostgreSQL connection: {e}"))
        })
    }

    /// Runs `work` on a pooled connection within the timeout.
    async fn with<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        F: AsyncFnOnce(&Object, &Statements) -> Result<T, Failure>,
    {
        let client = self.client().await?;
        let out = tokio::time::timeout(self.timeout, work(&client, &self.sql)).await;
        match out {
            Ok(Err(Failure::Store(e))) => Err(e),
            Ok(Err(Failure::Pg(e))) => self.settle(client, Ok(Err(e))),
            Ok(Ok(v)) => Ok(v),
            Err(elapsed) => self.settle::<T>(client, Err(elapsed)),
        }
    }

    /// Maps the outcome of a statement; a connection that broke or did not
    /// answer in time is taken out of the pool (and closed) instead of being
    /// handed to the next caller, so the pool heals by opening a new one.
    fn settle<T>(
        &self,
        client: Object,
        out: Result<Result<T, tokio_postgres::Error>, tokio::time::error::Elapsed>,
    ) -> Result<T, StoreError> {
        match out {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if client.is_closed() || e.as_db_error().is_none() {
                    drop(Object::take(client));
                }
                Err(StoreError::Unavailable(format!(
                    "PostgreSQL: {}",
                    describe(&e)
                )))
            }
            Err(_) => {
                drop(Object::take(client));
                Err(StoreError::Unavailable(format!(
                    "PostgreSQL did not answer within {:?}",
                    self.timeout
                )))
            }
        }
    }
}

/// The error text with its cause (tokio-postgres puts the server's message in
/// the source, not in `Display`).
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) if ["42P01", "3F000"].contains(&db.code().code()) => format!(
            "{} ({}); has PostgresStore::migrate() run for this schema?",
            db.message(),
            db.code().code()
        ),
        Some(db) => format!("{} ({})", db.message(), db.code().code()),
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

/// An error inside a store call: the database's, or the store's verdict.
enum Failure {
    Pg(tokio_postgres::Error),
    Store(StoreError),
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Failure::Pg(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

/// The advisory lock migrations of one schema take turns on.
fn lock_id(schema: &str) -> i64 {
    // FNV-1a: stable across builds and processes, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in "idem-migrate:".bytes().chain(schema.bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h as i64
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
        Err(StoreError::Unavailable(format!(
            "invalid schema name {schema:?}: use letters, digits and _ (at most 63)"
        )))
    }
}

/// The store's SQL, with the schema filled in once.
#[derive(Debug)]
struct Statements {
    schema: String,
    claim: String,
    read: String,
    complete: String,
    release: String,
    mark_unknown: String,
    heartbeat: String,
    refusal: String,
    lookup: String,
    purge: String,
    lapsed: String,
    unknown: String,
}

impl Statements {
    fn new(schema: String) -> Self {
        let t = format!("{schema}.idem_records");
        Statements {
            // One statement: insert, or take over the row only if it is
            // expired per Record::is_expired. A live row is left alone (and
            // only locked for the statement), and no row comes back.
            claim: format!(
                "INSERT INTO {t} AS r (key, fingerprint, tenant, tool, state, attempt, \
                   claimed_at, updated_at, lease_until, expires_at, retain_until, body) \
                 VALUES ($1, $2, $3, $4, 0, $5, now(), now(), \
                   now() + $6::int8 * interval '1 microsecond', \
                   now() + $7::int8 * interval '1 microsecond', \
                   now() + $8::int8 * interval '1 microsecond', NULL) \
                 ON CONFLICT (key) DO UPDATE SET fingerprint = EXCLUDED.fingerprint, \
                   tenant = EXCLUDED.tenant, tool = EXCLUDED.tool, state = 0, \
                   attempt = EXCLUDED.attempt, claimed_at = EXCLUDED.claimed_at, \
                   updated_at = EXCLUDED.updated_at, lease_until = EXCLUDED.lease_until, \
                   expires_at = EXCLUDED.expires_at, retain_until = EXCLUDED.retain_until, \
                   body = NULL \
                 WHERE {} \
                 RETURNING 1",
                expired("r")
            ),
            read: format!("SELECT {COLUMNS}, now() FROM {t} WHERE key = $1"),
            // Every fenced change carries `attempt = $2`: a worker whose claim
            // was taken over (lease ran out, record purged and claimed again)
            // must not overwrite, delete or extend the new owner's record.
            complete: format!(
                "UPDATE {t} SET state = 1, body = $3, updated_at = now() \
                 WHERE key = $1 AND attempt = $2 AND state <> 1"
            ),
            release: format!("DELETE FROM {t} WHERE key = $1 AND attempt = $2 AND state <> 1"),
            mark_unknown: format!(
                "UPDATE {t} SET state = 2, body = $3, updated_at = now() \
                 WHERE key = $1 AND attempt = $2 AND state = 0"
            ),
            heartbeat: format!(
                "UPDATE {t} SET lease_until = now() + $3::int8 * interval '1 microsecond', \
                   updated_at = now() \
                 WHERE key = $1 AND attempt = $2 AND state = 0"
            ),
            refusal: format!("SELECT attempt, state FROM {t} WHERE key = $1"),
            // The reference is the key's first eight bytes: a range over the
            // primary key finds it without a column or index of its own.
            lookup: format!(
                "SELECT {COLUMNS} FROM {t} WHERE key BETWEEN $1 AND $2 AND tenant = $3 \
                 ORDER BY key LIMIT 1"
            ),
            // Bounded, and SKIP LOCKED: rows a claim is taking over right now
            // are left for the next batch instead of being waited on. The
            // rows are deleted by ctid (stable: they are locked), a TID scan;
            // `key IN (…)` let the planner choose a hash join over a sequential
            // scan of the whole table on mid-sized tables, 5× slower a batch.
            purge: format!(
                "DELETE FROM {t} WHERE ctid = ANY(ARRAY( \
                   SELECT ctid FROM {t} AS r WHERE {} LIMIT $1 FOR UPDATE SKIP LOCKED))",
                expired("r")
            ),
            lapsed: format!(
                "SELECT {COLUMNS} FROM {t} WHERE state = 0 AND lease_until <= now() \
                 ORDER BY lease_until LIMIT $1"
            ),
            unknown: format!(
                "SELECT {COLUMNS} FROM {t} WHERE state = 2 ORDER BY claimed_at LIMIT $1"
            ),
            schema,
        }
    }
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn row_to_record(row: &Row) -> Result<Record, StoreError> {
    let bytes32 = |i: usize| -> Result<[u8; 32], StoreError> {
        let v: &[u8] = row.try_get(i).map_err(corrupt)?;
        <[u8; 32]>::try_from(v)
            .map_err(|_| StoreError::Corrupt("a key or fingerprint is not 32 bytes".into()))
    };
    let text = |b: Option<Vec<u8>>| -> Result<Option<String>, StoreError> {
        b.map(|b| {
            String::from_utf8(b).map_err(|_| StoreError::Corrupt("a body is not UTF-8".into()))
        })
        .transpose()
    };
    let body = text(row.try_get(11).map_err(corrupt)?)?;
    let state = match (row.try_get::<_, i16>(4).map_err(corrupt)?, body) {
        (IN_PROGRESS, _) => RecordState::InProgress,
        (COMPLETED, Some(response)) => RecordState::Completed { response },
        (UNKNOWN, note) => RecordState::Unknown {
            note: note.unwrap_or_default(),
        },
        (s, _) => return Err(StoreError::Corrupt(format!("state {s}"))),
    };
    let time = |i: usize| row.try_get::<_, SystemTime>(i).map_err(corrupt);
    Ok(Record {
        key: IdempotencyKey::from_parts(bytes32(0)?, bytes32(1)?),
        tenant: row.try_get(2).map_err(corrupt)?,
        tool: row.try_get(3).map_err(corrupt)?,
        attempt: Attempt(row.try_get::<_, i64>(5).map_err(corrupt)? as u64),
        state,
        claimed_at: time(6)?,
        updated_at: time(7)?,
        lease_until: time(8)?,
        expires_at: time(9)?,
        retain_until: time(10)?,
    })
}

fn corrupt(e: tokio_postgres::Error) -> StoreError {
    StoreError::Corrupt(format!("unexpected column: {e}"))
}

/// Why a fenced change touched no row: the attempt lost the record (or it is
/// gone), or the record is in a state that refuses the change.
async fn refusal(
    client: &Object,
    sql: &Statements,
    key: &[u8],
    attempt: Attempt,
) -> Result<StoreError, Failure> {
    let stmt = client.prepare_cached(&sql.refusal).await?;
    Ok(match client.query_opt(&stmt, &[&key]).await? {
        Some(row) if row.get::<_, i64>(0) as u64 == attempt.0 => StoreError::WrongState {
            found: match row.get::<_, i16>(1) {
                IN_PROGRESS => "IN_PROGRESS",
                COMPLETED => "COMPLETED",
                _ => "UNKNOWN",
            },
        },
        _ => StoreError::Fenced,
    })
}

/// A fenced change: `sql` must change exactly one row or it is refused.
async fn fenced(
    client: &Object,
    sql: &Statements,
    stmt: &str,
    key: &[u8],
    attempt: Attempt,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<(), Failure> {
    let stmt = client.prepare_cached(stmt).await?;
    if client.execute(&stmt, params).await? == 1 {
        Ok(())
    } else {
        Err(refusal(client, sql, key, attempt).await?.into())
    }
}

/// How often a claim retries when the conflicting row vanished between its
/// insert and its read (released or purged in between); each retry means
/// another caller made progress, so a handful is plenty.
const CLAIM_ROUNDS: usize = 16;

#[async_trait]
impl IdempotencyStore for PostgresStore {
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        self.with(async |client, sql| {
            let key = &req.key.as_bytes()[..];
            let claim = client.prepare_cached(&sql.claim).await?;
            for _ in 0..CLAIM_ROUNDS {
                let claimed = client
                    .query_opt(
                        &claim,
                        &[
                            &key,
                            &&req.key.fingerprint()[..],
                            &req.tenant,
                            &req.tool,
                            &(req.attempt.0 as i64),
                            &micros(req.lease),
                            &micros(req.window),
                            &micros(req.retention.max(req.window)),
                        ],
                    )
                    .await?;
                if claimed.is_some() {
                    return Ok(Claim::Claimed);
                }
                let read = client.prepare_cached(&sql.read).await?;
                if let Some(row) = client.query_opt(&read, &[&key]).await? {
                    let now: SystemTime = row.try_get(12).map_err(corrupt)?;
                    return Ok(Claim::Existing {
                        record: row_to_record(&row)?,
                        now,
                    });
                }
            }
            Err(StoreError::Unavailable(
                "the claim kept racing with deletions of the same record".into(),
            )
            .into())
        })
        .await
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        let key = &key.as_bytes()[..];
        self.with(async |client, sql| {
            fenced(
                client,
                sql,
                &sql.complete,
                key,
                attempt,
                &[&key, &(attempt.0 as i64), &response.as_bytes()],
            )
            .await
        })
        .await
    }

    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        let key = &key.as_bytes()[..];
        self.with(async |client, sql| {
            fenced(
                client,
                sql,
                &sql.release,
                key,
                attempt,
                &[&key, &(attempt.0 as i64)],
            )
            .await
        })
        .await
    }

    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        let key = &key.as_bytes()[..];
        self.with(async |client, sql| {
            fenced(
                client,
                sql,
                &sql.mark_unknown,
                key,
                attempt,
                &[&key, &(attempt.0 as i64), &note.as_bytes()],
            )
            .await
        })
        .await
    }

    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let key = &key.as_bytes()[..];
        self.with(async |client, sql| {
            fenced(
                client,
                sql,
                &sql.heartbeat,
                key,
                attempt,
                &[&key, &(attempt.0 as i64), &micros(lease)],
            )
            .await
        })
        .await
    }

    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        let (lo, hi) = key_range(reference);
        self.with(async |client, sql| {
            let stmt = client.prepare_cached(&sql.lookup).await?;
            match client
                .query_opt(&stmt, &[&&lo[..], &&hi[..], &tenant])
                .await?
            {
                Some(row) => Ok(Some(row_to_record(&row)?)),
                None => Ok(None),
            }
        })
        .await
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        self.with(async |client, sql| {
            let stmt = client.prepare_cached(&sql.purge).await?;
            Ok(client.execute(&stmt, &[&batch]).await? as usize)
        })
        .await
    }

    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.list(|s| &s.lapsed, limit).await
    }

    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.list(|s| &s.unknown, limit).await
    }
}

impl PostgresStore {
    async fn list(
        &self,
        which: fn(&Statements) -> &String,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(async |client, sql| {
            let stmt = client.prepare_cached(which(sql)).await?;
            let rows = client.query(&stmt, &[&limit]).await?;
            Ok(rows
                .iter()
                .map(row_to_record)
                .collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }
}
