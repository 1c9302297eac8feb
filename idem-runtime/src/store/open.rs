//! A store from a URL, as servers and the operator's command line take it.

use std::sync::Arc;

use super::{IdempotencyStore, MemoryStore, StoreError};

/// Opens the store a URL names:
///
/// - `memory`: a new, empty [`MemoryStore`];
/// - `sqlite:PATH`: the SQLite database at `PATH`, created if absent and
///   migrated (feature `sqlite`); with `?migrate=false`, only opened: a
///   file that is not there, or not migrated to this version's layout, is
///   refused (`Config`, naming `idem migrate`) and left as it is
///   (`SqliteStoreBuilder::migrate`);
/// - `postgres://…` or `postgresql://…`: a PostgreSQL database, connected
///   and checked to answer; not migrated (feature `postgres`). The tables
///   are in the schema `public` unless the URL names another with the
///   parameter `schema` (`postgres://app@db/app?schema=idem`, what the
///   builder's `schema` sets); the parameter is taken out before the rest
///   is parsed as a PostgreSQL connection string. So are
///   `relaxed_completions=false` (or `true`, the default), what the
///   builder's `relaxed_completions` sets, `direct=true` (or `false`, the
///   default), what its `direct_connection` sets (leave it out behind a
///   transaction pooler such as PgBouncer), `migrate=true`, which
///   applies the shipped migrations before the store is returned
///   (`PostgresStore::migrate`), and `migrate_timeout=SECONDS`, how long
///   that may take (10 minutes by default); without `migrate=true` (or
///   with `migrate=false`) a schema not migrated to this version's layout
///   is refused (`Config`, naming `idem migrate`;
///   `PostgresStore::check_layout`);
/// - `redis://…`, `rediss://…` or `redis+unix://…`: one Redis or Valkey
///   server, keys under the prefix `idem` (feature `redis`);
/// - `dynamodb://TABLE?region=REGION&endpoint=URL`: a DynamoDB table,
///   checked to exist (feature `dynamodb`); with `create=true`, created
///   first if absent, as `DynamoDbStore::create_table` does (the indexes
///   and the TTL; an existing table is left as it is). The region may
///   come from `AWS_REGION` instead, the endpoint is AWS's for the region
///   unless given (an emulator's: `endpoint=http://127.0.0.1:4567`), and
///   the credentials come from `AWS_ACCESS_KEY_ID`,
///   `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN` (no profiles or
///   instance roles: build a client with aws-config and use
///   `DynamoDbStore::builder` for those).
#[cfg_attr(
    feature = "postgres",
    doc = "
The PostgreSQL parameters are the builder's
[`schema`](crate::store::PostgresStoreBuilder::schema),
[`relaxed_completions`](crate::store::PostgresStoreBuilder::relaxed_completions) and
[`direct_connection`](crate::store::PostgresStoreBuilder::direct_connection) and
[`migrate_timeout`](crate::store::PostgresStoreBuilder::migrate_timeout) (in
seconds), and `migrate=true` runs
[`PostgresStore::migrate`](crate::PostgresStore::migrate)."
)]
#[cfg_attr(
    feature = "dynamodb",
    doc = "
A DynamoDB table is created as
[`DynamoDbStore::create_table`](crate::DynamoDbStore::create_table) creates it,
and a client of your own goes to
[`DynamoDbStore::builder`](crate::DynamoDbStore::builder)."
)]
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
        {
            let (path, migrate) = take_param(path, "migrate");
            let migrate = match migrate {
                Some(value) => parse_bool("migrate", &value)?,
                None => true,
            };
            let builder = super::SqliteStore::builder().migrate(migrate);
            return Ok(Arc::new(builder.open(path).await?));
        }
        #[cfg(not(feature = "sqlite"))]
        {
            let _ = path;
            return Err(missing("sqlite"));
        }
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        {
            let (url, schema) = take_schema(url);
            let (url, relaxed) = take_param(&url, "relaxed_completions");
            let (url, direct) = take_param(&url, "direct");
            let (url, migrate) = take_param(&url, "migrate");
            let (url, migrate_timeout) = take_param(&url, "migrate_timeout");
            let mut builder = super::PostgresStore::builder(&url)?;
            if let Some(schema) = schema {
                builder = builder.schema(schema);
            }
            if let Some(relaxed) = relaxed {
                builder = builder.relaxed_completions(parse_bool("relaxed_completions", &relaxed)?);
            }
            if let Some(direct) = direct {
                builder = builder.direct_connection(parse_bool("direct", &direct)?);
            }
            if let Some(seconds) = migrate_timeout {
                builder = builder.migrate_timeout(parse_seconds("migrate_timeout", &seconds)?);
            }
            let migrate = migrate.map(|m| parse_bool("migrate", &m)).transpose()?;
            let store = super::PostgresStore::connect_with(builder).await?;
            if migrate == Some(true) {
                store.migrate().await?;
            } else {
                store.check_layout().await?;
            }
            return Ok(Arc::new(store));
        }
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
    if url.starts_with("dynamodb://") {
        #[cfg(feature = "dynamodb")]
        {
            let (url, create) = take_param(url, "create");
            let create = match create {
                Some(value) => parse_bool("create", &value)?,
                None => false,
            };
            if !create {
                return Ok(Arc::new(super::dynamodb::open_url(&url).await?));
            }
            let store = super::DynamoDbStore::from_url(&url)?.build()?;
            store.create_table().await?;
            return Ok(Arc::new(store));
        }
        #[cfg(not(feature = "dynamodb"))]
        return Err(missing("dynamodb"));
    }
    let _ = missing;
    Err(StoreError::Config(format!(
        "{url:?} is not a store URL: use sqlite:PATH, postgres://USER@HOST/DB, \
         redis://HOST:PORT, dynamodb://TABLE?region=REGION or memory"
    )))
}

/// `url` without its `schema=NAME` query parameter, and the name: the
/// schema is idem's setting, which tokio-postgres would refuse as an unknown
/// option. The last `schema` given wins, as for the other parameters.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn take_schema(url: &str) -> (String, Option<String>) {
    take_param(url, "schema")
}

/// `true` or `false`, as the URL parameter `name` of idem's gives it.
#[cfg_attr(
    not(any(feature = "postgres", feature = "dynamodb", feature = "sqlite")),
    allow(dead_code)
)]
fn parse_bool(name: &str, value: &str) -> Result<bool, StoreError> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        other => Err(StoreError::Config(format!(
            "{name}={other}: use true or false"
        ))),
    }
}

/// A URL parameter `name` that is a duration in seconds (`600`, `0.5`).
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn parse_seconds(name: &str, value: &str) -> Result<std::time::Duration, StoreError> {
    value
        .parse::<f64>()
        .ok()
        .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            StoreError::Config(format!(
                "{name}={value:?} in the store URL is not a duration: give a number of                  seconds above 0, e.g. {name}=600"
            ))
        })
}

/// `url` without its query parameter `name` (idem's, which tokio-postgres
/// would refuse as unknown), and the parameter's value; the last one given
/// wins.
#[cfg_attr(
    not(any(feature = "postgres", feature = "dynamodb", feature = "sqlite")),
    allow(dead_code)
)]
fn take_param(url: &str, name: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_owned(), None);
    };
    let mut value = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(
            |pair| match pair.strip_prefix(name).and_then(|v| v.strip_prefix('=')) {
                Some(v) => {
                    value = Some(v.to_owned());
                    false
                }
                None => !pair.is_empty(),
            },
        )
        .collect();
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    (url, value)
}

#[cfg(test)]
mod tests {
    use super::{parse_seconds, take_param, take_schema};

    #[test]
    fn migrate_timeout_is_seconds_above_zero() {
        let d = |s| parse_seconds("migrate_timeout", s);
        assert_eq!(d("600").unwrap(), std::time::Duration::from_secs(600));
        assert_eq!(d("0.5").unwrap(), std::time::Duration::from_millis(500));
        for bad in ["", "0", "-1", "10m", "NaN"] {
            let err = d(bad).unwrap_err().to_string();
            assert!(err.contains("migrate_timeout=600"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn relaxed_completions_is_taken_out_of_the_url() {
        assert_eq!(
            take_param(
                "postgres://a@h/db?schema=s&relaxed_completions=false",
                "relaxed_completions"
            ),
            (
                "postgres://a@h/db?schema=s".to_owned(),
                Some("false".into())
            )
        );
        assert_eq!(
            take_param("postgres://a@h/db?relaxed=1", "relaxed_completions"),
            ("postgres://a@h/db?relaxed=1".to_owned(), None)
        );
    }

    #[test]
    fn the_schema_parameter_is_taken_out_of_the_url() {
        let cases = [
            ("postgres://a@h/db", "postgres://a@h/db", None),
            (
                "postgres://a@h/db?schema=nc2",
                "postgres://a@h/db",
                Some("nc2"),
            ),
            (
                "postgres://a@h/db?sslmode=disable&schema=nc2&connect_timeout=3",
                "postgres://a@h/db?sslmode=disable&connect_timeout=3",
                Some("nc2"),
            ),
            (
                "postgres://a@h/db?sslmode=disable",
                "postgres://a@h/db?sslmode=disable",
                None,
            ),
        ];
        for (given, url, schema) in cases {
            assert_eq!(
                take_schema(given),
                (url.to_owned(), schema.map(str::to_owned)),
                "{given}"
            );
        }
    }
}
