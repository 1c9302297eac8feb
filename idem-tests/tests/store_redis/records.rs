//! What only Redis has: times from the server's clock, native expiry over
//! the record's life, the key layout (the sorted sets of a shard, keys that
//! share their first bytes, a job on its record's slot), and a resent claim.

use std::time::{Duration, SystemTime};

use idem_runtime::store::conformance::{again, claim_request};
use idem_runtime::{
    key::IdempotencyKey,
    store::{Claim, ClaimRequest, FollowOnStore, RecordState, Resolution},
    IdempotencyStore, StoreError,
};

use crate::durable;
use crate::redis_server::{command, Prefixed};
use crate::{expire_time, ms_ceil, record_key, server_time};
use idem_runtime::store::Upkeep;

/// Times come from the server's `TIME`: a claim's times fall between two
/// readings of it, and its lease and window are exact.
#[tokio::test]
async fn times_come_from_the_server() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let req = durable::request(Duration::from_secs(30), Duration::from_secs(60));
    let before = server_time(&redis.url).await;
    redis.claim(&req).await.unwrap();
    let after = server_time(&redis.url).await;
    let record = redis
        .lookup(&req.tenant, &req.reference)
        .await
        .unwrap()
        .unwrap();
    assert!(before <= record.claimed_at && record.claimed_at <= after);
    assert!(record.claimed_at <= record.observed_at);
    let since_claim = |t: SystemTime| t.duration_since(record.claimed_at).unwrap();
    assert_eq!(since_claim(record.lease_until), Duration::from_secs(30));
    assert_eq!(since_claim(record.expires_at), Duration::from_secs(60));
}

/// Redis deletes a record at the end of its life, by a native TTL that every
/// transition sets: an IN_PROGRESS or UNKNOWN record when both its retention
/// and its lease are over, a COMPLETED one at `retain_until` (its window,
/// `expires_at`, ends the key's hold, not the record).
#[tokio::test]
async fn native_ttl_follows_the_record_life() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let req = ClaimRequest {
        lease: Duration::from_secs(30),
        window: Duration::from_secs(60),
        retention: Duration::from_secs(3600),
        ..claim_request(Duration::from_secs(60))
    };
    let key = record_key(&redis.prefix, &req.key);
    let read = async || {
        redis
            .lookup(&req.tenant, &req.reference)
            .await
            .unwrap()
            .unwrap()
    };
    redis.claim(&req).await.unwrap();
    let r = read().await;
    assert_eq!(expire_time(&redis.url, &key).await, ms_ceil(r.retain_until));

    // A lease renewed past the retention keeps the record as long.
    redis
        .heartbeat(&req.key, req.attempt, Duration::from_secs(7200))
        .await
        .unwrap();
    let r = read().await;
    assert!(r.lease_until > r.retain_until);
    assert_eq!(expire_time(&redis.url, &key).await, ms_ceil(r.lease_until));

    redis
        .mark_unknown(&req.key, req.attempt, "timeout")
        .await
        .unwrap();
    assert_eq!(expire_time(&redis.url, &key).await, ms_ceil(r.lease_until));

    redis
        .resolve(
            &req.key,
            req.attempt,
            Resolution::Completed { response: "1" },
            None,
        )
        .await
        .unwrap();
    let r = read().await;
    assert!(r.expires_at < r.retain_until);
    assert_eq!(expire_time(&redis.url, &key).await, ms_ceil(r.retain_until));
}

/// The sorted sets of the shard the record lives in.
fn sets(prefix: &str, key: &IdempotencyKey) -> [String; 2] {
    let shard = key.as_bytes()[0] % 64;
    [
        format!("{prefix}:{{{shard:02x}}}:lapsed"),
        format!("{prefix}:{{{shard:02x}}}:unknown"),
    ]
}

async fn members(url: &str, set: &str) -> usize {
    command(url, redis::cmd("ZCARD").arg(set)).await
}

/// Once Redis deleted expired IN_PROGRESS and UNKNOWN records, purge drops
/// their entries in the sorted sets and counts them; COMPLETED records were
/// never listed, so they cost purge nothing.
#[tokio::test]
async fn purge_drops_the_entries_of_deleted_records() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let short = Duration::from_millis(100);
    let lapsed = durable::request(short, short);
    let unknown = durable::request(short, short);
    let completed = durable::request(short, short);
    for req in [&lapsed, &unknown, &completed] {
        redis.claim(req).await.unwrap();
    }
    redis
        .mark_unknown(&unknown.key, unknown.attempt, "timeout")
        .await
        .unwrap();
    redis
        .complete(&completed.key, completed.attempt, "1")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    for req in [&lapsed, &unknown, &completed] {
        let gone = redis.lookup(&req.tenant, &req.reference).await.unwrap();
        assert_eq!(gone, None, "Redis deleted the record at its end");
    }
    assert_eq!(
        members(&redis.url, &sets(&redis.prefix, &lapsed.key)[0]).await,
        1
    );
    assert_eq!(
        members(&redis.url, &sets(&redis.prefix, &unknown.key)[1]).await,
        1
    );
    assert_eq!(redis.purge_expired(1).await.unwrap(), 1, "a batch of one");
    assert_eq!(redis.purge_expired(100).await.unwrap(), 1);
    assert_eq!(redis.purge_expired(100).await.unwrap(), 0);
    assert_eq!(
        members(&redis.url, &sets(&redis.prefix, &lapsed.key)[0]).await,
        0
    );
    assert_eq!(
        members(&redis.url, &sets(&redis.prefix, &unknown.key)[1]).await,
        0
    );
}

/// Two operations whose keys share their first eight bytes (where their
/// references start) are still two records: each is claimed, completed,
/// found by its own reference and released on its own, whichever tenant
/// they are in.
#[tokio::test]
async fn a_reference_collision_keeps_two_records() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let first = claim_request(Duration::from_secs(900));
    let mut bytes = *first.key.as_bytes();
    bytes[31] ^= 1;
    for same_tenant in [false, true] {
        let first = again(&first);
        let key = IdempotencyKey::from_parts(bytes, [7; 32]);
        let second = ClaimRequest {
            key,
            reference: idem_runtime::Reference::new_operation(&key),
            tenant: if same_tenant {
                first.tenant.clone()
            } else {
                format!("{}-other", first.tenant)
            },
            ..claim_request(Duration::from_secs(900))
        };
        assert_eq!(first.reference.key_prefix(), second.reference.key_prefix());
        assert!(matches!(
            redis.claim(&first).await.unwrap(),
            Claim::Claimed { .. }
        ));
        assert!(matches!(
            redis.claim(&second).await.unwrap(),
            Claim::Claimed { .. }
        ));
        redis
            .complete(&second.key, second.attempt, "\"second\"")
            .await
            .unwrap();
        let Claim::Existing { record } = redis.claim(&again(&first)).await.unwrap() else {
            panic!("the first is still claimed");
        };
        assert_eq!(record.state, RecordState::InProgress);
        let Claim::Existing { record } = redis.claim(&again(&second)).await.unwrap() else {
            panic!("the second is completed");
        };
        assert_eq!(
            record.state,
            RecordState::Completed {
                response: "\"second\"".into()
            }
        );
        let found = redis
            .lookup(&second.tenant, &second.reference)
            .await
            .unwrap()
            .unwrap();
        // Each reference names its own operation, in one tenant or two.
        assert_eq!(found.key, second.key);
        let found = redis
            .lookup(&first.tenant, &first.reference)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(found.key, first.key);
        redis.release(&first.key, first.attempt).await.unwrap();
        assert!(matches!(
            redis.release(&second.key, second.attempt).await,
            Err(StoreError::WrongState { .. })
        ));
        // With the first gone, the second is still there, under its own key.
        let Claim::Existing { record } = redis.claim(&again(&second)).await.unwrap() else {
            panic!("the second outlives the first");
        };
        assert_eq!(record.key, second.key);
        assert_eq!(
            redis.lookup(&first.tenant, &first.reference).await.unwrap(),
            None,
            "the first's reference never names the second"
        );
        // The first runs again, and the records are still apart.
        let next = again(&first);
        assert!(matches!(
            redis.claim(&next).await.unwrap(),
            Claim::Claimed { .. }
        ));
        redis.release(&next.key, next.attempt).await.unwrap();
        bytes[30] ^= 1;
    }
}

/// A claim sent twice (the client resent it after its answer was lost) is
/// the same claim: the second answer says it is claimed, by that attempt.
#[tokio::test]
async fn a_resent_claim_is_the_same_claim() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let req = claim_request(Duration::from_secs(900));
    assert!(matches!(
        redis.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    assert!(matches!(
        redis.claim(&req).await.unwrap(),
        Claim::Claimed { .. }
    ));
    assert!(matches!(
        redis.claim(&again(&req)).await.unwrap(),
        Claim::Existing { .. }
    ));
}

/// A follow-on has no TTL and outlives its record: the record Redis
/// deletes at the end of its window leaves its job in place, listed and
/// leased. The job sits on its record's slot (the same hash tag).
#[tokio::test]
async fn jobs_outlive_their_record() {
    let Some(redis) = Prefixed::new().await else {
        return;
    };
    let short = Duration::from_millis(300);
    let req = ClaimRequest {
        lease: short,
        window: short,
        retention: short,
        ..claim_request(short)
    };
    let name = format!("receipt_{}", idem_runtime::store::Attempt::random().get());
    redis.claim(&req).await.unwrap();
    let job = idem_runtime::follow_ons::FollowOn::new(&name, &serde_json::json!({ "to": "a@b" }))
        .unwrap();
    redis
        .complete_with_follow_ons(
            &req.key,
            req.attempt,
            "1",
            idem_runtime::store::FollowOns::new(&[job]).unwrap(),
        )
        .await
        .unwrap();
    let record = record_key(&redis.prefix, &req.key);
    let tenant_hex: String = req.tenant.bytes().map(|b| format!("{b:02x}")).collect();
    let (tag, _) = record
        .strip_prefix(&format!("{}:", redis.prefix))
        .unwrap()
        .split_once(":r:")
        .unwrap();
    // Under the operation's whole reference.
    let reference: String = req
        .reference
        .as_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let job_key = format!("{}:{tag}:j:{reference}:{tenant_hex}:{name}", redis.prefix);
    assert_eq!(
        expire_time(&redis.url, &job_key).await,
        -1,
        "the job exists, without a TTL"
    );

    tokio::time::sleep(Duration::from_millis(600)).await;
    let exists: i64 = command(&redis.url, redis::cmd("EXISTS").arg(&record)).await;
    assert_eq!(
        exists, 0,
        "Redis deleted the record at the end of its window"
    );
    let leased = redis
        .lease_follow_ons(
            &[name.as_str()],
            10,
            Duration::from_secs(60),
            idem_runtime::store::Attempt::random(),
        )
        .await
        .unwrap();
    assert_eq!(leased.len(), 1, "the job outlived its record");
    assert_eq!(leased[0].id.reference, req.reference);
}
