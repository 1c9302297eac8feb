//! Rolling deploys on the SQL stores from an earlier layout
//! (`tests/rolling`): a replica of the version that served that layout and
//! one of this version serve one store at once, this version's migrating
//! it (SQLite at its start; PostgreSQL in a step of its own, under the
//! roles docs/deploying.md documents), then the old one stops; nothing is
//! lost, nothing runs twice, every reference reads true. Each earlier
//! replica's module says what it replays, and why that is faithful.

#[path = "durable/mod.rs"]
mod durable;
#[path = "sql_upgrades/postgres_before_functions.rs"]
mod postgres_before_functions;
#[path = "sql_upgrades/postgres_earlier.rs"]
mod postgres_earlier;
#[path = "sql_upgrades/postgres_replayed.rs"]
mod postgres_replayed;
#[path = "postgres_roles/mod.rs"]
mod postgres_roles;
#[path = "rolling/mod.rs"]
mod rolling;
#[path = "sql_layouts/mod.rs"]
mod sql_layouts;
#[path = "sql_upgrades/sqlite_earlier.rs"]
mod sqlite_earlier;
#[path = "sql_upgrades/sqlite_replayed.rs"]
mod sqlite_replayed;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use idem_runtime::store::IdempotencyStore;
use idem_runtime::{PostgresStore, SqliteStore};

use crate::durable::{database_url, temp_dir};
use crate::postgres_before_functions::LayoutEight;
use crate::postgres_earlier::EarlierPostgres;
use crate::postgres_replayed::PostgresReplayed;
use crate::postgres_roles::{direct, documented_sql, with_schema, Roles};
use crate::rolling::{rolling_deploy, Replica, World};
use crate::sql_layouts::{
    postgres_layout, postgres_tables_at, schema_name, sqlite_at, sqlite_layout,
};
use crate::sqlite_earlier::{EarlierSqlite, COMMIT};

/// Issue 46: a file at layout 6, served by e11d36c's replica; this
/// version's starts, migrates the file (to 8) and serves beside it.
/// Migration 7 alone (which renamed `attempts`) failed the old replica's
/// completions that carry a receipt, after the charge, and its leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_from_layout_6_on_sqlite_loses_nothing() {
    let dir = temp_dir("rolling-sqlite-6");
    let path = dir.join("idem.sqlite3");
    sqlite_at(&path, 6);
    let world = Arc::new(World::default());
    let earlier = EarlierSqlite::open(&path).await;
    let start_new = async {
        // The old version's upkeep before the new one starts: its follow-ons
        // delivers what it completed alone, by its own statements.
        let old = Replica::new(COMMIT, Arc::new(earlier.clone()), &world);
        old.upkeep().await.unwrap();
        let store = SqliteStore::open(&path).await.unwrap();
        assert!(sqlite_layout(&path).0 > 6, "migrated at its start");
        Replica::new("this version", Arc::new(store), &world)
    };
    let old = Replica::new(COMMIT, Arc::new(earlier.clone()), &world);
    rolling_deploy(old, start_new, world.clone()).await;
    let ran = earlier.ran.lock().unwrap().clone();
    for call in ["complete_with_follow_ons", "lease_jobs", "finish_job"] {
        assert!(
            ran.get(call).copied().unwrap_or(0) > 0,
            "{COMMIT}'s {call} never ran: {ran:?}"
        );
    }
}

/// A file at `layout`, served by the replica of `commit`, the last at
/// that layout (every statement its own); this version's starts, migrates
/// the file and serves beside it. That replica keeps an operation for its
/// window only (it knows nothing of `idem_superseded`).
async fn sqlite_from(commit: &'static str, layout: usize) {
    let dir = temp_dir(&format!("rolling-sqlite-{layout}"));
    let path = dir.join("idem.sqlite3");
    sqlite_at(&path, layout);
    let world = Arc::new(World::default());
    let earlier = crate::sqlite_replayed::SqliteReplayed::open(&path, commit);
    let start_new = async {
        // The old version's upkeep before the new one starts: its follow-ons
        // delivers what it completed alone, by its own statements.
        let old = Replica::new(commit, Arc::new(earlier.clone()), &world);
        old.upkeep().await.unwrap();
        let store = SqliteStore::open(&path).await.unwrap();
        assert!(
            sqlite_layout(&path).0 > layout as i64,
            "migrated at its start"
        );
        Replica::new("this version", Arc::new(store), &world)
    };
    let old = Replica::new(commit, Arc::new(earlier.clone()), &world).window_only();
    rolling_deploy(old, start_new, world.clone()).await;
    let ran = earlier.ran.lock().unwrap().clone();
    for call in [
        "claim",
        "complete_with_follow_ons",
        "lease_jobs",
        "finish_job",
        "list_lapsed",
    ] {
        assert!(
            ran.get(call).copied().unwrap_or(0) > 0,
            "{commit}'s {call} never ran: {ran:?}"
        );
    }
}

/// From layout 5, what 0.1.0 leaves: 8d26ab9's replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_from_layout_5_on_sqlite_loses_nothing() {
    sqlite_from("8d26ab9", 5).await;
}

/// From layout 4: d97a05f's replica, which deletes a job it delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_from_layout_4_on_sqlite_loses_nothing() {
    sqlite_from("d97a05f", 4).await;
}

/// An earlier version's replica on PostgreSQL, as the rolling deploy
/// asks after it.
trait EarlierReplica: IdempotencyStore + Clone + 'static {
    /// How many times each of its own calls was answered.
    fn own_calls(&self) -> BTreeMap<&'static str, usize>;
    /// The role its connection logged in as.
    async fn current_user(&self) -> String;
}

impl EarlierReplica for EarlierPostgres {
    fn own_calls(&self) -> BTreeMap<&'static str, usize> {
        self.ran.lock().unwrap().clone()
    }
    async fn current_user(&self) -> String {
        EarlierPostgres::current_user(self).await
    }
}

impl EarlierReplica for LayoutEight {
    fn own_calls(&self) -> BTreeMap<&'static str, usize> {
        self.calls.ran.lock().unwrap().clone()
    }
    async fn current_user(&self) -> String {
        LayoutEight::current_user(self).await
    }
}

impl EarlierReplica for PostgresReplayed {
    fn own_calls(&self) -> BTreeMap<&'static str, usize> {
        self.ran.lock().unwrap().clone()
    }
    async fn current_user(&self) -> String {
        PostgresReplayed::current_user(self).await
    }
}

/// A schema at `layout`, served by the replica of `commit`, the last at
/// that layout, which `open` connects (given its login URL and the
/// schema); this version's migrates it in a step of its own and serves
/// beside it. Each of `calls`, the replica's own, ran. A replica of a
/// layout before 6 keeps an operation for its window only (it knows
/// nothing of `idem_superseded`).
///
/// Under the roles docs/deploying.md documents, its statements read from
/// the page: the layout built by `idem_migrator` (as that version's
/// `migrate()` would have), granted to `idem_server` as the page says for
/// that layout (before 6, 0.1.0's servers' grants; from 6, which has
/// `idem_superseded`, the page's grants as they are); then this version's
/// migration as `idem_migrator`, the page's grants run again, and both
/// replicas connected as `idem_server`.
async fn postgres_from<E, F>(
    commit: &'static str,
    layout: usize,
    calls: &[&str],
    open: impl FnOnce(String, String) -> F,
) where
    E: EarlierReplica,
    F: Future<Output = E>,
{
    let Some(url) = database_url() else { return };
    // The roles log in to the server itself: a pooler knows only its own
    // users.
    let url = direct(url);
    let name = schema_name(&format!("rolling_{layout}"));
    let roles = Roles::new(&url, &name);
    let grants = documented_sql("### PostgreSQL");
    let earlier_grants = documented_sql("## Upgrading SQLite and PostgreSQL");
    assert_eq!(
        (grants.len(), earlier_grants.len()),
        (4, 1),
        "docs/deploying.md: the roles and the schema, then serving, reading and resolving; \
         and 0.1.0's servers' grants: {grants:#?} {earlier_grants:#?}"
    );
    let admin = crate::durable::connect(&url).await;
    admin.batch_execute(&roles.sql(&grants[0])).await.unwrap();
    let migrator = crate::durable::connect(&roles.url("idem_migrator")).await;
    postgres_tables_at(&migrator, &name, layout).await;
    let grant = |block: &str| {
        let sql = roles.sql(block);
        let migrator = &migrator;
        async move {
            migrator.batch_execute(&sql).await.unwrap_or_else(|e| {
                let why = e.as_db_error().map_or(e.to_string(), |d| d.to_string());
                panic!("as idem_migrator: {why}: {sql}")
            })
        }
    };
    let before: &[String] = if layout < 6 {
        &earlier_grants
    } else {
        &grants[1..]
    };
    for block in before {
        grant(block).await;
    }

    // Both replicas log in as `idem_server`; this version's store takes
    // the schema on its URL.
    let login = roles.url("idem_server");
    let world = Arc::new(World::default());
    let earlier = open(login.clone(), name.clone()).await;
    let old = || {
        let old = Replica::new(commit, Arc::new(earlier.clone()), &world);
        if layout < 6 {
            old.window_only()
        } else {
            old
        }
    };
    let start_new = async {
        // The old version's upkeep before the new one starts: its follow-ons
        // delivers what it completed alone, by its own statements.
        old().upkeep().await.unwrap();
        // The deploy step: this version's migration as `idem_migrator`,
        // then the page's grants again, as it says.
        PostgresStore::builder(&roles.url("idem_migrator"))
            .unwrap()
            .schema(&name)
            .build()
            .unwrap()
            .migrate()
            .await
            .unwrap();
        let (versions, _) = postgres_layout(&url, &name).await;
        assert!(versions.len() > layout, "migrated: {versions:?}");
        for block in &grants[1..] {
            grant(block).await;
        }
        // Without `migrate=true`: a store not migrated is refused.
        let store = idem_runtime::open_store(&with_schema(&login, &name))
            .await
            .unwrap();
        // Logged in as `idem_server`: the old replica's connection, and
        // the one this version's pool opened to check the layout.
        let backends: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE usename = $1",
                &[&roles.role("idem_server")],
            )
            .await
            .unwrap()
            .get(0);
        assert!(backends >= 2, "{backends} connection(s) as idem_server");
        Replica::new("this version", store, &world)
    };
    rolling_deploy(old(), start_new, world.clone()).await;
    let ran = earlier.own_calls();
    for call in calls {
        assert!(
            ran.get(call).copied().unwrap_or(0) > 0,
            "{commit}'s {call} never ran: {ran:?}"
        );
    }
    // Both served as `idem_server`, which may not change the schema: the
    // old replica on its own connection, this version's by its login.
    let role = roles.role("idem_server");
    assert_eq!(earlier.current_user().await, role, "the old replica's role");
    let (user, create): (String, bool) = crate::durable::connect(&login)
        .await
        .query_one(
            "SELECT current_user::text, has_schema_privilege($1, 'CREATE')",
            &[&name],
        )
        .await
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(
        (user.as_str(), create),
        (role, false),
        "this version's role, and its CREATE on the schema"
    );
}

/// Issue 49: a schema at layout 8 (with data its replica writes first:
/// the deploy's upkeep runs after it served), served by c0e6665's replica,
/// which claims by its own statements (its calls all complete with a
/// receipt, a statement this version sends as it did); this version's
/// migrates it (to 9, the claim and the completion as functions) and
/// serves beside it, by the functions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_from_layout_8_on_postgres_loses_nothing() {
    postgres_from(
        crate::postgres_before_functions::COMMIT,
        8,
        &["claim"],
        |login, name| async move { LayoutEight::open(&login, &name).await },
    )
    .await;
}

/// The same on PostgreSQL: a schema at layout 6, served by e11d36c's
/// replica; this version's migrates it (to 8) and serves beside it.
/// Migration 7 alone failed the old replica's completions that carry a
/// receipt (42703, column "attempts" does not exist), and its leases.
/// e11d36c's own calls are the ones it replays; its claims and its
/// listings are this version's statements.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_from_layout_6_on_postgres_loses_nothing() {
    postgres_from(
        crate::postgres_earlier::COMMIT,
        6,
        &[
            "claim",
            "complete_with_follow_ons",
            "lease_jobs",
            "finish_job",
        ],
        |login, name| async move { EarlierPostgres::open(&login, &name).await },
    )
    .await;
}

/// Every call of 8d26ab9's and d97a05f's replicas is their own.
const REPLAYED: [&str; 5] = [
    "claim",
    "complete_with_follow_ons",
    "lease_jobs",
    "finish_job",
    "list_lapsed",
];

/// From layout 5, what 0.1.0 leaves: 8d26ab9's replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_from_layout_5_on_postgres_loses_nothing() {
    postgres_from("8d26ab9", 5, &REPLAYED, |login, name| async move {
        PostgresReplayed::open(&login, &name, "8d26ab9").await
    })
    .await;
}

/// From layout 4: d97a05f's replica, which deletes a job it delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_from_layout_4_on_postgres_loses_nothing() {
    postgres_from("d97a05f", 4, &REPLAYED, |login, name| async move {
        PostgresReplayed::open(&login, &name, "d97a05f").await
    })
    .await;
}
