//! `create-table`: the DynamoDB table a store needs, made before any server
//! opens it.

use serde_json::json;

use crate::escape::shown;
use crate::render::json_text;
use crate::{Failure, EXIT_UNREACHABLE, EXIT_USAGE};
use idem_runtime::store::{open_store, StoreError};

/// `create-table`: the DynamoDB table `url` names, created with its
/// indexes and TTL, or, when it exists, migrated to this version's indexes
/// (`DynamoDbStore::migrate`), through `open_store`'s `create=true`.
pub(super) async fn create_table(url: &str, json: bool) -> Result<String, Failure> {
    let Some(rest) = url.strip_prefix("dynamodb://") else {
        return Err(Failure(
            EXIT_USAGE,
            format!(
                "create-table makes a DynamoDB table, and {url:?} is not a dynamodb:// URL; \
                 `idem migrate` creates or migrates a SQLite file or a PostgreSQL schema"
            ),
        ));
    };
    let table = rest.split(['?', '/']).next().unwrap_or_default().to_owned();
    let joiner = if url.contains('?') { '&' } else { '?' };
    let url = if url.contains("create=") {
        url.to_owned()
    } else {
        format!("{url}{joiner}create=true")
    };
    open_store(&url).await.map_err(|e| match e {
        StoreError::Unavailable(_) => Failure(
            EXIT_UNREACHABLE,
            format!(
                "{e}\nthe table is left as far as DynamoDB got with it, and earlier replicas \
                 serve it meanwhile: run create-table again, which goes on from there; if \
                 DynamoDB did not answer, check the endpoint, the region and the network"
            ),
        ),
        e => e.into(),
    })?;
    Ok(if json {
        json_text(&json!({ "table": table, "active": true }))
    } else {
        format!(
            "the DynamoDB table {:?} exists and is active, with its indexes and TTL\n",
            shown(&table)
        )
    })
}
