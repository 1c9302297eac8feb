//! The operator's command line (`idem_cli`, the `idem` binary)
//! against stores a test fills: SQLite always, PostgreSQL when
//! `IDEM_TEST_DATABASE_URL` is set (see `durable::database_url`), DynamoDB
//! on its emulator, Redis on a server of the test's own.
//!
//! One test binary, a module per part of the command line as
//! `idem-cli/src/` has it; `operator` holds what the cases share.

#[path = "../durable/mod.rs"]
mod durable;
#[path = "../dynamodb_emulator/mod.rs"]
mod dynamodb_emulator;
#[path = "../dynamodb_proxy/mod.rs"]
mod dynamodb_proxy;
#[path = "../postgres_roles/mod.rs"]
mod postgres_roles;
#[path = "../redis_server/mod.rs"]
mod redis_server;
#[path = "../sql_layouts/mod.rs"]
mod sql_layouts;

mod binary;
mod configuration;
mod create_table;
mod escape;
mod follow_ons;
mod grants;
mod grants_postgres;
mod migrate;
mod operator;
mod postgres;
mod records;
mod resolve;
mod show_anywhere;
