//! Canonical JSON against the RFC 8785 reference vectors
//! (`tests/data/jcs/`, from cyberphone/json-canonicalization, Apache-2.0),
//! plus the exact-integer change and the error cases.

use std::fs;
use std::path::PathBuf;

use idem_runtime::key::canonical::{
    canonical_json, canonicalize_str, format_number_es6, CanonicalError, MAX_DEPTH,
};
use proptest::prelude::*;
use serde_json::{json, Value};

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/jcs")
}

#[test]
fn every_reference_input_canonicalizes_to_its_output_byte_for_byte() {
    let names = [
        "arrays",
        "french",
        "structures",
        "unicode",
        "values",
        "weird",
    ];
    for name in names {
        let input = fs::read_to_string(vectors().join(format!("input/{name}.json"))).unwrap();
        let expected = fs::read(vectors().join(format!("output/{name}.json"))).unwrap();
        let actual = canonicalize_str(&input).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            actual.as_bytes(),
            expected.as_slice(),
            "{name}: got {actual}"
        );
    }
    // The directory holds exactly the vectors above, so none is skipped.
    let mut on_disk: Vec<String> = fs::read_dir(vectors().join("input"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    on_disk.sort();
    let listed: Vec<String> = names.iter().map(|n| format!("{n}.json")).collect();
    assert_eq!(on_disk, listed);
}

#[test]
fn outhex_files_agree_with_the_outputs() {
    // Guards the data itself: an editor that touched an invisible byte in
    // output/ would make the test above compare against the wrong thing.
    for entry in fs::read_dir(vectors().join("outhex")).unwrap() {
        let path = entry.unwrap().path();
        let hex = fs::read_to_string(&path).unwrap();
        let bytes: Vec<u8> = hex
            .split_whitespace()
            .map(|pair| u8::from_str_radix(pair, 16).unwrap())
            .collect();
        let stem = path.file_stem().unwrap().to_str().unwrap();
        let output = fs::read(vectors().join(format!("output/{stem}.json"))).unwrap();
        assert_eq!(bytes, output, "{stem}");
    }
}

#[test]
fn all_ten_thousand_es6_number_vectors_format_as_expected() {
    let text = fs::read_to_string(vectors().join("es6testfile10k.txt")).unwrap();
    let mut checked = 0;
    let mut failures = Vec::new();
    for line in text.lines() {
        let (bits, expected) = line.split_once(',').unwrap();
        let f = f64::from_bits(u64::from_str_radix(bits, 16).unwrap());
        let actual = format_number_es6(f).unwrap();
        if actual != expected {
            failures.push(format!("{bits}: expected {expected}, got {actual}"));
        }
        checked += 1;
    }
    assert_eq!(checked, 10_000);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn floats_in_values_use_the_es6_form() {
    let value = json!([1000.0, -0.0, 1e21, 1e-7, 0.000001, 4.5, 56.0]);
    assert_eq!(
        canonical_json(&value).unwrap(),
        "[1000,0,1e+21,1e-7,0.000001,4.5,56]"
    );
}

#[test]
fn integers_are_exact_not_rounded_through_a_double() {
    let cases = [
        ("9007199254740993", "9007199254740993"),
        ("9007199254740992", "9007199254740992"),
        ("-9007199254740993", "-9007199254740993"),
        ("18446744073709551615", "18446744073709551615"),
        ("-9223372036854775808", "-9223372036854775808"),
        ("-0", "0"),
        // Past u64, serde_json holds a double: RFC 8785's form applies.
        ("18446744073709551616", "18446744073709552000"),
    ];
    for (text, expected) in cases {
        assert_eq!(canonicalize_str(text).unwrap(), expected, "{text}");
    }
    assert_eq!(
        canonical_json(&json!(u64::MAX)).unwrap(),
        "18446744073709551615"
    );
    assert_eq!(
        canonical_json(&json!(i64::MIN)).unwrap(),
        i64::MIN.to_string()
    );
}

#[test]
fn spellings_of_one_number_are_one_text() {
    for text in ["1000", "1e3", "1E3", "1000.0", "1.0e+3", "10000e-1"] {
        assert_eq!(canonicalize_str(text).unwrap(), "1000", "{text}");
    }
}

#[test]
fn string_escapes_follow_the_rfc() {
    let cases = [
        (r#""\u20ac\/\u0042""#, "\"€/B\""),
        (
            r#""\u000F\u000a\u0008\u000c\u000d\u0009""#,
            r#""\u000f\n\b\f\r\t""#,
        ),
        (r#""\u0000\u001f\u0020""#, r#""\u0000\u001f ""#),
        (r#""\"\\""#, r#""\"\\""#),
        ("\"\u{7f}\u{80}</script>\"", "\"\u{7f}\u{80}</script>\""),
        (r#""\u00e9""#, "\"é\""),
        (r#""\ud83d\ude02""#, "\"\u{1f602}\""),
        // No Unicode normalization: A + combining ring stays two characters.
        (r#""A\u030a""#, "\"A\u{30a}\""),
    ];
    for (text, expected) in cases {
        assert_eq!(canonicalize_str(text).unwrap(), expected, "{text}");
    }
}

#[test]
fn member_names_sort_by_utf16_code_units() {
    // U+1F602 is D83D DE02 in UTF-16, before U+FB33, though after it in UTF-8.
    let text = r#"{"\ufb33":1,"\ud83d\ude02":2,"\u00f6":3,"z":4,"":5,"Z":6}"#;
    assert_eq!(
        canonicalize_str(text).unwrap(),
        "{\"\":5,\"Z\":6,\"z\":4,\"ö\":3,\"\u{1f602}\":2,\"\u{fb33}\":1}"
    );
}

#[test]
fn whitespace_is_removed_and_array_order_kept() {
    let text = " [ 3 ,\n\t{ \"b\" : [ ] , \"a\" : { } } , 1 ] ";
    assert_eq!(canonicalize_str(text).unwrap(), r#"[3,{"a":{},"b":[]},1]"#);
}

#[test]
fn a_lone_surrogate_in_the_text_is_refused() {
    for text in [
        r#""\ud800""#,
        r#""\udc00""#,
        r#"{"\ud83d":1}"#,
        r#""a\ud83dz""#,
    ] {
        match canonicalize_str(text) {
            Err(CanonicalError::InvalidJson(message)) => {
                assert!(message.contains("surrogate"), "{text}: {message}")
            }
            other => panic!("{text}: expected InvalidJson, got {other:?}"),
        }
    }
    let message = canonicalize_str("{\n  \"k\": \"\\ud83d\\ude02 \\udc00\"}")
        .unwrap_err()
        .to_string();
    assert!(
        message.contains(r"the escape \udc00 at line 2 column 22"),
        "{message}"
    );
    // An escaped backslash followed by "ud800" is six ordinary characters.
    assert_eq!(canonicalize_str(r#""\\ud800""#).unwrap(), r#""\\ud800""#);
}

#[test]
fn a_repeated_member_name_is_refused() {
    match canonicalize_str(r#"{"a":1,"b":{"c":1,"c":2}}"#) {
        Err(CanonicalError::InvalidJson(message)) => {
            assert!(message.contains("\"c\" appears twice"), "{message}")
        }
        other => panic!("expected InvalidJson, got {other:?}"),
    }
    // The same name in different objects is fine.
    assert!(canonicalize_str(r#"{"a":{"a":1},"b":[{"a":1},{"a":2}]}"#).is_ok());
}

#[test]
fn other_invalid_text_is_refused() {
    for text in [
        "", "{", "[1,]", "NaN", "Infinity", "1e400", "{'a':1}", "[] []",
    ] {
        assert!(
            matches!(canonicalize_str(text), Err(CanonicalError::InvalidJson(_))),
            "{text}"
        );
    }
}

#[test]
fn non_finite_numbers_are_refused() {
    for f in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert!(matches!(
            format_number_es6(f),
            Err(CanonicalError::NonFinite)
        ));
    }
}

/// `depth` arrays, alternating with objects, around a `0`.
fn nested(depth: usize) -> Value {
    let mut value = json!(0);
    for level in 0..depth {
        value = if level % 2 == 0 {
            json!([value])
        } else {
            json!({ "k": value })
        };
    }
    value
}

#[test]
fn nesting_up_to_the_limit_is_accepted_and_one_more_level_refused() {
    assert_eq!(MAX_DEPTH, 128);
    // 128 nested arrays/objects around a scalar pass ...
    let text = canonical_json(&nested(MAX_DEPTH)).unwrap();
    assert_eq!(text.matches('[').count() + text.matches('{').count(), 128);
    // ... 129 do not.
    match canonical_json(&nested(MAX_DEPTH + 1)) {
        Err(CanonicalError::TooDeep { limit }) => assert_eq!(limit, 128),
        other => panic!("expected TooDeep, got {other:?}"),
    }
    // An empty container counts as a level too.
    let mut value = json!([]);
    for _ in 1..=MAX_DEPTH {
        value = json!([value]);
    }
    assert!(matches!(
        canonical_json(&value),
        Err(CanonicalError::TooDeep { .. })
    ));
}

#[test]
fn the_text_entry_point_reads_127_levels() {
    // serde_json's parser stops one level below MAX_DEPTH.
    let text = |depth: usize| format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    assert!(canonicalize_str(&text(127)).is_ok());
    assert!(matches!(
        canonicalize_str(&text(128)),
        Err(CanonicalError::InvalidJson(_))
    ));
}

#[test]
fn errors_say_what_to_do() {
    let too_deep = canonical_json(&nested(200)).unwrap_err().to_string();
    assert!(too_deep.contains("more than 128 levels"), "{too_deep}");
    let invalid = canonicalize_str(r#""\ud800""#).unwrap_err().to_string();
    assert!(invalid.contains("line 1"), "{invalid}");
}

/// Any JSON value, with strings over all of Unicode (including the
/// characters whose UTF-8 and UTF-16 orders disagree).
fn any_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map(any::<String>(), inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Another spelling of `value`: members in reverse order, every non-ASCII
/// character and some ASCII ones as `\uXXXX` escapes, floats in exponent
/// form, whitespace everywhere.
fn respelled(value: &Value) -> String {
    match value {
        Value::Number(n) if n.is_f64() => format!(" {:E} ", n.as_f64().unwrap()),
        Value::String(s) => {
            let mut out = String::from("\"");
            for unit in s.encode_utf16() {
                match unit {
                    0x20..=0x7e
                        if unit != u16::from(b'"') && unit != u16::from(b'\\') && unit % 3 != 0 =>
                    {
                        out.push(char::from(unit as u8))
                    }
                    _ => out.push_str(&format!("\\u{unit:04X}")),
                }
            }
            out.push('"');
            out
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(respelled).collect();
            format!("[ {} ]", items.join(" ,\n"))
        }
        Value::Object(members) => {
            let members: Vec<String> = members
                .iter()
                .rev()
                .map(|(name, v)| {
                    format!(
                        "{} :\t{}",
                        respelled(&Value::from(name.as_str())),
                        respelled(v)
                    )
                })
                .collect();
            format!("{{ {} }}", members.join(" , "))
        }
        other => format!(" {other} "),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn canonical_text_is_a_fixed_point(value in any_value()) {
        let text = canonical_json(&value).unwrap();
        prop_assert_eq!(canonicalize_str(&text).unwrap(), text);
    }

    #[test]
    fn members_come_out_in_utf16_order(names in prop::collection::btree_set(any::<String>(), 0..12)) {
        let value = Value::Object(names.iter().map(|n| (n.clone(), json!(0))).collect());
        let mut sorted: Vec<&String> = names.iter().collect();
        sorted.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
        // serde_json's own string escaping is the RFC 8785 one.
        let members: Vec<String> = sorted
            .iter()
            .map(|n| format!("{}:0", serde_json::to_string(n).unwrap()))
            .collect();
        prop_assert_eq!(canonical_json(&value).unwrap(), format!("{{{}}}", members.join(",")));
    }

    #[test]
    fn another_spelling_of_a_value_has_the_same_text(value in any_value()) {
        let text = respelled(&value);
        prop_assert_eq!(canonicalize_str(&text).unwrap(), canonical_json(&value).unwrap(), "{}", text);
    }
}
