//! `idem migrate`, the one command that changes a store's layout: every
//! other command leaves an older layout as it is (and says to run
//! `idem migrate`), and several migrations at once all succeed.

use idem_cli::{EXIT_OK, EXIT_USAGE};
use serde_json::json;

use crate::durable::{database_url, temp_dir};
use crate::operator::idem;
use crate::sql_layouts::{
    postgres_at, postgres_layout, schema_name, sqlite_at, sqlite_layout, DropSchema, LATEST,
    POSTGRES_LATEST,
};

/// A record completed with a job, written as the versions of layouts 5
/// and 6 wrote them (their statements' columns; `attempts` the job's runs).
fn rows_of_layout_6(path: &std::path::Path) -> (String, String) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let key = [7u8; 32];
    let tenant = "acme";
    conn.execute(
        "INSERT INTO idem_records (key, fingerprint, tenant, tool, state, attempt, claimed_at, \
           updated_at, lease_until, expires_at, retain_until, body, next_check_at, checks, \
           resolution, operation) \
         VALUES (?1, ?2, ?3, 'charge_card', 1, 42, 1, 1, 2, 4102444800000000000, \
           4102444800000000000, '\"paid\"', 1, 0, NULL, 9)",
        rusqlite::params![&key[..], &[1u8; 32][..], tenant],
    )
    .unwrap();
    let reference: Vec<u8> = key[..8].iter().copied().chain(9u64.to_be_bytes()).collect();
    conn.execute(
        "INSERT INTO idem_jobs (tenant, reference, name, payload, attempts, token, \
           next_run_at, last_error, dead, created_at, updated_at) \
         VALUES (?1, ?2, 'receipt', '{}', 5, NULL, 1, 'mailer down', 1, 1, 1)",
        rusqlite::params![tenant, &reference[..]],
    )
    .unwrap();
    let reference = idem_runtime::Reference::parse(&hex(&reference)).unwrap();
    (reference.to_string(), tenant.to_owned())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Issue 46: `idem stats` on a layout-6 file moved it to layout 7, and
/// the older servers on the file then failed their completions with jobs.
/// Every command but `migrate` now leaves the file as it was (its
/// user_version, its DDL and its rows), and says to run `idem migrate`;
/// `migrate` then brings it to this version's layout with its rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_migrate_changes_an_older_sqlite_layout() {
    let dir = temp_dir("cli-layout-6");
    let path = dir.join("idem.sqlite3");
    sqlite_at(&path, 6);
    let (reference, tenant) = rows_of_layout_6(&path);
    let url = format!("sqlite:{}", path.display());
    let before = sqlite_layout(&path);
    assert_eq!(before.0, 6);
    let commands: [&[&str]; 10] = [
        &["stats"],
        &["--json", "stats"],
        &["list"],
        &["show", &reference],
        &["follow-ons"],
        &["jobs", "--dead"],
        &["jobs", "--state", "delivered"],
        &[
            "resolve",
            &reference,
            "--tenant",
            &tenant,
            "--not-performed",
            "--note",
            "x",
        ],
        &["purge"],
        &["redrive", &reference, "receipt", "--tenant", &tenant],
    ];
    for command in commands {
        let ran = idem(&url, command).await;
        assert_eq!(ran.code, EXIT_USAGE, "{command:?}: {ran:?}");
        assert!(
            ran.err.contains("idem migrate") && ran.err.contains("layout 6"),
            "{command:?}: the error names the layout and what to run: {}",
            ran.err
        );
        assert_eq!(sqlite_layout(&path), before, "{command:?} changed the file");
    }
    // As a URL for open_store says it, for a server that does not migrate.
    let refused = idem_runtime::open_store(&format!("{url}?migrate=false"))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, idem_runtime::StoreError::Config(_))
            && refused.to_string().contains("idem migrate"),
        "{refused}"
    );
    assert_eq!(sqlite_layout(&path), before);

    let migrated = idem(&url, &["--json", "migrate"]).await;
    assert_eq!(migrated.code, EXIT_OK, "{migrated:?}");
    assert_eq!(migrated.json()["migrated"], json!(true));
    assert_eq!(sqlite_layout(&path).0, LATEST as i64);
    let stats = idem(&url, &["--json", "stats"]).await;
    assert_eq!(stats.code, EXIT_OK, "{stats:?}");
    assert_eq!(stats.json()["total"], json!(1), "{}", stats.out);
    let dead = idem(&url, &["--json", "jobs", "--dead"]).await;
    assert_eq!(dead.code, EXIT_OK, "{dead:?}");
    let jobs = dead.json();
    assert_eq!(jobs.as_array().unwrap().len(), 1, "{}", dead.out);
    assert_eq!(
        jobs[0]["runs"],
        json!(5),
        "the runs written at layout 6: {}",
        dead.out
    );
}

/// `idem migrate` by eight processes at once on a file of layout 5 (what
/// 0.1.0 leaves): every one succeeds, and the file ends at this version's
/// layout, the same as a file this version created.
#[test]
fn processes_migrating_a_sqlite_file_at_once_all_succeed() {
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_idem_cli"));
    let dir = temp_dir("cli-migrate-at-once");
    let path = dir.join("idem.sqlite3");
    sqlite_at(&path, 5);
    let url = format!("sqlite:{}", path.display());
    let children: Vec<_> = (0..8)
        .map(|_| {
            std::process::Command::new(&bin)
                .args(["--store", &url, "migrate"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("idem runs")
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let fresh = dir.join("fresh.sqlite3");
    let ran = std::process::Command::new(&bin)
        .args(["--store", &format!("sqlite:{}", fresh.display()), "migrate"])
        .output()
        .unwrap();
    assert!(ran.status.success(), "{ran:?}");
    let (version, ddl, _) = sqlite_layout(&path);
    assert_eq!(version, LATEST as i64);
    assert_eq!(ddl, sqlite_layout(&fresh).1);
}

/// On PostgreSQL: a schema at layout 6 is refused by every command but
/// `migrate` (exit 2, naming `idem migrate`), and by `open_store` without
/// `migrate=true`, and left as it was; eight `idem migrate` at once all
/// succeed, each migration recorded once; so on a schema never migrated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_migrate_changes_an_older_postgres_schema_and_at_once_all_succeed() {
    let Some(url) = database_url() else { return };
    let name = schema_name("cli_layout_6");
    let _drop = DropSchema(url.clone(), name.clone());
    postgres_at(&url, &name, 6).await;
    let before = postgres_layout(&url, &name).await;
    assert_eq!(before.0, vec![1, 2, 3, 4, 5, 6]);
    let reference = format!("idem_{}", "ab".repeat(16));
    let commands: [&[&str]; 6] = [
        &["stats"],
        &["list"],
        &["show", &reference],
        &["jobs", "--dead"],
        &["purge"],
        &["redrive", &reference, "receipt", "--tenant", "acme"],
    ];
    for command in commands {
        let mut args = vec!["--schema", &name];
        args.extend_from_slice(command);
        let ran = idem(&url, &args).await;
        assert_eq!(ran.code, EXIT_USAGE, "{command:?}: {ran:?}");
        assert!(
            ran.err.contains("idem migrate") && ran.err.contains("7, 8, 9"),
            "{command:?}: the error names the migrations missing and what to run: {}",
            ran.err
        );
        assert_eq!(postgres_layout(&url, &name).await, before, "{command:?}");
    }
    let joiner = if url.contains('?') { '&' } else { '?' };
    for param in ["", "&migrate=false"] {
        let refused = idem_runtime::open_store(&format!("{url}{joiner}schema={name}{param}"))
            .await
            .unwrap_err();
        assert!(
            matches!(refused, idem_runtime::StoreError::Config(_))
                && refused.to_string().contains("idem migrate"),
            "{refused}"
        );
    }
    assert_eq!(postgres_layout(&url, &name).await, before);

    let never = schema_name("cli_never");
    let _drop_never = DropSchema(url.clone(), never.clone());
    for schema in [&name, &never] {
        // In flight together: each opens its own connections and waits
        // its turn on the server.
        let args = ["--schema", schema.as_str(), "migrate"];
        let runs = (0..8).map(|_| idem(&url, &args));
        for ran in futures::future::join_all(runs).await {
            assert_eq!(ran.code, EXIT_OK, "{schema}: {ran:?}");
        }
        let (versions, _) = postgres_layout(&url, schema).await;
        assert_eq!(
            versions,
            (1..=POSTGRES_LATEST as i32).collect::<Vec<_>>(),
            "{schema}"
        );
        let stats = idem(&url, &["--schema", schema, "--json", "stats"]).await;
        assert_eq!(stats.code, EXIT_OK, "{stats:?}");
    }
    assert_eq!(
        postgres_layout(&url, &name).await.1,
        postgres_layout(&url, &never).await.1,
        "a schema migrated from layout 6 is the same as one migrated from nothing"
    );
}

/// On Redis, `idem migrate` loads this version's function library, as the
/// deploy step docs/deploying.md gives its own user (`idem-loader`);
/// four at once all succeed, and the library is there after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_loads_the_redis_library_as_the_documented_loader() {
    let Some(server) = crate::redis_server::Server::start(&[]) else {
        return;
    };
    let url = server.url();
    let listed = || async {
        let list: redis::Value =
            crate::redis_server::command(&url, redis::cmd("FUNCTION").arg("LIST")).await;
        format!("{list:?}")
    };
    let library = idem_runtime::RedisStore::library_name();
    assert!(!listed().await.contains(library), "not loaded yet");
    let loader = crate::redis_server::documented_user(&url, "idem-loader", "idem:*").await;
    let runs = (0..4).map(|_| idem(&loader, &["migrate"]));
    for ran in futures::future::join_all(runs).await {
        assert_eq!(ran.code, EXIT_OK, "{ran:?}");
        assert!(ran.out.contains(library), "{}", ran.out);
    }
    assert!(listed().await.contains(library), "{}", listed().await);
}

/// On DynamoDB (the emulator), `idem migrate` creates the table as
/// `create-table` does, three at once; the store then serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_makes_the_dynamodb_table_three_at_once() {
    let Some(endpoint) = crate::dynamodb_emulator::endpoint() else {
        return;
    };
    for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, "testing");
        }
    }
    let table = crate::dynamodb_emulator::fresh_table();
    let url = format!("dynamodb://{table}?region=us-east-1&endpoint={endpoint}");
    let runs = (0..3).map(|_| idem(&url, &["migrate"]));
    for ran in futures::future::join_all(runs).await {
        assert_eq!(ran.code, EXIT_OK, "{ran:?}");
    }
    let stats = idem(&url, &["--json", "stats"]).await;
    assert_eq!(stats.code, EXIT_OK, "{stats:?}");
    assert_eq!(stats.json()["total"], json!(0));
    let store = idem_runtime::DynamoDbStore::from_url(&url)
        .unwrap()
        .build()
        .unwrap();
    let _ = store.delete_table().await;
}

/// A SQLite file and a PostgreSQL schema at every earlier layout in the
/// repository (SQLite 1 to 7, PostgreSQL 1 to 8, each built from the
/// shipped migrations) end, after
/// `idem migrate`, with the same layout as one this version migrated from
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_earlier_layout_migrates_to_this_one() {
    let dir = temp_dir("cli-every-layout");
    let fresh = dir.join("fresh.sqlite3");
    let ran = idem(&format!("sqlite:{}", fresh.display()), &["migrate"]).await;
    assert_eq!(ran.code, EXIT_OK, "{ran:?}");
    let expected = sqlite_layout(&fresh);
    for layout in 1..LATEST {
        let path = dir.join(format!("layout-{layout}.sqlite3"));
        sqlite_at(&path, layout);
        let ran = idem(&format!("sqlite:{}", path.display()), &["migrate"]).await;
        assert_eq!(ran.code, EXIT_OK, "layout {layout}: {ran:?}");
        assert_eq!(sqlite_layout(&path), expected, "layout {layout}");
    }

    let Some(url) = database_url() else { return };
    let never = schema_name("cli_every_never");
    let _drop_never = DropSchema(url.clone(), never.clone());
    let ran = idem(&url, &["--schema", &never, "migrate"]).await;
    assert_eq!(ran.code, EXIT_OK, "{ran:?}");
    let expected = postgres_layout(&url, &never).await;
    for layout in 1..POSTGRES_LATEST {
        let name = schema_name(&format!("cli_every_{layout}"));
        let _drop = DropSchema(url.clone(), name.clone());
        postgres_at(&url, &name, layout).await;
        let ran = idem(&url, &["--schema", &name, "migrate"]).await;
        assert_eq!(ran.code, EXIT_OK, "layout {layout}: {ran:?}");
        assert_eq!(
            postgres_layout(&url, &name).await,
            expected,
            "layout {layout}"
        );
    }
}
