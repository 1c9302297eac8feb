//! `migrate`: the one command that changes a store's layout, run as a
//! deploy step before the new version's replicas start (or by whoever
//! the servers' role may not change the schema).

use serde_json::json;

use crate::escape::shown;
use crate::open::with_param;
use crate::render::json_text;
use crate::{create_table, Failure, EXIT_USAGE};
use idem_runtime::store::{open_store, RedisStore};

/// `migrate`: applies this version's migrations to the store `url` names
/// (`--schema` already joined to it), each at most once however many
/// processes run it at once: SQLite's file (created if absent) and a
/// PostgreSQL schema get the shipped migrations they lack, Redis this
/// version's function library, and a DynamoDB table is created, or given
/// this version's indexes, as `create-table` does.
pub(super) async fn migrate(url: &str, json: bool) -> Result<String, Failure> {
    if url.starts_with("dynamodb://") {
        return create_table::create_table(url, json).await;
    }
    if ["redis://", "rediss://", "redis+unix://"]
        .iter()
        .any(|scheme| url.starts_with(scheme))
    {
        let store = RedisStore::connect(url).await?;
        store.load_library().await?;
        let library = RedisStore::library_name();
        return Ok(if json {
            json_text(&json!({ "store": "redis", "library": library, "migrated": true }))
        } else {
            format!("this version's function library {library} is loaded\n")
        });
    }
    let (backend, what) = if url.starts_with("sqlite:") {
        ("sqlite", "the SQLite database")
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        ("postgres", "the PostgreSQL schema")
    } else {
        return Err(Failure(
            EXIT_USAGE,
            format!(
                "{:?} is not a store that migrates: give sqlite:PATH, postgres://…, \
                 redis://… or dynamodb://TABLE?region=R (a memory store lives inside its \
                 server)",
                shown(url)
            ),
        ));
    };
    open_store(&with_param(url, "migrate=true")).await?;
    Ok(if json {
        json_text(&json!({ "store": backend, "migrated": true }))
    } else {
        format!(
            "{what} has every migration of this version; replicas of this version and of \
             the one before it serve it\n"
        )
    })
}
