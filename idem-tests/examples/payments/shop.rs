//! The payments example's MCP server: a card charge and a shipment made safe
//! to repeat, each with a follow-on (a receipt to a stub mailer, a
//! notice to a stub warehouse) sent through the follow-on dispatcher, a status tool, and a
//! demo-only ledger of what the stub processor, carrier, mailer and
//! warehouse really did. Shared by `examples/payments` (the server binary)
//! and `examples/demo`.
//!
//! In files by follow-on: the tools here, their data in `model.rs`, the stub far
//! sides in `backends.rs` (or, in `remote.rs`, services over HTTP), the
//! reconciler in `reconcile.rs`. The files are
//! named by `#[path]` so that `examples/demo`, which includes this file by
//! `#[path]` too, finds them beside it.

#[path = "backends.rs"]
mod backends;
#[path = "model.rs"]
mod model;
#[path = "reconcile.rs"]
mod reconcile;
#[path = "remote.rs"]
mod remote;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::{
    current_reference, follow_on, idempotent,
    mcp::{current_cancellation, current_continuation},
    Ask, Caller, Executor, IdempotentServer, ToolError,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CancelTaskParams, ElicitResult, ElicitationAction, ElicitationSchema, GetTaskParams,
    GetTaskResult, Implementation, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, ErrorData, RoleServer, ServerHandler};
use serde::Serialize;

pub use backends::Backends;
pub use model::*;
pub use reconcile::ProcessorReconciler;

/// From this amount (in cents) up, `charge_card` asks the user to confirm
/// before it charges.
pub const CONFIRM_FROM_CENTS: u64 = 100_000;

/// The key of `charge_card`'s confirmation among its input requests.
pub const CONFIRM_KEY: &str = "confirm";

/// The confirmation `charge_card` asks for: a form with one boolean,
/// `confirm`.
fn confirmation(args: &ChargeArgs) -> Ask<Json<Receipt>> {
    let schema = ElicitationSchema::builder()
        .required_bool("confirm")
        .description("Set confirm to true to charge the card")
        .build()
        .expect("a schema with one boolean property");
    Ask::elicit(
        CONFIRM_KEY,
        format!(
            "Charge {}.{:02} {} to card {}? Nothing is charged unless you confirm.",
            args.amount_cents / 100,
            args.amount_cents % 100,
            args.currency.to_uppercase(),
            args.card
        ),
        schema,
    )
}

/// An accept whose form says `confirm: true`; anything else declines.
fn confirmed(answer: &ElicitResult) -> bool {
    answer.action == ElicitationAction::Accept
        && answer
            .content
            .as_ref()
            .and_then(|content| content.get("confirm"))
            .and_then(serde_json::Value::as_bool)
            == Some(true)
}

/// The payments MCP server.
#[derive(Clone, Debug)]
pub struct Payments {
    executor: Executor,
    default_caller: Option<Caller>,
    backends: Backends,
    processor_timeout: Duration,
    /// Each card's nickname: set by `set_card_nickname`, which writes the
    /// value it is given, so a repeat changes nothing.
    nicknames: Arc<Mutex<BTreeMap<String, String>>>,
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
            nicknames: Arc::default(),
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
        // leaves the outcome unknown, for the reconciler (or an operator).
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
                Ok(Err(failed)) => Err(failed),
                Ok(Ok(receipt)) => {
                    // Not mailed here: a crash between the charge and the
                    // mail would lose it. The follow-on dispatcher mails it once the
                    // charge is recorded, with the reference and the follow-on
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
                 not have gone through.",
            )),
        }
    }

    /// Declares a follow-on of the running operation: written with its
    /// completion, sent by the follow-on dispatcher. `what` says what happened before, for
    /// the answer if the follow-on cannot be declared (the effect is done, so the
    /// outcome is reported unknown and the reconciler takes over).
    fn queue<P: Serialize>(&self, name: &str, payload: &P, what: &str) -> Result<(), ToolError> {
        follow_on(name, payload).map_err(|e| {
            ToolError::unknown(format!(
                "{what}, but the {name} follow-on could not be queued ({e})."
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
    /// the MCP tasks extension gets a task at once and polls it. A host that
    /// sends an idempotency key (`_meta["idem/idempotency-key"]`, or the
    /// `Idempotency-Key` header over HTTP) names the operation itself: the
    /// same key is one charge for 24 hours, another key another charge.
    #[idempotent(
        window = "15m",
        status_tool = "get_operation_status",
        task = "optional",
        client_key = "optional"
    )]
    #[tool(
        description = "Charge a card. Safe to retry: a repeat within 15 minutes returns the \
                          first charge's receipt instead of charging again. From 1000.00 up \
                          (amount_cents >= 100000) the user is asked to confirm first."
    )]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Ask<Json<Receipt>>, ToolError> {
        // A large charge is confirmed by the user before anything happens:
        // the first call asks (idem records nothing and releases the claim),
        // the continuation carries the answer and is the operation.
        if args.amount_cents >= CONFIRM_FROM_CENTS {
            match current_continuation().and_then(|c| c.elicitation(CONFIRM_KEY)) {
                None => return Ok(confirmation(&args)),
                Some(answer) if confirmed(&answer) => {}
                Some(_) => {
                    return Err(ToolError::rejected(
                        "The user did not confirm the charge, so nothing was charged. Call \
                         charge_card again to ask again.",
                    ))
                }
            }
        }
        self.charge(args).await.map(Ask::Done)
    }

    /// A card tapped at a till: a second tap of the same card for the same
    /// amount within 5 seconds is the same payment (a double tap), and a tap
    /// after that is a new purchase, under a new reference, charged again. A
    /// till that sends an idempotency key per purchase says which taps are
    /// one purchase, whatever the clock.
    #[idempotent(
        window = "5s",
        status_tool = "get_operation_status",
        client_key = "optional"
    )]
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

    /// Sets a card's nickname: idempotent by construction (it writes the
    /// value it is given), so idem records nothing for it.
    #[idempotent(
        by_construction = "sets the card's nickname to the given value; a repeat writes the same value"
    )]
    #[tool(
        description = "Set the nickname shown for a card. Safe to retry: a repeat sets the same name."
    )]
    async fn set_card_nickname(&self, Parameters(args): Parameters<NicknameArgs>) -> String {
        let mut nicknames = self
            .nicknames
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        nicknames.insert(args.card.clone(), args.nickname.clone());
        format!("Card {} is now called {:?}.", args.card, args.nickname)
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
        idem_runtime::mcp::tasks::get_task(self, request, context).await
    }

    /// `tasks/cancel`: signals the handler if it runs in this process.
    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        idem_runtime::mcp::tasks::cancel_task(self, request, context).await
    }
}
