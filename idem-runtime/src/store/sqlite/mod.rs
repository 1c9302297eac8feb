//! [`SqliteStore`]: the embedded durable store, on bundled SQLite in WAL mode.
//!
//! `builder.rs` holds its settings and its opening, `statements.rs` its
//! SQL, `writer.rs` the writer thread and the schema it applies, `rows.rs`
//! how rows are read and fenced changes made, `tests.rs` the writer's
//! batches under test; this file the store and its contract.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::oneshot;

use super::sql::{
    claimable, counted, counts, expired, filtered, found_by_reference, jobs_filtered, key_range,
    looked_up, outlives_takeover, state_from, superseded_copy, superseded_replace, tag_to_column,
    takeover_operation, COLUMNS, COMPLETED, IN_PROGRESS, JOB_COLUMNS, NOT_PERFORMED, REDRIVE_SET,
    UNKNOWN,
};
use super::{
    lease_names, sort_leased, Attempt, Claim, ClaimRequest, FollowOn, FollowOnFilter, FollowOnId,
    FollowOnRecord, FollowOnStore, FollowOns, IdempotencyStore, Inspect, Limits, Record,
    RecordFilter, RecordStateKind, Resolution, StateCounts, StoreError, Upkeep,
};
use crate::key::{IdempotencyKey, Reference};
use std::collections::BTreeMap;

mod builder;
mod rows;
mod statements;
mod writer;

pub use builder::SqliteStoreBuilder;

use rows::*;
use statements::SQL;
use writer::*;

/// The embedded durable store: one SQLite database file in WAL mode, kept
/// across process restarts.
///
/// # One writer thread
///
/// The store owns one connection on one dedicated OS thread, fed by a channel;
/// async callers send it a job and await a oneshot reply, so no SQLite call
/// ever runs on (or blocks) a runtime thread. One thread rather than a
/// `spawn_blocking` pool because SQLite admits one writer per database anyway:
/// a pool would only queue on SQLite's file lock (and answer `SQLITE_BUSY`)
/// instead of on a channel. One thread also lets the writer *group-commit*:
/// it drains every item waiting in the channel, runs them in one
/// `BEGIN IMMEDIATE` transaction and commits once, so eight concurrent callers
/// share one fsync. An item's answer is sent only after its commit succeeded. A
/// batch is all or nothing: if the commit fails, or SQLite fails any
/// statement of the batch (disk full, an I/O error), the batch is rolled
/// back, nothing of it was written, and every item of it is answered
/// `Unavailable`.
///
/// A claim whose caller stopped waiting before the writer reached it (the
/// call cancelled or timed out while the claim was queued, or while the
/// writer waited on another process's write lock, up to 5 s) is skipped,
/// not applied late: its caller runs nothing under it. A statement that
/// waits on that lock longer fails the batch, `Unavailable`.
///
/// # The clock
///
/// SQLite has no server clock of its own. The writer thread reads the process
/// clock (`SystemTime::now()`) for each item, so claimed, lease and expiry
/// times come from one place per process. Several processes sharing one
/// database file each use their own clock: keep their clocks in sync (NTP), or
/// use `PostgresStore`, whose times come from the
/// database server. What a skewed process can and cannot do is
/// `DynamoDbStore`'s list (docs/clocks.md).
///
/// # Durability
///
/// `synchronous = FULL`: a commit is on disk before a claim is answered, so a
/// power cut cannot forget a claim whose side effect then ran (which would let
/// the same charge run twice after a restart).
///
/// Completions are relaxed by default
/// ([`SqliteStoreBuilder::relaxed_completions`]): a batch that holds only
/// completions commits with `synchronous = NORMAL`, which in WAL mode
/// survives a crash of the process but not of the machine (an OS crash or a
/// power cut may lose the last completions). Such a record is IN_PROGRESS
/// again after the restart; the sweep marks it UNKNOWN once its lease
/// lapses, and the reconciler finds the effect. A batch that holds anything
/// else, a claim above all, commits with FULL.
///
/// Cloning is cheap; every clone talks to the same writer thread. The thread
/// and its connection close when the last clone is dropped.
#[derive(Clone, Debug)]
pub struct SqliteStore {
    writer: mpsc::Sender<Item>,
    path: Option<PathBuf>,
    relaxed_completions: bool,
}

impl SqliteStore {
    /// A builder, for settings other than the defaults.
    pub fn builder() -> SqliteStoreBuilder {
        SqliteStoreBuilder::default()
    }

    /// Opens (creating if needed) the database at `path`, switches it to WAL
    /// mode and applies the shipped schema. Errors: `Unavailable` when the file
    /// cannot be opened or migrated.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::builder().open(path).await
    }

    /// A private in-memory database, gone when the store is dropped: for tests
    /// that want SQLite's behaviour without a file.
    pub async fn open_in_memory() -> Result<Self, StoreError> {
        Self::builder().open_in_memory().await
    }

    /// The database file, or `None` in memory.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// SQLite's plan (`EXPLAIN QUERY PLAN`) of the statement that
    /// [`find_by_reference`](crate::store::Inspect::find_by_reference) runs for
    /// `reference`, one line per step: for the tests that check it
    /// searches the tables' primary keys and scans no table.
    #[cfg(feature = "conformance")]
    #[doc(hidden)]
    pub async fn plan_of_find_by_reference(
        &self,
        reference: &Reference,
    ) -> Result<String, StoreError> {
        let (lo, hi) = key_range(reference);
        let tag = tag_to_column(reference);
        self.run(move |conn, _| {
            let explain = format!("EXPLAIN QUERY PLAN {}", SQL.by_reference);
            let mut stmt = conn.prepare(&explain).map_err(|e| unavailable(&e))?;
            let lines = stmt
                .query_map(params![&lo[..], &hi[..], tag], |r| r.get::<_, String>(3))
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(|e| unavailable(&e))?;
            Ok(lines.join("\n"))
        })
        .await
    }

    /// Runs `f` on the writer thread inside the current batch's transaction,
    /// with the process clock read for this job, and answers after the
    /// commit, a FULL one.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Connection, i64) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.run_as(false, false, f).await
    }

    /// [`run`](Self::run), with a commit that may be relaxed (see
    /// [`Item::relaxed`]) if `relaxed`; `if_awaited`: `f` runs only if its
    /// caller still waits for the answer when the writer reaches it.
    ///
    /// A caller that stopped waiting (its call cancelled, a client's
    /// timeout) while its item was queued, or while the writer waited for
    /// another connection's write lock, has been told nothing, and a claim
    /// of it would run nothing: the writer skips it rather than apply it
    /// after it was given up on. A caller that stops waiting while its
    /// item runs or commits is the executor's to retract (it releases an
    /// unconfirmed claim).
    async fn run_as<T: Send + 'static>(
        &self,
        relaxed: bool,
        if_awaited: bool,
        f: impl FnOnce(&Connection, i64) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job: Work = Box::new(move |conn| {
            if if_awaited && reply.is_closed() {
                let nobody: Finish = Box::new(|_| ());
                return (nobody, false);
            }
            let out = match conn {
                Ok(conn) => f(conn, to_nanos(SystemTime::now())),
                Err(e) => Err(StoreError::Unavailable(e.to_owned())),
            };
            // Every SQLite error is mapped to Unavailable; refusals (Fenced,
            // WrongState, NotSettled) are answers, not failures.
            let failed = matches!(out, Err(StoreError::Unavailable(_)));
            let finish: Finish = Box::new(move |commit| {
                let _ = reply.send(match commit {
                    Ok(()) => out,
                    Err(e) => Err(StoreError::Unavailable(e.to_owned())),
                });
            });
            (finish, failed)
        });
        let item = Item { relaxed, work: job };
        self.writer.send(item).map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }

    /// `complete` with its jobs in one transaction. An inherent method, so
    /// `complete` costs no second boxed future.
    async fn completed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: Vec<FollowOn>,
    ) -> Result<(), StoreError> {
        let (key, response) = (*key.as_bytes(), response.to_owned());
        self.run_as(self.relaxed_completions, false, move |conn, now| {
            // `attempt = ?2`: a worker whose claim was taken over must not
            // overwrite the new owner's record with its own response.
            fenced(conn, &key, attempt, &SQL.complete, &[&response, &now])?;
            // The same transaction: a failed insert fails the batch, and the
            // completion is rolled back with it.
            insert_jobs(conn, &key, &jobs, now)
        })
        .await
    }
}

#[async_trait]
impl IdempotencyStore for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let req = req.clone();
        // Only while its caller waits: a claim given up on is not applied.
        self.run_as(false, true, move |conn, now| {
            let key = req.key.as_bytes();
            // The writer holds the database's write lock for the batch, so no
            // other claim (of this or another process) can slip between the
            // claim and the read below.
            let fingerprint = req.key.fingerprint();
            let params = params![
                &key[..],
                &fingerprint[..],
                req.tenant,
                req.tool,
                req.attempt.get() as i64,
                now,
                now.saturating_add(nanos(req.lease)),
                now.saturating_add(nanos(req.window)),
                now.saturating_add(nanos(req.retain_for())),
                tag_to_column(&req.reference),
            ];
            let upsert = |sql: &str| {
                conn.prepare_cached(sql)
                    .and_then(|mut s| {
                        s.query_row(params, |row| row.get::<_, Option<i64>>(0))
                            .optional()
                    })
                    .map_err(|e| unavailable(&e))
            };
            let claimed = |tag: Option<i64>| {
                let reference = Reference::with_tag(&req.key, tag.unwrap_or(0) as u64);
                Ok(Claim::Claimed { reference })
            };
            if let Some(tag) = upsert(&SQL.claim)? {
                return claimed(tag);
            }
            let record = read(conn, key, now)?.ok_or_else(|| {
                // The conflict and the read run under one write lock.
                StoreError::Corrupt("a conflicting record vanished under the write lock".into())
            })?;
            if !record.is_claimable(record.observed_at) {
                return Ok(Claim::Existing { record });
            }
            // Claimable, and left by the claim because it must be kept
            // (Record::outlives_takeover): kept as a superseded operation,
            // then taken over, in the same transaction.
            conn.prepare_cached(&SQL.keep)
                .and_then(|mut s| s.execute(params))
                .map_err(|e| unavailable(&e))?;
            match upsert(&SQL.take_over)? {
                Some(tag) => claimed(tag),
                None => Err(StoreError::Corrupt(
                    "a claimable record was not taken over under the write lock".into(),
                )),
            }
        })
        .await
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        self.completed(key, attempt, response, Vec::new()).await
    }

    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        let key = *key.as_bytes();
        self.run(move |conn, _| {
            // `attempt = ?2`: a stale worker must not delete the new owner's claim.
            fenced(conn, &key, attempt, &SQL.release, &[])
        })
        .await
    }

    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        let (key, note) = (*key.as_bytes(), note.to_owned());
        self.run(move |conn, now| {
            // `attempt = ?2`: only the claim's owner (or the sweep, which read
            // the attempt) may declare its outcome unknown.
            fenced(conn, &key, attempt, &SQL.mark_unknown, &[&note, &now])
        })
        .await
    }

    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let key = *key.as_bytes();
        self.run(move |conn, now| {
            // `attempt = ?2`: a stale worker must not keep the new owner's
            // record alive.
            fenced(
                conn,
                &key,
                attempt,
                &SQL.heartbeat,
                &[&now.saturating_add(nanos(lease)), &now],
            )
        })
        .await
    }

    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        let (lo, hi) = key_range(reference);
        let tag = tag_to_column(reference);
        let tenant = tenant.to_owned();
        self.run(move |conn, now| {
            // The reference is the key's first eight bytes: a range over the
            // primary key finds it without an index of its own.
            let mut found = read_many(
                conn,
                &SQL.lookup,
                params![&lo[..], &hi[..], tenant, tag],
                now,
            )?;
            Ok(found.pop())
        })
        .await
    }

    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        Some(self)
    }

    // SQLITE_MAX_LENGTH (1e9 bytes, the bundled build's default) for a row, less 1 MB.
    fn limits(&self) -> Limits {
        Limits::NONE.with_max_response_bytes(999_000_000)
    }
}

#[async_trait]
impl Upkeep for SqliteStore {
    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        let (key, note) = (*key.as_bytes(), note.to_owned());
        self.run(move |conn, now| {
            let params: &[&dyn rusqlite::ToSql] =
                &[&&key[..], &(attempt.get() as i64), &note, &now];
            // Ok(false): still ours and IN_PROGRESS, the lease live again.
            let in_progress = RecordStateKind::InProgress;
            fenced_unless(conn, &key, attempt, in_progress, &SQL.mark_lapsed, params)
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
        let key = *key.as_bytes();
        let note = note.map(str::to_owned);
        let (body, settle) = match resolution {
            Resolution::Completed { response } => (response.to_owned(), None),
            Resolution::NotPerformed { note, settle } => (note.to_owned(), Some(nanos(settle))),
        };
        self.run(move |conn, now| {
            let a = attempt.get() as i64;
            let changed = match settle {
                None => change(
                    conn,
                    &SQL.resolve_completed,
                    &[&&key[..], &a, &body, &note, &now],
                )?,
                Some(settle) => change(
                    conn,
                    &SQL.resolve_not_performed,
                    &[
                        &&key[..],
                        &a,
                        &body,
                        &note,
                        &now,
                        &now.saturating_sub(settle),
                    ],
                )?,
            };
            if changed == 1 {
                return Ok(());
            }
            match (found(conn, &key)?, settle) {
                (Some((owner, RecordStateKind::Unknown, updated_at)), Some(settle))
                    if owner == attempt =>
                {
                    Err(StoreError::NotSettled {
                        until: from_nanos(updated_at.saturating_add(settle)),
                    })
                }
                _ => Err(refusal(conn, &key, attempt)),
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
        let key = *key.as_bytes();
        self.run(move |conn, now| {
            let params: &[&dyn rusqlite::ToSql] = &[
                &&key[..],
                &(attempt.get() as i64),
                &now.saturating_add(nanos(delay)),
                &taken.map(to_nanos),
            ];
            // Ok(false): still UNKNOWN, and the check taken is no longer the
            // record's.
            let unknown = RecordStateKind::Unknown;
            fenced_unless(conn, &key, attempt, unknown, &SQL.defer_check, params)
        })
        .await
    }

    async fn take_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        hold: Duration,
    ) -> Result<Option<SystemTime>, StoreError> {
        let key = *key.as_bytes();
        self.run(move |conn, now| {
            let until = now.saturating_add(nanos(hold));
            let params: &[&dyn rusqlite::ToSql] =
                &[&&key[..], &(attempt.get() as i64), &until, &now];
            // Not taken: still UNKNOWN, and another replica holds the check.
            let unknown = RecordStateKind::Unknown;
            let taken = fenced_unless(conn, &key, attempt, unknown, &SQL.take_check, params)?;
            Ok(taken.then(|| from_nanos(until)))
        })
        .await
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        self.run(move |conn, now| {
            // `retain_until <= now` comes first so the index on retain_until
            // finds the candidates; the rest is Record::is_expired. The keys'
            // current records, then the superseded operations, then the
            // delivered jobs (kept until their record's retention ends), each
            // with what is left of the batch.
            let mut deleted = 0;
            for sql in [&SQL.purge, &SQL.purge_superseded, &SQL.purge_jobs] {
                let left = batch - i64::try_from(deleted).unwrap_or(batch);
                deleted += conn
                    .prepare_cached(sql)
                    .and_then(|mut s| s.execute(params![now, left]))
                    .map_err(|e| unavailable(&e))?;
            }
            Ok(deleted)
        })
        .await
    }

    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn, now| read_many(conn, &SQL.lapsed, params![now, limit], now))
            .await
    }

    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn, now| read_many(conn, &SQL.unknown, params![now, limit], now))
            .await
    }
}

#[async_trait]
impl Inspect for SqliteStore {
    /// A range over each table's primary key (the reference is the key's
    /// first eight bytes), in every tenant: no scan.
    async fn find_by_reference(&self, reference: &Reference) -> Result<Vec<Record>, StoreError> {
        let (lo, hi) = key_range(reference);
        let tag = tag_to_column(reference);
        self.run(move |conn, now| {
            read_many(conn, &SQL.by_reference, params![&lo[..], &hi[..], tag], now)
        })
        .await
    }

    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let state = filter.state.map(|s| s.code());
        let (tenant, tool) = (filter.tenant.clone(), filter.tool.clone());
        self.run(move |conn, now| {
            read_many(
                conn,
                &SQL.filtered,
                params![state, tenant, tool, limit],
                now,
            )
        })
        .await
    }

    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        self.run(|conn, _| {
            let mut stmt = conn
                .prepare_cached(&SQL.counted)
                .map_err(|e| unavailable(&e))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)))
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(|e| unavailable(&e))?;
            counts(rows)
        })
        .await
    }
}

#[async_trait]
impl FollowOnStore for SqliteStore {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        self.completed(key, attempt, response, jobs.to_vec()).await
    }

    async fn resolve_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        let (key, body, jobs) = (*key.as_bytes(), response.to_owned(), jobs.to_vec());
        let note = note.map(str::to_owned);
        self.run(move |conn, now| {
            fenced(
                conn,
                &key,
                attempt,
                &SQL.resolve_completed,
                &[&body, &note, &now],
            )?;
            insert_jobs(conn, &key, &jobs, now)
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
        let names = serde_json::to_string(&names)
            .map_err(|e| StoreError::Invalid(format!("job names: {e}")))?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.run(move |conn, now| {
            let mut leased = read_jobs(
                conn,
                &SQL.lease_follow_ons,
                params![
                    attempt.get() as i64,
                    now.saturating_add(nanos(lease)),
                    now,
                    names,
                    limit
                ],
            )?;
            sort_leased(&mut leased);
            Ok(leased)
        })
        .await
    }

    async fn finish_follow_on(&self, id: &FollowOnId, attempt: Attempt) -> Result<(), StoreError> {
        let id = id.clone();
        let (lo, hi) = key_range(&id.reference);
        let tag = tag_to_column(&id.reference);
        self.run(move |conn, now| {
            let rest: [&dyn rusqlite::ToSql; 4] = [&now, &&lo[..], &&hi[..], &tag];
            fenced_job(conn, &SQL.finish_follow_on, &id, attempt, &rest)
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
        let (id, error) = (id.clone(), error.to_owned());
        self.run(move |conn, now| {
            let at = now.saturating_add(nanos(delay));
            fenced_job(
                conn,
                &SQL.retry_follow_on,
                &id,
                attempt,
                &[&at, &error, &now],
            )
        })
        .await
    }

    async fn bury_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        error: &str,
    ) -> Result<(), StoreError> {
        let (id, error) = (id.clone(), error.to_owned());
        self.run(move |conn, now| {
            fenced_job(conn, &SQL.bury_follow_on, &id, attempt, &[&error, &now])
        })
        .await
    }

    async fn list_follow_ons(
        &self,
        filter: &FollowOnFilter,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let (tenant, name) = (filter.tenant.clone(), filter.name.clone());
        let reference = filter.reference.map(|r| r.as_bytes().to_vec());
        let states = filter.state_mask().map(i64::from);
        self.run(move |conn, _| {
            read_jobs(
                conn,
                &SQL.jobs_filtered,
                params![tenant, reference, name, states, limit],
            )
        })
        .await
    }

    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError> {
        let id = id.clone();
        self.run(move |conn, now| {
            let changed = change(
                conn,
                &SQL.redrive_follow_on,
                &[&id.tenant, &id.reference.as_bytes(), &id.name, &now],
            )?;
            Ok(changed == 1)
        })
        .await
    }

    async fn count_due_follow_ons(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        self.run(|conn, now| {
            let mut stmt = conn
                .prepare_cached(&SQL.count_due_follow_ons)
                .map_err(|e| unavailable(&e))?;
            let rows = stmt
                .query_map([now], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(|e| unavailable(&e))?;
            Ok(rows
                .into_iter()
                .map(|(name, n)| (name, u64::try_from(n).unwrap_or(0)))
                .collect())
        })
        .await
    }
}

// Needs the conformance helpers: `cargo test --workspace` turns them on.
#[cfg(all(test, feature = "conformance"))]
mod tests;
