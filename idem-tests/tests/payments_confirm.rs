//! The payments example's confirmation before a large charge (a
//! multi-round-trip request, protocol 2026-07-28) and its tool idempotent
//! by construction, over stdio and streamable HTTP, driven by rmcp's
//! client. The stub processor's ledger counts every charge request the
//! moment it arrives, so a second execution would show.
//!
//! `charge_card` asks from `amount_cents >= 100000`: a form-mode
//! elicitation whose schema has a boolean `confirm`. An accept with
//! `confirm: true` charges; anything else declines and charges nothing.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    ElicitRequestParams, ElicitResult, ElicitationAction, Implementation, InputRequest,
    InputRequiredResult, InputResponses, ProtocolVersion, TaskPayload,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RequestContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ErrorData, RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const LARGE: u64 = 150_000;

fn payments_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    let bin = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join("payments"))
        .expect("a target directory");
    assert!(
        bin.exists(),
        "{} is missing: run the tests with `cargo test` (which builds the examples) \
         or build it first with `cargo build --example payments`",
        bin.display()
    );
    bin
}

/// How the client reaches the example.
#[derive(Clone, Copy, Debug)]
enum Transport {
    Stdio,
    Http,
}

const TRANSPORTS: [Transport; 2] = [Transport::Stdio, Transport::Http];

/// The example over HTTP; killed when dropped.
struct Server {
    _child: Option<Child>,
    url: String,
}

async fn serve_http() -> Server {
    let mut command = Command::new(payments_binary());
    command
        .args(["--transport", "http", "--listen", "127.0.0.1:0"])
        .args(["--store", "memory", "--processor-delay-ms", "300"])
        .args(["--token", "tok-acme=acme/alice"])
        .args(["--token", "tok-globex=globex/bob"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("the example starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let mut lines = BufReader::new(stderr).lines();
    let url = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.expect("stderr reads") {
            if let Some(url) = line.strip_prefix("payments: serving MCP on ") {
                return url.trim().to_owned();
            }
            eprintln!("{line}");
        }
        panic!("the example exited before serving");
    })
    .await
    .expect("the example serves within 30 s");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Server {
        _child: Some(child),
        url,
    }
}

fn modern() -> ClientLifecycleMode {
    ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
    }
}

fn plain() -> ClientConfig {
    ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("idem-confirm-test", "0"),
    )
}

/// A client of `handler` on the modern protocol; the server (over HTTP)
/// lives as long as the returned guard.
async fn connect<C: rmcp::Service<RoleClient>>(
    transport: Transport,
    handler: C,
    lifecycle: ClientLifecycleMode,
) -> (RunningService<RoleClient, C>, Server) {
    match transport {
        Transport::Stdio => {
            let mut command = tokio::process::Command::new(payments_binary());
            command.args(["--transport", "stdio", "--store", "memory"]);
            command.args(["--processor-delay-ms", "300"]);
            let child = TokioChildProcess::new(command).expect("the example starts");
            let client = handler
                .serve_with_lifecycle(child, lifecycle)
                .await
                .expect("the client connects");
            (
                client,
                Server {
                    _child: None,
                    url: String::new(),
                },
            )
        }
        Transport::Http => {
            let server = serve_http().await;
            let http = StreamableHttpClientTransport::from_config(
                StreamableHttpClientTransportConfig::with_uri(server.url.clone())
                    .auth_header("tok-acme"),
            );
            let client = handler
                .serve_with_lifecycle(http, lifecycle)
                .await
                .expect("the client connects");
            (client, server)
        }
    }
}

fn params(tool: &'static str, args: Value) -> CallToolRequestParams {
    let Value::Object(args) = args else {
        panic!("arguments are an object")
    };
    CallToolRequestParams::new(tool).with_arguments(args)
}

fn charge(amount: u64) -> CallToolRequestParams {
    params(
        "charge_card",
        json!({ "card": "4242", "amount_cents": amount }),
    )
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
        .and_then(|meta| meta.get(idem_runtime::mcp::RESULT_META_KEY))
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

async fn ledger<S: rmcp::Service<RoleClient>>(client: &RunningService<RoleClient, S>) -> Value {
    let result = client
        .call_tool(CallToolRequestParams::new("processor_ledger"))
        .await
        .expect("the ledger answers");
    result.structured_content.expect("the ledger is JSON")
}

async fn charges<S: rmcp::Service<RoleClient>>(client: &RunningService<RoleClient, S>) -> Value {
    ledger(client).await["processor_requests"].clone()
}

fn responses(answer: Value) -> InputResponses {
    let mut responses = InputResponses::new();
    responses.insert("confirm".to_owned(), answer);
    responses
}

fn accept(confirm: bool) -> InputResponses {
    responses(json!({ "action": "accept", "content": { "confirm": confirm } }))
}

fn continuation(
    amount: u64,
    input: &InputRequiredResult,
    answers: InputResponses,
) -> CallToolRequestParams {
    charge(amount)
        .with_input_responses(answers)
        .with_request_state(input.request_state.clone().expect("a requestState"))
}

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
    assert_eq!(schema["required"], json!(["confirm"]));
}

#[tokio::test]
async fn a_confirmed_charge_is_charged_once_repeated_and_reissued() {
    for transport in TRANSPORTS {
        let (client, _server) = connect(transport, plain(), modern()).await;
        let input = asked(client.call_tool_once(charge(LARGE)).await.unwrap());
        assert_asks_to_confirm(&input);
        assert_eq!(
            charges(&client).await,
            json!(0),
            "{transport:?}: asking charged"
        );

        let first = complete(
            client
                .call_tool_once(continuation(LARGE, &input, accept(true)))
                .await
                .unwrap(),
        );
        assert_ne!(
            first.is_error,
            Some(true),
            "{transport:?}: {}",
            text(&first)
        );
        assert_eq!(operation(&first)["state"], json!("executed"));
        let receipt = first.structured_content.clone().unwrap();
        assert_eq!(receipt["amount_cents"], json!(LARGE));

        // The continuation again (a retry after a lost answer), and the
        // original call re-issued: the stored receipt, no new question.
        let repeat = complete(
            client
                .call_tool_once(continuation(LARGE, &input, accept(true)))
                .await
                .unwrap(),
        );
        let reissue = complete(client.call_tool_once(charge(LARGE)).await.unwrap());
        for again in [&repeat, &reissue] {
            assert_eq!(operation(again)["replayed"], json!(true), "{transport:?}");
            assert_eq!(again.structured_content.as_ref(), Some(&receipt));
        }
        let ledger = ledger(&client).await;
        assert_eq!(
            ledger["processor_requests"],
            json!(1),
            "{transport:?}: {ledger}"
        );
        assert_eq!(
            ledger["processor_charges"],
            json!(1),
            "{transport:?}: {ledger}"
        );
        client.cancel().await.ok();
    }
}

#[tokio::test]
async fn a_decline_charges_nothing_and_the_next_call_asks_again() {
    for transport in TRANSPORTS {
        let (client, _server) = connect(transport, plain(), modern()).await;
        for answer in [
            responses(json!({ "action": "decline" })),
            responses(json!({ "action": "cancel" })),
            accept(false),
        ] {
            let input = asked(client.call_tool_once(charge(LARGE)).await.unwrap());
            let declined = complete(
                client
                    .call_tool_once(continuation(LARGE, &input, answer))
                    .await
                    .unwrap(),
            );
            assert_eq!(declined.is_error, Some(true), "{transport:?}");
            assert_eq!(operation(&declined)["state"], json!("rejected"));
            assert!(
                text(&declined).contains("nothing was charged"),
                "{}",
                text(&declined)
            );
        }
        assert_eq!(charges(&client).await, json!(0), "{transport:?}");
        // Still asks, and a confirmation then charges.
        let input = asked(client.call_tool_once(charge(LARGE)).await.unwrap());
        let charged = complete(
            client
                .call_tool_once(continuation(LARGE, &input, accept(true)))
                .await
                .unwrap(),
        );
        assert_eq!(operation(&charged)["state"], json!("executed"));
        assert_eq!(charges(&client).await, json!(1), "{transport:?}");
        client.cancel().await.ok();
    }
}

#[tokio::test]
async fn a_tampered_request_state_is_refused_and_charges_nothing() {
    for transport in TRANSPORTS {
        let (client, _server) = connect(transport, plain(), modern()).await;
        let input = asked(client.call_tool_once(charge(LARGE)).await.unwrap());
        let sealed = input.request_state.clone().unwrap();
        let mut bytes = sealed.clone().into_bytes();
        bytes[sealed.len() / 2] = if bytes[sealed.len() / 2] == b'x' {
            b'y'
        } else {
            b'x'
        };
        let tampered = charge(LARGE)
            .with_input_responses(accept(true))
            .with_request_state(String::from_utf8(bytes).unwrap());
        // A state asked for one amount, sent with another.
        let moved = charge(LARGE + 1)
            .with_input_responses(accept(true))
            .with_request_state(sealed);
        for params in [tampered, moved] {
            let refused = complete(client.call_tool_once(params).await.unwrap());
            assert_eq!(refused.is_error, Some(true), "{transport:?}");
            assert_eq!(operation(&refused)["state"], json!("refused"));
            assert!(text(&refused).contains("nothing ran"), "{}", text(&refused));
        }
        assert_eq!(charges(&client).await, json!(0), "{transport:?}");
        client.cancel().await.ok();
    }
}

/// A host whose user answers every confirmation: rmcp's `call_tool`
/// fulfils the elicitation through it and sends the continuation.
#[derive(Clone)]
struct User {
    confirm: bool,
    asked: Arc<AtomicUsize>,
}

impl ClientHandler for User {
    async fn create_elicitation(
        &self,
        _: ElicitRequestParams,
        _: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let mut result = ElicitResult::new(ElicitationAction::Accept);
        result.content = Some(json!({ "confirm": self.confirm }));
        Ok(result)
    }
}

#[tokio::test]
async fn rmcps_client_asks_its_user_and_continues() {
    for transport in TRANSPORTS {
        for confirm in [false, true] {
            let asked = Arc::new(AtomicUsize::new(0));
            let user = User {
                confirm,
                asked: asked.clone(),
            };
            let (client, _server) = connect(transport, user, modern()).await;
            let result = client.call_tool(charge(LARGE)).await.unwrap();
            assert_eq!(asked.load(Ordering::SeqCst), 1, "{transport:?}");
            let expected = if confirm { 1 } else { 0 };
            assert_eq!(charges(&client).await, json!(expected), "{transport:?}");
            if confirm {
                assert_eq!(operation(&result)["state"], json!("executed"));
                // Called again: the stored receipt, the user not asked again.
                let again = client.call_tool(charge(LARGE)).await.unwrap();
                assert_eq!(operation(&again)["replayed"], json!(true));
                assert_eq!(asked.load(Ordering::SeqCst), 1);
                assert_eq!(charges(&client).await, json!(1));
            } else {
                assert_eq!(operation(&result)["state"], json!("rejected"));
            }
            client.cancel().await.ok();
        }
    }
}

#[tokio::test]
async fn small_charges_ask_nothing_and_older_protocols_are_refused_large_ones() {
    // `initialize`: a protocol before multi-round-trip requests.
    let mut command = tokio::process::Command::new(payments_binary());
    command.args(["--transport", "stdio", "--store", "memory"]);
    let client = ().serve(TokioChildProcess::new(command).unwrap()).await.unwrap();
    let small = client.call_tool(charge(1999)).await.unwrap();
    assert_eq!(operation(&small)["state"], json!("executed"));
    let refused = client.call_tool(charge(LARGE)).await.unwrap();
    assert_eq!(refused.is_error, Some(true));
    assert_eq!(operation(&refused)["state"], json!("refused"));
    assert!(text(&refused).contains("2026-07-28"), "{}", text(&refused));
    let ledger = ledger(&client).await;
    assert_eq!(ledger["processor_requests"], json!(1), "{ledger}");
    client.cancel().await.ok();
}

#[tokio::test]
async fn a_large_charge_asked_for_as_a_task_fails_and_charges_nothing() {
    let with_tasks = ClientConfig::new(
        ClientCapabilities::builder().enable_tasks().build(),
        Implementation::new("idem-confirm-test", "0"),
    );
    let (client, _server) = connect(Transport::Stdio, with_tasks, modern()).await;
    let CallToolResponse::Task(created) = client.call_tool_once(charge(LARGE)).await.unwrap()
    else {
        panic!("a request that declares the tasks extension gets a task");
    };
    let task_id = created.task.task_id;
    let done = loop {
        let got = client
            .get_task(rmcp::model::GetTaskParams::new(task_id.clone()))
            .await
            .unwrap();
        if got.task.status().is_terminal() {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let TaskPayload::Failed { error } = &done.task.payload else {
        panic!("a failed task: {done:?}");
    };
    let message = error.get("message").and_then(Value::as_str).unwrap_or("");
    assert!(message.contains("without the tasks extension"), "{error:?}");
    assert_eq!(charges(&client).await, json!(0));
    client.cancel().await.ok();
}

#[tokio::test]
async fn the_nickname_tool_is_hinted_by_construction() {
    for transport in TRANSPORTS {
        let (client, _server) = connect(transport, plain(), modern()).await;
        let tools = client.list_all_tools().await.unwrap();
        let tool = tools
            .iter()
            .find(|t| t.name == "set_card_nickname")
            .unwrap();
        assert_eq!(
            tool.annotations.as_ref().and_then(|a| a.idempotent_hint),
            Some(true)
        );
        let marker = &tool.meta.as_ref().unwrap()[idem_runtime::mcp::TOOL_META_KEY];
        assert_eq!(
            marker,
            &json!({ "byConstruction": "sets the card's nickname to the given value; a repeat writes the same value" })
        );
        for _ in 0..2 {
            let result = client
                .call_tool(params(
                    "set_card_nickname",
                    json!({ "card": "4242", "nickname": "travel" }),
                ))
                .await
                .unwrap();
            assert_ne!(result.is_error, Some(true));
            assert_eq!(text(&result), "Card 4242 is now called \"travel\".");
            // Nothing recorded: no operation in the answer.
            assert_eq!(operation(&result), Value::Null);
        }
        client.cancel().await.ok();
    }
}

/// rmcp's HTTP client as the caller behind `token`, on a running server.
async fn connect_as(server: &Server, token: &str) -> RunningService<RoleClient, ClientConfig> {
    let http = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(server.url.clone()).auth_header(token),
    );
    plain()
        .serve_with_lifecycle(http, modern())
        .await
        .expect("the client connects")
}

#[tokio::test]
async fn another_callers_request_state_is_refused() {
    let server = serve_http().await;
    let alice = connect_as(&server, "tok-acme").await;
    let bob = connect_as(&server, "tok-globex").await;
    let input = asked(alice.call_tool_once(charge(LARGE)).await.unwrap());
    // Bob sends Alice's question back as his own continuation.
    let borrowed = complete(
        bob.call_tool_once(continuation(LARGE, &input, accept(true)))
            .await
            .unwrap(),
    );
    assert_eq!(borrowed.is_error, Some(true));
    assert_eq!(operation(&borrowed)["state"], json!("refused"));
    assert_eq!(charges(&alice).await, json!(0));
    // Alice's own continuation charges, once.
    let charged = complete(
        alice
            .call_tool_once(continuation(LARGE, &input, accept(true)))
            .await
            .unwrap(),
    );
    assert_eq!(operation(&charged)["state"], json!("executed"));
    assert_eq!(charges(&alice).await, json!(1));
    alice.cancel().await.ok();
    bob.cancel().await.ok();
}
