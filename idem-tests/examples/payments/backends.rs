//! The in-process stubs of the far sides: a processor, a carrier, a mailer
//! and a warehouse, each deduplicating by the key it is given, and their
//! ledger.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_runtime::{
    follow_ons::{follow_on_fn, FollowOnHandlers, FollowOnRun},
    ToolError,
};
use tokio::sync::watch;

use super::model::{
    ChargeArgs, ChargeCounts, ChargeStatus, DeliveryCounts, LedgerView, Receipt, ReceiptMail,
    Shipment, ShipmentArgs, ShipmentCounts, WarehouseNotice,
};
use super::remote::Remote;

#[derive(Debug)]
struct ChargeEntry {
    /// When the first request with this key arrived: the key is kept for
    /// [`KEYS_KEPT`] from then.
    since: Instant,
    requests: u32,
    charges: u32,
    /// `None` while the charge is in flight; the receipt once it is made.
    outcome: watch::Receiver<Option<Receipt>>,
}

#[derive(Debug)]
struct ShipmentEntry {
    since: Instant,
    requests: u32,
    shipments: u32,
    shipment: Shipment,
}

#[derive(Debug, Default)]
struct Books {
    charges: BTreeMap<String, ChargeEntry>,
    shipments: BTreeMap<String, ShipmentEntry>,
    charge_seq: u32,
    shipment_seq: u32,
    /// The mailer's and the warehouse's requests, by downstream key.
    mails: BTreeMap<String, Delivery>,
    notices: BTreeMap<String, Delivery>,
    /// How many of the mailer's next requests fail (a flaky mailer).
    mailer_failures: u32,
}

#[derive(Debug)]
struct Delivery {
    since: Instant,
    reference: String,
    attempts: u32,
    deliveries: u32,
}

/// A delivery by a stub that dedupes by the downstream key, counted from
/// the moment the request arrives; `fail` makes this request fail.
fn deliver(
    to: &mut BTreeMap<String, Delivery>,
    job: &FollowOnRun,
    fail: bool,
) -> Result<(), String> {
    let fresh = || Delivery {
        since: Instant::now(),
        reference: job.reference.to_string(),
        attempts: 0,
        deliveries: 0,
    };
    let entry = to.entry(job.downstream_key.clone()).or_insert_with(fresh);
    if !kept(entry.since) {
        // The key was forgotten: this is a new request to the far side.
        *entry = fresh();
    }
    entry.attempts += 1;
    if fail {
        return Err(format!(
            "unavailable (request {} for {})",
            entry.attempts, job.downstream_key
        ));
    }
    // A repeat of a delivered key is acknowledged, not delivered again.
    entry.deliveries = 1;
    Ok(())
}

fn delivery_counts(
    from: &BTreeMap<String, Delivery>,
    total_attempts: &mut u32,
    total_deliveries: &mut u32,
) -> BTreeMap<String, DeliveryCounts> {
    let mut by_reference: BTreeMap<String, DeliveryCounts> = BTreeMap::new();
    for delivery in from.values() {
        let counts = by_reference.entry(delivery.reference.clone()).or_default();
        counts.attempts += delivery.attempts;
        counts.deliveries += delivery.deliveries;
        *total_attempts += delivery.attempts;
        *total_deliveries += delivery.deliveries;
    }
    by_reference
}

/// How long the stubs keep an idempotency key, from the first request that
/// carried it: a day, as Stripe does. A stub that kept keys forever would
/// hide a reference reused by two operations a day apart.
pub const KEYS_KEPT: Duration = Duration::from_secs(24 * 3600);

/// Whether a key first seen at `since` is still kept.
fn kept(since: Instant) -> bool {
    since.elapsed() < KEYS_KEPT
}

/// The simulated processor and carrier. Both deduplicate by the reference
/// they are given for [`KEYS_KEPT`], as real ones do with an idempotency
/// key: the processor
/// registers a reference the moment a request arrives (before its delay),
/// and a later request with the same reference waits for the first one's
/// outcome instead of charging again. Each counts the requests it received
/// and the effects it made separately, so the ledger shows any retry that
/// got past idem. The processor also answers lookups by reference (in
/// flight, charged, never seen), which the reconciler uses.
///
/// The books live in memory: unlike a real processor's, they are gone when
/// the process exits.
#[derive(Clone, Debug)]
pub struct Backends {
    books: Arc<Mutex<Books>>,
    processor_delay_ms: Arc<AtomicU64>,
    /// The far sides reached over HTTP instead, if any.
    remote: Remote,
}

impl Backends {
    /// Backends whose processor takes `processor_delay` per charge.
    pub fn new(processor_delay: Duration) -> Self {
        Backends {
            books: Arc::default(),
            processor_delay_ms: Arc::new(AtomicU64::new(processor_delay.as_millis() as u64)),
            remote: Remote::new(None, None),
        }
    }

    /// Charges go to the processor service at `processor` and receipts to
    /// the mailer service at `mailer` (`src/bin/farside.rs`), each where
    /// given, instead of the stubs in this process. The ledger tool then
    /// shows only what stayed in process: the services have their own
    /// (`GET /ledger`).
    #[allow(dead_code)] // the server binary's flags; the demo keeps the stubs
    pub fn with_services(mut self, processor: Option<String>, mailer: Option<String>) -> Self {
        self.remote = Remote::new(processor, mailer);
        self
    }

    /// Changes how long the processor takes from the next charge on.
    #[allow(dead_code)] // the demo's slow-processor scenario; the server binary uses a flag
    pub fn set_processor_delay(&self, delay: Duration) {
        self.processor_delay_ms
            .store(delay.as_millis() as u64, Ordering::SeqCst);
    }

    fn books(&self) -> std::sync::MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Asks the processor to charge the card under `reference`, and waits
    /// for the outcome. The processor works on its own: a caller that stops
    /// waiting (a timeout) does not stop the charge. A request whose
    /// reference the processor already has is not charged again; it gets the
    /// first request's receipt, once there is one.
    pub async fn charge(&self, reference: String, args: &ChargeArgs) -> Result<Receipt, ToolError> {
        if self.remote.has_processor() {
            return self.remote.charge(&reference, args).await;
        }
        let mut outcome = {
            let mut books = self.books();
            let books = &mut *books;
            match books
                .charges
                .get_mut(&reference)
                .filter(|entry| kept(entry.since))
            {
                Some(entry) => {
                    entry.requests += 1;
                    entry.outcome.clone()
                }
                None => {
                    // Numbered on arrival, so overlapping charges get distinct ids.
                    books.charge_seq += 1;
                    let receipt = Receipt {
                        charge_id: format!("ch_{:04}", books.charge_seq),
                        amount_cents: args.amount_cents,
                        currency: args.currency.clone(),
                        reference: reference.clone(),
                    };
                    let (done, outcome) = watch::channel(None);
                    books.charges.insert(
                        reference.clone(),
                        ChargeEntry {
                            since: Instant::now(),
                            requests: 1,
                            charges: 0,
                            outcome: outcome.clone(),
                        },
                    );
                    let delay =
                        Duration::from_millis(self.processor_delay_ms.load(Ordering::SeqCst));
                    let processor = self.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        let mut books = processor.books();
                        if let Some(entry) = books.charges.get_mut(&reference) {
                            entry.charges += 1;
                        }
                        // Under the lock: the lookup never sees the charge
                        // counted without its receipt.
                        done.send_replace(Some(receipt));
                    });
                    outcome
                }
            }
        };
        let receipt = outcome
            .wait_for(Option::is_some)
            .await
            .expect("the processor finishes every charge it accepted")
            .clone();
        Ok(receipt.expect("waited for a receipt"))
    }

    /// What the processor knows about `reference`: its lookup API. Errors:
    /// the processor service could not be asked.
    pub async fn charge_status(&self, reference: &str) -> Result<ChargeStatus, String> {
        if self.remote.has_processor() {
            return self.remote.charge_status(reference).await;
        }
        Ok(match self.books().charges.get(reference) {
            None => ChargeStatus::NotFound,
            Some(entry) => match &*entry.outcome.borrow() {
                None => ChargeStatus::InFlight,
                Some(receipt) => ChargeStatus::Charged(receipt.clone()),
            },
        })
    }

    /// Books a shipment with the carrier under `reference`; a request whose
    /// reference the carrier already has gets the same shipment back.
    pub async fn ship(&self, reference: String, args: &ShipmentArgs) -> Shipment {
        let mut books = self.books();
        let books = &mut *books;
        if let Some(entry) = books
            .shipments
            .get_mut(&reference)
            .filter(|entry| kept(entry.since))
        {
            entry.requests += 1;
            return entry.shipment.clone();
        }
        books.shipment_seq += 1;
        let shipment = Shipment {
            tracking_number: format!("1Z{:08}", 40_000_000 + books.shipment_seq * 7919),
            order_id: args.order_id.clone(),
            service_level: args.service_level.clone(),
            reference: reference.clone(),
        };
        books.shipments.insert(
            reference,
            ShipmentEntry {
                since: Instant::now(),
                requests: 1,
                shipments: 1,
                shipment: shipment.clone(),
            },
        );
        shipment
    }

    /// Makes the mailer fail its next `n` requests (the demo's flaky mailer).
    #[allow(dead_code)] // the demo's scenario; the server binary uses a flag
    pub fn set_mailer_failures(&self, n: u32) {
        self.books().mailer_failures = n;
    }

    /// The stub mailer: sends the receipt of `job` unless it has already
    /// sent one under the follow-on's downstream key.
    pub fn send_receipt(&self, job: &FollowOnRun) -> Result<(), String> {
        let mut books = self.books();
        let fail = books.mailer_failures > 0;
        books.mailer_failures = books.mailer_failures.saturating_sub(1);
        deliver(&mut books.mails, job, fail).map_err(|e| format!("mailer {e}"))
    }

    /// The stub warehouse: takes the notice of `job` unless it already has
    /// one under the follow-on's downstream key.
    pub fn notify_warehouse(&self, job: &FollowOnRun) -> Result<(), String> {
        deliver(&mut self.books().notices, job, false)
    }

    /// The follow-ons' handlers: receipts to the mailer, notices to the
    /// warehouse, each with the follow-on's downstream key.
    pub fn job_handlers(&self) -> FollowOnHandlers {
        let (mailer, warehouse) = (self.clone(), self.clone());
        FollowOnHandlers::new()
            .on(
                "send_receipt",
                follow_on_fn(move |job: FollowOnRun| {
                    let mailer = mailer.clone();
                    async move {
                        let _mail: ReceiptMail = job.payload_as()?;
                        if mailer.remote.has_mailer() {
                            return mailer.remote.send(&job).await.map_err(Into::into);
                        }
                        mailer.send_receipt(&job).map_err(Into::into)
                    }
                }),
            )
            .on(
                "notify_warehouse",
                follow_on_fn(move |job: FollowOnRun| {
                    let warehouse = warehouse.clone();
                    async move {
                        let _notice: WarehouseNotice = job.payload_as()?;
                        warehouse.notify_warehouse(&job).map_err(Into::into)
                    }
                }),
            )
    }

    /// Every request and every effect so far, by reference.
    pub fn ledger(&self) -> LedgerView {
        let books = self.books();
        let mut view = LedgerView::default();
        view.mailer = delivery_counts(
            &books.mails,
            &mut view.mailer_attempts,
            &mut view.mailer_deliveries,
        );
        view.warehouse = delivery_counts(
            &books.notices,
            &mut view.warehouse_attempts,
            &mut view.warehouse_deliveries,
        );
        for (reference, entry) in &books.charges {
            view.processor_requests += entry.requests;
            view.processor_charges += entry.charges;
            view.processor.insert(
                reference.clone(),
                ChargeCounts {
                    requests: entry.requests,
                    charges: entry.charges,
                },
            );
        }
        for (reference, entry) in &books.shipments {
            view.carrier_requests += entry.requests;
            view.carrier_shipments += entry.shipments;
            view.carrier.insert(
                reference.clone(),
                ShipmentCounts {
                    requests: entry.requests,
                    shipments: entry.shipments,
                },
            );
        }
        view
    }
}
