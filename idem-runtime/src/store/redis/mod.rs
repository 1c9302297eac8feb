//! [`RedisStore`]: records in Redis or Valkey, standalone or Cluster.
//!
//! One job, the store and its contract; the key names are in `layout.rs`,
//! the scripts and their replies in `scripts.rs`, the connection in
//! `link.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use redis::Cmd;

use crate::future::join_all;
use crate::key::{IdempotencyKey, Reference};
use crate::store::{
    lease_names, listing_order, sort_leased, Attempt, Claim, ClaimRequest, FollowOnFilter,
    FollowOnId, FollowOnRecord, FollowOnStore, FollowOns, IdempotencyStore, Inspect, Limits,
    Record, RecordFilter, RecordStateKind, Resolution, StateCounts, StoreError, Upkeep,
};

mod builder;
mod layout;
mod link;
mod scripts;

pub use builder::RedisStoreBuilder;
use layout::{Layout, RecordKeys, SHARDS};
use link::{fcall, Link};
use scripts::{
    jobs, micros, name_counts, records, scanned, scores, Function, Reply, Scanned, LIBRARY,
};

/// Records in Redis or Valkey, standalone or Cluster, for several server
/// replicas.
///
/// # One script per transition
///
/// Every change of a record (claim, including the takeover of a record past
/// its life or resolved as not performed; complete, release, mark_unknown,
/// mark_lapsed, resolve, defer_check, heartbeat) is one Lua script, which
/// Redis runs atomically: no other command runs between its reads and its
/// writes. A claim is an insert-if-absent, never a check-then-insert; every
/// other change compares the record's attempt (the fencing token) in the same
/// script that writes. A lookup by (tenant, reference) and each listing are
/// one script too.
///
/// The scripts are one Redis Functions library, named after a hash of its
/// code ([`RedisStore::library_name`]): a server is sent it once (`FUNCTION
/// LOAD`, by the first call that finds it missing; on a Cluster, to every
/// primary) and keeps it with its data, replicated and persisted; each call
/// is an `FCALL`. Two versions of the store on one server each call their
/// own library.
///
/// # Follow-ons
///
/// A job is a hash on the slot of the record it follows (its shard's hash
/// tag), so [`complete_with_follow_ons`](FollowOnStore::complete_with_follow_ons)
/// writes the completion and its jobs in the one script that completes, even
/// on a Cluster. Each shard keeps its live jobs in one sorted set per name,
/// scored by when they may run next (a leased job: when its lease runs out),
/// so a lease reads only the names it handles. A lease asks every shard
/// which jobs are due (one read-only script each, all at once), picks the
/// longest due across the shards, and then leases them with one script on
/// each shard that has some; a job another dispatcher took in between is not
/// due any more, and that lease returns fewer. Every change of a job (lease,
/// finish, retry, bury, re-drive) is one script, fenced by the lease's
/// attempt, with times from the server's `TIME`. A job has no TTL until it is
/// finished; a delivered job then lives as long as its record (a TTL at the
/// record's `retain_until`), and the purge drops its set entries.
///
/// # The clock
///
/// Every time (claimed, lease, expiry, settle) is the server's `TIME`, read
/// inside the script, never the process clock: replicas whose clocks disagree
/// still agree on which lease ran out.
///
/// # Expiry
///
/// Redis deletes a record itself at the end of its life ([`Record::is_expired`]:
/// a COMPLETED or NOT_PERFORMED record at `retain_until`; any other once both
/// its retention and its lease are over), by a native TTL (`PXAT`) that every
/// transition sets again. The window (`expires_at`) ends the key's hold, not
/// the record: a claim after it takes the key over, and the operation it
/// replaces, if its retention has not ended, is kept in the claim's script
/// as a superseded operation, under its reference, with its own native TTL
/// at `retain_until`; [`lookup`](IdempotencyStore::lookup) and the listings
/// find it. [`purge_expired`](crate::store::Upkeep::purge_expired) has no
/// records to delete: it drops the entries that deleted IN_PROGRESS and
/// UNKNOWN records left in the listings' sorted sets, and returns how many.
///
/// Data written by an earlier version reads as it was written. A COMPLETED
/// record then had its native TTL at `expires_at`: each purge moves a few of
/// those to `retain_until` (one SCAN step per shard, until each shard is
/// done). A record completed late by an earlier version had its window
/// moved to its retention, and holds its key until then, as it promised
/// when it was written: its original window was not kept.
///
/// # Keys and Cluster
///
/// A record is a string under its reference; lapsed and UNKNOWN records are
/// listed through two sorted sets per shard, scored by `lease_until` and
/// `next_check_at`. The records spread over 64 shards, each with its own
/// Cluster hash tag, so a record and the sets that list it sit on one slot
/// and every script touches one slot; a listing asks the 64 shards at once,
/// a purge one after the other until its batch is full. The full layout is
/// in the `layout` module (`P:{SS}:r:REF`, `P:{SS}:lapsed`, …, `P` being
/// [`RedisStoreBuilder::prefix`]).
///
/// # Durability
///
/// Redis answers a write once it is in memory, before it is on disk and
/// before any replica has it. What that costs here:
///
/// - With the default `appendonly no` (or `appendfsync everysec`), a crash
///   loses the writes of the last snapshot interval (or of up to about a
///   second). A failover to a replica loses what the replica had not
///   received. Either way **a lost claim makes a second execution
///   possible**: the handler ran under a claim that the restarted or
///   promoted server no longer has, and a repeat of the call runs again. A
///   lost completion is safer: the record is back to IN_PROGRESS, the sweep
///   marks it UNKNOWN and the reconciler resolves it, never a second run.
/// - `appendonly yes` with `appendfsync always` makes a single server hold:
///   each write is on disk before it is answered. (Redis 7.2 and Valkey
///   also have `WAITAOF` for the same per write.)
/// - Against a failover, [`RedisStoreBuilder::wait_for_replicas`] sends
///   `WAIT n timeout` after each claim, on the same connection, and runs the
///   handler only once `n` replicas have the claim (otherwise the claim is
///   released and the call fails closed). Replication stays asynchronous:
///   this makes a lost claim unlikely (Sentinel and Cluster promote the
///   replica with the most data), not impossible.
///
/// Where money moves, use `PostgresStore`, unless this Redis is configured
/// for it: `appendonly yes` with `appendfsync always` on every node, claims
/// that wait for a replica, and `min-replicas-to-write` so that a primary cut
/// off from its replicas stops taking claims.
///
/// # When Redis goes away
///
/// Calls fail fast with [`StoreError::Unavailable`] (the executor then does
/// not run the handler): connecting and each call are bounded by the
/// builder's timeout. The connection reconnects by itself once the server is
/// back, and a server that no longer has the library (restarted without its
/// data, or after `FUNCTION FLUSH`) is sent it again: no restart of the
/// process is needed.
///
/// Needs Redis 7.0 or later, or Valkey 7.2 or later (Redis Functions). The
/// store's user must be allowed `FCALL`, the commands the library runs
/// (Redis checks them against the calling user's ACL) and the store's keys,
/// and `FUNCTION LOAD` unless the library is loaded by another user
/// ([`load_library`](RedisStore::load_library)); docs/deploying.md ("Redis
/// or Valkey") gives the exact ACL of each role. A server that refuses a
/// command (`NOPERM`, also from inside a function) is a
/// [`StoreError::Config`], not an outage.
///
/// ```no_run
/// # async fn f() -> Result<(), idem_runtime::StoreError> {
/// let store = idem_runtime::RedisStore::builder("redis://127.0.0.1:6379")?
///     .prefix("payments")
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RedisStore {
    link: Arc<Link>,
    layout: Arc<Layout>,
    replicas: Option<(u32, Duration)>,
}

impl RedisStore {
    /// A builder for one server (or a proxy in front of several):
    /// `redis://[user:password@]host[:port][/db]`, or `redis+unix:///path`.
    /// Errors: `Config` when the URL does not parse.
    pub fn builder(url: &str) -> Result<RedisStoreBuilder, StoreError> {
        RedisStoreBuilder::single(url)
    }

    /// A builder for a Redis Cluster, found from any of `nodes` (URLs as for
    /// [`RedisStore::builder`]). Errors: `Config`.
    pub fn cluster_builder<S: AsRef<str>>(
        nodes: impl IntoIterator<Item = S>,
    ) -> Result<RedisStoreBuilder, StoreError> {
        RedisStoreBuilder::cluster(nodes)
    }

    /// A store with the default settings on one server, after checking that
    /// it answers. Errors: `Config`, `Unavailable`.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let store = Self::builder(url)?.build()?;
        store
            .link
            .call(store.link.timeout(), async |conn| {
                redis::cmd("PING").query_async::<()>(conn).await
            })
            .await?;
        Ok(store)
    }

    /// The prefix of every key the store writes.
    pub fn prefix(&self) -> &str {
        self.layout.prefix()
    }

    /// The name of the Redis Functions library this version of the store
    /// loads and calls (`idem_` and 16 hex digits of a hash of its code).
    /// Each version has its own, so versions side by side during a deploy
    /// never call each other's; once no process runs an older version,
    /// `FUNCTION DELETE` with its name removes it from the servers.
    pub fn library_name() -> &'static str {
        &LIBRARY.name
    }

    /// Loads this version's function library onto the server (on a
    /// Cluster, onto every primary), as the first call that finds it
    /// missing does: for a deploy step run by a user allowed `FUNCTION
    /// LOAD` when the servers' user is not (docs/deploying.md, "Redis or
    /// Valkey"). Loading it again changes nothing. Errors: `Config` when
    /// the server refuses the user `FUNCTION LOAD` (`NOPERM`),
    /// `Unavailable`.
    pub async fn load_library(&self) -> Result<(), StoreError> {
        self.link
            .call(self.link.timeout(), async |conn| link::load(conn).await)
            .await
    }

    /// An FCALL of `function` over the record of `key`: its one key, the
    /// record under its reference, and `ARGV[1]`, the key and the key in hex
    /// packed (`over` in `prelude.lua`), followed by what `tail` packs; the
    /// caller adds the other arguments.
    fn over(
        &self,
        function: &Function,
        key: &IdempotencyKey,
        tail: impl FnOnce(&mut Packed),
    ) -> (Cmd, RecordKeys) {
        let rk = self.layout.record(key);
        let mut cmd = fcall(function, &[&rk.by_reference]);
        let mut packed = Packed(Vec::with_capacity(160));
        packed.bytes(key.as_bytes());
        packed.bytes(rk.key_hex.as_bytes());
        tail(&mut packed);
        cmd.arg(packed.0);
        (cmd, rk)
    }

    /// A fenced change: `function` over the record of `key` with `attempt`
    /// (packed after the key) and `args` after `ARGV[1]`.
    async fn fenced(
        &self,
        function: &Function,
        key: &IdempotencyKey,
        attempt: Attempt,
        args: impl FnOnce(&mut Cmd),
    ) -> Result<Reply, StoreError> {
        let (mut cmd, _) = self.over(function, key, |p| p.text(&attempt.get().to_string()));
        args(&mut cmd);
        Reply::read(self.link.run(&cmd).await?)
    }

    /// The due records of one sorted set (`which`: 0 lapsed, 1 unknown) over
    /// every shard, the earliest first, at most `limit`. The shards are asked
    /// all at once: a standalone server takes the scripts pipelined on its
    /// one connection, a Cluster each on its node.
    async fn list(
        &self,
        which: usize,
        state: RecordStateKind,
        limit: usize,
        order: fn(&Record) -> std::time::SystemTime,
    ) -> Result<Vec<Record>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let function = &LIBRARY.list;
        let calls = (0..SHARDS).map(|shard| {
            let set = &self.layout.sets(shard)[which];
            let mut cmd = fcall(function, &[set]);
            cmd.arg(self.layout.shard(shard))
                .arg(limit.min(i64::MAX as usize))
                .arg(state.code());
            async move { self.link.run(&cmd).await }
        });
        let mut found = Vec::new();
        for reply in join_all(calls).await {
            found.extend(records(reply?)?);
        }
        found.sort_by_key(order);
        found.truncate(limit);
        Ok(found)
    }
}

/// A script's arguments packed into one value, as Redis's `struct.unpack`
/// reads them with a little-endian format: each argument of a script costs
/// it about as much as a call inside it, so the scripts on the hot path
/// take one.
struct Packed(Vec<u8>);

impl Packed {
    /// `cN`: bytes of a length the format names.
    fn bytes(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    /// `i4c0`: a 4-byte length, then the bytes.
    fn text(&mut self, text: &str) {
        let len = u32::try_from(text.len()).expect("a text under 4 GiB");
        self.bytes(&len.to_le_bytes());
        self.bytes(text.as_bytes());
    }

    /// `d`: a duration in whole microseconds, as a double (exact: at most a
    /// hundred years, below 2^53).
    fn micros(&mut self, d: Duration) {
        self.bytes(&(micros(d) as f64).to_le_bytes());
    }
}

impl RedisStore {
    /// The follow-ons' arguments of `complete.lua` and `resolve.lua`:
    /// the record's shard prefix, then (name, payload) pairs; nothing when
    /// there are none.
    fn job_args(&self, cmd: &mut Cmd, key: &IdempotencyKey, jobs: FollowOns<'_>) {
        if jobs.is_empty() {
            return;
        }
        cmd.arg(self.layout.shard(self.layout.shard_of_key(key)));
        for job in jobs.iter() {
            cmd.arg(job.name()).arg(job.payload());
        }
    }

    /// A change of one job fenced by its lease's attempt: `function` over the
    /// job's hash, its name's due set and the shard's job list, with the
    /// job's member and `args`.
    async fn job_change(
        &self,
        function: &Function,
        id: &FollowOnId,
        args: impl FnOnce(&mut Cmd),
    ) -> Result<(), StoreError> {
        let ([job, due, list, _], member) = self.layout.job(id);
        let mut cmd = fcall(function, &[&job, &due, &list]);
        cmd.arg(&member);
        args(&mut cmd);
        done(Reply::read(self.link.run(&cmd).await?)?)
    }
}

/// How many keys one SCAN step of `list_records` and `count_records` looks
/// at: each step is one short script.
const SCAN_COUNT: usize = 500;

impl RedisStore {
    /// Every record of the store, one shard after another, one short SCAN
    /// step per script: `each` gets what each step found. Not atomic across
    /// steps; on a Cluster each shard's steps run on the node holding it.
    async fn scan(
        &self,
        states: bool,
        mut each: impl FnMut(Scanned) -> Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let function = &LIBRARY.scan;
        for shard in 0..SHARDS {
            let [lapsed, _] = self.layout.sets(shard);
            let mut cursor = "0".to_owned();
            loop {
                let mut cmd = fcall(function, &[&lapsed]);
                cmd.arg(self.layout.shard(shard))
                    .arg(&cursor)
                    .arg(SCAN_COUNT)
                    .arg(if states { "1" } else { "0" });
                let (next, found) = scanned(self.link.run(&cmd).await?, states)?;
                each(found)?;
                if next == "0" {
                    break;
                }
                cursor = next;
            }
        }
        Ok(())
    }
}

/// The refusals every fenced change shares; anything else is not a reply
/// this change gives.
fn refused(reply: Reply) -> StoreError {
    match reply {
        Reply::Fenced => StoreError::Fenced,
        Reply::WrongState(found) => StoreError::WrongState { found },
        Reply::NotSettled(until) => StoreError::NotSettled { until },
        other => StoreError::Corrupt(format!("Redis: unexpected reply {other:?}")),
    }
}

fn done(reply: Reply) -> Result<(), StoreError> {
    match reply {
        Reply::Ok => Ok(()),
        other => Err(refused(other)),
    }
}

#[async_trait]
impl IdempotencyStore for RedisStore {
    fn backend(&self) -> &'static str {
        "redis"
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        let function = &LIBRARY.claim;
        let (cmd, rk) = self.over(function, &req.key, |p| {
            p.bytes(req.key.fingerprint());
            p.text(&req.tenant);
            p.text(&req.tool);
            p.text(&req.attempt.get().to_string());
            p.micros(req.lease);
            p.micros(req.window);
            p.micros(req.retain_for());
            p.bytes(&req.reference.tag().to_be_bytes());
        });
        let Some((replicas, timeout)) = self.replicas else {
            return claimed(&req.key, Reply::read(self.link.run(&cmd).await?)?);
        };
        let (reply, acked) = self
            .link
            .run_and_wait(&cmd, &rk.by_reference, replicas, timeout)
            .await?;
        let claim = claimed(&req.key, Reply::read(reply)?)?;
        if matches!(claim, Claim::Claimed { .. }) && acked < i64::from(replicas) {
            // The handler must not run on a claim a failover could lose.
            // Undone here (fenced by this attempt); if that fails too, the
            // executor's own release of an unconfirmed claim follows.
            let _ = self.release(&req.key, req.attempt).await;
            return Err(StoreError::Unavailable(format!(
                "Redis: the claim reached {acked} of {replicas} replicas within {timeout:?}; \
                 released, nothing ran"
            )));
        }
        Ok(claim)
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
    ) -> Result<(), StoreError> {
        // No ARGV[3]: complete.lua never reaches for jobs.lua's functions.
        done(
            self.fenced(&LIBRARY.complete, key, attempt, |cmd| {
                cmd.arg(response);
            })
            .await?,
        )
    }

    async fn release(&self, key: &IdempotencyKey, attempt: Attempt) -> Result<(), StoreError> {
        done(self.fenced(&LIBRARY.release, key, attempt, |_| {}).await?)
    }

    async fn mark_unknown(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<(), StoreError> {
        done(
            self.fenced(&LIBRARY.mark_unknown, key, attempt, |cmd| {
                cmd.arg(note).arg("0");
            })
            .await?,
        )
    }

    async fn heartbeat(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        lease: Duration,
    ) -> Result<(), StoreError> {
        done(
            self.fenced(&LIBRARY.heartbeat, key, attempt, |cmd| {
                cmd.arg(micros(lease));
            })
            .await?,
        )
    }

    async fn lookup(
        &self,
        tenant: &str,
        reference: &Reference,
    ) -> Result<Option<Record>, StoreError> {
        let function = &LIBRARY.lookup;
        let record = self.layout.by_reference(reference);
        let collisions = self.layout.collisions(reference);
        let mut cmd = fcall(function, &[&record, &collisions]);
        cmd.arg(tenant)
            .arg(self.layout.shard(self.layout.shard_of(reference)))
            .arg(&reference.tag().to_be_bytes()[..])
            .arg(reference.as_bytes());
        let reply = self.link.run(&cmd).await?;
        if matches!(&reply, redis::Value::Array(items) if items.is_empty()) {
            return Ok(None);
        }
        match Reply::read(reply)? {
            Reply::Found(record) => Ok(Some(*record)),
            other => Err(refused(other)),
        }
    }

    fn follow_ons(&self) -> Option<&dyn FollowOnStore> {
        Some(self)
    }

    // A 512 MB string, less 1 MiB for the record's other fields; the 1 GB
    // query buffer holds a completion's command: the response, then the
    // jobs.
    fn limits(&self) -> Limits {
        Limits::NONE
            .with_max_response_bytes(511 * 1024 * 1024)
            .with_max_follow_on_bytes_per_completion(256 * 1024 * 1024)
    }
}

#[async_trait]
impl Upkeep for RedisStore {
    async fn mark_lapsed(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        note: &str,
    ) -> Result<bool, StoreError> {
        // "1": the script re-checks the lease against the server's clock, so
        // a heartbeat that landed after the sweep listed the record wins.
        let reply = self
            .fenced(&LIBRARY.mark_unknown, key, attempt, |cmd| {
                cmd.arg(note).arg("1");
            })
            .await?;
        match reply {
            Reply::Ok => Ok(true),
            Reply::HeldBack => Ok(false),
            other => Err(refused(other)),
        }
    }

    async fn resolve(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        resolution: Resolution<'_>,
        note: Option<&str>,
    ) -> Result<(), StoreError> {
        let (state, body, settle) = match resolution {
            Resolution::Completed { response } => {
                (RecordStateKind::Completed, response, Duration::ZERO)
            }
            Resolution::NotPerformed { note, settle } => {
                (RecordStateKind::NotPerformed, note, settle)
            }
        };
        done(
            self.fenced(&LIBRARY.resolve, key, attempt, |cmd| {
                cmd.arg(state.code()).arg(body).arg(micros(settle));
                match note {
                    Some(note) => cmd.arg("1").arg(note),
                    None => cmd.arg("0").arg(""),
                };
            })
            .await?,
        )
    }

    async fn defer_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        delay: Duration,
        taken: Option<SystemTime>,
    ) -> Result<bool, StoreError> {
        let taken = taken.map(|t| micros(t.duration_since(UNIX_EPOCH).unwrap_or_default()));
        let reply = self
            .fenced(&LIBRARY.defer_check, key, attempt, |cmd| {
                cmd.arg(micros(delay)).arg("0");
                match taken {
                    Some(until) => cmd.arg(until),
                    None => cmd.arg(""),
                };
            })
            .await?;
        match reply {
            Reply::Ok => Ok(true),
            // Still UNKNOWN, and the check taken is no longer the record's.
            Reply::HeldBack => Ok(false),
            other => Err(refused(other)),
        }
    }

    async fn take_check(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        hold: Duration,
    ) -> Result<Option<SystemTime>, StoreError> {
        let reply = self
            .fenced(&LIBRARY.defer_check, key, attempt, |cmd| {
                cmd.arg(micros(hold)).arg("1");
            })
            .await?;
        match reply {
            Reply::Taken(until) => Ok(Some(until)),
            // Still UNKNOWN, and another replica holds the check.
            Reply::HeldBack => Ok(None),
            other => Err(refused(other)),
        }
    }

    async fn purge_expired(&self, batch: usize) -> Result<usize, StoreError> {
        // One shard after the other, each a short script, until the batch is
        // full: never more than `batch`, never one long script.
        // Delivered jobs go in the same pass, within the same budget.
        let mut purged = 0;
        for shard in 0..SHARDS {
            if purged >= batch {
                break;
            }
            let function = &LIBRARY.purge;
            let [lapsed, unknown] = self.layout.sets(shard);
            let [list, _] = self.layout.job_sets(shard);
            let delivered = [&self.layout.shard(shard)[..], b"delivered"].concat();
            let mut cmd = fcall(function, &[&lapsed, &unknown, &delivered, &list]);
            let left = batch - purged;
            cmd.arg(self.layout.shard(shard))
                .arg(left)
                .arg(left.saturating_add(PURGE_LOOKAHEAD))
                .arg(SCAN_COUNT);
            match self.link.run(&cmd).await? {
                redis::Value::Int(n) => purged += usize::try_from(n).unwrap_or(0).min(left),
                other => {
                    return Err(StoreError::Corrupt(format!(
                        "Redis: purge answered {other:?}"
                    )))
                }
            }
        }
        Ok(purged)
    }

    async fn list_lapsed(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.list(0, RecordStateKind::InProgress, limit, |r| r.lease_until)
            .await
    }

    async fn list_unknown(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.list(1, RecordStateKind::Unknown, limit, |r| r.next_check_at)
            .await
    }
}

#[async_trait]
impl Inspect for RedisStore {
    async fn find_by_reference(&self, reference: &Reference) -> Result<Vec<Record>, StoreError> {
        // Where `lookup` reads, without the tenant: no SCAN.
        let record = self.layout.by_reference(reference);
        let collisions = self.layout.collisions(reference);
        let mut cmd = fcall(&LIBRARY.find, &[&record, &collisions]);
        cmd.arg(self.layout.shard(self.layout.shard_of(reference)))
            .arg(&reference.tag().to_be_bytes()[..])
            .arg(reference.as_bytes());
        let mut found = records(self.link.run(&cmd).await?)?;
        found.retain(|r| r.reference == *reference);
        Ok(found)
    }

    async fn list_records(&self, filter: &RecordFilter) -> Result<Vec<Record>, StoreError> {
        let mut seen = std::collections::HashSet::new();
        let mut found: Vec<Record> = Vec::new();
        let newest_first = |r: &Record| std::cmp::Reverse(r.claimed_at);
        self.scan(false, |step| {
            if let Scanned::Records(records) = step {
                for record in records {
                    // A key's current record and its superseded
                    // operations share the key: a repeat is the same key,
                    // reference and attempt.
                    let id = (record.key.key, record.reference, record.attempt);
                    if filter.matches(&record) && seen.insert(id) {
                        found.push(record);
                    }
                }
                // Keep only the newest `limit` between steps.
                if found.len() > filter.limit.saturating_mul(2).max(1024) {
                    found.sort_by_key(newest_first);
                    found.truncate(filter.limit);
                }
            }
            Ok(())
        })
        .await?;
        found.sort_by_key(newest_first);
        found.truncate(filter.limit);
        Ok(found)
    }

    async fn count_records(&self) -> Result<StateCounts, StoreError> {
        let mut seen = std::collections::HashSet::new();
        let mut counts = StateCounts::default();
        self.scan(true, |step| {
            if let Scanned::States(states) = step {
                for (name, kind) in states {
                    if seen.insert(name) {
                        counts.add(kind, 1);
                    }
                }
            }
            Ok(())
        })
        .await?;
        Ok(counts)
    }
}

#[async_trait]
impl FollowOnStore for RedisStore {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        done(
            self.fenced(&LIBRARY.complete, key, attempt, |cmd| {
                cmd.arg(response);
                self.job_args(cmd, key, jobs);
            })
            .await?,
        )
    }

    async fn resolve_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        let completed = RecordStateKind::Completed.code();
        done(
            self.fenced(&LIBRARY.resolve, key, attempt, |cmd| {
                cmd.arg(completed).arg(response).arg(0);
                match note {
                    Some(note) => cmd.arg("1").arg(note),
                    None => cmd.arg("0").arg(""),
                };
                self.job_args(cmd, key, jobs);
            })
            .await?,
        )
    }

    async fn lease_follow_ons(
        &self,
        names: &[&str],
        limit: usize,
        lease: Duration,
        attempt: Attempt,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        let Some(names) = lease_names(names, limit) else {
            return Ok(Vec::new());
        };
        // Which shards hold the `limit` longest due jobs: every shard at once,
        // each a read-only script.
        let peek = &LIBRARY.peek_jobs;
        let calls = (0..SHARDS).map(|shard| {
            let [list, _] = self.layout.job_sets(shard);
            let mut cmd = fcall(peek, &[&list]);
            cmd.arg(self.layout.shard(shard)).arg(limit).arg(&names);
            async move { (shard, self.link.run(&cmd).await) }
        });
        let mut due = Vec::new();
        for (shard, reply) in join_all(calls).await {
            due.extend(scores(reply?)?.into_iter().map(|score| (score, shard)));
        }
        due.sort_unstable();
        due.truncate(limit);
        let mut per_shard = BTreeMap::<u8, usize>::new();
        for (_, shard) in due {
            *per_shard.entry(shard).or_default() += 1;
        }
        // Then lease them, one script on each of those shards. A job another
        // dispatcher leased in between is not due any more: this lease then
        // returns fewer jobs, never one that is held.
        let function = &LIBRARY.lease_follow_ons;
        let calls = per_shard.into_iter().map(|(shard, count)| {
            let [list, _] = self.layout.job_sets(shard);
            let mut cmd = fcall(function, &[&list]);
            cmd.arg(self.layout.shard(shard))
                .arg(count)
                .arg(micros(lease))
                .arg(attempt.get())
                .arg(&names);
            async move { self.link.run(&cmd).await }
        });
        let (mut leased, mut failed) = (Vec::new(), None);
        for reply in join_all(calls).await {
            // A shard that failed leased nothing; one that answered did, and
            // its jobs are returned (or they would wait out their lease).
            match reply.and_then(jobs) {
                Ok(found) => leased.extend(found),
                Err(e) => failed = Some(e),
            }
        }
        if let (true, Some(e)) = (leased.is_empty(), failed) {
            return Err(e);
        }
        sort_leased(&mut leased);
        Ok(leased)
    }

    async fn finish_follow_on(&self, id: &FollowOnId, attempt: Attempt) -> Result<(), StoreError> {
        self.job_change(&LIBRARY.finish_follow_on, id, |cmd| {
            cmd.arg(attempt.get());
        })
        .await
    }

    async fn retry_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        self.job_change(&LIBRARY.retry_follow_on, id, |cmd| {
            cmd.arg(attempt.get()).arg(micros(delay)).arg(error);
        })
        .await
    }

    async fn bury_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        error: &str,
    ) -> Result<(), StoreError> {
        self.job_change(&LIBRARY.bury_follow_on, id, |cmd| {
            cmd.arg(attempt.get()).arg(error);
        })
        .await
    }

    async fn list_follow_ons(
        &self,
        filter: &FollowOnFilter,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        if filter.limit == 0 {
            return Ok(Vec::new());
        }
        let want = |v: Option<&[u8]>| v.map_or_else(Vec::new, |v| [b"=", v].concat());
        let (tenant, reference, name) = (
            want(filter.tenant.as_deref().map(str::as_bytes)),
            want(filter.reference.as_ref().map(|r| r.as_bytes())),
            want(filter.name.as_deref().map(str::as_bytes)),
        );
        let states = filter
            .state_mask()
            .map_or_else(String::new, |m| m.to_string());
        // An operation's jobs are on its shard; any other filter reads every
        // shard.
        let shards: Vec<u8> = match &filter.reference {
            Some(r) => vec![self.layout.shard_of(r)],
            None => (0..SHARDS).collect(),
        };
        let function = &LIBRARY.list_follow_ons;
        let calls = shards.into_iter().map(|shard| {
            let [list, _] = self.layout.job_sets(shard);
            let mut cmd = fcall(function, &[&list]);
            cmd.arg(self.layout.shard(shard))
                .arg(filter.limit)
                .arg(&tenant)
                .arg(&reference)
                .arg(&name)
                .arg(&states);
            async move { self.link.run(&cmd).await }
        });
        let mut found = Vec::new();
        for reply in join_all(calls).await {
            found.extend(jobs(reply?)?);
        }
        found.sort_by_key(listing_order);
        found.truncate(filter.limit);
        Ok(found)
    }

    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError> {
        let function = &LIBRARY.redrive_follow_on;
        let ([job, due, _, names], member) = self.layout.job(id);
        let mut cmd = fcall(function, &[&job, &due, &names]);
        cmd.arg(&member).arg(&id.name);
        match self.link.run(&cmd).await? {
            redis::Value::Int(n) => Ok(n == 1),
            other => Err(StoreError::Corrupt(format!(
                "Redis: redrive_job answered {other:?}"
            ))),
        }
    }

    async fn count_due_follow_ons(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let function = &LIBRARY.count_due_follow_ons;
        let calls = (0..SHARDS).map(|shard| {
            let [_, names] = self.layout.job_sets(shard);
            let mut cmd = fcall(function, &[&names]);
            cmd.arg(self.layout.shard(shard));
            async move { self.link.run(&cmd).await }
        });
        let mut due = BTreeMap::new();
        for reply in join_all(calls).await {
            for (name, n) in name_counts(reply?)? {
                *due.entry(name).or_default() += n;
            }
        }
        Ok(due)
    }
}

/// How many entries beyond its budget a purge looks at in each set: the
/// lapsed set's oldest entries may be records the sweep has yet to mark,
/// which are kept.
const PURGE_LOOKAHEAD: usize = 1024;

fn claimed(key: &IdempotencyKey, reply: Reply) -> Result<Claim, StoreError> {
    match reply {
        Reply::Claimed(tag) => Ok(Claim::Claimed {
            reference: Reference::with_tag(key, tag),
        }),
        Reply::Found(record) => Ok(Claim::Existing { record: *record }),
        other => Err(refused(other)),
    }
}
