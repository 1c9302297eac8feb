//! A store from a URL, as servers and the operator's command line take it.

use std::sync::Arc;

use super::{IdempotencyStore, MemoryStore, StoreError};

/// Opens the store a URL names:
///
/// - `memory`: a new, empty [`MemoryStore`];
/// - `sqlite:PATH`: the SQLite database at `PATH`, created (and migrated)
///   if absent (feature `sqlite`);
/// - `postgres://…` or `postgresql://…`: a PostgreSQL database, connected
///   and checked to answer; not migrated (feature `postgres`);
/// - `redis://…`, `rediss://…` or `redis+unix://…`: one Redis or Valkey
///   server, keys under the prefix `idem` (feature `redis`).
///
/// Errors: `Config` for a URL of none of these forms, or of a backend this
/// build lacks (the message names the feature); `Unavailable` when the store
/// does not answer.
pub async fn open_store(url: &str) -> Result<Arc<dyn IdempotencyStore>, StoreError> {
    let missing = |feature: &str| {
        StoreError::Config(format!(
            "{url:?} needs idem-runtime's `{feature}` feature, which this build lacks"
        ))
    };
    if url == "memory" {
        return Ok(Arc::new(MemoryStore::new()));
    }
    if let Some(path) = url.strip_prefix("sqlite:") {
        #[cfg(feature = "sqlite")]
        return Ok(Arc::new(super::SqliteStore::open(path).await?));
        #[cfg(not(feature = "sqlite"))]
        {
            let _ = path;
            return Err(missing("sqlite"));
        }
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        return Ok(Arc::new(super::PostgresStore::connect(url).await?));
        #[cfg(not(feature = "postgres"))]
        return Err(missing("postgres"));
    }
    if ["redis://", "rediss://", "redis+unix://"]
        .iter()
        .any(|scheme| url.starts_with(scheme))
    {
        #[cfg(feature = "redis")]
        return Ok(Arc::new(super::RedisStore::connect(url).await?));
        #[cfg(not(feature = "redis"))]
        return Err(missing("redis"));
    }
    let _ = missing;
    Err(StoreError::Config(format!(
        "{url:?} is not a store URL: use sqlite:PATH, postgres://USER@HOST/DB, \
         redis://HOST:PORT or memory"
    )))
}
