//! Items read back as records and jobs, times as DynamoDB keeps them, and
//! the SDK's errors as [`StoreError`]s.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::{AttributeValue, CancellationReason};

use super::layout::{attr, Item, JOB_TAG, RECORD_TAG, SUPERSEDED_TAG};
use crate::key::{IdempotencyKey, Reference};
use crate::store::{
    Attempt, FollowOnId, FollowOnRecord, Record, RecordState, RecordStateKind, StoreError,
};

/// A time as the table keeps it: whole microseconds since the epoch.
pub(super) fn micros(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros()
        .min(u128::from(u64::MAX)) as u64
}

/// A time read back from microseconds since the epoch.
pub(super) fn at(micros: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(micros)
}

/// A time in whole epoch seconds, rounded up: DynamoDB's TTL attribute
/// (never before the time itself).
pub(super) fn ttl_secs(t: SystemTime) -> u64 {
    micros(t).div_ceil(1_000_000)
}

/// The first byte of an item's sort key: what kind of item it is.
pub(super) fn tag(item: &Item) -> Option<u8> {
    match item.get(attr::SK) {
        Some(AttributeValue::B(b)) => b.as_ref().first().copied(),
        _ => None,
    }
}

/// Whether an item is a record (a key's current record or a superseded
/// operation), by its sort key.
pub(super) fn is_record(item: &Item) -> bool {
    matches!(tag(item), Some(RECORD_TAG | SUPERSEDED_TAG))
}

/// Whether an item is a job, by its sort key.
pub(super) fn is_job(item: &Item) -> bool {
    tag(item) == Some(JOB_TAG)
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(format!("DynamoDB item: {what}"))
}

fn bytes<'i>(item: &'i Item, name: &str) -> Result<&'i [u8], StoreError> {
    match item.get(name) {
        Some(AttributeValue::B(b)) => Ok(b.as_ref()),
        _ => Err(corrupt(&format!("`{name}` is not binary"))),
    }
}

fn text<'i>(item: &'i Item, name: &str) -> Result<&'i str, StoreError> {
    match item.get(name) {
        Some(AttributeValue::S(s)) => Ok(s),
        _ => Err(corrupt(&format!("`{name}` is not a string"))),
    }
}

fn opt_text(item: &Item, name: &str) -> Option<String> {
    match item.get(name) {
        Some(AttributeValue::S(s)) => Some(s.clone()),
        _ => None,
    }
}

/// A number attribute, `None` when absent.
pub(super) fn opt_number(item: &Item, name: &str) -> Result<Option<u64>, StoreError> {
    match item.get(name) {
        None => Ok(None),
        Some(AttributeValue::N(n)) => n
            .parse()
            .map(Some)
            .map_err(|_| corrupt(&format!("`{name}` is not a whole number: {n}"))),
        Some(_) => Err(corrupt(&format!("`{name}` is not a number"))),
    }
}

/// A number attribute that must be there.
pub(super) fn number(item: &Item, name: &str) -> Result<u64, StoreError> {
    opt_number(item, name)?.ok_or_else(|| corrupt(&format!("`{name}` is missing")))
}

/// The state of a record item.
pub(super) fn state_of(item: &Item) -> Result<RecordStateKind, StoreError> {
    let code = number(item, attr::STATE)?;
    RecordStateKind::from_code(code as i64).ok_or_else(|| corrupt(&format!("state code {code}")))
}

/// A record item (a key's current record or a superseded operation) as a
/// [`Record`], read at `now` (the store's clock).
pub(super) fn record(item: &Item, now: SystemTime) -> Result<Record, StoreError> {
    let pk = bytes(item, attr::PK)?;
    let sk = bytes(item, attr::SK)?;
    let mut key = [0u8; 32];
    let whole = match sk.first() {
        Some(&RECORD_TAG) => sk.len() == 25,
        // The key's tail, then the reference.
        Some(&SUPERSEDED_TAG) => sk.len() == 25 + 8 || sk.len() == 25 + 16,
        _ => false,
    };
    if pk.len() != 8 || !whole {
        return Err(corrupt("a record's key is not 32 bytes"));
    }
    key[..8].copy_from_slice(pk);
    key[8..].copy_from_slice(&sk[1..25]);
    let fingerprint: [u8; 32] = bytes(item, attr::FINGERPRINT)?
        .try_into()
        .map_err(|_| corrupt("a fingerprint is not 32 bytes"))?;
    let reference = Reference::from_bytes(bytes(item, attr::REFERENCE)?)
        .ok_or_else(|| corrupt("a reference is not 8 or 16 bytes"))?;
    let note = || opt_text(item, attr::NOTE).unwrap_or_default();
    let state = match state_of(item)? {
        RecordStateKind::InProgress => RecordState::InProgress,
        RecordStateKind::Completed => RecordState::Completed {
            response: text(item, attr::RESPONSE)?.to_owned(),
        },
        RecordStateKind::Unknown => RecordState::Unknown { note: note() },
        RecordStateKind::NotPerformed => RecordState::NotPerformed { note: note() },
    };
    let time = |name| number(item, name).map(at);
    Ok(Record {
        expires_at: window_end(item, &state)?,
        key: IdempotencyKey::from_parts(key, fingerprint),
        reference,
        tenant: text(item, attr::TENANT)?.to_owned(),
        tool: text(item, attr::TOOL)?.to_owned(),
        attempt: Attempt::from_stored(number(item, attr::ATTEMPT)?),
        state,
        claimed_at: time(attr::CLAIMED)?,
        updated_at: time(attr::UPDATED)?,
        lease_until: time(attr::LEASE)?,
        retain_until: time(attr::RETAIN)?,
        // Written when the record becomes UNKNOWN; until then the claim's
        // time and none.
        next_check_at: match opt_number(item, attr::NEXT_CHECK)? {
            Some(t) => at(t),
            None => time(attr::CLAIMED)?,
        },
        checks: u32::try_from(opt_number(item, attr::CHECKS)?.unwrap_or(0)).unwrap_or(u32::MAX),
        resolution: opt_text(item, attr::RESOLUTION),
        observed_at: now,
    })
}

/// The end of a record item's window. An item that earlier versions
/// completed late had its window moved to its retention end and its TTL
/// removed (a COMPLETED item without `tt`: every completion now sets it);
/// its window is read back from `te`, which those claims wrote as the
/// window's end in epoch seconds (rounded up), and which the claim's
/// condition reads the same way.
fn window_end(item: &Item, state: &RecordState) -> Result<SystemTime, StoreError> {
    let written = at(number(item, attr::EXPIRES)?);
    if !matches!(state, RecordState::Completed { .. }) || item.contains_key(attr::TTL) {
        return Ok(written);
    }
    Ok(match opt_number(item, attr::TTL_AT)? {
        Some(secs) => written.min(at(secs.saturating_mul(1_000_000))),
        None => written,
    })
}

/// A job item as a [`FollowOnRecord`].
pub(super) fn job(item: &Item) -> Result<FollowOnRecord, StoreError> {
    let reference = Reference::from_bytes(bytes(item, attr::REFERENCE)?)
        .ok_or_else(|| corrupt("a job's reference is not 8 or 16 bytes"))?;
    let time = |name| number(item, name).map(at);
    let opt_time = |name| opt_number(item, name).map(|t| t.map(at));
    Ok(FollowOnRecord {
        id: FollowOnId {
            tenant: text(item, attr::TENANT)?.to_owned(),
            reference,
            name: text(item, attr::NAME)?.to_owned(),
        },
        payload: text(item, attr::PAYLOAD)?.to_owned(),
        runs: u32::try_from(number(item, attr::RUNS)?).unwrap_or(u32::MAX),
        attempt: opt_number(item, attr::JOB_ATTEMPT)?.map(Attempt::from_stored),
        next_run_at: time(attr::NEXT_RUN)?,
        last_error: opt_text(item, attr::ERROR),
        dead: matches!(item.get(attr::DEAD), Some(AttributeValue::Bool(true))),
        created_at: time(attr::CREATED)?,
        updated_at: time(attr::UPDATED)?,
        delivered_at: opt_time(attr::DELIVERED)?,
        kept_until: opt_time(attr::KEPT)?,
        earlier_runs: opt_number(item, attr::EARLIER_RUNS)?
            .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
        error_before_redrive: opt_text(item, attr::ERROR_BEFORE_REDRIVE),
    })
}

/// A `TransactWriteItems` cancelled because DynamoDB found one of its
/// writes invalid (reason `ValidationError`: an item over 400 KB once
/// updated, say) as [`StoreError::Invalid`]: nothing was written, and the
/// same transaction again would be refused again. `None` when no reason is
/// a validation error (a condition, a conflict, throttling).
pub(super) fn invalid_transaction(reasons: &[CancellationReason]) -> Option<StoreError> {
    let refused = reasons
        .iter()
        .find(|r| r.code() == Some("ValidationError"))?;
    Some(StoreError::Invalid(format!(
        "DynamoDB refused the transaction as invalid, and wrote nothing: {}",
        refused.message().unwrap_or("ValidationError")
    )))
}

/// An SDK error as the store's: throttling, timeouts and a connection that
/// failed are `Unavailable` (retry later: nothing was changed that the
/// caller can tell); a missing table, or credentials refused, are `Config`
/// (retrying will not help); a request DynamoDB found invalid (an item over
/// its 400 KB) is `Invalid`.
pub(super) fn sdk_error<E>(table: &str, e: SdkError<E, HttpResponse>) -> StoreError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let code = e.code().unwrap_or_default().to_owned();
    let message = e.message().unwrap_or_default().to_owned();
    match &e {
        SdkError::ServiceError(_) => match code.as_str() {
            "ResourceNotFoundException" => StoreError::Config(format!(
                "the DynamoDB table {table:?} (or one of its indexes) does not exist: create it \
                 with DynamoDbStore::create_table, or from the definition in \
                 idem_runtime::store::DYNAMODB_TABLE_DEFINITION ({message})"
            )),
            "UnrecognizedClientException"
            | "InvalidSignatureException"
            | "AccessDeniedException"
            | "MissingAuthenticationToken"
            | "ExpiredTokenException" => StoreError::Config(format!(
                "DynamoDB refused the credentials ({code}: {message}): check \
                 AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN) or the \
                 client's credentials provider"
            )),
            "ValidationException" => {
                StoreError::Invalid(format!("DynamoDB refused the request: {message}"))
            }
            // An answer without an error code (an HTTP 500 from a proxy
            // or an emulator): what there is of it, never an empty text.
            "" => {
                let answer = e.raw_response().map(|r| {
                    let body = r.body().bytes().unwrap_or_default();
                    let body = String::from_utf8_lossy(&body[..body.len().min(200)]);
                    format!("HTTP {} {body:?}", r.status().as_u16())
                });
                StoreError::Unavailable(format!(
                    "DynamoDB answered an error that names no code ({}); the same call later \
                     may pass",
                    answer.as_deref().unwrap_or("no answer")
                ))
            }
            // ProvisionedThroughputExceededException, ThrottlingException,
            // RequestLimitExceeded, InternalServerError, a transaction
            // conflict: the same call later may pass.
            _ => StoreError::Unavailable(format!("DynamoDB: {code}: {message}")),
        },
        _ => StoreError::Unavailable(format!(
            "DynamoDB: {}",
            aws_sdk_dynamodb::error::DisplayErrorContext(&e)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(code: &str, message: Option<&str>) -> CancellationReason {
        CancellationReason::builder()
            .code(code)
            .set_message(message.map(str::to_owned))
            .build()
    }

    /// An item made too large inside a transaction is a request that
    /// cannot pass, not an outage to retry.
    #[test]
    fn a_validation_error_in_a_transaction_is_invalid() {
        let reasons = [
            reason("None", None),
            reason(
                "ValidationError",
                Some("Item size has exceeded the maximum allowed size"),
            ),
        ];
        let e = invalid_transaction(&reasons).expect("classed");
        assert!(matches!(&e, StoreError::Invalid(_)), "{e:?}");
        assert!(e.to_string().contains("maximum allowed size"), "{e}");
    }

    #[test]
    fn other_cancellations_are_not_invalid() {
        for code in [
            "ConditionalCheckFailed",
            "TransactionConflict",
            "ThrottlingError",
            "None",
        ] {
            assert!(
                invalid_transaction(&[reason("None", None), reason(code, None)]).is_none(),
                "{code}"
            );
        }
        assert!(invalid_transaction(&[]).is_none());
    }
}
