//! A PostgreSQL replica of commit e11d36c, the last version of layout 6
//! (the one before migration 7), serving a schema beside this version's.
//!
//! What makes it faithful: what that version sent to the server. Its
//! statements on `idem_jobs` and the reconciler's deferral are replayed
//! here exactly, the text its `statements.rs` built (`git show
//! e11d36c:idem-runtime/src/store/postgres/statements.rs`, with `sql.rs`'s
//! `JOB_COLUMNS`, `JOB_STATE_BIT` and `jobs_filtered`, the state codes,
//! `RELAXED`, `REFERENCE` and `micros` written out; completions relaxed,
//! its default), with its parameters in its order and types, as named
//! statements on a connection of its own to the server itself (as it
//! prepared them): a completion or a resolution and its jobs in one
//! statement, as it sent them. Those are the statements that read or write
//! what migrations 7 and 8 changed (`attempts`, the columns 7 added); its
//! deferral has no hold, and it took no checks (its `take_check` is
//! answered taken, nothing written). Its claim and its completion without
//! jobs are the ones every version before migration 9 sent
//! (`postgres_before_functions`). Every other statement of that version
//! (the release, the sweep's, the lookup, the purge, the listings) reads
//! and writes what it did then, in the columns layout 6 has: those calls
//! go to this version's store on the same schema.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use idem_runtime::store::{
    Attempt, Claim, ClaimRequest, FollowOnFilter, FollowOnId, FollowOnRecord, FollowOnState,
    FollowOnStore, FollowOns, IdempotencyStore, Inspect, Record, RecordFilter, RecordStateKind,
    Resolution, StateCounts, StoreError, Upkeep,
};
use idem_runtime::{key::IdempotencyKey, PostgresStore, Reference};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

/// The commit whose statements these are.
pub const COMMIT: &str = "e11d36c";

/// A job row's columns as e11d36c read them (13).
const JOB_COLUMNS: &str = "tenant, reference, name, payload, attempts, token, \
                                      next_run_at, last_error, dead, created_at, updated_at, \
                                      delivered_at, kept_until";
const REFERENCE: &str = "CASE WHEN coalesce(operation, 0) = 0 THEN substring(key FROM 1 FOR 8) \
     ELSE substring(key FROM 1 FOR 8) || int8send(operation) END AS reference";
const RELAXED: &str = "relaxed AS (SELECT set_config('synchronous_commit', 'off', true) AS off)";

/// e11d36c's statements over the schema `schema` (quoted).
struct Statements {
    refusal: String,
    defer_check: String,
    complete_with_jobs: String,
    resolve_with_jobs: String,
    lease_follow_ons: String,
    finish_follow_on: String,
    retry_follow_on: String,
    bury_follow_on: String,
    redrive_follow_on: String,
    jobs_filtered: String,
    count_due_follow_ons: String,
}

/// e11d36c's `with_jobs`: a fenced change and its jobs in one statement.
fn with_jobs(first: &str, change: &str, jobs: &str, n: u8) -> String {
    let (names, payloads) = (n, n + 1);
    format!(
        "WITH {first}done AS ({change} RETURNING tenant, {REFERENCE}), \
         written AS ( \
           INSERT INTO {jobs} (tenant, reference, name, payload, attempts, token, next_run_at, \
             last_error, dead, created_at, updated_at) \
           SELECT done.tenant, done.reference, f.name, f.payload, 0, NULL, now(), NULL, \
             false, now(), now() \
           FROM done, unnest(${names}::text[], ${payloads}::bytea[]) AS f(name, payload) \
           ON CONFLICT (tenant, reference, name) DO NOTHING \
           RETURNING 1) \
         SELECT count(*) FROM done"
    )
}

impl Statements {
    fn new(schema: &str) -> Statements {
        let t = format!("{schema}.idem_records");
        let s = format!("{schema}.idem_superseded");
        let j = format!("{schema}.idem_jobs");
        let micros = |n: u8| format!("${n}::int8 * interval '1 microsecond'");
        let update_complete = format!(
            "UPDATE {t} SET state = 1, body = $3, updated_at = now() \
             FROM relaxed WHERE key = $1 AND attempt = $2 AND state <> 1"
        );
        let resolve_completed = format!(
            "UPDATE {t} SET state = 1, body = $3, resolution = $4, \
               updated_at = now() \
             WHERE key = $1 AND attempt = $2 AND state = 2"
        );
        Statements {
            refusal: format!("SELECT attempt, state, updated_at FROM {t} WHERE key = $1"),
            defer_check: format!(
                "UPDATE {t} SET next_check_at = now() + {}, checks = checks + 1 \
                 WHERE key = $1 AND attempt = $2 AND state = 2",
                micros(3)
            ),
            complete_with_jobs: with_jobs(&format!("{RELAXED}, "), &update_complete, &j, 4),
            resolve_with_jobs: with_jobs("", &resolve_completed, &j, 5),
            lease_follow_ons: format!(
                "UPDATE {j} SET token = $1, attempts = attempts + 1, \
                   next_run_at = now() + {}, updated_at = now() \
                 WHERE (tenant, reference, name) IN ( \
                   SELECT tenant, reference, name FROM {j} \
                   WHERE NOT dead AND delivered_at IS NULL AND next_run_at <= now() \
                     AND name = ANY($3::text[]) \
                   ORDER BY next_run_at LIMIT $4 FOR UPDATE SKIP LOCKED) \
                 RETURNING {JOB_COLUMNS}",
                micros(2)
            ),
            finish_follow_on: format!(
                "UPDATE {j} SET token = NULL, delivered_at = now(), updated_at = now(), \
                   kept_until = coalesce((SELECT retain_until FROM {t} \
                     WHERE key BETWEEN $5::bytea AND $6::bytea AND tenant = $1 \
                       AND coalesce(operation, 0) = $7::int8 \
                     ORDER BY key LIMIT 1), \
                   (SELECT retain_until FROM {s} \
                     WHERE key BETWEEN $5::bytea AND $6::bytea AND tenant = $1 \
                       AND operation = $7::int8 \
                     ORDER BY key LIMIT 1), now()) \
                 WHERE tenant = $1 AND reference = $2 AND name = $3 AND token = $4"
            ),
            retry_follow_on: format!(
                "UPDATE {j} SET token = NULL, next_run_at = now() + {}, last_error = $6, \
                   updated_at = now() \
                 WHERE tenant = $1 AND reference = $2 AND name = $3 AND token = $4",
                micros(5)
            ),
            bury_follow_on: format!(
                "UPDATE {j} SET token = NULL, dead = true, last_error = $5, updated_at = now() \
                 WHERE tenant = $1 AND reference = $2 AND name = $3 AND token = $4"
            ),
            redrive_follow_on: format!(
                "UPDATE {j} SET dead = false, attempts = 0, token = NULL, next_run_at = now(), \
                   updated_at = now() \
                 WHERE tenant = $1 AND reference = $2 AND name = $3 AND dead"
            ),
            jobs_filtered: format!(
                "SELECT {JOB_COLUMNS} FROM {j} \
                 WHERE ($1::text IS NULL OR tenant = $1::text) \
                   AND ($2::bytea IS NULL OR reference = $2::bytea) \
                   AND ($3::text IS NULL OR name = $3::text) \
                   AND ($4::int8 IS NULL OR ($4::int8 & CASE WHEN delivered_at IS NOT NULL \
                     THEN 8 WHEN dead THEN 4 \
                             WHEN token IS NOT NULL THEN 2 ELSE 1 END) <> 0) \
                 ORDER BY created_at, reference, name, tenant LIMIT $5::int8"
            ),
            count_due_follow_ons: format!(
                "SELECT name, count(*) FROM {j} \
                 WHERE NOT dead AND delivered_at IS NULL AND next_run_at <= now() \
                 GROUP BY name"
            ),
        }
    }
}

/// The replica's store: this version's for the statements the two share,
/// e11d36c's own on its connection for the rest.
#[derive(Clone)]
pub struct EarlierPostgres {
    shared: PostgresStore,
    /// Its claim and its completion, as every version before migration 9
    /// sent them.
    before: crate::postgres_before_functions::BeforeFunctions,
    client: Arc<Client>,
    sql: Arc<Statements>,
    /// How many times each of its own calls was answered.
    pub ran: Arc<Mutex<BTreeMap<&'static str, usize>>>,
}

impl std::fmt::Debug for EarlierPostgres {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EarlierPostgres({COMMIT})")
    }
}

fn unavailable(e: tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(format!("PostgreSQL: {e}"))
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// e11d36c's `row_to_job`, its 13 columns.
fn row_to_job(row: &Row) -> FollowOnRecord {
    let reference: &[u8] = row.get(1);
    let payload: Vec<u8> = row.get(3);
    FollowOnRecord {
        id: FollowOnId {
            tenant: row.get(0),
            reference: Reference::from_bytes(reference).expect("8 or 16 bytes"),
            name: row.get(2),
        },
        payload: String::from_utf8(payload).unwrap(),
        runs: row.get::<_, i32>(4).max(0) as u32,
        earlier_runs: 0,
        attempt: row
            .get::<_, Option<i64>>(5)
            .map(|t| Attempt::from_stored(t as u64)),
        next_run_at: row.get(6),
        last_error: row.get(7),
        error_before_redrive: None,
        dead: row.get(8),
        created_at: row.get(9),
        updated_at: row.get(10),
        delivered_at: row.get(11),
        kept_until: row.get(12),
    }
}

impl EarlierPostgres {
    /// The replica on the schema `name` at `url`: this version's store
    /// (built, which reads nothing), and e11d36c's connection.
    pub async fn open(url: &str, name: &str) -> EarlierPostgres {
        let shared = PostgresStore::builder(url)
            .unwrap()
            .schema(name)
            .build()
            .unwrap();
        let client = Arc::new(crate::durable::connect(url).await);
        EarlierPostgres {
            sql: Arc::new(Statements::new(&format!("\"{name}\""))),
            shared,
            before: crate::postgres_before_functions::BeforeFunctions::new(client.clone(), name),
            client,
            ran: Arc::default(),
        }
    }

    /// The role its connection logged in as: the test's question, not one
    /// of e11d36c's statements.
    pub async fn current_user(&self) -> String {
        self.client
            .query_one("SELECT current_user::text", &[])
            .await
            .unwrap()
            .get(0)
    }

    fn ran(&self, call: &'static str) {
        *self.ran.lock().unwrap().entry(call).or_default() += 1;
    }

    /// e11d36c's `refusal`: why a fenced change changed nothing.
    async fn refusal(&self, key: &[u8], attempt: Attempt) -> StoreError {
        let stmt = match self.client.prepare(&self.sql.refusal).await {
            Ok(stmt) => stmt,
            Err(e) => return unavailable(e),
        };
        match self.client.query_opt(&stmt, &[&key]).await {
            Ok(Some(row)) if row.get::<_, i64>(0) as u64 == attempt.get() => {
                StoreError::WrongState {
                    found: RecordStateKind::from_code(row.get::<_, i16>(1).into()).unwrap(),
                }
            }
            Ok(_) => StoreError::Fenced,
            Err(e) => unavailable(e),
        }
    }

    /// A statement that changes one row, or is refused.
    async fn fenced_count(
        &self,
        key: &[u8],
        attempt: Attempt,
        changed: u64,
    ) -> Result<(), StoreError> {
        if changed == 1 {
            Ok(())
        } else {
            Err(self.refusal(key, attempt).await)
        }
    }

    async fn execute(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, StoreError> {
        let stmt = self.client.prepare(sql).await.map_err(unavailable)?;
        self.client
            .execute(&stmt, params)
            .await
            .map_err(unavailable)
    }

    async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let stmt = self.client.prepare(sql).await.map_err(unavailable)?;
        self.client.query(&stmt, params).await.map_err(unavailable)
    }

    /// e11d36c's `fenced_job`.
    async fn fenced_job(
        &self,
        sql: &str,
        id: &FollowOnId,
        attempt: Attempt,
        rest: &[&(dyn ToSql + Sync)],
    ) -> Result<(), StoreError> {
        let (reference, attempt) = (id.reference.as_bytes(), attempt.get() as i64);
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&id.tenant, &reference, &id.name, &attempt];
        params.extend_from_slice(rest);
        match self.execute(sql, &params).await? {
            0 => Err(StoreError::Fenced),
            _ => Ok(()),
        }
    }

    /// e11d36c's `with_jobs`: the change and its jobs, one statement.
    async fn with_jobs(
        &self,
        sql: &str,
        key: &[u8],
        attempt: Attempt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(), StoreError> {
        let rows = self.query(sql, params).await?;
        let changed: i64 = rows[0].get(0);
        self.fenced_count(key, attempt, changed as u64).await
    }
}

#[async_trait]
impl IdempotencyStore for EarlierPostgres {
    fn backend(&self) -> &'static str {
        "postgres"
    }
    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let claimed = self.before.claim(req).await;
        if claimed.is_ok() {
            self.ran("claim");
        }
        claimed
    }
    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        let completed = self.before.complete(key, attempt, response).await;
        if completed.is_ok() {
            self.ran("complete");
        }
        completed
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
        Some(self)
    }
}

#[async_trait]
impl Upkeep for EarlierPostgres {
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
        _taken: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        let key = &key.as_bytes()[..];
        let changed = self
            .execute(
                &self.sql.defer_check,
                &[&key, &(attempt.get() as i64), &micros(delay)],
            )
            .await?;
        self.fenced_count(key, attempt, changed).await?;
        self.ran("defer_check");
        Ok(true)
    }
    async fn take_check(
        &self,
        _key: &IdempotencyKey,
        _attempt: Attempt,
        hold: Duration,
    ) -> Result<Option<SystemTime>, StoreError> {
        Ok(Some(SystemTime::now() + hold))
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
impl Inspect for EarlierPostgres {
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        self.shared.list_records(filter).await
    }
    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        self.shared.count_records().await
    }
}

#[async_trait]
impl FollowOnStore for EarlierPostgres {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        if jobs.is_empty() {
            return self.complete(key, attempt, response).await;
        }
        let (names, payloads): (Vec<&str>, Vec<&[u8]>) = jobs
            .iter()
            .map(|j| (j.name(), j.payload().as_bytes()))
            .unzip();
        let key = &key.as_bytes()[..];
        let params: [&(dyn ToSql + Sync); 5] = [
            &key,
            &(attempt.get() as i64),
            &response.as_bytes(),
            &names,
            &payloads,
        ];
        self.with_jobs(&self.sql.complete_with_jobs, key, attempt, &params)
            .await?;
        self.ran("complete_with_follow_ons");
        Ok(())
    }

    async fn resolve_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        if jobs.is_empty() {
            let completed = Resolution::Completed { response };
            return self.resolve(key, attempt, completed, note).await;
        }
        let (names, payloads): (Vec<&str>, Vec<&[u8]>) = jobs
            .iter()
            .map(|j| (j.name(), j.payload().as_bytes()))
            .unzip();
        let key = &key.as_bytes()[..];
        let note = note.map(str::as_bytes);
        let params: [&(dyn ToSql + Sync); 6] = [
            &key,
            &(attempt.get() as i64),
            &response.as_bytes(),
            &note,
            &names,
            &payloads,
        ];
        self.with_jobs(&self.sql.resolve_with_jobs, key, attempt, &params)
            .await?;
        self.ran("resolve_with_follow_ons");
        Ok(())
    }

    async fn lease_follow_ons(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        attempt: Attempt,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        if names.is_empty() || limit == 0 {
            return Ok(Vec::new());
        }
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .query(
                &self.sql.lease_follow_ons,
                &[&(attempt.get() as i64), &micros(lease), &names, &limit],
            )
            .await?;
        let mut leased: Vec<FollowOnRecord> = rows.iter().map(row_to_job).collect();
        leased.sort_by_key(|j| (j.created_at, j.id.reference, j.id.name.clone()));
        self.ran("lease_jobs");
        Ok(leased)
    }

    async fn finish_follow_on(&self, id: &FollowOnId, attempt: Attempt) -> Result<(), StoreError> {
        let (mut lo, mut hi) = ([0u8; 32], [0xffu8; 32]);
        lo[..8].copy_from_slice(&id.reference.key_prefix());
        hi[..8].copy_from_slice(&id.reference.key_prefix());
        let tag = id.reference.tag() as i64;
        let rest: [&(dyn ToSql + Sync); 3] = [&&lo[..], &&hi[..], &tag];
        self.fenced_job(&self.sql.finish_follow_on, id, attempt, &rest)
            .await?;
        self.ran("finish_job");
        Ok(())
    }

    async fn retry_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        self.fenced_job(
            &self.sql.retry_follow_on,
            id,
            attempt,
            &[&micros(delay), &error],
        )
        .await?;
        self.ran("retry_job");
        Ok(())
    }

    async fn bury_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        error: &str,
    ) -> Result<(), StoreError> {
        self.fenced_job(&self.sql.bury_follow_on, id, attempt, &[&error])
            .await?;
        self.ran("bury_job");
        Ok(())
    }

    async fn list_follow_ons(
        &self,
        filter: &FollowOnFilter,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let reference = filter.reference.map(|r| r.as_bytes().to_vec());
        let states = (!filter.states.is_empty()).then(|| {
            filter.states.iter().fold(0i64, |mask, state| {
                mask | match state {
                    FollowOnState::Waiting => 1,
                    FollowOnState::Running => 2,
                    FollowOnState::Dead => 4,
                    FollowOnState::Delivered => 8,
                }
            })
        });
        let rows = self
            .query(
                &self.sql.jobs_filtered,
                &[&filter.tenant, &reference, &filter.name, &states, &limit],
            )
            .await?;
        self.ran("list_jobs");
        Ok(rows.iter().map(row_to_job).collect())
    }

    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError> {
        let reference = id.reference.as_bytes();
        let changed = self
            .execute(
                &self.sql.redrive_follow_on,
                &[&id.tenant, &reference, &id.name],
            )
            .await?;
        self.ran("redrive_job");
        Ok(changed == 1)
    }

    async fn count_due_follow_ons(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let rows = self.query(&self.sql.count_due_follow_ons, &[]).await?;
        let mut due = BTreeMap::new();
        for row in rows {
            let (name, n): (String, i64) = (row.get(0), row.get(1));
            due.insert(name, u64::try_from(n).unwrap_or(0));
        }
        self.ran("count_due_jobs");
        Ok(due)
    }
}
