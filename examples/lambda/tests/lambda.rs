//! The Lambda functions in process, on the DynamoDB emulator
//! (`IDEM_TEST_DYNAMODB_ENDPOINT`; skipped without it, failed without it
//! under `CI=true`): API Gateway HTTP API events as API Gateway sends them,
//! through `lambda_http`'s own conversion, to the MCP service; and
//! EventBridge's scheduled event to the upkeep handler. Every assertion on
//! an effect counts at the far side: the processor stub's charges, the
//! mailer stub's deliveries, the record in the table.
//!
//! One test function: it sets the process's AWS credentials for the
//! emulator, which no other test may read at the same time.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_lambda_example::{
    follow_on_config, mcp_service, BoxFuture, CallerClaims, ChargeArgs, Payments, Processor,
    Receipt, Upkeep,
};
use idem_runtime::follow_ons::{follow_on_fn, FollowOnHandlers};
use idem_runtime::maintenance::MaintenanceConfig;
use idem_runtime::store::{Attempt, Claim, ClaimRequest, RecordStateKind};
use idem_runtime::{
    key::IdempotencyKey, open_store, DynamoDbStore, Executor, Reference, ToolError,
};
use lambda_http::{Body, Request, Response, Service};
use serde_json::{json, Value};

/// The emulator's endpoint; `None` (said on stderr) when the test is
/// skipped. Under `CI=true` a missing emulator fails.
fn endpoint() -> Option<String> {
    match std::env::var("IDEM_TEST_DYNAMODB_ENDPOINT") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var("CI").as_deref() == Ok("true") => panic!(
            "IDEM_TEST_DYNAMODB_ENDPOINT is not set, and CI=true: the Lambda example's test \
             needs the DynamoDB emulator (scripts/dynamodb-emulator start)"
        ),
        _ => {
            eprintln!(
                "SKIPPED: the Lambda example's test did not run: IDEM_TEST_DYNAMODB_ENDPOINT is \
                 not set (scripts/dynamodb-emulator start, then \
                 IDEM_TEST_DYNAMODB_ENDPOINT=$(scripts/dynamodb-emulator url))"
            );
            None
        }
    }
}

/// A processor that counts the charges that reach it.
#[derive(Clone, Default)]
struct CountingProcessor {
    charges: Arc<AtomicUsize>,
}

impl Processor for CountingProcessor {
    fn charge(&self, reference: String, args: ChargeArgs) -> BoxFuture<Result<Receipt, ToolError>> {
        let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
        Box::pin(async move {
            Ok(Receipt {
                charge_id: format!("ch_{n}_{reference}"),
                amount_cents: args.amount_cents,
            })
        })
    }
}

/// An API Gateway HTTP API (payload 2.0) event for `POST /mcp` carrying
/// `body`, with a JWT authorizer's claims when `claims` is given: what API
/// Gateway sends a function.
fn api_event(body: &Value, claims: Option<(&str, &str)>) -> Request {
    let mut context = json!({
        "accountId": "123456789012",
        "apiId": "a1b2c3d4e5",
        "domainName": "a1b2c3d4e5.execute-api.us-east-1.amazonaws.com",
        "domainPrefix": "a1b2c3d4e5",
        "http": {
            "method": "POST",
            "path": "/mcp",
            "protocol": "HTTP/1.1",
            "sourceIp": "203.0.113.7",
            "userAgent": "mcp-client/1.0"
        },
        "requestId": "JKJaXmPLvHcESHA=",
        "routeKey": "POST /mcp",
        "stage": "$default",
        "time": "10/Mar/2026:12:00:00 +0000",
        "timeEpoch": 1773144000000_i64
    });
    if let Some((tenant, sub)) = claims {
        context["authorizer"] = json!({
            "jwt": {
                "claims": {
                    "iss": "https://cognito-idp.us-east-1.amazonaws.com/us-east-1_example",
                    "sub": sub,
                    "tenant": tenant,
                    "exp": "1773147600"
                },
                "scopes": null
            }
        });
    }
    let event = json!({
        "version": "2.0",
        "routeKey": "POST /mcp",
        "rawPath": "/mcp",
        "rawQueryString": "",
        "headers": {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "host": "a1b2c3d4e5.execute-api.us-east-1.amazonaws.com",
            "mcp-protocol-version": "2025-06-18",
            "x-forwarded-proto": "https"
        },
        "requestContext": context,
        "body": body.to_string(),
        "isBase64Encoded": false
    });
    lambda_http::request::from_str(&event.to_string()).expect("an API Gateway v2 event")
}

/// What EventBridge sends for a schedule rule.
fn scheduled_event() -> Value {
    json!({
        "version": "0",
        "id": "53dc4d37-cffa-4f76-80c9-8b7d4a4d2eaa",
        "detail-type": "Scheduled Event",
        "source": "aws.events",
        "account": "123456789012",
        "time": "2026-03-10T12:00:00Z",
        "region": "us-east-1",
        "resources": ["arn:aws:events:us-east-1:123456789012:rule/idem-upkeep"],
        "detail": {}
    })
}

fn body_text(response: &Response<Body>) -> String {
    match response.body() {
        Body::Text(text) => text.clone(),
        Body::Binary(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        _ => String::new(),
    }
}

/// The JSON-RPC message in a response (JSON, or one SSE `data:` line).
fn message(response: &Response<Body>) -> Value {
    let text = body_text(response);
    let json = text
        .lines()
        .find_map(|line| line.strip_prefix("data:"))
        .unwrap_or(&text)
        .trim();
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {text}"))
}

fn charge(id: u64) -> Value {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "method": "tools/call",
        "params": {
            "name": "charge_card",
            "arguments": { "card": "tok_visa", "amount_cents": 1999 }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_functions_charge_once_replay_and_keep_up_on_dynamodb() {
    let Some(endpoint) = endpoint() else { return };
    // The emulator takes any credentials; a function gets its role's from
    // Lambda in the same variables.
    for (name, value) in [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
    ] {
        std::env::set_var(name, value);
    }
    let table = format!("idem-lambda-{:016x}", Attempt::random().get());
    let url = format!("dynamodb://{table}?region=us-east-1&endpoint={endpoint}");
    let store = open_store(&format!("{url}&create=true"))
        .await
        .expect("the table is created from the URL");

    let processor = CountingProcessor::default();
    let server = Payments::new(
        Executor::new(store.clone()).with_background_completions(false),
        Arc::new(processor.clone()),
    );
    let mut mcp = mcp_service(server, CallerClaims::default(), None);

    // initialize: stateless, no session to keep.
    let init = json!({
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": { "name": "lambda-test", "version": "1.0" }
        }
    });
    let response = mcp
        .call(api_event(&init, Some(("acme", "alice"))))
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{}", body_text(&response));
    assert!(
        response.headers().get("mcp-session-id").is_none(),
        "stateless: no session"
    );
    let initialized = message(&response);
    assert!(
        initialized["result"]["capabilities"]["tools"].is_object(),
        "{initialized}"
    );

    // The charge runs once.
    let response = mcp
        .call(api_event(&charge(2), Some(("acme", "alice"))))
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{}", body_text(&response));
    let first = message(&response)["result"].clone();
    assert_eq!(first["isError"], json!(false), "{first}");
    let meta = &first["_meta"]["idem/operation"];
    assert_eq!(meta["state"], "executed", "{first}");
    assert_eq!(meta["recorded"], json!(true), "{first}");
    let reference = meta["reference"].as_str().unwrap().to_owned();
    assert_eq!(processor.charges.load(Ordering::SeqCst), 1);

    // The same call again, in another invocation: replayed from DynamoDB.
    let response = mcp
        .call(api_event(&charge(3), Some(("acme", "alice"))))
        .await
        .unwrap();
    let again = message(&response)["result"].clone();
    let meta = &again["_meta"]["idem/operation"];
    assert_eq!(meta["state"], "replayed", "{again}");
    assert_eq!(meta["reference"], reference.as_str());
    assert_eq!(
        again["structuredContent"], first["structuredContent"],
        "the stored response"
    );
    assert_eq!(processor.charges.load(Ordering::SeqCst), 1, "charged once");

    // Without an authorizer's caller: refused, nothing runs.
    let refused = mcp.call(api_event(&charge(4), None)).await.unwrap();
    assert_eq!(refused.status(), 401);
    assert!(body_text(&refused).contains("authorizer"));
    let no_tenant = mcp
        .call(api_event(&charge(5), Some(("", "alice"))))
        .await
        .unwrap();
    assert_eq!(no_tenant.status(), 401, "{}", body_text(&no_tenant));
    assert_eq!(processor.charges.load(Ordering::SeqCst), 1);

    // A call whose instance died mid-call: its claim's lease runs out.
    let key = IdempotencyKey::from_parts([7; 32], [7; 32]);
    let lapsed = ClaimRequest {
        key,
        reference: Reference::new_operation(&key),
        tenant: "acme".to_owned(),
        tool: "charge_card".to_owned(),
        attempt: Attempt::random(),
        lease: Duration::from_millis(1),
        window: Duration::from_secs(900),
        retention: Duration::from_secs(3600),
    };
    assert!(matches!(
        store.claim(&lapsed).await.unwrap(),
        Claim::Claimed { .. }
    ));
    tokio::time::sleep(Duration::from_millis(50)).await;

    // The schedule: a maintenance round sweeps it, an follow-on round sends
    // the receipt the charge declared.
    let mailed = Arc::new(Mutex::new(Vec::<String>::new()));
    let mailer = {
        let mailed = mailed.clone();
        FollowOnHandlers::new().on(
            "send_receipt",
            follow_on_fn(move |job| {
                let mailed = mailed.clone();
                async move {
                    mailed.lock().unwrap().push(job.downstream_key.clone());
                    Ok(())
                }
            }),
        )
    };
    let upkeep = Upkeep::new(
        store.clone(),
        MaintenanceConfig::default(),
        mailer,
        follow_on_config(),
    )
    .unwrap();
    let report = upkeep.handle(&scheduled_event()).await.unwrap();
    assert_eq!(report.maintenance.swept, 1, "{report:?}");
    assert_eq!(report.maintenance.errors, 0, "{report:?}");
    assert_eq!(report.dispatcher.delivered, 1, "{report:?}");
    let record = store
        .lookup("acme", &lapsed.reference)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state.kind(), RecordStateKind::Unknown);
    assert_eq!(
        *mailed.lock().unwrap(),
        vec![format!("{reference}:send_receipt")],
        "the receipt of the one charge, once"
    );

    // The next schedule finds nothing more to do.
    let report = upkeep.handle(&scheduled_event()).await.unwrap();
    assert_eq!(
        (report.maintenance.swept, report.dispatcher.delivered),
        (0, 0)
    );
    assert_eq!(mailed.lock().unwrap().len(), 1);

    // Any other event is refused by the upkeep function.
    let init_event = json!({ "version": "2.0", "routeKey": "POST /mcp" });
    let refused = upkeep.handle(&init_event).await.unwrap_err();
    assert!(refused.contains("Scheduled Event"), "{refused}");

    let _ = DynamoDbStore::from_url(&url)
        .unwrap()
        .build()
        .unwrap()
        .delete_table()
        .await;
}
