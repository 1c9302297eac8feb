//! Tools that ask before their effect (multi-round-trip requests, protocol
//! 2026-07-28) and tools idempotent by construction, in process: a server
//! and rmcp's client over a duplex pipe, a processor stub that counts the
//! charges it receives, a store that counts the calls it gets.
//!
//! The promises: asking runs nothing and records nothing; the continuation
//! is the operation (run once, recorded); a repeat of it, or a re-issue of
//! the original call, gets the stored answer; while it runs a repeat is
//! told "in progress", and the continuation is never "in progress" against
//! itself; a decline runs nothing and the next call asks again; a tampered
//! `requestState` is refused; a client on an older protocol is refused.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use idem_runtime::store::conformance::{Call, Fault, FaultyStore};
use idem_runtime::{
    audit_hints, idempotent,
    mcp::{current_continuation, hint_report, HintBacking, TOOL_META_KEY},
    Ask, Caller, Executor, IdempotentServer, MemoryStore, ToolError,
};
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema, Implementation,
    InputRequest, InputRequiredResult, InputResponses, ProtocolVersion, RequestMetaObject,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RequestContext, RunningService};
use rmcp::{tool, tool_handler, ClientHandler, ErrorData, RoleClient, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
    card: String,
    amount_cents: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Receipt {
    charge_id: String,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct NicknameArgs {
    card: String,
    nickname: String,
}

/// The far side: every charge request it receives, and nicknames set.
#[derive(Default)]
struct Processor {
    charges: AtomicUsize,
    nicknames: Mutex<Vec<(String, String)>>,
}

#[derive(Clone)]
struct Shop {
    executor: Executor,
    processor: Arc<Processor>,
    delay: Duration,
    tool_router: rmcp::handler::server::router::tool::ToolRouter<Self>,
}

impl IdempotentServer for Shop {
    fn executor(&self) -> &Executor {
        &self.executor
    }
    fn default_caller(&self) -> Option<&Caller> {
        static LOCAL: OnceLock<Caller> = OnceLock::new();
        Some(LOCAL.get_or_init(|| Caller::new("acme", "alice")))
    }
}

fn confirm_schema() -> ElicitationSchema {
    ElicitationSchema::builder()
        .required_bool("confirm")
        .build()
        .unwrap()
}

#[idem_runtime::tool_router]
impl Shop {
    /// Asks from 1000 cents up; charges once confirmed.
    #[idempotent(window = "15m", client_key = "optional")]
    #[tool(description = "Charge a card; large amounts are confirmed first")]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Ask<Json<Receipt>>, ToolError> {
        if args.amount_cents >= 1000 {
            let answer = current_continuation().and_then(|c| c.elicitation("confirm"));
            match answer {
                None => {
                    return Ok(Ask::elicit(
                        "confirm",
                        format!("Charge {} cents?", args.amount_cents),
                        confirm_schema(),
                    ))
                }
                Some(answer)
                    if answer.action == ElicitationAction::Accept
                        && answer.content.as_ref().and_then(|c| c.get("confirm"))
                            == Some(&json!(true)) => {}
                Some(_) => return Err(ToolError::rejected("declined: nothing was charged")),
            }
        }
        self.processor.charges.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.delay).await;
        let n = self.processor.charges.load(Ordering::SeqCst);
        Ok(Ask::Done(Json(Receipt {
            charge_id: format!("ch_{n}"),
        })))
    }

    #[idempotent(
        by_construction = "sets the nickname to the given value; a repeat writes the same value"
    )]
    #[tool(description = "Set a card's nickname")]
    async fn set_nickname(&self, Parameters(args): Parameters<NicknameArgs>) -> String {
        let mut nicknames = self.processor.nicknames.lock().unwrap();
        nicknames.retain(|(card, _)| *card != args.card);
        nicknames.push((args.card.clone(), args.nickname.clone()));
        format!("{} is {}", args.card, args.nickname)
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Shop {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// Every store call, by kind.
type Calls = Arc<Mutex<Vec<Call>>>;

fn shop(delay: Duration) -> (Shop, Arc<Processor>, Calls) {
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let store = FaultyStore::new(MemoryStore::new(), move |call| {
        seen.lock().unwrap().push(call);
        Fault::None
    });
    let processor = Arc::new(Processor::default());
    let shop = Shop {
        executor: Executor::new(Arc::new(store)),
        processor: processor.clone(),
        delay,
        tool_router: Shop::tool_router(),
    };
    (shop, processor, calls)
}

async fn connect<C: rmcp::Service<RoleClient>>(
    shop: Shop,
    client: C,
    lifecycle: ClientLifecycleMode,
) -> RunningService<RoleClient, C> {
    let (server_side, client_side) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = shop.serve(server_side).await.expect("server starts");
        let _ = running.waiting().await;
    });
    client
        .serve_with_lifecycle(client_side, lifecycle)
        .await
        .expect("client connects")
}

fn modern() -> ClientLifecycleMode {
    ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    }
}

fn config() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("idem-ask-test", "0"),
    )
}

fn charge(amount: u64) -> CallToolRequestParams {
    let Value::Object(args) = json!({ "card": "4242", "amount_cents": amount }) else {
        unreachable!()
    };
    CallToolRequestParams::new("charge_card").with_arguments(args)
}

fn asked(response: CallToolResponse) -> InputRequiredResult {
    match response {
        CallToolResponse::InputRequired(input) => input,
        other => panic!("expected input_required, got {other:?}"),
    }
}

fn complete(response: CallToolResponse) -> CallToolResult {
    match response {
        CallToolResponse::Complete(result) => result,
        other => panic!("expected a result, got {other:?}"),
    }
}

fn operation(result: &CallToolResult) -> Value {
    result
        .meta
        .as_ref()
        .and_then(|meta| meta.get("idem/operation"))
        .cloned()
        .unwrap_or(Value::Null)
}

fn text(result: &CallToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

fn answer(confirm: Value) -> InputResponses {
    let mut responses = InputResponses::new();
    responses.insert(
        "confirm".to_owned(),
        json!({ "action": "accept", "content": { "confirm": confirm } }),
    );
    responses
}

fn declined() -> InputResponses {
    let mut responses = InputResponses::new();
    responses.insert("confirm".to_owned(), json!({ "action": "decline" }));
    responses
}

fn continuation(
    amount: u64,
    input: &InputRequiredResult,
    responses: InputResponses,
) -> CallToolRequestParams {
    charge(amount)
        .with_input_responses(responses)
        .with_request_state(input.request_state.clone().expect("a requestState"))
}

/// The elicitation asked under "confirm": a form whose schema has a
/// boolean `confirm`.
fn assert_asks_to_confirm(input: &InputRequiredResult) {
    let requests = input.input_requests.as_ref().expect("input requests");
    let Some(InputRequest::Elicitation(request)) = requests.get("confirm") else {
        panic!("an elicitation under \"confirm\": {requests:?}");
    };
    let ElicitRequestParams::FormElicitationParams {
        requested_schema, ..
    } = &request.params
    else {
        panic!("a form-mode elicitation: {request:?}");
    };
    let schema = serde_json::to_value(requested_schema).unwrap();
    assert_eq!(schema["properties"]["confirm"]["type"], json!("boolean"));
}

#[tokio::test]
async fn asking_runs_nothing_and_the_confirmed_continuation_charges_once() {
    let (shop, processor, _) = shop(Duration::ZERO);
    let client = connect(shop, config(), modern()).await;

    let input = asked(client.call_tool_once(charge(5000)).await.unwrap());
    assert_asks_to_confirm(&input);
    assert_eq!(
        processor.charges.load(Ordering::SeqCst),
        0,
        "asking ran nothing"
    );

    let first = complete(
        client
            .call_tool_once(continuation(5000, &input, answer(json!(true))))
            .await
            .unwrap(),
    );
    assert_ne!(first.is_error, Some(true), "{}", text(&first));
    assert_eq!(operation(&first)["state"], json!("executed"));
    assert_eq!(processor.charges.load(Ordering::SeqCst), 1);

    // A repeat of the continuation, and a re-issue of the original call:
    // the stored receipt, neither asking nor charging again.
    let repeat = complete(
        client
            .call_tool_once(continuation(5000, &input, answer(json!(true))))
            .await
            .unwrap(),
    );
    let reissue = complete(client.call_tool_once(charge(5000)).await.unwrap());
    for again in [&repeat, &reissue] {
        assert_eq!(operation(again)["replayed"], json!(true), "{again:?}");
        assert_eq!(
            operation(again)["reference"],
            operation(&first)["reference"]
        );
        assert_eq!(again.structured_content, first.structured_content);
    }
    assert_eq!(processor.charges.load(Ordering::SeqCst), 1);
}

/// `params` sent under the client key `key`.
fn keyed(mut params: CallToolRequestParams, key: &str) -> CallToolRequestParams {
    let mut meta = RequestMetaObject::new();
    meta.0.insert("idem/idempotency-key".to_owned(), json!(key));
    params.meta = Some(meta);
    params
}

/// A question asked under a client key stays answerable for the key's
/// retention, not only the tool's window: a host that answers after the
/// window, under the same key, continues the same operation and charges
/// once. Without a key the question lasts the window, and a late answer is
/// refused, charging nothing.
#[tokio::test]
async fn under_a_client_key_the_question_outlives_the_window() {
    let processor = Arc::new(Processor::default());
    let executor = Executor::new(Arc::new(MemoryStore::new()))
        .with_window("charge_card", Duration::from_secs(1))
        .expect("a valid window");
    let shop = Shop {
        executor,
        processor: processor.clone(),
        delay: Duration::ZERO,
        tool_router: Shop::tool_router(),
    };
    let client = connect(shop, config(), modern()).await;

    let key = "order-7/confirm";
    let input = asked(
        client
            .call_tool_once(keyed(charge(5000), key))
            .await
            .unwrap(),
    );
    let unkeyed = asked(client.call_tool_once(charge(6000)).await.unwrap());
    // The requestState's expiry is on the wall clock.
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let late = complete(
        client
            .call_tool_once(keyed(continuation(5000, &input, answer(json!(true))), key))
            .await
            .unwrap(),
    );
    assert_eq!(
        operation(&late)["state"],
        json!("executed"),
        "{}",
        text(&late)
    );
    assert_eq!(operation(&late)["keyedBy"], json!("clientKey"));
    assert_eq!(processor.charges.load(Ordering::SeqCst), 1);

    let expired = complete(
        client
            .call_tool_once(continuation(6000, &unkeyed, answer(json!(true))))
            .await
            .unwrap(),
    );
    assert_eq!(
        operation(&expired)["state"],
        json!("refused"),
        "{expired:?}"
    );
    assert!(text(&expired).contains("expired"), "{}", text(&expired));

    // The original call re-issued under the key: the stored receipt.
    let reissue = complete(
        client
            .call_tool_once(keyed(charge(5000), key))
            .await
            .unwrap(),
    );
    assert_eq!(operation(&reissue)["replayed"], json!(true), "{reissue:?}");
    assert_eq!(
        operation(&reissue)["reference"],
        operation(&late)["reference"]
    );
    assert_eq!(processor.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_decline_runs_nothing_and_the_next_call_asks_again() {
    let (shop, processor, _) = shop(Duration::ZERO);
    let client = connect(shop, config(), modern()).await;

    let input = asked(client.call_tool_once(charge(5000)).await.unwrap());
    let decline = complete(
        client
            .call_tool_once(continuation(5000, &input, declined()))
            .await
            .unwrap(),
    );
    assert_eq!(decline.is_error, Some(true));
    assert_eq!(operation(&decline)["state"], json!("rejected"));
    // An accept without `confirm: true` declines too.
    let input = asked(client.call_tool_once(charge(5000)).await.unwrap());
    let unconfirmed = complete(
        client
            .call_tool_once(continuation(5000, &input, answer(json!(false))))
            .await
            .unwrap(),
    );
    assert_eq!(operation(&unconfirmed)["state"], json!("rejected"));
    assert_eq!(processor.charges.load(Ordering::SeqCst), 0);

    // Nothing ran, so the next call asks again, and its confirmation charges.
    let input = asked(client.call_tool_once(charge(5000)).await.unwrap());
    let charged = complete(
        client
            .call_tool_once(continuation(5000, &input, answer(json!(true))))
            .await
            .unwrap(),
    );
    assert_eq!(operation(&charged)["state"], json!("executed"));
    assert_eq!(processor.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_tampered_or_borrowed_request_state_is_refused_and_nothing_runs() {
    let (shop, processor, _) = shop(Duration::ZERO);
    let client = connect(shop, config(), modern()).await;
    let input = asked(client.call_tool_once(charge(5000)).await.unwrap());
    let sealed = input.request_state.clone().unwrap();

    // One character changed.
    let mut tampered = sealed.clone().into_bytes();
    let last = tampered.len() - 1;
    tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    // The state of 5000 cents, sent with 9000 cents.
    let other_args = charge(9000)
        .with_input_responses(answer(json!(true)))
        .with_request_state(sealed.clone());
    let made_up = charge(5000)
        .with_input_responses(answer(json!(true)))
        .with_request_state("made-up");
    let no_state = charge(5000).with_input_responses(answer(json!(true)));
    let forged = charge(5000)
        .with_input_responses(answer(json!(true)))
        .with_request_state(tampered);
    for params in [forged, other_args, made_up, no_state] {
        let refused = complete(client.call_tool_once(params).await.unwrap());
        assert_eq!(refused.is_error, Some(true));
        assert_eq!(operation(&refused)["state"], json!("refused"));
        assert!(text(&refused).contains("nothing ran"), "{}", text(&refused));
        assert!(text(&refused).contains("charge_card"), "{}", text(&refused));
    }
    assert_eq!(processor.charges.load(Ordering::SeqCst), 0);

    // The genuine one still continues.
    let charged = complete(
        client
            .call_tool_once(continuation(5000, &input, answer(json!(true))))
            .await
            .unwrap(),
    );
    assert_eq!(operation(&charged)["state"], json!("executed"));
    assert_eq!(processor.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn while_the_continuation_runs_a_repeat_is_in_progress() {
    let (shop, processor, _) = shop(Duration::from_millis(400));
    let client = Arc::new(connect(shop, config(), modern()).await);
    let input = asked(client.call_tool_once(charge(5000)).await.unwrap());

    let running = {
        let client = client.clone();
        let params = continuation(5000, &input, answer(json!(true)));
        tokio::spawn(async move { client.call_tool_once(params).await })
    };
    // The continuation is in flight (the processor sleeps): a repeat of it
    // and a re-issue of the first call are told so.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let repeat = complete(
        client
            .call_tool_once(continuation(5000, &input, answer(json!(true))))
            .await
            .unwrap(),
    );
    let reissue = complete(client.call_tool_once(charge(5000)).await.unwrap());
    for again in [&repeat, &reissue] {
        assert_eq!(operation(again)["state"], json!("in_progress"), "{again:?}");
    }
    // The continuation itself was never "in progress" against itself.
    let first = complete(running.await.unwrap().unwrap());
    assert_eq!(operation(&first)["state"], json!("executed"));
    assert_eq!(
        operation(&repeat)["reference"],
        operation(&first)["reference"]
    );
    assert_eq!(processor.charges.load(Ordering::SeqCst), 1);
}

/// A client that answers every elicitation through its handler, as a
/// host does when the user clicks: rmcp's `call_tool` drives the rounds.
#[derive(Clone)]
struct Confirming {
    confirm: bool,
    asked: Arc<AtomicUsize>,
}

impl ClientHandler for Confirming {
    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        assert!(matches!(
            request,
            ElicitRequestParams::FormElicitationParams { .. }
        ));
        let mut result = ElicitResult::new(ElicitationAction::Accept);
        result.content = Some(json!({ "confirm": self.confirm }));
        Ok(result)
    }
}

#[tokio::test]
async fn rmcps_client_drives_the_rounds_through_its_handler() {
    let (shop, processor, _) = shop(Duration::ZERO);
    let asked = Arc::new(AtomicUsize::new(0));
    let handler = Confirming {
        confirm: true,
        asked: asked.clone(),
    };
    let client = connect(shop, handler, modern()).await;
    let result = client.call_tool(charge(5000)).await.unwrap();
    assert_eq!(operation(&result)["state"], json!("executed"));
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    // Again: the stored receipt, without asking.
    let again = client.call_tool(charge(5000)).await.unwrap();
    assert_eq!(operation(&again)["replayed"], json!(true));
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert_eq!(processor.charges.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_client_on_an_older_protocol_is_refused_when_the_tool_asks() {
    let (shop, processor, _) = shop(Duration::ZERO);
    // `initialize`: the protocol before multi-round-trip requests.
    let client = ().serve(connect_raw(shop).await).await.unwrap();
    let refused = client.call_tool(charge(5000)).await.unwrap();
    assert_eq!(refused.is_error, Some(true));
    assert_eq!(operation(&refused)["state"], json!("refused"));
    assert!(text(&refused).contains("2026-07-28"), "{}", text(&refused));
    assert!(text(&refused).contains("Nothing ran"), "{}", text(&refused));
    assert_eq!(processor.charges.load(Ordering::SeqCst), 0);
    // A small amount asks nothing and runs as always.
    let small = client.call_tool(charge(500)).await.unwrap();
    assert_eq!(operation(&small)["state"], json!("executed"));
    assert_eq!(processor.charges.load(Ordering::SeqCst), 1);
}

async fn connect_raw(shop: Shop) -> tokio::io::DuplexStream {
    let (server_side, client_side) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let running = shop.serve(server_side).await.expect("server starts");
        let _ = running.waiting().await;
    });
    client_side
}

#[tokio::test]
async fn a_tool_idempotent_by_construction_makes_no_store_call() {
    let (shop, processor, calls) = shop(Duration::ZERO);
    let router = Shop::tool_router();
    let client = connect(shop, config(), modern()).await;
    let tools = client.list_all_tools().await.unwrap();
    let tool = tools.iter().find(|t| t.name == "set_nickname").unwrap();
    assert_eq!(
        tool.annotations.as_ref().and_then(|a| a.idempotent_hint),
        Some(true)
    );
    assert_eq!(
        tool.meta.as_ref().and_then(|m| m.get(TOOL_META_KEY)),
        Some(&json!({
            "byConstruction": "sets the nickname to the given value; a repeat writes the same value"
        }))
    );

    let Value::Object(args) = json!({ "card": "4242", "nickname": "travel" }) else {
        unreachable!()
    };
    for _ in 0..3 {
        let result = client
            .call_tool(CallToolRequestParams::new("set_nickname").with_arguments(args.clone()))
            .await
            .unwrap();
        assert_eq!(text(&result), "4242 is travel");
    }
    assert_eq!(
        *processor.nicknames.lock().unwrap(),
        vec![("4242".to_owned(), "travel".to_owned())]
    );
    assert!(
        calls.lock().unwrap().is_empty(),
        "no store call: {:?}",
        calls.lock().unwrap()
    );

    // `audit_hints` passes the tool, and says in its log why it may.
    let log = Arc::new(Mutex::new(Vec::<u8>::new()));
    let writer = {
        let log = log.clone();
        move || LogWriter(log.clone())
    };
    let subscriber = tracing_subscriber::fmt()
        .with_writer(writer)
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        audit_hints(&router).expect("every hint is backed");
    });
    let log = String::from_utf8(log.lock().unwrap().clone()).unwrap();
    assert!(
        log.contains("set_nickname")
            && log.contains("sets the nickname to the given value; a repeat writes the same value"),
        "{log}"
    );
    let report = hint_report(&router);
    assert!(report.contains(&HintBacking::ByConstruction {
        tool: "set_nickname".to_owned(),
        reason: "sets the nickname to the given value; a repeat writes the same value".to_owned(),
    }));
    assert!(report.contains(&HintBacking::Wrapper {
        tool: "charge_card".to_owned()
    }));
}

/// A log written into a buffer the test reads.
struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
