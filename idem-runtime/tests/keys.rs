//! Operation keys: one key per operation, however it is spelled, and a new
//! key for anything that makes it another operation.

use std::time::Duration;

use idem_runtime::{
    key::canonical::{canonical_json, CanonicalError},
    key::{IdempotencyKey, KeyError, Scope},
    Caller, Reference,
};
use proptest::prelude::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

fn window() -> Scope {
    Scope::Window(Duration::from_secs(15 * 60))
}

fn alice() -> Caller {
    Caller::new("acme", "alice")
}

fn key(caller: &Caller, tool: &str, args: &Value, scope: &Scope) -> IdempotencyKey {
    IdempotencyKey::derive(caller, tool, args, scope).unwrap()
}

/// The key of `args` given as JSON text, the way a server receives it.
fn key_of_text(text: &str) -> IdempotencyKey {
    let args: Value = serde_json::from_str(text).unwrap();
    key(&alice(), "charge", &args, &window())
}

#[test]
fn member_order_whitespace_escapes_and_number_spellings_give_one_key() {
    let spellings = [
        r#"{"amount":1000,"currency":"EUR","memo":"café"}"#,
        r#"{"memo":"café","currency":"EUR","amount":1000}"#,
        "{ \"amount\" : 1000 ,\n\t\"currency\" : \"EUR\", \"memo\": \"café\" }",
        r#"{"amount":1000,"currency":"\u0045UR","memo":"caf\u00e9"}"#,
        r#"{"amount":1000,"currency":"EUR","memo":"caf\u00E9"}"#,
        r#"{"amount":1e3,"currency":"EUR","memo":"café"}"#,
        r#"{"amount":1000.0,"currency":"EUR","memo":"café"}"#,
        r#"{"amount":1.000E+3,"currency":"EUR","memo":"café"}"#,
    ];
    let first = key_of_text(spellings[0]);
    for text in spellings {
        let k = key_of_text(text);
        assert_eq!(k.as_bytes(), first.as_bytes(), "{text}");
        assert_eq!(k.fingerprint(), first.fingerprint(), "{text}");
    }
}

#[test]
fn integers_past_two_to_the_53_are_distinct_operations() {
    let a = key_of_text(r#"{"cents":9007199254740993}"#);
    let b = key_of_text(r#"{"cents":9007199254740992}"#);
    assert_ne!(a.as_bytes(), b.as_bytes());
    assert_ne!(a.fingerprint(), b.fingerprint());
}

#[test]
fn each_part_of_the_operation_changes_the_key() {
    let args = json!({"to": "bob", "cents": 500});
    let base = key(&alice(), "charge", &args, &window());
    let others = [
        key(&Caller::new("globex", "alice"), "charge", &args, &window()),
        key(&Caller::new("acme", "bob"), "charge", &args, &window()),
        key(&alice(), "refund", &args, &window()),
        key(
            &alice(),
            "charge",
            &json!({"to": "bob", "cents": 501}),
            &window(),
        ),
        key(
            &alice(),
            "charge",
            &json!({"to": "bob", "cents": "500"}),
            &window(),
        ),
        key(
            &alice(),
            "charge",
            &json!({"to": "bob", "cents": 500, "x": null}),
            &window(),
        ),
        key(&alice(), "charge", &json!({"to": "bob"}), &window()),
        key(&alice(), "charge", &args, &Scope::BusinessKey(args.clone())),
    ];
    for (i, other) in others.iter().enumerate() {
        assert_ne!(other.as_bytes(), base.as_bytes(), "change #{i}");
    }
}

#[test]
fn fields_are_length_prefixed_not_joined() {
    let args = json!({});
    let pairs = [
        (("a|b", "c"), ("a", "b|c")),
        (("ab", "c"), ("a", "bc")),
        (("a", ""), ("", "a")),
    ];
    for ((t1, s1), (t2, s2)) in pairs {
        assert_ne!(
            key(&Caller::new(t1, s1), "t", &args, &window()).as_bytes(),
            key(&Caller::new(t2, s2), "t", &args, &window()).as_bytes(),
            "{t1:?}+{s1:?} vs {t2:?}+{s2:?}"
        );
    }
    // The subject/tool boundary too.
    assert_ne!(
        key(&Caller::new("t", "ab"), "c", &args, &window()).as_bytes(),
        key(&Caller::new("t", "a"), "bc", &args, &window()).as_bytes(),
    );
}

#[test]
fn the_window_duration_is_not_part_of_the_key() {
    let args = json!({"to": "bob"});
    let short = key(
        &alice(),
        "charge",
        &args,
        &Scope::Window(Duration::from_secs(60)),
    );
    let long = key(
        &alice(),
        "charge",
        &args,
        &Scope::Window(Duration::from_secs(86_400)),
    );
    assert_eq!(short, long, "key and fingerprint");
}

#[test]
fn a_business_key_ignores_the_subject_and_other_arguments_but_not_the_fingerprint() {
    let order = Scope::BusinessKey(json!("order-17"));
    let a = key(
        &Caller::new("acme", "alice"),
        "ship",
        &json!({"order_id": "order-17", "speed": "express"}),
        &order,
    );
    let by_bob = key(
        &Caller::new("acme", "bob"),
        "ship",
        &json!({"order_id": "order-17", "speed": "express"}),
        &order,
    );
    let slower = key(
        &Caller::new("acme", "alice"),
        "ship",
        &json!({"order_id": "order-17", "speed": "ground"}),
        &order,
    );
    assert_eq!(a.as_bytes(), by_bob.as_bytes());
    assert_eq!(a.fingerprint(), by_bob.fingerprint());
    assert_eq!(a.as_bytes(), slower.as_bytes());
    assert_ne!(a.fingerprint(), slower.fingerprint());

    // Still tenant-scoped, tool-scoped and keyed on the business key's value.
    let other_tenant = key(&Caller::new("globex", "alice"), "ship", &json!({}), &order);
    let other_tool = key(&alice(), "cancel", &json!({}), &order);
    let other_order = key(
        &alice(),
        "ship",
        &json!({}),
        &Scope::BusinessKey(json!("order-18")),
    );
    let base = key(&alice(), "ship", &json!({}), &order);
    assert_ne!(base.as_bytes(), other_tenant.as_bytes());
    assert_ne!(base.as_bytes(), other_tool.as_bytes());
    assert_ne!(base.as_bytes(), other_order.as_bytes());

    // A business key is canonicalized like the arguments.
    let composite = |text: &str| {
        key(
            &alice(),
            "ship",
            &json!({}),
            &Scope::BusinessKey(serde_json::from_str(text).unwrap()),
        )
    };
    assert_eq!(
        composite(r#"{"order":17,"line":2}"#),
        composite(r#"{ "line": 2.0, "order": 1.7e1 }"#)
    );
}

#[test]
fn an_empty_business_key_is_refused() {
    for empty in [
        json!(null),
        json!(""),
        json!([]),
        json!({}),
        json!({"order_id": null}),
        json!([null, ""]),
    ] {
        let result = IdempotencyKey::derive(
            &alice(),
            "ship",
            &json!({}),
            &Scope::BusinessKey(empty.clone()),
        );
        assert!(matches!(result, Err(KeyError::EmptyBusinessKey)), "{empty}");
    }
    for present in [json!(0), json!(false), json!(" "), json!({"order_id": 0})] {
        assert!(
            IdempotencyKey::derive(
                &alice(),
                "ship",
                &json!({}),
                &Scope::BusinessKey(present.clone())
            )
            .is_ok(),
            "{present}"
        );
    }
}

#[test]
fn arguments_too_deep_to_canonicalize_are_an_error() {
    let mut args = json!(0);
    for _ in 0..200 {
        args = json!([args]);
    }
    let result = IdempotencyKey::derive(&alice(), "charge", &args, &window());
    assert!(matches!(
        result,
        Err(KeyError::Canonical(CanonicalError::TooDeep { limit: 128 }))
    ));
}

/// `len(bytes) as u64 big-endian ‖ bytes`, written out independently of the
/// crate so the test pins the documented encoding.
fn field(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

#[test]
fn keys_are_sha256_over_the_documented_encoding() {
    // Stored keys must stay stable; this recomputes them from the rustdoc's
    // description, from the canonical text written out by hand.
    let args = json!({"to": "bob", "cents": 500, "memo": "1\n"});
    let canonical = r#"{"cents":500,"memo":"1\n","to":"bob"}"#;
    assert_eq!(canonical_json(&args).unwrap(), canonical);
    let args_digest = Sha256::digest(canonical.as_bytes());

    let mut expected_key = Sha256::new();
    for part in [
        &b"idem/key/v1"[..],
        b"acme",
        b"alice",
        b"charge",
        b"window",
        &args_digest,
    ] {
        field(&mut expected_key, part);
    }
    let mut expected_fingerprint = Sha256::new();
    for part in [&b"idem/fingerprint/v1"[..], b"charge", &args_digest] {
        field(&mut expected_fingerprint, part);
    }
    let k = key(&alice(), "charge", &args, &window());
    assert_eq!(k.as_bytes()[..], expected_key.finalize()[..]);
    assert_eq!(k.fingerprint()[..], expected_fingerprint.finalize()[..]);

    let business_digest = Sha256::digest(br#"{"order":17}"#);
    let mut expected_key = Sha256::new();
    for part in [
        &b"idem/key/v1"[..],
        b"acme",
        b"",
        b"charge",
        b"business_key",
        &business_digest,
    ] {
        field(&mut expected_key, part);
    }
    let k = key(
        &alice(),
        "charge",
        &args,
        &Scope::BusinessKey(json!({"order": 17})),
    );
    assert_eq!(k.as_bytes()[..], expected_key.finalize()[..]);
}

#[test]
fn display_is_the_key_in_lowercase_hex_and_the_reference_its_prefix() {
    let k = key(&alice(), "charge", &json!({"to": "bob"}), &window());
    let hex = k.to_string();
    assert_eq!(hex.len(), 64);
    assert!(hex
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    let bytes_as_hex: String = k.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex, bytes_as_hex);

    // An operation's reference: the key's first 64 bits, then a tag of 64
    // drawn for the operation; two operations of one key differ.
    let reference = Reference::new_operation(&k);
    let text = reference.to_string();
    assert_eq!(text.len(), "idem_".len() + 32);
    assert_eq!(
        text.strip_prefix("idem_").map(|t| &t[..16]),
        Some(&hex[..16])
    );
    assert_eq!(reference.as_bytes().len(), 16);
    assert_eq!(reference.key_prefix()[..], k.as_bytes()[..8]);
    assert!(reference.is_of(&k));
    assert_ne!(reference.tag(), 0);
    assert_ne!(Reference::new_operation(&k), reference);
}

#[test]
fn a_reference_parses_back_and_junk_does_not() {
    let k = key(&alice(), "charge", &json!({"to": "bob"}), &window());
    let reference = Reference::new_operation(&k);
    let text = reference.to_string();
    assert_eq!(Reference::parse(&text), Some(reference));
    // Without the prefix, in capitals, or with spaces around: the same.
    let digits = &text["idem_".len()..];
    assert_eq!(Reference::parse(digits), Some(reference));
    assert_eq!(
        Reference::parse(&text.to_uppercase().replace("IDEM_", "idem_")),
        Some(reference)
    );
    assert_eq!(Reference::parse(&format!("  {text}\n")), Some(reference));
    // A reference written before references had tags: 16 digits, tag zero,
    // printed as it was.
    let legacy = Reference::parse(&format!("idem_{}", &k.to_string()[..16])).unwrap();
    assert_eq!(legacy.tag(), 0);
    assert_eq!(legacy.as_bytes(), &k.as_bytes()[..8]);
    assert_eq!(legacy.to_string(), format!("idem_{}", &k.to_string()[..16]));
    assert_eq!(Reference::from_bytes(legacy.as_bytes()), Some(legacy));
    assert_eq!(Reference::from_bytes(reference.as_bytes()), Some(reference));
    assert_eq!(Reference::from_bytes(&[1; 12]), None);

    let hex = digits;
    for junk in [
        String::new(),
        "idem_".into(),
        format!("idem_{}", &hex[..31]),
        format!("idem_{hex}0"),
        format!("idem-{hex}"),
        format!("op_{hex}"),
        format!("idem_{}g", &hex[..31]),
        format!("idem_{}", "+f".repeat(16)),
        format!("idem_{}", "-0".repeat(16)),
        "idem_ééééééé00".into(),
        format!("idem_{hex} idem_{hex}"),
        format!("idem_idem_{hex}"),
    ] {
        assert_eq!(Reference::parse(&junk), None, "{junk:?}");
    }
}

/// JSON arguments: objects of scalars, arrays and nested objects.
fn any_args() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,12}".prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ];
    let value = leaf.prop_recursive(3, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    prop::collection::btree_map("[a-z_]{1,10}", value, 0..8)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
}

/// Another spelling of `value`: members in reverse order, every character
/// as a `\uXXXX` escape, floats in exponent form, extra whitespace.
fn respelled(value: &Value) -> String {
    match value {
        Value::Number(n) if n.is_f64() => format!("{:e}", n.as_f64().unwrap()),
        Value::String(s) => {
            let units: String = s.encode_utf16().map(|u| format!("\\u{u:04x}")).collect();
            format!("\"{units}\"")
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(respelled).collect();
            format!("[ {} ]", items.join(" , "))
        }
        Value::Object(members) => {
            let members: Vec<String> = members
                .iter()
                .rev()
                .map(|(name, v)| format!("{} :\n {}", respelled(&json!(name)), respelled(v)))
                .collect();
            format!("{{\t{} }}", members.join(",\n"))
        }
        other => other.to_string(),
    }
}

/// One way to make a call a different operation.
#[derive(Debug, Clone)]
enum Change {
    Tenant(String),
    Subject(String),
    Tool(String),
    /// Set this argument to this value (adding it if absent).
    Argument(String, Value),
    ToBusinessKey,
}

fn any_change() -> impl Strategy<Value = Change> {
    prop_oneof![
        any::<String>().prop_map(Change::Tenant),
        any::<String>().prop_map(Change::Subject),
        any::<String>().prop_map(Change::Tool),
        ("[a-z_]{1,10}", any_args()).prop_map(|(n, v)| Change::Argument(n, v)),
        ("[a-z_]{1,10}", any::<i64>()).prop_map(|(n, v)| Change::Argument(n, json!(v))),
        ("[a-z_]{1,10}", any::<String>()).prop_map(|(n, v)| Change::Argument(n, json!(v))),
        Just(Change::ToBusinessKey),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn a_respelled_call_has_the_same_key_and_fingerprint(
        args in any_args(),
        tenant in any::<String>(),
        subject in any::<String>(),
        tool in any::<String>(),
    ) {
        let caller = Caller::new(tenant, subject);
        let text = respelled(&args);
        let parsed: Value = serde_json::from_str(&text).unwrap();
        let a = key(&caller, &tool, &args, &window());
        let b = key(&caller, &tool, &parsed, &window());
        prop_assert_eq!(a.as_bytes(), b.as_bytes(), "{}", text);
        prop_assert_eq!(a.fingerprint(), b.fingerprint());
    }

    #[test]
    fn any_change_to_the_operation_changes_the_key(
        args in any_args(),
        tenant in any::<String>(),
        subject in any::<String>(),
        tool in any::<String>(),
        change in any_change(),
    ) {
        let base = key(&Caller::new(&*tenant, &*subject), &tool, &args, &window());
        let (mut tenant2, mut subject2, mut tool2, mut args2, mut scope2) =
            (tenant.clone(), subject.clone(), tool.clone(), args.clone(), window());
        match change {
            Change::Tenant(t) => tenant2 = t,
            Change::Subject(s) => subject2 = s,
            Change::Tool(t) => tool2 = t,
            Change::Argument(name, value) => {
                args2.as_object_mut().unwrap().insert(name, value);
            }
            Change::ToBusinessKey => scope2 = Scope::BusinessKey(args.clone()),
        }
        let same_operation = tenant2 == tenant
            && subject2 == subject
            && tool2 == tool
            && canonical_json(&args2).unwrap() == canonical_json(&args).unwrap()
            && scope2 == window();
        prop_assume!(!same_operation);
        if let Scope::BusinessKey(business_key) = &scope2 {
            // An empty object is not a usable business key.
            prop_assume!(!business_key.as_object().unwrap().is_empty());
        }
        let changed = IdempotencyKey::derive(&Caller::new(tenant2, subject2), &tool2, &args2, &scope2);
        match changed {
            Ok(changed) => prop_assert_ne!(changed.as_bytes(), base.as_bytes()),
            Err(KeyError::EmptyBusinessKey) => {}
            Err(e) => return Err(TestCaseError::fail(e.to_string())),
        }
    }

    #[test]
    fn moving_bytes_between_tenant_and_subject_changes_the_key(
        a in any::<String>(),
        b in ".{1,8}",
        c in any::<String>(),
        args in any_args(),
    ) {
        let joined_left = key(&Caller::new(format!("{a}{b}"), &*c), "t", &args, &window());
        let joined_right = key(&Caller::new(&*a, format!("{b}{c}")), "t", &args, &window());
        prop_assert_ne!(joined_left.as_bytes(), joined_right.as_bytes());
    }

    #[test]
    fn a_business_key_is_shared_by_every_subject_and_any_other_arguments(
        order in any::<u64>(),
        subject_a in any::<String>(),
        subject_b in any::<String>(),
        extra_a in any_args(),
        extra_b in any_args(),
    ) {
        let scope = Scope::BusinessKey(json!(order));
        let with = |extra: &Value| {
            let mut args = extra.clone();
            args.as_object_mut().unwrap().insert("order_id".into(), json!(order));
            args
        };
        let a = key(&Caller::new("acme", subject_a), "ship", &with(&extra_a), &scope);
        let b = key(&Caller::new("acme", subject_b), "ship", &with(&extra_b), &scope);
        prop_assert_eq!(a.as_bytes(), b.as_bytes());
        let same_args = canonical_json(&with(&extra_a)).unwrap() == canonical_json(&with(&extra_b)).unwrap();
        prop_assert_eq!(a.fingerprint() == b.fingerprint(), same_args);
    }
}
