//! The claim and the completion of the PostgreSQL store as every version
//! before migration 9 sent them (c0e6665, the last of layout 8, and
//! e11d36c, the last of layout 6, alike): the upsert, the read of what it
//! found and the takeover of a record that must be kept, in rounds; the
//! relaxed `UPDATE`. Migration 9 turned both into functions of the schema;
//! a replica of such a version keeps sending these beside this version's.
//!
//! What makes it faithful: the text its `statements.rs` built (`git show
//! c0e6665:idem-runtime/src/store/postgres/statements.rs`, with `sql.rs`'s
//! `COLUMNS`, `claimable`, `outlives_takeover`, `takeover_operation`,
//! `superseded_copy` and `superseded_replace`, the state codes and `micros`
//! written out; completions relaxed, its default), with its parameters in
//! its order and types, as named statements on a connection of its own to
//! the server itself; the Rust between them is its `postgres/mod.rs`'s
//! `claim`. Every other statement of c0e6665 is this version's, text for
//! text (`git diff c0e6665 -- idem-runtime/src/store/postgres/statements.rs`
//! changes only these four and the batched completion, which a replica
//! sends only under concurrency, as the completion does one at a time).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use idem_runtime::store::{
    Attempt, Claim, ClaimRequest, FollowOnStore, IdempotencyStore, Inspect, Record, RecordFilter,
    RecordState, RecordStateKind, Resolution, StateCounts, StoreError, Upkeep,
};
use idem_runtime::{key::IdempotencyKey, PostgresStore, Reference};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

const COLUMNS: &str = "key, fingerprint, tenant, tool, state, attempt, claimed_at, \
                       updated_at, lease_until, expires_at, retain_until, body, \
                       next_check_at, checks, resolution, operation";

/// The four statements, over one schema.
struct Statements {
    claim: String,
    take_over: String,
    read: String,
    complete: String,
    refusal: String,
}

impl Statements {
    fn new(schema: &str) -> Statements {
        let t = format!("{schema}.idem_records");
        let s = format!("{schema}.idem_superseded");
        let micros = |n: u8| format!("${n}::int8 * interval '1 microsecond'");
        let (lease, window, retention) = (micros(6), micros(7), micros(8));
        let claimable = |r: &str| {
            format!(
                "(({r}state = 1 AND {r}expires_at <= now()) OR {r}state = 3 \
                 OR ({r}state IN (0, 2) AND {r}retain_until <= now() \
                   AND {r}lease_until <= now()))"
            )
        };
        let outlives = |r: &str, offered: &str| {
            format!(
                "(NOT ({r}state = 3 AND {r}expires_at > now()) \
                 AND coalesce({r}operation, 0) <> {offered} AND {r}retain_until > now())"
            )
        };
        let takeover_operation = |r: &str, offered: &str| {
            format!(
                "CASE WHEN {r}state = 3 AND {r}expires_at > now() \
                 THEN {r}operation ELSE {offered} END"
            )
        };
        let copy = "old.key, old.fingerprint, old.tenant, old.tool, old.state, old.attempt, \
                    old.claimed_at, old.updated_at, old.lease_until, old.expires_at, \
                    old.retain_until, old.body, old.next_check_at, old.checks, \
                    old.resolution, coalesce(old.operation, 0)";
        let replace = "ON CONFLICT (key, operation) DO UPDATE SET \
                       fingerprint = EXCLUDED.fingerprint, tenant = EXCLUDED.tenant, \
                       tool = EXCLUDED.tool, state = EXCLUDED.state, \
                       attempt = EXCLUDED.attempt, claimed_at = EXCLUDED.claimed_at, \
                       updated_at = EXCLUDED.updated_at, lease_until = EXCLUDED.lease_until, \
                       expires_at = EXCLUDED.expires_at, retain_until = EXCLUDED.retain_until, \
                       body = EXCLUDED.body, next_check_at = EXCLUDED.next_check_at, \
                       checks = EXCLUDED.checks, resolution = EXCLUDED.resolution";
        Statements {
            claim: format!(
                "INSERT INTO {t} AS r (key, fingerprint, tenant, tool, state, attempt, \
                   claimed_at, updated_at, lease_until, expires_at, retain_until, body, \
                   next_check_at, checks, resolution, operation) \
                 VALUES ($1, $2, $3, $4, 0, $5, now(), now(), \
                   now() + {lease}, now() + {window}, now() + {retention}, NULL, now(), 0, NULL, \
                   $9) \
                 ON CONFLICT (key) DO UPDATE SET operation = {}, \
                   fingerprint = EXCLUDED.fingerprint, \
                   tenant = EXCLUDED.tenant, tool = EXCLUDED.tool, state = 0, \
                   attempt = EXCLUDED.attempt, claimed_at = EXCLUDED.claimed_at, \
                   updated_at = EXCLUDED.updated_at, lease_until = EXCLUDED.lease_until, \
                   expires_at = EXCLUDED.expires_at, retain_until = EXCLUDED.retain_until, \
                   body = NULL, next_check_at = EXCLUDED.next_check_at, checks = 0, \
                   resolution = NULL \
                 WHERE {} AND NOT {} \
                 RETURNING operation",
                takeover_operation("r.", "EXCLUDED.operation"),
                claimable("r."),
                outlives("r.", "EXCLUDED.operation"),
            ),
            take_over: format!(
                "WITH old AS (SELECT {COLUMNS} FROM {t} WHERE key = $1 AND attempt = $10 \
                   FOR UPDATE), \
                 taken AS ( \
                   UPDATE {t} AS r SET operation = {}, fingerprint = $2, tenant = $3, \
                     tool = $4, state = 0, attempt = $5, claimed_at = now(), \
                     updated_at = now(), lease_until = now() + {lease}, \
                     expires_at = now() + {window}, retain_until = now() + {retention}, \
                     body = NULL, next_check_at = now(), checks = 0, resolution = NULL \
                   FROM old WHERE r.key = old.key AND r.attempt = old.attempt AND {} \
                   RETURNING r.operation), \
                 kept AS ( \
                   INSERT INTO {s} ({COLUMNS}) SELECT {copy} FROM old, taken WHERE {} \
                   {replace}) \
                 SELECT operation FROM taken",
                takeover_operation("r.", "$9::int8"),
                claimable("r."),
                outlives("old.", "$9::int8"),
            ),
            read: format!("SELECT {COLUMNS}, now() FROM {t} WHERE key = $1"),
            complete: format!(
                "WITH relaxed AS (SELECT set_config('synchronous_commit', 'off', true) AS off) \
                 UPDATE {t} SET state = 1, body = $3, updated_at = now() \
                 FROM relaxed WHERE key = $1 AND attempt = $2 AND state <> 1"
            ),
            refusal: format!("SELECT attempt, state, updated_at FROM {t} WHERE key = $1"),
        }
    }
}

/// The claim and the completion of a version before migration 9, on a
/// connection of its own.
#[derive(Clone)]
pub struct BeforeFunctions {
    client: Arc<Client>,
    sql: Arc<Statements>,
    /// How many times each call was answered.
    pub ran: Arc<Mutex<BTreeMap<&'static str, usize>>>,
}

fn unavailable(e: tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(format!("PostgreSQL: {e}"))
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// c0e6665's `row_to_record`: `{COLUMNS}, now()`.
fn row_to_record(row: &Row) -> Record {
    let text = |i: usize| -> Option<String> {
        row.get::<_, Option<Vec<u8>>>(i)
            .map(|b| String::from_utf8(b).unwrap())
    };
    let key: &[u8] = row.get(0);
    let fingerprint: &[u8] = row.get(1);
    let key = IdempotencyKey::from_parts(key.try_into().unwrap(), fingerprint.try_into().unwrap());
    let kind = RecordStateKind::from_code(row.get::<_, i16>(4).into()).unwrap();
    Record {
        key,
        reference: Reference::with_tag(&key, row.get::<_, Option<i64>>(15).unwrap_or(0) as u64),
        tenant: row.get(2),
        tool: row.get(3),
        attempt: Attempt::from_stored(row.get::<_, i64>(5) as u64),
        state: RecordState::from_stored(kind, text(11)).unwrap(),
        claimed_at: row.get(6),
        updated_at: row.get(7),
        lease_until: row.get(8),
        expires_at: row.get(9),
        retain_until: row.get(10),
        next_check_at: row.get(12),
        checks: row.get::<_, i32>(13).max(0) as u32,
        resolution: text(14),
        observed_at: row.get(16),
    }
}

impl BeforeFunctions {
    /// The calls on the schema `name` (unquoted), on `client`.
    pub fn new(client: Arc<Client>, name: &str) -> BeforeFunctions {
        BeforeFunctions {
            client,
            sql: Arc::new(Statements::new(&format!("\"{name}\""))),
            ran: Arc::default(),
        }
    }

    fn ran(&self, call: &'static str) {
        *self.ran.lock().unwrap().entry(call).or_default() += 1;
    }

    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let stmt = self.client.prepare(sql).await.map_err(unavailable)?;
        self.client.query(&stmt, params).await.map_err(unavailable)
    }

    /// c0e6665's `claim`: the upsert; else the read of the record it
    /// found, an answer unless it can be taken over by then; else the
    /// takeover of the record read, in rounds.
    pub async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let key = &req.key.as_bytes()[..];
        let fingerprint = &req.key.fingerprint()[..];
        let (attempt, lease, window) = (
            req.attempt.get() as i64,
            micros(req.lease),
            micros(req.window),
        );
        let retention = micros(req.retain_for());
        let tag = req.reference.tag() as i64;
        let params: [&(dyn ToSql + Sync); 9] = [
            &key,
            &fingerprint,
            &req.tenant,
            &req.tool,
            &attempt,
            &lease,
            &window,
            &retention,
            &tag,
        ];
        let claimed_as = |row: &Row| {
            let tag: Option<i64> = row.get(0);
            Claim::Claimed {
                reference: Reference::with_tag(&req.key, tag.unwrap_or(0) as u64),
            }
        };
        for _ in 0..16 {
            if let Some(row) = self.query(&self.sql.claim, &params).await?.first() {
                self.ran("claim");
                return Ok(claimed_as(row));
            }
            let Some(row) = self.query(&self.sql.read, &[&key]).await?.pop() else {
                continue;
            };
            let record = row_to_record(&row);
            if !record.is_claimable(record.observed_at) {
                self.ran("claim");
                return Ok(Claim::Existing { record });
            }
            let read_attempt = record.attempt.get() as i64;
            let mut with_read = params.to_vec();
            with_read.push(&read_attempt);
            if let Some(row) = self.query(&self.sql.take_over, &with_read).await?.first() {
                self.ran("claim");
                return Ok(claimed_as(row));
            }
        }
        Err(StoreError::Unavailable(
            "the claim kept racing with deletions of the same record".into(),
        ))
    }

    /// c0e6665's `complete` (relaxed), refused as it refused.
    pub async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        let key = &key.as_bytes()[..];
        let fence = attempt.get() as i64;
        let stmt = self
            .client
            .prepare(&self.sql.complete)
            .await
            .map_err(unavailable)?;
        let changed = self
            .client
            .execute(&stmt, &[&key, &fence, &response.as_bytes()])
            .await
            .map_err(unavailable)?;
        if changed == 1 {
            self.ran("complete");
            return Ok(());
        }
        let found = self.query(&self.sql.refusal, &[&key]).await?;
        Err(match found.first() {
            Some(row) if row.get::<_, i64>(0) as u64 == attempt.get() => StoreError::WrongState {
                found: RecordStateKind::from_code(row.get::<_, i16>(1).into()).unwrap(),
            },
            _ => StoreError::Fenced,
        })
    }
}

/// A replica of c0e6665, the last version of layout 8: its claim and its
/// completion ([`BeforeFunctions`]) on a connection of its own, and this
/// version's store for every other call, whose statements are its own.
#[derive(Clone)]
pub struct LayoutEight {
    shared: PostgresStore,
    /// Its own calls.
    pub calls: BeforeFunctions,
}

impl std::fmt::Debug for LayoutEight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LayoutEight({COMMIT})")
    }
}

/// The commit whose claim and completion these are.
pub const COMMIT: &str = "c0e6665";

impl LayoutEight {
    /// The replica on the schema `name` at `url`: this version's store
    /// (built, which reads nothing), and c0e6665's connection.
    pub async fn open(url: &str, name: &str) -> LayoutEight {
        let shared = PostgresStore::builder(url)
            .unwrap()
            .schema(name)
            .build()
            .unwrap();
        let client = Arc::new(crate::durable::connect(url).await);
        LayoutEight {
            shared,
            calls: BeforeFunctions::new(client, name),
        }
    }

    /// The role its connection logged in as.
    pub async fn current_user(&self) -> String {
        self.calls
            .client
            .query_one("SELECT current_user::text", &[])
            .await
            .unwrap()
            .get(0)
    }
}

#[async_trait]
impl IdempotencyStore for LayoutEight {
    fn backend(&self) -> &'static str {
        "postgres"
    }
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        self.calls.claim(req).await
    }
    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        self.calls.complete(key, attempt, response).await
    }
    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        self.shared.release(key, attempt).await
    }
    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        self.shared.mark_unknown(key, attempt, note).await
    }
    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.shared.heartbeat(key, attempt, lease).await
    }
    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        self.shared.lookup(tenant, reference).await
    }
    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        self.shared.follow_ons()
    }
}

#[async_trait]
impl Upkeep for LayoutEight {
    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        self.shared.mark_lapsed(key, attempt, note).await
    }
    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        self.shared.resolve(key, attempt, resolution, note).await
    }
    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
        taken: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        self.shared.defer_check(key, attempt, delay, taken).await
    }
    async fn take_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        hold: Duration,
    ) -> Result<Option<SystemTime>, StoreError> {
        self.shared.take_check(key, attempt, hold).await
    }
    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        self.shared.purge_expired(batch).await
    }
    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.shared.list_lapsed(limit).await
    }
    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.shared.list_unknown(limit).await
    }
}

#[async_trait]
impl Inspect for LayoutEight {
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        self.shared.list_records(filter).await
    }
    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        self.shared.count_records().await
    }
}
