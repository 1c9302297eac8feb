//! [`SqliteStoreBuilder`]: how durable a completion's commit is, and the
//! opening of the database on its writer thread.

use std::path::{Path, PathBuf};
use std::sync::mpsc;

use rusqlite::Connection;
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
}

impl Default for SqliteStoreBuilder {
    fn default() -> Self {
        SqliteStoreBuilder {
            relaxed_completions: true,
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

    /// Opens (creating if needed) the database at `path`, as
    /// [`SqliteStore::open`] does.
    pub async fn open(self, path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let path = path.as_ref().to_path_buf();
        let p = path.clone();
        self.start(move || Connection::open(&p), Some(path)).await
    }

    /// A private in-memory database, as [`SqliteStore::open_in_memory`].
    pub async fn open_in_memory(self) -> Result<SqliteStore, StoreError> {
        self.start(Connection::open_in_memory, None).await
    }

    /// Starts the writer thread on the connection `open` makes, once the
    /// schema is applied: the store, or why it could not start.
    async fn start(
        self,
        open: impl FnOnce() -> rusqlite::Result<Connection> + Send + 'static,
        path: Option<PathBuf>,
    ) -> Result<SqliteStore, StoreError> {
        let (to_writer, rx) = mpsc::channel::<Item>();
        let (ready, ready_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("idem-sqlite".into())
            .spawn(move || {
                let conn = match open().and_then(|c| init(&c).map(|()| c)) {
                    Ok(conn) => {
                        let _ = ready.send(Ok(()));
                        conn
                    }
                    Err(e) => {
                        let _ = ready.send(Err(unavailable(&e)));
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
