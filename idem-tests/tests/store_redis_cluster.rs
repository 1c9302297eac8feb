//! RedisStore on a Redis Cluster of three nodes that the test starts on
//! loopback ports and stops at the end: the whole conformance suite, a race
//! between separate clients, records spread over the nodes, still found
//! by reference and by the listings, and the store's library loaded again
//! on every node after `FUNCTION FLUSH`, and on a fourth node after a
//! reshard moved records there. Needs `redis-server` and `redis-cli`.

mod durable;
mod redis_server;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_runtime::store::conformance::claim_request;
use idem_runtime::store::Upkeep;
use idem_runtime::{
    executor::{Operation, ScopeSpec},
    store::{conformance, Claim, FollowOnStore},
    Caller, Executor, IdempotencyStore, RedisStore,
};
use redis_server::{command, free_port, fresh_prefix, Server};

/// A Cluster node's settings (its bus listens on its port + 10000).
const CLUSTER_NODE: [&str; 6] = [
    "--cluster-enabled",
    "yes",
    "--cluster-config-file",
    "nodes.conf",
    "--cluster-node-timeout",
    "5000",
];

/// Three masters, no replicas, the 16384 slots split between them.
struct Cluster {
    nodes: Vec<Server>,
}

impl Cluster {
    async fn start() -> Option<Cluster> {
        let mut nodes = Vec::new();
        for _ in 0..3 {
            // The node's bus listens on its port + 10000.
            let port = free_port(10_000);
            nodes.push(Server::start_on(port, &CLUSTER_NODE)?);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&created.stdout),
            String::from_utf8_lossy(&created.stderr)
        );
        let cluster = Cluster { nodes };
        let started = Instant::now();
        for node in &cluster.nodes {
            loop {
                let info: String = command(&node.url(), redis::cmd("CLUSTER").arg("INFO")).await;
                if info.contains("cluster_state:ok") && info.contains("cluster_known_nodes:3") {
                    break;
                }
                assert!(started.elapsed() < Duration::from_secs(20), "{info}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Some(cluster)
    }

    fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    fn store(&self, prefix: &str) -> RedisStore {
        RedisStore::cluster_builder(self.urls())
            .unwrap()
            .prefix(prefix)
            .build()
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster() {
    let Some(cluster) = Cluster::start().await else {
        return;
    };

    // Every conformance case (the records' and the follow-ons'), on one store.
    let store = cluster.store(&fresh_prefix());
    for (name, case) in conformance::cases() {
        let started = Instant::now();
        case(&store).await;
        eprintln!("cluster: {name} ({:?})", started.elapsed());
    }

    // The library gone from every node (as after a restart without data, or
    // on nodes added by a reshard): the calls below load it again, on every
    // primary.
    let function_list = |url: String| async move {
        let listed: Vec<redis::Value> = command(&url, redis::cmd("FUNCTION").arg("LIST")).await;
        format!("{listed:?}")
    };
    for node in cluster.urls() {
        assert!(function_list(node.clone())
            .await
            .contains(RedisStore::library_name()));
        let _: () = command(&node, redis::cmd("FUNCTION").arg("FLUSH")).await;
        assert!(!function_list(node)
            .await
            .contains(RedisStore::library_name()));
    }

    // Records spread over the three nodes, and are still found by
    // reference, and listed, from any of them.
    let store = cluster.store(&fresh_prefix());
    let requests: Vec<_> = (0..200)
        .map(|_| claim_request(Duration::from_secs(900)))
        .collect();
    for req in &requests {
        assert!(matches!(
            store.claim(req).await.unwrap(),
            Claim::Claimed { .. }
        ));
        store
            .mark_unknown(&req.key, req.attempt, "timeout")
            .await
            .unwrap();
    }
    for node in &cluster.urls() {
        let keys: usize = command(node, &redis::cmd("DBSIZE")).await;
        assert!(keys > 10, "{node} holds {keys} keys");
        assert!(
            function_list(node.clone())
                .await
                .contains(RedisStore::library_name()),
            "{node} has the library again"
        );
    }
    for req in &requests {
        let found = store
            .lookup(&req.tenant, &req.reference)
            .await
            .unwrap()
            .expect("found by reference");
        assert_eq!(found.key, req.key);
        assert!(store
            .lookup("another-tenant", &req.reference)
            .await
            .unwrap()
            .is_none());
    }
    let listed = store.list_unknown(1000).await.unwrap();
    assert_eq!(listed.len(), requests.len());
    let first = store.list_unknown(7).await.unwrap();
    assert_eq!(first.len(), 7);
    assert!(first
        .windows(2)
        .all(|w| w[0].next_check_at <= w[1].next_check_at));

    // A reshard onto a node that never had the library (it joins by CLUSTER
    // MEET, so nothing copies it there): the records that moved are still
    // found, and the first call that reaches the node loads it there.
    let extra = Server::start_on(free_port(10_000), &CLUSTER_NODE).unwrap();
    let _: () = command(
        &cluster.urls()[0],
        redis::cmd("CLUSTER")
            .arg("MEET")
            .arg("127.0.0.1")
            .arg(extra.port),
    )
    .await;
    let started = Instant::now();
    for node in cluster.urls().iter().chain([&extra.url()]) {
        loop {
            let info: String = command(node, redis::cmd("CLUSTER").arg("INFO")).await;
            if info.contains("cluster_known_nodes:4") {
                break;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "{info}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let id: String = command(&extra.url(), redis::cmd("CLUSTER").arg("MYID")).await;
    // redis-cli refuses to reshard until the nodes' views of the cluster
    // agree, which takes a few gossip rounds after the MEET.
    loop {
        let resharded = Command::new("redis-cli")
            .args(["--cluster", "reshard"])
            .arg(format!("127.0.0.1:{}", cluster.nodes[0].port))
            .args(["--cluster-from", "all", "--cluster-to", &id])
            .args(["--cluster-slots", "4096", "--cluster-yes"])
            .output()
            .expect("redis-cli runs");
        if resharded.status.success() {
            break;
        }
        // A reshard cut off midway (a MIGRATE that timed out on a loaded
        // machine) leaves a slot open, migrating on one node and importing
        // on the other, and every later reshard refuses to start: close it.
        let _ = Command::new("redis-cli")
            .args(["--cluster", "fix"])
            .arg(format!("127.0.0.1:{}", cluster.nodes[0].port))
            .arg("--cluster-yes")
            .output();
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "redis-cli --cluster reshard failed: {}{}",
            String::from_utf8_lossy(&resharded.stdout),
            String::from_utf8_lossy(&resharded.stderr)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let moved: usize = command(&extra.url(), &redis::cmd("DBSIZE")).await;
    assert!(moved > 0, "the reshard moved no record");
    assert!(!function_list(extra.url())
        .await
        .contains(RedisStore::library_name()));
    for req in &requests {
        let found = store.lookup(&req.tenant, &req.reference).await.unwrap();
        assert_eq!(found.expect("found after the reshard").key, req.key);
    }
    assert!(
        function_list(extra.url())
            .await
            .contains(RedisStore::library_name()),
        "the new node has the library"
    );

    // WAIT goes to the record's node: with no replica there, the claim is
    // released and refused.
    let waiting = RedisStore::cluster_builder(cluster.urls())
        .unwrap()
        .prefix(fresh_prefix())
        .wait_for_replicas(1, Duration::from_millis(100))
        .build()
        .unwrap();
    for req in requests.iter().take(8) {
        let err = waiting.claim(req).await.unwrap_err();
        assert!(err.to_string().contains("unavailable"), "{err}");
        assert!(waiting
            .lookup(&req.tenant, &req.reference)
            .await
            .unwrap()
            .is_none());
    }

    // A race between separate clients, each on connections of its own.
    let runs = Arc::new(AtomicUsize::new(0));
    let prefix = fresh_prefix();
    let executors: Vec<Executor> = (0..4)
        .map(|_| Executor::new(Arc::new(cluster.store(&prefix))))
        .collect();
    for amount in [100u64, 200, 300] {
        let start = tokio::time::Instant::now() + Duration::from_millis(200);
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let (executor, runs) = (executors[i % 4].clone(), runs.clone());
                tokio::spawn(async move {
                    tokio::time::sleep_until(start).await;
                    let caller = Caller::new("acme", "alice");
                    let args = serde_json::json!({ "card": "tok_visa", "amount_cents": amount });
                    executor
                        .run(
                            Operation {
                                caller: &caller,
                                tool: "charge_card",
                                args: &args,
                                scope: ScopeSpec::Window(Duration::from_secs(900)),
                                status_tool: "get_operation_status",
                            },
                            |_| async {
                                runs.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(50)).await;
                                Ok::<_, idem_runtime::ToolError>(amount)
                            },
                        )
                        .await
                        .name()
                })
            })
            .collect();
        let mut kinds = Vec::new();
        for t in tasks {
            kinds.push(t.await.unwrap());
        }
        assert_eq!(
            kinds.iter().filter(|k| **k == "executed").count(),
            1,
            "{kinds:?}"
        );
        assert!(kinds
            .iter()
            .all(|k| ["executed", "in_progress", "replayed"].contains(k)));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 3, "each charge ran once");

    // Follow-ons spread over the nodes with their records, each job on
    // its record's slot; two dispatchers on clients of their own drain them
    // together, and each job is leased once.
    let prefix = fresh_prefix();
    let (one, two) = (cluster.store(&prefix), cluster.store(&prefix));
    let name = format!("receipt_{}", idem_runtime::store::Attempt::random().get());
    let requests: Vec<_> = (0..120)
        .map(|_| claim_request(Duration::from_secs(900)))
        .collect();
    for req in &requests {
        assert!(matches!(
            one.claim(req).await.unwrap(),
            Claim::Claimed { .. }
        ));
        let job =
            idem_runtime::follow_ons::FollowOn::new(&name, &serde_json::json!({ "to": "a@b" }))
                .unwrap();
        one.complete_with_follow_ons(
            &req.key,
            req.attempt,
            "\"paid\"",
            idem_runtime::store::FollowOns::new(&[job]).unwrap(),
        )
        .await
        .unwrap();
    }
    let first = cluster.urls()[0].clone();
    let slot = async |key: String| -> i64 {
        command(&first, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key)).await
    };
    let mut nodes_with_jobs = std::collections::HashSet::new();
    for req in requests.iter().take(16) {
        let reference = req.reference;
        let hex = reference.to_string().trim_start_matches("idem_").to_owned();
        let tenant_hex: String = req.tenant.bytes().map(|b| format!("{b:02x}")).collect();
        let shard = reference.as_bytes()[0] % 64;
        let record = format!("{prefix}:{{{shard:02x}}}:r:{hex}");
        let job = format!("{prefix}:{{{shard:02x}}}:j:{hex}:{tenant_hex}:{name}");
        let job_slot = slot(job).await;
        assert_eq!(slot(record).await, job_slot, "a job off its record's slot");
        for node in &cluster.urls() {
            let here: i64 = command(
                node,
                redis::cmd("CLUSTER").arg("COUNTKEYSINSLOT").arg(job_slot),
            )
            .await;
            if here > 0 {
                nodes_with_jobs.insert(node.clone());
            }
        }
    }
    assert!(nodes_with_jobs.len() > 1, "jobs on one node only");
    let drain = async |store: &RedisStore| {
        let mut got = Vec::new();
        loop {
            let token = idem_runtime::store::Attempt::random();
            let leased = store
                .lease_follow_ons(&[name.as_str()], 7, Duration::from_secs(60), token)
                .await
                .unwrap();
            if leased.is_empty() {
                return got;
            }
            for job in leased {
                store.finish_follow_on(&job.id, token).await.unwrap();
                got.push(job.id);
            }
        }
    };
    let (a, b) = tokio::join!(drain(&one), drain(&two));
    assert!(!a.is_empty() && !b.is_empty(), "both dispatchers leased");
    let mut all: Vec<_> = a.into_iter().chain(b).collect();
    all.sort();
    let leased = all.len();
    all.dedup();
    assert_eq!(leased, all.len(), "a job leased twice");
    assert_eq!(all.len(), requests.len(), "every job leased");
    assert!(one.count_due_follow_ons().await.unwrap().is_empty());
}
