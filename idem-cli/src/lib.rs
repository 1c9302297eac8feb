//! The operator's command line, `idem`: list, show, resolve by hand, purge
//! and count the records of an [idem](https://docs.rs/idem-runtime) store;
//! list follow-ons and re-drive a dead one.
//!
//! ```text
//! cargo install idem-cli                       # SQLite, PostgreSQL, Redis
//! cargo install idem-cli --features dynamodb   # and DynamoDB
//! ```
//!
//! ```text
//! idem --store URL [--schema NAME] list [--state unknown|in_progress|completed|not_performed] [--tenant T] [--tool X] [--limit N]
//! idem --store URL show REF [--tenant T] [--response]   (the record and its follow-ons)
//! idem --store URL resolve REF --tenant T (--completed VALUE_JSON | --completed-result RESULT_JSON | --not-performed) [--follow-on NAME=JSON]... --note "who and why"
//! idem --store URL purge
//! idem --store URL stats
//! idem --store URL follow-ons [--state waiting|running|dead|delivered | --dead] [--tenant T] [--reference REF] [--name N] [--limit N]
//! idem --store URL redrive REF NAME --tenant T
//! idem --store dynamodb://TABLE?region=R create-table   (DynamoDB: the table, its indexes, TTL)
//! idem --store URL migrate   (this version's migrations; the only command that changes a layout)
//! ```
//!
//! `URL` is what [`open_store`](idem_runtime::open_store) takes (`sqlite:PATH`, `postgres://…`,
//! `redis://…`, and `dynamodb://TABLE?region=…` when built with the
//! `dynamodb` feature). Only `migrate` (and `create-table`) changes a
//! store's layout, and several at once all succeed; every other command
//! opens the store as it is: a SQLite file must exist, and a SQLite file or
//! a PostgreSQL schema that lacks one of this version's migrations is
//! refused with exit code 2, naming `idem migrate`, and left as it was. A
//! DynamoDB table must exist (`create-table` or `migrate` makes it). `show` finds a reference in whichever tenant holds it;
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
//! wrong (a PostgreSQL schema not migrated, a DynamoDB table missing
//! included); [`EXIT_UNREACHABLE`] 3, the store did not answer.
//!
//! [`run`] is the whole program, with its output given, so tests run it in
//! process; [`main`] runs it on the process's own arguments and streams,
//! and the `idem` binary is that call.

#![warn(
    missing_docs,
    missing_debug_implementations,
    unreachable_pub,
    rust_2018_idioms
)]

use std::ffi::OsString;
use std::io::Write;

use clap::Parser;

use args::{Args, Command};
use idem_runtime::maintenance::ResolveError;
use idem_runtime::store::StoreError;

// What clap reads (`args`), the store it opens (`open`), a function per
// command (`records`, `resolve`, `follow_ons`, `create_table`, `migrate`), and
// how their answers read (`render`, `escape`).
mod args;
mod create_table;
mod escape;
mod follow_ons;
mod migrate;
mod open;
mod records;
mod render;
mod resolve;

/// Done.
pub const EXIT_OK: u8 = 0;
/// Refused: no such reference, the record is not UNKNOWN, or the store
/// holds something invalid. Nothing was changed.
pub const EXIT_OPERATOR: u8 = 1;
/// The command line or the store's configuration is wrong (a SQL store
/// not migrated to this version's layout, which `idem migrate` fixes, a
/// DynamoDB table missing, a privilege or a login the server refused);
/// nothing was changed.
pub const EXIT_USAGE: u8 = 2;
/// The store could not be reached or did not answer in time.
pub const EXIT_UNREACHABLE: u8 = 3;

/// Why the program stops: the exit code and what to tell the operator.
struct Failure(u8, String);

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Unavailable(_) => Failure(
                EXIT_UNREACHABLE,
                format!("{e}\ncheck the URL, and that the store is up and reachable from here"),
            ),
            StoreError::Config(_) | StoreError::Unsupported(_) => {
                Failure(EXIT_USAGE, e.to_string())
            }
            e => Failure(EXIT_OPERATOR, e.to_string()),
        }
    }
}

impl From<ResolveError> for Failure {
    fn from(e: ResolveError) -> Self {
        match e {
            ResolveError::Store(e) => e.into(),
            ResolveError::EmptyNote
            | ResolveError::ReservedNote
            | ResolveError::InvalidResponse(_) => Failure(EXIT_USAGE, e.to_string()),
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

/// The `idem` program: [`run`] on the process's arguments, its standard
/// output and standard error, on a runtime of its own; returns the exit
/// code to end the process with.
pub fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("idem: cannot start the async runtime: {e}\ncheck the process's limits on threads and open files");
            return std::process::ExitCode::from(EXIT_USAGE);
        }
    };
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let code = runtime.block_on(run(std::env::args_os(), &mut out, &mut err));
    std::process::ExitCode::from(code)
}

/// The command `args` names, its answer written to `out`: `create-table`
/// on the URL alone, every other command on the store it opens.
async fn execute(args: Args, out: &mut dyn Write) -> Result<(), Failure> {
    let Args {
        store: url,
        schema,
        json,
        command,
    } = args;
    let text = if let Command::CreateTable = command {
        create_table::create_table(&url, json).await?
    } else if let Command::Migrate = command {
        migrate::migrate(&open::store_url(&url, schema.as_deref())?, json).await?
    } else {
        let store = open::open(&url, schema.as_deref()).await?;
        let store = &*store;
        match command {
            Command::List(args) => records::list(store, args, json).await?,
            Command::Show(args) => records::show(store, args, json).await?,
            Command::Resolve(args) => resolve::resolve(store, args, json).await?,
            Command::Purge(args) => records::purge(store, args, json).await?,
            Command::Stats => records::stats(store, json).await?,
            Command::FollowOns(args) => follow_ons::list(store, args, json).await?,
            Command::Redrive(args) => follow_ons::redrive(store, args, json).await?,
            Command::CreateTable | Command::Migrate => {
                unreachable!("answered before the store is opened")
            }
        }
    };
    out.write_all(text.as_bytes())
        .map_err(|e| Failure(EXIT_USAGE, format!("cannot write the output: {e}")))
}
