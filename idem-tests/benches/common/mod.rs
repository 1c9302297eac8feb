//! What the store benches share: requests and latency statistics.
#![allow(dead_code)]

use std::time::Duration;

use idem_runtime::store::ClaimRequest;
use idem_runtime::{
    answer::Answer,
    executor::{Operation, ScopeSpec},
    Caller, Executor, ToolError,
};

/// A claim of a fresh random key, as the executor would make it.
pub fn request() -> ClaimRequest {
    ClaimRequest {
        retention: Duration::from_secs(48 * 3600),
        ..idem_runtime::store::conformance::claim_request(Duration::from_secs(900))
    }
}

/// A typical small response.
pub const RESPONSE: &str =
    r#"{"charge_id":"ch_3f9a0c1d2e4b5a69","amount_cents":1999,"status":"succeeded"}"#;

/// Median and p99 of a sample, in microseconds.
pub fn median_p99(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1e6
    };
    (at(0.5), at(0.99))
}

/// The machine's load average, printed beside the figures: this is a shared
/// 2-core machine, and a busy one shifts every number.
pub fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// CPU seconds used so far: by this process (user and system, its
/// threads included), and by the whole machine (every CPU's user, nice,
/// system, irq and softirq time, from `/proc/stat`). Their differences
/// around a measurement split its CPU between the client (this process)
/// and the servers it talks to on the same machine.
pub fn cpu_seconds() -> (f64, f64) {
    // SAFETY: getrusage fills the struct it is given; a zeroed rusage is
    // a valid value of it.
    let own = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let process = secs(own.ru_utime) + secs(own.ru_stime);
    // SAFETY: sysconf only reads a configuration value.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let busy: f64 = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .enumerate()
        // user, nice, system, (idle, iowait), irq, softirq
        .filter(|(i, _)| matches!(i, 0 | 1 | 2 | 5 | 6))
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum();
    (process, busy / ticks)
}

/// The arguments of a benchmarked charge: a fresh `amount_cents` makes a
/// new operation, the same one a repeat.
#[derive(serde::Serialize)]
struct ChargeArgs {
    card: &'static str,
    amount_cents: u64,
}

/// One charge of `amount_cents` through `exec` (a 15-minute window), with a
/// no-op handler that answers [`RESPONSE`].
pub async fn charge(
    exec: &Executor,
    caller: &Caller,
    amount_cents: u64,
) -> Answer<String, ToolError> {
    let args = ChargeArgs {
        card: "4242424242424242",
        amount_cents,
    };
    let op = Operation {
        caller,
        tool: "charge_card",
        args: &args,
        scope: ScopeSpec::Window(Duration::from_secs(900)),
        status_tool: "get_operation_status",
    };
    exec.run(op, |_| async { Ok::<_, ToolError>(RESPONSE.to_owned()) })
        .await
}

/// Runs `text` on a PostgreSQL connection of its own (set-up and
/// measurement SQL: the store's connections carry a statement timeout that
/// a bulk insert exceeds); its rows.
pub async fn sql(url: &str, text: &str) -> Vec<tokio_postgres::Row> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client.query(text, &[]).await.unwrap()
}
