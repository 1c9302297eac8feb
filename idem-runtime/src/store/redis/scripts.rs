//! The store's Lua scripts, one per transition (`lua/*.lua`), loaded as one
//! Redis Functions library, and how their replies read.
//!
//! Each function runs atomically on the server: no other command runs
//! between its reads and its writes, which is what makes a claim an
//! insert-if-absent and every fenced change a compare-and-set.

use std::sync::LazyLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Value;
use sha2::{Digest, Sha256};

use crate::key::{IdempotencyKey, Reference};
use crate::store::{
    Attempt, FollowOnId, FollowOnRecord, Record, RecordState, RecordStateKind, StoreError,
};

/// What a script answers first.
pub(super) mod code {
    /// The change was made.
    pub(super) const OK: i64 = 0;
    /// The attempt does not own the record, or there is none.
    pub(super) const FENCED: i64 = 1;
    /// The record's state refuses the change; its code follows.
    pub(super) const WRONG_STATE: i64 = 2;
    /// "Not performed" came too soon; the time it may come follows (µs).
    pub(super) const NOT_SETTLED: i64 = 3;
    /// The change's own condition held it back (the sweep's mark found the
    /// lease renewed, a check taken was not due): nothing changed.
    pub(super) const HELD_BACK: i64 = 4;
    /// The claim created the record, or took it over.
    pub(super) const CLAIMED: i64 = 5;
    /// A record follows: the server's time (µs), then its fields.
    pub(super) const FOUND: i64 = 6;
    /// A reconciler check was taken; the hold's end follows (µs).
    pub(super) const TAKEN: i64 = 7;
}

/// One function of the library, by its name on the server.
#[derive(Debug)]
pub(super) struct Function(String);

impl Function {
    /// The name `FCALL` takes: the library's name, then the script's.
    pub(super) fn name(&self) -> &str {
        &self.0
    }
}

/// The store's scripts as one Redis Functions library: sent once to each
/// server (`FUNCTION LOAD`), which keeps it, and called by name (`FCALL`).
/// The shared code (`prelude.lua`, `jobs.lua`, the constants) runs once,
/// when the library loads, instead of at the start of every call.
#[derive(Debug)]
pub(super) struct Library {
    /// `idem_` and 16 hex digits of the SHA-256 of the library's code: a
    /// server keeps one library per version of the code, so two versions of
    /// the store on one server (a rolling deploy) each call their own.
    pub(super) name: String,
    /// What `FUNCTION LOAD` is sent: the `#!lua name=…` line, then the code.
    pub(super) code: String,
    pub(super) claim: Function,
    pub(super) complete: Function,
    pub(super) release: Function,
    pub(super) mark_unknown: Function,
    pub(super) resolve: Function,
    pub(super) defer_check: Function,
    pub(super) heartbeat: Function,
    pub(super) lookup: Function,
    pub(super) find: Function,
    pub(super) list: Function,
    pub(super) purge: Function,
    pub(super) scan: Function,
    pub(super) peek_jobs: Function,
    pub(super) lease_follow_ons: Function,
    pub(super) finish_follow_on: Function,
    pub(super) retry_follow_on: Function,
    pub(super) bury_follow_on: Function,
    pub(super) redrive_follow_on: Function,
    pub(super) list_follow_ons: Function,
    pub(super) count_due_follow_ons: Function,
}

/// Each script's name, whether it only reads (`no-writes`: the server then
/// runs it when it refuses writes, out of memory, as it ran the script
/// before), and its code.
const SCRIPTS: [(&str, bool, &str); 20] = [
    ("claim", false, include_str!("lua/claim.lua")),
    ("complete", false, include_str!("lua/complete.lua")),
    ("release", false, include_str!("lua/release.lua")),
    ("mark_unknown", false, include_str!("lua/mark_unknown.lua")),
    ("resolve", false, include_str!("lua/resolve.lua")),
    ("defer_check", false, include_str!("lua/defer_check.lua")),
    ("heartbeat", false, include_str!("lua/heartbeat.lua")),
    ("lookup", true, include_str!("lua/lookup.lua")),
    ("find", true, include_str!("lua/find.lua")),
    ("list", false, include_str!("lua/list.lua")),
    ("purge", false, include_str!("lua/purge.lua")),
    ("scan", true, include_str!("lua/scan.lua")),
    ("peek_jobs", true, include_str!("lua/peek_jobs.lua")),
    ("lease_jobs", false, include_str!("lua/lease_jobs.lua")),
    ("finish_job", false, include_str!("lua/finish_job.lua")),
    ("retry_job", false, include_str!("lua/retry_job.lua")),
    ("bury_job", false, include_str!("lua/bury_job.lua")),
    ("redrive_job", false, include_str!("lua/redrive_job.lua")),
    ("list_jobs", false, include_str!("lua/list_jobs.lua")),
    (
        "count_due_jobs",
        false,
        include_str!("lua/count_due_jobs.lua"),
    ),
];

pub(super) static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    // The state codes come from RecordStateKind, the reply codes from `code`:
    // written once, here, for every script.
    let states = RecordStateKind::ALL
        .map(|k| format!("local {} = '{}'\n", k.as_str(), k.code()))
        .concat();
    let codes = format!(
        "local OK, FENCED, WRONG_STATE, NOT_SETTLED, HELD_BACK, CLAIMED, FOUND, TAKEN = \
         {}, {}, {}, {}, {}, {}, {}, {}\n",
        code::OK,
        code::FENCED,
        code::WRONG_STATE,
        code::NOT_SETTLED,
        code::HELD_BACK,
        code::CLAIMED,
        code::FOUND,
        code::TAKEN
    );
    // Each script is the body of a function that `library.lua` registers.
    let body: String = [states, codes, include_str!("lua/library.lua").to_owned()]
        .into_iter()
        .chain(
            [
                include_str!("lua/prelude.lua"),
                include_str!("lua/jobs.lua"),
            ]
            .map(String::from),
        )
        .chain(SCRIPTS.iter().map(|(name, reads_only, code)| {
            let flags = if *reads_only { "{'no-writes'}" } else { "{}" };
            format!("register('{name}', {flags}, function()\n{code}end)\n")
        }))
        .collect();
    let digest = Sha256::digest(body.as_bytes());
    let name = format!("idem_{}", crate::key::hex(&digest[..8]));
    let code = format!("#!lua name={name}\nlocal LIBRARY = '{name}'\n{body}");
    let function = |script: &str| Function(format!("{name}_{script}"));
    Library {
        claim: function("claim"),
        complete: function("complete"),
        release: function("release"),
        mark_unknown: function("mark_unknown"),
        resolve: function("resolve"),
        defer_check: function("defer_check"),
        heartbeat: function("heartbeat"),
        lookup: function("lookup"),
        find: function("find"),
        list: function("list"),
        purge: function("purge"),
        scan: function("scan"),
        peek_jobs: function("peek_jobs"),
        lease_follow_ons: function("lease_jobs"),
        finish_follow_on: function("finish_job"),
        retry_follow_on: function("retry_job"),
        bury_follow_on: function("bury_job"),
        redrive_follow_on: function("redrive_job"),
        list_follow_ons: function("list_jobs"),
        count_due_follow_ons: function("count_due_jobs"),
        name,
        code,
    }
});

/// The answer of a script over one record.
#[derive(Debug)]
pub(super) enum Reply {
    Ok,
    Fenced,
    WrongState(RecordStateKind),
    NotSettled(SystemTime),
    HeldBack,
    /// A reconciler check taken, held until this time (server clock).
    Taken(SystemTime),
    /// Claimed, under the operation with this tag.
    Claimed(u64),
    Found(Box<Record>),
}

impl Reply {
    /// Reads a script's reply: a code, then what the code says follows.
    pub(super) fn read(value: Value) -> Result<Reply, StoreError> {
        let Value::Array(items) = value else {
            return Err(corrupt(&format!(
                "a script's reply is not an array: {value:?}"
            )));
        };
        let Some(first) = items.first() else {
            return Err(corrupt("a script's reply is empty"));
        };
        Ok(match int(first)? {
            code::OK => Reply::Ok,
            code::FENCED => Reply::Fenced,
            code::WRONG_STATE => Reply::WrongState(kind(items.get(1))?),
            code::NOT_SETTLED => Reply::NotSettled(time(items.get(1))?),
            code::HELD_BACK => Reply::HeldBack,
            code::TAKEN => Reply::Taken(time(items.get(1))?),
            code::CLAIMED => {
                let tag: [u8; 8] = items
                    .get(1)
                    .and_then(bytes)
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| corrupt("a claim's tag is not 8 bytes"))?;
                Reply::Claimed(u64::from_be_bytes(tag))
            }
            code::FOUND => {
                let now = time(items.get(1))?;
                let packed = items
                    .get(2)
                    .ok_or_else(|| corrupt("a found record is missing"))?;
                Reply::Found(Box::new(record(packed, now)?))
            }
            other => return Err(corrupt(&format!("unknown reply code {other}"))),
        })
    }
}

/// The records of a listing's reply: the server's time (µs), then each
/// record, packed (`REC` in `prelude.lua`).
pub(super) fn records(value: Value) -> Result<Vec<Record>, StoreError> {
    let Value::Array(items) = value else {
        return Err(corrupt("a listing's reply is not an array"));
    };
    let Some((now, packed)) = items.split_first() else {
        return Err(corrupt("a listing's reply is empty"));
    };
    let now = time(Some(now))?;
    packed.iter().map(|p| record(p, now)).collect()
}

/// One SCAN step's reply (`scan.lua`): the next cursor, and the records
/// (`states` false) or each record's Redis key name and state (`states`
/// true).
pub(super) fn scanned(value: Value, states: bool) -> Result<(String, Scanned), StoreError> {
    let Value::Array(mut items) = value else {
        return Err(corrupt("a scan's reply is not an array"));
    };
    if items.len() < 2 {
        return Err(corrupt("a scan's reply is too short"));
    }
    let cursor = text(&items.remove(1))?.ok_or_else(|| corrupt("a scan has no cursor"))?;
    if !states {
        return Ok((cursor, Scanned::Records(records(Value::Array(items))?)));
    }
    let pairs = &items[1..];
    if pairs.len() % 2 != 0 {
        return Err(corrupt("a scan's reply has a partial record"));
    }
    let found = pairs
        .chunks(2)
        .map(|p| {
            let name = bytes(&p[0]).ok_or_else(|| corrupt("a record's name is not a string"))?;
            Ok((name.to_vec(), kind(Some(&p[1]))?))
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    Ok((cursor, Scanned::States(found)))
}

/// What one SCAN step found.
#[derive(Debug)]
pub(super) enum Scanned {
    /// Whole records.
    Records(Vec<Record>),
    /// Each record's Redis key name (which names one stored record) and
    /// state.
    States(Vec<(Vec<u8>, RecordStateKind)>),
}

/// How many values a job is in a reply: `JOB_FIELDS` in `jobs.lua`.
pub(super) const JOB_FIELDS: usize = 15;

/// The jobs of a reply: the server's time (µs), then [`JOB_FIELDS`] values
/// per job.
pub(super) fn jobs(value: Value) -> Result<Vec<FollowOnRecord>, StoreError> {
    let Value::Array(items) = value else {
        return Err(corrupt("a job listing's reply is not an array"));
    };
    let Some((_now, fields)) = items.split_first() else {
        return Err(corrupt("a job listing's reply is empty"));
    };
    if fields.len() % JOB_FIELDS != 0 {
        return Err(corrupt("a job listing's reply has a partial job"));
    }
    fields.chunks(JOB_FIELDS).map(job).collect()
}

/// A job from its fields (`JOB_FIELDS` order in `jobs.lua`).
fn job(f: &[Value]) -> Result<FollowOnRecord, StoreError> {
    let required =
        |v: &Value, what: &str| text(v)?.ok_or_else(|| corrupt(&format!("a job has no {what}")));
    let reference = bytes(&f[1])
        .and_then(Reference::from_bytes)
        .ok_or_else(|| corrupt("a job's reference is not 8 or 16 bytes"))?;
    let attempt = text(&f[5])?
        .map(|t| {
            t.parse::<u64>()
                .map(Attempt::from_stored)
                .map_err(|_| corrupt("a job's token is not a number"))
        })
        .transpose()?;
    Ok(FollowOnRecord {
        id: FollowOnId {
            tenant: required(&f[0], "tenant")?,
            reference,
            name: required(&f[2], "name")?,
        },
        payload: required(&f[3], "payload")?,
        runs: u32::try_from(int(&f[4])?.max(0)).unwrap_or(u32::MAX),
        attempt,
        next_run_at: time(Some(&f[6]))?,
        last_error: text(&f[7])?,
        dead: text(&f[8])?.as_deref() == Some("1"),
        created_at: time(Some(&f[9]))?,
        updated_at: time(Some(&f[10]))?,
        delivered_at: optional_time(&f[11])?,
        kept_until: optional_time(&f[12])?,
        earlier_runs: match &f[13] {
            Value::Nil => 0,
            v => u32::try_from(int(v)?.max(0)).unwrap_or(u32::MAX),
        },
        error_before_redrive: text(&f[14])?,
    })
}

/// The scores of a `peek_jobs.lua` reply (after the server's time), as
/// microseconds.
pub(super) fn scores(value: Value) -> Result<Vec<i64>, StoreError> {
    let Value::Array(items) = value else {
        return Err(corrupt("a peek's reply is not an array"));
    };
    items.iter().skip(1).map(int).collect()
}

/// A reply of (name, count) pairs after the server's time
/// (`count_due_follow_ons.lua`).
pub(super) fn name_counts(value: Value) -> Result<Vec<(String, u64)>, StoreError> {
    let Value::Array(items) = value else {
        return Err(corrupt("a count's reply is not an array"));
    };
    let pairs = items.get(1..).unwrap_or_default();
    if pairs.len() % 2 != 0 {
        return Err(corrupt("a count's reply has a partial pair"));
    }
    pairs
        .chunks(2)
        .map(|p| {
            let name = text(&p[0])?.ok_or_else(|| corrupt("a count has no name"))?;
            Ok((name, u64::try_from(int(&p[1])?).unwrap_or(0)))
        })
        .collect()
}

/// A record as `prelude.lua` packs it (`REC`: little-endian, no padding),
/// read at `now`.
fn record(packed: &Value, now: SystemTime) -> Result<Record, StoreError> {
    let mut r = Packed(bytes(packed).ok_or_else(|| corrupt("a record is not a string"))?);
    let key: [u8; 32] = r.take_array()?;
    let fingerprint: [u8; 32] = r.take_array()?;
    let [code] = r.take_array()?;
    let kind = RecordStateKind::from_code(i64::from(code) - i64::from(b'0'))
        .ok_or_else(|| corrupt(&format!("state {:?}", char::from(code))))?;
    let [claimed_at, updated_at, lease_until, expires_at, retain_until, next_check_at, checks] =
        [(); 7].map(|()| r.take_double());
    let attempt = r.take_text("attempt")?;
    let tenant = r.take_text("tenant")?;
    let tool = r.take_text("tool")?;
    let body = r.take_optional_text("response")?;
    let resolution = r.take_optional_text("resolution")?;
    // The operation's tag; none on a record written before references had
    // tags.
    let tag = match r.0.len() {
        0 => 0,
        8 => u64::from_be_bytes(r.take_array()?),
        _ => return Err(corrupt("a record has bytes after its last field")),
    };
    let state = RecordState::from_stored(kind, body)
        .ok_or_else(|| corrupt("a COMPLETED record has no response"))?;
    let key = IdempotencyKey::from_parts(key, fingerprint);
    Ok(Record {
        key,
        reference: Reference::with_tag(&key, tag),
        tenant,
        tool,
        attempt: Attempt::from_stored(
            attempt
                .parse()
                .map_err(|_| corrupt("an attempt is not a number"))?,
        ),
        state,
        claimed_at: micros_time(claimed_at?)?,
        updated_at: micros_time(updated_at?)?,
        lease_until: micros_time(lease_until?)?,
        expires_at: micros_time(expires_at?)?,
        retain_until: micros_time(retain_until?)?,
        next_check_at: micros_time(next_check_at?)?,
        checks: checks?.clamp(0.0, f64::from(u32::MAX)) as u32,
        resolution,
        observed_at: now,
    })
}

/// The unread rest of a packed record.
struct Packed<'a>(&'a [u8]);

impl Packed<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], StoreError> {
        if self.0.len() < n {
            return Err(corrupt("a record is cut short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], StoreError> {
        Ok(self.take(N)?.try_into().expect("take returns N bytes"))
    }

    /// A Lua number: a double, which holds every time the scripts write.
    fn take_double(&mut self) -> Result<f64, StoreError> {
        Ok(f64::from_le_bytes(self.take_array()?))
    }

    /// A 4-byte length, then that many bytes of UTF-8.
    fn take_text(&mut self, what: &str) -> Result<String, StoreError> {
        let len = u32::from_le_bytes(self.take_array()?) as usize;
        String::from_utf8(self.take(len)?.to_vec())
            .map_err(|_| corrupt(&format!("a record's {what} is not UTF-8")))
    }

    /// A presence byte, then a text ([`Packed::take_text`]) that is `None`
    /// when the byte is 0.
    fn take_optional_text(&mut self, what: &str) -> Result<Option<String>, StoreError> {
        let [present] = self.take_array()?;
        let text = self.take_text(what)?;
        Ok((present != 0).then_some(text))
    }
}

/// A time a record keeps: microseconds since the epoch, as a double.
fn micros_time(micros: f64) -> Result<SystemTime, StoreError> {
    if !(0.0..9_007_199_254_740_992.0).contains(&micros) {
        return Err(corrupt(&format!(
            "a record's time {micros} is out of range"
        )));
    }
    Ok(UNIX_EPOCH + Duration::from_micros(micros as u64))
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

fn text(v: &Value) -> Result<Option<String>, StoreError> {
    match v {
        Value::Nil => Ok(None),
        v => bytes(v)
            .and_then(|b| String::from_utf8(b.to_vec()).ok())
            .map(Some)
            .ok_or_else(|| corrupt("a text field is not UTF-8")),
    }
}

fn int(v: &Value) -> Result<i64, StoreError> {
    match v {
        Value::Int(i) => Ok(*i),
        v => bytes(v)
            .and_then(|b| std::str::from_utf8(b).ok())
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| corrupt("a number field is not a number")),
    }
}

fn kind(v: Option<&Value>) -> Result<RecordStateKind, StoreError> {
    let code = int(v.ok_or_else(|| corrupt("a state is missing"))?)?;
    RecordStateKind::from_code(code).ok_or_else(|| corrupt(&format!("state {code}")))
}

/// A time the scripts keep: microseconds since the epoch.
fn time(v: Option<&Value>) -> Result<SystemTime, StoreError> {
    let micros = int(v.ok_or_else(|| corrupt("a time is missing"))?)?;
    let micros = u64::try_from(micros).map_err(|_| corrupt("a time is before 1970"))?;
    Ok(UNIX_EPOCH + Duration::from_micros(micros))
}

/// A time the scripts may leave out (nil).
fn optional_time(v: &Value) -> Result<Option<SystemTime>, StoreError> {
    match v {
        Value::Nil => Ok(None),
        v => time(Some(v)).map(Some),
    }
}

/// The longest duration a script is given: a hundred years, so that the
/// server's time plus it stays below 2^53 µs, which Lua's doubles hold
/// exactly.
const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A duration as the scripts take it: whole microseconds, at most a hundred
/// years.
pub(super) fn micros(d: Duration) -> u64 {
    d.min(LONGEST).as_micros() as u64
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("Redis: {what}"))
}
