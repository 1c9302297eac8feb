//! Migrating a table created before the `leases` index while other
//! starters migrate it too.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::maintenance::sweep;
use idem_runtime::{DynamoDbStore, StoreError};

use crate::create_table_before_leases;
use crate::dynamodb_emulator::{client, endpoint};
use crate::dynamodb_proxy::{Intercepted, Proxy};

/// How a starter brings the table to this version's layout.
#[derive(Clone, Copy, Debug)]
enum Starter {
    Migrate,
    CreateTable,
    OpenStoreCreate,
    CommandLine,
}

const STARTERS: [Starter; 4] = [
    Starter::Migrate,
    Starter::CreateTable,
    Starter::OpenStoreCreate,
    Starter::CommandLine,
];

/// One starter on `table` at `endpoint`, on a client of its own: `Err`
/// with what it said when it failed.
async fn start(starter: Starter, endpoint: &str, table: &str) -> Result<(), String> {
    let url = format!("dynamodb://{table}?region=us-east-1&endpoint={endpoint}");
    let store = || {
        DynamoDbStore::builder(client(endpoint), table)
            .build()
            .unwrap()
    };
    let said = |e: StoreError| format!("{e:?}");
    match starter {
        Starter::Migrate => store().migrate().await.map(drop).map_err(said),
        Starter::CreateTable => store().create_table().await.map_err(said),
        Starter::OpenStoreCreate => idem_runtime::open_store(&format!("{url}&create=true"))
            .await
            .map(drop)
            .map_err(said),
        Starter::CommandLine => {
            let (mut out, mut err) = (Vec::new(), Vec::new());
            let code = idem_cli::run(
                ["idem", "--store", &url, "create-table"],
                &mut out,
                &mut err,
            )
            .await;
            if code == idem_cli::EXIT_OK {
                Ok(())
            } else {
                Err(format!("exit {code}: {}", String::from_utf8_lossy(&err)))
            }
        }
    }
}

/// The emulator takes any credentials; a `dynamodb://` URL reads them from
/// the environment.
fn test_credentials() {
    for name in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"] {
        if std::env::var_os(name).is_none() {
            std::env::set_var(name, "testing");
        }
    }
}

/// Four starters at once on a table from before `leases`, each its own
/// way (`migrate`, `create_table`, `open_store` with `create=true`, `idem
/// create-table`), on two tables: every one of them succeeds, and the
/// table then serves (`connect` finds `leases`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starters_migrating_at_once_all_succeed() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    test_credentials();
    let mut failures = Vec::new();
    for _ in 0..2 {
        let table = create_table_before_leases(&endpoint).await;
        let (endpoint, name) = (endpoint.as_str(), table.table());
        // One task polls the four: their requests are in flight together.
        let ran = futures::future::join_all(
            STARTERS.map(|starter| async move { (starter, start(starter, endpoint, name).await) }),
        )
        .await;
        for (starter, result) in ran {
            if let Err(e) = result {
                failures.push(format!("{starter:?}: {e}"));
            }
        }
        DynamoDbStore::connect(client(endpoint), name)
            .await
            .expect("migrated, it serves");
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// How DynamoDB adds an index, which the emulator does at once: for
/// `building` after the `UpdateTable` that creates `leases`, the table
/// reads UPDATING and the index CREATING (backfilling), a read of it is
/// refused, and a second `UpdateTable` is refused as a change under way
/// (`ResourceInUseException` and `LimitExceededException` in turn); after
/// it, as an index that exists (`ValidationException`). Counts the
/// `UpdateTable`s it refused.
struct IndexBuild {
    building: Duration,
    state: std::sync::Mutex<BuildState>,
}

#[derive(Default)]
struct BuildState {
    /// When the index is built, once it has been asked for.
    active_at: Option<tokio::time::Instant>,
    refused: usize,
}

impl IndexBuild {
    /// Puts a build of `building` in front of the emulator, on `proxy`.
    fn on(proxy: &Proxy, building: Duration) -> Arc<IndexBuild> {
        let build = Arc::new(IndexBuild {
            building,
            state: Default::default(),
        });
        let hook = build.clone();
        proxy.intercept(move |operation, body| hook.answer(operation, body));
        build
    }

    fn answer(&self, operation: &str, body: &str) -> Intercepted {
        let mut state = self.state.lock().unwrap();
        let now = tokio::time::Instant::now();
        let building = state.active_at.is_some_and(|at| now < at);
        match operation {
            "UpdateTable" if body.contains("\"leases\"") => match state.active_at {
                None => {
                    state.active_at = Some(now + self.building);
                    Intercepted::Forward
                }
                Some(_) => {
                    state.refused += 1;
                    if !building {
                        Intercepted::error(
                            "ValidationException",
                            "Attempting to create an index which already exists",
                        )
                    } else if state.refused % 2 == 1 {
                        Intercepted::error(
                            "ResourceInUseException",
                            "Attempt to change a resource which is still in use: Table is being \
                             updated",
                        )
                    } else {
                        Intercepted::error(
                            "LimitExceededException",
                            "Subscriber limit exceeded: Only 1 online index can be created or \
                             deleted simultaneously per table",
                        )
                    }
                }
            },
            "DescribeTable" if building => Intercepted::Rewrite(Box::new(|mut answer| {
                answer["Table"]["TableStatus"] = "UPDATING".into();
                for index in answer["Table"]["GlobalSecondaryIndexes"]
                    .as_array_mut()
                    .unwrap()
                {
                    if index["IndexName"] == "leases" {
                        index["IndexStatus"] = "CREATING".into();
                        index["Backfilling"] = true.into();
                    }
                }
                answer
            })),
            "Query" if building && body.contains("\"leases\"") => Intercepted::error(
                "ValidationException",
                "Cannot read from backfilling global secondary index: leases",
            ),
            _ => Intercepted::Forward,
        }
    }

    /// When the index is built, once asked for.
    fn active_at(&self) -> Option<tokio::time::Instant> {
        self.state.lock().unwrap().active_at
    }

    fn refused(&self) -> usize {
        self.state.lock().unwrap().refused
    }
}

/// The four starters at once on a table from before `leases`, where
/// DynamoDB takes 1.5 s to build the index and refuses the other requests
/// to add it meanwhile: every starter succeeds, none returns before the
/// index is active, and the sweep then reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starters_wait_for_the_index_being_built() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    test_credentials();
    let table = create_table_before_leases(&endpoint).await;
    let proxy = Proxy::start(&endpoint).await;
    let build = IndexBuild::on(&proxy, Duration::from_millis(1500));
    let (url, name) = (proxy.url.as_str(), table.table());
    let ran = futures::future::join_all(STARTERS.map(|starter| async move {
        let result = start(starter, url, name).await;
        (starter, result, tokio::time::Instant::now())
    }))
    .await;
    let active_at = build.active_at().expect("one asked for the index");
    for (starter, result, returned) in ran {
        assert!(result.is_ok(), "{starter:?}: {result:?}");
        assert!(
            returned >= active_at,
            "{starter:?} returned while it was built"
        );
    }
    assert_eq!(proxy.count("UpdateTable"), build.refused() + 1);
    let store = DynamoDbStore::builder(client(url), name).build().unwrap();
    sweep(&store, 100).await.expect("the sweep reads the index");
}

/// A migration refused because another change to the table is under way
/// waits for it and then adds the index; one refused because another
/// starter added the index between its look and its request waits for
/// that index instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_migration_looks_again() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    let proxy = Proxy::start(&endpoint).await;

    // Another change under way: the table reads UPDATING for 1 s.
    let table = create_table_before_leases(&endpoint).await;
    let until = tokio::time::Instant::now() + Duration::from_secs(1);
    proxy.intercept(move |operation, _| {
        let busy = tokio::time::Instant::now() < until;
        match operation {
            "UpdateTable" if busy => Intercepted::error(
                "ResourceInUseException",
                "Attempt to change a resource which is still in use: Table is being updated",
            ),
            "DescribeTable" if busy => Intercepted::Rewrite(Box::new(|mut answer| {
                answer["Table"]["TableStatus"] = "UPDATING".into();
                answer
            })),
            _ => Intercepted::Forward,
        }
    });
    let store = DynamoDbStore::builder(client(&proxy.url), table.table())
        .build()
        .unwrap();
    assert!(store.migrate().await.unwrap(), "it added the index");
    assert!(tokio::time::Instant::now() >= until);

    // The index added by another starter after this one looked: its
    // request is refused as an index that exists.
    let table = create_table_before_leases(&endpoint).await;
    let raced = std::sync::atomic::AtomicBool::new(false);
    proxy.intercept(move |operation, _| match operation {
        "UpdateTable" if !raced.swap(true, Ordering::SeqCst) => Intercepted::applied_but_refused(
            "ValidationException",
            "Attempting to create an index which already exists",
        ),
        _ => Intercepted::Forward,
    });
    let store = DynamoDbStore::builder(client(&proxy.url), table.table())
        .build()
        .unwrap();
    let added = store.migrate().await;
    assert!(matches!(added, Ok(false)), "{added:?}");
    DynamoDbStore::connect(client(&endpoint), table.table())
        .await
        .expect("the index is there");
}

/// A migration that runs out of time while DynamoDB builds the index says
/// so, and what to do; a server that starts meanwhile waits for the index
/// (its sweep reads it), and the next migration returns once it is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_out_of_time_says_what_to_do() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    let table = create_table_before_leases(&endpoint).await;
    let proxy = Proxy::start(&endpoint).await;
    let build = IndexBuild::on(&proxy, Duration::from_secs(2));
    let impatient = DynamoDbStore::builder(client(&proxy.url), table.table())
        .migrate_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let e = impatient.migrate().await.unwrap_err();
    let said = e.to_string();
    assert!(matches!(e, StoreError::Unavailable(_)), "{e:?}");
    for words in [
        "`leases` index",
        "CREATING",
        "create-table",
        "migrate_timeout",
    ] {
        assert!(said.contains(words), "{words}: {said}");
    }

    let server = DynamoDbStore::connect(client(&proxy.url), table.table())
        .await
        .expect("a server that starts meanwhile waits for the index");
    assert!(tokio::time::Instant::now() >= build.active_at().unwrap());
    sweep(&server, 100)
        .await
        .expect("the sweep reads the index");
    assert!(!impatient.migrate().await.unwrap(), "built, by the first");
}

/// `idem create-table` that cannot add the index says what happened and
/// what to do, about DynamoDB; an answer without an error code is said
/// with what there is of it, never as an empty text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_migration_says_what_to_do() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    test_credentials();
    let table = create_table_before_leases(&endpoint).await;
    let proxy = Proxy::start(&endpoint).await;
    proxy.intercept(|operation, _| match operation {
        "UpdateTable" => Intercepted::error("InternalServerError", "Internal server error"),
        _ => Intercepted::Forward,
    });
    let url = format!(
        "dynamodb://{}?region=us-east-1&endpoint={}",
        table.table(),
        proxy.url
    );
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = idem_cli::run(
        ["idem", "--store", &url, "create-table"],
        &mut out,
        &mut err,
    )
    .await;
    let err = String::from_utf8(err).unwrap();
    assert_eq!(code, idem_cli::EXIT_UNREACHABLE, "{err}");
    for words in [
        "could not add the `leases` index",
        "InternalServerError",
        "create-table again",
    ] {
        assert!(err.contains(words), "{words}: {err}");
    }
    assert!(
        !err.contains("PostgreSQL") && !err.contains("migrated it"),
        "{err}"
    );

    proxy.intercept(|operation, _| match operation {
        "UpdateTable" => Intercepted::Answer(500, String::new()),
        _ => Intercepted::Forward,
    });
    let store = DynamoDbStore::builder(client(&proxy.url), table.table())
        .build()
        .unwrap();
    let e = store.migrate().await.unwrap_err();
    assert!(e.to_string().contains("names no code"), "{e}");
}
