//! The store `--store` names (with `--schema`), opened as a server would
//! open it, or refused with what to give instead.

use std::path::Path;
use std::sync::Arc;

use super::{Failure, EXIT_USAGE};
use crate::store::{open_store, IdempotencyStore};

/// The store at `url`, in the PostgreSQL `schema` when one is given; never
/// a memory store (it lives inside its server) nor a SQLite file that is
/// not there.
pub(super) async fn open(
    url: &str,
    schema: Option<&str>,
) -> Result<Arc<dyn IdempotencyStore>, Failure> {
    if let Some(schema) = schema {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(Failure(
                EXIT_USAGE,
                format!(
                    "--schema {schema:?} names a PostgreSQL schema, and {url:?} is not a \
                     PostgreSQL store; leave --schema out, or give the postgres:// URL"
                ),
            ));
        }
        if url.contains("?schema=") || url.contains("&schema=") {
            return Err(Failure(
                EXIT_USAGE,
                format!(
                    "{url:?} names a schema already; give it once, with --schema or with \
                     ?schema= on the URL"
                ),
            ));
        }
        let joiner = if url.contains('?') { '&' } else { '?' };
        return Ok(open_store(&format!("{url}{joiner}schema={schema}")).await?);
    }
    if url == "memory" {
        return Err(Failure(
            EXIT_USAGE,
            "a memory store lives inside its server's process; point --store at the \
             server's durable store (sqlite:PATH, postgres://…, redis://…)"
                .to_owned(),
        ));
    }
    // Opening a mistyped path would create an empty database, and every
    // answer from it would be wrong.
    if let Some(path) = url.strip_prefix("sqlite:") {
        if !Path::new(path).is_file() {
            return Err(Failure(
                EXIT_USAGE,
                format!("no SQLite database at {path:?}; give the path the server uses"),
            ));
        }
    }
    Ok(open_store(url).await?)
}
