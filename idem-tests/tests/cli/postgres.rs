//! The command line on PostgreSQL (when `IDEM_TEST_DATABASE_URL` is set):
//! a database of its own, refused until migrated, and a store in a schema
//! of its own.

use std::sync::Arc;

use idem_cli::{EXIT_OK, EXIT_USAGE};
use idem_runtime::PostgresStore;
use serde_json::json;

use crate::durable::{self, database_url};
use crate::operator::{fill, idem, operate};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_works_on_a_postgres_store() {
    let Some(url) = database_url() else { return };
    // A database of its own: the command line reads the default schema.
    let db = format!(
        "idem_cli_{:016x}",
        idem_runtime::store::Attempt::random().get()
    );
    let admin = durable::connect(&url).await;
    admin
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .await
        .unwrap();
    let (base, _) = url.rsplit_once('/').unwrap();
    let url_db = format!("{base}/{db}");

    // Not migrated: the store says what to run, and it is configuration
    // (running it again will not help).
    let unmigrated = idem(&url_db, &["stats"]).await;
    assert_eq!(unmigrated.code, EXIT_USAGE, "{unmigrated:?}");
    assert!(unmigrated.err.contains("migrate"), "{}", unmigrated.err);

    let store = PostgresStore::connect(&url_db).await.unwrap();
    store.migrate().await.unwrap();
    let store = Arc::new(store);
    operate(&url_db, &*store).await;
    drop(store);
    admin
        .batch_execute(&format!("DROP DATABASE {db} WITH (FORCE)"))
        .await
        .unwrap();
}

/// A server whose store is in a schema of its own
/// (`PostgresStore::builder(url)?.schema(..)`): the command line reads it
/// with `--schema` or `?schema=` on the URL, and without either says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_reads_a_postgres_store_in_its_own_schema() {
    let Some(url) = database_url() else { return };
    let schema = format!(
        "idem_cli_schema_{:016x}",
        idem_runtime::store::Attempt::random().get()
    );
    let store = PostgresStore::builder(&url)
        .unwrap()
        .schema(&schema)
        .build()
        .unwrap();
    store.migrate().await.unwrap();
    let reqs = fill(&store).await;
    let tenant = reqs[0].tenant.as_str();
    let unknown = reqs[1].reference.to_string();

    // In another database `public` may hold idem's tables: point the
    // default at a schema that cannot exist here, as `public` did not.
    let elsewhere = idem(&url, &["--schema", "idem_no_such_schema", "list"]).await;
    assert_eq!(elsewhere.code, EXIT_USAGE, "{elsewhere:?}");
    assert!(
        elsewhere.err.contains("\"idem_no_such_schema\"")
            && elsewhere.err.contains("--schema NAME"),
        "the error names the schema it read and how to name another: {}",
        elsewhere.err
    );

    let flag = idem(
        &url,
        &["--schema", &schema, "--json", "list", "--tenant", tenant],
    )
    .await;
    assert_eq!(flag.code, EXIT_OK, "{flag:?}");
    assert_eq!(flag.json().as_array().unwrap().len(), 3, "{}", flag.out);
    // After the command too (a global flag), and as the URL's parameter.
    let shown = idem(
        &url,
        &["show", &unknown, "--tenant", tenant, "--schema", &schema],
    )
    .await;
    assert_eq!(shown.code, EXIT_OK, "{shown:?}");
    assert!(shown.out.contains("UNKNOWN"), "{}", shown.out);
    let joiner = if url.contains('?') { '&' } else { '?' };
    let in_url = format!("{url}{joiner}schema={schema}");
    let stats = idem(&in_url, &["--json", "stats"]).await;
    assert_eq!(stats.code, EXIT_OK, "{stats:?}");
    assert_eq!(stats.json()["total"], json!(3), "{}", stats.out);

    // Given twice, or to a store without schemas: refused, saying why.
    let twice = idem(&in_url, &["--schema", &schema, "stats"]).await;
    assert_eq!(twice.code, EXIT_USAGE, "{twice:?}");
    assert!(twice.err.contains("give it once"), "{}", twice.err);
    let sqlite = idem("sqlite:/tmp/x.sqlite3", &["--schema", "nc2", "stats"]).await;
    assert_eq!(sqlite.code, EXIT_USAGE, "{sqlite:?}");
    assert!(
        sqlite.err.contains("not a PostgreSQL store"),
        "{}",
        sqlite.err
    );

    durable::connect(&url)
        .await
        .batch_execute(&format!("DROP SCHEMA \"{schema}\" CASCADE"))
        .await
        .unwrap();
}
