//! PostgreSQL under the roles docs/deploying.md documents, for the tests
//! that run its statements: the SQL blocks read from the page, renamed to
//! roles and a schema of the test's own (so that tests running at once do
//! not collide), URLs that log in as each role, and the roles and the
//! schema dropped when the test ends, after a failure too.
#![allow(dead_code)]

/// The roles the page creates, as it names them.
pub const ROLES: [&str; 4] = [
    "idem_migrator",
    "idem_server",
    "idem_reader",
    "idem_resolver",
];

/// The SQL blocks of deploying.md's section under `heading` (its whole
/// line, e.g. `### PostgreSQL`), in order: up to the next heading of the
/// same level or above.
pub fn documented_sql(heading: &str) -> Vec<String> {
    let page = include_str!("../../../docs/deploying.md");
    let level = heading.chars().take_while(|c| *c == '#').count();
    let mut lines = page
        .lines()
        .skip_while(|l| *l != heading)
        .skip(1)
        .peekable();
    assert!(
        lines.peek().is_some(),
        "docs/deploying.md has no section `{heading}`"
    );
    let mut blocks = Vec::new();
    while let Some(line) = lines.next() {
        let trimmed = line.trim();
        let depth = line.chars().take_while(|c| *c == '#').count();
        if trimmed == "```sql" {
            let block: Vec<&str> = lines
                .by_ref()
                .take_while(|l| l.trim() != "```")
                .map(str::trim)
                .collect();
            blocks.push(block.join("\n"));
        } else if trimmed.starts_with("```") {
            // Another language's block: a `#` line in it is no heading.
            lines.by_ref().find(|l| l.trim() == "```");
        } else if depth > 0 && depth <= level {
            break;
        }
    }
    blocks
}

/// `sql` with each identifier of `names` (a whole word, outside string
/// literals) renamed.
pub fn rename(sql: &str, names: &[(&str, &str)]) -> String {
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

/// `url` logging in as `role`, with the page's password.
pub fn as_role(url: &str, role: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{role}:change-me@{host}")
}

/// `url` with the store's schema, as `open_store` and the command line
/// take it.
pub fn with_schema(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}schema={schema}")
}

/// The server the roles log in to: `IDEM_TEST_DIRECT_DATABASE_URL` when
/// set, else `url`. A pooler knows only its own users.
pub fn direct(url: String) -> String {
    std::env::var("IDEM_TEST_DIRECT_DATABASE_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or(url)
}

/// The page's roles and a schema, renamed for one test. They are created
/// by the page's own statements ([`Roles::sql`] of its first block), and
/// dropped, with the schema and all they own, when this is dropped.
pub struct Roles {
    url: String,
    schema: String,
    roles: Vec<(&'static str, String)>,
}

impl Roles {
    /// The roles for the schema `schema`, on the server at `url` (the
    /// administrator's URL, which drops them).
    pub fn new(url: &str, schema: &str) -> Roles {
        let tag = format!(
            "{:08x}",
            idem_runtime::store::Attempt::random().get() as u32
        );
        Roles {
            url: url.to_string(),
            schema: schema.to_string(),
            roles: ROLES.iter().map(|r| (*r, format!("{r}_{tag}"))).collect(),
        }
    }

    /// The test's name of the page's role `documented`.
    pub fn role(&self, documented: &str) -> &str {
        &self
            .roles
            .iter()
            .find(|(r, _)| *r == documented)
            .unwrap_or_else(|| panic!("the page creates no role {documented}"))
            .1
    }

    /// The server's URL, logging in as the page's role `documented`.
    pub fn url(&self, documented: &str) -> String {
        as_role(&self.url, self.role(documented))
    }

    /// The page's statements `sql`, with the test's roles and schema (the
    /// page's `idem`).
    pub fn sql(&self, sql: &str) -> String {
        let mut names: Vec<(&str, &str)> =
            self.roles.iter().map(|(r, to)| (*r, to.as_str())).collect();
        names.push(("idem", &self.schema));
        rename(sql, &names)
    }
}

impl Drop for Roles {
    fn drop(&mut self) {
        let url = self.url.clone();
        let schema = self.schema.clone();
        let roles: Vec<String> = self.roles.iter().map(|(_, r)| r.clone()).collect();
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
