//! idem-tests only owns the end-to-end tests, the examples, the benches and
//! the harness binaries (`src/bin`); it is never published.
