//! The root package only owns tests, examples and benches.
