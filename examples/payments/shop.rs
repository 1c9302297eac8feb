//! The payments example's MCP server: a card charge and a shipment made safe
//! to repeat, each with a follow-on job (a receipt to a stub mailer, a
//! notice to a stub warehouse) sent through the outbox, a status tool, and a
//! demo-only ledger of what the stub processor, carrier, mailer and
//! warehouse really did. Shared by `examples/payments` (the server binary)
//! and `examples/demo`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use idem_runtime::{
    current_cancellation, current_reference, follow_on, idempotent,
    maintenance::{Outcome, Reconciler, Reconciliation},
    outbox::{job_fn, FollowOn, JobHandlers, JobRun},
    store::Record,
    Caller, Executor, IdempotentServer, ToolError,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CancelTaskParams, GetTaskParams, GetTaskResult, Implementation, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, ErrorData, RoleServer, ServerHandler};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

/// `charge_card`'s arguments.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    /// The card to charge (a token or the last four digits in this demo).
    pub card: String,
    /// The amount in the currency's smallest unit.
    pub amount_cents: u64,
    /// ISO 4217 code, lower case.
    #[serde(default = "usd")]
    pub currency: String,
}

fn usd() -> String {
    "usd".to_owned()
}

/// What a charge returns.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Receipt {
    /// The processor's charge id.
    pub charge_id: String,
    /// The amount charged.
    pub amount_cents: u64,
    /// The currency charged.
    pub currency: String,
    /// The idempotency reference the processor was given.
    pub reference: String,
}

/// `create_shipment`'s arguments.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShipmentArgs {
    /// The order this shipment fulfils: one shipment per order.
    pub order_id: String,
    /// Where to ship.
    pub address: String,
    /// e.g. "standard" or "express".
    pub service_level: String,
}

/// What a shipment returns.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Shipment {
    /// The carrier's tracking number.
    pub tracking_number: String,
    /// The order shipped.
    pub order_id: String,
    /// The service level booked.
    pub service_level: String,
    /// The idempotency reference the carrier was given.
    pub reference: String,
}

/// What the stub processor saw and did under one reference.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChargeCounts {
    /// Charge requests that arrived with this reference.
    pub requests: u32,
    /// Charges actually made for it: 0 while the first request is in
    /// flight, then 1. A repeated request gets the first one's outcome.
    pub charges: u32,
}

/// What the stub carrier saw and did under one reference.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ShipmentCounts {
    /// Shipment requests that arrived with this reference.
    pub requests: u32,
    /// Shipments actually booked for it (at most 1).
    pub shipments: u32,
}

/// What the stub mailer or warehouse saw and did under one reference.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeliveryCounts {
    /// Requests that arrived (the outbox's runs of the job, failed ones
    /// included).
    pub attempts: u32,
    /// What was actually delivered: the stub dedupes by the downstream key,
    /// so at most 1.
    pub deliveries: u32,
}

/// The receipt `charge_card` asks the outbox to mail.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReceiptMail {
    /// The processor's charge id.
    pub charge_id: String,
    /// The amount charged.
    pub amount_cents: u64,
    /// The currency charged.
    pub currency: String,
}

impl ReceiptMail {
    fn of(receipt: &Receipt) -> Self {
        ReceiptMail {
            charge_id: receipt.charge_id.clone(),
            amount_cents: receipt.amount_cents,
            currency: receipt.currency.clone(),
        }
    }
}

/// The notice `create_shipment` asks the outbox to send the warehouse.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WarehouseNotice {
    /// The order to pick and pack.
    pub order_id: String,
    /// The carrier's tracking number.
    pub tracking_number: String,
}

/// What the stub processor, carrier, mailer and warehouse were asked to do
/// and really did, per reference: a retry that got past idem shows as a
/// second request, and a double charge (which the stubs' own deduplication
/// prevents) as a second charge; a receipt the outbox ran three times shows
/// three attempts and one delivery.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LedgerView {
    /// Receipt requests and receipts mailed, by reference.
    pub mailer: BTreeMap<String, DeliveryCounts>,
    /// Warehouse notices requested and delivered, by reference.
    pub warehouse: BTreeMap<String, DeliveryCounts>,
    /// Total receipt requests that reached the mailer.
    pub mailer_attempts: u32,
    /// Total receipts mailed.
    pub mailer_deliveries: u32,
    /// Total notices that reached the warehouse.
    pub warehouse_attempts: u32,
    /// Total notices delivered.
    pub warehouse_deliveries: u32,
    /// Charge requests and charges made at the processor, by reference.
    pub processor: BTreeMap<String, ChargeCounts>,
    /// Shipment requests and shipments booked at the carrier, by reference.
    pub carrier: BTreeMap<String, ShipmentCounts>,
    /// Total charge requests that reached the processor.
    pub processor_requests: u32,
    /// Total charges the processor made.
    pub processor_charges: u32,
    /// Total shipment requests that reached the carrier.
    pub carrier_requests: u32,
    /// Total shipments the carrier booked.
    pub carrier_shipments: u32,
}

/// What the processor's lookup says about a reference.
#[derive(Clone, Debug)]
pub enum ChargeStatus {
    /// No request with this reference ever arrived.
    NotFound,
    /// A request arrived and its charge is still being processed.
    InFlight,
    /// The charge was made.
    Charged(Receipt),
}

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
fn deliver(to: &mut BTreeMap<String, Delivery>, job: &JobRun, fail: bool) -> Result<(), String> {
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
}

impl Backends {
    /// Backends whose processor takes `processor_delay` per charge.
    pub fn new(processor_delay: Duration) -> Self {
        Backends {
            books: Arc::default(),
            processor_delay_ms: Arc::new(AtomicU64::new(processor_delay.as_millis() as u64)),
        }
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
    pub async fn charge(&self, reference: String, args: &ChargeArgs) -> Receipt {
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
        receipt.expect("waited for a receipt")
    }

    /// What the processor knows about `reference`: its lookup API.
    pub fn charge_status(&self, reference: &str) -> ChargeStatus {
        match self.books().charges.get(reference) {
            None => ChargeStatus::NotFound,
            Some(entry) => match &*entry.outcome.borrow() {
                None => ChargeStatus::InFlight,
                Some(receipt) => ChargeStatus::Charged(receipt.clone()),
            },
        }
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
    /// sent one under the job's downstream key.
    pub fn send_receipt(&self, job: &JobRun) -> Result<(), String> {
        let mut books = self.books();
        let fail = books.mailer_failures > 0;
        books.mailer_failures = books.mailer_failures.saturating_sub(1);
        deliver(&mut books.mails, job, fail).map_err(|e| format!("mailer {e}"))
    }

    /// The stub warehouse: takes the notice of `job` unless it already has
    /// one under the job's downstream key.
    pub fn notify_warehouse(&self, job: &JobRun) -> Result<(), String> {
        deliver(&mut self.books().notices, job, false)
    }

    /// The outbox's handlers: receipts to the mailer, notices to the
    /// warehouse, each with the job's downstream key.
    pub fn job_handlers(&self) -> JobHandlers {
        let (mailer, warehouse) = (self.clone(), self.clone());
        JobHandlers::new()
            .on(
                "send_receipt",
                job_fn(move |job: JobRun| {
                    let mailer = mailer.clone();
                    async move {
                        let _mail: ReceiptMail = job.payload_as()?;
                        mailer.send_receipt(&job).map_err(Into::into)
                    }
                }),
            )
            .on(
                "notify_warehouse",
                job_fn(move |job: JobRun| {
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

/// The payments MCP server.
#[derive(Clone, Debug)]
pub struct Payments {
    executor: Executor,
    default_caller: Option<Caller>,
    backends: Backends,
    processor_timeout: Duration,
    tool_router: ToolRouter<Self>,
}

impl Payments {
    /// A server on `executor`. `default_caller` serves a single local user
    /// (stdio); leave it `None` where every request carries its caller (HTTP
    /// behind an auth layer).
    pub fn new(
        executor: Executor,
        default_caller: Option<Caller>,
        backends: Backends,
        processor_timeout: Duration,
    ) -> Self {
        Payments {
            executor,
            default_caller,
            backends,
            processor_timeout,
            tool_router: Self::router(),
        }
    }

    /// Every tool; `#[idem_runtime::tool_router]` has added the status tool.
    pub fn router() -> ToolRouter<Self> {
        Self::tool_router()
    }

    /// What `charge_card` and `tap_to_pay` do under their operation: charge
    /// the card at the processor, with the operation's reference as its
    /// idempotency key, and queue the receipt.
    async fn charge(&self, args: ChargeArgs) -> Result<Json<Receipt>, ToolError> {
        if args.amount_cents == 0 {
            return Err(ToolError::rejected(
                "The amount must be at least 1 cent; nothing was charged.",
            ));
        }
        // The processor gets the operation's reference as its own
        // idempotency key: the guarantee reaches across that boundary.
        let reference = current_reference()
            .expect("inside #[idempotent]")
            .to_string();
        // Run as a task, the call can be cancelled (`tasks/cancel`); the
        // request is already at the processor by then, so stopping to wait
        // leaves the outcome unknown, and the reconciler settles it.
        let cancelled = async {
            match current_cancellation() {
                Some(signal) => signal.cancelled().await,
                None => std::future::pending().await,
            }
        };
        // The processor keeps going when we stop waiting, as a real one does:
        // the charge may happen after the timeout, so the outcome is unknown.
        tokio::select! {
            charged = tokio::time::timeout(
                self.processor_timeout,
                self.backends.charge(reference, &args),
            ) => match charged {
                Ok(receipt) => {
                    // Not mailed here: a crash between the charge and the
                    // mail would lose it. The outbox mails it once the
                    // charge is recorded, with the reference and the job
                    // name as the mailer's idempotency key.
                    self.queue(
                        "send_receipt",
                        &ReceiptMail::of(&receipt),
                        "The card was charged",
                    )?;
                    Ok(Json(receipt))
                }
                Err(_) => Err(ToolError::unknown(format!(
                    "The processor did not answer within {} ms; the charge may or may not have gone through.",
                    self.processor_timeout.as_millis()
                ))),
            },
            () = cancelled => Err(ToolError::unknown(
                "The task was cancelled while the processor was charging; the charge may or may \
                 not have gone through, and is being reconciled.",
            )),
        }
    }

    /// Declares a follow-on job of the running operation: written with its
    /// completion, sent by the outbox. `what` says what happened before, for
    /// the answer if the job cannot be declared (the effect is done, so the
    /// outcome is reported unknown and the reconciler takes over).
    fn queue<P: Serialize>(&self, name: &str, payload: &P, what: &str) -> Result<(), ToolError> {
        follow_on(name, payload).map_err(|e| {
            ToolError::unknown(format!(
                "{what}, but the {name} job could not be queued ({e})."
            ))
        })
    }
}

impl IdempotentServer for Payments {
    fn executor(&self) -> &Executor {
        &self.executor
    }

    fn default_caller(&self) -> Option<&Caller> {
        self.default_caller.as_ref()
    }
}

#[idem_runtime::tool_router]
impl Payments {
    /// Charges a card at most once per (caller, card, amount, currency) within
    /// 15 minutes, however often the call is repeated. A client that declares
    /// the MCP tasks extension gets a task at once and polls it.
    #[idempotent(
        window = "15m",
        status_tool = "get_operation_status",
        task = "optional"
    )]
    #[tool(
        description = "Charge a card. Safe to retry: a repeat within 15 minutes returns the \
                          first charge's receipt instead of charging again."
    )]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        self.charge(args).await
    }

    /// A card tapped at a till: a second tap of the same card for the same
    /// amount within 5 seconds is the same payment (a double tap), and a tap
    /// after that is a new purchase, under a new reference, charged again.
    #[idempotent(window = "5s", status_tool = "get_operation_status")]
    #[tool(
        description = "Charge a card tapped at a till. A second tap of the same card for the \
                          same amount within 5 seconds is the same payment; after that it is a \
                          new purchase."
    )]
    async fn tap_to_pay(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        self.charge(args).await
    }

    /// Creates one shipment per order id: a repeat returns the same tracking
    /// number, and the same order id with other details is a conflict.
    #[idempotent(
        business_key = "order_id",
        status_tool = "get_operation_status",
        task = "optional"
    )]
    #[tool(
        description = "Create a shipment for an order. One shipment per order_id: a repeat \
                          returns the same tracking number."
    )]
    async fn create_shipment(
        &self,
        Parameters(args): Parameters<ShipmentArgs>,
    ) -> Result<Json<Shipment>, ToolError> {
        let reference = current_reference()
            .expect("inside #[idempotent]")
            .to_string();
        let shipment = self.backends.ship(reference, &args).await;
        let notice = WarehouseNotice {
            order_id: shipment.order_id.clone(),
            tracking_number: shipment.tracking_number.clone(),
        };
        self.queue("notify_warehouse", &notice, "The shipment was booked")?;
        Ok(Json(shipment))
    }

    /// Demo only: what the stub processor and carrier were asked to do.
    #[tool(
        description = "Demo only: per reference, how many requests reached the stub processor, \
                       carrier, mailer and warehouse, and how many charges, shipments, receipts \
                       and notices they really made, to check that a retry did not charge, \
                       ship or mail twice.",
        annotations(read_only_hint = true)
    )]
    async fn processor_ledger(&self) -> Json<LedgerView> {
        Json(self.backends.ledger())
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Payments {
    fn get_info(&self) -> ServerConfig {
        // `enable_tasks`: the MCP tasks extension, served from idem's records.
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new(
            "idem-payments",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(
            "Charges and shipments are safe to retry. When an answer says an operation is \
                 in progress or its outcome is unknown, do not submit it again: call \
                 get_operation_status with the reference it gives.",
        )
    }

    /// `tasks/get`: any replica answers from the store.
    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        idem_runtime::tasks::get_task(self, request, context).await
    }

    /// `tasks/cancel`: signals the handler if it runs in this process.
    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        idem_runtime::tasks::cancel_task(self, request, context).await
    }
}

/// Resolves UNKNOWN operations by asking the processor what became of the
/// reference: charged (the stored response is the receipt, as the tool would
/// have returned it), still in flight (ask again later), or never seen (not
/// performed, which idem trusts only once the record has settled). The
/// carrier has no lookup, so a shipment stays UNKNOWN for an operator; any
/// other tool is not this reconciler's.
///
/// A charge found made gets its receipt job written with the resolution
/// (the handler's declaration was lost with its outcome): every store idem
/// ships keeps follow-on jobs.
#[derive(Debug)]
pub struct ProcessorReconciler {
    /// The processor to ask.
    pub backends: Backends,
}

#[async_trait]
impl Reconciler for ProcessorReconciler {
    async fn reconcile(
        &self,
        record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        Ok(match record.tool.as_str() {
            "charge_card" | "tap_to_pay" => {
                match self.backends.charge_status(&record.reference.to_string()) {
                    // The handler's receipt job was lost with its outcome: the
                    // resolution writes it.
                    ChargeStatus::Charged(receipt) => {
                        let mail = FollowOn::new("send_receipt", &ReceiptMail::of(&receipt))?;
                        Reconciliation::Found(Outcome::completed_with(
                            tool_response(receipt)?,
                            vec![mail],
                        ))
                    }
                    ChargeStatus::InFlight => Reconciliation::StillUnknown,
                    ChargeStatus::NotFound => Reconciliation::not_performed(),
                }
            }
            // The carrier dedups by reference but offers no lookup: only an
            // operator can resolve a shipment (`resolve_by_hand`).
            "create_shipment" => Reconciliation::StillUnknown,
            _ => Reconciliation::NotMine,
        })
    }
}

/// Exactly what `charge_card` stores for `receipt` (it returns
/// `Json<Receipt>`), so a repeat replays the receipt as the tool would.
fn tool_response(receipt: Receipt) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    Ok(idem_runtime::stored_response(Json(receipt))?)
}
