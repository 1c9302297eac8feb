//! A PostgreSQL replica of an earlier commit, serving a schema beside
//! this version's: 8d26ab9, the last of layout 5 (the layout of 0.1.0,
//! before migration 6), or d97a05f, the last of layout 4 (before
//! migration 5).
//!
//! What makes it faithful: every statement it sends is that commit's own
//! text (`tests/data/sql_earlier/COMMIT-postgres.sql`, printed by that
//! commit's `statements.rs` and `sql.rs` compiled alone, completions
//! relaxed as 8d26ab9 did by default), as named statements with its parameters in its
//! order and types, on a connection of its own to the server itself (as
//! it prepared them). The Rust between the statements is that commit's
//! `postgres/mod.rs` as it was (a claim is its upsert, then the read of
//! what it found, in rounds; a refused change reads why; the purge
//! deletes records, then delivered jobs), written here against the public
//! types. It took no checks (its `take_check` is answered taken, nothing
//! written), and knew nothing of `idem_superseded`: a record it takes over
//! after the window is replaced whole, and its purge deletes a record once
//! its window has ended. d97a05f also deleted a job once it was delivered
//! (a job had no `delivered_at` before migration 5), and listed jobs by
//! `dead` alone.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use idem_runtime::store::{
    Attempt, Claim, ClaimRequest, FollowOnFilter, FollowOnId, FollowOnRecord, FollowOnState,
    FollowOnStore, FollowOns, IdempotencyStore, Inspect, Record, RecordFilter, RecordState,
    RecordStateKind, Resolution, StateCounts, StoreError, Upkeep,
};
use idem_runtime::{key::IdempotencyKey, Reference};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Row};

/// The replica's store: 8d26ab9's statements on a connection of its own.
#[derive(Clone)]
pub struct PostgresReplayed {
    /// The commit replayed.
    pub commit: &'static str,
    layout: usize,
    client: Arc<Client>,
    sql: Arc<HashMap<&'static str, String>>,
    /// How many times each of its calls was answered.
    pub ran: Arc<Mutex<BTreeMap<&'static str, usize>>>,
}

impl std::fmt::Debug for PostgresReplayed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PostgresReplayed({})", self.commit)
    }
}

fn unavailable(e: tokio_postgres::Error) -> StoreError {
    StoreError::Unavailable(format!("PostgreSQL: {e}"))
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// 8d26ab9's `state_from`.
fn state_from(code: i16, body: Option<String>) -> RecordState {
    match (RecordStateKind::from_code(code.into()), body) {
        (Some(RecordStateKind::InProgress), _) => RecordState::InProgress,
        (Some(RecordStateKind::Completed), Some(response)) => RecordState::Completed { response },
        (Some(RecordStateKind::Unknown), note) => RecordState::Unknown {
            note: note.unwrap_or_default(),
        },
        (Some(RecordStateKind::NotPerformed), note) => RecordState::NotPerformed {
            note: note.unwrap_or_default(),
        },
        (_, _) => panic!("state {code}"),
    }
}

/// 8d26ab9's `row_to_record`: `{COLUMNS}, now()`.
fn row_to_record(row: &Row) -> Record {
    let text = |i: usize| -> Option<String> {
        row.get::<_, Option<Vec<u8>>>(i)
            .map(|b| String::from_utf8(b).unwrap())
    };
    let key: &[u8] = row.get(0);
    let fingerprint: &[u8] = row.get(1);
    let key = IdempotencyKey::from_parts(key.try_into().unwrap(), fingerprint.try_into().unwrap());
    let tag = row.get::<_, Option<i64>>(15);
    Record {
        key,
        reference: Reference::with_tag(&key, tag.unwrap_or(0) as u64),
        tenant: row.get(2),
        tool: row.get(3),
        attempt: Attempt::from_stored(row.get::<_, i64>(5) as u64),
        state: state_from(row.get(4), text(11)),
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
/// The commit's `row_to_job`: 13 columns, or 11 before migration 5.
fn row_to_job(row: &Row) -> FollowOnRecord {
    let delivered = row.len() > 11;
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
        delivered_at: if delivered { row.get(11) } else { None },
        kept_until: if delivered { row.get(12) } else { None },
    }
}

impl PostgresReplayed {
    /// The replica of `commit` on the schema `name` at `url`, on a
    /// connection of its own.
    pub async fn open(url: &str, name: &str, commit: &'static str) -> PostgresReplayed {
        let schema = format!("\"{name}\"");
        let (layout, text) = match commit {
            "8d26ab9" => (5, include_str!("../data/sql_earlier/8d26ab9-postgres.sql")),
            "d97a05f" => (4, include_str!("../data/sql_earlier/d97a05f-postgres.sql")),
            other => panic!("no statements of {other}"),
        };
        let sql = crate::sql_layouts::statements(text)
            .into_iter()
            .map(|(k, v)| (k, v.replace("{schema}", &schema)))
            .collect();
        PostgresReplayed {
            commit,
            layout,
            client: Arc::new(crate::durable::connect(url).await),
            sql: Arc::new(sql),
            ran: Arc::default(),
        }
    }

    /// The role its connection logged in as: the test's question, not one
    /// of the commit's statements.
    pub async fn current_user(&self) -> String {
        self.client
            .query_one("SELECT current_user::text", &[])
            .await
            .unwrap()
            .get(0)
    }

    fn sql(&self, name: &str) -> &str {
        self.sql
            .get(name)
            .unwrap_or_else(|| panic!("{} has no statement {name}", self.commit))
    }

    fn ran(&self, call: &'static str) {
        *self.ran.lock().unwrap().entry(call).or_default() += 1;
    }

    async fn execute(&self, name: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, StoreError> {
        let stmt = self
            .client
            .prepare(self.sql(name))
            .await
            .map_err(unavailable)?;
        self.client
            .execute(&stmt, params)
            .await
            .map_err(unavailable)
    }

    async fn query(
        &self,
        name: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let stmt = self
            .client
            .prepare(self.sql(name))
            .await
            .map_err(unavailable)?;
        self.client.query(&stmt, params).await.map_err(unavailable)
    }

    /// 8d26ab9's `found`.
    async fn found(
        &self,
        key: &[u8],
    ) -> Result<Option<(Attempt, RecordStateKind, SystemTime)>, StoreError> {
        let rows = self.query("refusal", &[&key]).await?;
        Ok(rows.first().map(|row| {
            (
                Attempt::from_stored(row.get::<_, i64>(0) as u64),
                RecordStateKind::from_code(row.get::<_, i16>(1).into()).unwrap(),
                row.get(2),
            )
        }))
    }

    /// 8d26ab9's `refusal`.
    async fn refusal(&self, key: &[u8], attempt: Attempt) -> StoreError {
        match self.found(key).await {
            Err(e) => e,
            Ok(Some((owner, found, _))) if owner == attempt => StoreError::WrongState { found },
            Ok(_) => StoreError::Fenced,
        }
    }

    /// 8d26ab9's `fenced`.
    async fn fenced(
        &self,
        name: &str,
        key: &[u8],
        attempt: Attempt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(), StoreError> {
        if self.execute(name, params).await? == 1 {
            Ok(())
        } else {
            Err(self.refusal(key, attempt).await)
        }
    }

    /// 8d26ab9's `fenced_job`.
    async fn fenced_job(
        &self,
        name: &str,
        id: &FollowOnId,
        attempt: Attempt,
        rest: &[&(dyn ToSql + Sync)],
    ) -> Result<(), StoreError> {
        let (reference, attempt) = (id.reference.as_bytes(), attempt.get() as i64);
        let mut params: Vec<&(dyn ToSql + Sync)> = vec![&id.tenant, &reference, &id.name, &attempt];
        params.extend_from_slice(rest);
        match self.execute(name, &params).await? {
            0 => Err(StoreError::Fenced),
            _ => Ok(()),
        }
    }

    /// 8d26ab9's `with_jobs`: the change and its jobs, one statement.
    async fn with_jobs(
        &self,
        name: &str,
        key: &[u8],
        attempt: Attempt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(), StoreError> {
        let rows = self.query(name, params).await?;
        if rows[0].get::<_, i64>(0) == 1 {
            Ok(())
        } else {
            Err(self.refusal(key, attempt).await)
        }
    }

    async fn list(&self, name: &str, limit: usize) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self.query(name, &[&limit]).await?;
        Ok(rows.iter().map(row_to_record).collect())
    }
}

fn key_range(reference: &Reference) -> ([u8; 32], [u8; 32]) {
    let (mut lo, mut hi) = ([0u8; 32], [0xffu8; 32]);
    lo[..8].copy_from_slice(&reference.key_prefix());
    hi[..8].copy_from_slice(&reference.key_prefix());
    (lo, hi)
}

#[async_trait]
impl IdempotencyStore for PostgresReplayed {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let key = &req.key.as_bytes()[..];
        for _ in 0..16 {
            let claimed = self
                .query(
                    "claim",
                    &[
                        &key,
                        &&req.key.fingerprint()[..],
                        &req.tenant,
                        &req.tool,
                        &(req.attempt.get() as i64),
                        &micros(req.lease),
                        &micros(req.window),
                        &micros(req.retention.max(req.window)),
                        &(req.reference.tag() as i64),
                    ],
                )
                .await?;
            if let Some(row) = claimed.first() {
                let tag: Option<i64> = row.get(0);
                let reference = Reference::with_tag(&req.key, tag.unwrap_or(0) as u64);
                self.ran("claim");
                return Ok(Claim::Claimed { reference });
            }
            if let Some(row) = self.query("read", &[&key]).await?.first() {
                let record = row_to_record(row);
                if !record.is_claimable(record.observed_at) {
                    self.ran("claim");
                    return Ok(Claim::Existing { record });
                }
            }
        }
        Err(StoreError::Unavailable(
            "the claim kept racing with deletions of the same record".into(),
        ))
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        let key = &key.as_bytes()[..];
        self.fenced(
            "complete",
            key,
            attempt,
            &[&key, &(attempt.get() as i64), &response.as_bytes()],
        )
        .await?;
        self.ran("complete");
        Ok(())
    }

    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        let key = &key.as_bytes()[..];
        self.fenced("release", key, attempt, &[&key, &(attempt.get() as i64)])
            .await
    }

    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        let key = &key.as_bytes()[..];
        self.fenced(
            "mark_unknown",
            key,
            attempt,
            &[&key, &(attempt.get() as i64), &note.as_bytes()],
        )
        .await
    }

    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let key = &key.as_bytes()[..];
        self.fenced(
            "heartbeat",
            key,
            attempt,
            &[&key, &(attempt.get() as i64), &micros(lease)],
        )
        .await
    }

    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        let (lo, hi) = key_range(reference);
        let tag = reference.tag() as i64;
        let rows = self
            .query("lookup", &[&&lo[..], &&hi[..], &tenant, &tag])
            .await?;
        self.ran("lookup");
        Ok(rows.first().map(row_to_record))
    }

    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        Some(self)
    }
}

#[async_trait]
impl Upkeep for PostgresReplayed {
    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        let key = &key.as_bytes()[..];
        let params: &[&(dyn ToSql + Sync)] = &[&key, &(attempt.get() as i64), &note.as_bytes()];
        self.ran("mark_lapsed");
        if self.execute("mark_lapsed", params).await? == 1 {
            return Ok(true);
        }
        match self.refusal(key, attempt).await {
            StoreError::WrongState {
                found: RecordStateKind::InProgress,
            } => Ok(false),
            refused => Err(refused),
        }
    }

    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        let key = &key.as_bytes()[..];
        let note = note.map(str::as_bytes);
        let a = attempt.get() as i64;
        let (changed, settle) = match resolution {
            Resolution::Completed { response } => (
                self.execute(
                    "resolve_completed",
                    &[&key, &a, &response.as_bytes(), &note],
                )
                .await?,
                None,
            ),
            Resolution::NotPerformed { note: body, settle } => (
                self.execute(
                    "resolve_not_performed",
                    &[&key, &a, &body.as_bytes(), &note, &micros(settle)],
                )
                .await?,
                Some(settle),
            ),
        };
        if changed == 1 {
            return Ok(());
        }
        match (self.found(key).await?, settle) {
            (Some((owner, RecordStateKind::Unknown, updated_at)), Some(settle))
                if owner == attempt =>
            {
                Err(StoreError::NotSettled {
                    until: updated_at + settle,
                })
            }
            _ => Err(self.refusal(key, attempt).await),
        }
    }

    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
        _taken: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        let key = &key.as_bytes()[..];
        self.fenced(
            "defer_check",
            key,
            attempt,
            &[&key, &(attempt.get() as i64), &micros(delay)],
        )
        .await?;
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
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        let records = self.execute("purge", &[&batch]).await?;
        self.ran("purge_expired");
        let left = batch - i64::try_from(records).unwrap_or(batch);
        if left <= 0 || self.layout < 5 {
            return Ok(records as usize);
        }
        let jobs = self.execute("purge_jobs", &[&left]).await?;
        Ok((records + jobs) as usize)
    }

    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.ran("list_lapsed");
        self.list("lapsed", limit).await
    }

    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.ran("list_unknown");
        self.list("unknown", limit).await
    }
}

#[async_trait]
impl Inspect for PostgresReplayed {
    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(filter.limit).unwrap_or(i64::MAX);
        let state = filter.state.map(|s| s.code());
        let rows = self
            .query("filtered", &[&state, &filter.tenant, &filter.tool, &limit])
            .await?;
        self.ran("list_records");
        Ok(rows.iter().map(row_to_record).collect())
    }

    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        let rows = self.query("counted", &[]).await?;
        let mut counts = StateCounts::default();
        for row in rows {
            let kind = RecordStateKind::from_code(row.get::<_, i16>(0).into()).unwrap();
            counts.add(kind, u64::try_from(row.get::<_, i64>(1)).unwrap_or(0));
        }
        self.ran("count_records");
        Ok(counts)
    }
}
#[async_trait]
impl FollowOnStore for PostgresReplayed {
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
        self.with_jobs("complete_with_jobs", key, attempt, &params)
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
        self.with_jobs("resolve_with_jobs", key, attempt, &params)
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
                "lease_jobs",
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
        // Before migration 5 it deleted the job.
        let rest: &[&(dyn ToSql + Sync)] = if self.layout >= 5 { &rest } else { &[] };
        self.fenced_job("finish_job", id, attempt, rest).await?;
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
        self.fenced_job("retry_job", id, attempt, &[&micros(delay), &error])
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
        self.fenced_job("bury_job", id, attempt, &[&error]).await?;
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
        // Before migration 5 a listing took `dead`, not states.
        let dead = match filter.states.as_slice() {
            [] => None,
            [FollowOnState::Dead] => Some(true),
            _ => Some(false),
        };
        let rows = if self.layout >= 5 {
            self.query(
                "jobs_filtered",
                &[&filter.tenant, &reference, &filter.name, &states, &limit],
            )
            .await?
        } else {
            self.query(
                "jobs_filtered",
                &[&filter.tenant, &reference, &filter.name, &dead, &limit],
            )
            .await?
        };
        self.ran("list_jobs");
        Ok(rows.iter().map(row_to_job).collect())
    }

    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError> {
        let reference = id.reference.as_bytes();
        let changed = self
            .execute("redrive_job", &[&id.tenant, &reference, &id.name])
            .await?;
        self.ran("redrive_job");
        Ok(changed == 1)
    }

    async fn count_due_follow_ons(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let rows = self.query("count_due_jobs", &[]).await?;
        let mut due = BTreeMap::new();
        for row in rows {
            let (name, n): (String, i64) = (row.get(0), row.get(1));
            due.insert(name, u64::try_from(n).unwrap_or(0));
        }
        self.ran("count_due_jobs");
        Ok(due)
    }
}
