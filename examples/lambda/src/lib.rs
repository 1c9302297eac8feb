//! An MCP server on AWS Lambda, with idem's records in DynamoDB.
//!
//! - **The MCP function** (handler `mcp`): API Gateway's HTTP API (payload
//!   version 2.0) sends `POST /mcp` here; [`mcp_service`] reads the caller
//!   from the authorizer's claims, refuses a request without them (there is
//!   no default caller on Lambda), and hands the request to rmcp's
//!   streamable HTTP service in stateless mode (no session to keep between
//!   invocations, which may land on different instances).
//! - **The upkeep function** (handler `upkeep`): an EventBridge schedule
//!   (every minute, say) invokes [`Upkeep::handle`], which runs one
//!   maintenance round (sweep lapsed claims, reconcile, purge) and follow-ons
//!   rounds (deliver follow-ons). A Lambda process is frozen between
//!   invocations, so the tokio tasks `Maintenance::spawn` and
//!   `FollowOnDispatcher::spawn` start would never run: on Lambda the schedule runs
//!   them.
//!
//! Both are one binary (`src/main.rs`), deployed as two functions that
//! differ in their handler setting: `lambda_http::run` turns every event it
//! gets into an HTTP request, so a schedule's event goes to a function of
//! its own, with its own timeout and a reserved concurrency of 1, and
//! without API Gateway in front of it. docs/deploying.md has the rest (the
//! table, the IAM actions, the schedule).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::follow_ons::{
    DispatchReport, FollowOnConfig, FollowOnDispatcher, FollowOnHandlers,
};
use idem_runtime::maintenance::{Maintenance, MaintenanceConfig, RoundReport};
use idem_runtime::{
    current_reference, follow_on, idempotent, Caller, Executor, IdempotencyStore, IdempotentServer,
    ToolError,
};
use lambda_http::request::RequestContext;
use lambda_http::{Body, IntoResponse, Request, RequestExt, Response};
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::tool;
use rmcp::transport::streamable_http_server::{
    session::never::NeverSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// What `charge_card` takes.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChargeArgs {
    /// The card to charge (a token, never a card number).
    pub card: String,
    /// The amount, in cents.
    pub amount_cents: u64,
}

/// What `charge_card` answers.
#[derive(Clone, Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Receipt {
    /// The processor's charge.
    pub charge_id: String,
    /// The amount charged, in cents.
    pub amount_cents: u64,
}

/// A boxed future, as the processor answers.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Your card processor's client. `reference` is the operation's reference:
/// give it to the processor as its idempotency key. Return
/// `ToolError::unknown(..)` when the outcome is unknown (a timeout).
pub trait Processor: Send + Sync + 'static {
    /// Charges `args.card` once for `reference`.
    fn charge(&self, reference: String, args: ChargeArgs) -> BoxFuture<Result<Receipt, ToolError>>;
}

/// The MCP server: one tool, `charge_card`, and idem's status tool.
#[derive(Clone)]
pub struct Payments {
    executor: Executor,
    processor: Arc<dyn Processor>,
}

impl Payments {
    /// The server over `executor`'s store, charging through `processor`.
    pub fn new(executor: Executor, processor: Arc<dyn Processor>) -> Self {
        Payments {
            executor,
            processor,
        }
    }
}

impl Payments {
    /// Checks the served router's `idempotentHint`s
    /// ([`audit_hints`](idem_runtime::audit_hints)): call it before serving,
    /// and refuse to start on an error.
    pub fn audit() -> Result<(), String> {
        idem_runtime::audit_hints(&Self::tool_router()).map_err(|problems| format!("{problems:?}"))
    }
}

// No default_caller: every request brings its caller (`mcp_service`).
impl IdempotentServer for Payments {
    fn executor(&self) -> &Executor {
        &self.executor
    }
}

#[idem_runtime::tool_router(server_handler)]
impl Payments {
    #[idempotent(window = "15m")]
    #[tool(description = "Charge a card. Safe to repeat within 15 minutes.")]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Json<Receipt>, ToolError> {
        if args.amount_cents == 0 {
            return Err(ToolError::rejected("the amount must be positive"));
        }
        let reference = current_reference().expect("inside #[idempotent]");
        let receipt = self
            .processor
            .charge(reference.to_string(), args.clone())
            .await?;
        // The receipt is a follow-on, written with this call's record;
        // the upkeep function's follow-on round sends it.
        follow_on(
            "send_receipt",
            &json!({ "charge_id": receipt.charge_id, "card": args.card }),
        )
        .map_err(|e| ToolError::unknown(e.to_string()))?;
        Ok(Json(receipt))
    }
}

/// Which claims of the authorizer name the caller.
#[derive(Clone, Debug)]
pub struct CallerClaims {
    /// The claim that names the tenant (default `tenant`; Cognito's custom
    /// attributes are `custom:tenant`).
    pub tenant: String,
    /// The claim that names the subject (default `sub`).
    pub subject: String,
}

impl Default for CallerClaims {
    fn default() -> Self {
        CallerClaims {
            tenant: "tenant".to_owned(),
            subject: "sub".to_owned(),
        }
    }
}

/// The caller API Gateway's authorizer vouched for: from a JWT
/// authorizer's claims, or from a Lambda authorizer's context, under the
/// names `claims` gives. `Err` says what is missing; such a request is
/// refused, never served under a default caller.
pub fn caller_from(request: &Request, claims: &CallerClaims) -> Result<Caller, String> {
    let Some(RequestContext::ApiGatewayV2(context)) = request.request_context_ref() else {
        return Err("the request did not come through API Gateway's HTTP API".to_owned());
    };
    let Some(authorizer) = &context.authorizer else {
        return Err(
            "API Gateway passed no authorizer: attach a JWT or Lambda authorizer to the \
                    /mcp route"
                .to_owned(),
        );
    };
    let claim = |name: &str| -> Option<String> {
        let from_jwt = authorizer
            .jwt
            .as_ref()
            .and_then(|jwt| jwt.claims.get(name).cloned());
        let from_lambda = || match authorizer.fields.get(name) {
            Some(Value::String(s)) => Some(s.clone()),
            _ => None,
        };
        from_jwt.or_else(from_lambda).filter(|v| !v.is_empty())
    };
    match (claim(&claims.tenant), claim(&claims.subject)) {
        (Some(tenant), Some(subject)) => Ok(Caller::new(tenant, subject)),
        (tenant, _) => Err(format!(
            "the authorizer's claims have no {:?}",
            if tenant.is_none() {
                &claims.tenant
            } else {
                &claims.subject
            }
        )),
    }
}

/// The MCP function's service, for `lambda_http::run`: the caller from the
/// authorizer ([`caller_from`]; `401` and nothing runs without one), then
/// rmcp's streamable HTTP service in stateless mode, answering JSON.
///
/// `allowed_hosts`: the `Host` values rmcp accepts (your API's domain);
/// `None` accepts any, which is safe behind API Gateway (the check guards
/// a server on a developer's machine against DNS rebinding).
pub fn mcp_service(
    server: Payments,
    claims: CallerClaims,
    allowed_hosts: Option<Vec<String>>,
) -> impl lambda_http::Service<
    Request,
    Response = Response<Body>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Body>, Infallible>> + Send,
> + Clone {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true);
    let config = match allowed_hosts {
        Some(hosts) => config.with_allowed_hosts(hosts),
        None => config.disable_allowed_hosts(),
    };
    let mcp = Arc::new(StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    ));
    let claims = Arc::new(claims);
    lambda_http::service_fn(move |request: Request| {
        let (mcp, claims) = (mcp.clone(), claims.clone());
        async move {
            let caller = match caller_from(&request, &claims) {
                Ok(caller) => caller,
                Err(why) => {
                    let refusal = Response::builder()
                        .status(401)
                        .header("content-type", "text/plain; charset=utf-8")
                        .body(Body::from(format!("{why}; nothing was run\n")))
                        .expect("a valid response");
                    return Ok(refusal);
                }
            };
            let (mut parts, body) = request.into_parts();
            // Where #[idempotent] finds it (rmcp hands the request's parts
            // to the tool).
            parts.extensions.insert(caller);
            let response = mcp.handle(Request::from_parts(parts, body)).await;
            Ok(response.into_response().await)
        }
    })
}

/// The upkeep function: what an EventBridge schedule runs.
pub struct Upkeep {
    store: Arc<dyn IdempotencyStore>,
    maintenance: MaintenanceConfig,
    handlers: FollowOnHandlers,
    dispatcher: FollowOnConfig,
    /// The most follow-on rounds one invocation runs (each leases a batch).
    pub max_follow_on_rounds: usize,
}

/// What one scheduled invocation did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpkeepReport {
    /// The maintenance round's.
    pub maintenance: RoundReport,
    /// The follow-on rounds', added up.
    pub dispatcher: DispatchReport,
    /// How many follow-on rounds ran.
    pub follow_on_rounds: usize,
}

impl UpkeepReport {
    /// The report as the function's answer (CloudWatch shows it).
    pub fn to_json(&self) -> Value {
        let m = &self.maintenance;
        let o = &self.dispatcher;
        json!({
            "maintenance": {
                "swept": m.swept,
                "reconciled_completed": m.reconciled.completed,
                "reconciled_not_performed": m.reconciled.not_performed,
                "still_unknown": m.reconciled.still_unknown,
                "purged": m.purged,
                "errors": m.errors,
            },
            "outbox": {
                "rounds": self.follow_on_rounds,
                "leased": o.leased,
                "delivered": o.delivered,
                "retried": o.retried,
                "buried": o.buried,
            },
        })
    }
}

impl Upkeep {
    /// Upkeep of `store`: maintenance as `maintenance` says (give it your
    /// reconciler), and the follow-ons `handlers` run. Errors:
    /// `Unsupported` when the store keeps no follow-ons.
    pub fn new(
        store: Arc<dyn IdempotencyStore>,
        maintenance: MaintenanceConfig,
        handlers: FollowOnHandlers,
        dispatcher: FollowOnConfig,
    ) -> Result<Self, idem_runtime::store::StoreError> {
        if store.follow_ons().is_none() {
            return Err(idem_runtime::store::StoreError::Unsupported(
                "keep follow-ons (the upkeep function delivers them)",
            ));
        }
        Ok(Upkeep {
            store,
            maintenance,
            handlers,
            dispatcher,
            max_follow_on_rounds: 10,
        })
    }

    /// Answers one scheduled event: refuses any other event (so a
    /// misrouted HTTP request never runs maintenance), then runs one
    /// maintenance round and follow-on rounds until one leases less than a
    /// batch (at most [`max_follow_on_rounds`](Upkeep::max_follow_on_rounds)).
    pub async fn handle(&self, event: &Value) -> Result<UpkeepReport, String> {
        if !is_schedule(event) {
            return Err(format!(
                "the upkeep function answers EventBridge schedules (\"detail-type\": \
                 \"Scheduled Event\"); this event is not one: {}",
                shape(event)
            ));
        }
        let mut report = UpkeepReport {
            maintenance: Maintenance::round(&*self.store, &self.maintenance).await,
            ..UpkeepReport::default()
        };
        while report.follow_on_rounds < self.max_follow_on_rounds {
            let round = FollowOnDispatcher::round(&*self.store, &self.handlers, &self.dispatcher)
                .await
                .map_err(|e| format!("the follow-on round failed: {e}"))?;
            report.follow_on_rounds += 1;
            let o = &mut report.dispatcher;
            o.leased += round.leased;
            o.delivered += round.delivered;
            o.retried += round.retried;
            o.buried += round.buried;
            if round.leased < self.dispatcher.batch {
                break;
            }
        }
        Ok(report)
    }
}

/// Whether `event` is what an EventBridge schedule sends: a rule's
/// (`"source": "aws.events"`) or EventBridge Scheduler's
/// (`"source": "aws.scheduler"`) "Scheduled Event".
pub fn is_schedule(event: &Value) -> bool {
    event.get("detail-type").and_then(Value::as_str) == Some("Scheduled Event")
        && matches!(
            event.get("source").and_then(Value::as_str),
            Some("aws.events" | "aws.scheduler")
        )
}

/// The top-level keys of an event, to say what arrived without echoing it.
fn shape(event: &Value) -> String {
    match event.as_object() {
        Some(map) => format!(
            "it has the keys {:?}",
            map.keys().map(String::as_str).collect::<Vec<_>>()
        ),
        None => "it is not a JSON object".to_owned(),
    }
}

/// The follow-on dispatcher settings for a function: a run's timeout short enough that
/// a few rounds fit in a one-minute invocation.
pub fn follow_on_config() -> FollowOnConfig {
    FollowOnConfig::default().with_timeout(Duration::from_secs(10))
}
