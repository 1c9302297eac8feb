//! One binary, two Lambda functions: the function's handler setting (which
//! Lambda passes as `_HANDLER`) picks what it answers.
//!
//! - `mcp`: API Gateway HTTP API events for `/mcp` ([`mcp_service`]).
//! - `upkeep`: EventBridge schedules ([`Upkeep::handle`]): maintenance and
//!   follow-on rounds.
//!
//! Settings (environment): `IDEM_TABLE`, the DynamoDB table (create it with
//! `idem --store 'dynamodb://TABLE?region=REGION' create-table` or from
//! `DYNAMODB_TABLE_DEFINITION`); `IDEM_TENANT_CLAIM` and
//! `IDEM_SUBJECT_CLAIM`, the authorizer's claims that name the caller
//! (`tenant`, `sub`); `IDEM_ALLOWED_HOSTS`, the API's domains, comma
//! separated (any when unset). The region and the function role's
//! credentials are the ones Lambda sets (`AWS_REGION`,
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`).

use std::sync::Arc;

use idem_lambda_example::{
    follow_on_config, mcp_service, BoxFuture, CallerClaims, ChargeArgs, Payments, Processor,
    Receipt, Upkeep,
};
use idem_runtime::follow_ons::{follow_on_fn, FollowOnHandlers};
use idem_runtime::maintenance::MaintenanceConfig;
use idem_runtime::{open_store, Executor, ToolError};
use lambda_http::lambda_runtime::{self, LambdaEvent};
use lambda_http::{service_fn, Error};
use serde_json::Value;

/// Stands for your processor's client: replace it.
struct StubProcessor;

impl Processor for StubProcessor {
    fn charge(&self, reference: String, args: ChargeArgs) -> BoxFuture<Result<Receipt, ToolError>> {
        Box::pin(async move {
            Ok(Receipt {
                charge_id: format!("ch_{reference}"),
                amount_cents: args.amount_cents,
            })
        })
    }
}

fn setting(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    lambda_http::tracing::init_default_subscriber();
    let table = setting("IDEM_TABLE").ok_or("set IDEM_TABLE to the DynamoDB table's name")?;
    // Checks that the table exists; the first invocation pays for it, once
    // per instance.
    let store = open_store(&format!("dynamodb://{table}")).await?;

    match setting("_HANDLER").as_deref() {
        Some("mcp") => {
            Payments::audit().map_err(|problems| format!("refusing to start: {problems}"))?;
            let claims = CallerClaims {
                tenant: setting("IDEM_TENANT_CLAIM").unwrap_or_else(|| "tenant".into()),
                subject: setting("IDEM_SUBJECT_CLAIM").unwrap_or_else(|| "sub".into()),
            };
            let hosts = setting("IDEM_ALLOWED_HOSTS")
                .map(|hosts| hosts.split(',').map(|h| h.trim().to_owned()).collect());
            // Completions are written before the answer: Lambda freezes the
            // process after it (background completions are refused there).
            let server = Payments::new(Executor::new(store), Arc::new(StubProcessor));
            lambda_http::run(mcp_service(server, claims, hosts)).await
        }
        Some("upkeep") => {
            let mailer = FollowOnHandlers::new().on(
                "send_receipt",
                follow_on_fn(|follow_on| async move {
                    // Your mailer, given follow_on.downstream_key as its idempotency key.
                    tracing_line(&follow_on.payload, &follow_on.downstream_key);
                    Ok(())
                }),
            );
            let upkeep = Upkeep::new(
                store,
                MaintenanceConfig::default(),
                mailer,
                follow_on_config(),
            )?;
            let upkeep = &upkeep;
            lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
                let report = upkeep.handle(&event.payload).await?;
                Ok::<Value, Error>(report.to_json())
            }))
            .await
        }
        other => Err(format!(
            "the function's handler is {other:?}: set it to `mcp` (API Gateway, /mcp) or \
             `upkeep` (the EventBridge schedule)"
        )
        .into()),
    }
}

fn tracing_line(payload: &str, key: &str) {
    lambda_http::tracing::info!(%payload, %key, "receipt sent");
}
