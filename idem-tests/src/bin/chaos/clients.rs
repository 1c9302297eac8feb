//! The fleet of clients: each carries out intents (a purchase a user
//! wants) against the replicas over streamable HTTP, retrying the way hosts
//! and models do, and writes down every answer it gets.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde::Serialize;
use serde_json::{json, Value};

/// A small seeded generator (xorshift64*).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// Seeded; a zero seed is moved off zero.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// A draw in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.below(1_000_000) as f64) < p * 1_000_000.0
    }
}

/// One answer (or its absence) as the client saw it.
#[derive(Clone, Debug, Serialize)]
pub struct Obs {
    /// When the request left, in milliseconds since the run started.
    pub t_ms: u64,
    /// When its answer (or the timeout) came.
    pub end_ms: u64,
    /// The replica asked.
    pub replica: usize,
    /// `call`, `status` or `probe`.
    pub via: &'static str,
    /// The answer's `_meta` state (`executed`, `replayed`, …), the status's
    /// state (`COMPLETED`, …), or `timeout` / `transport: …`.
    pub outcome: String,
    /// The operation's reference, when the answer gave one.
    pub reference: Option<String>,
    /// The charge id the answer told, if it told one.
    pub charge_id: Option<String>,
    /// The result's text, for answers that carry the operation's value.
    pub text: Option<String>,
    /// The client threw this answer away (it "never arrived").
    pub lost: bool,
}

/// A purchase a user wants, and everything the client saw while carrying
/// it out.
#[derive(Clone, Debug, Serialize)]
pub struct Intent {
    /// Unique in the run.
    pub id: u64,
    /// The tenant whose token the client uses.
    pub tenant: String,
    /// `charge_card` or `tap_to_pay`.
    pub tool: &'static str,
    /// The card: unique per intent, except for a tap made again after the
    /// window (`again_of`), which is a new purchase on the same card.
    pub card: String,
    /// The amount in cents (0: a call the tool must reject).
    pub amount: u64,
    /// How the client retries: `plain`, `duplicates`, `timeout`, `lost`,
    /// `tap`, `tap_again`, `zero`.
    pub kind: &'static str,
    /// The intent this one repeats after the window, a wanted new purchase.
    pub again_of: Option<u64>,
    /// What the client saw.
    pub obs: Vec<Obs>,
    /// When the client last submitted the call (ms since the start).
    pub last_submit_ms: u64,
}

/// Where the clients send their calls.
pub struct Fleet {
    /// `http://127.0.0.1:PORT/mcp` of each replica.
    pub replicas: Vec<String>,
    /// (tenant, token).
    pub tenants: Vec<(String, String)>,
    /// The run's start.
    pub start: Instant,
    /// Cleared when no new intent may begin.
    pub running: AtomicBool,
    /// Every intent carried out, once it ends.
    pub done: Mutex<Vec<Intent>>,
    /// References told to each tenant, for the isolation probes.
    pub seen: Mutex<Vec<(String, String)>>,
    /// The next intent id.
    pub next_id: std::sync::atomic::AtomicU64,
}

impl Fleet {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }
}

/// One call on a new session to `replica`, within `limit`.
async fn call(
    url: &str,
    token: &str,
    tool: &'static str,
    args: Value,
    limit: Duration,
) -> Result<CallToolResult, String> {
    let attempt = async {
        let transport = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token),
        );
        let client = ().serve(transport).await.map_err(|e| format!("transport: {e}"))?;
        let Value::Object(args) = args else {
            unreachable!("arguments are objects")
        };
        let result = client
            .call_tool(CallToolRequestParams::new(tool).with_arguments(args))
            .await
            .map_err(|e| format!("transport: {e}"));
        let _ = client.cancel().await;
        result
    };
    match tokio::time::timeout(limit, attempt).await {
        Ok(result) => result,
        Err(_) => Err("timeout".to_owned()),
    }
}

fn first_text(result: &CallToolResult) -> Option<String> {
    result
        .content
        .iter()
        .find_map(|c| c.as_text().map(|t| t.text.clone()))
}

/// A tool call's answer as an observation.
fn observe_call(
    result: &CallToolResult,
) -> (String, Option<String>, Option<String>, Option<String>) {
    let op = result
        .meta
        .as_ref()
        .and_then(|m| m.get(idem_runtime::mcp::RESULT_META_KEY))
        .cloned()
        .unwrap_or(Value::Null);
    let state = op["state"].as_str().unwrap_or("no_meta").to_owned();
    let reference = op["reference"].as_str().map(str::to_owned);
    let has_value = matches!(state.as_str(), "executed" | "replayed");
    let charge_id = has_value
        .then(|| {
            result
                .structured_content
                .as_ref()
                .and_then(|v| v["charge_id"].as_str().map(str::to_owned))
        })
        .flatten();
    let text = has_value.then(|| first_text(result)).flatten();
    (state, reference, charge_id, text)
}

/// How a status answer for a reference with no record begins
/// (`answer.rs`'s not-found text, behind `observe_status`'s prefix).
const RELEASED: &str = "status_error: No operation with reference";

/// A status answer as an observation: its state and the charge id of a
/// completed operation.
fn observe_status(result: &CallToolResult) -> (String, Option<String>) {
    let text = first_text(result).unwrap_or_default();
    if result.is_error == Some(true) {
        return (
            format!(
                "status_error: {}",
                text.chars().take(80).collect::<String>()
            ),
            None,
        );
    }
    let report: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let state = report["state"].as_str().unwrap_or("?").to_owned();
    let charge_id = report["response"]["structuredContent"]["charge_id"]
        .as_str()
        .map(str::to_owned);
    (state, charge_id)
}

struct Client {
    fleet: Arc<Fleet>,
    tenant: String,
    token: String,
    rng: Rng,
    last_replica: usize,
}

impl Client {
    fn other_replica(&mut self) -> usize {
        let n = self.fleet.replicas.len();
        let next = (self.last_replica + 1 + self.rng.below(n as u64 - 1) as usize) % n;
        self.last_replica = next;
        next
    }

    async fn submit(
        &mut self,
        intent: &mut Intent,
        replica: usize,
        limit: Duration,
        lost: bool,
    ) -> Obs {
        let args = json!({ "card": intent.card, "amount_cents": intent.amount, "currency": "usd" });
        intent.last_submit_ms = self.fleet.now_ms();
        let url = self.fleet.replicas[replica].clone();
        // When the call left: what it is compared with (a window, a charge).
        let t_ms = self.fleet.now_ms();
        let answer = call(&url, &self.token, intent.tool, args, limit).await;
        let end_ms = self.fleet.now_ms();
        match answer {
            Ok(result) => {
                let (outcome, reference, charge_id, text) = observe_call(&result);
                Obs {
                    t_ms,
                    end_ms,
                    replica,
                    via: "call",
                    outcome,
                    reference,
                    charge_id,
                    text,
                    lost,
                }
            }
            Err(e) => Obs {
                t_ms,
                end_ms,
                replica,
                via: "call",
                outcome: e,
                reference: None,
                charge_id: None,
                text: None,
                lost,
            },
        }
    }

    async fn status(&mut self, reference: &str, via: &'static str) -> Obs {
        let replica = self.other_replica();
        let url = self.fleet.replicas[replica].clone();
        let t_ms = self.fleet.now_ms();
        let answer = call(
            &url,
            &self.token,
            "get_operation_status",
            json!({ "reference": reference }),
            Duration::from_secs(5),
        )
        .await;
        let end_ms = self.fleet.now_ms();
        let (outcome, charge_id) = match &answer {
            Ok(result) => observe_status(result),
            Err(e) => (e.clone(), None),
        };
        Obs {
            t_ms,
            end_ms,
            replica,
            via,
            outcome,
            reference: Some(reference.to_owned()),
            charge_id,
            text: None,
            lost: false,
        }
    }

    /// Carries out `intent` until it is told a charge, or it may no longer
    /// resubmit and its operation is settled, or 60 s have passed.
    async fn pursue(&mut self, intent: &mut Intent) {
        let start = Instant::now();
        let resubmit_for = if intent.tool == "tap_to_pay" {
            // A repeat after the 5 s window would be a new purchase.
            Duration::from_secs(3)
        } else {
            Duration::from_secs(20)
        };
        let deadline = Duration::from_secs(60);
        let mut pending: Option<String> = None;
        let mut round = 0;
        while start.elapsed() < deadline {
            if let Some(reference) = pending.clone() {
                let obs = self.status(&reference, "status").await;
                let outcome = obs.outcome.clone();
                intent.obs.push(obs);
                match outcome.as_str() {
                    "COMPLETED" => return,
                    "NOT_PERFORMED" => pending = None,
                    // A claim given back (the charge refused before it was
                    // made) leaves no record: nothing was performed, and
                    // the purchase is still wanted. Polling on would only
                    // wait out the deadline.
                    released if released.starts_with(RELEASED) => pending = None,
                    _ => {
                        tokio::time::sleep(Duration::from_millis(300 + self.rng.below(400))).await;
                        continue;
                    }
                }
            }
            if start.elapsed() >= resubmit_for {
                return;
            }
            let first = round == 0;
            round += 1;
            let mut answers = Vec::new();
            if first && matches!(intent.kind, "duplicates" | "tap") {
                // Concurrent duplicates on different replicas.
                let copies = 2 + self.rng.below(2) as usize;
                let n = self.fleet.replicas.len();
                let base = self.rng.below(n as u64) as usize;
                let mut calls = Vec::new();
                for i in 0..copies {
                    let mut me = Client {
                        fleet: self.fleet.clone(),
                        tenant: self.tenant.clone(),
                        token: self.token.clone(),
                        rng: Rng::new(self.rng.below(u64::MAX)),
                        last_replica: 0,
                    };
                    let mut copy = intent.clone();
                    calls.push(async move {
                        let obs = me
                            .submit(&mut copy, (base + i) % n, Duration::from_secs(8), false)
                            .await;
                        (obs, copy.last_submit_ms)
                    });
                }
                for (obs, at) in futures::future::join_all(calls).await {
                    intent.last_submit_ms = intent.last_submit_ms.max(at);
                    answers.push(obs);
                }
            } else {
                let replica = self.other_replica();
                let (limit, lost) = match (first, intent.kind) {
                    // Shorter than the processor may take: the host times out.
                    (true, "timeout") => (Duration::from_millis(150 + self.rng.below(300)), false),
                    (true, "lost") => (Duration::from_secs(8), true),
                    _ => (Duration::from_secs(8), false),
                };
                answers.push(self.submit(intent, replica, limit, lost).await);
            }
            let mut told = false;
            for obs in &answers {
                if obs.lost {
                    continue;
                }
                if let Some(reference) = &obs.reference {
                    self.fleet
                        .seen
                        .lock()
                        .unwrap()
                        .push((self.tenant.clone(), reference.clone()));
                }
                match obs.outcome.as_str() {
                    "executed" | "replayed" => told = true,
                    "in_progress" | "unknown" | "failed_unknown" => {
                        pending = obs.reference.clone();
                    }
                    _ => {}
                }
            }
            let refused = answers.iter().any(|o| o.outcome == "rejected");
            intent.obs.extend(answers);
            if told || (refused && intent.kind == "zero") {
                return;
            }
            if pending.is_none() {
                // Rejected, refused, a timeout, a dead replica: again, on
                // another replica, after a pause (a lost answer: at once).
                if !intent.obs.last().is_some_and(|o| o.lost) {
                    tokio::time::sleep(Duration::from_millis(100 + self.rng.below(500))).await;
                }
            }
        }
    }

    /// Asks for another tenant's reference: it must not be found.
    async fn probe(&mut self) -> Option<Obs> {
        let theirs = {
            let seen = self.fleet.seen.lock().unwrap();
            let others: Vec<&(String, String)> =
                seen.iter().filter(|(t, _)| *t != self.tenant).collect();
            if others.is_empty() {
                return None;
            }
            others[self.rng.below(others.len() as u64) as usize]
                .1
                .clone()
        };
        let mut obs = self.status(&theirs, "probe").await;
        // A probe that got a status of someone else's operation leaked it.
        if !obs.outcome.starts_with("status_error")
            && !obs.outcome.starts_with("transport")
            && obs.outcome != "timeout"
        {
            obs.outcome = format!("leaked: {}", obs.outcome);
        }
        Some(obs)
    }
}

/// Runs one client until the fleet stops: intent after intent.
pub async fn run_client(fleet: Arc<Fleet>, number: usize, seed: u64) {
    let (tenant, token) = fleet.tenants[number % fleet.tenants.len()].clone();
    let mut client = Client {
        last_replica: number % fleet.replicas.len(),
        fleet: fleet.clone(),
        tenant: tenant.clone(),
        token,
        rng: Rng::new(seed ^ (number as u64 + 1) << 20),
    };
    while fleet.running.load(Ordering::SeqCst) {
        let id = fleet.next_id.fetch_add(1, Ordering::SeqCst);
        let kind = match client.rng.below(100) {
            0..=24 => "plain",
            25..=44 => "duplicates",
            45..=59 => "timeout",
            60..=74 => "lost",
            75..=94 => "tap",
            _ => "zero",
        };
        let tool = if kind == "tap" {
            "tap_to_pay"
        } else {
            "charge_card"
        };
        let mut intent = Intent {
            id,
            tenant: tenant.clone(),
            tool,
            card: format!("tok_{tenant}_{id}"),
            amount: if kind == "zero" {
                0
            } else {
                100 + client.rng.below(9900)
            },
            kind,
            again_of: None,
            obs: Vec::new(),
            last_submit_ms: 0,
        };
        client.pursue(&mut intent).await;
        let again = (kind == "tap").then(|| Intent {
            id: fleet.next_id.fetch_add(1, Ordering::SeqCst),
            kind: "tap_again",
            again_of: Some(intent.id),
            obs: Vec::new(),
            ..intent.clone()
        });
        let last_submit = intent.last_submit_ms;
        fleet.done.lock().unwrap().push(intent);
        if let Some(mut again) = again {
            // The same tap after the 5 s window: a purchase the user wants.
            let after = last_submit + 6_500;
            let now = fleet.now_ms();
            if after > now {
                tokio::time::sleep(Duration::from_millis(after - now)).await;
            }
            client.pursue(&mut again).await;
            fleet.done.lock().unwrap().push(again);
        }
        if client.rng.chance(0.15) {
            if let Some(obs) = client.probe().await {
                let probe = Intent {
                    id: fleet.next_id.fetch_add(1, Ordering::SeqCst),
                    tenant: tenant.clone(),
                    tool: "get_operation_status",
                    card: String::new(),
                    amount: 0,
                    kind: "probe",
                    again_of: None,
                    obs: vec![obs],
                    last_submit_ms: 0,
                };
                fleet.done.lock().unwrap().push(probe);
            }
        }
    }
}
