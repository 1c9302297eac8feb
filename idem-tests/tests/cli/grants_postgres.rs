//! PostgreSQL under the grants docs/deploying.md gives its four roles
//! ("What each store needs", "PostgreSQL", "Grants"), the statements read
//! from the page and run in a schema (and with roles) of the test's own:
//! migrating as `idem_migrator`, the store's conformance suite as
//! `idem_server`, the command line as `idem_reader` and `idem_resolver`;
//! and every table of the schema granted to each of the three.

use idem_cli::EXIT_USAGE;
use idem_runtime::store::{conformance, Attempt, RecordStateKind};
use idem_runtime::{IdempotencyStore, PostgresStore};

use crate::durable;
use crate::grants::{fill, read, resolution, resolve};
use crate::operator::idem;
use crate::postgres_roles::{direct, documented_sql, with_schema, Roles, ROLES};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_serves_and_is_operated_under_the_documented_grants() {
    let Some(url) = durable::database_url() else {
        return;
    };
    // The roles log in to the server itself: a pooler knows only its own
    // users.
    let url = direct(url);
    let blocks = documented_sql("### PostgreSQL");
    assert_eq!(
        blocks.len(),
        4,
        "docs/deploying.md's PostgreSQL grants: the roles and the schema, then serving, \
         reading and resolving: {blocks:#?}"
    );
    let schema = format!("g_{:08x}", Attempt::random().get() as u32);
    let roles = Roles::new(&url, &schema);
    let sql: Vec<String> = blocks.iter().map(|b| roles.sql(b)).collect();
    for role in ROLES {
        assert!(
            blocks[0].contains(role),
            "the page creates {role}: {}",
            blocks[0]
        );
    }

    let admin = durable::connect(&url).await;
    admin.batch_execute(&sql[0]).await.unwrap();
    let store_as = |name: &str| {
        PostgresStore::builder(&roles.url(name))
            .unwrap()
            .schema(&schema)
            .build()
            .unwrap()
    };
    store_as("idem_migrator").migrate().await.unwrap();
    let migrator = durable::connect(&roles.url("idem_migrator")).await;
    for block in &sql[1..] {
        migrator
            .batch_execute(block)
            .await
            .unwrap_or_else(|e| panic!("as idem_migrator: {e}: {block}"));
    }

    // Every table of the schema, the ones a later migration adds too, is
    // granted to each role.
    let tables: Vec<String> = admin
        .query(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1",
            &[&schema],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(tables.len() >= 4, "{tables:?}");
    for table in &tables {
        let qualified = format!("{schema}.{table}");
        let written: &[&str] = if table == "idem_migrations" {
            &["SELECT"]
        } else {
            &["SELECT", "INSERT", "UPDATE", "DELETE"]
        };
        for (name, privileges) in [
            ("idem_server", written),
            ("idem_reader", &["SELECT"][..]),
            ("idem_resolver", &["SELECT"][..]),
        ] {
            for privilege in privileges {
                let has: bool = admin
                    .query_one(
                        "SELECT has_table_privilege($1, $2, $3)",
                        &[&roles.role(name), &qualified, privilege],
                    )
                    .await
                    .unwrap()
                    .get(0);
                assert!(
                    has,
                    "docs/deploying.md grants {name} no {privilege} on {table}: a migration \
                     added the table without its grants"
                );
            }
        }
    }

    // Serving: every case of the contract; `migrate` finds nothing to do.
    let server = store_as("idem_server");
    server.migrate().await.unwrap();
    conformance::run_all(&server).await;

    // The command line: reading, then resolving.
    let filled = fill(&server).await;
    let reader = with_schema(&roles.url("idem_reader"), &schema);
    let resolver = with_schema(&roles.url("idem_resolver"), &schema);
    read(&reader, &filled).await;
    let tenant = filled.unknown.tenant.as_str();
    let unknown = filled.unknown.reference.to_string();
    let refused = idem(&reader, &resolution(&unknown, tenant)).await;
    assert_eq!(refused.code, EXIT_USAGE, "{refused:?}");
    assert!(refused.err.contains("42501"), "{}", refused.err);
    let record = server
        .lookup(tenant, &filled.unknown.reference)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state.kind(), RecordStateKind::Unknown);

    read(&resolver, &filled).await;
    resolve(&resolver, &filled).await;
    let record = server
        .lookup(tenant, &filled.unknown.reference)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state.kind(), RecordStateKind::Completed);
    let jobs = server
        .follow_ons()
        .unwrap()
        .list_follow_ons(&idem_runtime::store::FollowOnFilter {
            reference: Some(filled.dead.reference),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(
        jobs.iter().all(|j| !j.dead),
        "the dead job was re-driven: {jobs:?}"
    );
}
