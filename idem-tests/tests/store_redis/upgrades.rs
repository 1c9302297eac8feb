//! Data an earlier version of the store left on the server: records written
//! as hashes, and 8d26ab9's library with the records its scripts wrote.

use std::time::{Duration, UNIX_EPOCH};

use idem_runtime::store::conformance::{again, claim_request, new_operation};
use idem_runtime::{
    store::{Claim, ClaimRequest, RecordState},
    IdempotencyStore, RedisStore, StoreError,
};

use crate::redis_server::{command, Prefixed, Server};
use crate::{expire_time, libraries, ms_ceil, record_key, server_time};
use idem_runtime::store::Upkeep;

/// A record as an earlier version of the store wrote it: a hash of these
/// fields, times in µs on the server's clock.
async fn write_hash_record(url: &str, key: &str, req: &ClaimRequest, state: &str, body: &str) {
    let now = server_time(url).await.duration_since(UNIX_EPOCH).unwrap();
    let at = |d: Duration| (now + d).as_micros().to_string();
    let micros_now = now.as_micros().to_string();
    let mut hset = redis::cmd("HSET");
    hset.arg(key)
        .arg("k")
        .arg(&req.key.as_bytes()[..])
        .arg("f")
        .arg(&req.key.fingerprint()[..])
        .arg("t")
        .arg(&req.tenant)
        .arg("o")
        .arg(&req.tool)
        .arg("s")
        .arg(state)
        .arg("a")
        .arg(req.attempt.get().to_string())
        .arg("c")
        .arg(&micros_now)
        .arg("u")
        .arg(&micros_now)
        .arg("l")
        .arg(at(req.lease))
        .arg("e")
        .arg(at(req.window))
        .arg("r")
        .arg(at(req.retention))
        .arg("n")
        .arg(&micros_now)
        .arg("x")
        .arg("0")
        .arg("b")
        .arg(body);
    let _: i64 = command(url, &hset).await;
    let _: i64 = command(url, redis::cmd("PEXPIRE").arg(key).arg(3_600_000)).await;
}

/// Records that an earlier version of the store wrote as hashes are still
/// read after an upgrade: a completed one answers a repeat with its response
/// (no second run), an in-progress one is completed by its attempt, and the
/// change writes it back in the current form.
#[tokio::test]
async fn records_written_as_hashes_are_read_after_an_upgrade() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let done = claim_request(Duration::from_secs(900));
    write_hash_record(
        &redis.url,
        &record_key(&redis.prefix, &done.key),
        &done,
        "1",
        r#"{"receipt":"r-1"}"#,
    )
    .await;
    match redis.claim(&again(&done)).await.unwrap() {
        Claim::Existing { record } => {
            assert_eq!(record.attempt, done.attempt);
            assert_eq!(record.tenant, done.tenant);
            assert_eq!(
                record.state,
                RecordState::Completed {
                    response: r#"{"receipt":"r-1"}"#.to_owned()
                }
            );
        }
        other => panic!("a repeat of a completed hash record claimed it: {other:?}"),
    }

    let running = claim_request(Duration::from_secs(900));
    let key = record_key(&redis.prefix, &running.key);
    write_hash_record(&redis.url, &key, &running, "0", "").await;
    assert!(matches!(
        redis.claim(&again(&running)).await.unwrap(),
        Claim::Existing { .. }
    ));
    redis
        .complete(&running.key, running.attempt, "2")
        .await
        .unwrap();
    let kind: String = command(&redis.url, redis::cmd("TYPE").arg(&key)).await;
    assert_eq!(kind, "string");
    // Written before references had tags: its reference is the key's first
    // eight bytes, as it was printed then, and it keeps it.
    let legacy = idem_runtime::Reference::with_tag(&running.key, 0);
    assert_eq!(legacy.to_string().len(), "idem_".len() + 16);
    let record = redis
        .lookup(&running.tenant, &legacy)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.reference, legacy);
    assert_eq!(
        record.state,
        RecordState::Completed {
            response: "2".to_owned()
        }
    );
}

/// The store's library as version 8d26ab9 loaded it (its `FUNCTION LOAD`
/// text, byte for byte): the scripts that extended a late completion's
/// window to its retention, and gave a COMPLETED record its native expiry at
/// the end of its window.
const LIBRARY_8D26AB9: &str = include_str!("../data/redis/library-8d26ab9.lua");

/// The library name in the first line of a library's code.
fn library_name_of(code: &str) -> &str {
    code.lines()
        .next()
        .and_then(|l| l.strip_prefix("#!lua name="))
        .unwrap()
}

/// One call of a function of 8d26ab9's library over the record of `req`:
/// `ARGV[1]` packs the key, the key in hex and `tail`, as that version's
/// store did.
async fn call_8d26ab9(
    url: &str,
    prefix: &str,
    function: &str,
    req: &ClaimRequest,
    tail: &[u8],
    args: &[&str],
) -> redis::Value {
    let hex: String = req
        .key
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let packed = [&req.key.as_bytes()[..], hex.as_bytes(), tail].concat();
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(format!("{}_{function}", library_name_of(LIBRARY_8D26AB9)))
        .arg(1)
        .arg(record_key(prefix, &req.key))
        .arg(packed)
        .arg(args);
    command(url, &cmd).await
}

/// A text as 8d26ab9's scripts unpack it (`i4c0`).
fn packed_text(text: &str) -> Vec<u8> {
    [&(text.len() as u32).to_le_bytes()[..], text.as_bytes()].concat()
}

/// 8d26ab9's claim of `req`, then its completion (`late`: after the sweep
/// marked it UNKNOWN and its window ended, which extended its window to its
/// retention), both by that version's own scripts.
async fn completed_by_8d26ab9(url: &str, prefix: &str, req: &ClaimRequest, late: bool) {
    let micros = |d: Duration| (d.as_micros() as f64).to_le_bytes();
    let attempt = packed_text(&req.attempt.get().to_string());
    let claim = [
        &req.key.fingerprint()[..],
        &packed_text(&req.tenant),
        &packed_text(&req.tool),
        &attempt,
        &micros(req.lease),
        &micros(req.window),
        &micros(req.retention),
        &req.reference.tag().to_be_bytes(),
    ]
    .concat();
    let reply = call_8d26ab9(url, prefix, "claim", req, &claim, &[]).await;
    assert!(
        matches!(&reply, redis::Value::Array(a) if a.first() == Some(&redis::Value::Int(5))),
        "claimed by 8d26ab9's script: {reply:?}"
    );
    if late {
        call_8d26ab9(
            url,
            prefix,
            "mark_unknown",
            req,
            &attempt,
            &["timeout", "0"],
        )
        .await;
        tokio::time::sleep(req.window + Duration::from_millis(100)).await;
    }
    let reply = call_8d26ab9(url, prefix, "complete", req, &attempt, &["\"old\""]).await;
    assert_eq!(reply, redis::Value::Array(vec![redis::Value::Int(0)]));
}

/// A server that holds 8d26ab9's library and records its scripts wrote: the
/// store loads its own library beside it (its name is a hash of its code,
/// so a new version's first call finds its functions missing) and reads
/// those records under the new rules. A record completed on time answers
/// repeats for its window; the purge moves its native expiry from the end of
/// its window to its retention; after the window the same call is a new
/// operation, and the old one still reads by its reference. A record
/// completed late, whose window 8d26ab9 moved to its retention, holds its
/// key as that version promised (its first window was not kept).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_of_8d26ab9_read_and_are_taken_over_under_the_new_rules() {
    let Some(server) = Server::start(&[]) else {
        return;
    };
    let url = server.url();
    let old = library_name_of(LIBRARY_8D26AB9);
    assert_ne!(
        old,
        RedisStore::library_name(),
        "the library's name changed"
    );
    let _: String = command(
        &url,
        redis::cmd("FUNCTION").arg("LOAD").arg(LIBRARY_8D26AB9),
    )
    .await;
    let prefix = "upgraded";
    let on_time = ClaimRequest {
        window: Duration::from_millis(1500),
        retention: Duration::from_secs(3600),
        ..claim_request(Duration::from_millis(1500))
    };
    let late = ClaimRequest {
        lease: Duration::from_millis(100),
        window: Duration::from_millis(200),
        retention: Duration::from_secs(3600),
        ..claim_request(Duration::from_millis(200))
    };
    completed_by_8d26ab9(&url, prefix, &on_time, false).await;
    completed_by_8d26ab9(&url, prefix, &late, true).await;
    let key = record_key(prefix, &on_time.key);
    let ttl_then = expire_time(&url, &key).await;

    let store = RedisStore::builder(&url)
        .unwrap()
        .prefix(prefix)
        .build()
        .unwrap();
    let Claim::Existing { record } = store.claim(&new_operation(&on_time)).await.unwrap() else {
        panic!("a repeat inside the window of 8d26ab9's completion claimed it");
    };
    assert_eq!(record.reference, on_time.reference);
    assert_eq!(
        record.state,
        RecordState::Completed {
            response: "\"old\"".into()
        }
    );
    assert_eq!(ttl_then, ms_ceil(record.expires_at), "8d26ab9's expiry");
    let mut found = libraries(&url).await;
    found.sort();
    let mut want = vec![old.to_owned(), RedisStore::library_name().to_owned()];
    want.sort();
    assert_eq!(found, want, "the new library loaded beside the old one");

    // The purge migrates the shards one SCAN step each: until every shard
    // is done, the record gets its retention as native expiry.
    let mut rounds = 0;
    while expire_time(&url, &key).await != ms_ceil(record.retain_until) {
        store.purge_expired(1000).await.unwrap();
        rounds += 1;
        assert!(rounds < 100, "the purge never moved the expiry");
    }

    // The late one holds its key for its (moved) window, as 8d26ab9 said.
    let Claim::Existing { record: held } = store.claim(&new_operation(&late)).await.unwrap() else {
        panic!("8d26ab9's late completion no longer holds its key");
    };
    assert_eq!(held.reference, late.reference);
    assert_eq!(held.expires_at, held.retain_until);

    // After the window: a new operation, and the old one reads as it was.
    let wait = record
        .expires_at
        .duration_since(server_time(&url).await)
        .unwrap_or_default();
    tokio::time::sleep(wait + Duration::from_millis(100)).await;
    let later = new_operation(&on_time);
    let Claim::Claimed { reference } = store.claim(&later).await.unwrap() else {
        panic!("the same call after the window did not run");
    };
    assert_eq!(reference, later.reference);
    let first = store
        .lookup(&on_time.tenant, &on_time.reference)
        .await
        .unwrap()
        .expect("8d26ab9's operation reads by its reference after the takeover");
    assert_eq!(
        (first.attempt, first.state, first.retain_until),
        (
            on_time.attempt,
            RecordState::Completed {
                response: "\"old\"".into()
            },
            record.retain_until
        )
    );
    let superseded = format!(
        "{prefix}:{{{:02x}}}:o:{}",
        on_time.key.as_bytes()[0] % 64,
        on_time
            .reference
            .as_bytes()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    assert_eq!(
        expire_time(&url, &superseded).await,
        ms_ceil(record.retain_until),
        "kept until its retention, by Redis' own expiry"
    );
    let now = store.lookup(&later.tenant, &later.reference).await.unwrap();
    assert_eq!(now.map(|r| r.attempt), Some(later.attempt));
    assert!(matches!(
        store.complete(&on_time.key, on_time.attempt, "1").await,
        Err(StoreError::Fenced)
    ));
}
