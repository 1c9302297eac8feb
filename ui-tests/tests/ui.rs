//! Compile-time behaviour of `#[idempotent]` and `#[idem_runtime::tool_router]`:
//! one case per mistake the macros detect (`tests/ui/*.rs`, expected errors
//! in the `.stderr` next to each). Regenerate the `.stderr` files with
//! `TRYBUILD=overwrite`, then read them.
//!
//! The cases that must compile (`tests/ui/pass-*.rs`) are test targets of
//! their own (`ui_pass_*` in Cargo.toml), built and run by `cargo test`:
//! with no pass case, trybuild only checks its copy of the dependencies
//! instead of building them all a second time.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/[!p]*.rs");
}
