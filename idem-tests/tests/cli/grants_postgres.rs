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

/// The SQL blocks of deploying.md's PostgreSQL section, in order.
fn documented_sql() -> Vec<String> {
    let page = include_str!("../../../docs/deploying.md");
    let start = page
        .find("\n### PostgreSQL\n")
        .expect("docs/deploying.md has a PostgreSQL section")
        + 1;
    let section = &page[start..];
    let end = section[1..].find("\n### ").map_or(section.len(), |e| e + 1);
    let mut blocks = Vec::new();
    let mut lines = section[..end].lines();
    while let Some(line) = lines.next() {
        if line.trim() == "```sql" {
            let block: Vec<&str> = lines
                .by_ref()
                .take_while(|l| l.trim() != "```")
                .map(str::trim)
                .collect();
            blocks.push(block.join("\n"));
        }
    }
    blocks
}

/// `sql` with each identifier of `names` (a whole word, outside string
/// literals) renamed.
fn rename(sql: &str, names: &[(&str, &str)]) -> String {
    let mut out = String::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let w = std::mem::take(word);
        match names.iter().find(|(from, _)| *from == w) {
            Some((_, to)) => out.push_str(to),
            None => out.push_str(&w),
        }
    };
    let mut literal = false;
    for c in sql.chars() {
        if !literal && (c.is_ascii_alphanumeric() || c == '_') {
            word.push(c);
            continue;
        }
        flush(&mut word, &mut out);
        if c == '\'' {
            literal = !literal;
        }
        out.push(c);
    }
    flush(&mut word, &mut out);
    out
}

/// `url` logging in as `role`.
fn as_role(url: &str, role: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{role}:change-me@{host}")
}

/// `url` with the store's schema, as the command line takes it.
fn with_schema(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}schema={schema}")
}

/// Drops the test's schema and roles, also after a failure.
struct Cleanup {
    url: String,
    schema: String,
    roles: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let (url, schema, roles) = (self.url.clone(), self.schema.clone(), self.roles.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let Ok((client, conn)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                else {
                    return;
                };
                tokio::spawn(conn);
                let _ = client
                    .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
                    .await;
                for role in roles {
                    let _ = client
                        .batch_execute(&format!(
                            "DROP OWNED BY \"{role}\"; DROP ROLE IF EXISTS \"{role}\""
                        ))
                        .await;
                }
            });
        })
        .join();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_serves_and_is_operated_under_the_documented_grants() {
    let Some(url) = durable::database_url() else {
        return;
    };
    // The roles log in to the server itself: a pooler knows only its own
    // users.
    let url = std::env::var("IDEM_TEST_DIRECT_DATABASE_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or(url);
    let blocks = documented_sql();
    assert_eq!(
        blocks.len(),
        4,
        "docs/deploying.md's PostgreSQL grants: the roles and the schema, then serving, \
         reading and resolving: {blocks:#?}"
    );
    let tag = format!("{:08x}", Attempt::random().get() as u32);
    let schema = format!("g_{tag}");
    let roles: Vec<(&str, String)> = [
        "idem_migrator",
        "idem_server",
        "idem_reader",
        "idem_resolver",
    ]
    .into_iter()
    .map(|r| (r, format!("{r}_{tag}")))
    .collect();
    let mut names: Vec<(&str, &str)> = roles.iter().map(|(r, to)| (*r, to.as_str())).collect();
    names.push(("idem", &schema));
    let sql: Vec<String> = blocks.iter().map(|b| rename(b, &names)).collect();
    for (role, _) in &roles {
        assert!(
            blocks[0].contains(role),
            "the page creates {role}: {}",
            blocks[0]
        );
    }
    let role = |name: &str| roles.iter().find(|(r, _)| *r == name).unwrap().1.clone();
    let _cleanup = Cleanup {
        url: url.clone(),
        schema: schema.clone(),
        roles: roles.iter().map(|(_, r)| r.clone()).collect(),
    };

    let admin = durable::connect(&url).await;
    admin.batch_execute(&sql[0]).await.unwrap();
    let store_as = |name: &str| {
        PostgresStore::builder(&as_role(&url, &role(name)))
            .unwrap()
            .schema(&schema)
            .build()
            .unwrap()
    };
    store_as("idem_migrator").migrate().await.unwrap();
    let migrator = durable::connect(&as_role(&url, &role("idem_migrator"))).await;
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
                        &[&role(name), &qualified, privilege],
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
    let reader = with_schema(&as_role(&url, &role("idem_reader")), &schema);
    let resolver = with_schema(&as_role(&url, &role("idem_resolver")), &schema);
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
        .list_jobs(&idem_runtime::store::JobFilter {
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
