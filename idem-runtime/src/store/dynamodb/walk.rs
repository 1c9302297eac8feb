//! The sweep's walk over the `leases` index.
//!
//! Every current record is in `leases` from its claim to its delete, at its
//! lease's end (`lu`), and only keys are projected, so a completion writes
//! no index. The sweep cannot ask the index for IN_PROGRESS records: it
//! walks the entries whose lease has ended, in order, from a cursor kept
//! per shard in an item of its own, reads their records (an eventually
//! consistent `BatchGetItem`, half a read unit per record of up to 4 KB),
//! and moves the cursor past every entry whose record is settled there. An
//! entry whose record is IN_PROGRESS is what the sweep is after: it holds
//! the cursor until the record is marked UNKNOWN (or completed, or
//! heartbeat to a later lease). So each record is read about once, as its
//! lease ends, however long its retention.
//!
//! Why moving past a settled entry is safe: a record leaves IN_PROGRESS
//! for good at the position its lease gave it; only a new claim makes it
//! IN_PROGRESS again, and a claim writes a lease in the future, which moves
//! the entry ahead of the cursor. A record read at another lease than its
//! entry's (the index lags the table) or not read at all (the read lags
//! the index, or the record is gone and its entry not yet) holds the cursor
//! for that round: it is judged again next round.
//!
//! What can still reach the index behind the cursor: an entry written on a
//! clock behind the walker's by more than its lease, or one the index took
//! longer than its lease to show. Each walk starts the store's clock
//! spread ([`DynamoDbStoreBuilder::clock_spread`], 1 s by default) before
//! its cursor, so either would also need to miss by that much more. The
//! clocks' bound (docs/clocks.md) keeps skew far below any
//! lease.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{KeysAndAttributes, ReturnValue};

use super::*;
use layout::LEASES_INDEX;

/// The most entries one walk reads per shard; it goes on from there at the
/// next round. Four shards at 50,000 a round every 30 s (the default
/// maintenance interval) keep up with some 6,600 calls a second; a round
/// that reads them all makes 2,000 pages of requests.
const BUDGET: usize = 50_000;

/// Entries per page: one `BatchGetItem` reads at most 100 items.
const PAGE: i32 = 100;

/// An item's table key, as bytes: `pk` then `sk`.
fn key_of(item: &Item) -> Option<(Vec<u8>, Vec<u8>)> {
    match (item.get(attr::PK), item.get(attr::SK)) {
        (Some(AttributeValue::B(pk)), Some(AttributeValue::B(sk))) => {
            Some((pk.as_ref().to_vec(), sk.as_ref().to_vec()))
        }
        _ => None,
    }
}

impl DynamoDbStore {
    /// The IN_PROGRESS records whose lease ran out at `now`, from every
    /// shard of `leases`, the earliest lease first, at most `limit`; each
    /// shard's cursor moves past the entries found settled or gone.
    pub(super) async fn walk_leases(
        &self,
        limit: usize,
        now: SystemTime,
    ) -> Result<Vec<Item>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let cursors = self.cursors().await?;
        let walks = (0..SHARDS).map(|s| self.walk_shard(s, cursors[usize::from(s)], limit, now));
        let mut found = Vec::new();
        for walked in join_all(walks).await {
            found.extend(walked?);
        }
        found.sort_by_key(|item| items::number(item, attr::LEASE).unwrap_or(u64::MAX));
        found.truncate(limit);
        Ok(found)
    }

    /// One shard's walk from `cursor` (µs).
    async fn walk_shard(
        &self,
        shard: u8,
        cursor: u64,
        limit: usize,
        now: SystemTime,
    ) -> Result<Vec<Item>, StoreError> {
        let rewind = u64::try_from(self.clock_spread.as_micros()).unwrap_or(u64::MAX);
        let from = cursor.saturating_sub(rewind);
        if from > micros(now) {
            // A cursor a walker with a clock ahead of this one's moved:
            // nothing behind it is due by this clock. Beyond the spread,
            // the clocks are outside the bound the walk rests on: claims
            // written behind the cursor are not walked (docs/clocks.md).
            tracing::warn!(
                table = %self.table,
                shard,
                ahead_ms = (from - micros(now)) / 1_000,
                "DynamoDB: the sweep's cursor is ahead of this replica's clock by more than \
                 the clock spread; check the replicas' clocks (NTP)"
            );
            return Ok(Vec::new());
        }
        let (mut passed, mut held) = (cursor, false);
        let (mut found, mut read, mut start) = (Vec::new(), 0, None);
        // Entries whose record read at another lease, or not at all.
        let (mut other_lease, mut unread) = (0_usize, 0_usize);
        loop {
            let page = self
                .client
                .query()
                .table_name(&*self.table)
                .index_name(LEASES_INDEX)
                .key_condition_expression("mq = :s AND lu BETWEEN :from AND :now")
                .expression_attribute_values(":s", num(shard))
                .expression_attribute_values(":from", num(from))
                .expression_attribute_values(":now", num(micros(now)))
                .limit(PAGE)
                .set_exclusive_start_key(start)
                .send()
                .await
                .map_err(|e| self.err(e))?;
            let entries = page.items.unwrap_or_default();
            let records = self.read_items(&entries).await?;
            for entry in &entries {
                let lease = items::number(entry, attr::LEASE)?;
                let record = key_of(entry).and_then(|k| records.get(&k));
                let here = match record {
                    Some(r) => items::number(r, attr::LEASE)? == lease,
                    None => false,
                };
                match record {
                    Some(r) if here && items::state_of(r)? == InProgress => {
                        if found.len() < limit {
                            found.push(r.clone());
                        }
                        held = true;
                    }
                    Some(_) if here => {}
                    // The index lags the table (or the read lags the index):
                    // judged again next round, at the lease it reads at then.
                    Some(_) => {
                        other_lease += 1;
                        held = true;
                    }
                    // The read lags the index, or the record is gone and its
                    // entry not yet.
                    None => {
                        unread += 1;
                        held = true;
                    }
                }
                if !held {
                    passed = passed.max(lease);
                }
            }
            read += entries.len();
            start = page.last_evaluated_key;
            if start.is_none() || read >= BUDGET || found.len() >= limit {
                break;
            }
        }
        if other_lease + unread > 0 {
            tracing::debug!(
                table = %self.table,
                shard,
                other_lease,
                unread,
                "DynamoDB: the sweep's walk holds its cursor at entries whose record reads at \
                 another lease (the index lags the table) or not at all (the read lags the \
                 index); they are judged again next round"
            );
        }
        if passed > cursor {
            self.move_cursor(shard, passed).await?;
        }
        Ok(found)
    }

    /// The items the index `entries` name, read eventually consistent,
    /// by their table key.
    async fn read_items(
        &self,
        entries: &[Item],
    ) -> Result<HashMap<(Vec<u8>, Vec<u8>), Item>, StoreError> {
        let mut keys: Vec<Item> = Vec::with_capacity(entries.len());
        let mut seen = std::collections::HashSet::new();
        for entry in entries {
            if let Some(k) = key_of(entry) {
                if seen.insert(k) {
                    keys.push(
                        [attr::PK, attr::SK]
                            .into_iter()
                            .filter_map(|a| entry.get(a).map(|v| (a.to_owned(), v.clone())))
                            .collect(),
                    );
                }
            }
        }
        let mut found = HashMap::with_capacity(keys.len());
        let mut rounds = 0;
        while !keys.is_empty() {
            let wanted = KeysAndAttributes::builder()
                .set_keys(Some(std::mem::take(&mut keys)))
                .build()
                .map_err(|e| StoreError::Invalid(e.to_string()))?;
            let got = self
                .client
                .batch_get_item()
                .request_items(&*self.table, wanted)
                .send()
                .await
                .map_err(|e| self.err(e))?;
            for item in got
                .responses
                .unwrap_or_default()
                .remove(&*self.table)
                .unwrap_or_default()
            {
                if let Some(k) = key_of(&item) {
                    found.insert(k, item);
                }
            }
            // Keys DynamoDB left for later (throttling, a response over
            // 16 MB): asked again, a little later each time.
            if let Some(left) = got
                .unprocessed_keys
                .unwrap_or_default()
                .remove(&*self.table)
            {
                keys = left.keys;
                rounds += 1;
                if rounds > 8 {
                    return Err(StoreError::Unavailable(
                        "DynamoDB kept leaving the sweep's reads unprocessed; try again".into(),
                    ));
                }
                tokio::time::sleep(Duration::from_millis(20 << rounds)).await;
            }
        }
        Ok(found)
    }

    /// Every shard's cursor (µs; 0 where none was written yet), read
    /// strongly consistent.
    async fn cursors(&self) -> Result<[u64; SHARDS as usize], StoreError> {
        let page = self
            .client
            .query()
            .table_name(&*self.table)
            .consistent_read(true)
            .key_condition_expression("pk = :pk")
            .expression_attribute_values(":pk", layout::cursor_key(0)[attr::PK].clone())
            .send()
            .await
            .map_err(|e| self.err(e))?;
        let mut cursors = [0; SHARDS as usize];
        for item in page.items.unwrap_or_default() {
            let Some((_, sk)) = key_of(&item) else {
                continue;
            };
            if let [layout::CURSOR_TAG, shard] = sk[..] {
                if let Some(c) = cursors.get_mut(usize::from(shard)) {
                    *c = items::number(&item, attr::CURSOR)?;
                }
            }
        }
        Ok(cursors)
    }

    /// Moves `shard`'s cursor to `to`, unless another walk moved it
    /// further already.
    async fn move_cursor(&self, shard: u8, to: u64) -> Result<(), StoreError> {
        use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
        let sent = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(layout::cursor_key(shard)))
            .condition_expression("attribute_not_exists(cu) OR cu < :cu")
            .update_expression("SET cu = :cu")
            .expression_attribute_values(":cu", num(to))
            .return_values(ReturnValue::None)
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(()),
                _ => Err(self.err(e)),
            },
        }
    }
}
