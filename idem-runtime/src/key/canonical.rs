//! Canonical JSON: RFC 8785 (JCS), with exact integers.
//!
//! Two JSON texts that mean the same value have one canonical form, so an
//! operation's arguments hash to one key however the client spelled them.
//! The rules are documented on [`canonical_json`].
//!
//! One follow-on, over 700 lines: RFC 8785 text and its tests (most of the file).

use std::cmp::Ordering;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// How deeply arrays and objects may nest.
///
/// The depth of a value is the number of arrays and objects on the path from
/// the root to it, counting itself: `1` has depth 0, `[1]` depth 1, `[[1]]`
/// depth 2. A value whose depth is at most `MAX_DEPTH` (128 nested arrays or
/// objects) is canonicalized; one level more is [`CanonicalError::TooDeep`].
/// The bound keeps the recursive writer's stack use small and fixed.
///
/// [`canonicalize_str`] is bounded a little lower, by `serde_json`'s parser:
/// it reads at most 127 nested levels.
pub const MAX_DEPTH: usize = 128;

/// Why a value has no canonical form.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CanonicalError {
    /// A number is NaN or infinite. JSON has no spelling for these; a
    /// `serde_json::Value` cannot hold one, so only [`format_number_es6`]
    /// reports this.
    #[error("the number is NaN or infinite, which JSON cannot represent; pass a finite number")]
    NonFinite,
    /// Arrays and objects nest deeper than [`MAX_DEPTH`].
    #[error(
        "the value nests arrays and objects more than {limit} levels deep; \
         flatten the arguments to at most {limit} levels"
    )]
    TooDeep {
        /// The deepest nesting accepted ([`MAX_DEPTH`]).
        limit: usize,
    },
    /// The text given to [`canonicalize_str`] is not valid JSON: a syntax
    /// error, an escaped lone surrogate such as `"\ud800"` (not a Unicode
    /// character), or an object with a repeated member name (RFC 8785 requires
    /// I-JSON, whose names are unique).
    #[error("the text is not valid JSON for canonicalization: {0}; send well-formed JSON")]
    InvalidJson(String),
}

/// The canonical JSON text of `value`.
///
/// The form follows RFC 8785 with one deliberate change: a number that
/// `serde_json` holds as an integer (`i64` or `u64`) is written exactly, never
/// rounded through a double. Under plain RFC 8785, `9007199254740993` and
/// `9007199254740992` are both written `9007199254740992`, so two payments
/// would be one operation and the second would be suppressed. Everything else
/// is RFC 8785:
///
/// - object members sorted by the UTF-16 code units of their names (so U+1F602
///   sorts before U+FB33, unlike UTF-8 byte order);
/// - floats in ECMAScript `Number.prototype.toString` form (`1000.0` → `1000`,
///   `-0` → `0`, `1e21` → `1e+21`, `0.000001`, `1e-7`);
/// - strings escaped only where JSON requires it: `\"`, `\\`, `\b \f \n \r \t`,
///   and other characters below U+0020 as `\u00xx` (lowercase hex). Everything
///   else, including U+007F, U+0080, `/` and `<`, is written as is, with no
///   Unicode normalization;
/// - no whitespace.
///
/// Integers beyond the range of `i64`/`u64` are held by `serde_json` as
/// doubles, and are written as RFC 8785 writes them.
///
/// # Errors
///
/// [`CanonicalError::TooDeep`] if arrays and objects nest deeper than
/// [`MAX_DEPTH`].
///
/// # Examples
///
/// ```
/// let value = serde_json::json!({"b": [1000.0, "é\n"], "a": 9007199254740993u64});
/// assert_eq!(
///     idem_runtime::key::canonical::canonical_json(&value).unwrap(),
///     r#"{"a":9007199254740993,"b":[1000,"é\n"]}"#,
/// );
/// ```
pub fn canonical_json(value: &Value) -> Result<String, CanonicalError> {
    let mut out = String::new();
    write_canonical(value, &mut out, 0)?;
    Ok(out)
}

/// Parses JSON text and returns its canonical form (see [`canonical_json`]).
///
/// # Errors
///
/// [`CanonicalError::InvalidJson`] if the text is not JSON, contains an
/// escaped lone surrogate (`"\ud800"`), repeats a member name within one
/// object, or nests deeper than the parser's limit of 127 levels.
///
/// # Examples
///
/// ```
/// let canonical = idem_runtime::key::canonical::canonicalize_str(r#"{ "b": 1e3, "a": "\u00e9" }"#).unwrap();
/// assert_eq!(canonical, r#"{"a":"é","b":1000}"#);
/// ```
pub fn canonicalize_str(text: &str) -> Result<String, CanonicalError> {
    let value: Value = serde_json::from_str(text).map_err(|e| {
        // serde_json reports "\ud800" as a malformed hex escape; say what
        // is actually wrong with it.
        CanonicalError::InvalidJson(match find_lone_surrogate(text) {
            Some((escape, line, column)) => format!(
                "the escape {escape} at line {line} column {column} is a lone UTF-16 \
                 surrogate, which is not a Unicode character (write a pair such as \
                 \\ud83d\\ude02, or the character itself)"
            ),
            None => e.to_string(),
        })
    })?;
    // `Value` keeps the last of repeated names silently; a second pass over
    // the text refuses them instead of canonicalizing a value the sender may
    // not have meant.
    serde_json::from_str::<UniqueNames>(text)
        .map_err(|e| CanonicalError::InvalidJson(e.to_string()))?;
    canonical_json(&value)
}

/// Formats a double as ECMAScript's `Number.prototype.toString` does, which
/// is how RFC 8785 writes every number: the shortest digits that read back as
/// the same double, in plain notation from 1e-7 to below 1e21 and in
/// exponent notation (`1e+21`, `5e-324`) outside it. `-0` is written `0`.
///
/// # Errors
///
/// [`CanonicalError::NonFinite`] for NaN and the infinities.
///
/// # Examples
///
/// ```
/// use idem_runtime::key::canonical::format_number_es6;
/// assert_eq!(format_number_es6(1e21).unwrap(), "1e+21");
/// assert_eq!(format_number_es6(333333333.33333329).unwrap(), "333333333.3333333");
/// assert_eq!(format_number_es6(-0.0).unwrap(), "0");
/// assert!(format_number_es6(f64::NAN).is_err());
/// ```
pub fn format_number_es6(f: f64) -> Result<String, CanonicalError> {
    let mut out = String::new();
    write_f64(f, &mut out)?;
    Ok(out)
}

/// Where the canonical writer puts its output: a `String`, or a hasher that
/// consumes the bytes as they come, so the whole text is never held at once.
pub(crate) trait Sink {
    /// Appends `s`: a number, an escape, or a run of unescaped string bytes.
    fn write_str(&mut self, s: &str);

    /// Appends one ASCII byte (punctuation). Separate from `write_str` because
    /// it is the most frequent write and needs no length or copy.
    fn write_ascii(&mut self, byte: u8);
}

impl Sink for String {
    fn write_str(&mut self, s: &str) {
        self.push_str(s);
    }

    fn write_ascii(&mut self, byte: u8) {
        debug_assert!(byte.is_ascii());
        self.push(char::from(byte));
    }
}

/// Writes the canonical form of `value` into `out`. `depth` is the number of
/// arrays and objects enclosing `value` (0 at the root).
///
/// On error, `out` holds a partial text that must be discarded.
pub(crate) fn write_canonical<S: Sink>(
    value: &Value,
    out: &mut S,
    depth: usize,
) -> Result<(), CanonicalError> {
    match value {
        Value::Null => out.write_str("null"),
        Value::Bool(true) => out.write_str("true"),
        Value::Bool(false) => out.write_str("false"),
        Value::Number(n) => write_number(n, out)?,
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            let depth = enter(depth)?;
            out.write_ascii(b'[');
            let mut items = items.iter();
            if let Some(first) = items.next() {
                write_canonical(first, out, depth)?;
                for item in items {
                    out.write_ascii(b',');
                    write_canonical(item, out, depth)?;
                }
            }
            out.write_ascii(b']');
        }
        Value::Object(map) => {
            let depth = enter(depth)?;
            out.write_ascii(b'{');
            if names_in_utf16_order(map) {
                // The usual case: serde_json's default map iterates in UTF-8
                // order, which is UTF-16 order unless a name holds a character
                // at or above U+E000. No allocation is needed then.
                write_members(map.iter(), out, depth)?;
            } else {
                let mut members: Vec<(&String, &Value)> = map.iter().collect();
                members.sort_unstable_by(|a, b| cmp_utf16(a.0, b.0));
                write_members(members.into_iter(), out, depth)?;
            }
            out.write_ascii(b'}');
        }
    }
    Ok(())
}

/// The depth inside a new array or object, if that is still allowed.
fn enter(depth: usize) -> Result<usize, CanonicalError> {
    if depth >= MAX_DEPTH {
        return Err(CanonicalError::TooDeep { limit: MAX_DEPTH });
    }
    Ok(depth + 1)
}

fn write_members<'a, S: Sink>(
    members: impl Iterator<Item = (&'a String, &'a Value)>,
    out: &mut S,
    depth: usize,
) -> Result<(), CanonicalError> {
    for (i, (name, value)) in members.enumerate() {
        if i > 0 {
            out.write_ascii(b',');
        }
        write_string(name, out);
        out.write_ascii(b':');
        write_canonical(value, out, depth)?;
    }
    Ok(())
}

/// Whether the map already iterates in strictly increasing UTF-16 order.
fn names_in_utf16_order(map: &Map<String, Value>) -> bool {
    let mut names = map.keys();
    let Some(mut prev) = names.next() else {
        return true;
    };
    for name in names {
        if cmp_utf16(prev, name) != Ordering::Less {
            return false;
        }
        prev = name;
    }
    true
}

/// Compares two strings by their UTF-16 code units, as RFC 8785 sorts member
/// names, without encoding them.
///
/// UTF-8 byte order is code point order, and code point order is UTF-16
/// order except in one case: a character above U+FFFF is written in UTF-16
/// as a surrogate pair starting with D800..DBFF, which sorts *before* the BMP
/// characters U+E000..U+FFFF. So compare bytes, and at the first difference
/// fix up that one case. The strings agree up to that byte, so either both
/// bytes start a character (lead bytes 0xEE/0xEF for U+E000..U+FFFF, 0xF0..
/// for above U+FFFF) or both are continuation bytes of characters of the same
/// length, where byte order is already right.
pub(crate) fn cmp_utf16(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    match first_difference(a, b) {
        None => a.len().cmp(&b.len()),
        Some(i) => match (a[i], b[i]) {
            (0xEE..=0xEF, 0xF0..) => Ordering::Greater,
            (0xF0.., 0xEE..=0xEF) => Ordering::Less,
            (x, y) => x.cmp(&y),
        },
    }
}

/// The index of the first byte where `a` and `b` differ, if one ends
/// before they do not; compared a word at a time, since member names often
/// share a long prefix (`item_00017`, `item_00018`).
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    let common = a.len().min(b.len());
    let (a, b) = (&a[..common], &b[..common]);
    let mut i = 0;
    while let (Some(x), Some(y)) = (a[i..].first_chunk::<8>(), b[i..].first_chunk::<8>()) {
        let diff = u64::from_le_bytes(*x) ^ u64::from_le_bytes(*y);
        if diff != 0 {
            return Some(i + (diff.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    (i..common).find(|&j| a[j] != b[j])
}

fn write_number<S: Sink>(n: &Number, out: &mut S) -> Result<(), CanonicalError> {
    // Integers are written exactly: this is the one deliberate departure from
    // RFC 8785, which would round them through a double.
    if let Some(u) = n.as_u64() {
        out.write_str(itoa::Buffer::new().format(u));
    } else if let Some(i) = n.as_i64() {
        out.write_str(itoa::Buffer::new().format(i));
    } else {
        write_f64(n.as_f64().ok_or(CanonicalError::NonFinite)?, out)?;
    }
    Ok(())
}

fn write_f64<S: Sink>(f: f64, out: &mut S) -> Result<(), CanonicalError> {
    if !f.is_finite() {
        return Err(CanonicalError::NonFinite);
    }
    // Below 2^53 an integral double converts to i64 exactly, and ECMAScript
    // writes it as that integer ("1000", and "0" for -0); itoa is several
    // times faster than the shortest-digits search.
    if f.abs() < 9_007_199_254_740_992.0 && (f as i64) as f64 == f {
        out.write_str(itoa::Buffer::new().format(f as i64));
    } else {
        let mut es = EsNumber::new();
        out.write_str(es.format(f));
    }
    Ok(())
}

/// The ECMAScript form of a finite double (Number::prototype.toString):
/// zmij finds the shortest digits that round-trip (Schubfach, faster than
/// Ryū), and they are laid out here as ECMAScript writes them.
struct EsNumber {
    shortest: zmij::Buffer,
    bytes: [u8; 40],
}

impl EsNumber {
    fn new() -> Self {
        EsNumber {
            shortest: zmij::Buffer::new(),
            bytes: [0; 40],
        }
    }

    fn format(&mut self, f: f64) -> &str {
        let text = self.shortest.format_finite(f);
        // zmij writes plain notation for decimal exponents -5..=15, a range
        // inside ECMAScript's (1e-7 up to 1e21), and its plain digits are
        // ECMAScript's but for the ".0" it puts after an integral value. So
        // only exponent forms need laying out again: the usual number is
        // passed through as it is.
        if !text.as_bytes().contains(&b'e') {
            return text.strip_suffix(".0").unwrap_or(text);
        }
        let len = layout_es6(text.as_bytes(), &mut self.bytes);
        // Every byte `layout_es6` writes is ASCII.
        std::str::from_utf8(&self.bytes[..len]).expect("ASCII")
    }
}

/// Lays out a number written in any decimal notation (`-1.5e-7`, `120.0`,
/// `0.001`) as ECMAScript writes it, into `out`; returns the length.
fn layout_es6(text: &[u8], out: &mut [u8; 40]) -> usize {
    let (negative, text) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let (mantissa, exponent) = match text.iter().position(|&b| b == b'e' || b == b'E') {
        Some(i) => (&text[..i], parse_exponent(&text[i + 1..])),
        None => (text, 0),
    };
    // The significant digits d1..dk and n, with value = 0.d1..dk × 10^n:
    // n is the count of digits before the point, less the leading zeros,
    // plus the exponent.
    let mut digits = [0u8; 20];
    let mut k = 0usize;
    let mut before_point: i32 = 0;
    let mut leading_zeros: i32 = 0;
    let mut in_fraction = false;
    for &b in mantissa {
        if b == b'.' {
            in_fraction = true;
            continue;
        }
        if !in_fraction {
            before_point += 1;
        }
        if k == 0 && b == b'0' {
            leading_zeros += 1;
            continue;
        }
        digits[k] = b;
        k += 1;
    }
    while k > 1 && digits[k - 1] == b'0' {
        k -= 1;
    }
    let n = before_point - leading_zeros + exponent;
    let digits = &digits[..k];
    let mut len = 0;
    let mut push = |b: u8| {
        out[len] = b;
        len += 1;
    };
    if negative {
        push(b'-');
    }
    let k = k as i32;
    if k <= n && n <= 21 {
        digits.iter().for_each(|&d| push(d));
        (0..n - k).for_each(|_| push(b'0'));
    } else if 0 < n && n <= 21 {
        digits[..n as usize].iter().for_each(|&d| push(d));
        push(b'.');
        digits[n as usize..].iter().for_each(|&d| push(d));
    } else if -6 < n && n <= 0 {
        push(b'0');
        push(b'.');
        (0..-n).for_each(|_| push(b'0'));
        digits.iter().for_each(|&d| push(d));
    } else {
        push(digits[0]);
        if k > 1 {
            push(b'.');
            digits[1..].iter().for_each(|&d| push(d));
        }
        push(b'e');
        let e = n - 1;
        push(if e < 0 { b'-' } else { b'+' });
        let mut e = e.unsigned_abs();
        let mut rev = [0u8; 4];
        let mut m = 0;
        loop {
            rev[m] = b'0' + (e % 10) as u8;
            m += 1;
            e /= 10;
            if e == 0 {
                break;
            }
        }
        rev[..m].iter().rev().for_each(|&d| push(d));
    }
    len
}

fn parse_exponent(text: &[u8]) -> i32 {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        _ => (false, text),
    };
    let magnitude = digits
        .iter()
        .fold(0i32, |acc, &d| acc * 10 + i32::from(d - b'0'));
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

/// The escape for each byte that needs one: the controls below 0x20, `"`
/// and `\`. Every other byte is copied as is.
static ESCAPES: [Option<&str>; 256] = {
    const CONTROLS: [&str; 32] = [
        "\\u0000", "\\u0001", "\\u0002", "\\u0003", "\\u0004", "\\u0005", "\\u0006", "\\u0007",
        "\\b", "\\t", "\\n", "\\u000b", "\\f", "\\r", "\\u000e", "\\u000f", "\\u0010", "\\u0011",
        "\\u0012", "\\u0013", "\\u0014", "\\u0015", "\\u0016", "\\u0017", "\\u0018", "\\u0019",
        "\\u001a", "\\u001b", "\\u001c", "\\u001d", "\\u001e", "\\u001f",
    ];
    let mut table = [None; 256];
    let mut i = 0;
    while i < 32 {
        table[i] = Some(CONTROLS[i]);
        i += 1;
    }
    table[b'"' as usize] = Some("\\\"");
    table[b'\\' as usize] = Some("\\\\");
    table
};

fn write_string<S: Sink>(s: &str, out: &mut S) {
    out.write_ascii(b'"');
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        // Runs of bytes that need no escape go out in one call. Every
        // escaped byte is ASCII, so the runs end on character boundaries.
        let run = plain_prefix(&bytes[i..]);
        if run > 0 {
            out.write_str(&s[i..i + run]);
            i += run;
        }
        // Either the end, or a byte that needs an escape.
        if let Some(escape) = bytes.get(i).and_then(|&b| ESCAPES[b as usize]) {
            out.write_str(escape);
            i += 1;
        }
    }
    out.write_ascii(b'"');
}

/// The length of the longest prefix of `bytes` that needs no escape.
fn plain_prefix(bytes: &[u8]) -> usize {
    let mut i = 0;
    // Most text has no escapes: skip it eight bytes at a time.
    while let Some(word) = bytes[i..].first_chunk::<8>() {
        match escape_mask(u64::from_le_bytes(*word)) {
            0 => i += 8,
            mask => return i + (mask.trailing_zeros() / 8) as usize,
        }
    }
    let tail = &bytes[i..];
    i + tail
        .iter()
        .position(|&b| ESCAPES[b as usize].is_some())
        .unwrap_or(tail.len())
}

/// The high bit of each byte of `word` (little-endian) that is below 0x20,
/// `"` or `\`, exact up to and including the lowest one marked: above it a
/// byte may be marked wrongly, so only the lowest is to be trusted (0 when
/// none needs an escape).
#[inline]
fn escape_mask(word: u64) -> u64 {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    // The classic "has a zero byte" test: a byte's high bit survives
    // `(x - 1) & !x` only if the byte was zero (with `x - 0x20`: below 0x20).
    // A borrow between bytes only starts at a real hit, so the lowest mark
    // is always a real one.
    let zeros = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    below_space | zeros(word ^ (ONES * u64::from(b'"'))) | zeros(word ^ (ONES * u64::from(b'\\')))
}

/// The first `\uXXXX` escape inside a JSON string of `text` that encodes a
/// UTF-16 surrogate without its partner, with its 1-based line and column
/// (in characters).
fn find_lone_surrogate(text: &str) -> Option<(&str, usize, usize)> {
    // The UTF-16 unit of the `\uXXXX` escape starting at byte `i`, if any.
    let unit_at = |i: usize| -> Option<u16> {
        let digits = text.get(i..i + 6)?.strip_prefix("\\u")?;
        if !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u16::from_str_radix(digits, 16).ok()
    };
    let bytes = text.as_bytes();
    let mut in_string = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => in_string = !in_string,
            b'\\' if in_string => {
                let Some(unit) = unit_at(i) else {
                    i += 2; // `\"`, `\\` and the other short escapes
                    continue;
                };
                let lone = match unit {
                    0xD800..=0xDBFF => {
                        if let Some(0xDC00..=0xDFFF) = unit_at(i + 6) {
                            i += 12;
                            continue;
                        }
                        true
                    }
                    0xDC00..=0xDFFF => true,
                    _ => false,
                };
                if lone {
                    let before = &text[..i];
                    let line = before.matches('\n').count() + 1;
                    let column = before[before.rfind('\n').map_or(0, |n| n + 1)..]
                        .chars()
                        .count()
                        + 1;
                    return Some((&text[i..i + 6], line, column));
                }
                i += 6;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Parses any JSON text and fails on an object that repeats a member name.
/// It keeps nothing but the names of the object being read.
struct UniqueNames;

impl<'de> Deserialize<'de> for UniqueNames {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueNames)
    }
}

impl<'de> Visitor<'de> for UniqueNames {
    type Value = UniqueNames;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_str<E>(self, _: &str) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_unit<E>(self) -> Result<Self, E> {
        Ok(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<UniqueNames>()?.is_some() {}
        Ok(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self, A::Error> {
        let mut names = HashSet::new();
        while let Some(name) = map.next_key::<String>()? {
            if let Some(name) = names.replace(name) {
                return Err(de::Error::custom(format_args!(
                    "the member name {name:?} appears twice in one object"
                )));
            }
            map.next_value::<UniqueNames>()?;
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf16_order_puts_supplementary_characters_before_the_top_of_the_bmp() {
        let names = [
            "",
            "a",
            "ab",
            "b",
            "\u{7f}",
            "\u{80}",
            "é",
            "\u{d7ff}",
            "\u{e000}",
            "\u{fb33}",
            "\u{ffff}",
            "\u{10000}",
            "\u{1f602}",
            "\u{10ffff}",
            "a\u{1f602}",
            "a\u{fb33}",
        ];
        // Also behind a shared prefix longer than a word, so the difference
        // is found inside the second word.
        for prefix in ["", "item_00017_é"] {
            for a in names {
                for b in names {
                    let (a, b) = (format!("{prefix}{a}"), format!("{prefix}{b}"));
                    assert_eq!(
                        cmp_utf16(&a, &b),
                        a.encode_utf16().cmp(b.encode_utf16()),
                        "{a:?} vs {b:?}"
                    );
                }
            }
        }
        assert_eq!(cmp_utf16("\u{1f602}", "\u{fb33}"), Ordering::Less);
    }

    #[test]
    fn only_controls_quote_and_backslash_are_escaped() {
        let mut out = String::new();
        write_string(
            "\"\\/\u{8}\u{c}\n\r\t\u{0}\u{1f}\u{7f}\u{80}</script>€",
            &mut out,
        );
        assert_eq!(
            out,
            "\"\\\"\\\\/\\b\\f\\n\\r\\t\\u0000\\u001f\u{7f}\u{80}</script>€\""
        );
    }

    #[test]
    fn the_word_test_finds_every_byte_that_needs_an_escape_at_every_position() {
        for byte in 0..=255u8 {
            for position in 0..8 {
                let mut word = [b'a'; 8];
                word[position] = byte;
                assert_eq!(
                    escape_mask(u64::from_le_bytes(word)) != 0,
                    ESCAPES[byte as usize].is_some(),
                    "byte {byte:#x} at {position}"
                );
            }
        }
    }

    #[test]
    fn the_lowest_mark_is_the_first_byte_that_needs_an_escape() {
        // Every pair of bytes (one that may need an escape, then any) at
        // every pair of positions: the mask's lowest mark is the first.
        let interesting = [
            0x00, 0x01, 0x1f, 0x20, b'"', b'\\', 0x21, 0x5b, 0x5d, 0x7f, 0x80, 0xc3, 0xff,
        ];
        for &x in &interesting {
            for y in 0..=255u8 {
                for px in 0..8 {
                    for py in 0..8 {
                        let mut word = [b'a'; 8];
                        word[px] = x;
                        word[py] = y;
                        let first = word.iter().position(|&b| ESCAPES[b as usize].is_some());
                        let mask = escape_mask(u64::from_le_bytes(word));
                        let found = (mask != 0).then(|| (mask.trailing_zeros() / 8) as usize);
                        assert_eq!(found, first, "{word:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn escapes_are_found_wherever_they_fall_in_a_string() {
        // serde_json escapes strings exactly as RFC 8785 does.
        for escaped in ['"', '\\', '\n', '\u{1}', '\u{1f}'] {
            for len in 0..20 {
                for at in 0..=len {
                    let mut text: String = "aé€".chars().cycle().take(len).collect();
                    let at = text.char_indices().nth(at).map_or(text.len(), |(i, _)| i);
                    text.insert(at, escaped);
                    let mut out = String::new();
                    write_string(&text, &mut out);
                    assert_eq!(out, serde_json::to_string(&text).unwrap());
                }
            }
        }
    }

    #[test]
    fn zmij_plain_digits_pass_through_as_ecmascripts_form() {
        // The fast path (zmij's plain notation, less a trailing ".0") must
        // agree with laying the same digits out in full, for doubles of
        // every magnitude around the two notations' edges and at random.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let check = |f: f64| {
            if !f.is_finite() {
                return;
            }
            let fast = EsNumber::new().format(f).to_owned();
            let mut shortest = zmij::Buffer::new();
            let text = shortest.format_finite(f);
            let mut full = [0u8; 40];
            let len = layout_es6(text.as_bytes(), &mut full);
            assert_eq!(fast.as_bytes(), &full[..len], "{f:e} (zmij: {text})");
        };
        for _ in 0..100_000 {
            check(f64::from_bits(next()));
            // A random 52-bit mantissa at every decimal magnitude where one
            // notation or the other changes.
            let mantissa = f64::from_bits(0x3ff0_0000_0000_0000 | (next() >> 12));
            let exponent = (next() % 40) as i32 - 12;
            check(mantissa * 10f64.powi(exponent));
            check(-mantissa * 10f64.powi(exponent));
            // Short decimals, and integral values above 2^53.
            check((next() % 1_000_000) as f64 / 10f64.powi((next() % 12) as i32));
            check((next() >> 8) as f64 * 4.0);
        }
    }

    #[test]
    fn unsorted_maps_are_sorted_by_utf16() {
        // Built so that UTF-8 order and UTF-16 order disagree.
        let mut map = Map::new();
        map.insert("\u{fb33}".into(), Value::from(1));
        map.insert("\u{1f602}".into(), Value::from(2));
        assert!(!names_in_utf16_order(&map));
        let text = canonical_json(&Value::Object(map)).unwrap();
        assert_eq!(text, "{\"\u{1f602}\":2,\"\u{fb33}\":1}");
    }
}
