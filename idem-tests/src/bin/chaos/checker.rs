//! The checker: the far sides' ledgers, the clients' observations and the
//! records, against the ten properties of a chaos run.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{json, Value};

use crate::clients::Intent;

/// One broken property.
#[derive(Debug, Serialize)]
pub struct Violation {
    /// Which property (1 to 10, as RELIABILITY.md lists them).
    pub check: u8,
    /// What was seen.
    pub what: String,
    /// The reference concerned, if one.
    pub reference: Option<String>,
    /// The intent concerned, if one.
    pub intent: Option<u64>,
}

/// Everything the run collected.
pub struct Evidence<'a> {
    /// Every intent, with its observations.
    pub intents: &'a [Intent],
    /// The records at the end (`idem list --json`).
    pub records: &'a [Value],
    /// Each reference's states as the snapshots saw them, in order.
    pub history: &'a BTreeMap<String, Vec<(u64, u64, String)>>,
    /// The processor's `GET /ledger`.
    pub processor: &'a Value,
    /// The mailer's `GET /ledger`.
    pub mailer: &'a Value,
    /// Each reference's record as last seen (a purged one included).
    pub last_seen: &'a BTreeMap<String, Value>,
    /// The run's start, in milliseconds since the Unix epoch: an
    /// observation's `t_ms` counts from it.
    pub start_unix_ms: u64,
    /// Whether every record settled within the bound after the faults.
    pub settled: bool,
}

/// `2026-12-04T01:31:14.705Z` in milliseconds since the Unix epoch (the
/// CLI's RFC 3339, always UTC).
pub fn unix_ms(rfc3339: &str) -> Option<u64> {
    let b = rfc3339.as_bytes();
    let num =
        |from: usize, len: usize| -> Option<i64> { rfc3339.get(from..from + len)?.parse().ok() };
    if b.len() < 20 {
        return None;
    }
    let (y, m, d) = (num(0, 4)?, num(5, 2)?, num(8, 2)?);
    let (hh, mm, ss) = (num(11, 2)?, num(14, 2)?, num(17, 2)?);
    let ms = if b.get(19) == Some(&b'.') {
        num(20, 3).unwrap_or(0)
    } else {
        0
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((((days * 24 + hh) * 60 + mm) * 60 + ss) as u64 * 1000 + ms as u64)
}

#[derive(Default)]
struct Charge {
    effects: i64,
    overlaps: i64,
    mismatches: i64,
    charge_ids: Vec<String>,
    card: String,
}

fn sum(entries: &Value, field: &str) -> i64 {
    entries
        .as_array()
        .map(|a| a.iter().map(|e| e[field].as_i64().unwrap_or(0)).sum())
        .unwrap_or(0)
}

/// Runs every check; the violations, in the order found.
pub fn check(e: &Evidence<'_>) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut flag = |check: u8, what: String, reference: Option<&str>, intent: Option<u64>| {
        out.push(Violation {
            check,
            what,
            reference: reference.map(str::to_owned),
            intent,
        })
    };

    // The processor's ledger by reference and by card.
    let mut charges: BTreeMap<String, Charge> = BTreeMap::new();
    let mut effects_by_card: BTreeMap<String, i64> = BTreeMap::new();
    if let Some(keys) = e.processor["keys"].as_object() {
        for (key, entries) in keys {
            let mut c = Charge {
                effects: sum(entries, "effects"),
                overlaps: sum(entries, "overlaps"),
                mismatches: sum(entries, "mismatches"),
                ..Charge::default()
            };
            for entry in entries.as_array().into_iter().flatten() {
                if entry["effects"].as_i64().unwrap_or(0) > 0 {
                    c.charge_ids
                        .push(entry["answer"]["id"].as_str().unwrap_or("?").to_owned());
                }
                c.card = entry["request"]["card"].as_str().unwrap_or("").to_owned();
            }
            *effects_by_card.entry(c.card.clone()).or_default() += c.effects;
            charges.insert(key.clone(), c);
        }
    }
    let effects = |reference: &str| charges.get(reference).map_or(0, |c| c.effects);
    // When the first request that made an effect arrived at the processor.
    let mut charged_at: BTreeMap<String, u64> = BTreeMap::new();
    if let Some(keys) = e.processor["keys"].as_object() {
        for (key, entries) in keys {
            for entry in entries.as_array().into_iter().flatten() {
                if entry["effects"].as_i64().unwrap_or(0) > 0 {
                    if let Some(at) = entry["arrived_ms"].as_u64() {
                        let first = charged_at.entry(key.clone()).or_insert(at);
                        *first = (*first).min(at);
                    }
                }
            }
        }
    }
    // Whether a charge under `reference` had reached the processor before
    // `t_ms` (run time): a "not performed" from then on is false. (A retry
    // after a true "not performed" takes the record over and charges later.)
    let charged_before = |reference: &str, t_ms: u64| {
        charged_at
            .get(reference)
            .is_some_and(|at| *at < e.start_unix_ms + t_ms)
    };

    // 1. At most one effect per operation (reference), and per purchase:
    // a card is one intent's, or a tap's and its repeat after the window.
    for (reference, c) in &charges {
        if c.effects > 1 {
            flag(
                1,
                format!("{} effects under one reference", c.effects),
                Some(reference),
                None,
            );
        }
    }
    let mut intents_by_card: BTreeMap<&str, Vec<&Intent>> = BTreeMap::new();
    for intent in e.intents.iter().filter(|i| i.kind != "probe") {
        intents_by_card
            .entry(&intent.card)
            .or_default()
            .push(intent);
    }
    for (card, intents) in &intents_by_card {
        let n = effects_by_card.get(*card).copied().unwrap_or(0);
        if n > intents.len() as i64 {
            flag(
                1,
                format!(
                    "{n} charges for {} purchase(s) on card {card}",
                    intents.len()
                ),
                None,
                Some(intents[0].id),
            );
        }
    }

    // 5. No two requests of one operation at the processor at once, and no
    // reference sent with two different charges.
    for (reference, c) in &charges {
        if c.overlaps > 0 {
            flag(
                5,
                format!(
                    "{} request(s) arrived while the reference was in flight",
                    c.overlaps
                ),
                Some(reference),
                None,
            );
        }
        if c.mismatches > 0 {
            flag(
                5,
                format!(
                    "{} request(s) with the reference and other parameters",
                    c.mismatches
                ),
                Some(reference),
                None,
            );
        }
    }

    // The records: final, and the last state each reference was seen in
    // (a COMPLETED tap's record is purged once its 5 s window ends).
    let mut final_state: BTreeMap<String, (String, String)> = BTreeMap::new();
    for r in e.records {
        if let (Some(reference), Some(state)) = (r["reference"].as_str(), r["state"].as_str()) {
            final_state.insert(
                reference.to_owned(),
                (
                    state.to_owned(),
                    r["tenant"].as_str().unwrap_or("").to_owned(),
                ),
            );
        }
    }
    let last_state = |reference: &str| -> Option<String> {
        final_state
            .get(reference)
            .map(|(s, _)| s.clone())
            .or_else(|| {
                e.history
                    .get(reference)
                    .and_then(|h| h.last())
                    .map(|(_, _, s)| s.clone())
            })
    };

    // 2, 3, 4, 9: what each intent was told.
    let mut first_text: BTreeMap<String, (String, u64)> = BTreeMap::new();
    let mut refs_of: BTreeMap<u64, BTreeSet<String>> = BTreeMap::new();
    for intent in e.intents {
        for obs in &intent.obs {
            if obs.via == "probe" {
                // 9. Another tenant's reference must not be found.
                if obs.outcome.starts_with("leaked") {
                    flag(
                        9,
                        format!(
                            "tenant {} read another tenant's operation: {}",
                            intent.tenant, obs.outcome
                        ),
                        obs.reference.as_deref(),
                        Some(intent.id),
                    );
                }
                continue;
            }
            let Some(reference) = obs.reference.as_deref() else {
                continue;
            };
            refs_of
                .entry(intent.id)
                .or_default()
                .insert(reference.to_owned());
            // 9. Every reference a tenant was told is that tenant's record.
            if let Some((_, tenant)) = final_state.get(reference) {
                if *tenant != intent.tenant {
                    flag(
                        9,
                        format!(
                            "tenant {} was told a record of tenant {tenant}",
                            intent.tenant
                        ),
                        Some(reference),
                        Some(intent.id),
                    );
                }
            }
            let told = matches!(obs.outcome.as_str(), "executed" | "replayed" | "COMPLETED");
            if told {
                // 2. Exactly one effect, with the charge id told, on this
                // intent's card.
                let c = charges.get(reference);
                let n = effects(reference);
                if n != 1 {
                    flag(
                        2,
                        format!(
                            "told {} ({:?}) but the processor has {n} effect(s)",
                            obs.outcome, obs.charge_id
                        ),
                        Some(reference),
                        Some(intent.id),
                    );
                } else if let Some(c) = c {
                    if obs
                        .charge_id
                        .as_ref()
                        .is_none_or(|id| !c.charge_ids.contains(id))
                    {
                        flag(
                            2,
                            format!(
                                "told charge {:?}, the processor made {:?}",
                                obs.charge_id, c.charge_ids
                            ),
                            Some(reference),
                            Some(intent.id),
                        );
                    }
                    if c.card != intent.card {
                        flag(
                            2,
                            format!("told a charge of card {}, not {}", c.card, intent.card),
                            Some(reference),
                            Some(intent.id),
                        );
                    }
                }
            }
            // 3. Every answer with the value is the first one, byte for byte.
            if let Some(text) = &obs.text {
                match first_text.get(reference) {
                    None => {
                        first_text.insert(reference.to_owned(), (text.clone(), intent.id));
                    }
                    Some((first, _)) if first != text => {
                        flag(
                            3,
                            format!(
                                "{} answer differs from the first: {text} vs {first}",
                                obs.outcome
                            ),
                            Some(reference),
                            Some(intent.id),
                        );
                    }
                    Some(_) => {}
                }
            }
            // 4. Nothing reported not performed had been charged.
            if obs.outcome == "NOT_PERFORMED" && charged_before(reference, obs.t_ms) {
                flag(
                    4,
                    format!(
                        "told NOT_PERFORMED at {} ms, after the charge had reached the processor",
                        obs.t_ms
                    ),
                    Some(reference),
                    Some(intent.id),
                );
            }
            // 4. Nothing reported rejected had an effect: no charge under
            // the reference reached the processor before the answer came.
            // (A later repeat may charge under it: a rejected claim whose
            // release failed lapses, is found not performed, and is taken
            // over within its window, reference and all.)
            if obs.outcome == "rejected" && charged_before(reference, obs.end_ms) {
                flag(4, "answered rejected (nothing was executed), but a charge under the reference had reached the processor".into(), Some(reference), Some(intent.id));
            }
        }
        // 4. An intent told nothing but "nothing was executed", with no
        // answer it did not see, has no charge on its card.
        let nothing = !intent.obs.is_empty()
            && intent.kind != "probe"
            && intent.again_of.is_none()
            && !intent.card.is_empty()
            && intents_by_card
                .get(intent.card.as_str())
                .is_some_and(|v| v.len() == 1)
            && intent.obs.iter().all(|o| {
                !o.lost
                    && (o.outcome == "rejected"
                        || o.outcome == "store_unavailable"
                        || o.outcome == "refused")
            });
        if nothing && effects_by_card.get(&intent.card).copied().unwrap_or(0) > 0 {
            flag(
                4,
                "every answer said nothing was executed, yet the card was charged".into(),
                None,
                Some(intent.id),
            );
        }
    }
    // 2. A tap made again after the window is a new purchase: a reference
    // of its own, not the first tap's receipt. The first tap's operation
    // still holds its key past the window while it is unresolved (a live
    // claim, or UNKNOWN): then the tap is told "in progress" or "unknown"
    // under the first reference, by design, unless the operation had been
    // seen settled (COMPLETED or NOT_PERFORMED) before the tap was asked.
    for intent in e.intents.iter().filter(|i| i.again_of.is_some()) {
        let first = refs_of.get(&intent.again_of.unwrap_or_default());
        for obs in intent.obs.iter().filter(|o| o.via == "call") {
            let Some(reference) = obs.reference.as_deref() else {
                continue;
            };
            if !first.is_some_and(|f| f.contains(reference)) {
                continue;
            }
            let expires = e
                .last_seen
                .get(reference)
                .and_then(|r| unix_ms(r["expires_at"].as_str()?));
            let asked = e.start_unix_ms + obs.t_ms;
            let settled_before = e.history.get(reference).is_some_and(|seen| {
                seen.iter().any(|(_, until, state)| {
                    matches!(state.as_str(), "COMPLETED" | "NOT_PERFORMED")
                        && until + 1000 < obs.t_ms
                })
            });
            let unresolved = matches!(obs.outcome.as_str(), "unknown" | "in_progress");
            if unresolved && !settled_before {
                continue;
            }
            if expires.is_none_or(|x| x + 1000 < asked) {
                flag(2, format!("a tap after the window was answered as the first tap's operation ({}; the record expires at {expires:?}, asked at {asked})", obs.outcome), Some(reference), Some(intent.id));
            }
        }
    }

    // 4. No record was NOT_PERFORMED once its charge had reached the
    // processor (a snapshot's time is taken before it is read).
    for (reference, states) in e.history {
        if let Some((t, _, _)) = states
            .iter()
            .find(|(t, _, s)| s == "NOT_PERFORMED" && charged_before(reference, *t))
        {
            flag(4, format!("the record was NOT_PERFORMED at {t} ms, after the charge had reached the processor"), Some(reference), None);
        }
    }

    // 6. States only move forward, over every sighting of a record (the
    // snapshots and the clients' status answers), each a span from the
    // request to its answer: A is before B only if A's answer came before
    // B's request. Nothing leaves COMPLETED, and an UNKNOWN record runs
    // again (IN_PROGRESS) only through a NOT_PERFORMED that someone saw. A
    // status answer counts only when COMPLETED or NOT_PERFORMED: its
    // UNKNOWN is also an IN_PROGRESS record whose lease ran out, which a
    // late heartbeat may still keep alive.
    let mut sightings: BTreeMap<&str, Vec<(u64, u64, &str)>> = BTreeMap::new();
    for (reference, states) in e.history {
        for (t, end, state) in states {
            sightings
                .entry(reference)
                .or_default()
                .push((*t, *end, state));
        }
    }
    for intent in e.intents {
        for obs in intent.obs.iter().filter(|o| o.via == "status") {
            if let (Some(reference), true) = (
                obs.reference.as_deref(),
                matches!(obs.outcome.as_str(), "COMPLETED" | "NOT_PERFORMED"),
            ) {
                sightings
                    .entry(reference)
                    .or_default()
                    .push((obs.t_ms, obs.end_ms, &obs.outcome));
            }
        }
    }
    for (reference, seen) in &sightings {
        let mut flagged = false;
        for a in seen {
            for b in seen.iter().filter(|b| b.0 > a.1) {
                let bad = match (a.2, b.2) {
                    ("COMPLETED", other) => other != "COMPLETED",
                    ("UNKNOWN", "IN_PROGRESS") => !seen
                        .iter()
                        .any(|n| n.2 == "NOT_PERFORMED" && n.1 >= a.0 && n.0 <= b.1),
                    _ => false,
                };
                if bad && !flagged {
                    flagged = true;
                    flag(
                        6,
                        format!(
                            "{} seen at {}–{} ms, then {} at {}–{} ms",
                            a.2, a.0, a.1, b.2, b.0, b.1
                        ),
                        Some(reference),
                        None,
                    );
                }
            }
        }
    }

    // 7. Once the faults stopped and maintenance ran, every operation ended
    // completed (one charge) or not performed (none).
    if !e.settled {
        flag(
            7,
            "records still IN_PROGRESS or UNKNOWN at the bound".into(),
            None,
            None,
        );
    }
    for (reference, (state, _)) in &final_state {
        let n = effects(reference);
        match state.as_str() {
            "COMPLETED" if n != 1 => flag(
                7,
                format!("COMPLETED with {n} effect(s)"),
                Some(reference),
                None,
            ),
            "NOT_PERFORMED" if n != 0 => flag(
                7,
                format!("NOT_PERFORMED with {n} effect(s)"),
                Some(reference),
                None,
            ),
            "COMPLETED" | "NOT_PERFORMED" => {}
            other => flag(7, format!("ended {other}"), Some(reference), None),
        }
    }
    // Seen COMPLETED: by a snapshot, or by a client told the value (a tap's
    // record is purged once its 5 s window ends, which may fall between two
    // snapshots).
    let told_completed: BTreeSet<&str> = e
        .intents
        .iter()
        .flat_map(|i| &i.obs)
        .filter(|o| matches!(o.outcome.as_str(), "executed" | "replayed" | "COMPLETED"))
        .filter_map(|o| o.reference.as_deref())
        .collect();
    let completed_seen = |reference: &str| {
        told_completed.contains(reference)
            || e.history
                .get(reference)
                .is_some_and(|h| h.iter().any(|(_, _, s)| s == "COMPLETED"))
    };
    // A charge whose record never completed, where the record is known.
    for (reference, c) in &charges {
        if c.effects > 0 && !completed_seen(reference) {
            if let Some(state) = last_state(reference) {
                if state != "COMPLETED" {
                    flag(
                        7,
                        format!("charged, but the record's last state is {state}"),
                        Some(reference),
                        None,
                    );
                }
            }
        }
    }

    // 8. One receipt per completed charge, delivered once; none for
    // anything else.
    let mut mails: BTreeMap<String, (i64, usize)> = BTreeMap::new();
    if let Some(keys) = e.mailer["keys"].as_object() {
        for entries in keys.values() {
            let reference = entries[0]["request"]["reference"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            let m = mails.entry(reference).or_default();
            m.0 += sum(entries, "effects");
            m.1 += 1;
        }
    }
    for (reference, c) in &charges {
        if c.effects > 0
            && (completed_seen(reference) || last_state(reference).is_none_or(|s| s == "COMPLETED"))
        {
            let (delivered, keys) = mails.get(reference).copied().unwrap_or((0, 0));
            if delivered != 1 || keys != 1 {
                flag(
                    8,
                    format!("{delivered} receipt(s) under {keys} key(s) for a completed charge"),
                    Some(reference),
                    None,
                );
            }
        }
    }
    for (reference, (delivered, _)) in &mails {
        if *delivered > 0 && effects(reference) == 0 {
            flag(
                8,
                "a receipt for an operation that charged nothing".into(),
                Some(reference),
                None,
            );
        }
    }

    // 10. The processor is asked about one reference by one replica at a
    // time: no lookup arrives while another of its reference is answered.
    if let Some(keys) = e.processor["lookups_by_key"].as_object() {
        for (reference, n) in keys {
            let overlaps = n["overlaps"].as_i64().unwrap_or(0);
            if overlaps > 0 {
                flag(
                    10,
                    format!(
                        "{overlaps} of {} lookups arrived while another lookup of it was answered",
                        n["lookups"]
                    ),
                    Some(reference),
                    None,
                );
            }
        }
    }
    out
}

/// The processor's lookups: how many, of how many references, the most of
/// one reference, and how many references were asked about once.
pub fn lookups(processor: &Value) -> (i64, usize, i64, usize) {
    let per_key: Vec<i64> = processor["lookups_by_key"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(_, n)| n["lookups"].as_i64().unwrap_or(0))
        .collect();
    (
        per_key.iter().sum(),
        per_key.len(),
        per_key.iter().copied().max().unwrap_or(0),
        per_key.iter().filter(|n| **n == 1).count(),
    )
}

/// An intent's whole history, for a violation's report.
pub fn history_of(e: &Evidence<'_>, intent: Option<u64>, reference: Option<&str>) -> Value {
    let intents: Vec<&Intent> = e
        .intents
        .iter()
        .filter(|i| {
            Some(i.id) == intent
                || reference
                    .is_some_and(|r| i.obs.iter().any(|o| o.reference.as_deref() == Some(r)))
                || intent.is_some_and(|id| i.again_of == Some(id))
        })
        .collect();
    let mut refs: BTreeSet<String> = reference.into_iter().map(str::to_owned).collect();
    let mut cards = BTreeSet::new();
    for i in &intents {
        cards.insert(i.card.clone());
        refs.extend(i.obs.iter().filter_map(|o| o.reference.clone()));
    }
    let processor: BTreeMap<&String, &Value> = e.processor["keys"]
        .as_object()
        .map(|keys| {
            keys.iter()
                .filter(|(k, v)| {
                    refs.contains(*k)
                        || cards.contains(v[0]["request"]["card"].as_str().unwrap_or("-"))
                })
                .collect()
        })
        .unwrap_or_default();
    let records: Vec<&Value> = e
        .records
        .iter()
        .filter(|r| r["reference"].as_str().is_some_and(|x| refs.contains(x)))
        .collect();
    let states: BTreeMap<&String, &Vec<(u64, u64, String)>> = e
        .history
        .iter()
        .filter(|(r, _)| refs.contains(*r))
        .collect();
    json!({
        "intents": intents,
        "processor": processor,
        "records": records,
        "states": states,
    })
}
