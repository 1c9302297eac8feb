//! A proxy between a DynamoDbStore and the emulator, for tests that look at
//! the requests themselves: it counts every request by its operation (the
//! `X-Amz-Target` header: `DynamoDB_20120810.Scan`), holds a request a
//! test picks for a while before it forwards it anyway, after its client
//! gave up (a request the service applies late), and lets a test answer a
//! request itself or rewrite the service's answer (what DynamoDB does and
//! the emulator does not: an index it is still building).
//!
//! Plain HTTP/1.1, one request per connection (each answer says
//! `Connection: close`, so the SDK opens a new connection for the next);
//! each request is forwarded on a connection of its own.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Which requests a hold picks: by operation and body.
type Pick = Box<dyn Fn(&str, &str) -> bool + Send + Sync>;

/// A request to hold, once.
struct Hold {
    pick: Pick,
    delay: Duration,
}

/// What became of a held request: the operation, the service's status
/// code and answer once it was forwarded.
#[derive(Clone, Debug)]
pub struct Landed {
    pub target: String,
    pub request: String,
    pub status: u16,
    pub answer: String,
}

/// What a test's hook ([`Proxy::intercept`]) makes of one request.
pub enum Intercepted {
    /// Forward it, and answer what the service answered.
    Forward,
    /// Send nothing on, and answer with this status and JSON body.
    Answer(u16, String),
    /// Forward it, and answer the service's JSON body rewritten.
    Rewrite(Rewrite),
    /// Forward it, and answer this status and JSON body instead of the
    /// service's: a request applied whose answer says otherwise.
    Replace(u16, String),
    /// Forward this JSON body in its place, and answer what the service
    /// answered to it, rewritten by `answer` if given.
    Alter {
        request: String,
        answer: Option<Rewrite>,
    },
}

/// A rewrite of the service's answer's JSON body.
pub type Rewrite = Box<dyn FnOnce(serde_json::Value) -> serde_json::Value + Send>;

impl Intercepted {
    /// DynamoDB's answer to a request it refused: HTTP 400 and the error's
    /// code (`ResourceInUseException`) and message, as the SDK reads them.
    pub fn error(code: &str, message: &str) -> Intercepted {
        Intercepted::Answer(400, error_body(code, message))
    }

    /// The request forwarded, and answered as refused (see
    /// [`error`](Intercepted::error)).
    pub fn applied_but_refused(code: &str, message: &str) -> Intercepted {
        Intercepted::Replace(400, error_body(code, message))
    }
}

/// The body of DynamoDB's answer to a request it refused.
fn error_body(code: &str, message: &str) -> String {
    serde_json::json!({
        "__type": format!("com.amazonaws.dynamodb.v20120810#{code}"),
        "message": message,
    })
    .to_string()
}

/// A test's hook: the operation (without its prefix) and the body in, what
/// to do with the request out.
type Hook = Arc<dyn Fn(&str, &str) -> Intercepted + Send + Sync>;

#[derive(Default)]
struct State {
    counts: Mutex<BTreeMap<String, usize>>,
    hold: Mutex<Option<Hold>>,
    hook: Mutex<Option<Hook>>,
}

/// The proxy, serving until dropped.
pub struct Proxy {
    /// Its endpoint, for the store's client.
    pub url: String,
    state: Arc<State>,
    landed: watch::Receiver<Option<Landed>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// A proxy in front of the emulator at `upstream` (`http://host:port`).
    pub async fn start(upstream: &str) -> Proxy {
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(State::default());
        let (tell, landed) = watch::channel(None);
        let tell = Arc::new(tell);
        let serving = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                let (state, upstream, tell) = (serving.clone(), upstream.clone(), tell.clone());
                tokio::spawn(async move {
                    let _ = serve(client, &state, &upstream, &tell).await;
                });
            }
        });
        Proxy {
            url,
            state,
            landed,
            task,
        }
    }

    /// How many requests of `operation` (`Scan`, `Query`, `PutItem`) it
    /// has seen.
    pub fn count(&self, operation: &str) -> usize {
        let counts = self.state.counts.lock().unwrap();
        counts
            .get(&format!("DynamoDB_20120810.{operation}"))
            .copied()
            .unwrap_or(0)
    }

    /// Every operation it has seen, with its count.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        self.state.counts.lock().unwrap().clone()
    }

    /// Forgets the counts.
    pub fn reset_counts(&self) {
        self.state.counts.lock().unwrap().clear();
    }

    /// Holds the next request that `pick` (its operation, without the
    /// `DynamoDB_20120810.` prefix, and its body) selects: its client is
    /// answered nothing, and `delay` after it came it is forwarded anyway.
    pub fn hold_next(
        &self,
        pick: impl Fn(&str, &str) -> bool + Send + Sync + 'static,
        delay: Duration,
    ) {
        *self.state.hold.lock().unwrap() = Some(Hold {
            pick: Box::new(pick),
            delay,
        });
    }

    /// Hands every request from now on to `hook`, which says whether it is
    /// forwarded, answered by the proxy, or forwarded and its answer
    /// rewritten.
    pub fn intercept(&self, hook: impl Fn(&str, &str) -> Intercepted + Send + Sync + 'static) {
        *self.state.hook.lock().unwrap() = Some(Arc::new(hook));
    }

    /// Waits (at most `timeout`) until the held request has been forwarded
    /// and answered.
    pub async fn landed(&self, timeout: Duration) -> Landed {
        let mut landed = self.landed.clone();
        let found = tokio::time::timeout(timeout, landed.wait_for(Option::is_some))
            .await
            .expect("the held request is forwarded in time")
            .expect("the proxy runs");
        found.clone().unwrap()
    }
}

/// One client connection: one request, forwarded (or held), one answer.
async fn serve(
    mut client: TcpStream,
    state: &State,
    upstream: &str,
    tell: &watch::Sender<Option<Landed>>,
) -> std::io::Result<()> {
    let Some((head, body)) = read_request(&mut client).await? else {
        return Ok(());
    };
    let target = header(&head, "x-amz-target").unwrap_or_default();
    *state
        .counts
        .lock()
        .unwrap()
        .entry(target.clone())
        .or_default() += 1;
    let operation = target.trim_start_matches("DynamoDB_20120810.").to_owned();
    let text = String::from_utf8_lossy(&body).into_owned();
    let held = {
        let mut hold = state.hold.lock().unwrap();
        match hold.as_ref() {
            Some(h) if (h.pick)(&operation, &text) => hold.take(),
            _ => None,
        }
    };
    let request = with_connection_close(&head, &body);
    let hook = state.hook.lock().unwrap().clone();
    match hook.map_or(Intercepted::Forward, |hook| hook(&operation, &text)) {
        Intercepted::Forward => {}
        Intercepted::Answer(status, body) => {
            client.write_all(&json_answer(status, &body)).await?;
            return client.shutdown().await;
        }
        Intercepted::Rewrite(rewrite) => {
            let answer = exchange(upstream, &request).await?;
            let (status, body) = split_answer(&answer);
            let body = serde_json::from_str(&body).expect("the service answers JSON");
            let body = rewrite(body).to_string();
            client.write_all(&json_answer(status, &body)).await?;
            return client.shutdown().await;
        }
        Intercepted::Replace(status, body) => {
            exchange(upstream, &request).await?;
            client.write_all(&json_answer(status, &body)).await?;
            return client.shutdown().await;
        }
        Intercepted::Alter { request, answer } => {
            let head = with_length(&head, request.len());
            let sent =
                exchange(upstream, &with_connection_close(&head, request.as_bytes())).await?;
            let (status, body) = split_answer(&sent);
            let body = match answer {
                Some(rewrite) => {
                    let body = serde_json::from_str(&body).expect("the service answers JSON");
                    rewrite(body).to_string()
                }
                None => body,
            };
            client.write_all(&json_answer(status, &body)).await?;
            return client.shutdown().await;
        }
    }
    if let Some(hold) = held {
        // Forwarded later, whatever the client does meanwhile; the client
        // is answered nothing and gives up.
        let (upstream, tell) = (upstream.to_owned(), tell.clone());
        tokio::spawn(async move {
            tokio::time::sleep(hold.delay).await;
            let answer = exchange(&upstream, &request)
                .await
                .expect("the emulator answers the held request");
            let (status, answer) = split_answer(&answer);
            tell.send_replace(Some(Landed {
                target: operation,
                request: text,
                status,
                answer,
            }));
        });
        // Until the client hangs up.
        let mut rest = [0u8; 1024];
        while client.read(&mut rest).await? > 0 {}
        return Ok(());
    }
    let answer = exchange(upstream, &request).await?;
    client.write_all(&answer_closing(&answer)).await?;
    client.shutdown().await
}

/// Reads one request: its head (up to the blank line) and its body (by
/// `Content-Length`). `None` when the client hung up first.
async fn read_request(client: &mut TcpStream) -> std::io::Result<Option<(String, Vec<u8>)>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
    assert!(
        header(&head, "transfer-encoding").is_none(),
        "the proxy reads bodies by Content-Length only"
    );
    let length: usize = header(&head, "content-length")
        .map(|l| l.parse().unwrap())
        .unwrap_or(0);
    let mut body = buf[end..].to_vec();
    while body.len() < length {
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        body.extend_from_slice(&chunk[..n]);
    }
    Ok(Some((head, body)))
}

/// A header's value, by its name in any case.
fn header(head: &str, name: &str) -> Option<String> {
    head.lines().skip(1).find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

/// The head without its `Connection` header and with `Connection: close`,
/// then the body.
fn with_connection_close(head: &str, body: &[u8]) -> Vec<u8> {
    let mut out = String::new();
    for line in head.trim_end().lines() {
        let is_connection = line
            .split_once(':')
            .is_some_and(|(n, _)| n.trim().eq_ignore_ascii_case("connection"));
        if !is_connection {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// The service's answer, also with `Connection: close`.
fn answer_closing(answer: &[u8]) -> Vec<u8> {
    match answer.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(i) => {
            with_connection_close(&String::from_utf8_lossy(&answer[..i + 4]), &answer[i + 4..])
        }
        None => answer.to_vec(),
    }
}

/// A request's head with `Content-Length: length` in place of its own.
fn with_length(head: &str, length: usize) -> String {
    let mut out = String::new();
    for line in head.trim_end().lines() {
        let is_length = line
            .split_once(':')
            .is_some_and(|(n, _)| n.trim().eq_ignore_ascii_case("content-length"));
        if !is_length {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str(&format!("Content-Length: {length}\r\n\r\n"));
    out
}

/// An answer of the proxy's own: `status`, a JSON `body`.
fn json_answer(status: u16, body: &str) -> Vec<u8> {
    let reason = if status == 200 { "OK" } else { "Bad Request" };
    format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/x-amz-json-1.0\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends `request` on a connection of its own and reads the answer to its
/// end.
async fn exchange(upstream: &str, request: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut conn = TcpStream::connect(upstream).await?;
    conn.write_all(request).await?;
    let mut answer = Vec::new();
    conn.read_to_end(&mut answer).await?;
    Ok(answer)
}

/// An answer's status code and body.
fn split_answer(answer: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(answer);
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or_else(String::new, |(_, b)| b.to_owned());
    (status, body)
}

/// The IAM actions a request needs (`dynamodb:PutItem`): its operation's,
/// or for a `TransactWriteItems` those of the writes it holds (IAM has no
/// action of its own for a transaction).
pub fn iam_actions(operation: &str, body: &str) -> Vec<String> {
    if operation != "TransactWriteItems" {
        return vec![format!("dynamodb:{operation}")];
    }
    let body: serde_json::Value = serde_json::from_str(body).expect("a JSON request");
    let mut actions: Vec<String> = body["TransactItems"]
        .as_array()
        .expect("a transaction's items")
        .iter()
        .flat_map(|item| item.as_object().unwrap().keys())
        .map(|write| match write.as_str() {
            "Put" => "dynamodb:PutItem".to_owned(),
            "Update" => "dynamodb:UpdateItem".to_owned(),
            "Delete" => "dynamodb:DeleteItem".to_owned(),
            "ConditionCheck" => "dynamodb:ConditionCheckItem".to_owned(),
            other => panic!("a transaction's write {other:?}"),
        })
        .collect();
    actions.dedup();
    actions
}

/// The IAM actions requests have needed, by what a test was doing.
pub type Actions = Arc<Mutex<BTreeSet<String>>>;

impl Proxy {
    /// From now on, forwards every request and records the IAM actions it
    /// needs ([`iam_actions`]) in what this returns.
    pub fn record_actions(&self) -> Actions {
        let actions = Actions::default();
        let recorded = actions.clone();
        self.intercept(move |operation, body| {
            recorded
                .lock()
                .unwrap()
                .extend(iam_actions(operation, body));
            Intercepted::Forward
        });
        actions
    }
}

/// The actions docs/deploying.md grants in its IAM statement `sid` (the
/// JSON block with `"Sid": "IdemServe"`).
pub fn documented_actions(sid: &str) -> BTreeSet<String> {
    let docs = include_str!("../../../docs/deploying.md");
    let at = docs
        .find(&format!("\"Sid\": \"{sid}\""))
        .unwrap_or_else(|| panic!("docs/deploying.md has no IAM statement {sid}"));
    let start = docs[..at].rfind("```json").expect("in a JSON block") + "```json".len();
    let end = at + docs[at..].find("```").expect("a closed JSON block");
    let statement: serde_json::Value = serde_json::from_str(&docs[start..end])
        .unwrap_or_else(|e| panic!("{sid}'s statement is JSON: {e}"));
    statement["Action"]
        .as_array()
        .expect("its actions")
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}
