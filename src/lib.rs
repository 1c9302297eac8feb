//! The root package only owns tests, examples, benches and the harness
//! binaries (`src/bin`).
