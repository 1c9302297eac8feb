//! A child process for the follow-ons' fault tests (`tests/follow_ons_faults.rs`):
//! it completes one charge that declares a receipt, or dispatches receipts,
//! on a SQLite file, so the parent can SIGKILL it at the moment it chooses.
//! The mailer stub appends one line per request to a file (`O_APPEND`,
//! fsync'd before it answers), so requests are counted across processes
//! and kills.
//!
//! ```text
//! follow_ons_worker charge   <sqlite-path>
//! follow_ons_worker dispatch <sqlite-path> <mailer-log> ok|hang
//! ```
//!
//! `charge` completes the operation (and its receipt job), prints
//! `COMPLETED <reference>` and waits to be killed, with no dispatcher.
//! `dispatch` runs a [`FollowOnDispatcher`] whose receipt handler logs
//! `<downstream-key> <attempt> <pid>`; with `hang` it then prints
//! `IN_JOB <downstream-key>` and never returns, with `ok` it succeeds.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{
    executor::{Operation, ScopeSpec},
    follow_on,
    follow_ons::{follow_on_fn, FollowOnConfig, FollowOnDispatcher, FollowOnHandlers},
    Caller, Executor, IdempotencyStore, SqliteStore, ToolError,
};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let store: Arc<dyn IdempotencyStore> = Arc::new(SqliteStore::open(&args[2]).await.unwrap());
    match args[1].as_str() {
        "charge" => {
            let executor = Executor::new(store);
            let caller = Caller::new("acme", "alice");
            let charge = serde_json::json!({"card": "tok_visa", "amount_cents": 1999});
            let answer = executor
                .run(
                    Operation {
                        caller: &caller,
                        tool: "charge_card",
                        args: &charge,
                        scope: ScopeSpec::Window(Duration::from_secs(900)),
                        status_tool: "get_operation_status",
                    },
                    |ctx| async move {
                        follow_on(
                            "send_receipt",
                            &serde_json::json!({"to": "alice@example.com"}),
                        )
                        .map_err(|e| ToolError::unknown(e.to_string()))?;
                        Ok::<_, ToolError>(format!("ch_{}", ctx.reference()))
                    },
                )
                .await;
            let reference = answer.reference().expect("a reference");
            println!("COMPLETED {reference} {}", answer.name());
            std::io::stdout().flush().unwrap();
            std::future::pending::<()>().await;
        }
        "dispatch" => {
            let (log, hang) = (args[3].clone(), args[4] == "hang");
            let handlers = FollowOnHandlers::new().on(
                "send_receipt",
                follow_on_fn(move |job| {
                    let log = log.clone();
                    async move {
                        let mut f = std::fs::OpenOptions::new()
                            .append(true)
                            .create(true)
                            .open(&log)?;
                        writeln!(
                            f,
                            "{} {} {}",
                            job.downstream_key,
                            job.run,
                            std::process::id()
                        )?;
                        f.sync_all()?;
                        if hang {
                            println!("IN_JOB {}", job.downstream_key);
                            std::io::stdout().flush()?;
                            std::future::pending::<()>().await;
                        }
                        Ok(())
                    }
                }),
            );
            let config = FollowOnConfig::default()
                .with_interval(Duration::from_millis(50))
                // The lease is twice this: a killed run's job is free again
                // two seconds after it was leased.
                .with_timeout(Duration::from_secs(1));
            let _dispatcher = FollowOnDispatcher::spawn(store, handlers, config)
                .expect("the store keeps follow-ons");
            std::future::pending::<()>().await;
        }
        other => panic!("unknown role {other}"),
    }
}
