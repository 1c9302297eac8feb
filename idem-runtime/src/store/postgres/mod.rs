//! [`PostgresStore`]: records in PostgreSQL, shared by several replicas.
//!
//! One job, the store and its contract; its SQL is in `statements.rs`, its
//! schema in `migrate.rs`, its configuration in `builder.rs`, how its rows
//! are read and its fenced changes made in `rows.rs`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use deadpool_postgres::{Object, Pool};

use crate::key::{IdempotencyKey, Reference};
use crate::store::sql::{counts, key_range, tag_to_column};
use crate::store::{
    lease_names, sort_leased, Attempt, Claim, ClaimRequest, FollowOnFilter, FollowOnId,
    FollowOnRecord, FollowOnStore, FollowOns, IdempotencyStore, Inspect, Limits, PausePoint,
    Pauses, Record, RecordFilter, RecordStateKind, Resolution, StateCounts, StoreError, Upkeep,
};

mod builder;
mod combine;
mod exec;
mod migrate;
mod rows;
mod statements;

pub use builder::PostgresStoreBuilder;
use exec::{Canceller, Db, Param, Redacted, TimedOut};
use rows::*;
use statements::Statements;

/// Records in a PostgreSQL database, for several server replicas.
///
/// Every time (claimed, lease, expiry) comes from the server's `now()`, never
/// from the process clock, so replicas whose clocks disagree still agree on
/// which lease ran out. Every change is one statement; a claim is one
/// `INSERT … ON CONFLICT … DO UPDATE … WHERE <claimable and not to be kept>`.
/// The rare claim that takes over a record whose operation must still read
/// by its reference ([`Record::outlives_takeover`]) reads it and then, in a
/// second statement, moves it to `idem_superseded` and takes its key
/// (migration 6).
///
/// Follow-ons live in `idem_jobs` (migration 3). A completion (or a
/// COMPLETED resolution) and its jobs are one statement, so one transaction:
/// the jobs are inserted from the row the fenced change returns, and a
/// refused change writes none. A dispatcher's lease is one `UPDATE` over a
/// `FOR UPDATE SKIP LOCKED` selection of the longest-due jobs: dispatchers in
/// several processes never lease one job, and never wait on each other.
///
/// Calls fail fast with [`StoreError::Unavailable`] when the server cannot be
/// reached: connecting, waiting for a pooled connection and each statement are
/// bounded by the builder's timeout, a statement still running then is
/// cancelled on the server ([`PostgresStoreBuilder::timeout`]), and a
/// connection that broke or stopped answering is dropped from the pool, which
/// opens fresh ones once the server is back (no restart needed). What only a
/// change of configuration fixes (a transaction pooler in front of a store
/// built for a direct connection, a schema not migrated, a missing privilege,
/// a refused login) is [`StoreError::Config`], whose message says what to
/// change.
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
    /// The server's own bound on a claim (the builder's timeout): its lock
    /// waits end then, and a claim that took longer is not committed
    /// (migration 9's `idem_claim`).
    bound: Duration,
    /// Cancels a statement on the server when it did not answer in time.
    cancel: Canceller,
    /// Named, cached statements ([`PostgresStoreBuilder::direct_connection`]).
    named_statements: bool,
    /// Completions written together under concurrency ([`combine`]);
    /// `None` when each is written alone.
    combiner: Option<Arc<combine::Combiner>>,
    /// Makes the connections of [`migrate`](Self::migrate), outside the
    /// pool.
    migrations: migrate::Connector,
    /// [`PostgresStoreBuilder::migrate_timeout`].
    migrate_timeout: Duration,
    /// How long a migration's change that locks a live table waits for
    /// its lock before it gives way to the writes queued behind it, and
    /// is tried again: a quarter of the timeout.
    lock_timeout: Duration,
    /// [`PostgresStoreBuilder::pause_hook`].
    pauses: Pauses,
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

impl PostgresStore {
    /// A builder from a connection string: a URL
    /// (`postgres://user@host:5432/db`) or `key=value` pairs.
    /// Errors: `Config` when the string does not parse.
    pub fn builder(url: &str) -> Result<PostgresStoreBuilder, StoreError> {
        let config = url
            .parse::<tokio_postgres::Config>()
            .map_err(|e| StoreError::Config(format!("invalid connection string: {e}")))?;
        Ok(Self::builder_from_config(config))
    }

    /// A builder from a parsed configuration.
    pub fn builder_from_config(config: tokio_postgres::Config) -> PostgresStoreBuilder {
        PostgresStoreBuilder::new(config)
    }

    /// A store with the default settings, after checking that the server
    /// answers. Errors: `Unavailable`.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(Self::builder(url)?).await
    }

    /// The store `builder` builds, after checking that the server answers.
    pub(crate) async fn connect_with(builder: PostgresStoreBuilder) -> Result<Self, StoreError> {
        let store = builder.build()?;
        let client = store.client().await?;
        let token = || client.cancel_token();
        let ping = client.simple_query("SELECT 1");
        let out = exec::bounded(&store.cancel, token, store.timeout, ping).await;
        store.settle(client, out).map(|_| store)
    }

    /// The schema's name, quoted as it appears in SQL.
    pub fn schema(&self) -> &str {
        &self.sql.schema
    }

    /// The server's plan (`EXPLAIN`) of the statement that
    /// [`find_by_reference`](crate::store::Inspect::find_by_reference) sends
    /// for `reference`, one line per node: for the tests that check it
    /// searches the tables' primary keys and scans no table.
    #[cfg(feature = "conformance")]
    #[doc(hidden)]
    pub async fn plan_of_find_by_reference(
        &self,
        reference: &Reference,
    ) -> Result<String, StoreError> {
        let (lo, hi) = key_range(reference);
        let tag = tag_to_column(reference);
        self.with(async |db, sql| {
            let explain = format!("EXPLAIN {}", sql.by_reference);
            let rows = db.query(&explain, &[&&lo[..], &&hi[..], &tag]).await?;
            let lines = rows
                .iter()
                .map(|r| r.try_get::<_, String>(0))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(lines.join("\n"))
        })
        .await
    }

    /// A pooled connection, or `Unavailable` within the timeout.
    async fn client(&self) -> Result<Object, StoreError> {
        self.pool.get().await.map_err(|e| match e {
            // The server refused the connection (a login, a database that
            // does not exist): configuration, or the server's trouble.
            deadpool_postgres::PoolError::Backend(e) => match classify(&e, &self.sql.schema) {
                StoreError::Unavailable(m) => {
                    StoreError::Unavailable(format!("cannot get a PostgreSQL connection: {m}"))
                }
                other => other,
            },
            e => StoreError::Unavailable(format!("cannot get a PostgreSQL connection: {e}")),
        })
    }

    /// Runs `work` on a pooled connection within the timeout; a statement
    /// still running then is cancelled on the server ([`exec::bounded`]).
    async fn with<T, F>(&self, work: F) -> Result<T, StoreError>
    where
        F: AsyncFnOnce(&Db<'_>, &Statements) -> Result<T, CallError>,
    {
        let client = self.client().await?;
        let db = Db::new(&client, self.named_statements);
        let token = || client.cancel_token();
        let out = exec::bounded(&self.cancel, token, self.timeout, work(&db, &self.sql)).await;
        match out {
            Ok(Err(CallError::Store(e))) => Err(e),
            Ok(Err(CallError::Pg(e))) => self.settle(client, Ok(Err(e))),
            Ok(Ok(v)) => Ok(v),
            Err(timed_out) => self.settle::<T>(client, Err(timed_out)),
        }
    }

    /// Maps the outcome of a statement; a connection that broke or did not
    /// answer in time is taken out of the pool (and closed) instead of being
    /// handed to the next caller, so the pool heals by opening a new one.
    fn settle<T>(
        &self,
        client: Object,
        out: Result<Result<T, tokio_postgres::Error>, TimedOut>,
    ) -> Result<T, StoreError> {
        match out {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => {
                if client.is_closed() || e.as_db_error().is_none() {
                    drop(Object::take(client));
                }
                Err(classify(&e, &self.sql.schema))
            }
            Err(TimedOut { ended }) => {
                drop(Object::take(client));
                let server = if ended {
                    "the statement was cancelled on the server, and nothing of it was applied"
                } else {
                    "a cancel request could not be confirmed, so the server may still apply \
                     the statement"
                };
                Err(StoreError::Unavailable(format!(
                    "PostgreSQL did not answer within {:?}; {server}",
                    self.timeout
                )))
            }
        }
    }
}

/// A PostgreSQL error as the store's error: [`StoreError::Config`], with
/// what to change, for what only a change of configuration fixes (calling
/// again meets it again); [`StoreError::Unavailable`] for the rest.
fn classify(e: &tokio_postgres::Error, schema: &str) -> StoreError {
    let Some(db) = e.as_db_error() else {
        // tokio-postgres puts the cause (an I/O error, a closed
        // connection) in the source, not in `Display`.
        return StoreError::Unavailable(match std::error::Error::source(e) {
            Some(cause) => format!("PostgreSQL: {e}: {cause}"),
            None => format!("PostgreSQL: {e}"),
        });
    };
    let code = db.code().code();
    match misconfigured(code, db.message(), schema) {
        Some(fix) => StoreError::Config(format!("PostgreSQL: {} ({code}); {fix}", db.message())),
        None => StoreError::Unavailable(format!("PostgreSQL: {} ({code})", db.message())),
    }
}

/// What to change, when the server's error `code` (with its `message`) is
/// one that only a change of configuration fixes.
fn misconfigured(code: &str, message: &str, schema: &str) -> Option<String> {
    Some(match code {
        // A named statement prepared on one server connection, used on
        // another: a transaction pooler between.
        "26000" | "42P05" => "a transaction pooler (PgBouncer in transaction mode, or the pooler \
             of Supabase, Neon, Heroku or Azure) is between the store and the server, and the \
             store was built for a direct connection: turn \
             PostgresStoreBuilder::direct_connection off (remove direct=true from the store URL), \
             or point the store at the server itself"
            .to_owned(),
        // A pooler that refuses the direct connection's startup option.
        _ if message.contains("unsupported startup parameter") => "a connection pooler \
             refused the startup parameter that PostgresStoreBuilder::direct_connection sends: \
             turn direct_connection off (remove direct=true from the store URL) behind a \
             pooler"
            .to_owned(),
        "42P01" | "3F000" => format!(
            "this store reads the schema {schema}: has PostgresStore::migrate() (or `idem \
             migrate --store URL`) run for it? If \
             the servers keep their tables in another schema \
             (PostgresStore::builder(url)?.schema(NAME)), name it: ?schema=NAME on the store \
             URL, or `idem --schema NAME`"
        ),
        "42501" => format!(
            "the store's database user lacks a privilege: grant it USAGE on the schema {schema} \
             and SELECT, INSERT, UPDATE, DELETE on its tables (docs/deploying.md, \"Grants\"), \
             or connect as a user that has them"
        ),
        "3D000" => "the database named in the store URL does not exist: check its name".to_owned(),
        _ if code.starts_with("28") => "the server refused the store's login: check the user \
             and password in the store URL, and the server's pg_hba.conf"
            .to_owned(),
        _ => return None,
    })
}

/// An error inside a store call: the database's, or the store's verdict.
enum CallError {
    Pg(tokio_postgres::Error),
    Store(StoreError),
}

impl From<tokio_postgres::Error> for CallError {
    fn from(e: tokio_postgres::Error) -> Self {
        CallError::Pg(e)
    }
}

impl From<StoreError> for CallError {
    fn from(e: StoreError) -> Self {
        CallError::Store(e)
    }
}

/// How often a claim retries when the conflicting row vanished between its
/// insert and its read (released or purged in between), or could be taken
/// over by the time it was read (its window ended in between); each retry
/// means time passed or another caller made progress, so a handful is plenty.
const CLAIM_ROUNDS: usize = 16;

#[async_trait]
impl IdempotencyStore for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        self.with(async |db, sql| {
            let key = &req.key.as_bytes()[..];
            let (attempt, lease, window) = (
                req.attempt.get() as i64,
                micros(req.lease),
                micros(req.window),
            );
            let (retention, tag) = (micros(req.retain_for()), tag_to_column(&req.reference));
            let fingerprint = Redacted(&req.key.fingerprint()[..]);
            let bound = micros(self.bound);
            let params: [&dyn Param; 10] = [
                &key,
                &fingerprint,
                &req.tenant,
                &req.tool,
                &attempt,
                &lease,
                &window,
                &retention,
                &tag,
                &bound,
            ];
            let claimed_as = |tag: i64| Claim::Claimed {
                reference: Reference::with_tag(&req.key, tag as u64),
            };
            for _ in 0..CLAIM_ROUNDS {
                let row = db.query_one(&sql.claim, &params).await?;
                if let Some(tag) = row.try_get::<_, Option<i64>>(0)? {
                    return Ok(claimed_as(tag));
                }
                self.pauses.at(PausePoint::PostgresClaimRead).await;
                let Some(row) = db.query_opt(&sql.read, &[&key]).await? else {
                    continue;
                };
                let record = row_to_record(&row)?;
                // The insert decided at its own start; the read comes later
                // (after a wait on the row's lock, say). A record that can be
                // taken over by the time it is read is not an answer to give.
                if !record.is_claimable(record.observed_at) {
                    return Ok(Claim::Existing { record });
                }
                // Claimable: the insert left it because it must be kept
                // (Record::outlives_takeover), or its window ended since.
                // Take over the record read, keeping it if it must be; if it
                // changed meanwhile, start over.
                let read_attempt = record.attempt.get() as i64;
                let mut with_read: Vec<&dyn Param> = params[..9].to_vec();
                with_read.push(&read_attempt);
                if let Some(row) = db.query_opt(&sql.take_over, &with_read).await? {
                    let tag: Option<i64> = row.try_get(0)?;
                    return Ok(claimed_as(tag.unwrap_or(0)));
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
        let stored = Redacted(response.as_bytes());
        let turn = self.combiner.as_ref().map(|combiner| {
            let store = self.clone();
            combiner.turn(key, attempt, response, move || {
                tokio::spawn(store.write_completions());
            })
        });
        let _alone = match turn {
            None => None,
            Some(combine::Turn::Alone(alone)) => Some(alone),
            Some(combine::Turn::Queued(answer)) => {
                if answer.await == Ok(true) {
                    return Ok(());
                }
                // Not written by the batch: alone, which completes it or
                // says why not.
                return self.completion(key, attempt, &stored).await;
            }
        };
        self.completion(key, attempt, &stored).await
    }

    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        self.fenced_change(|sql| &sql.release, key, attempt, &[])
            .await
    }

    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        let note = Redacted(note.as_bytes());
        self.fenced_change(|sql| &sql.mark_unknown, key, attempt, &[&note])
            .await
    }

    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.fenced_change(|sql| &sql.heartbeat, key, attempt, &[&micros(lease)])
            .await
    }

    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        let (lo, hi) = key_range(reference);
        let tag = tag_to_column(reference);
        self.with(async |db, sql| {
            match db
                .query_opt(&sql.lookup, &[&&lo[..], &&hi[..], &tenant, &tag])
                .await?
            {
                Some(row) => Ok(Some(row_to_record(&row)?)),
                None => Ok(None),
            }
        })
        .await
    }

    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        Some(self)
    }

    // A 1 GB field and a 1 GB message: half of it for the response, so the
    // jobs fit beside it; the jobs' payloads are one array parameter of the
    // completion's message.
    fn limits(&self) -> Limits {
        Limits::NONE
            .with_max_response_bytes(512 * 1024 * 1024)
            .with_max_follow_on_bytes_per_completion(256 * 1024 * 1024)
    }
}

#[async_trait]
impl Upkeep for PostgresStore {
    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        let key = &key.as_bytes()[..];
        let note = Redacted(note.as_bytes());
        self.with(async |db, sql| {
            let params: &[&dyn Param] = &[&key, &(attempt.get() as i64), &note];
            // Ok(false): still ours and IN_PROGRESS, the lease live again.
            let in_progress = RecordStateKind::InProgress;
            fenced_unless(db, sql, &sql.mark_lapsed, key, attempt, in_progress, params).await
        })
        .await
    }

    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        let key = &key.as_bytes()[..];
        let note = Redacted(note.map(str::as_bytes));
        let a = attempt.get() as i64;
        self.with(async |db, sql| {
            let (changed, settle) = match resolution {
                Resolution::Completed { response } => {
                    let params: &[&dyn Param] = &[&key, &a, &Redacted(response.as_bytes()), &note];
                    (db.execute(&sql.resolve_completed, params).await?, None)
                }
                Resolution::NotPerformed { note: body, settle } => {
                    let params: &[&dyn Param] =
                        &[&key, &a, &Redacted(body.as_bytes()), &note, &micros(settle)];
                    (
                        db.execute(&sql.resolve_not_performed, params).await?,
                        Some(settle),
                    )
                }
            };
            if changed == 1 {
                return Ok(());
            }
            match (found(db, sql, key).await?, settle) {
                (Some((owner, RecordStateKind::Unknown, updated_at)), Some(settle))
                    if owner == attempt =>
                {
                    Err(StoreError::NotSettled {
                        until: updated_at + settle,
                    }
                    .into())
                }
                _ => Err(refusal(db, sql, key, attempt).await?.into()),
            }
        })
        .await
    }

    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
        taken: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        let key = &key.as_bytes()[..];
        self.with(async |db, sql| {
            let params: &[&dyn Param] = &[&key, &(attempt.get() as i64), &micros(delay), &taken];
            // Ok(false): still UNKNOWN, and the check taken is no longer the
            // record's.
            let unknown = RecordStateKind::Unknown;
            fenced_unless(db, sql, &sql.defer_check, key, attempt, unknown, params).await
        })
        .await
    }

    async fn take_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        hold: Duration,
    ) -> Result<Option<SystemTime>, StoreError> {
        let key = &key.as_bytes()[..];
        self.with(async |db, sql| {
            let params: &[&dyn Param] = &[&key, &(attempt.get() as i64), &micros(hold)];
            if let Some(row) = db.query_opt(&sql.take_check, params).await? {
                return Ok(Some(row.try_get(0).map_err(corrupt)?));
            }
            // Still UNKNOWN: another replica holds the check.
            match refusal(db, sql, key, attempt).await? {
                StoreError::WrongState {
                    found: RecordStateKind::Unknown,
                } => Ok(None),
                refused => Err(refused.into()),
            }
        })
        .await
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        self.with(async |db, sql| {
            // The keys' current records, then the superseded operations,
            // then the delivered jobs (kept until their record's retention
            // ends), each with what is left of the batch.
            let mut deleted: u64 = 0;
            for stmt in [&sql.purge, &sql.purge_superseded, &sql.purge_jobs] {
                let left = batch - i64::try_from(deleted).unwrap_or(batch);
                if left <= 0 {
                    break;
                }
                deleted += db.execute(stmt, &[&left]).await?;
            }
            Ok(deleted as usize)
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

#[async_trait]
impl Inspect for PostgresStore {
    /// A range over each table's primary key (the reference is the key's
    /// first eight bytes), in every tenant: no scan.
    async fn find_by_reference(&self, reference: &Reference) -> Result<Vec<Record>, StoreError> {
        let (lo, hi) = key_range(reference);
        let tag = tag_to_column(reference);
        self.with(async |db, sql| {
            let rows = db
                .query(&sql.by_reference, &[&&lo[..], &&hi[..], &tag])
                .await?;
            Ok(rows
                .iter()
                .map(row_to_record)
                .collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let state = filter.state.map(|s| s.code());
        self.with(async |db, sql| {
            let rows = db
                .query(
                    &sql.filtered,
                    &[&state, &filter.tenant, &filter.tool, &limit],
                )
                .await?;
            Ok(rows
                .iter()
                .map(row_to_record)
                .collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        self.with(async |db, sql| {
            let rows = db.query(&sql.counted, &[]).await?;
            let pairs = rows
                .iter()
                .map(|r| Ok((i64::from(r.try_get::<_, i16>(0)?), r.try_get::<_, i64>(1)?)))
                .collect::<Result<Vec<_>, tokio_postgres::Error>>()?;
            Ok(counts(pairs)?)
        })
        .await
    }
}

#[async_trait]
impl FollowOnStore for PostgresStore {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        if jobs.is_empty() {
            return self.complete(key, attempt, response).await;
        }
        let (names, payloads) = job_columns(&jobs);
        let (response, payloads) = (Redacted(response.as_bytes()), Redacted(payloads));
        let key = &key.as_bytes()[..];
        self.with(async |db, sql| {
            with_jobs(
                db,
                sql,
                &sql.complete_with_follow_ons,
                key,
                attempt,
                &[&key, &(attempt.get() as i64), &response, &names, &payloads],
            )
            .await
        })
        .await
    }

    async fn resolve_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        if jobs.is_empty() {
            let completed = Resolution::Completed { response };
            return self.resolve(key, attempt, completed, note).await;
        }
        let (names, payloads) = job_columns(&jobs);
        let (response, payloads) = (Redacted(response.as_bytes()), Redacted(payloads));
        let key = &key.as_bytes()[..];
        let note = Redacted(note.map(str::as_bytes));
        self.with(async |db, sql| {
            with_jobs(
                db,
                sql,
                &sql.resolve_with_jobs,
                key,
                attempt,
                &[
                    &key,
                    &(attempt.get() as i64),
                    &response,
                    &note,
                    &names,
                    &payloads,
                ],
            )
            .await
        })
        .await
    }

    async fn lease_follow_ons(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        attempt: Attempt,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        let Some(names) = lease_names(names, limit) else {
            return Ok(Vec::new());
        };
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut leased = self
            .with(async |db, sql| {
                let rows = db
                    .query(
                        &sql.lease_follow_ons,
                        &[&(attempt.get() as i64), &micros(lease), &names, &limit],
                    )
                    .await?;
                Ok(rows.iter().map(row_to_job).collect::<Result<Vec<_>, _>>()?)
            })
            .await?;
        sort_leased(&mut leased);
        Ok(leased)
    }

    async fn finish_follow_on(&self, id: &FollowOnId, attempt: Attempt) -> Result<(), StoreError> {
        let (lo, hi) = key_range(&id.reference);
        let tag = tag_to_column(&id.reference);
        self.with(async |db, sql| {
            let rest: [&dyn Param; 3] = [&&lo[..], &&hi[..], &tag];
            fenced_job(db, &sql.finish_follow_on, id, attempt, &rest).await
        })
        .await
    }

    async fn retry_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        let error = Redacted(error);
        self.with(async |db, sql| {
            fenced_job(
                db,
                &sql.retry_follow_on,
                id,
                attempt,
                &[&micros(delay), &error],
            )
            .await
        })
        .await
    }

    async fn bury_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        error: &str,
    ) -> Result<(), StoreError> {
        let error = Redacted(error);
        self.with(async |db, sql| fenced_job(db, &sql.bury_follow_on, id, attempt, &[&error]).await)
            .await
    }

    async fn list_follow_ons(
        &self,
        filter: &FollowOnFilter,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let reference = filter.reference.map(|r| r.as_bytes().to_vec());
        let states = filter.state_mask().map(i64::from);
        self.with(async |db, sql| {
            let rows = db
                .query(
                    &sql.jobs_filtered,
                    &[&filter.tenant, &reference, &filter.name, &states, &limit],
                )
                .await?;
            Ok(rows.iter().map(row_to_job).collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError> {
        let reference = id.reference.as_bytes();
        self.with(async |db, sql| {
            let changed = db
                .execute(&sql.redrive_follow_on, &[&id.tenant, &reference, &id.name])
                .await?;
            Ok(changed == 1)
        })
        .await
    }

    async fn count_due_follow_ons(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        self.with(async |db, sql| {
            let rows = db.query(&sql.count_due_follow_ons, &[]).await?;
            let mut due = BTreeMap::new();
            for row in rows {
                let (name, n): (String, i64) = (row.try_get(0)?, row.try_get(1)?);
                due.insert(name, u64::try_from(n).unwrap_or(0));
            }
            Ok(due)
        })
        .await
    }
}

impl PostgresStore {
    /// A fenced change of `key`'s record by `attempt`: the statement `which`
    /// picks, with `$1` the key, `$2` the attempt, then `rest` (a response, a
    /// note, a lease or a delay in µs).
    async fn fenced_change(
        &self,
        which: fn(&Statements) -> &String,
        key: &IdempotencyKey,
        attempt: Attempt,
        rest: &[&dyn Param],
    ) -> Result<(), StoreError> {
        let (key, fence) = (&key.as_bytes()[..], attempt.get() as i64);
        let mut params: Vec<&dyn Param> = vec![&key, &fence];
        params.extend_from_slice(rest);
        self.with(async |db, sql| fenced(db, sql, which(sql), key, attempt, &params).await)
            .await
    }

    /// A completion alone (migration 9's function, which answers how many
    /// records it completed), refused as [`fenced`] refuses.
    async fn completion(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &Redacted<&[u8]>,
    ) -> Result<(), StoreError> {
        let (key, fence) = (&key.as_bytes()[..], attempt.get() as i64);
        self.with(async |db, sql| {
            let row = db
                .query_one(&sql.complete, &[&key, &fence, response])
                .await?;
            if row.try_get::<_, i32>(0)? == 1 {
                Ok(())
            } else {
                Err(refusal(db, sql, key, attempt).await?.into())
            }
        })
        .await
    }

    async fn list(
        &self,
        which: fn(&Statements) -> &String,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.with(async |db, sql| {
            let rows = db.query(which(sql), &[&limit]).await?;
            Ok(rows
                .iter()
                .map(row_to_record)
                .collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }
}
