//! A rolling deploy from the version before the `leases` index (f180a13^,
//! whose table `create_table_before_leases` makes) to this one: the old
//! replica's requests are that version's, replayed.
//!
//! How, and why it is faithful: the old replica is this version's store
//! behind a proxy that turns each of its requests into the one f180a13^
//! sent for the same step. Between the two versions' sources
//! (`git diff f180a13^ -- idem-runtime/src/store/dynamodb`), the requests
//! differ in these steps only, and the proxy rewrites exactly them:
//!
//! - a claim's item (its `PutItem`, and the new record's `Put` of a
//!   takeover) carried `lq`, the `lapsed` index's hash, where this version
//!   writes `mq`;
//! - a completion (`complete`, a completion with jobs, a reconciler's
//!   completed resolution) was `SET st = :c, rs = :rs, ua = :now, xq =
//!   :xq, xk = ra, tt = te … REMOVE lq, uq` (into the `expiry` index at the
//!   retention's end), where this version writes no index and removes `nt`;
//! - a superseded operation's item, a copy of the record it replaces, kept
//!   `mq` when that record had it (f180a13^ knew no `mq` to remove): the
//!   proxy puts it back, from the record the refused claim read;
//! - the sweep and the purge read the `lapsed` index only, with the query
//!   this version also sends while the table has that index: the walk over
//!   `leases` (its cursors' query and its index query) is answered empty,
//!   so nothing of it reaches the table and no cursor moves.
//!
//! Every other request is byte for byte the one f180a13^ sent (the
//! condition expressions, the fenced updates, the jobs' requests, the
//! lookups). What is not replayed is how that version read the items it
//! got back (its lookups returned a record past its life; its listings
//! counted one): this version's reading is used for both replicas, which
//! the upgrade notes' "items written by earlier versions" cover.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use idem_runtime::DynamoDbStore;

use crate::create_table_before_leases;
use crate::dynamodb_emulator::{client, endpoint};
use crate::dynamodb_proxy::{documented_actions, iam_actions, Actions, Intercepted, Proxy};
use crate::rolling::{rolling_deploy, Replica, World};

/// The requests this version sends, as f180a13^ sent them (see above);
/// counts each rewrite, so a test sees that each was made.
#[derive(Default)]
struct BeforeLeases {
    /// Rewrites made, by kind.
    made: Mutex<BTreeMap<&'static str, usize>>,
    /// `mq` of the records refused claims read, by reference (`rf`).
    leases: Mutex<HashMap<String, Value>>,
}

/// The sweep's cursors' partition, `idem\0`, in base64.
const CURSORS: &str = "aWRlbQA=";

/// The completion's update, this version's and f180a13^'s.
const COMPLETION: &str = "SET st = :c, rs = :rs, ua = :now, tt = te";
const OLD_COMPLETION: &str = "SET st = :c, rs = :rs, ua = :now, xq = :xq, xk = ra, tt = te";

impl BeforeLeases {
    fn made(&self, kind: &'static str) {
        *self.made.lock().unwrap().entry(kind).or_default() += 1;
    }

    fn answer(self: &Arc<Self>, operation: &str, body: &str) -> Intercepted {
        let mut request: Value = serde_json::from_str(body).expect("a JSON request");
        match operation {
            "PutItem" => {
                self.claimed(&mut request["Item"]);
                let this = self.clone();
                Intercepted::Alter {
                    request: request.to_string(),
                    answer: Some(Box::new(move |answer: Value| {
                        // A refused claim: the record it read.
                        if let (Some(rf), Some(mq)) =
                            (answer["Item"].get("rf"), answer["Item"].get("mq"))
                        {
                            this.leases
                                .lock()
                                .unwrap()
                                .insert(rf.to_string(), mq.clone());
                        }
                        answer
                    })),
                }
            }
            "UpdateItem" => {
                self.completed(&mut request);
                Intercepted::Alter {
                    request: request.to_string(),
                    answer: None,
                }
            }
            "TransactWriteItems" => {
                for item in request["TransactItems"].as_array_mut().unwrap() {
                    if let Some(put) = item.get_mut("Put") {
                        let sk = put["Item"]["sk"]["B"].as_str().unwrap().to_owned();
                        match first_byte(&sk) {
                            b'r' => self.claimed(&mut put["Item"]),
                            b's' => self.superseded(&mut put["Item"]),
                            _ => {}
                        }
                    }
                    if let Some(update) = item.get_mut("Update") {
                        self.completed(update);
                    }
                }
                Intercepted::Alter {
                    request: request.to_string(),
                    answer: None,
                }
            }
            "Query" if request["IndexName"] == "leases" => {
                self.made("walk");
                Intercepted::Answer(
                    200,
                    json!({"Items": [], "Count": 0, "ScannedCount": 0}).to_string(),
                )
            }
            "Query" if request["ExpressionAttributeValues"][":pk"]["B"] == CURSORS => {
                self.made("cursors");
                Intercepted::Answer(
                    200,
                    json!({"Items": [], "Count": 0, "ScannedCount": 0}).to_string(),
                )
            }
            "BatchGetItem" => panic!("f180a13^ sent no BatchGetItem"),
            _ => Intercepted::Forward,
        }
    }

    /// A claim's item: `lq` where this version writes `mq`.
    fn claimed(&self, item: &mut Value) {
        if let Some(mq) = item.as_object_mut().unwrap().remove("mq") {
            item["lq"] = mq;
            self.made("claim");
        }
    }

    /// A superseded operation's item: `mq` kept when its record had it.
    fn superseded(&self, item: &mut Value) {
        let rf = item["rf"].to_string();
        if let Some(mq) = self.leases.lock().unwrap().get(&rf) {
            item["mq"] = mq.clone();
            self.made("superseded");
        }
    }

    /// A completion's update: into `expiry` at the retention's end, `nt`
    /// left.
    fn completed(&self, update: &mut Value) {
        let Some(expression) = update["UpdateExpression"].as_str() else {
            return;
        };
        if !expression.starts_with(COMPLETION) {
            return;
        }
        let old = expression.replacen(COMPLETION, OLD_COMPLETION, 1).replacen(
            " REMOVE lq, uq, nt",
            " REMOVE lq, uq",
            1,
        );
        update["UpdateExpression"] = old.into();
        let pk = update["Key"]["pk"]["B"].as_str().unwrap();
        update["ExpressionAttributeValues"][":xq"] = json!({"N": (first_byte(pk) % 4).to_string()});
        self.made("completion");
    }
}

/// The first byte of a base64 text.
fn first_byte(base64: &str) -> u8 {
    let digit = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {base64}"),
    };
    let b = base64.as_bytes();
    (digit(b[0]) << 2) | (digit(b[1]) >> 4)
}

/// A table from before `leases` served by that version's replica alone,
/// migrated in a step of its own, then both at once, then this version
/// alone: every call ran once, every charge's receipt was sent once, and
/// every reference reads as the processor says.
///
/// Under the IAM docs/deploying.md documents ("IAM"), which the emulator
/// does not check: every request each replica sends (the old one's as
/// f180a13^ sent it) needs only actions of the serving role's list
/// (`IdemServe`), and the migration's only the migrating role's
/// (`IdemMigrate`), each counted through a proxy of its own
/// (`grants.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_deploy_from_before_leases_loses_nothing() {
    let Some(endpoint) = endpoint() else {
        return;
    };
    let table = create_table_before_leases(&endpoint).await;
    let proxy = Proxy::start(&endpoint).await;
    let before = Arc::new(BeforeLeases::default());
    let hook = before.clone();
    let old_actions = Actions::default();
    let recorded = old_actions.clone();
    proxy.intercept(move |operation, body| {
        let intercepted = hook.answer(operation, body);
        // What reaches the table: f180a13^'s request (one the proxy
        // answers itself, f180a13^ never sent).
        let sent = match &intercepted {
            Intercepted::Alter { request, .. } => Some(request.as_str()),
            Intercepted::Forward => Some(body),
            _ => None,
        };
        if let Some(sent) = sent {
            recorded
                .lock()
                .unwrap()
                .extend(iam_actions(operation, sent));
        }
        intercepted
    });
    let world = Arc::new(World::default());
    let old = DynamoDbStore::builder(client(&proxy.url), table.table())
        .build()
        .unwrap();
    let migrating = Proxy::start(&endpoint).await;
    let migrate_actions = migrating.record_actions();
    let serving = Proxy::start(&endpoint).await;
    let new_actions = serving.record_actions();
    // The deploy step: the migration, as the migrating role; then this
    // version's first replica, as the serving role.
    let start_new = async {
        let migrator = DynamoDbStore::builder(client(&migrating.url), table.table())
            .build()
            .unwrap();
        assert!(migrator.migrate().await.unwrap());
        let new = DynamoDbStore::connect(client(&serving.url), table.table())
            .await
            .unwrap();
        Replica::new("this version", Arc::new(new), &world)
    };
    rolling_deploy(
        Replica::new("f180a13^", Arc::new(old), &world),
        start_new,
        world.clone(),
    )
    .await;
    let made = before.made.lock().unwrap().clone();
    for kind in ["claim", "completion", "superseded", "walk", "cursors"] {
        assert!(made.get(kind).is_some_and(|n| *n > 0), "{kind}: {made:?}");
    }
    let held = |actions: &Actions, sid: &str, who: &str| {
        let actions = actions.lock().unwrap().clone();
        let granted = documented_actions(sid);
        let beyond: BTreeSet<_> = actions.difference(&granted).collect();
        assert!(
            !actions.is_empty() && beyond.is_empty(),
            "{who} needed {beyond:?} beyond docs/deploying.md's {sid}: {actions:?}"
        );
    };
    held(&old_actions, "IdemServe", "f180a13^'s replica");
    held(&new_actions, "IdemServe", "this version's replica");
    held(&migrate_actions, "IdemMigrate", "the migration");
}
