//! The conformance suite against `MemoryStore`.

use std::sync::Arc;

use idem_runtime::{store::conformance, MemoryStore};

idem_runtime::conformance_tests!(Some(Arc::new(MemoryStore::new())));

#[tokio::test]
async fn all_cases_share_one_store() {
    conformance::run_all(&MemoryStore::new()).await;
}
