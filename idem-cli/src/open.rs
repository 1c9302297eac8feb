//! The store `--store` names (with `--schema`), opened as a server that
//! does not migrate would open it (its layout left as it is), or refused
//! with what to give instead.

use std::sync::Arc;

use crate::{Failure, EXIT_USAGE};
use idem_runtime::store::{open_store, IdempotencyStore};

/// The store at `url`, in the PostgreSQL `schema` when one is given; never
/// a memory store (it lives inside its server), a SQLite file that is not
/// there, nor a SQL store that lacks one of this version's migrations
/// (the error names `idem migrate`): only `migrate` changes a layout.
pub(super) async fn open(
    url: &str,
    schema: Option<&str>,
) -> Result<Arc<dyn IdempotencyStore>, Failure> {
    let url = store_url(url, schema)?;
    let sql = url.starts_with("sqlite:")
        || url.starts_with("postgres://")
        || url.starts_with("postgresql://");
    let url = if sql {
        with_param(&url, "migrate=false")
    } else {
        url
    };
    Ok(open_store(&url).await?)
}

/// `url` with the query parameter `param` (`name=value`) added; the last
/// one given wins, so it overrides one the operator gave.
pub(super) fn with_param(url: &str, param: &str) -> String {
    let joiner = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joiner}{param}")
}

/// The store URL `url` and `--schema` give together, or why they do not.
pub(super) fn store_url(url: &str, schema: Option<&str>) -> Result<String, Failure> {
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
        return Ok(with_param(url, &format!("schema={schema}")));
    }
    if url == "memory" {
        return Err(Failure(
            EXIT_USAGE,
            "a memory store lives inside its server's process; point --store at the \
             server's durable store (sqlite:PATH, postgres://…, redis://…)"
                .to_owned(),
        ));
    }
    Ok(url.to_owned())
}
