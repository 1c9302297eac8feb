//! [`DynamoDbStore`]'s follow-ons: a new job's item, the fenced
//! changes of a leased job, and the [`FollowOnStore`] contract over them.

use super::*;

/// A new job's item: due at `now`, no runs, in the `due` index.
pub(super) fn job_item(id: &FollowOnId, payload: &str, now: SystemTime) -> Item {
    let mut item = layout::job_key(id);
    let now = num(micros(now));
    for (name, value) in [
        (attr::TENANT, AttributeValue::S(id.tenant.clone())),
        (attr::REFERENCE, blob(id.reference.as_bytes())),
        (attr::NAME, AttributeValue::S(id.name.clone())),
        (attr::PAYLOAD, AttributeValue::S(payload.to_owned())),
        (attr::RUNS, num(0)),
        (attr::NEXT_RUN, now.clone()),
        (attr::CREATED, now.clone()),
        (attr::UPDATED, now),
        (attr::DUE_SHARD, num(shard(id.reference.as_bytes()[0]))),
    ] {
        item.insert(name.to_owned(), value);
    }
    item
}

impl DynamoDbStore {
    /// A change of job `id`, conditional on `condition`: `Ok(false)` when
    /// the condition refused it.
    pub(super) async fn job_update(
        &self,
        id: &FollowOnId,
        condition: &str,
        update: &str,
        values: Values,
    ) -> Result<bool, StoreError> {
        use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
        let sent = self
            .client
            .update_item()
            .table_name(&*self.table)
            .set_key(Some(layout::job_key(id)))
            .condition_expression(condition)
            .update_expression(update)
            .set_expression_attribute_values(values.into_inner())
            .send()
            .await;
        match sent {
            Ok(_) => Ok(true),
            Err(e) => match e.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(self.err(e)),
            },
        }
    }

    /// A change of a job leased to `attempt` (and not delivered): `Fenced`
    /// when another lease holds it, it is gone or delivered.
    pub(super) async fn fenced_job(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        update: &str,
        values: Values,
    ) -> Result<(), StoreError> {
        let values = values.set(":ja", num(attempt.get()));
        let condition = "ja = :ja AND attribute_not_exists(dl)";
        match self.job_update(id, condition, update, values).await? {
            true => Ok(()),
            false => Err(StoreError::Fenced),
        }
    }

    /// Every job due by `now`, over every shard, the longest due first.
    async fn due_jobs(&self, now: SystemTime) -> Result<Vec<Item>, StoreError> {
        self.due(
            layout::DUE_INDEX,
            "dq = :s AND nr <= :now",
            attr::NEXT_RUN,
            usize::MAX,
            now,
        )
        .await
    }
}

#[async_trait]
impl FollowOnStore for DynamoDbStore {
    async fn complete_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        self.complete_from(
            key,
            attempt,
            &[InProgress, Unknown, NotPerformed],
            response,
            None,
            jobs,
        )
        .await
    }

    async fn resolve_with_follow_ons(
        &self,
        key: &IdempotencyKey,
        attempt: Attempt,
        response: &str,
        note: Option<&str>,
        jobs: FollowOns<'_>,
    ) -> Result<(), StoreError> {
        self.complete_from(key, attempt, &[Unknown], response, Some(note), jobs)
            .await
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
        let now = self.now();
        let mut due: Vec<FollowOnRecord> = Vec::new();
        for item in self.due_jobs(now).await? {
            let job = items::job(&item)?;
            if names.contains(&job.id.name.as_str()) {
                due.push(job);
            }
        }
        due.sort_by_key(due_order);
        let mut leased = Vec::new();
        for job in due {
            if leased.len() >= limit {
                break;
            }
            use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
            // Still live and due at the write: of two dispatchers, the
            // first write moves `nr` past now, and the second's condition
            // refuses.
            let sent = self
                .client
                .update_item()
                .table_name(&*self.table)
                .set_key(Some(layout::job_key(&job.id)))
                .condition_expression("attribute_exists(dq) AND nr <= :now")
                .update_expression("SET ja = :ja, rn = rn + :one, nr = :nr, ua = :now")
                .expression_attribute_values(":now", num(micros(now)))
                .expression_attribute_values(":ja", num(attempt.get()))
                .expression_attribute_values(":one", num(1))
                .expression_attribute_values(":nr", num(micros(now + lease)))
                .return_values(ReturnValue::AllNew)
                .send()
                .await;
            match sent {
                Ok(done) => leased.push(items::job(&done.attributes.unwrap_or_default())?),
                Err(e) => match e.as_service_error() {
                    Some(UpdateItemError::ConditionalCheckFailedException(_)) => {}
                    _ => return Err(self.err(e)),
                },
            }
        }
        sort_leased(&mut leased);
        Ok(leased)
    }

    async fn finish_follow_on(&self, id: &FollowOnId, attempt: Attempt) -> Result<(), StoreError> {
        // Kept as long as its operation's record (current or superseded):
        // until its retention ends, or until the next purge when it is gone
        // already.
        let kept = match self.lookup(&id.tenant, &id.reference).await? {
            Some(record) => record.retain_until,
            None => self.now(),
        };
        let now = self.now();
        let values = Values::default()
            .set(":now", num(micros(now)))
            .set(":ku", num(micros(kept)))
            .set(":tt", num(ttl_secs(kept)))
            .set(":shard", num(shard(id.reference.as_bytes()[0])));
        let update = "SET dl = :now, ku = :ku, ua = :now, xq = :shard, xk = :ku, tt = :tt \
                      REMOVE ja, dq";
        self.fenced_job(id, attempt, update, values).await
    }

    async fn retry_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        delay: Duration,
        error: &str,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let values = Values::default()
            .set(":now", num(micros(now)))
            .set(":nr", num(micros(now + delay)))
            .set(":er", AttributeValue::S(error.to_owned()));
        let update = "SET nr = :nr, er = :er, ua = :now REMOVE ja";
        self.fenced_job(id, attempt, update, values).await
    }

    async fn bury_follow_on(
        &self,
        id: &FollowOnId,
        attempt: Attempt,
        error: &str,
    ) -> Result<(), StoreError> {
        let now = self.now();
        let values = Values::default()
            .set(":now", num(micros(now)))
            .set(":dead", AttributeValue::Bool(true))
            .set(":er", AttributeValue::S(error.to_owned()));
        let update = "SET dd = :dead, er = :er, ua = :now REMOVE ja, dq";
        self.fenced_job(id, attempt, update, values).await
    }

    async fn list_follow_ons(
        &self,
        filter: &FollowOnFilter,
    ) -> Result<Vec<FollowOnRecord>, StoreError> {
        // An operation's jobs sit in its record's partition, under sort
        // keys that start with its reference: one query (`idem show`);
        // any other filter reads every job.
        let listed = match &filter.reference {
            Some(reference) => self.jobs_of(reference).await?,
            None => self.scan(&[layout::JOB_TAG], None).await?,
        };
        let mut found = Vec::new();
        for item in listed {
            let job = items::job(&item)?;
            if filter.matches(&job) {
                found.push(job);
            }
        }
        found.sort_by_key(listing_order);
        found.truncate(filter.limit);
        Ok(found)
    }

    async fn redrive_follow_on(&self, id: &FollowOnId) -> Result<bool, StoreError> {
        let now = self.now();
        let values = Values::default()
            .set(":now", num(micros(now)))
            .set(":dead", AttributeValue::Bool(true))
            .set(":zero", num(0))
            .set(":shard", num(shard(id.reference.as_bytes()[0])));
        // FollowOnRecord::redrive's fields: the runs added to the earlier runs (rb),
        // the last error kept as the error before the re-drive (eb; a dead
        // job always has one, written by bury_follow_on), both read before the
        // update.
        let update = "SET nr = :now, rb = if_not_exists(rb, :zero) + rn, rn = :zero, eb = er, \
                      ua = :now, dq = :shard REMOVE dd, ja, er";
        self.job_update(id, "dd = :dead", update, values).await
    }

    async fn count_due_follow_ons(&self) -> Result<BTreeMap<String, u64>, StoreError> {
        let now = self.now();
        let mut counts = BTreeMap::new();
        for item in self.due_jobs(now).await? {
            if let Some(AttributeValue::S(name)) = item.get(attr::NAME) {
                *counts.entry(name.clone()).or_insert(0) += 1;
            }
        }
        Ok(counts)
    }
}
