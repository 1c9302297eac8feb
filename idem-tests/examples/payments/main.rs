//! An MCP server whose `charge_card` and `create_shipment` tools are safe to
//! repeat, on a simulated processor and carrier.
//!
//! ```text
//! cargo run --example payments -- [FLAGS]
//!
//!   --transport stdio|http        stdio (default) or streamable HTTP
//!   --listen 127.0.0.1:PORT       HTTP address (default 127.0.0.1:8080); serves /mcp, and
//!                                 Prometheus metrics at /metrics (no token needed)
//!   --token TOKEN=tenant/subject  HTTP: a bearer token and the caller it stands for (repeatable)
//!   --tenant T --subject S        stdio: the local caller (default local/me)
//!   --store memory|sqlite:PATH|postgres://...|redis://...|dynamodb://...
//!                                 default: sqlite:$IDEM_HOME/payments.sqlite3, where IDEM_HOME
//!                                 defaults to ./.idem; redis://HOST:PORT[/DB] is one Redis or
//!                                 Valkey server, keys under the prefix "idem";
//!                                 dynamodb://TABLE?region=R[&endpoint=URL] is a DynamoDB table,
//!                                 created if absent (credentials from AWS_ACCESS_KEY_ID and
//!                                 AWS_SECRET_ACCESS_KEY)
//!   --processor-delay-ms N        how long the stub processor takes (default 300)
//!   --processor-timeout-ms N      how long the tool waits for it (default 5000)
//!   --lease-ms N                  how long a claim holds without a heartbeat (default 30000);
//!                                 a dead process's call reads as outcome unknown after it
//!   --background-completions      answer when the tool returns and write its completion after
//!                                 (Executor::with_background_completions; default off)
//!   --maintenance-interval-ms N   time between maintenance rounds: sweep, reconcile, purge
//!                                 (default 10000)
//!   --settle-ms N                 how long an outcome-unknown record must be unchanged before
//!                                 the processor's "not performed" is trusted (default 300000;
//!                                 never less than --processor-timeout-ms)
//!   --reconcile-backoff-ms N      the pause before a record the processor could not resolve
//!                                 yet is asked about again; doubles each time, up to 1 h
//!                                 (default 30000)
//!   --reconciler on|off           off: no reconciler asks the processor, so an unknown
//!                                 outcome waits for an operator's `idem resolve`, and the
//!                                 answers say so (default on)
//!   --follow-on-interval-ms N     time between the dispatcher's rounds when it is idle (default 1000)
//!   --follow-on-backoff-ms N      the pause after a follow-on's first failure; doubles
//!                                 with each further one, with jitter (default 1000)
//!   --mailer-failures N           the stub mailer fails its first N requests (default 0)
//!   --processor-url URL           charge at this processor service (src/bin/farside.rs) instead
//!                                 of the in-process stub; --processor-delay-ms is then its own
//!   --mailer-url URL              mail receipts through this mailer service instead of the
//!                                 in-process stub
//! ```

mod shop;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use idem_runtime::{
    audit_hints,
    follow_ons::{FollowOnConfig, FollowOnDispatcher},
    maintenance::{Maintenance, MaintenanceConfig, ReconcileConfig},
    Caller, Executor, IdempotencyStore,
};
use rmcp::ServiceExt;
use shop::{Backends, Payments, ProcessorReconciler};

const USAGE: &str = "\
usage: payments [FLAGS]
  --transport stdio|http        stdio (default) or streamable HTTP
  --listen 127.0.0.1:PORT       HTTP address (default 127.0.0.1:8080); serves /mcp, and
                                Prometheus metrics at /metrics (no token needed)
  --token TOKEN=tenant/subject  HTTP: a bearer token and the caller it stands for (repeatable)
  --tenant T --subject S        stdio: the local caller (default local/me)
  --store memory|sqlite:PATH|postgres://...|redis://...|dynamodb://...
                                default: sqlite:$IDEM_HOME/payments.sqlite3 (IDEM_HOME defaults to .idem);
                                redis://HOST:PORT[/DB] is one Redis or Valkey server, keys under
                                the prefix \"idem\"; dynamodb://TABLE?region=R[&endpoint=URL] is a
                                DynamoDB table, created if absent (credentials from
                                AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)
  --processor-delay-ms N        how long the stub processor takes (default 300)
  --processor-timeout-ms N      how long the tool waits for it (default 5000)
  --lease-ms N                  how long a claim holds without a heartbeat (default 30000);
                                a dead process's call reads as outcome unknown after it
  --background-completions      answer when the tool returns and write its completion after
                                (default off)
  --maintenance-interval-ms N   time between maintenance rounds: sweep, reconcile, purge
                                (default 10000)
  --settle-ms N                 how long an outcome-unknown record must be unchanged before
                                the processor's \"not performed\" is trusted (default 300000;
                                never less than --processor-timeout-ms: a charge still in
                                flight may not show at the processor yet)
  --reconcile-backoff-ms N      the pause before a record the processor could not resolve
                                yet is asked about again; doubles each time, up to 1 h
                                (default 30000)
  --reconciler on|off           off: no reconciler asks the processor, so an unknown
                                outcome waits for an operator's `idem resolve`, and the
                                answers say so (default on)
  --follow-on-interval-ms N     time between the dispatcher's rounds when it is idle (default 1000)
  --follow-on-backoff-ms N      the pause after a follow-on's first failure; doubles
                                with each further one, with jitter (default 1000)
  --mailer-failures N           the stub mailer fails its first N requests (default 0)
  --processor-url URL           charge at this processor service (src/bin/farside.rs) instead
                                of the in-process stub; --processor-delay-ms is then its own
  --mailer-url URL              mail receipts through this mailer service instead of the
                                in-process stub";

#[derive(Debug)]
struct Flags {
    transport: String,
    listen: SocketAddr,
    tokens: Vec<(String, Caller)>,
    tenant: String,
    subject: String,
    store: String,
    processor_delay: Duration,
    processor_timeout: Duration,
    lease: Duration,
    background_completions: bool,
    maintenance_interval: Duration,
    settle: Duration,
    reconcile_backoff: Duration,
    reconciler: bool,
    follow_on_interval: Duration,
    follow_on_backoff: Duration,
    mailer_failures: u32,
    processor_url: Option<String>,
    mailer_url: Option<String>,
}

fn usage(problem: &str) -> ! {
    eprintln!("payments: {problem}");
    eprintln!("run `cargo run --example payments -- --help` for the flags");
    std::process::exit(2)
}

fn default_store() -> String {
    let home = std::env::var_os("IDEM_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(".idem"));
    format!("sqlite:{}", home.join("payments.sqlite3").display())
}

fn parse_flags() -> Flags {
    let mut flags = Flags {
        transport: "stdio".into(),
        listen: "127.0.0.1:8080".parse().unwrap(),
        tokens: Vec::new(),
        tenant: "local".into(),
        subject: "me".into(),
        store: default_store(),
        processor_delay: Duration::from_millis(300),
        processor_timeout: Duration::from_millis(5000),
        lease: idem_runtime::executor::DEFAULT_LEASE,
        background_completions: false,
        maintenance_interval: Duration::from_millis(10_000),
        settle: ReconcileConfig::default().settle,
        reconcile_backoff: ReconcileConfig::default().first_backoff,
        reconciler: true,
        follow_on_interval: FollowOnConfig::default().interval,
        follow_on_backoff: FollowOnConfig::default().first_backoff,
        mailer_failures: 0,
        processor_url: None,
        mailer_url: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        let millis = |v: String| {
            v.parse::<u64>()
                .map(Duration::from_millis)
                .unwrap_or_else(|_| usage(&format!("{flag} takes milliseconds, not {v:?}")))
        };
        match flag.as_str() {
            "--transport" => flags.transport = value(),
            "--listen" => {
                let v = value();
                flags.listen = v
                    .parse()
                    .unwrap_or_else(|_| usage(&format!("--listen takes HOST:PORT, not {v:?}")));
            }
            "--token" => {
                let v = value();
                let parsed = v.split_once('=').and_then(|(token, who)| {
                    let (tenant, subject) = who.split_once('/')?;
                    (!token.is_empty() && !tenant.is_empty() && !subject.is_empty())
                        .then(|| (token.to_owned(), Caller::new(tenant, subject)))
                });
                flags.tokens.push(parsed.unwrap_or_else(|| {
                    usage(&format!("--token takes TOKEN=tenant/subject, not {v:?}"))
                }));
            }
            "--tenant" => flags.tenant = value(),
            "--subject" => flags.subject = value(),
            "--store" => flags.store = value(),
            "--processor-delay-ms" => flags.processor_delay = millis(value()),
            "--processor-timeout-ms" => flags.processor_timeout = millis(value()),
            "--lease-ms" => flags.lease = millis(value()),
            "--background-completions" => flags.background_completions = true,
            "--maintenance-interval-ms" => flags.maintenance_interval = millis(value()),
            "--settle-ms" => flags.settle = millis(value()),
            "--reconcile-backoff-ms" => flags.reconcile_backoff = millis(value()),
            "--reconciler" => {
                let v = value();
                flags.reconciler = match v.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => usage(&format!("--reconciler is on or off, not {v:?}")),
                };
            }
            "--follow-on-interval-ms" => flags.follow_on_interval = millis(value()),
            "--follow-on-backoff-ms" => flags.follow_on_backoff = millis(value()),
            "--mailer-failures" => {
                let v = value();
                flags.mailer_failures = v.parse().unwrap_or_else(|_| {
                    usage(&format!("--mailer-failures takes a count, not {v:?}"))
                });
            }
            "--processor-url" => flags.processor_url = Some(value()),
            "--mailer-url" => flags.mailer_url = Some(value()),
            other => usage(&format!("unknown flag {other:?}")),
        }
    }
    if !matches!(flags.transport.as_str(), "stdio" | "http") {
        usage(&format!(
            "--transport is stdio or http, not {:?}",
            flags.transport
        ));
    }
    if flags.maintenance_interval.is_zero() {
        usage("--maintenance-interval-ms must be at least 1");
    }
    if flags.follow_on_interval.is_zero() {
        usage("--follow-on-interval-ms must be at least 1");
    }
    // A charge the tool stopped waiting for may still be in flight at the
    // processor: "not performed" is no proof before the timeout has passed.
    if flags.settle < flags.processor_timeout {
        eprintln!(
            "payments: --settle-ms {} is less than --processor-timeout-ms {}; settling for {} ms",
            flags.settle.as_millis(),
            flags.processor_timeout.as_millis(),
            flags.processor_timeout.as_millis()
        );
        flags.settle = flags.processor_timeout;
    }
    flags
}

/// The store `--store` names, opened by the library's `open_store` (the same
/// URLs the `idem` command line reads), created or migrated on the first run:
/// a SQLite file's directory is made, a PostgreSQL schema migrated
/// (`migrate=true`), a DynamoDB table created (`create=true`).
async fn open_store(spec: &str) -> Arc<dyn IdempotencyStore> {
    let with = |param: &str| {
        let sep = if spec.contains('?') { '&' } else { '?' };
        format!("{spec}{sep}{param}")
    };
    let url = if let Some(path) = spec.strip_prefix("sqlite:") {
        let path = PathBuf::from(path);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Err(e) = std::fs::create_dir_all(dir) {
                usage(&format!("cannot create {}: {e}", dir.display()));
            }
        }
        spec.to_owned()
    } else if spec.starts_with("postgres://") || spec.starts_with("postgresql://") {
        with("migrate=true")
    } else if spec.starts_with("dynamodb://") {
        with("create=true")
    } else if spec == "memory" || spec.starts_with("redis://") || spec.starts_with("redis+unix://")
    {
        spec.to_owned()
    } else {
        usage(&format!(
            "--store is memory, sqlite:PATH, postgres://..., redis://... or \
             dynamodb://TABLE?region=REGION, not {spec:?}"
        ))
    };
    idem_runtime::open_store(&url).await.unwrap_or_else(|e| {
        eprintln!("payments: cannot open the store {spec:?}: {e}");
        std::process::exit(1)
    })
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let flags = parse_flags();
    // idem emits through the `metrics` facade; this recorder keeps the values
    // for /metrics to render (no listener of the exporter's own).
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .unwrap_or_else(|e| {
            eprintln!("payments: cannot install the metrics recorder: {e}");
            std::process::exit(1)
        });
    let upkeep = metrics.clone();
    tokio::spawn(async move {
        // Drains the histograms' buckets; the exporter leaves the pace to us.
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });

    // Refuse to start if any tool claims a hint no wrapper backs.
    if let Err(problems) = audit_hints(&Payments::router()) {
        for p in problems {
            eprintln!("payments: {p}");
        }
        std::process::exit(1);
    }

    let store = open_store(&flags.store).await;
    let backends = Backends::new(flags.processor_delay)
        .with_services(flags.processor_url.clone(), flags.mailer_url.clone());
    backends.set_mailer_failures(flags.mailer_failures);
    // The follow-ons (receipts, warehouse notices), delivered at least
    // once. Every store idem ships keeps them; `spawn` refuses a store that
    // does not, so the tools never declare a follow-on nothing would run.
    let dispatcher = FollowOnDispatcher::spawn(
        store.clone(),
        backends.job_handlers(),
        FollowOnConfig::default()
            .with_interval(flags.follow_on_interval)
            .with_first_backoff(flags.follow_on_backoff),
    )
    .unwrap_or_else(|e| {
        eprintln!("payments: the follow-on dispatcher cannot run on this store: {e}");
        std::process::exit(2)
    });
    // Without a reconciler, maintenance warns at start, and the answers
    // name `idem resolve` instead of promising one.
    let mut config = MaintenanceConfig::default()
        .with_interval(flags.maintenance_interval)
        .with_reconcile(
            ReconcileConfig::default()
                .with_settle(flags.settle)
                .with_first_backoff(flags.reconcile_backoff),
        );
    if flags.reconciler {
        config = config.with_reconciler(Arc::new(ProcessorReconciler {
            backends: backends.clone(),
        }));
    }
    let maintenance = Maintenance::spawn(store.clone(), config);
    // The answers about an unknown outcome say who resolves it: the
    // reconciler above, or an operator.
    let executor = Executor::new(store)
        .with_resolver(maintenance.resolver())
        .with_lease(flags.lease)
        .with_background_completions(flags.background_completions);
    let pending = executor.clone();

    match flags.transport.as_str() {
        "stdio" => {
            let caller = Caller::new(flags.tenant.clone(), flags.subject.clone());
            let server = Payments::new(executor, Some(caller), backends, flags.processor_timeout);
            let running = server
                .serve(rmcp::transport::stdio())
                .await
                .unwrap_or_else(|e| {
                    eprintln!("payments: cannot start on stdio: {e}");
                    std::process::exit(1)
                });
            let _ = running.waiting().await;
        }
        _ => {
            if flags.tokens.is_empty() {
                eprintln!("payments: warning: no --token given; every HTTP request will get 401");
            }
            let server = Payments::new(executor, None, backends, flags.processor_timeout);
            if let Err(e) = http::serve(flags.listen, flags.tokens, server, metrics).await {
                eprintln!("payments: HTTP server on {} failed: {e}", flags.listen);
                std::process::exit(1);
            }
        }
    }
    // Completions still being written in the background land before the
    // process ends (a deploy then loses none).
    let left = pending.drain(Duration::from_secs(10)).await;
    if left > 0 {
        eprintln!("payments: {left} completion(s) not written; the sweep and the reconciler will resolve them");
    }
    maintenance.stop().await;
    dispatcher.stop().await;
}

mod http {
    //! Streamable HTTP at `/mcp`, behind a bearer-token layer that turns the
    //! token into the request's `Caller`; Prometheus metrics at `/metrics`,
    //! outside that layer: a scraper needs no caller's token, and the metrics
    //! hold tool names and counts, never arguments, tenants or references.

    use std::collections::HashMap;
    use std::net::SocketAddr;
    use std::sync::Arc;

    use axum::extract::{Request, State};
    use axum::http::{header, StatusCode};
    use axum::middleware::{self, Next};
    use axum::response::{IntoResponse, Response};
    use idem_runtime::Caller;
    use rmcp::transport::streamable_http_server::{
        session::local::LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
    };

    use crate::shop::Payments;

    type Tokens = Arc<HashMap<String, Caller>>;

    /// A missing or unknown token is answered 401 here, before rmcp sees the
    /// request: nothing runs.
    async fn authenticate(State(tokens): State<Tokens>, mut req: Request, next: Next) -> Response {
        let caller = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .and_then(|token| tokens.get(token.trim()))
            .cloned();
        match caller {
            Some(caller) => {
                // rmcp hands the request's parts, extensions included, to the
                // tool: that is where #[idempotent] finds the caller.
                req.extensions_mut().insert(caller);
                next.run(req).await
            }
            None => (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "missing or unknown bearer token; send Authorization: Bearer <token>\n",
            )
                .into_response(),
        }
    }

    pub(crate) async fn serve(
        listen: SocketAddr,
        tokens: Vec<(String, Caller)>,
        server: Payments,
        metrics: metrics_exporter_prometheus::PrometheusHandle,
    ) -> std::io::Result<()> {
        let tokens: Tokens = Arc::new(tokens.into_iter().collect());
        let service = StreamableHttpService::new(
            move || Ok(server.clone()),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default(),
        );
        let app = axum::Router::new()
            .nest_service("/mcp", service)
            .layer(middleware::from_fn_with_state(tokens, authenticate))
            // Added after the layer, so the token check does not cover it.
            .route(
                "/metrics",
                axum::routing::get(move || async move { metrics.render() }),
            );
        let listener = tokio::net::TcpListener::bind(listen).await?;
        eprintln!(
            "payments: serving MCP on http://{}/mcp",
            listener.local_addr()?
        );
        axum::serve(listener, app).await
    }
}
