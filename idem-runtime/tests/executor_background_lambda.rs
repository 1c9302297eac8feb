//! Background completions under AWS Lambda: the process is frozen after the
//! answer, so `Executor::with_background_completions(true)` keeps every
//! completion inline there, and says so once. This file is a test binary of
//! its own because it sets `AWS_LAMBDA_RUNTIME_API` for the whole process.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_runtime::store::RecordStateKind;
use idem_runtime::{
    answer::{Answer, Recording},
    executor::{Operation, ScopeSpec},
    Caller, Executor, IdempotencyStore, MemoryStore, ToolError,
};
use tracing_subscriber::util::SubscriberInitExt;

/// What the tracing subscriber wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn under_lambda_completions_are_written_before_the_answer() {
    let logs = Captured::default();
    let writer = logs.clone();
    let _guard = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish()
        .set_default();
    // What Lambda sets for every runtime (the runtime API's address).
    std::env::set_var("AWS_LAMBDA_RUNTIME_API", "127.0.0.1:9001");

    let store = Arc::new(MemoryStore::new());
    let executor = Executor::new(store.clone()).with_background_completions(true);
    // A second executor so configured does not say it again.
    let _again = Executor::new(store.clone()).with_background_completions(true);

    let caller = Caller::new("acme", "alice");
    let args = serde_json::json!({ "card": "4242", "amount_cents": 500 });
    let op = Operation {
        caller: &caller,
        tool: "charge_card",
        args: &args,
        scope: ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: "get_operation_status",
    };
    let answer = executor
        .run(op, |_ctx| async { Ok::<_, ToolError>("ch_1".to_owned()) })
        .await;
    let reference = match answer {
        Answer::Executed {
            recording,
            reference,
            ..
        } => {
            assert_eq!(recording, Recording::Stored, "written before the answer");
            reference
        }
        other => panic!("expected executed, got {other:?}"),
    };
    assert_eq!(executor.pending_completions(), 0);
    // The store holds the completion the moment the caller has its answer.
    let record = store.lookup("acme", &reference).await.unwrap().unwrap();
    assert_eq!(record.state.kind(), RecordStateKind::Completed);

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert_eq!(
        text.matches("background completions are off").count(),
        1,
        "said once: {text}"
    );
    assert!(text.contains("AWS_LAMBDA_RUNTIME_API"), "{text}");
}
