//! Client keys seen per caller and arguments: what makes a host that sends
//! a fresh key on every retry visible.
//!
//! A call with a client key is its own operation whatever the window says:
//! the host named it. A host that sends a new key on each retry of one call
//! therefore runs it once per retry, the failure this module reports: when
//! identical arguments from one caller to one tool arrive under another
//! client key inside the tool's window, it counts
//! `idem_client_key_new_key_repeats_total{tool}` and logs a warning. The
//! call still runs (docs/keys.md, "Client keys: why they work as they do").
//!
//! What it remembers is this process's: one replica sees the keys its own
//! calls carried. Entries live for the tool's window and are bounded in
//! number, so the memory is bounded whatever the traffic.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::key::{Caller, IdempotencyKey, Reference};

/// The most (caller, tool, arguments) entries kept; past it, the expired
/// ones go, and if none had, all of them (a missed warning, never a wrong
/// answer: nothing here decides what runs).
const MAX_ENTRIES: usize = 65_536;

/// The client key last seen for each caller's identical arguments to a tool.
#[derive(Debug, Default)]
pub(super) struct NewKeyRepeats {
    seen: Mutex<HashMap<Seen, Last>>,
}

/// A caller's identical call: tenant, subject and the fingerprint (the tool
/// and the canonical arguments).
#[derive(Debug, PartialEq, Eq, Hash)]
struct Seen {
    tenant: String,
    subject: String,
    fingerprint: [u8; 32],
}

#[derive(Debug)]
struct Last {
    /// The client-keyed operation's key (it covers the client key).
    key: [u8; 32],
    /// The end of the tool's window, counted from that call.
    until: Instant,
}

impl NewKeyRepeats {
    /// Notes a call of `tool` by `caller` under the client-keyed `key`, and
    /// reports it when the same arguments came under another client key
    /// less than `window` ago. Returns whether it reported.
    pub(super) fn observe(
        &self,
        caller: &Caller,
        tool: &str,
        key: &IdempotencyKey,
        reference: Reference,
        window: Duration,
    ) -> bool {
        let now = Instant::now();
        let seen = Seen {
            tenant: caller.tenant().to_owned(),
            subject: caller.subject().to_owned(),
            fingerprint: *key.fingerprint(),
        };
        let last = Last {
            key: *key.as_bytes(),
            until: now + window,
        };
        let mut map = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let repeated = match map.get(&seen) {
            Some(previous) if previous.until > now && previous.key != last.key => true,
            // The same key again: a repeat of one operation, answered as such.
            Some(previous) if previous.until > now => return false,
            _ => false,
        };
        if map.len() >= MAX_ENTRIES && !map.contains_key(&seen) {
            map.retain(|_, entry| entry.until > now);
            if map.len() >= MAX_ENTRIES {
                map.clear();
            }
        }
        map.insert(seen, last);
        drop(map);
        if repeated {
            crate::telemetry::client_key_new_key_repeat(tool);
            tracing::warn!(
                tool,
                tenant = caller.tenant(),
                %reference,
                window_seconds = window.as_secs(),
                "identical arguments arrived under a new client key inside the tool's window: \
                 they run as a new operation, as the key says. If this was a retry, the host \
                 sent a fresh idempotency key for it; a retry must reuse the key of the call it repeats"
            );
        }
        repeated
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Scope;

    fn key(caller: &Caller, client_key: &str) -> IdempotencyKey {
        IdempotencyKey::derive(
            caller,
            "charge",
            &serde_json::json!({"cents": 5}),
            &Scope::ClientKey(client_key.to_owned()),
        )
        .unwrap()
    }

    #[test]
    fn a_new_key_for_identical_arguments_inside_the_window_is_reported() {
        let seen = NewKeyRepeats::default();
        let alice = Caller::new("acme", "alice");
        let bob = Caller::new("acme", "bob");
        let window = Duration::from_secs(60);
        let reference = Reference::new_operation(&key(&alice, "a"));
        assert!(!seen.observe(&alice, "charge", &key(&alice, "a"), reference, window));
        assert!(!seen.observe(&alice, "charge", &key(&alice, "a"), reference, window));
        assert!(seen.observe(&alice, "charge", &key(&alice, "b"), reference, window));
        // Another caller's call is not a repeat of alice's.
        assert!(!seen.observe(&bob, "charge", &key(&bob, "c"), reference, window));
        // After the window, a new key is simply a new operation.
        let short = Duration::from_millis(1);
        let other = NewKeyRepeats::default();
        assert!(!other.observe(&alice, "charge", &key(&alice, "a"), reference, short));
        std::thread::sleep(Duration::from_millis(5));
        assert!(!other.observe(&alice, "charge", &key(&alice, "b"), reference, short));
    }
}
