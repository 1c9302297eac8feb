//! Callers whose calls ask first and continue (multi-round-trip requests,
//! protocol 2026-07-28), through the MCP layer itself: replicas of an rmcp
//! server whose `charge_card` asks the user to confirm large amounts, all on
//! one store and sharing the `requestState` key, and users who answer
//! through rmcp's client, on a paused clock, every decision drawn from the
//! seed. Each user sends the first call, thinks, and sends the continuation
//! to any replica: accepting, declining (then perhaps asking again and
//! accepting), tampering with the `requestState` first, sending the
//! continuation twice at once, or re-issuing the original call beside it.
//! The processor sleeps, so calls overlap.
//!
//! The oracles are the users' promises:
//!
//! 1. one effect per operation: a user's card is charged at most once, and
//!    exactly once when the user confirmed;
//! 2. a decline runs nothing: a user who never confirmed was charged
//!    nothing, and a call answered rejected, refused or input-required
//!    caused no charge by its own run;
//! 3. a continuation is never "in progress" against itself: a user who
//!    sends one continuation alone gets it run (or declined), never
//!    `in_progress`; and an `in_progress` answer is given only while
//!    another call of the same operation is in flight;
//! 4. what a user is told was charged was charged: every executed or
//!    replayed answer carries the one charge the processor made for it;
//! 5. a tampered `requestState` is refused, and nothing runs.
//!
//! `continuations_oracles_catch_sabotage` shows that they can fail.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::{
    current_reference, idempotent, mcp::current_continuation, Ask, Caller, Executor,
    IdempotencyStore, IdempotentServer, MemoryStore, ToolError,
};
use rmcp::handler::server::wrapper::{Json, Parameters};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig,
    ElicitationAction, ElicitationSchema, Implementation, InputRequiredResult, InputResponses,
    ProtocolVersion, RequestStateCodec, ServerCapabilities, ServerConfig,
};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService};
use rmcp::{tool, tool_handler, RoleClient, ServerHandler, ServiceExt};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::rng::Rng;

/// From this amount up, `charge_card` asks.
const CONFIRM_FROM: u64 = 1000;

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct ChargeArgs {
    card: String,
    amount_cents: u64,
}

#[derive(Serialize, Deserialize, schemars::JsonSchema)]
struct Receipt {
    charge_id: String,
}

/// The far side: every charge it made, by card.
#[derive(Default)]
struct Processor {
    charges: Mutex<Vec<(String, String)>>,
    delays: Mutex<Option<Rng>>,
    /// Sabotage: charge before asking (an effect before the question).
    charge_before_asking: AtomicBool,
}

impl Processor {
    fn delay(&self) -> Duration {
        let mut rng = self.delays.lock().unwrap();
        let rng = rng.as_mut().expect("seeded");
        Duration::from_millis(rng.range(1, 60))
    }

    fn charge(&self, card: &str) -> String {
        let mut charges = self.charges.lock().unwrap();
        let id = format!("ch_{}", charges.len() + 1);
        charges.push((card.to_owned(), id.clone()));
        id
    }
}

/// One replica's server, as one user's connection sees it: the user is its
/// default caller.
#[derive(Clone)]
struct Shop {
    executor: Executor,
    caller: Caller,
    codec: Arc<RequestStateCodec>,
    processor: Arc<Processor>,
    tool_router: rmcp::handler::server::router::tool::ToolRouter<Self>,
}

impl IdempotentServer for Shop {
    fn executor(&self) -> &Executor {
        &self.executor
    }
    fn default_caller(&self) -> Option<&Caller> {
        Some(&self.caller)
    }
    fn request_state_codec(&self) -> Option<&RequestStateCodec> {
        Some(&self.codec)
    }
}

fn confirm_schema() -> ElicitationSchema {
    ElicitationSchema::builder()
        .required_bool("confirm")
        .build()
        .expect("one boolean")
}

#[idem_runtime::tool_router]
impl Shop {
    #[idempotent(window = "15m")]
    #[tool(description = "Charge a card; from 1000 cents the user confirms first")]
    async fn charge_card(
        &self,
        Parameters(args): Parameters<ChargeArgs>,
    ) -> Result<Ask<Json<Receipt>>, ToolError> {
        assert!(current_reference().is_some(), "inside #[idempotent]");
        if args.amount_cents >= CONFIRM_FROM {
            match current_continuation().and_then(|c| c.elicitation("confirm")) {
                None => {
                    if self.processor.charge_before_asking.load(Ordering::SeqCst) {
                        self.processor.charge(&args.card);
                    }
                    return Ok(Ask::elicit("confirm", "Charge?", confirm_schema()));
                }
                Some(answer)
                    if answer.action == ElicitationAction::Accept
                        && answer.content.as_ref().and_then(|c| c.get("confirm"))
                            == Some(&json!(true)) => {}
                Some(_) => return Err(ToolError::rejected("declined: nothing was charged")),
            }
        }
        tokio::time::sleep(self.processor.delay()).await;
        let charge_id = self.processor.charge(&args.card);
        tokio::time::sleep(self.processor.delay()).await;
        Ok(Ask::Done(Json(Receipt { charge_id })))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Shop {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

/// What a user does after the first call asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Behaviour {
    /// Confirms once.
    Accept,
    /// Declines (or cancels, or answers `confirm: false`) and stops.
    Decline,
    /// Declines, then calls again and confirms.
    DeclineThenAccept,
    /// Sends a tampered `requestState` first, then the genuine one.
    Tamper,
    /// Sends the confirmed continuation twice at once (a client retry on a
    /// slow answer), perhaps to two replicas.
    Twice,
    /// Sends the confirmed continuation and re-issues the original call
    /// beside it.
    Reissue,
    /// A small amount: nothing is asked.
    Small,
}

const BEHAVIOURS: [Behaviour; 7] = [
    Behaviour::Accept,
    Behaviour::Decline,
    Behaviour::DeclineThenAccept,
    Behaviour::Tamper,
    Behaviour::Twice,
    Behaviour::Reissue,
    Behaviour::Small,
];

/// One answer a user got, and when its call was in flight.
#[derive(Clone, Debug)]
struct Told {
    user: usize,
    /// "first", "continuation", "tampered", "reissue".
    kind: &'static str,
    state: String,
    charge_id: Option<String>,
    sent: tokio::time::Instant,
    answered: tokio::time::Instant,
}

type Client = RunningService<RoleClient, ClientConfig>;

struct User {
    index: usize,
    behaviour: Behaviour,
    card: String,
    amount: u64,
    /// A connection to each replica.
    clients: Vec<Client>,
}

fn charge(card: &str, amount: u64) -> CallToolRequestParams {
    let Value::Object(args) = json!({ "card": card, "amount_cents": amount }) else {
        unreachable!()
    };
    CallToolRequestParams::new("charge_card").with_arguments(args)
}

fn responses(answer: Value) -> InputResponses {
    let mut responses = InputResponses::new();
    responses.insert("confirm".to_owned(), answer);
    responses
}

fn accept() -> InputResponses {
    responses(json!({ "action": "accept", "content": { "confirm": true } }))
}

fn state_of(result: &CallToolResult) -> (String, Option<String>) {
    let state = result
        .meta
        .as_ref()
        .and_then(|m| m.get("idem/operation"))
        .and_then(|o| o.get("state"))
        .and_then(Value::as_str)
        .unwrap_or("none")
        .to_owned();
    let charge_id = result
        .structured_content
        .as_ref()
        .and_then(|c| c.get("charge_id"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    (state, charge_id)
}

/// What a schedule shares: the answers and the seeded choices.
struct Schedule {
    told: Mutex<Vec<Told>>,
    rng: Mutex<Rng>,
    violations: Mutex<Vec<String>>,
}

impl Schedule {
    fn pick(&self, n: usize) -> usize {
        self.rng.lock().unwrap().below(n as u64) as usize
    }
    fn think(&self) -> Duration {
        Duration::from_millis(self.rng.lock().unwrap().range(0, 120))
    }
    /// A broken promise, under the number of its oracle (0: the harness).
    fn violation(&self, oracle: u8, message: String) {
        self.violations
            .lock()
            .unwrap()
            .push(format!("oracle {oracle}: {message}"));
    }
}

/// Sends one call to a replica the schedule picks; records the answer.
async fn send(
    schedule: &Schedule,
    user: &User,
    kind: &'static str,
    params: CallToolRequestParams,
) -> Option<InputRequiredResult> {
    let replica = schedule.pick(user.clients.len());
    let sent = tokio::time::Instant::now();
    let response = user.clients[replica].call_tool_once(params).await;
    let answered = tokio::time::Instant::now();
    let (state, charge_id, input) = match response {
        Ok(CallToolResponse::InputRequired(input)) => {
            ("input_required".to_owned(), None, Some(input))
        }
        Ok(CallToolResponse::Complete(result)) => {
            let (state, charge_id) = state_of(&result);
            (state, charge_id, None)
        }
        Ok(other) => (format!("unexpected {other:?}"), None, None),
        Err(error) => (format!("error {error}"), None, None),
    };
    schedule.told.lock().unwrap().push(Told {
        user: user.index,
        kind,
        state,
        charge_id,
        sent,
        answered,
    });
    input
}

fn continuation(
    user: &User,
    input: &InputRequiredResult,
    answers: InputResponses,
) -> CallToolRequestParams {
    charge(&user.card, user.amount)
        .with_input_responses(answers)
        .with_request_state(input.request_state.clone().unwrap_or_default())
}

async fn play(schedule: Arc<Schedule>, user: User) {
    tokio::time::sleep(schedule.think()).await;
    let first = send(&schedule, &user, "first", charge(&user.card, user.amount)).await;
    let Some(input) = first else {
        return; // a small amount, answered at once (or a bug the oracles see)
    };
    tokio::time::sleep(schedule.think()).await;
    match user.behaviour {
        Behaviour::Accept | Behaviour::Small => {
            send(
                &schedule,
                &user,
                "continuation",
                continuation(&user, &input, accept()),
            )
            .await;
        }
        Behaviour::Decline | Behaviour::DeclineThenAccept => {
            let answer = match schedule.pick(3) {
                0 => responses(json!({ "action": "decline" })),
                1 => responses(json!({ "action": "cancel" })),
                _ => responses(json!({ "action": "accept", "content": { "confirm": false } })),
            };
            send(
                &schedule,
                &user,
                "continuation",
                continuation(&user, &input, answer),
            )
            .await;
            if user.behaviour == Behaviour::DeclineThenAccept {
                tokio::time::sleep(schedule.think()).await;
                let again = send(&schedule, &user, "first", charge(&user.card, user.amount)).await;
                if let Some(input) = again {
                    send(
                        &schedule,
                        &user,
                        "continuation",
                        continuation(&user, &input, accept()),
                    )
                    .await;
                }
            }
        }
        Behaviour::Tamper => {
            let mut sealed = input.request_state.clone().unwrap_or_default().into_bytes();
            let at = schedule.pick(sealed.len().max(1));
            if let Some(byte) = sealed.get_mut(at) {
                *byte = if *byte == b'A' { b'B' } else { b'A' };
            }
            let tampered = charge(&user.card, user.amount)
                .with_input_responses(accept())
                .with_request_state(String::from_utf8_lossy(&sealed).into_owned());
            send(&schedule, &user, "tampered", tampered).await;
            send(
                &schedule,
                &user,
                "continuation",
                continuation(&user, &input, accept()),
            )
            .await;
        }
        Behaviour::Twice => {
            let a = send(
                &schedule,
                &user,
                "continuation",
                continuation(&user, &input, accept()),
            );
            let b = async {
                tokio::time::sleep(Duration::from_millis(schedule.pick(30) as u64)).await;
                send(
                    &schedule,
                    &user,
                    "continuation",
                    continuation(&user, &input, accept()),
                )
                .await
            };
            tokio::join!(a, b);
        }
        Behaviour::Reissue => {
            let a = send(
                &schedule,
                &user,
                "continuation",
                continuation(&user, &input, accept()),
            );
            let b = async {
                tokio::time::sleep(Duration::from_millis(schedule.pick(30) as u64)).await;
                send(&schedule, &user, "reissue", charge(&user.card, user.amount)).await
            };
            tokio::join!(a, b);
            // After it completed: the original call once more.
            send(&schedule, &user, "reissue", charge(&user.card, user.amount)).await;
        }
    }
}

/// What a schedule found wrong.
#[derive(Default)]
pub(crate) struct Found {
    pub(crate) violations: Vec<String>,
    pub(crate) answers: usize,
}

/// Breaks one thing on purpose, to show an oracle catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sabotage {
    None,
    /// The handler charges before it asks.
    ChargeBeforeAsking,
    /// Each replica seals with its own key: a continuation that reaches
    /// another replica is refused.
    KeyPerReplica,
}

async fn schedule(seed: u64, sabotage: Sabotage) -> Found {
    idem_runtime::store::conformance::seed_this_thread(
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
    );
    let mut rng = Rng::new(seed);
    let store: Arc<dyn IdempotencyStore> = Arc::new(MemoryStore::new());
    let replicas: Vec<Executor> = (0..rng.range(1, 4))
        .map(|_| Executor::new(store.clone()))
        .collect();
    let shared = Arc::new(RequestStateCodec::try_new(vec![7u8; 32]).expect("a key"));
    let codecs: Vec<Arc<RequestStateCodec>> = (0..replicas.len())
        .map(|i| match sabotage {
            Sabotage::KeyPerReplica => {
                Arc::new(RequestStateCodec::try_new(vec![i as u8 + 1; 32]).expect("a key"))
            }
            _ => shared.clone(),
        })
        .collect();
    let processor = Arc::new(Processor::default());
    *processor.delays.lock().unwrap() = Some(Rng::new(seed ^ 0xD1B5_4A32_D192_ED03));
    processor
        .charge_before_asking
        .store(sabotage == Sabotage::ChargeBeforeAsking, Ordering::SeqCst);
    let router = Shop::tool_router();

    let users: usize = rng.range(4, 10) as usize;
    let mut plays = Vec::new();
    let schedule = Arc::new(Schedule {
        told: Mutex::new(Vec::new()),
        rng: Mutex::new(Rng::new(seed ^ 0x5851_F42D_4C95_7F2D)),
        violations: Mutex::new(Vec::new()),
    });
    let mut behaviours = Vec::new();
    for index in 0..users {
        let behaviour = *rng.pick(&BEHAVIOURS);
        let tenant = *rng.pick(&["acme", "globex"]);
        let caller = Caller::new(tenant, format!("user{index}"));
        let amount = if behaviour == Behaviour::Small {
            rng.range(1, CONFIRM_FROM)
        } else {
            rng.range(CONFIRM_FROM, 200_000)
        };
        let mut clients = Vec::new();
        for (executor, codec) in replicas.iter().zip(&codecs) {
            let shop = Shop {
                executor: executor.clone(),
                caller: caller.clone(),
                codec: codec.clone(),
                processor: processor.clone(),
                tool_router: router.clone(),
            };
            let (server_side, client_side) = tokio::io::duplex(64 * 1024);
            tokio::spawn(async move {
                if let Ok(running) = shop.serve(server_side).await {
                    let _ = running.waiting().await;
                }
            });
            let client = ClientConfig::new(
                ClientCapabilities::default(),
                Implementation::new("idem-sim-continuations", "0"),
            )
            .serve_with_lifecycle(
                client_side,
                ClientLifecycleMode::Discover {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                },
            )
            .await
            .expect("the client connects");
            clients.push(client);
        }
        behaviours.push(behaviour);
        let user = User {
            index,
            behaviour,
            card: format!("tok_{seed}_{index}"),
            amount,
            clients,
        };
        plays.push(tokio::spawn(play(schedule.clone(), user)));
    }
    for play in plays {
        if let Err(error) = play.await {
            schedule.violation(0, format!("a user's task failed: {error}"));
        }
    }
    judge(&schedule, &processor, &behaviours, seed);
    let told = schedule.told.lock().unwrap().len();
    let violations = std::mem::take(&mut *schedule.violations.lock().unwrap());
    Found {
        violations,
        answers: told,
    }
}

/// The oracles, over everything the users were told and everything the
/// processor did.
fn judge(schedule: &Schedule, processor: &Processor, behaviours: &[Behaviour], seed: u64) {
    let told = schedule.told.lock().unwrap().clone();
    let charges = processor.charges.lock().unwrap().clone();
    for (user, &behaviour) in behaviours.iter().enumerate() {
        let card = format!("tok_{seed}_{user}");
        let made: Vec<&String> = charges
            .iter()
            .filter(|(c, _)| *c == card)
            .map(|(_, id)| id)
            .collect();
        let answers: Vec<&Told> = told.iter().filter(|t| t.user == user).collect();
        let confirmed = !matches!(behaviour, Behaviour::Decline);
        // 1 and 2: one effect per operation; none without a confirmation.
        let expected = usize::from(confirmed);
        if made.len() != expected {
            let oracle = if confirmed { 1 } else { 2 };
            schedule.violation(oracle, format!(
                "user {user} ({behaviour:?}): {} charge(s) at the processor, {expected} promised; told {:?}",
                made.len(),
                answers.iter().map(|t| (t.kind, t.state.as_str())).collect::<Vec<_>>()
            ));
        }
        for answer in &answers {
            // 4: what a user is told was charged was charged.
            if matches!(answer.state.as_str(), "executed" | "replayed") {
                match &answer.charge_id {
                    Some(id) if made.contains(&id) => {}
                    other => schedule.violation(4, format!(
                        "user {user} ({behaviour:?}) was told {} with charge {other:?}, the processor made {made:?}",
                        answer.state
                    )),
                }
            }
            // 5: a tampered state is refused.
            if answer.kind == "tampered" && answer.state != "refused" {
                schedule.violation(
                    5,
                    format!(
                        "user {user}: a tampered requestState was answered {}",
                        answer.state
                    ),
                );
            }
            // 3: "in progress" only while another call of the operation is in flight.
            if answer.state == "in_progress" {
                let overlapped = answers.iter().any(|other| {
                    !std::ptr::eq(*other, *answer)
                        && other.sent <= answer.answered
                        && other.answered >= answer.sent
                        && matches!(
                            other.state.as_str(),
                            "executed" | "replayed" | "in_progress"
                        )
                });
                if !overlapped {
                    schedule.violation(3, format!(
                        "user {user} ({behaviour:?}): a {} was told in_progress with nothing else of its operation in flight",
                        answer.kind
                    ));
                }
            }
            if answer.state.starts_with("error") || answer.state.starts_with("unexpected") {
                schedule.violation(0, format!("user {user}: {}", answer.state));
            }
        }
        // 3: a continuation sent alone is run, never "in progress".
        if matches!(
            behaviour,
            Behaviour::Accept | Behaviour::DeclineThenAccept | Behaviour::Tamper
        ) {
            let last = answers.iter().rev().find(|t| t.kind == "continuation");
            if last.map(|t| t.state.as_str()) != Some("executed") {
                schedule.violation(3, format!(
                    "user {user} ({behaviour:?}): its confirmed continuation, sent alone, was answered {:?}",
                    last.map(|t| &t.state)
                ));
            }
        }
        if behaviour == Behaviour::Reissue
            && answers.last().map(|t| (t.kind, t.state.as_str())) != Some(("reissue", "replayed"))
        {
            schedule.violation(1, format!(
                "user {user}: the original call sent again after the continuation completed was answered {:?}",
                answers.last().map(|t| &t.state)
            ));
        }
        if behaviour == Behaviour::Small
            && answers.first().map(|t| t.state.as_str()) != Some("executed")
        {
            schedule.violation(
                1,
                format!(
                    "user {user}: a small charge was answered {:?}",
                    answers.first().map(|t| &t.state)
                ),
            );
        }
    }
}

/// One schedule on its own paused single-threaded runtime.
fn run_seed(seed: u64, sabotage: Sabotage) -> Found {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    rt.block_on(schedule(seed, sabotage))
}

/// Prints, as the other stores' runs do (and as scripts/mutants reads),
/// each failing seed and the count of violations by oracle.
#[test]
fn simulation_continuations() {
    let _serial = crate::serial();
    let (seeds, single) = crate::seeds(200);
    let mut failed = 0;
    let mut answers = 0;
    let mut by_oracle = std::collections::BTreeMap::<String, usize>::new();
    for &seed in &seeds {
        let found = run_seed(seed, Sabotage::None);
        answers += found.answers;
        if found.violations.is_empty() {
            continue;
        }
        failed += 1;
        say!(
            "simulation: continuations: seed {seed}: {} violation(s)",
            found.violations.len()
        );
        for violation in &found.violations {
            let oracle = violation.split(':').next().unwrap_or("").to_owned();
            *by_oracle.entry(oracle).or_default() += 1;
            if failed <= 3 || single {
                say!("    {violation}");
            }
        }
    }
    if !by_oracle.is_empty() {
        let list: Vec<String> = by_oracle.iter().map(|(o, n)| format!("{o}: {n}")).collect();
        say!(
            "simulation: continuations: violations by oracle: {}",
            list.join(", ")
        );
    }
    say!(
        "simulation: continuations: {} schedules, {answers} answers, {failed} with violations",
        seeds.len()
    );
    assert_eq!(failed, 0, "continuations broke a promise (see above)");
}

#[test]
fn continuations_oracles_catch_sabotage() {
    let _serial = crate::serial();
    for sabotage in [Sabotage::ChargeBeforeAsking, Sabotage::KeyPerReplica] {
        let caught = (0..40).any(|seed| !run_seed(seed, sabotage).violations.is_empty());
        assert!(caught, "{sabotage:?} was not caught in 40 schedules");
    }
}
