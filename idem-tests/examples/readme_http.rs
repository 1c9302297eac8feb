use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use idem_runtime::follow_ons::{
    follow_on_fn, FollowOnConfig, FollowOnDispatcher, FollowOnHandlers,
};
use idem_runtime::maintenance::{Maintenance, MaintenanceConfig};
use idem_runtime::{
    audit_hints, follow_on, idempotent, Caller, Executor, IdempotentServer, SqliteStore, ToolError,
};
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::tool;
use rmcp::transport::streamable_http_server::{
    session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
    /// The card to charge (a token, never a card number).
    card: String,
    /// The amount, in cents.
    amount_cents: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Receipt {
    charge_id: String,
    amount_cents: u64,
}

#[derive(Clone)] // the HTTP service makes one server per session
struct Payments {
    executor: Executor,
}

// No default_caller: over HTTP every request brings its caller (`authenticate`).
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
        let reference = idem_runtime::current_reference().expect("inside #[idempotent]");
        // ... charge the card with `reference` as the processor's idempotency key;
        // the receipt is a follow-on, written with this call's record.
        follow_on("send_receipt", &args.card).map_err(|e| ToolError::unknown(e.to_string()))?;
        Ok(Json(Receipt {
            charge_id: format!("ch_{reference}"),
            amount_cents: args.amount_cents,
        }))
    }
}

/// Bearer tokens and the callers they stand for (from your identity provider).
type Tokens = Arc<HashMap<String, Caller>>;

/// Puts the token's `Caller` in the request, where `#[idempotent]` finds it;
/// a missing or unknown token gets 401 and nothing runs.
async fn authenticate(State(tokens): State<Tokens>, mut req: Request, next: Next) -> Response {
    let caller = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .and_then(|token| tokens.get(token))
        .cloned();
    match caller {
        Some(caller) => {
            req.extensions_mut().insert(caller);
            next.run(req).await
        }
        None => (
            StatusCode::UNAUTHORIZED,
            "send Authorization: Bearer <token>\n",
        )
            .into_response(),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Err(problems) = audit_hints(&Payments::tool_router()) {
        return Err(format!("refusing to start: {problems:?}").into());
    }
    // idem counts through the `metrics` facade; this recorder keeps the counts for /metrics.
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });

    let store = Arc::new(SqliteStore::open("idem.sqlite3").await?);
    // Beside the server, in every replica: purge and sweep (and reconcile, given
    // MaintenanceConfig::reconciler; without one it warns at start); run the follow-ons.
    let maintenance = Maintenance::spawn(store.clone(), MaintenanceConfig::default());
    let receipts = FollowOnHandlers::new().on(
        "send_receipt",
        follow_on_fn(|follow_on| async move {
            // Your mailer, given follow_on.downstream_key as its idempotency key.
            println!(
                "receipt for {} sent, key {}",
                follow_on.payload, follow_on.downstream_key
            );
            Ok(())
        }),
    );
    let dispatcher = FollowOnDispatcher::spawn(store.clone(), receipts, FollowOnConfig::default())?;

    let server = Payments {
        // Answers about an unknown outcome say who resolves it: here, an operator.
        executor: Executor::new(store).with_resolver(maintenance.resolver()),
    };
    let tokens: Tokens = Arc::new(HashMap::from([
        ("secret-a".to_owned(), Caller::new("acme", "alice")),
        ("secret-b".to_owned(), Caller::new("globex", "bob")),
    ]));
    let mcp = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let app = axum::Router::new()
        .nest_service("/mcp", mcp)
        .layer(middleware::from_fn_with_state(tokens, authenticate))
        // Added after the layer, so it needs no token: counts, never tenants or arguments.
        .route(
            "/metrics",
            axum::routing::get(move || async move { metrics.render() }),
        );

    let listen = std::env::args().nth(1).unwrap_or("127.0.0.1:8080".into());
    let listener = tokio::net::TcpListener::bind(listen).await?;
    eprintln!("serving MCP on http://{}/mcp", listener.local_addr()?);
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    maintenance.stop().await;
    dispatcher.stop().await;
    Ok(())
}
