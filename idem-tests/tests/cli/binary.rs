//! The real `idem` binary, run as a process.

use idem_runtime::SqliteStore;
use serde_json::{json, Value};

use crate::durable::temp_dir;
use crate::operator::fill;

/// The binary as a process: `idem_cli` here is `idem_cli::main`, the whole
/// of the `idem` binary `cargo install idem-cli` gives.
#[test]
fn the_idem_binary_runs() {
    let bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_idem_cli"));

    let dir = temp_dir("cli-bin");
    let path = dir.join("idem.sqlite3");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let reqs = runtime.block_on(async {
        let store = SqliteStore::open(&path).await.unwrap();
        fill(&store).await
    });
    let url = format!("sqlite:{}", path.display());
    let run = |args: &[&str]| {
        std::process::Command::new(&bin)
            .args(["--store", &url])
            .args(args)
            .output()
            .expect("idem runs")
    };
    let stats = run(&["--json", "stats"]);
    assert!(stats.status.success(), "{stats:?}");
    let stats: Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(stats["total"], json!(3));
    let reference = reqs[1].reference.to_string();
    let not_found = run(&["show", &reference, "--tenant", "nobody"]);
    assert_eq!(not_found.status.code(), Some(1), "{not_found:?}");
    let usage = run(&["resolve", &reference]);
    assert_eq!(usage.status.code(), Some(2), "{usage:?}");
}
