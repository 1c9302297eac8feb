//! The operator's command line, `idem` (feature `cli`): list, show, resolve
//! by hand, purge and count the records of a store; list follow-on jobs and
//! re-drive a dead one.
//!
//! One job, the command line: its commands, their tables and their JSON.
//!
//! ```text
//! idem --store URL [--schema NAME] list [--state unknown|in_progress|completed|not_performed] [--tenant T] [--tool X] [--limit N]
//! idem --store URL show REF [--tenant T] [--response]   (the record and its jobs)
//! idem --store URL resolve REF --tenant T (--completed VALUE_JSON | --completed-result RESULT_JSON | --not-performed) [--follow-on NAME=JSON]... --note "who and why"
//! idem --store URL purge
//! idem --store URL stats
//! idem --store URL jobs [--state waiting|running|dead|delivered | --dead] [--tenant T] [--reference REF] [--name N] [--limit N]
//! idem --store URL redrive REF NAME --tenant T
//! idem --store dynamodb://TABLE?region=R create-table   (DynamoDB: the table, its indexes, TTL)
//! ```
//!
//! `URL` is what [`open_store`] takes (`sqlite:PATH`, `postgres://…`,
//! `redis://…`, and `dynamodb://TABLE?region=…` when built with the
//! `dynamodb` feature); a SQLite file must exist, PostgreSQL must have been
//! migrated by the server, and a DynamoDB table must exist (`create-table`
//! makes it). `show` finds a reference in whichever tenant holds it;
//! `--tenant` is needed only when two tenants hold one (it says so). A PostgreSQL store in a schema other than
//! `public` (`PostgresStore::builder(url)?.schema("nc2")`) is read with
//! `--schema nc2` (or `?schema=nc2` on the URL). Output is an aligned table, or JSON with
//! `--json`. A table shows control characters and invisible ones escaped
//! (`\n`, `\u{1b}`), so a note or an error a far side wrote cannot add a
//! row or drive the terminal; JSON keeps every text exact. Responses are printed only by `show --response` (they may hold
//! personal data); records hold no arguments.
//!
//! Exit codes: [`EXIT_OK`] 0; [`EXIT_OPERATOR`] 1, the request was refused
//! (no such reference, the record is not UNKNOWN, the store holds something
//! invalid); [`EXIT_USAGE`] 2, the command line or the configuration is
//! wrong; [`EXIT_UNREACHABLE`] 3, the store did not answer (or is not
//! migrated).
//!
//! [`run`] is the whole program, with its output given, so tests run it in
//! process; the `idem` binary calls it.

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};

use crate::key::Reference;
use crate::maintenance::{purge, resolve_by_hand, Outcome, ResolveError};
use crate::mcp::stored_response;
use crate::store::{
    open_store, FollowOn, FollowOnStore, IdempotencyStore, JobFilter, JobId, JobState, Record,
    RecordFilter, RecordState, RecordStateKind, StoreError,
};
use crate::time::rfc3339;
use rmcp::handler::server::wrapper::Json;
use rmcp::model::CallToolResult;

mod escape;
mod render;

use escape::shown;
use render::{job_error, job_json, job_runs, job_when, json_text, record_json, state_label, table};

/// Done.
pub const EXIT_OK: u8 = 0;
/// Refused: no such reference, the record is not UNKNOWN, or the store
/// holds something invalid. Nothing was changed.
pub const EXIT_OPERATOR: u8 = 1;
/// The command line or the store's configuration is wrong; nothing was
/// tried.
pub const EXIT_USAGE: u8 = 2;
/// The store could not be reached, did not answer in time, or is not
/// migrated.
pub const EXIT_UNREACHABLE: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "idem",
    version,
    about = "Look after idem's idempotency records: list, show, resolve by hand, purge, count; \
             list follow-on jobs and re-drive dead ones",
    after_help = "Exit codes: 0 ok, 1 refused (not found, not UNKNOWN), 2 usage or \
                  configuration, 3 store unreachable or not migrated."
)]
struct Args {
    /// The store: sqlite:PATH, postgres://USER@HOST/DB, redis://HOST:PORT or
    /// dynamodb://TABLE?region=REGION (with the `dynamodb` feature).
    #[arg(long, value_name = "URL")]
    store: String,
    /// PostgreSQL: the schema that holds the store's tables, the one the
    /// servers name with PostgresStore's builder (`.schema(NAME)`); default
    /// public. The same as `?schema=NAME` on the URL.
    #[arg(long, global = true, value_name = "NAME")]
    schema: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The newest records first (by claim), filtered.
    List {
        /// Only records in this state (as stored: a lapsed call is
        /// IN_PROGRESS, shown as lapsed).
        #[arg(long)]
        state: Option<State>,
        /// Only this tenant's records.
        #[arg(long)]
        tenant: Option<String>,
        /// Only this tool's records.
        #[arg(long)]
        tool: Option<String>,
        /// The most records shown.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// One record, in full (its response only with --response), and its
    /// follow-on jobs: waiting, running, dead, or delivered and when.
    Show {
        /// The operation's reference (`idem_` and 32 hex digits, as the tool's answer gives it; the `idem_` may be left out).
        reference: String,
        /// The caller's tenant: needed only when two tenants hold the
        /// reference (the command says so); otherwise it is found.
        #[arg(long)]
        tenant: Option<String>,
        /// Print the stored response too (it may hold personal data).
        #[arg(long)]
        response: bool,
    },
    /// Resolve an UNKNOWN operation by hand, with a note saying who and why.
    #[command(group(
        clap::ArgGroup::new("outcome")
            .required(true)
            .args(["completed", "completed_result", "not_performed"])
    ))]
    Resolve {
        /// The operation's reference (`idem_` and 32 hex digits, as the tool's answer gives it; the `idem_` may be left out).
        reference: String,
        /// The caller's tenant.
        #[arg(long)]
        tenant: String,
        /// It happened, and the tool returned this value as its structured
        /// result (a JSON object, what a tool returning `Json<T>` gives):
        /// repeats replay it as that tool result.
        #[arg(long, value_name = "VALUE_JSON")]
        completed: Option<String>,
        /// It happened, and the tool returned this whole MCP tool result
        /// (`{"content": [...], "structuredContent": ..., "isError": ...}`),
        /// for a tool whose result is text or built by hand: repeats replay it.
        #[arg(long, value_name = "RESULT_JSON")]
        completed_result: Option<String>,
        /// It did not happen: the next identical call runs.
        #[arg(long)]
        not_performed: bool,
        /// A follow-on job the handler would have declared (the receipt
        /// that was never sent), written with the completion: its name, `=`,
        /// and its payload as JSON, e.g. `send_receipt={"to":"a@example.com"}`.
        /// Repeat it for several jobs; only with a completed outcome.
        #[arg(
            long = "follow-on",
            value_name = "NAME=JSON",
            conflicts_with = "not_performed"
        )]
        follow_on: Vec<String>,
        /// Who resolves it and why; the status tool shows it.
        #[arg(long)]
        note: String,
    },
    /// Delete every expired record.
    Purge {
        /// Records deleted per statement.
        #[arg(long, default_value_t = 250)]
        batch: usize,
    },
    /// How many records are in each state.
    Stats,
    /// Follow-on jobs waiting to run or running (or, with --state, those in
    /// one state: the dead letter, or what was delivered and when), the
    /// oldest first.
    Jobs {
        /// Only jobs in this state; without it, the jobs waiting or running.
        #[arg(long, value_enum, conflicts_with = "dead")]
        state: Option<JobStateArg>,
        /// Only jobs in the dead letter: `--state dead`.
        #[arg(long)]
        dead: bool,
        /// Only this tenant's jobs.
        #[arg(long)]
        tenant: Option<String>,
        /// Only the jobs of this operation (`idem_` and 32 hex digits, as the tool's answer gives it; the `idem_` may be left out).
        #[arg(long)]
        reference: Option<String>,
        /// Only jobs with this name.
        #[arg(long)]
        name: Option<String>,
        /// The most jobs shown.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// DynamoDB: create the table the store needs (its indexes, on-demand
    /// billing, TTL on), and wait until it is active; a table that exists is
    /// left as it is. Other stores need no such step: SQLite creates its
    /// file, and a PostgreSQL server migrates its database (`migrate()`).
    CreateTable,
    /// Take a job out of the dead letter: it runs again from its first attempt.
    Redrive {
        /// The operation's reference (`idem_` and 32 hex digits, as the tool's answer gives it; the `idem_` may be left out).
        reference: String,
        /// The job's name.
        name: String,
        /// The operation's tenant.
        #[arg(long)]
        tenant: String,
    },
}

/// A job's state as the command line spells it.
#[derive(Clone, Copy, Debug, ValueEnum)]
#[value(rename_all = "snake_case")]
enum JobStateArg {
    Waiting,
    Running,
    Dead,
    Delivered,
}

impl From<JobStateArg> for JobState {
    fn from(s: JobStateArg) -> Self {
        match s {
            JobStateArg::Waiting => JobState::Waiting,
            JobStateArg::Running => JobState::Running,
            JobStateArg::Dead => JobState::Dead,
            JobStateArg::Delivered => JobState::Delivered,
        }
    }
}

/// A state as the command line spells it.
#[derive(Clone, Copy, Debug, ValueEnum)]
#[value(rename_all = "snake_case")]
enum State {
    Unknown,
    InProgress,
    Completed,
    NotPerformed,
}

impl From<State> for RecordStateKind {
    fn from(s: State) -> Self {
        match s {
            State::Unknown => RecordStateKind::Unknown,
            State::InProgress => RecordStateKind::InProgress,
            State::Completed => RecordStateKind::Completed,
            State::NotPerformed => RecordStateKind::NotPerformed,
        }
    }
}

/// Why the program stops: the exit code and what to tell the operator.
struct Failure(u8, String);

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(_) => Failure(
                EXIT_UNREACHABLE,
                format!("{e}\ncheck the URL, that the store is up and reachable from here, and (PostgreSQL) that the server has migrated it"),
            ),
            StoreError::Config(_) | StoreError::Unsupported(_) => Failure(EXIT_USAGE, e.to_string()),
            e => Failure(EXIT_OPERATOR, e.to_string()),
        }
    }
}

impl From<ResolveError> for Failure {
    fn from(e: ResolveError) -> Self {
        match e {
            ResolveError::Store(e) => e.into(),
            ResolveError::EmptyNote | ResolveError::InvalidResponse(_) => {
                Failure(EXIT_USAGE, e.to_string())
            }
            e => Failure(EXIT_OPERATOR, e.to_string()),
        }
    }
}

/// Runs the command line `args` (the program's name first), writing its
/// answer to `out` and problems to `err`; returns the exit code.
pub async fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args = match Args::try_parse_from(args) {
        Ok(args) => args,
        Err(e) => {
            use clap::error::ErrorKind;
            let asked = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion);
            let text = e.render().to_string();
            return if asked {
                let _ = write!(out, "{text}");
                EXIT_OK
            } else {
                let _ = write!(err, "{text}");
                EXIT_USAGE
            };
        }
    };
    match execute(args, out).await {
        Ok(()) => EXIT_OK,
        Err(Failure(code, message)) => {
            let _ = writeln!(err, "idem: {message}");
            code
        }
    }
}

async fn open(url: &str, schema: Option<&str>) -> Result<Arc<dyn IdempotencyStore>, Failure> {
    if let Some(schema) = schema {
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(Failure(
                EXIT_USAGE,
                format!(
                    "--schema {schema:?} names a PostgreSQL schema, and {url:?} is not a \
                     PostgreSQL store; leave --schema out, or give the postgres:// URL"
                ),
            ));
        }
        if url.contains("?schema=") || url.contains("&schema=") {
            return Err(Failure(
                EXIT_USAGE,
                format!(
                    "{url:?} names a schema already; give it once, with --schema or with \
                     ?schema= on the URL"
                ),
            ));
        }
        let joiner = if url.contains('?') { '&' } else { '?' };
        return Ok(open_store(&format!("{url}{joiner}schema={schema}")).await?);
    }
    if url == "memory" {
        return Err(Failure(
            EXIT_USAGE,
            "a memory store lives inside its server's process; point --store at the \
             server's durable store (sqlite:PATH, postgres://…, redis://…)"
                .to_owned(),
        ));
    }
    // Opening a mistyped path would create an empty database, and every
    // answer from it would be wrong.
    if let Some(path) = url.strip_prefix("sqlite:") {
        if !Path::new(path).is_file() {
            return Err(Failure(
                EXIT_USAGE,
                format!("no SQLite database at {path:?}; give the path the server uses"),
            ));
        }
    }
    Ok(open_store(url).await?)
}

/// The store's follow-on jobs, or why there are none to show.
fn follow_ons(store: &dyn IdempotencyStore) -> Result<&dyn FollowOnStore, Failure> {
    store.follow_ons().ok_or_else(|| {
        Failure(
            EXIT_USAGE,
            format!(
                "the {} store keeps no follow-on jobs; point --store at the store your servers \
                 write their jobs to",
                store.backend()
            ),
        )
    })
}

fn parse_reference(text: &str) -> Result<Reference, Failure> {
    Reference::parse(text.trim()).ok_or_else(|| {
        Failure(
            EXIT_USAGE,
            format!(
                "{text:?} is not a reference: a reference is idem_ and 32 hex digits (16 for one written \
                 before references had tags), as the tool's answer gives it; the idem_ may be left out"
            ),
        )
    })
}

async fn execute(args: Args, out: &mut dyn Write) -> Result<(), Failure> {
    if let Command::CreateTable = args.command {
        return create_table(&args.store, args.json, out).await;
    }
    let store = open(&args.store, args.schema.as_deref()).await?;
    let store = &*store;
    let text = match args.command {
        Command::List {
            state,
            tenant,
            tool,
            limit,
        } => {
            let filter = RecordFilter {
                state: state.map(Into::into),
                tenant,
                tool,
                limit,
            };
            let records = store.list_records(&filter).await?;
            if args.json {
                json_text(&Value::Array(
                    records.iter().map(|r| record_json(r, false)).collect(),
                ))
            } else {
                let mut rows = vec![
                    ["REFERENCE", "TENANT", "TOOL", "STATE", "CLAIMED", "UPDATED"]
                        .map(str::to_owned)
                        .to_vec(),
                ];
                rows.extend(records.iter().map(|r| {
                    vec![
                        r.reference.to_string(),
                        r.tenant.clone(),
                        r.tool.clone(),
                        state_label(r),
                        rfc3339(r.claimed_at),
                        rfc3339(r.updated_at),
                    ]
                }));
                table(&rows)
            }
        }
        Command::Show {
            reference,
            tenant,
            response,
        } => {
            let reference = parse_reference(&reference)?;
            let record = match tenant {
                Some(tenant) => store.lookup(&tenant, &reference).await?.ok_or_else(|| {
                    Failure(
                        EXIT_OPERATOR,
                        format!(
                            "no operation with reference {reference} in tenant {tenant:?}; check \
                             both (without --tenant, every tenant is searched)"
                        ),
                    )
                })?,
                None => find_anywhere(store, &reference).await?,
            };
            let tenant = record.tenant.clone();
            // The operation's follow-on jobs: waiting, running, dead or
            // delivered (kept as long as the record).
            let jobs = match store.follow_ons() {
                Some(follow_ons) => {
                    follow_ons
                        .list_jobs(&JobFilter {
                            tenant: Some(tenant.clone()),
                            reference: Some(reference),
                            limit: 1000,
                            ..JobFilter::default()
                        })
                        .await?
                }
                None => Vec::new(),
            };
            if args.json {
                let mut value = record_json(&record, response);
                value["jobs"] = Value::Array(jobs.iter().map(job_json).collect());
                json_text(&value)
            } else {
                let value = record_json(&record, response);
                let rows: Vec<Vec<String>> = value
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| {
                        let shown = match v {
                            Value::String(s) => s.clone(),
                            v => v.to_string(),
                        };
                        vec![format!("{k}:"), shown]
                    })
                    .collect();
                let mut text = table(&rows);
                if !response && matches!(record.state, RecordState::Completed { .. }) {
                    text.push_str("(the response is not shown; --response prints it)\n");
                }
                if jobs.is_empty() {
                    text.push_str("jobs: none\n");
                } else {
                    let mut rows = vec![["JOB", "STATE", "RUNS", "WHEN", "LAST ERROR"]
                        .map(str::to_owned)
                        .to_vec()];
                    rows.extend(jobs.iter().map(|j| {
                        vec![
                            j.id.name.clone(),
                            j.state().as_str().to_owned(),
                            job_runs(j),
                            job_when(j),
                            job_error(j),
                        ]
                    }));
                    text.push_str(&table(&rows));
                }
                text
            }
        }
        Command::Resolve {
            reference,
            tenant,
            completed,
            completed_result,
            not_performed: _,
            follow_on,
            note,
        } => {
            let reference = parse_reference(&reference)?;
            let follow_ons = follow_on
                .iter()
                .map(|given| parse_follow_on(given))
                .collect::<Result<Vec<_>, _>>()?;
            for (i, job) in follow_ons.iter().enumerate() {
                if follow_ons[..i].iter().any(|j| j.name() == job.name()) {
                    return Err(Failure(
                        EXIT_USAGE,
                        format!(
                            "--follow-on names the job `{}` twice; an operation has one job \
                             of each name, so give each once; nothing was changed",
                            job.name()
                        ),
                    ));
                }
            }
            let names: Vec<String> = follow_ons.iter().map(|j| j.name().to_owned()).collect();
            let outcome = match (completed, completed_result) {
                (Some(value), _) => {
                    Outcome::completed_with(structured_response(&value)?, follow_ons)
                }
                (None, Some(result)) => {
                    Outcome::completed_with(whole_response(&result)?, follow_ons)
                }
                (None, None) if !follow_ons.is_empty() => {
                    return Err(Failure(
                        EXIT_USAGE,
                        "--follow-on jobs follow only a completed operation: resolve it with \
                         --completed or --completed-result, or give no --follow-on; nothing \
                         was changed"
                            .to_owned(),
                    ))
                }
                (None, None) => Outcome::NotPerformed,
            };
            let record = resolve_by_hand(store, &tenant, &reference, &outcome, &note).await?;
            if args.json {
                let mut value = record_json(&record, false);
                value["follow_ons"] = json!(names);
                json_text(&value)
            } else {
                let mut text = format!(
                    "resolved {reference} in tenant {tenant:?}: {} ({})\n",
                    record.state.name(),
                    shown(record.resolution.as_deref().unwrap_or_default())
                );
                if !names.is_empty() {
                    text.push_str(&format!(
                        "follow-on jobs written with it: {}\n",
                        names.join(", ")
                    ));
                }
                text
            }
        }
        Command::Purge { batch } => {
            let purged = purge(store, batch).await?;
            if args.json {
                json_text(&json!({ "purged": purged }))
            } else {
                format!("purged {purged} expired records\n")
            }
        }
        Command::Stats => {
            let counts = store.count_records().await?;
            if args.json {
                let mut by_state = serde_json::Map::new();
                for kind in RecordStateKind::ALL {
                    by_state.insert(kind.as_str().to_owned(), counts.get(kind).into());
                }
                by_state.insert("total".to_owned(), counts.total().into());
                json_text(&Value::Object(by_state))
            } else {
                let mut rows = vec![vec!["STATE".to_owned(), "RECORDS".to_owned()]];
                for kind in RecordStateKind::ALL {
                    rows.push(vec![kind.as_str().to_owned(), counts.get(kind).to_string()]);
                }
                rows.push(vec!["total".to_owned(), counts.total().to_string()]);
                table(&rows)
            }
        }
        Command::Jobs {
            state,
            dead,
            tenant,
            reference,
            name,
            limit,
        } => {
            let filter = JobFilter {
                tenant,
                reference: reference.as_deref().map(parse_reference).transpose()?,
                name,
                states: match (state, dead) {
                    (Some(state), _) => vec![state.into()],
                    (None, true) => vec![JobState::Dead],
                    (None, false) => vec![JobState::Waiting, JobState::Running],
                },
                limit,
            };
            let jobs = follow_ons(store)?.list_jobs(&filter).await?;
            if args.json {
                json_text(&Value::Array(jobs.iter().map(job_json).collect()))
            } else {
                let mut rows = vec![[
                    "REFERENCE",
                    "NAME",
                    "TENANT",
                    "STATE",
                    "RUNS",
                    "WHEN",
                    "LAST ERROR",
                ]
                .map(str::to_owned)
                .to_vec()];
                rows.extend(jobs.iter().map(|j| {
                    vec![
                        j.id.reference.to_string(),
                        j.id.name.clone(),
                        j.id.tenant.clone(),
                        j.state().as_str().to_owned(),
                        job_runs(j),
                        job_when(j),
                        job_error(j),
                    ]
                }));
                table(&rows)
            }
        }
        Command::CreateTable => unreachable!("answered before the store is opened"),
        Command::Redrive {
            reference,
            name,
            tenant,
        } => {
            let id = JobId {
                reference: parse_reference(&reference)?,
                name,
                tenant,
            };
            if !follow_ons(store)?.redrive_job(&id).await? {
                return Err(Failure(
                    EXIT_OPERATOR,
                    format!(
                        "no dead job {} in tenant {:?}; `idem jobs --state dead` lists them",
                        id, id.tenant
                    ),
                ));
            }
            if args.json {
                json_text(&json!({ "redriven": id.to_string(), "tenant": id.tenant }))
            } else {
                format!(
                    "re-drove {id} in tenant {:?}: it runs again from its first attempt\n",
                    id.tenant
                )
            }
        }
    };
    out.write_all(text.as_bytes())
        .map_err(|e| Failure(EXIT_USAGE, format!("cannot write the output: {e}")))
}

/// One `--follow-on NAME=JSON`: the job, or why it is refused.
fn parse_follow_on(given: &str) -> Result<FollowOn, Failure> {
    let usage = |problem: String| Failure(EXIT_USAGE, format!("{problem}; nothing was changed"));
    let (name, payload) = given.split_once('=').ok_or_else(|| {
        usage(format!(
            "--follow-on {given:?} is not NAME=JSON: write the job's name, `=`, and its \
             payload as JSON, e.g. --follow-on 'send_receipt={{\"to\":\"a@example.com\"}}'"
        ))
    })?;
    let payload: Value = serde_json::from_str(payload).map_err(|e| {
        usage(format!(
            "--follow-on {given:?}: the payload after `=` is not JSON ({e}); quote it for \
             the shell, e.g. --follow-on '{name}={{\"to\":\"a@example.com\"}}'"
        ))
    })?;
    FollowOn::new(name, &payload).map_err(|e| usage(format!("--follow-on {given:?}: {e}")))
}

/// What a tool that returned `text` (`--completed`: its structured result,
/// a JSON object) would have stored: the tool result `Json(value)` makes,
/// as [`stored_response`] writes it. A whole tool result given here is
/// refused, as is anything that is not a JSON object: either would replay
/// something the tool never returned.
fn structured_response(text: &str) -> Result<String, Failure> {
    let usage = |problem: String| {
        Failure(
            EXIT_USAGE,
            format!(
                "--completed {text:?} {problem}; nothing was changed. --completed takes the \
                 value the tool returned as its structured result, a JSON object such as \
                 '{{\"charge_id\":\"ch_42\"}}'; a tool whose result is text, or a whole \
                 tool result, goes in --completed-result '{{\"content\":[{{\"type\":\"text\",\
                 \"text\":\"...\"}}]}}'"
            ),
        )
    };
    let value: Value =
        serde_json::from_str(text).map_err(|e| usage(format!("is not JSON ({e})")))?;
    if !value.is_object() {
        return Err(usage("is not a JSON object".to_owned()));
    }
    if serde_json::from_value::<CallToolResult>(value.clone()).is_ok() {
        return Err(usage(
            "is a whole tool result (it has content, structuredContent or isError), not the \
             tool's structured value; to store it as given, pass it with --completed-result"
                .to_owned(),
        ));
    }
    stored_response(Json(value)).map_err(|e| usage(format!("cannot be stored ({e})")))
}

/// What a tool that returned the whole tool result `text`
/// (`--completed-result`) would have stored, as [`stored_response`] writes
/// it; refused unless MCP reads it as a tool result.
fn whole_response(text: &str) -> Result<String, Failure> {
    let usage = |problem: String| {
        Failure(
            EXIT_USAGE,
            format!(
                "--completed-result {text:?} {problem}; nothing was changed. Give the whole \
                 MCP tool result, e.g. '{{\"content\":[{{\"type\":\"text\",\"text\":\
                 \"charged ch_42\"}}]}}', or the tool's structured value with --completed"
            ),
        )
    };
    let result: CallToolResult =
        serde_json::from_str(text).map_err(|e| usage(format!("is not a tool result ({e})")))?;
    stored_response(result).map_err(|e| usage(format!("cannot be stored ({e})")))
}

/// The record with `reference` in whichever tenant holds it; refused when
/// none does, or when several do (then `--tenant` says which).
async fn find_anywhere(
    store: &dyn IdempotencyStore,
    reference: &Reference,
) -> Result<Record, Failure> {
    let mut found = store.find_by_reference(reference).await?;
    match found.len() {
        0 => Err(Failure(
            EXIT_OPERATOR,
            format!("no operation with reference {reference} in any tenant; check the reference"),
        )),
        1 => Ok(found.remove(0)),
        _ => {
            let mut tenants: Vec<&str> = found.iter().map(|r| r.tenant.as_str()).collect();
            tenants.sort_unstable();
            tenants.dedup();
            Err(Failure(
                EXIT_USAGE,
                format!(
                    "the reference {reference} is held by {} tenants ({}); say which with \
                     --tenant",
                    tenants.len(),
                    tenants
                        .iter()
                        .map(|t| format!("{:?}", shown(t)))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ))
        }
    }
}

/// `create-table`: the DynamoDB table `url` names, created with its
/// indexes and TTL (left as it is when it exists), through `open_store`'s
/// `create=true`.
async fn create_table(url: &str, json: bool, out: &mut dyn Write) -> Result<(), Failure> {
    let Some(rest) = url.strip_prefix("dynamodb://") else {
        return Err(Failure(
            EXIT_USAGE,
            format!(
                "create-table makes a DynamoDB table, and {url:?} is not a dynamodb:// URL; a \
                 SQLite file is created by the server that opens it, and a PostgreSQL database \
                 is migrated by the server (PostgresStore::migrate)"
            ),
        ));
    };
    let table = rest.split(['?', '/']).next().unwrap_or_default().to_owned();
    let joiner = if url.contains('?') { '&' } else { '?' };
    let url = if url.contains("create=") {
        url.to_owned()
    } else {
        format!("{url}{joiner}create=true")
    };
    open_store(&url).await?;
    let text = if json {
        json_text(&json!({ "table": table, "active": true }))
    } else {
        format!(
            "the DynamoDB table {:?} exists and is active, with its indexes and TTL\n",
            shown(&table)
        )
    };
    out.write_all(text.as_bytes())
        .map_err(|e| Failure(EXIT_USAGE, format!("cannot write the output: {e}")))
}
