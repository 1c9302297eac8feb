//! [`SqliteStoreBuilder`]: how durable a completion's commit is, and the
//! opening of the database on its writer thread.

use std::path::{Path, PathBuf};
use std::sync::mpsc;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

use super::writer::{init, unavailable, writer, Item};
use super::SqliteStore;
use crate::store::StoreError;

/// Configures a [`SqliteStore`]: how durable a completion's commit is.
///
/// ```no_run
/// # async fn f() -> Result<(), idem_runtime::StoreError> {
/// let store = idem_runtime::SqliteStore::builder()
///     .relaxed_completions(false)
///     .open("idem.sqlite3")
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct SqliteStoreBuilder {
    relaxed_completions: bool,
    migrate: bool,
}

impl Default for SqliteStoreBuilder {
    fn default() -> Self {
        SqliteStoreBuilder {
            relaxed_completions: true,
            migrate: true,
        }
    }
}

impl SqliteStoreBuilder {
    /// Whether a batch of the writer that holds only completions
    /// (`complete`, `complete_with_follow_ons`) commits with
    /// `synchronous = NORMAL` (default `true`) instead of `FULL`.
    ///
    /// A claim, and every other change, always commits with `FULL`. What a
    /// relaxed completion risks: an OS crash or a power cut (not a crash of
    /// the process) may lose the last completions; each such record is
    /// IN_PROGRESS again, answered "in progress" until its lease lapses, then
    /// UNKNOWN until the reconciler (or an operator) finds the effect. The
    /// handler never runs a second time.
    pub fn relaxed_completions(mut self, relaxed: bool) -> Self {
        self.relaxed_completions = relaxed;
        self
    }

    /// Whether opening applies the shipped migrations the database lacks
    /// (default `true`), creating the file if it is not there.
    ///
    /// With `false` the database is only opened, and refused when it is
    /// not there or lacks one of this version's migrations
    /// ([`StoreError::Config`], naming `idem migrate`); the file is left
    /// as it was. That is what the `idem` command line does, and what a
    /// server does whose deploy migrates in a step of its own (`idem
    /// migrate --store sqlite:PATH`, or `sqlite:PATH?migrate=false` for
    /// `open_store`). A database migrated further, by a later version, is
    /// served as it is: each migration only adds what the version before
    /// it does not know (docs/deploying.md, "Upgrading").
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Opens the database at `path`, as [`SqliteStore::open`] does
    /// (creating and migrating it unless [`migrate`](Self::migrate) is off).
    pub async fn open(self, path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let p = path.clone();
        if self.migrate {
            let open = move || Connection::open(&p).map_err(|e| unavailable(&e));
            return self.start(open, Some(path)).await;
        }
        // Without the CREATE flag: a mistyped path is refused, not made
        // into an empty database.
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let shown = path.display().to_string();
        let open = move || {
            Connection::open_with_flags(&p, flags).map_err(|e| match e.sqlite_error_code() {
                Some(rusqlite::ErrorCode::CannotOpen) => StoreError::Config(format!(
                    "no SQLite database at {shown:?}: give the path the server uses, or \
                     create and migrate it with `idem migrate --store sqlite:PATH`"
                )),
                _ => unavailable(&e),
            })
        };
        self.start(open, Some(path)).await
    }

    /// A private in-memory database, as [`SqliteStore::open_in_memory`].
    pub async fn open_in_memory(self) -> Result<SqliteStore, StoreError> {
        let open = || Connection::open_in_memory().map_err(|e| unavailable(&e));
        self.start(open, None).await
    }

    /// Starts the writer thread on the connection `open` makes, once the
    /// schema is applied: the store, or why it could not start.
    async fn start(
        self,
        open: impl FnOnce() -> Result<Connection, StoreError> + Send + 'static,
        path: Option<PathBuf>,
    ) -> Result<SqliteStore, StoreError> {
        let (to_writer, rx) = mpsc::channel::<Item>();
        let (migrate, shown) = (self.migrate, path.as_ref().map(|p| p.display().to_string()));
        let (ready, ready_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("idem-sqlite".into())
            .spawn(move || {
                let shown = shown.as_deref().unwrap_or(":memory:");
                let conn = match open().and_then(|c| init(&c, migrate, shown).map(|()| c)) {
                    Ok(conn) => {
                        let _ = ready.send(Ok(()));
                        conn
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e));
                        return;
                    }
                };
                writer(conn, rx);
            })
            .map_err(|e| StoreError::Unavailable(format!("cannot start the SQLite thread: {e}")))?;
        ready_rx.await.map_err(|_| {
            StoreError::Unavailable("the SQLite thread stopped while opening".into())
        })??;
        Ok(SqliteStore {
            writer: to_writer,
            path,
            relaxed_completions: self.relaxed_completions,
        })
    }
}
