//! The writer thread: one connection, batches of items in one transaction
//! each (a group commit), and the pragmas and migrations it applies first.

use super::*;

/// One unit of work for the writer: runs its statements inside the batch's
/// transaction (or learns that the batch failed before its turn, and runs
/// nothing), and returns what to do once the batch's commit succeeded or
/// failed, and whether SQLite itself failed one of its statements.
pub(super) type Work = Box<dyn FnOnce(Result<&Connection, &str>) -> (Finish, bool) + Send>;
pub(super) type Finish = Box<dyn FnOnce(Result<(), &str>) + Send>;

/// A [`Work`] and how durable its commit must be.
pub(super) struct Item {
    /// The work may commit with `synchronous = NORMAL`: a completion (with
    /// its follow-ons) of a store built with relaxed completions. A batch
    /// commits relaxed only if every one of its items is relaxed; one claim
    /// (or any other change) makes the whole batch FULL.
    pub(super) relaxed: bool,
    pub(super) work: Work,
}

/// At most this many items share one transaction: bounds how long one batch
/// holds the file lock against other processes.
pub(super) const MAX_BATCH: usize = 256;

/// How long a statement waits for another process's lock before the call
/// fails as `Unavailable`.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The schema, one entry per version; `PRAGMA user_version` says how many ran.
pub(super) const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/sqlite/0001_records.sql"),
    include_str!("../../../migrations/sqlite/0002_lifecycle.sql"),
    include_str!("../../../migrations/sqlite/0003_outbox.sql"),
    include_str!("../../../migrations/sqlite/0004_operations.sql"),
    include_str!("../../../migrations/sqlite/0005_delivered_jobs.sql"),
    // The superseded operations' table, and the purge's index on
    // retain_until (a COMPLETED record now lives until its retention, its
    // window only holds the key). Records written before it whose
    // expires_at a late completion or resolution moved to their
    // retain_until cannot be told apart from a business key's records
    // (whose window is their retention): they keep their key until their
    // retention ends.
    include_str!("../../../migrations/sqlite/0006_superseded.sql"),
    // A job's runs and last error from before its last re-drive.
    include_str!("../../../migrations/sqlite/0007_redrives.sql"),
    // The column of a job's runs is `attempts` again, as the version
    // before 7 reads and writes it (7 renamed it, and so broke that
    // version's replicas during a rolling deploy).
    include_str!("../../../migrations/sqlite/0008_attempts_again.sql"),
];

pub(super) fn stopped() -> StoreError {
    StoreError::Unavailable("the SQLite writer thread has stopped".into())
}

pub(super) fn unavailable(e: &rusqlite::Error) -> StoreError {
    StoreError::Unavailable(format!("SQLite: {e}"))
}

/// Pragmas and migrations, on the writer thread before it serves; with
/// `migrate` off, the check that the database at `path` (as shown in
/// errors) has every shipped migration instead, made before anything is
/// written to it.
pub(super) fn init(conn: &Connection, migrate: bool, path: &str) -> Result<(), StoreError> {
    let failed = |e: rusqlite::Error| unavailable(&e);
    conn.busy_timeout(BUSY_TIMEOUT).map_err(failed)?;
    if !migrate {
        let done: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(failed)?;
        let needed = MIGRATIONS.len() as i64;
        if done < needed {
            return Err(StoreError::Config(format!(
                "the SQLite database {path:?} is at layout {done}, and this version of idem \
                 serves layout {needed}: run `idem migrate --store sqlite:{path}` (or open it \
                 with migrations on: SqliteStore::open, or sqlite:PATH without \
                 migrate=false); replicas of the version before keep serving it meanwhile, \
                 and this one serves it once migrated"
            )));
        }
    }
    // WAL: readers of other processes never block the writer, and a commit
    // appends to one file. In-memory databases answer "memory"; that is fine.
    let _mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(failed)?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(failed)?;
    if !migrate {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE").map_err(failed)?;
    let migrated = (|| {
        let done: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(done.max(0) as usize) {
            conn.execute_batch(sql)?;
            conn.pragma_update(None, "user_version", (i + 1) as i64)?;
        }
        Ok(())
    })();
    match migrated {
        Ok(()) => conn.execute_batch("COMMIT").map_err(failed),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(failed(e))
        }
    }
}

/// The writer loop: one batch of waiting items per transaction, answers after
/// the commit. Ends when every [`SqliteStore`] clone is dropped.
///
/// A batch is all or nothing. A statement that SQLite fails (disk full, an
/// I/O error) may have made SQLite roll the transaction back on its own, after
/// which later statements would each commit by themselves; so once one item
/// fails, the items after it run nothing, the batch is rolled back, and every
/// item of it is answered `Unavailable`.
///
/// Durability, per batch: `synchronous = FULL` (the commit is on disk before
/// any item of the batch is answered) unless every item of the batch is a
/// relaxed completion ([`Item::relaxed`]); then `NORMAL`, under which a WAL
/// commit survives the process's crash but not the machine's. The pragma
/// is switched outside the transaction, and only when it changes. A FULL
/// commit syncs the WAL up to itself, so it also makes every earlier
/// NORMAL commit durable.
pub(super) fn writer(conn: Connection, rx: mpsc::Receiver<Item>) {
    // `init` left it FULL.
    let mut relaxed_now = false;
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let relaxed = batch.iter().all(|item| item.relaxed);
        let mut failed = None;
        if relaxed != relaxed_now {
            let level = if relaxed { "NORMAL" } else { "FULL" };
            match conn.pragma_update(None, "synchronous", level) {
                Ok(()) => relaxed_now = relaxed,
                // Staying FULL is always safe; a batch that needs FULL and
                // cannot have it is not run.
                Err(e) if !relaxed => {
                    failed = Some(format!("SQLite: cannot set synchronous = FULL: {e}"))
                }
                Err(_) => {}
            }
        }
        if failed.is_none() {
            failed = conn
                .execute_batch("BEGIN IMMEDIATE")
                .err()
                .map(|e| format!("SQLite: cannot begin a transaction: {e}"));
        }
        let began = failed.is_none();
        let mut finishes: Vec<Finish> = Vec::with_capacity(batch.len());
        for Item { work, .. } in batch {
            let turn = match &failed {
                None => Ok(&conn),
                Some(reason) => Err(reason.as_str()),
            };
            // A panicking item must not take the thread (and the store) down
            // with it: the batch fails instead.
            let (finish, sqlite_failed) =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(turn)))
                    .unwrap_or_else(|_| (Box::new(|_| ()), true));
            finishes.push(finish);
            if failed.is_none() && (sqlite_failed || conn.is_autocommit()) {
                failed = Some(
                    "SQLite failed a statement of this batch; the batch was rolled back and \
                     nothing of it was written"
                        .to_owned(),
                );
            }
        }
        let committed = match failed {
            Some(reason) => {
                if began && !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                Err(reason)
            }
            None => conn.execute_batch("COMMIT").map_err(|e| {
                let _ = conn.execute_batch("ROLLBACK");
                format!("SQLite: the commit failed, nothing was written: {e}")
            }),
        };
        for finish in finishes {
            finish(committed.as_ref().map(|_| ()).map_err(String::as_str));
        }
    }
}
