//! Compile-time tests of `#[idempotent]` and `#[idem_runtime::tool_router]`
//! (`tests/ui.rs` and `tests/ui/`). Nothing here is published: the package
//! exists so that trybuild checks only what a tool server needs.
