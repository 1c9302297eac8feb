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
    current_reference, idempotent, Caller, Executor, IdempotentServer, Reconciler, Reconciliation,
    Record, ToolError,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{CallToolResponse, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{tool, tool_handler, ServerHandler};
use serde::{Deserialize, Serialize};

/// The status tool every wrapped tool names in its answers.
pub const STATUS_TOOL: &str = "get_operation_status";

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

/// What the stub processor and carrier were asked to do, per reference.
#[derive(Clone, Debug, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LedgerView {
    /// Charge invocations at the processor, by reference.
    pub processor: BTreeMap<String, u32>,
    /// Shipment invocations at the carrier, by reference.
    pub carrier: BTreeMap<String, u32>,
    /// Total processor invocations.
    pub processor_invocations: u32,
    /// Total carrier invocations.
    pub carrier_invocations: u32,
}

#[derive(Debug, Default)]
struct Books {
    invocations: LedgerView,
    charges: BTreeMap<String, Receipt>,
    charges_started: u32,
    shipments: u32,
}

/// The simulated processor and carrier. Each counts every invocation by the
/// reference it was given, and the processor keeps the charges it made so a
/// reconciler can look one up, as a real processor's API would allow.
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

    /// Charges the card. The processor dedups by `reference` as real ones do,
    /// but counts every invocation, so the ledger shows any retry that got
    /// past idem.
    pub async fn charge(&self, reference: String, args: &ChargeArgs) -> Receipt {
        let (n, existing) = {
            let mut books = self.books();
            *books
                .invocations
                .processor
                .entry(reference.clone())
                .or_default() += 1;
            books.invocations.processor_invocations += 1;
            // Numbered when the charge starts, so overlapping charges get distinct ids.
            books.charges_started += 1;
            (
                books.charges_started,
                books.charges.get(&reference).cloned(),
            )
        };
        let delay = Duration::from_millis(self.processor_delay_ms.load(Ordering::SeqCst));
        tokio::time::sleep(delay).await;
        if let Some(receipt) = existing {
            return receipt;
        }
        let receipt = Receipt {
            charge_id: format!("ch_{n:04}"),
            amount_cents: args.amount_cents,
            currency: args.currency.clone(),
            reference: reference.clone(),
        };
        self.books().charges.insert(reference, receipt.clone());
        receipt
    }

    /// Books a shipment with the carrier.
    pub async fn ship(&self, reference: String, args: &ShipmentArgs) -> Shipment {
        let n = {
            let mut books = self.books();
            *books
                .invocations
                .carrier
                .entry(reference.clone())
                .or_default() += 1;
            books.invocations.carrier_invocations += 1;
            books.shipments += 1;
            books.shipments
        };
        Shipment {
            tracking_number: format!("1Z{:08}", 40_000_000 + n * 7919),
            order_id: args.order_id.clone(),
            service_level: args.service_level.clone(),
            reference,
        }
    }

    /// The processor's charge for `reference`, if it made one.
    pub fn charge_for(&self, reference: &str) -> Option<Receipt> {
        self.books().charges.get(reference).cloned()
    }

    /// Every invocation so far, by reference.
    pub fn ledger(&self) -> LedgerView {
        self.books().invocations.clone()
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

    /// Every tool, with the status tool.
    pub fn router() -> ToolRouter<Self> {
        Self::tool_router().with_route(idem_runtime::status_tool::<Self>(STATUS_TOOL))
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
    /// 15 minutes, however often the call is repeated.
    #[idempotent(window = "15m", status_tool = "get_operation_status")]
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
        let backends = self.backends.clone();
        // The processor keeps going when we stop waiting, as a real one does:
        // the charge may happen after the timeout, so the outcome is unknown.
        let charge = tokio::spawn(async move { backends.charge(reference, &args).await });
        match tokio::time::timeout(self.processor_timeout, charge).await {
            Ok(Ok(receipt)) => Ok(Json(receipt)),
            Ok(Err(join)) => Err(ToolError::unknown(format!("The processor call failed: {join}."))),
            Err(_) => Err(ToolError::unknown(format!(
                "The processor did not answer within {} ms; the charge may or may not have gone through.",
                self.processor_timeout.as_millis()
            ))),
        }
    }

    /// Creates one shipment per order id: a repeat returns the same tracking
    /// number, and the same order id with other details is a conflict.
    #[idempotent(business_key = "order_id", status_tool = "get_operation_status")]
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
        description = "Demo only: the stub processor's and carrier's invocations per reference, \
                       to check that a retry did not charge or ship twice.",
        annotations(read_only_hint = true)
    )]
    async fn processor_ledger(&self) -> Json<LedgerView> {
        Json(self.backends.ledger())
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Payments {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
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
}

/// Resolves UNKNOWN charges by asking the processor for the charge it made
/// under the operation's reference.
#[derive(Debug)]
pub struct ProcessorReconciler(pub Backends);

#[async_trait]
impl Reconciler for ProcessorReconciler {
    async fn reconcile(
        &self,
        record: &Record,
    ) -> Result<Reconciliation, Box<dyn std::error::Error + Send + Sync>> {
        if record.tool != "charge_card" {
            return Ok(Reconciliation::StillUnknown);
        }
        Ok(match self.0.charge_for(&record.reference().to_string()) {
            // Store exactly what the tool would have returned.
            Some(receipt) => match Json(receipt).into_call_tool_result()? {
                CallToolResponse::Complete(result) => Reconciliation::Completed {
                    response: serde_json::to_string(&result)?,
                },
                _ => Reconciliation::StillUnknown,
            },
            None => Reconciliation::NotPerformed,
        })
    }
}
