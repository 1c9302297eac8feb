//! The command line as clap reads it: the global options, the commands and
//! each command's arguments, and a reference as the operator writes it.

use clap::{Parser, Subcommand, ValueEnum};

use crate::{Failure, EXIT_USAGE};
use idem_runtime::store::{FollowOnState, RecordStateKind};
use idem_runtime::Reference;

#[derive(Debug, Parser)]
#[command(
    name = "idem",
    version,
    about = "Look after idem's idempotency records: list, show, resolve by hand, purge, count; \
             list follow-ons and re-drive dead ones",
    after_help = "Exit codes: 0 ok, 1 refused (not found, not UNKNOWN), 2 usage or \
                  configuration (a store not migrated included: run `idem migrate`), 3 store \
                  unreachable."
)]
pub(super) struct Args {
    /// The store: sqlite:PATH, postgres://USER@HOST/DB, redis://HOST:PORT or
    /// dynamodb://TABLE?region=REGION (with the `dynamodb` feature).
    #[arg(long, value_name = "URL")]
    pub(super) store: String,
    /// PostgreSQL: the schema that holds the store's tables, the one the
    /// servers name with PostgresStore's builder (`.schema(NAME)`); default
    /// public. The same as `?schema=NAME` on the URL.
    #[arg(long, global = true, value_name = "NAME")]
    pub(super) schema: Option<String>,
    /// Print JSON instead of a table.
    #[arg(long, global = true)]
    pub(super) json: bool,
    #[command(subcommand)]
    pub(super) command: Command,
}

/// The commands, each run by one function (see `execute`).
#[derive(Debug, Subcommand)]
pub(super) enum Command {
    /// The newest records first (by claim), filtered.
    List(List),
    /// One record, in full (its response only with --response), and its
    /// follow-ons: waiting, running, dead, or delivered and when.
    Show(Show),
    /// Resolve an UNKNOWN operation by hand, with a note saying who and why.
    Resolve(Resolve),
    /// Delete every expired record.
    Purge(Purge),
    /// How many records are in each state.
    Stats,
    /// Follow-ons waiting to run or running (or, with --state, those in
    /// one state: the dead letter, or what was delivered and when), the
    /// oldest first.
    // `jobs`, its name in 0.1.0, still runs it (hidden) for existing scripts.
    #[command(alias = "jobs")]
    FollowOns(FollowOns),
    /// DynamoDB: create the table the store needs (its indexes, on-demand
    /// billing, TTL on), and wait until it is active; a table that exists is
    /// left as it is. The same as `migrate` on a DynamoDB store.
    CreateTable,
    /// Take a follow-on out of the dead letter: it runs again from its first attempt.
    Redrive(Redrive),
    /// Apply this version's migrations to the store, the one command that
    /// changes its layout: SQLite's file and a PostgreSQL schema get the
    /// shipped migrations they lack (the file is created if absent),
    /// Redis this version's function library, and a DynamoDB table is
    /// created or migrated as by create-table. Run it before this
    /// version's replicas start; the version before keeps serving the
    /// store meanwhile. Several at once all succeed.
    Migrate,
}

/// The arguments of `list`.
#[derive(Debug, clap::Args)]
pub(super) struct List {
    /// Only records in this state (as stored: a lapsed call is
    /// IN_PROGRESS, shown as lapsed).
    #[arg(long)]
    pub(super) state: Option<State>,
    /// Only this tenant's records.
    #[arg(long)]
    pub(super) tenant: Option<String>,
    /// Only this tool's records.
    #[arg(long)]
    pub(super) tool: Option<String>,
    /// The most records shown.
    #[arg(long, default_value_t = 50)]
    pub(super) limit: usize,
}

/// The arguments of `show`.
#[derive(Debug, clap::Args)]
pub(super) struct Show {
    /// The operation's reference (`idem_` and 32 hex digits, as the tool's answer gives it; the `idem_` may be left out).
    pub(super) reference: String,
    /// The caller's tenant: needed only when two tenants hold the
    /// reference (the command says so); otherwise it is found.
    #[arg(long)]
    pub(super) tenant: Option<String>,
    /// Print the stored response too (it may hold personal data).
    #[arg(long)]
    pub(super) response: bool,
}

/// The arguments of `resolve`: exactly one outcome.
#[derive(Debug, clap::Args)]
#[command(group(
    clap::ArgGroup::new("outcome")
        .required(true)
        .args(["completed", "completed_result", "not_performed"])
))]
pub(super) struct Resolve {
    /// The operation's reference (`idem_` and 32 hex digits, as the tool's answer gives it; the `idem_` may be left out).
    pub(super) reference: String,
    /// The caller's tenant.
    #[arg(long)]
    pub(super) tenant: String,
    /// It happened, and the tool returned this value as its structured
    /// result (a JSON object, what a tool returning `Json<T>` gives):
    /// repeats replay it as that tool result.
    #[arg(long, value_name = "VALUE_JSON")]
    pub(super) completed: Option<String>,
    /// It happened, and the tool returned this whole MCP tool result
    /// (`{"content": [...], "structuredContent": ..., "isError": ...}`),
    /// for a tool whose result is text or built by hand: repeats replay it.
    #[arg(long, value_name = "RESULT_JSON")]
    pub(super) completed_result: Option<String>,
    /// It did not happen: the next identical call runs.
    #[arg(long)]
    pub(super) not_performed: bool,
    /// A follow-on the handler would have declared (the receipt
    /// that was never sent), written with the completion: its name, `=`,
    /// and its payload as JSON, e.g. `send_receipt={"to":"a@example.com"}`.
    /// Repeat it for several follow-ons; only with a completed outcome.
    #[arg(
        long = "follow-on",
        value_name = "NAME=JSON",
        conflicts_with = "not_performed"
    )]
    pub(super) follow_on: Vec<String>,
    /// Who resolves it and why; the status tool shows it.
    #[arg(long)]
    pub(super) note: String,
}

/// The arguments of `purge`.
#[derive(Debug, clap::Args)]
pub(super) struct Purge {
    /// Records deleted per statement.
    #[arg(long, default_value_t = 250)]
    pub(super) batch: usize,
}

/// The arguments of `follow-ons`.
#[derive(Debug, clap::Args)]
pub(super) struct FollowOns {
    /// Only follow-ons in this state; without it, the follow-ons waiting or running.
    #[arg(long, value_enum, conflicts_with = "dead")]
    pub(super) state: Option<FollowOnStateArg>,
    /// Only follow-ons in the dead letter: `--state dead`.
    #[arg(long)]
    pub(super) dead: bool,
    /// Only this tenant's follow-ons.
    #[arg(long)]
    pub(super) tenant: Option<String>,
    /// Only the follow-ons of this operation (`idem_` and 32 hex digits, as the tool's answer gives it; the `idem_` may be left out).
    #[arg(long)]
    pub(super) reference: Option<String>,
    /// Only follow-ons with this name.
    #[arg(long)]
    pub(super) name: Option<String>,
    /// The most follow-ons shown.
    #[arg(long, default_value_t = 50)]
    pub(super) limit: usize,
}

/// The arguments of `redrive`.
#[derive(Debug, clap::Args)]
pub(super) struct Redrive {
    /// The operation's reference (`idem_` and 32 hex digits, as the tool's answer gives it; the `idem_` may be left out).
    pub(super) reference: String,
    /// The follow-on's name.
    pub(super) name: String,
    /// The operation's tenant.
    #[arg(long)]
    pub(super) tenant: String,
}

/// A follow-on's state as the command line spells it.
#[derive(Clone, Copy, Debug, ValueEnum)]
#[value(rename_all = "snake_case")]
pub(super) enum FollowOnStateArg {
    Waiting,
    Running,
    Dead,
    Delivered,
}

impl From<FollowOnStateArg> for FollowOnState {
    fn from(s: FollowOnStateArg) -> Self {
        match s {
            FollowOnStateArg::Waiting => FollowOnState::Waiting,
            FollowOnStateArg::Running => FollowOnState::Running,
            FollowOnStateArg::Dead => FollowOnState::Dead,
            FollowOnStateArg::Delivered => FollowOnState::Delivered,
        }
    }
}

/// A state as the command line spells it.
#[derive(Clone, Copy, Debug, ValueEnum)]
#[value(rename_all = "snake_case")]
pub(super) enum State {
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

/// The reference the operator typed (`idem_` and 32 hex digits, or
/// without the `idem_`), or how to write one.
pub(super) fn parse_reference(text: &str) -> Result<Reference, Failure> {
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
