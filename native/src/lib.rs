//! rolloutbus_native: two hot paths compiled — the Span writer (`write_span`, the SDK's transport
//! thread and the gateway through `schemas.codec.encode_raw`) and the span stage's per-record work.
//!
//! One pass over a consumed `rolloutbus.Span` value (Avro single-object encoding) does what the
//! Python path does in three: the generated reader (`schemas.span_avro.read_span`), the checks
//! (`schemas.checks.check_span`) and the `spans` RowBinary row (`streams.rowbinary.span`), and it
//! builds the span view the stage's pure core reads (`streams.attempts.span_view`).
//!
//! It takes the common shape only, like the generated Python reader: anything else — another record
//! type or writer schema, a malformed or unusual body (a non-shortest varint, a negative block count,
//! a duplicate map key), a value the checks refuse — gives `None`, and the stage runs the Python
//! path on that record, whose answer or error (and dead-letter reason) is the reference's by
//! construction. `tests/unit/streams/test_native_stage.py` compares the two on random and hostile
//! input.

mod otlp;

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// The CRC-64-AVRO fingerprint of schemas/avro/span.avsc's canonical form, the layout `read_span`
/// follows. The stage uses this decoder only when its own Span fingerprint is this one: a schema
/// changed without this file is the Python path, never a wrong parse (a unit test says so).
const SPAN_FINGERPRINT: [u8; 8] = [0xca, 0xca, 0x07, 0x2f, 0x93, 0x8c, 0x38, 0xc5];

/// Not the common shape: the caller runs the Python reference on this record.
struct Unusual;
type Res<T> = Result<T, Unusual>;

// --------------------------------------------------------------------------- Avro reading

struct Reader<'a> {
    d: &'a [u8],
    p: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    fn byte(&mut self) -> Res<u8> {
        let b = *self.d.get(self.p).ok_or(Unusual)?;
        self.p += 1;
        Ok(b)
    }

    /// A zig-zag varint in its shortest form, at most 64 bits (as `schemas.span_avro._long_at`).
    #[inline]
    fn long(&mut self) -> Res<i64> {
        let b = self.byte()?;
        if b < 0x80 {
            return Ok(((b >> 1) as i64) ^ -((b & 1) as i64));
        }
        let mut z = (b & 0x7F) as u64;
        let mut shift = 7u32;
        loop {
            let b = self.byte()?;
            if shift == 63 && (b & 0x7F) > 1 {
                return Err(Unusual); // over 64 bits
            }
            z |= ((b & 0x7F) as u64) << shift;
            if b < 0x80 {
                if b == 0 {
                    return Err(Unusual); // padded with a zero byte
                }
                break;
            }
            shift += 7;
            if shift > 63 {
                return Err(Unusual);
            }
        }
        Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
    }

    #[inline]
    fn raw(&mut self) -> Res<&'a [u8]> {
        let n = self.long()?;
        if n < 0 {
            return Err(Unusual);
        }
        let e = self.p.checked_add(n as usize).ok_or(Unusual)?;
        if e > self.d.len() {
            return Err(Unusual);
        }
        let s = &self.d[self.p..e];
        self.p = e;
        Ok(s)
    }

    #[inline]
    fn string(&mut self) -> Res<&'a str> {
        std::str::from_utf8(self.raw()?).map_err(|_| Unusual)
    }

    #[inline]
    fn present(&mut self) -> Res<bool> {
        match self.byte()? {
            0 => Ok(false),
            2 => Ok(true),
            _ => Err(Unusual),
        }
    }

    fn opt_string(&mut self) -> Res<Option<&'a str>> {
        Ok(if self.present()? { Some(self.string()?) } else { None })
    }

    fn double(&mut self) -> Res<f64> {
        let e = self.p + 8;
        let b = self.d.get(self.p..e).ok_or(Unusual)?;
        self.p = e;
        Ok(f64::from_le_bytes(b.try_into().unwrap()))
    }

    fn boolean(&mut self) -> Res<bool> {
        match self.byte()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(Unusual),
        }
    }

    /// The blocks of a map or an array: calls `item` count times per block; a negative count
    /// (a block with its byte size) is left to fastavro.
    fn blocks(&mut self, mut item: impl FnMut(&mut Self) -> Res<()>) -> Res<()> {
        loop {
            let c = self.long()?;
            if c == 0 {
                return Ok(());
            }
            if c < 0 {
                return Err(Unusual);
            }
            for _ in 0..c {
                item(self)?;
            }
        }
    }

    /// A map as a list in wire order; a key twice (a Python dict keeps one, in the first one's
    /// place) is left to the reference.
    fn map<T>(&mut self, mut value: impl FnMut(&mut Self) -> Res<T>) -> Res<Vec<(&'a str, T)>> {
        let mut out: Vec<(&'a str, T)> = Vec::new();
        self.blocks(|r| {
            let k = r.string()?;
            let v = value(r)?;
            out.push((k, v));
            Ok(())
        })?;
        if out.len() > 1 {
            if out.len() <= 16 {
                for i in 1..out.len() {
                    if out[..i].iter().any(|(k, _)| *k == out[i].0) {
                        return Err(Unusual);
                    }
                }
            } else {
                let mut seen = std::collections::HashSet::with_capacity(out.len());
                if !out.iter().all(|(k, _)| seen.insert(*k)) {
                    return Err(Unusual);
                }
            }
        }
        Ok(out)
    }
}

// --------------------------------------------------------------------------- the span

struct Event<'a> {
    name: &'a str,
    time_ns: i64,
    attributes: Vec<(&'a str, &'a str)>,
}

struct Llm<'a> {
    model: Option<&'a str>,
    prompt: &'a [u8],
    response: &'a [u8],
    logprobs: &'a [u8],
    mask: &'a [u8],
    resource_version: Option<i64>,
    request_id: Option<&'a str>,
    finish_reason: Option<&'a str>,
}

struct Reward<'a> {
    value: f64,
    primary: &'a str,
    dimensions: Vec<(&'a str, f64)>,
}

struct Tool<'a> {
    name: &'a str,
    arguments: &'a str,
    result: Option<&'a str>,
    ok: bool,
    error: Option<&'a str>,
}

struct Span<'a> {
    span_id: &'a str,
    trace_id: &'a str,
    parent_id: Option<&'a str>,
    rollout_id: &'a str,
    attempt_id: &'a str,
    sequence_id: i64,
    name: &'a str,
    kind: &'a str,
    start_time_ns: i64,
    end_time_ns: i64,
    status_code: &'a str,
    status_message: Option<&'a str>,
    attributes: Vec<(&'a str, &'a str)>,
    events: Vec<Event<'a>>,
    resource: Vec<(&'a str, &'a str)>,
    llm: Option<Llm<'a>>,
    reward: Option<Reward<'a>>,
    tool: Option<Tool<'a>>,
    agent_name: Option<&'a str>,
}

/// The body of a `rolloutbus.Span` (schemas/avro/span.avsc, field by field), which must fill `d`.
fn read_span(d: &[u8], at: usize) -> Res<Span<'_>> {
    let r = &mut Reader { d, p: at };
    let span_id = r.string()?;
    let trace_id = r.string()?;
    let parent_id = r.opt_string()?;
    let rollout_id = r.string()?;
    let attempt_id = r.string()?;
    let sequence_id = r.long()?;
    let name = r.string()?;
    let kind = r.string()?;
    let start_time_ns = r.long()?;
    let end_time_ns = r.long()?;
    let status_code = r.string()?;
    let status_message = r.opt_string()?;
    let attributes = r.map(|r| r.string())?;
    let mut events = Vec::new();
    r.blocks(|r| {
        let name = r.string()?;
        let time_ns = r.long()?;
        let attributes = r.map(|r| r.string())?;
        events.push(Event { name, time_ns, attributes });
        Ok(())
    })?;
    let resource = r.map(|r| r.string())?;
    let llm = if r.present()? {
        Some(Llm {
            model: r.opt_string()?,
            prompt: r.raw()?,
            response: r.raw()?,
            logprobs: r.raw()?,
            mask: r.raw()?,
            resource_version: if r.present()? { Some(r.long()?) } else { None },
            request_id: r.opt_string()?,
            finish_reason: r.opt_string()?,
        })
    } else {
        None
    };
    let reward = if r.present()? {
        Some(Reward { value: r.double()?, primary: r.string()?, dimensions: r.map(|r| r.double())? })
    } else {
        None
    };
    let tool = if r.present()? {
        Some(Tool {
            name: r.string()?,
            arguments: r.string()?,
            result: r.opt_string()?,
            ok: r.boolean()?,
            error: r.opt_string()?,
        })
    } else {
        None
    };
    let agent_name = r.opt_string()?;
    if r.p != d.len() {
        return Err(Unusual); // trailing bytes
    }
    Ok(Span {
        span_id, trace_id, parent_id, rollout_id, attempt_id, sequence_id, name, kind, start_time_ns, end_time_ns,
        status_code, status_message, attributes, events, resource, llm, reward, tool, agent_name,
    })
}

/// `schemas.checks.check_span`: a span it would refuse is left to the reference (which says why).
fn check(s: &Span, max_attributes: usize, max_value_chars: usize) -> Res<()> {
    if s.rollout_id.is_empty() || s.attempt_id.is_empty() || s.span_id.is_empty() || s.sequence_id < 0 {
        return Err(Unusual);
    }
    for attrs in [&s.attributes, &s.resource] {
        if attrs.len() > max_attributes {
            return Err(Unusual);
        }
        for (_, v) in attrs.iter() {
            // Python counts characters; a string of no more bytes than the limit has no more characters.
            if v.len() > max_value_chars && v.chars().count() > max_value_chars {
                return Err(Unusual);
            }
        }
    }
    if let Some(llm) = &s.llm {
        if llm.prompt.len() % 4 != 0 || llm.response.len() % 4 != 0 || llm.logprobs.len() % 4 != 0 {
            return Err(Unusual);
        }
        for c in llm.logprobs.chunks_exact(4) {
            let x = f32::from_le_bytes(c.try_into().unwrap()) as f64;
            if x.is_nan() || x > 1e-4 {
                return Err(Unusual);
            }
        }
    }
    if let Some(rw) = &s.reward {
        if !rw.value.is_finite() || rw.dimensions.iter().any(|(_, x)| !x.is_finite()) {
            return Err(Unusual);
        }
    }
    Ok(())
}

// --------------------------------------------------------------------------- RowBinary

#[inline]
fn leb(out: &mut Vec<u8>, mut n: usize) {
    while n >= 0x80 {
        out.push((n as u8 & 0x7F) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

#[inline]
fn rb_str(out: &mut Vec<u8>, s: &str) {
    leb(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

#[inline]
fn rb_nstr(out: &mut Vec<u8>, s: Option<&str>) {
    match s {
        None => out.push(1),
        Some(s) => {
            out.push(0);
            rb_str(out, s);
        }
    }
}

fn rb_map_ss(out: &mut Vec<u8>, m: &[(&str, &str)]) {
    leb(out, m.len());
    for (k, v) in m {
        rb_str(out, k);
        rb_str(out, v);
    }
}

/// `streams.rowbinary.span` without its last four columns (late, kafka_partition, kafka_offset,
/// ingested_ns: `_TAIL`, which the stage appends once it knows them).
fn row_head(s: &Span) -> Vec<u8> {
    let mut n = 160 + s.attributes.iter().map(|(k, v)| k.len() + v.len() + 4).sum::<usize>();
    if let Some(llm) = &s.llm {
        n += llm.prompt.len() + llm.response.len() + llm.logprobs.len() + 64;
    }
    let mut out = Vec::with_capacity(n);
    rb_str(&mut out, s.rollout_id);
    rb_str(&mut out, s.attempt_id);
    rb_str(&mut out, s.span_id);
    out.extend_from_slice(&(s.sequence_id as u64).to_le_bytes());
    rb_str(&mut out, s.trace_id);
    rb_nstr(&mut out, s.parent_id);
    rb_str(&mut out, s.name);
    rb_str(&mut out, s.kind);
    rb_nstr(&mut out, s.agent_name);
    out.extend_from_slice(&s.start_time_ns.to_le_bytes());
    out.extend_from_slice(&s.end_time_ns.to_le_bytes());
    rb_str(&mut out, s.status_code);
    rb_nstr(&mut out, s.status_message);
    rb_map_ss(&mut out, &s.attributes);
    leb(&mut out, s.events.len());
    for e in &s.events {
        rb_str(&mut out, e.name);
        out.extend_from_slice(&e.time_ns.to_le_bytes());
        rb_map_ss(&mut out, &e.attributes);
    }
    rb_map_ss(&mut out, &s.resource);
    match &s.llm {
        None => out.extend_from_slice(&[1, 0, 0, 0, 1]),
        Some(llm) => {
            rb_nstr(&mut out, llm.model);
            for packed in [llm.prompt, llm.response, llm.logprobs] {
                leb(&mut out, packed.len() / 4);
                out.extend_from_slice(packed);
            }
            match llm.resource_version {
                None => out.push(1),
                Some(v) => {
                    out.push(0);
                    out.extend_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
    match &s.reward {
        None => out.extend_from_slice(&[1, 0]),
        Some(rw) => {
            out.push(0);
            out.extend_from_slice(&rw.value.to_le_bytes());
            leb(&mut out, rw.dimensions.len());
            for (k, x) in &rw.dimensions {
                rb_str(&mut out, k);
                out.extend_from_slice(&x.to_le_bytes());
            }
        }
    }
    match &s.tool {
        None => out.extend_from_slice(&[1, 1, 1, 1, 1]),
        Some(t) => {
            out.push(0);
            rb_str(&mut out, t.name);
            out.push(0);
            out.push(t.ok as u8);
            out.push(0);
            rb_str(&mut out, t.arguments);
            rb_nstr(&mut out, t.result);
            rb_nstr(&mut out, t.error);
        }
    }
    out
}

// --------------------------------------------------------------------------- the Python view

fn opt_str<'py>(py: Python<'py>, s: Option<&str>) -> Bound<'py, PyAny> {
    match s {
        Some(s) => PyString::new(py, s).into_any(),
        None => py.None().into_bound(py),
    }
}

fn str_dict<'py>(py: Python<'py>, m: &[(&str, &str)]) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in m {
        d.set_item(PyString::new(py, k), PyString::new(py, v))?;
    }
    Ok(d)
}

/// Python's objects for one span: `streams.attempts.span_view` of the dict the reference decodes.
#[pyclass(frozen, module = "rolloutbus_native")]
struct SpanDecoder {
    header: [u8; 10],
    max_attributes: usize,
    max_value_chars: usize,
    namespace: Py<PyAny>,
    array: Py<PyAny>,
}

impl SpanDecoder {
    fn ns<'py>(&self, py: Python<'py>, d: &Bound<'py, PyDict>) -> PyResult<Bound<'py, PyAny>> {
        self.namespace.bind(py).call((), Some(d))
    }

    fn packed<'py>(&self, py: Python<'py>, code: &Bound<'py, PyString>, data: &[u8]) -> PyResult<Bound<'py, PyAny>> {
        self.array.bind(py).call1((code, PyBytes::new(py, data)))
    }

    fn view<'py>(&self, py: Python<'py>, s: &Span) -> PyResult<Bound<'py, PyAny>> {
        let d = PyDict::new(py);
        d.set_item(intern!(py, "span_id"), s.span_id)?;
        d.set_item(intern!(py, "trace_id"), s.trace_id)?;
        d.set_item(intern!(py, "parent_id"), opt_str(py, s.parent_id))?;
        d.set_item(intern!(py, "rollout_id"), s.rollout_id)?;
        d.set_item(intern!(py, "attempt_id"), s.attempt_id)?;
        d.set_item(intern!(py, "sequence_id"), s.sequence_id)?;
        d.set_item(intern!(py, "name"), s.name)?;
        d.set_item(intern!(py, "kind"), s.kind)?;
        d.set_item(intern!(py, "start_time_ns"), s.start_time_ns)?;
        d.set_item(intern!(py, "end_time_ns"), s.end_time_ns)?;
        d.set_item(intern!(py, "status_code"), s.status_code)?;
        d.set_item(intern!(py, "status_message"), opt_str(py, s.status_message))?;
        d.set_item(intern!(py, "attributes"), str_dict(py, &s.attributes)?)?;
        let events = PyList::empty(py);
        for e in &s.events {
            let ed = PyDict::new(py);
            ed.set_item(intern!(py, "name"), e.name)?;
            ed.set_item(intern!(py, "time_ns"), e.time_ns)?;
            ed.set_item(intern!(py, "attributes"), str_dict(py, &e.attributes)?)?;
            events.append(self.ns(py, &ed)?)?;
        }
        d.set_item(intern!(py, "events"), events)?;
        d.set_item(intern!(py, "resource"), str_dict(py, &s.resource)?)?;
        match &s.llm {
            None => d.set_item(intern!(py, "llm"), py.None())?,
            Some(llm) => {
                let ld = PyDict::new(py);
                ld.set_item(intern!(py, "model"), opt_str(py, llm.model))?;
                let code_i = intern!(py, "I");
                ld.set_item(intern!(py, "prompt_token_ids"), self.packed(py, code_i, llm.prompt)?)?;
                ld.set_item(intern!(py, "response_token_ids"), self.packed(py, code_i, llm.response)?)?;
                ld.set_item(intern!(py, "response_logprobs"), self.packed(py, intern!(py, "f"), llm.logprobs)?)?;
                ld.set_item(intern!(py, "response_mask"), PyList::new(py, llm.mask.iter().copied())?)?;
                ld.set_item(intern!(py, "resource_version"), llm.resource_version)?;
                ld.set_item(intern!(py, "request_id"), opt_str(py, llm.request_id))?;
                ld.set_item(intern!(py, "finish_reason"), opt_str(py, llm.finish_reason))?;
                d.set_item(intern!(py, "llm"), self.ns(py, &ld)?)?;
            }
        }
        match &s.reward {
            None => d.set_item(intern!(py, "reward"), py.None())?,
            Some(rw) => {
                let rd = PyDict::new(py);
                rd.set_item(intern!(py, "value"), rw.value)?;
                rd.set_item(intern!(py, "primary"), rw.primary)?;
                let dims = PyDict::new(py);
                for (k, x) in &rw.dimensions {
                    dims.set_item(PyString::new(py, k), *x)?;
                }
                rd.set_item(intern!(py, "dimensions"), dims)?;
                d.set_item(intern!(py, "reward"), self.ns(py, &rd)?)?;
            }
        }
        match &s.tool {
            None => d.set_item(intern!(py, "tool"), py.None())?,
            Some(t) => {
                let td = PyDict::new(py);
                td.set_item(intern!(py, "name"), t.name)?;
                td.set_item(intern!(py, "arguments"), t.arguments)?;
                td.set_item(intern!(py, "result"), opt_str(py, t.result))?;
                td.set_item(intern!(py, "ok"), t.ok)?;
                td.set_item(intern!(py, "error"), opt_str(py, t.error))?;
                d.set_item(intern!(py, "tool"), self.ns(py, &td)?)?;
            }
        }
        d.set_item(intern!(py, "agent_name"), opt_str(py, s.agent_name))?;
        self.ns(py, &d)
    }

    fn one<'py>(&self, py: Python<'py>, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let Ok(b) = value.downcast::<PyBytes>() else {
            return Ok(py.None().into_bound(py)); // None (a tombstone), a bytearray: the reference says
        };
        let data = b.as_bytes();
        if data.len() < 10 || data[..10] != self.header {
            return Ok(py.None().into_bound(py)); // another record, writer schema, or not ours
        }
        let span = match read_span(data, 10).and_then(|s| check(&s, self.max_attributes, self.max_value_chars).map(|_| s)) {
            Ok(s) => s,
            Err(Unusual) => return Ok(py.None().into_bound(py)),
        };
        let head = PyBytes::new(py, &row_head(&span));
        Ok(PyTuple::new(py, [self.view(py, &span)?, head.into_any()])?.into_any())
    }
}

#[pymethods]
impl SpanDecoder {
    /// ``fingerprint``: the current Span schema's 8 bytes; the limits of ``schemas.models``;
    /// ``namespace`` and ``array``: ``types.SimpleNamespace`` and ``array.array``.
    #[new]
    fn new(fingerprint: &[u8], max_attributes: usize, max_attribute_value_chars: usize, namespace: Py<PyAny>, array: Py<PyAny>) -> PyResult<Self> {
        if fingerprint != SPAN_FINGERPRINT {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "rolloutbus_native reads the Span schema {}, not {}: rebuild native/ for the current schema",
                hex(&SPAN_FINGERPRINT),
                hex(fingerprint)
            )));
        }
        if !cfg!(target_endian = "little") {
            return Err(pyo3::exceptions::PyRuntimeError::new_err("rolloutbus_native reads packed arrays on little-endian machines only"));
        }
        let mut header = [0xC3u8, 0x01, 0, 0, 0, 0, 0, 0, 0, 0];
        header[2..].copy_from_slice(fingerprint);
        Ok(SpanDecoder { header, max_attributes, max_value_chars: max_attribute_value_chars, namespace, array })
    }

    /// One consumed value → ``(span view, row head)``, or ``None`` where the reference must do the
    /// record (an event, another writer schema, an unusual or bad record). One record per call, not
    /// a batch: a batch's views alive at once made the garbage collector's passes cost more than
    /// the decoding (measured: 29 → 19 µs per workload span in the stage).
    fn decode_one<'py>(&self, py: Python<'py>, value: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        self.one(py, value)
    }
}

// --------------------------------------------------------------------------- Avro writing (the SDK, the gateway)

/// Not the common shape of a value to write: `schemas.span_avro.Unusual`, the codec asks fastavro.
type W<T> = Result<T, Unusual>;

fn py_err(_: PyErr) -> Unusual {
    Unusual
}

#[inline]
fn w_long(out: &mut Vec<u8>, n: i64) {
    let mut z = ((n << 1) ^ (n >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8 & 0x7F) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

#[inline]
fn w_int_field(out: &mut Vec<u8>, v: &Bound<'_, PyAny>) -> W<()> {
    if !v.is_exact_instance_of::<PyInt>() {
        return Err(Unusual);
    }
    w_long(out, v.extract::<i64>().map_err(py_err)?); // over 64 bits: fastavro says so
    Ok(())
}

#[inline]
fn w_str(out: &mut Vec<u8>, v: &Bound<'_, PyAny>) -> W<()> {
    if !v.is_exact_instance_of::<PyString>() {
        return Err(Unusual);
    }
    let s = v.downcast::<PyString>().map_err(|_| Unusual)?.to_str().map_err(py_err)?; // a lone surrogate
    w_long(out, s.len() as i64);
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

#[inline]
fn w_bytes(out: &mut Vec<u8>, v: &Bound<'_, PyAny>) -> W<()> {
    if !v.is_exact_instance_of::<PyBytes>() {
        return Err(Unusual);
    }
    let b = v.downcast::<PyBytes>().map_err(|_| Unusual)?.as_bytes();
    w_long(out, b.len() as i64);
    out.extend_from_slice(b);
    Ok(())
}

#[inline]
fn w_double(out: &mut Vec<u8>, v: &Bound<'_, PyAny>) -> W<()> {
    if !v.is_exact_instance_of::<PyFloat>() {
        return Err(Unusual);
    }
    out.extend_from_slice(&v.downcast::<PyFloat>().map_err(|_| Unusual)?.value().to_le_bytes());
    Ok(())
}

fn w_bool(out: &mut Vec<u8>, v: &Bound<'_, PyAny>) -> W<()> {
    if !v.is_exact_instance_of::<PyBool>() {
        return Err(Unusual);
    }
    out.push(v.is_truthy().map_err(py_err)? as u8);
    Ok(())
}

#[inline]
fn w_nullable(out: &mut Vec<u8>, v: &Bound<'_, PyAny>, write: impl FnOnce(&mut Vec<u8>, &Bound<'_, PyAny>) -> W<()>) -> W<()> {
    if v.is_none() {
        out.push(0);
        Ok(())
    } else {
        out.push(2);
        write(out, v)
    }
}

fn w_map(out: &mut Vec<u8>, v: &Bound<'_, PyAny>, value: fn(&mut Vec<u8>, &Bound<'_, PyAny>) -> W<()>) -> W<()> {
    if !v.is_exact_instance_of::<PyDict>() {
        return Err(Unusual);
    }
    let d = v.downcast::<PyDict>().map_err(|_| Unusual)?;
    if !d.is_empty() {
        w_long(out, d.len() as i64);
        for (k, x) in d.iter() {
            w_str(out, &k)?;
            value(out, &x)?;
        }
    }
    out.push(0);
    Ok(())
}

fn field<'py>(d: &Bound<'py, PyDict>, name: &Bound<'py, PyString>) -> W<Bound<'py, PyAny>> {
    d.get_item(name).map_err(py_err)?.ok_or(Unusual) // a missing field: fastavro decides (a default, or an error)
}

fn record<'a, 'py>(v: &'a Bound<'py, PyAny>) -> W<&'a Bound<'py, PyDict>> {
    if !v.is_exact_instance_of::<PyDict>() {
        return Err(Unusual);
    }
    v.downcast::<PyDict>().map_err(|_| Unusual)
}

/// `schemas.span_avro.write_span`, compiled: the Avro body of one Span dict, or `None` exactly where
/// the generated writer raises `Unusual` (the codec then asks fastavro).
fn write_span_body(py: Python<'_>, rec: &Bound<'_, PyAny>) -> W<Vec<u8>> {
    let d = record(rec)?;
    let mut out = Vec::with_capacity(256);
    let o = &mut out;
    w_str(o, &field(d, intern!(py, "span_id"))?)?;
    w_str(o, &field(d, intern!(py, "trace_id"))?)?;
    w_nullable(o, &field(d, intern!(py, "parent_id"))?, w_str)?;
    w_str(o, &field(d, intern!(py, "rollout_id"))?)?;
    w_str(o, &field(d, intern!(py, "attempt_id"))?)?;
    w_int_field(o, &field(d, intern!(py, "sequence_id"))?)?;
    w_str(o, &field(d, intern!(py, "name"))?)?;
    w_str(o, &field(d, intern!(py, "kind"))?)?;
    w_int_field(o, &field(d, intern!(py, "start_time_ns"))?)?;
    w_int_field(o, &field(d, intern!(py, "end_time_ns"))?)?;
    w_str(o, &field(d, intern!(py, "status_code"))?)?;
    w_nullable(o, &field(d, intern!(py, "status_message"))?, w_str)?;
    w_map(o, &field(d, intern!(py, "attributes"))?, w_str)?;
    let events = field(d, intern!(py, "events"))?;
    if !events.is_exact_instance_of::<PyList>() {
        return Err(Unusual);
    }
    let events = events.downcast::<PyList>().map_err(|_| Unusual)?;
    if !events.is_empty() {
        w_long(o, events.len() as i64);
        for e in events.iter() {
            let e = record(&e)?;
            w_str(o, &field(e, intern!(py, "name"))?)?;
            w_int_field(o, &field(e, intern!(py, "time_ns"))?)?;
            w_map(o, &field(e, intern!(py, "attributes"))?, w_str)?;
        }
    }
    o.push(0);
    w_map(o, &field(d, intern!(py, "resource"))?, w_str)?;
    let llm = field(d, intern!(py, "llm"))?;
    if llm.is_none() {
        o.push(0);
    } else {
        o.push(2);
        let l = record(&llm)?;
        w_nullable(o, &field(l, intern!(py, "model"))?, w_str)?;
        w_bytes(o, &field(l, intern!(py, "prompt_token_ids"))?)?;
        w_bytes(o, &field(l, intern!(py, "response_token_ids"))?)?;
        w_bytes(o, &field(l, intern!(py, "response_logprobs"))?)?;
        w_bytes(o, &field(l, intern!(py, "response_mask"))?)?;
        w_nullable(o, &field(l, intern!(py, "resource_version"))?, w_int_field)?;
        w_nullable(o, &field(l, intern!(py, "request_id"))?, w_str)?;
        w_nullable(o, &field(l, intern!(py, "finish_reason"))?, w_str)?;
    }
    let reward = field(d, intern!(py, "reward"))?;
    if reward.is_none() {
        o.push(0);
    } else {
        o.push(2);
        let r = record(&reward)?;
        w_double(o, &field(r, intern!(py, "value"))?)?;
        w_str(o, &field(r, intern!(py, "primary"))?)?;
        w_map(o, &field(r, intern!(py, "dimensions"))?, w_double)?;
    }
    let tool = field(d, intern!(py, "tool"))?;
    if tool.is_none() {
        o.push(0);
    } else {
        o.push(2);
        let t = record(&tool)?;
        w_str(o, &field(t, intern!(py, "name"))?)?;
        w_str(o, &field(t, intern!(py, "arguments"))?)?;
        w_nullable(o, &field(t, intern!(py, "result"))?, w_str)?;
        w_bool(o, &field(t, intern!(py, "ok"))?)?;
        w_nullable(o, &field(t, intern!(py, "error"))?, w_str)?;
    }
    w_nullable(o, &field(d, intern!(py, "agent_name"))?, w_str)?;
    Ok(out)
}

/// The Avro body (no header) of one ``rolloutbus.Span`` dict, or ``None`` where
/// ``schemas.span_avro.write_span`` would raise ``Unusual`` (a value of another type, a missing
/// field, an int over 64 bits, a lone surrogate): then the codec asks fastavro.
#[pyfunction]
fn write_span<'py>(py: Python<'py>, rec: &Bound<'py, PyAny>) -> Option<Bound<'py, PyBytes>> {
    write_span_body(py, rec).ok().map(|b| PyBytes::new(py, &b))
}

// --------------------------------------------------------------------------- transitions rows

static ARRAY_TYPE: pyo3::sync::PyOnceLock<Py<pyo3::types::PyType>> = pyo3::sync::PyOnceLock::new();

fn attr<'py>(o: &Bound<'py, PyAny>, name: &Bound<'py, PyString>) -> W<Bound<'py, PyAny>> {
    o.getattr(name).map_err(py_err)
}

fn rb_exact_str(out: &mut Vec<u8>, v: &Bound<'_, PyAny>) -> W<()> {
    if !v.is_exact_instance_of::<PyString>() {
        return Err(Unusual);
    }
    rb_str(out, v.downcast::<PyString>().map_err(|_| Unusual)?.to_str().map_err(py_err)?);
    Ok(())
}

fn exact_float(v: &Bound<'_, PyAny>) -> W<f64> {
    if !v.is_exact_instance_of::<PyFloat>() {
        return Err(Unusual);
    }
    Ok(v.downcast::<PyFloat>().map_err(|_| Unusual)?.value())
}

/// `array.array` of typecode `code` → RowBinary `Array(...)`: its item count and its bytes.
fn rb_packed(py: Python<'_>, out: &mut Vec<u8>, v: &Bound<'_, PyAny>, code: &str, size: usize) -> W<()> {
    let array = ARRAY_TYPE.import(py, "array", "array").map_err(py_err)?;
    if !v.get_type().is(array) || attr(v, intern!(py, "typecode"))?.extract::<String>().map_err(py_err)? != code {
        return Err(Unusual);
    }
    let b = v.call_method0(intern!(py, "tobytes")).map_err(py_err)?;
    let b = b.downcast::<PyBytes>().map_err(|_| Unusual)?.as_bytes();
    leb(out, b.len() / size);
    out.extend_from_slice(b);
    Ok(())
}

/// A response mask: a list of ints 0..=255 (or an `array('B')`) → `Array(UInt8)`.
fn rb_mask(py: Python<'_>, out: &mut Vec<u8>, v: &Bound<'_, PyAny>) -> W<()> {
    if !v.is_exact_instance_of::<PyList>() {
        return rb_packed(py, out, v, "B", 1);
    }
    let l = v.downcast::<PyList>().map_err(|_| Unusual)?;
    leb(out, l.len());
    for x in l.iter() {
        if !x.is_exact_instance_of::<PyInt>() {
            return Err(Unusual);
        }
        out.push(x.extract::<u8>().map_err(py_err)?);
    }
    Ok(())
}

fn transition_body(py: Python<'_>, step: &Bound<'_, PyAny>, group: &Bound<'_, PyAny>, credit: &Bound<'_, PyAny>, updated_ns: &Bound<'_, PyAny>) -> W<Vec<u8>> {
    if !cfg!(target_endian = "little") {
        return Err(Unusual);
    }
    let mut out = Vec::with_capacity(512);
    let o = &mut out;
    rb_exact_str(o, &attr(step, intern!(py, "rollout_id"))?)?;
    rb_exact_str(o, &attr(step, intern!(py, "attempt_id"))?)?;
    let turn = attr(step, intern!(py, "turn"))?;
    if !turn.is_exact_instance_of::<PyInt>() {
        return Err(Unusual);
    }
    o.extend_from_slice(&turn.extract::<u32>().map_err(py_err)?.to_le_bytes());
    rb_exact_str(o, &attr(step, intern!(py, "task_id"))?)?;
    rb_exact_str(o, &attr(step, intern!(py, "span_id"))?)?;
    let agent = attr(step, intern!(py, "agent_name"))?;
    if agent.is_none() {
        o.push(1);
    } else {
        o.push(0);
        rb_exact_str(o, &agent)?;
    }
    let rv = attr(step, intern!(py, "resource_version"))?;
    if rv.is_none() {
        o.push(1);
    } else if rv.is_exact_instance_of::<PyInt>() {
        o.push(0);
        o.extend_from_slice(&rv.extract::<i64>().map_err(py_err)?.to_le_bytes());
    } else {
        return Err(Unusual);
    }
    rb_packed(py, o, &attr(step, intern!(py, "prompt_token_ids"))?, "I", 4)?;
    rb_packed(py, o, &attr(step, intern!(py, "response_token_ids"))?, "I", 4)?;
    rb_packed(py, o, &attr(step, intern!(py, "response_logprobs"))?, "f", 4)?;
    rb_mask(py, o, &attr(step, intern!(py, "response_mask"))?)?;
    for name in [intern!(py, "reward"), intern!(py, "return_"), intern!(py, "advantage")] {
        o.extend_from_slice(&exact_float(&attr(step, name)?)?.to_le_bytes());
    }
    let trained = attr(step, intern!(py, "trained"))?;
    if !trained.is_exact_instance_of::<PyBool>() {
        return Err(Unusual);
    }
    o.push(trained.is_truthy().map_err(py_err)? as u8);
    rb_exact_str(o, group)?;
    rb_exact_str(o, credit)?;
    if !updated_ns.is_exact_instance_of::<PyInt>() {
        return Err(Unusual);
    }
    o.extend_from_slice(&updated_ns.extract::<i64>().map_err(py_err)?.to_le_bytes());
    Ok(out)
}

/// ``streams.rowbinary.transition``, compiled: one ``transitions`` row, or ``None`` for anything but
/// the common shape (token ids and logprobs as ``array`` of their wire type, exact str/int/float/bool
/// values, a mask as a list of bytes' values): then the Python reference builds it.
#[pyfunction]
fn transition_row<'py>(
    py: Python<'py>, step: &Bound<'py, PyAny>, group: &Bound<'py, PyAny>, credit: &Bound<'py, PyAny>, updated_ns: &Bound<'py, PyAny>,
) -> Option<Bound<'py, PyBytes>> {
    transition_body(py, step, group, credit, updated_ns).ok().map(|b| PyBytes::new(py, &b))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[pymodule]
fn rolloutbus_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<SpanDecoder>()?;
    m.add_function(wrap_pyfunction!(write_span, m)?)?;
    m.add_function(wrap_pyfunction!(transition_row, m)?)?;
    m.add_function(wrap_pyfunction!(otlp::otlp_spans, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("SPAN_FINGERPRINT", PyBytes::new(m.py(), &SPAN_FINGERPRINT))?;
    Ok(())
}
