//! The payments example's MCP server: a card charge and a shipment made safe
//! to repeat, a status tool, and a demo-only ledger of what the stub
//! processor and carrier really did. Shared by `examples/payments` (the
//! server binary) and `examples/demo`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use idem_runtime::{
    current_cancellation, current_reference, idempotent, Caller, Executor, IdempotentServer,
    Reconciler, Reconciliation, Record, ToolError,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CallToolResponse, CancelTaskParams, GetTaskParams, GetTaskResult, Implementation,
    ServerCapabilities, ServerConfig,
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

/// What the stub processor and carrier were asked to do and really did, per
/// reference: a retry that got past idem shows as a second request, and a
/// double charge (which the stubs' own deduplication prevents) as a second
/// charge.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LedgerView {
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
    requests: u32,
    charges: u32,
    /// `None` while the charge is in flight; the receipt once it is made.
    outcome: watch::Receiver<Option<Receipt>>,
}

#[derive(Debug)]
struct ShipmentEntry {
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
}

/// The simulated processor and carrier. Both deduplicate by the reference
/// they are given, as real ones do with an idempotency key: the processor
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
            match books.charges.get_mut(&reference) {
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
        if let Some(entry) = books.shipments.get_mut(&reference) {
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
                requests: 1,
                shipments: 1,
                shipment: shipment.clone(),
            },
        );
        shipment
    }

    /// Every request and every effect so far, by reference.
    pub fn ledger(&self) -> LedgerView {
        let books = self.books();
        let mut view = LedgerView::default();
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
                Ok(receipt) => Ok(Json(receipt)),
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
        Ok(Json(self.backends.ship(reference, &args).await))
    }

    /// Demo only: what the stub processor and carrier were asked to do.
    #[tool(
        description = "Demo only: per reference, how many requests reached the stub processor \
                       and carrier and how many charges and shipments they really made, to \
                       check that a retry did not charge or ship twice.",
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
#[derive(Debug)]
pub struct ProcessorReconciler(pub Backends);

#[async_trait]
impl Reconciler for ProcessorReconciler {
    async fn reconcile(
        &self,
        record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        Ok(match record.tool.as_str() {
            "charge_card" => match self.0.charge_status(&record.reference().to_string()) {
                ChargeStatus::Charged(receipt) => Reconciliation::Completed {
                    response: tool_response(receipt)?,
                },
                ChargeStatus::InFlight => Reconciliation::StillUnknown,
                ChargeStatus::NotFound => Reconciliation::NotPerformed,
            },
            // The carrier dedups by reference but offers no lookup: only an
            // operator can resolve a shipment (`resolve_by_hand`).
            "create_shipment" => Reconciliation::StillUnknown,
            _ => Reconciliation::NotMine,
        })
    }
}

/// Exactly what `charge_card` returns for `receipt`, as idem stores it: the
/// tool result serialized to JSON text.
fn tool_response(receipt: Receipt) -> Result<String, Box<dyn std::error::Error + Send + Sync>> {
    match Json(receipt).into_call_tool_result()? {
        CallToolResponse::Complete(result) => Ok(serde_json::to_string(&result)?),
        _ => Err("the receipt did not make one tool result".into()),
    }
}
