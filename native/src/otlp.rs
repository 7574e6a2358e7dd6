//! The gateway's hot path compiled: an OTLP/HTTP protobuf `ExportTraceServiceRequest` body → one
//! `rolloutbus.Span` record (single-object Avro) per span, in one pass over the bytes, without a
//! Python object per attribute or per token id.
//!
//! The reference is `producers.ingest.otlp_decoding.request_to_spans` (upb's parse, `producers.mapping.otel_to_span`,
//! `schemas.codec.encode_raw`). This path takes the common shapes only — plain spans, LLM calls with
//! token ids and logprobs, tool calls, `agentlightning.reward.{i}` rewards, ids on the span or on its
//! resource — and declines the rest: a span it declines is `None` in the answer, and the gateway maps
//! that span with the reference (so its answer, or its refusal and reason, is the reference's by
//! construction); a body it cannot read at all (malformed, a field repeated where protobuf would merge
//! or overwrite, a group, a nesting it does not follow) is `None` as a whole, and the gateway parses
//! the body with upb, whose error the client gets. `tests/unit/producers/test_native_otlp.py` compares
//! the two on random and hostile bodies.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};
use std::collections::HashMap;
use std::fmt::Write as _;

use crate::{w_long, Res, Unusual, SPAN_FINGERPRINT};

// --------------------------------------------------------------------------- protobuf reading

struct Pb<'a> {
    d: &'a [u8],
    p: usize,
}

impl<'a> Pb<'a> {
    fn new(d: &'a [u8]) -> Self {
        Pb { d, p: 0 }
    }

    #[inline]
    fn more(&self) -> bool {
        self.p < self.d.len()
    }

    /// A varint of at most ten bytes whose value fits 64 bits (upb refuses longer ones).
    #[inline]
    fn varint(&mut self) -> Res<u64> {
        let mut x = 0u64;
        let mut shift = 0u32;
        loop {
            let b = *self.d.get(self.p).ok_or(Unusual)?;
            self.p += 1;
            if shift == 63 && b > 1 {
                return Err(Unusual);
            }
            x |= ((b & 0x7F) as u64) << shift;
            if b < 0x80 {
                return Ok(x);
            }
            shift += 7;
        }
    }

    /// (field number, wire type); groups (3, 4) and unknown wire types are not followed.
    #[inline]
    fn key(&mut self) -> Res<(u64, u8)> {
        let k = self.varint()?;
        let (f, wt) = (k >> 3, (k & 7) as u8);
        if f == 0 || f > 0x1FFF_FFFF || !matches!(wt, 0 | 1 | 2 | 5) {
            return Err(Unusual);
        }
        Ok((f, wt))
    }

    #[inline]
    fn take(&mut self, n: usize) -> Res<&'a [u8]> {
        let end = self.p.checked_add(n).ok_or(Unusual)?;
        let s = self.d.get(self.p..end).ok_or(Unusual)?;
        self.p = end;
        Ok(s)
    }

    #[inline]
    fn bytes(&mut self) -> Res<&'a [u8]> {
        let n = self.varint()?;
        self.take(usize::try_from(n).map_err(|_| Unusual)?)
    }

    /// A proto3 string: upb refuses one that is not UTF-8.
    #[inline]
    fn string(&mut self) -> Res<&'a str> {
        std::str::from_utf8(self.bytes()?).map_err(|_| Unusual)
    }

    #[inline]
    fn fixed64(&mut self) -> Res<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().map_err(|_| Unusual)?))
    }

    /// An unknown field: kept by upb, read by nobody.
    fn skip(&mut self, wt: u8) -> Res<()> {
        match wt {
            0 => self.varint().map(|_| ()),
            1 => self.take(8).map(|_| ()),
            2 => self.bytes().map(|_| ()),
            5 => self.take(4).map(|_| ()),
            _ => Err(Unusual),
        }
    }
}

/// The wire type a known field must have; another one is declined (upb would keep it as unknown).
#[inline]
fn want(wt: u8, expected: u8) -> Res<()> {
    if wt == expected {
        Ok(())
    } else {
        Err(Unusual)
    }
}

/// Singular fields seen in one message: a second occurrence (protobuf's last-wins or merge) is declined.
#[inline]
fn once(seen: &mut u32, bit: u32) -> Res<()> {
    if *seen & bit != 0 {
        return Err(Unusual);
    }
    *seen |= bit;
    Ok(())
}

// --------------------------------------------------------------------------- attribute values

#[derive(Clone, Copy)]
enum Val<'a> {
    Str(&'a str),
    Int(i64),
    Bool(bool),
    Dbl(f64),
    Bytes(&'a [u8]),
    /// The serialized ArrayValue (read again when it is used: token ids, JSON text).
    Arr(&'a [u8]),
}

/// One `AnyValue`: exactly one of its value fields (an unset value, a key/value list or two values
/// are declined). An array's items are checked here (strings UTF-8, scalars or unset, nothing nested).
fn any_value(d: &[u8]) -> Res<Val<'_>> {
    // An int or a double alone: every item of a token-id or logprob array, a million per request.
    // The same answer as the loop below, without it.
    match d.first() {
        Some(&0x18) => {
            let mut r = Pb { d, p: 1 };
            let v = r.varint()?;
            if !r.more() {
                return Ok(Val::Int(v as i64));
            }
        }
        Some(&0x21) if d.len() == 9 => return Ok(Val::Dbl(f64::from_bits(u64::from_le_bytes(d[1..9].try_into().map_err(|_| Unusual)?)))),
        _ => {}
    }
    let mut r = Pb::new(d);
    let mut out = None;
    while r.more() {
        let (f, wt) = r.key()?;
        let v = match f {
            1 => {
                want(wt, 2)?;
                Val::Str(r.string()?)
            }
            2 => {
                want(wt, 0)?;
                Val::Bool(r.varint()? != 0)
            }
            3 => {
                want(wt, 0)?;
                Val::Int(r.varint()? as i64)
            }
            4 => {
                want(wt, 1)?;
                Val::Dbl(f64::from_bits(r.fixed64()?))
            }
            5 => {
                want(wt, 2)?;
                let a = r.bytes()?;
                array_items(a, |_| Ok(()))?;
                Val::Arr(a)
            }
            7 => {
                want(wt, 2)?;
                Val::Bytes(r.bytes()?)
            }
            6 => return Err(Unusual),
            _ => {
                r.skip(wt)?;
                continue;
            }
        };
        if out.is_some() {
            return Err(Unusual);
        }
        out = Some(v);
    }
    out.ok_or(Unusual)
}

/// Each item of a serialized ArrayValue (`None`: an unset AnyValue), in order.
fn array_items<'a>(d: &'a [u8], mut each: impl FnMut(Option<Val<'a>>) -> Res<()>) -> Res<()> {
    let mut r = Pb::new(d);
    while r.more() {
        let (f, wt) = r.key()?;
        if f != 1 {
            r.skip(wt)?;
            continue;
        }
        want(wt, 2)?;
        let item = r.bytes()?;
        if item.is_empty() {
            each(None)?;
            continue;
        }
        let v = any_value(item)?;
        if matches!(v, Val::Arr(_)) {
            return Err(Unusual);
        }
        each(Some(v))?;
    }
    Ok(())
}

/// One `KeyValue` (a missing value is declined: the reference reads it as `None`).
fn key_value(d: &[u8]) -> Res<(&str, Val<'_>)> {
    let mut r = Pb::new(d);
    let (mut key, mut val, mut seen) = ("", None, 0u32);
    while r.more() {
        let (f, wt) = r.key()?;
        match f {
            1 => {
                want(wt, 2)?;
                once(&mut seen, 1)?;
                key = r.string()?;
            }
            2 => {
                want(wt, 2)?;
                once(&mut seen, 2)?;
                val = Some(any_value(r.bytes()?)?);
            }
            _ => r.skip(wt)?,
        }
    }
    Ok((key, val.ok_or(Unusual)?))
}

/// Attributes by key, in their order; a key given twice is declined (the reference keeps the last value
/// at the first one's place).
struct Attrs<'a> {
    items: Vec<(&'a str, Val<'a>)>,
    index: Option<HashMap<&'a str, usize>>,
}

impl<'a> Attrs<'a> {
    fn new() -> Self {
        Attrs { items: Vec::new(), index: None }
    }

    fn push(&mut self, d: &'a [u8]) -> Res<()> {
        let (k, v) = key_value(d)?;
        if self.get(k).is_some() {
            return Err(Unusual);
        }
        if let Some(ix) = self.index.as_mut() {
            ix.insert(k, self.items.len());
        }
        self.items.push((k, v));
        if self.index.is_none() && self.items.len() > 24 {
            self.index = Some(self.items.iter().enumerate().map(|(i, (k, _))| (*k, i)).collect());
        }
        Ok(())
    }

    #[inline]
    fn get(&self, key: &str) -> Option<Val<'a>> {
        match &self.index {
            Some(ix) => ix.get(key).map(|&i| self.items[i].1),
            None => self.items.iter().find(|(k, _)| *k == key).map(|(_, v)| *v),
        }
    }

    /// `producers.mapping._first`: the first of `keys` present with a value other than "".
    fn first(&self, keys: &[&str]) -> Option<Val<'a>> {
        keys.iter().filter_map(|k| self.get(k)).find(|v| !matches!(v, Val::Str("")))
    }
}

// --------------------------------------------------------------------------- the reference's text forms

/// `json.dumps(x)` of a finite float is `repr(x)`; NaN and the infinities as Python's json writes them.
fn py_float(out: &mut String, x: f64) {
    if x.is_nan() {
        out.push_str("NaN");
        return;
    }
    if x.is_infinite() {
        out.push_str(if x > 0.0 { "Infinity" } else { "-Infinity" });
        return;
    }
    // Rust's shortest round-trip digits, laid out the way Python's repr lays them out.
    let e = format!("{x:e}");
    let (mant, exp) = e.split_once('e').unwrap_or((&e, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (neg, mant) = match mant.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, mant),
    };
    let mut digits: String = mant.chars().filter(|c| *c != '.').collect();
    // At an exact tie between two shortest candidates (the value lies halfway between them), Python's repr takes the
    // one whose last digit is even and Rust's the upper one: 562949953421312.25 is "...312.2" in Python.
    // Cheap first (this runs for every float of every span): a tie needs 16+ shortest digits (a shorter lower form
    // would be more than half a unit away) and a value whose exact decimal form ends within 18 digits (m·5^k short).
    if digits.len() >= 16 && could_tie(x.abs()) {
        tie_to_even(&mut digits, x, exp);
    }
    if neg {
        out.push('-');
    }
    let decpt = exp + 1;
    layout(out, &digits, decpt, exp);
}

/// Whether ``x`` (> 0) has an exact decimal form of at most ~18 significant digits: ``m·2^e`` with the mantissa's
/// trailing zeros taken out, an integer, or ``m·5^(-e)`` under 2^62.
fn could_tie(x: f64) -> bool {
    let bits = x.to_bits();
    let (exp_bits, frac) = (((bits >> 52) & 0x7ff) as i32, bits & ((1u64 << 52) - 1));
    let (m, e) = if exp_bits == 0 { (frac, -1074) } else { (frac | (1u64 << 52), exp_bits - 1075) };
    if m == 0 {
        return false;
    }
    let tz = m.trailing_zeros() as i32;
    let (m, e) = (m >> tz, e + tz);
    e >= 0 || f64::from(64 - m.leading_zeros()) + f64::from(-e) * 2.3219281 <= 62.0
}

/// At an exact tie between two shortest candidates, the even last digit where the lower one reads back as ``x``.
fn tie_to_even(digits: &mut String, x: f64, exp: i32) {
    let exact = format!("{:.40e}", x.abs());
    if let Some((emant, eexp)) = exact.split_once('e') {
        let edigits: String = emant.chars().filter(|c| *c != '.').collect();
        let n = digits.len();
        let tail = &edigits[n.min(edigits.len())..];
        if eexp.parse::<i32>().ok() == Some(exp) && tail.starts_with('5') && tail[1..].chars().all(|c| c == '0') {
            let down = &edigits[..n];
            // the lower candidate must read back as x too (not so below a power of two, where the gap is half)
            let text = format!("{}.{}e{}", &down[..1], &down[1..], exp);
            if down != digits.as_str() && down.as_bytes()[n - 1] % 2 == 0 && text.parse::<f64>().ok() == Some(x.abs()) {
                *digits = down.to_string();
            }
        }
    }
}

/// ``digits`` with the decimal point at ``decpt``, laid out as Python's repr lays it out.
fn layout(out: &mut String, digits: &str, decpt: i32, exp: i32) {
    if -4 < decpt && decpt <= 16 {
        let n = digits.len() as i32;
        if decpt <= 0 {
            out.push_str("0.");
            for _ in 0..-decpt {
                out.push('0');
            }
            out.push_str(&digits);
        } else if decpt >= n {
            out.push_str(&digits);
            for _ in 0..decpt - n {
                out.push('0');
            }
            out.push_str(".0");
        } else {
            out.push_str(&digits[..decpt as usize]);
            out.push('.');
            out.push_str(&digits[decpt as usize..]);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs());
    }
}

/// A JSON string as `json.dumps(..., ensure_ascii=False)` writes it.
fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

const HEX: &[u8; 16] = b"0123456789abcdef";

fn hex_into(out: &mut String, b: &[u8]) {
    out.reserve(b.len() * 2);
    for x in b {
        out.push(HEX[(x >> 4) as usize] as char);
        out.push(HEX[(x & 15) as usize] as char);
    }
}

/// `producers.mapping.attr_str` of a value as the reference reads it from protobuf.
fn attr_str<'a>(v: Val<'a>) -> Res<std::borrow::Cow<'a, str>> {
    use std::borrow::Cow;
    Ok(match v {
        Val::Str(s) => Cow::Borrowed(s),
        Val::Int(i) => Cow::Owned(i.to_string()),
        Val::Bool(b) => Cow::Borrowed(if b { "true" } else { "false" }),
        Val::Dbl(x) => {
            let mut s = String::new();
            py_float(&mut s, x);
            Cow::Owned(s)
        }
        Val::Bytes(b) => {
            let mut s = String::new();
            hex_into(&mut s, b);
            Cow::Owned(s)
        }
        Val::Arr(a) => {
            let mut s = String::from("[");
            let mut first = true;
            array_items(a, |item| {
                if !first {
                    s.push_str(", ");
                }
                first = false;
                match item {
                    None => s.push_str("null"),
                    Some(Val::Str(x)) => json_str(&mut s, x),
                    Some(Val::Int(i)) => {
                        let _ = write!(s, "{i}");
                    }
                    Some(Val::Bool(b)) => s.push_str(if b { "true" } else { "false" }),
                    Some(Val::Dbl(x)) => py_float(&mut s, x),
                    Some(_) => return Err(Unusual), // bytes: json's default=str
                }
                Ok(())
            })?;
            s.push(']');
            Cow::Owned(s)
        }
    })
}

/// Token ids → little-endian uint32 (`schemas.codec.pack_tokens`): a list of ints in 0..2**32-1 only.
fn packed_ids(v: Val<'_>) -> Res<Vec<u8>> {
    let Val::Arr(a) = v else { return Err(Unusual) };
    let mut out = Vec::with_capacity(a.len() * 2);
    array_items(a, |item| match item {
        Some(Val::Int(i)) if (0..=u32::MAX as i64).contains(&i) => {
            out.extend_from_slice(&(i as u32).to_le_bytes());
            Ok(())
        }
        _ => Err(Unusual),
    })?;
    Ok(out)
}

/// Numbers → little-endian float32 (`array('f', ...)`): a list of floats or ints only.
fn packed_floats(v: Val<'_>) -> Res<Vec<u8>> {
    let Val::Arr(a) = v else { return Err(Unusual) };
    let mut out = Vec::with_capacity(a.len());
    array_items(a, |item| {
        let x = match item {
            Some(Val::Dbl(x)) => x,
            Some(Val::Int(i)) => i as f64,
            _ => return Err(Unusual),
        };
        out.extend_from_slice(&(x as f32).to_le_bytes());
        Ok(())
    })?;
    Ok(out)
}

fn str_only<'a>(v: Option<Val<'a>>) -> Res<Option<&'a str>> {
    match v {
        None => Ok(None),
        Some(Val::Str(s)) => Ok(Some(s)),
        Some(_) => Err(Unusual),
    }
}

// --------------------------------------------------------------------------- the mapping

const ROLLOUT_KEYS: &[&str] = &["agentlightning.rollout_id", "rolloutbus.rollout_id"];
const ATTEMPT_KEYS: &[&str] = &["agentlightning.attempt_id", "rolloutbus.attempt_id"];
const SEQUENCE_KEYS: &[&str] = &["agentlightning.span_sequence_id", "rolloutbus.sequence_id"];
const AGENT_KEYS: &[&str] = &["rolloutbus.agent_name", "agentlightning.agent_name", "gen_ai.agent.name", "agent.name"];
const PROMPT_IDS_KEYS: &[&str] = &["prompt_token_ids", "gen_ai.prompt.token_ids", "agentlightning.operation.output.prompt_token_ids"];
const RESPONSE_IDS_KEYS: &[&str] = &[
    "response_token_ids",
    "gen_ai.response.token_ids",
    "agentlightning.operation.output.response_token_ids.0",
    "agentlightning.operation.output.choices.0.token_ids",
    "agentlightning.operation.output.choices.0.provider_specific_fields.token_ids",
];
const RESPONSE_ID_KEYS: &[&str] = &["gen_ai.response.id", "agentlightning.operation.output.id"];
const MODEL_KEYS: &[&str] = &["gen_ai.response.model", "gen_ai.request.model", "agentlightning.operation.output.model"];
const LLM_NAMES: &[&str] = &["openai.chat", "chat ", "text_completion"];
/// Keys whose meaning this path does not carry (AgentOps outputs, other reward forms, exceptions,
/// explicit kinds, messages, the agent-name rules of other frameworks): such a span is the reference's.
const DECLINED_KEYS: &[&str] = &[
    "agentops.task.output",
    "agentops.entity.output",
    "rolloutbus.reward",
    "agentlightning.reward",
    "reward",
    "rolloutbus.reward.primary",
    "exception.type",
    "rolloutbus.kind",
    "agentlightning.message.body",
    "message.body",
    "agentops.span.kind",
    "recipient_agent_type",
    "langchain.chain.type",
    "executor.id",
    "type",
    "lc_name",
];
const REWARD_PREFIX: &str = "agentlightning.reward.";

fn is_token_key(k: &str) -> bool {
    k == "response_logprobs" || PROMPT_IDS_KEYS.contains(&k) || RESPONSE_IDS_KEYS.contains(&k)
}

struct PbSpan<'a> {
    trace_id: &'a [u8],
    span_id: &'a [u8],
    parent: &'a [u8],
    name: &'a str,
    start: u64,
    end: u64,
    attrs: Attrs<'a>,
    status: u64,
    message: &'a str,
}

fn status(d: &[u8]) -> Res<(u64, &str)> {
    let mut r = Pb::new(d);
    let (mut code, mut message, mut seen) = (0u64, "", 0u32);
    while r.more() {
        let (f, wt) = r.key()?;
        match (f, wt) {
            (2, 2) => {
                once(&mut seen, 2)?;
                message = r.string()?;
            }
            (3, 0) => {
                once(&mut seen, 4)?;
                code = r.varint()?;
            }
            (2 | 3, _) => return Err(Unusual),
            _ => r.skip(wt)?,
        }
    }
    Ok((code, message))
}

/// One `Span`; events and links are declined (the reference's); the rest of its fields it ignores too.
fn span(d: &[u8]) -> Res<PbSpan<'_>> {
    let mut r = Pb::new(d);
    let mut s = PbSpan {
        trace_id: b"", span_id: b"", parent: b"", name: "", start: 0, end: 0, attrs: Attrs::new(), status: 0, message: "",
    };
    let mut seen = 0u32;
    while r.more() {
        let (f, wt) = r.key()?;
        if f <= 16 && f != 9 {
            once(&mut seen, 1 << f)?;
        }
        match (f, wt) {
            (1, 2) => s.trace_id = r.bytes()?,
            (2, 2) => s.span_id = r.bytes()?,
            (3, 2) => drop(r.string()?), // trace_state
            (4, 2) => s.parent = r.bytes()?,
            (5, 2) => s.name = r.string()?,
            (6 | 10 | 12 | 14, 0) => drop(r.varint()?), // kind, dropped counts
            (7, 1) => s.start = r.fixed64()?,
            (8, 1) => s.end = r.fixed64()?,
            (9, 2) => s.attrs.push(r.bytes()?)?,
            (15, 2) => (s.status, s.message) = status(r.bytes()?)?,
            (16, 5) => drop(r.take(4)?), // flags
            (1..=16, _) => return Err(Unusual), // events, links, a known field with another wire type
            _ => r.skip(wt)?,
        }
    }
    Ok(s)
}

struct Reward {
    dims: Vec<(String, f64)>,
}

/// `agentlightning.reward.{i}.name/value` (ASCII index without leading zeros), or decline the key.
fn reward_slot(key: &str) -> Res<(u64, bool)> {
    let rest = &key[REWARD_PREFIX.len()..];
    let (idx, field) = rest.split_once('.').ok_or(Unusual)?;
    let is_name = match field {
        "name" => true,
        "value" => false,
        _ => return Err(Unusual),
    };
    if idx.is_empty() || idx.len() > 9 || !idx.bytes().all(|b| b.is_ascii_digit()) || (idx.len() > 1 && idx.starts_with('0')) {
        return Err(Unusual);
    }
    Ok((idx.parse().map_err(|_| Unusual)?, is_name))
}

fn rewards(attrs: &Attrs<'_>) -> Res<Option<Reward>> {
    let mut slots: Vec<(u64, Option<Val<'_>>, Option<Val<'_>>)> = Vec::new();
    for (k, v) in &attrs.items {
        if !k.starts_with(REWARD_PREFIX) {
            continue;
        }
        let (i, is_name) = reward_slot(k)?;
        let at = match slots.iter().position(|s| s.0 == i) {
            Some(at) => at,
            None => {
                slots.push((i, None, None));
                slots.len() - 1
            }
        };
        if is_name {
            slots[at].1 = Some(*v);
        } else {
            slots[at].2 = Some(*v);
        }
    }
    if slots.is_empty() {
        return Ok(None);
    }
    slots.sort_by_key(|s| s.0);
    let mut dims: Vec<(String, f64)> = Vec::with_capacity(slots.len());
    for (i, name, value) in slots {
        let dim = match name {
            None | Some(Val::Str("")) => if i == 0 { "reward".to_string() } else { format!("reward_{i}") },
            Some(Val::Str(s)) => s.to_string(),
            Some(_) => return Err(Unusual),
        };
        let value = match value {
            Some(Val::Dbl(x)) => x,
            Some(Val::Int(n)) => n as f64,
            _ => return Err(Unusual),
        };
        if !value.is_finite() || dims.iter().any(|(d, _)| *d == dim) {
            return Err(Unusual);
        }
        dims.push((dim, value));
    }
    Ok(Some(Reward { dims }))
}

// Avro writing (the layout of schemas/avro/span.avsc, as lib.rs's write_span_body)

#[inline]
fn w_str(out: &mut Vec<u8>, s: &str) {
    w_long(out, s.len() as i64);
    out.extend_from_slice(s.as_bytes());
}

#[inline]
fn w_opt_str(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        None => out.push(0),
        Some(s) => {
            out.push(2);
            w_str(out, s);
        }
    }
}

#[inline]
fn w_bytes(out: &mut Vec<u8>, b: &[u8]) {
    w_long(out, b.len() as i64);
    out.extend_from_slice(b);
}

fn hex_str(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    hex_into(&mut s, b);
    s
}

/// The mapped span's Kafka key (its rollout id) and single-object Avro value.
fn map_span(s: &PbSpan<'_>, resource: &Attrs<'_>, resource_strs: &[(&str, std::borrow::Cow<'_, str>)]) -> Res<(String, Vec<u8>)> {
    let a = &s.attrs;
    for (k, _) in &a.items {
        if DECLINED_KEYS.contains(k) || k.starts_with("agentlightning.object.") {
            return Err(Unusual);
        }
    }
    let id = |keys: &[&str]| a.first(keys).or_else(|| resource.first(keys));
    let rollout_id = str_only(id(ROLLOUT_KEYS))?.ok_or(Unusual)?;
    let attempt_id = str_only(id(ATTEMPT_KEYS))?.ok_or(Unusual)?;
    let sequence_id = match id(SEQUENCE_KEYS) {
        None => 0, // schemas.models.UNNUMBERED: the span stage numbers it
        Some(Val::Int(n)) if n >= 0 => n,
        Some(_) => return Err(Unusual),
    };
    let status = match s.status {
        0 => "UNSET",
        1 => "OK",
        2 => "ERROR",
        _ => return Err(Unusual),
    };
    let message = if s.message.is_empty() { None } else { Some(s.message) };
    if s.start > i64::MAX as u64 || s.end > i64::MAX as u64 {
        return Err(Unusual);
    }

    let prompt = a.first(PROMPT_IDS_KEYS);
    let response = a.first(RESPONSE_IDS_KEYS);
    let model = str_only(a.first(MODEL_KEYS))?;
    let is_llm = prompt.is_some()
        || response.is_some()
        || LLM_NAMES.iter().any(|p| s.name.starts_with(p))
        || (model.is_some() && a.get("gen_ai.tool.name").is_none());
    let reward = rewards(a)?;
    let tool_name = str_only(a.first(&["gen_ai.tool.name", "tool.name"]))?;
    let agent = str_only(a.first(AGENT_KEYS))?;
    let kind = if reward.is_some() {
        "reward"
    } else if is_llm {
        "llm"
    } else if tool_name.is_some() {
        "tool"
    } else {
        "span"
    };

    let mut out = Vec::with_capacity(256 + s.attrs.items.len() * 32);
    let o = &mut out;
    o.extend_from_slice(&[0xC3, 0x01]);
    o.extend_from_slice(&SPAN_FINGERPRINT);
    w_str(o, &hex_str(s.span_id));
    w_str(o, &hex_str(s.trace_id));
    if s.parent.is_empty() {
        o.push(0);
    } else {
        o.push(2);
        w_str(o, &hex_str(s.parent));
    }
    w_str(o, rollout_id);
    w_str(o, attempt_id);
    w_long(o, sequence_id);
    w_str(o, s.name);
    w_str(o, kind);
    w_long(o, s.start as i64);
    w_long(o, s.end as i64);
    w_str(o, status);
    w_opt_str(o, message);
    let kept = a.items.iter().filter(|(k, _)| !is_token_key(k)).count();
    if kept > 0 {
        w_long(o, kept as i64);
        for (k, v) in a.items.iter().filter(|(k, _)| !is_token_key(k)) {
            w_str(o, k);
            w_str(o, &attr_str(*v)?);
        }
    }
    o.push(0);
    o.push(0); // events: none (a span with events is the reference's)
    if !resource_strs.is_empty() {
        w_long(o, resource_strs.len() as i64);
        for (k, v) in resource_strs {
            w_str(o, k);
            w_str(o, v);
        }
    }
    o.push(0);
    if is_llm {
        o.push(2);
        w_opt_str(o, model);
        w_bytes(o, &prompt.map(packed_ids).transpose()?.unwrap_or_default());
        w_bytes(o, &response.map(packed_ids).transpose()?.unwrap_or_default());
        w_bytes(o, &a.get("response_logprobs").map(packed_floats).transpose()?.unwrap_or_default());
        w_bytes(o, b""); // response_mask
        match a.first(&["rolloutbus.resource_version"]) {
            None => o.push(0),
            Some(Val::Int(v)) => {
                o.push(2);
                w_long(o, v);
            }
            Some(_) => return Err(Unusual),
        }
        w_opt_str(o, str_only(a.first(RESPONSE_ID_KEYS))?);
        let finish = match a.get("gen_ai.response.finish_reasons") {
            None => None,
            Some(Val::Str(f)) => Some(f),
            Some(Val::Arr(arr)) => {
                let mut first: Option<Option<&str>> = None;
                array_items(arr, |item| {
                    if first.is_none() {
                        first = Some(match item {
                            Some(Val::Str(f)) => Some(f),
                            _ => return Err(Unusual),
                        });
                    }
                    Ok(())
                })?;
                first.flatten()
            }
            Some(_) => return Err(Unusual),
        };
        w_opt_str(o, finish);
    } else {
        o.push(0);
    }
    match &reward {
        None => o.push(0),
        Some(r) => {
            o.push(2);
            o.extend_from_slice(&r.dims[0].1.to_le_bytes());
            w_str(o, &r.dims[0].0);
            w_long(o, r.dims.len() as i64);
            for (d, x) in &r.dims {
                w_str(o, d);
                o.extend_from_slice(&x.to_le_bytes());
            }
            o.push(0);
        }
    }
    match tool_name {
        None => o.push(0),
        Some(t) => {
            o.push(2);
            w_str(o, t);
            match a.first(&["gen_ai.tool.call.arguments", "tool.arguments"]) {
                None => w_str(o, ""),
                Some(v) => w_str(o, &attr_str(v)?),
            }
            match a.first(&["gen_ai.tool.call.result", "tool.result"]) {
                None => o.push(0),
                Some(v) => {
                    o.push(2);
                    w_str(o, &attr_str(v)?);
                }
            }
            o.push((status != "ERROR") as u8);
            w_opt_str(o, if status == "ERROR" { message } else { None });
        }
    }
    w_opt_str(o, agent);
    Ok((rollout_id.to_string(), out))
}

// --------------------------------------------------------------------------- the request

/// `InstrumentationScope` and other messages the mapping does not read: walked for what upb checks
/// (UTF-8 strings, well-formed nesting).
fn scope(d: &[u8]) -> Res<()> {
    let mut r = Pb::new(d);
    while r.more() {
        let (f, wt) = r.key()?;
        match f {
            1 | 2 => {
                want(wt, 2)?;
                r.string()?;
            }
            3 => {
                want(wt, 2)?;
                key_value(r.bytes()?)?;
            }
            _ => r.skip(wt)?,
        }
    }
    Ok(())
}

fn resource_attrs(d: &[u8]) -> Res<Attrs<'_>> {
    let mut r = Pb::new(d);
    let mut attrs = Attrs::new();
    while r.more() {
        let (f, wt) = r.key()?;
        match f {
            1 => {
                want(wt, 2)?;
                attrs.push(r.bytes()?)?;
            }
            3 => return Err(Unusual), // entity refs
            _ => r.skip(wt)?,
        }
    }
    Ok(attrs)
}

type Mapped = Option<(String, Vec<u8>, String)>;

fn request(body: &[u8]) -> Res<Vec<Mapped>> {
    let mut out = Vec::new();
    let mut r = Pb::new(body);
    while r.more() {
        let (f, wt) = r.key()?;
        if f != 1 {
            r.skip(wt)?;
            continue;
        }
        want(wt, 2)?;
        let mut rs = Pb::new(r.bytes()?);
        let mut resource: Option<&[u8]> = None;
        let mut scopes: Vec<&[u8]> = Vec::new();
        while rs.more() {
            let (f, wt) = rs.key()?;
            match f {
                1 => {
                    want(wt, 2)?;
                    if resource.is_some() {
                        return Err(Unusual);
                    }
                    resource = Some(rs.bytes()?);
                }
                2 => {
                    want(wt, 2)?;
                    scopes.push(rs.bytes()?);
                }
                3 => {
                    want(wt, 2)?;
                    rs.string()?;
                }
                _ => rs.skip(wt)?,
            }
        }
        let res = resource_attrs(resource.unwrap_or(b""))?;
        let res_strs = res.items.iter().map(|(k, v)| Ok((*k, attr_str(*v)?))).collect::<Res<Vec<_>>>()?;
        for ss in scopes {
            let mut sr = Pb::new(ss);
            let mut seen = 0u32;
            while sr.more() {
                let (f, wt) = sr.key()?;
                match f {
                    1 => {
                        want(wt, 2)?;
                        once(&mut seen, 1)?;
                        scope(sr.bytes()?)?;
                    }
                    2 => {
                        want(wt, 2)?;
                        let raw = sr.bytes()?;
                        // A span this path cannot read is the reference's alone; a body it cannot read is too.
                        let mapped = match span(raw) {
                            Ok(s) => map_span(&s, &res, &res_strs).ok().map(|(k, v)| (k, v, s.name.to_string())),
                            Err(Unusual) => match first_level_ok(raw) {
                                true => None,
                                false => return Err(Unusual),
                            },
                        };
                        out.push(mapped);
                    }
                    3 => {
                        want(wt, 2)?;
                        sr.string()?;
                    }
                    _ => sr.skip(wt)?,
                }
            }
        }
    }
    Ok(out)
}

/// A span the mapping declined while parsing (events, links, a repeated field) must still be a
/// well-formed message at its own level, or the body is left to upb as a whole.
fn first_level_ok(d: &[u8]) -> bool {
    let mut r = Pb::new(d);
    while r.more() {
        match r.key() {
            Ok((_, wt)) => {
                if r.skip(wt).is_err() {
                    return false;
                }
            }
            Err(_) => return false,
        }
    }
    true
}

/// The spans of an OTLP/HTTP protobuf body, each `(rollout id as bytes, Span record, span name)` or
/// `None` (the reference maps that one); `None` for the whole body when it is not read here at all.
#[pyfunction]
pub fn otlp_spans<'py>(py: Python<'py>, body: &[u8]) -> PyResult<Option<Bound<'py, PyList>>> {
    let Ok(mapped) = py.detach(|| request(body)) else { return Ok(None) };
    let items = mapped
        .into_iter()
        .map(|m| -> PyResult<Bound<'py, PyAny>> {
            Ok(match m {
                None => py.None().into_bound(py),
                Some((k, v, name)) => {
                    PyTuple::new(py, [PyBytes::new(py, k.as_bytes()).into_any(), PyBytes::new(py, &v).into_any(), PyString::new(py, &name).into_any()])?
                        .into_any()
                }
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    Ok(Some(PyList::new(py, items)?))
}
