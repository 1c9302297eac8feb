//! Compile-time behaviour of `#[idempotent]` and `#[idem_runtime::tool_router]`:
//! one case per mistake the macros detect (`tests/ui/*.rs`, expected errors
//! in the `.stderr` next to each), and the cases that must compile.
//! Regenerate the `.stderr` files with `TRYBUILD=overwrite`, then read them.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass-*.rs");
    cases.compile_fail("tests/ui/[!p]*.rs");
}
