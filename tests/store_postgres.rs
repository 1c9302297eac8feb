//! PostgresStore: the conformance suite, migrations, and what only a shared
//! server store has. Needs `IDEM_TEST_DATABASE_URL` (see `durable::database_url`).

mod conformance;
mod durable;

use durable::PgSchema;

// Each case in a fresh schema of its own, dropped at the end.
conformance_tests!(PgSchema::new().await);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_cases_share_one_store() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    conformance::run_all(&pg.store).await;
}

#[tokio::test]
async fn expiry_sweep_and_purge() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    durable::expiry_sweep_and_purge(&pg.store).await;
}

/// Migrating twice, and from several stores at once, is harmless.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_is_idempotent_and_safe_concurrently() {
    let Some(pg) = PgSchema::new().await else {
        return;
    };
    let others: Vec<_> = (0..4)
        .map(|_| {
            idem_runtime::PostgresStore::builder(&pg.url)
                .unwrap()
                .schema(&pg.name)
                .build()
                .unwrap()
        })
        .collect();
    let runs = others.iter().map(|s| {
        let s = s.clone();
        async move { s.migrate().await }
    });
    for r in tokio_join_all(runs).await {
        r.unwrap();
    }
    pg.store.migrate().await.unwrap();
    conformance::claim_creates_in_progress(&others[0]).await;
}

async fn tokio_join_all<F>(fs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}
