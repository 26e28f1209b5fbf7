//! The protobuf bytes of a neutral [`Request`], written straight from it in one wire
//! generation: no message tree of the generated types in between.
//!
//! Why by hand: building the generated messages (`opentelemetry-proto`'s, ours for v1.9) copied
//! every string of the dictionary, every stack's location list and every sample's attribute list
//! into a second tree as large as the neutral request, only to be encoded and freed at once; under
//! churn that was a third of an interval's transient heap, every second. Here a message is a
//! type that can write its fields ([`Fields`]); a nested message's length prefix comes from
//! running the same code into a byte counter first ([`Counter`]), so length and bytes cannot
//! disagree, and the whole request's length is known before a byte is written (the split decides
//! on it, and the buffer is reserved once).
//!
//! The bytes are those prost writes for the generated types (a pinned test compares them over
//! both generations): fields in field-number order; a scalar at its default (0, empty string)
//! left out; a set optional message always written, even empty; repeated scalars packed; an
//! element of a repeated field and a `oneof` member written even when empty; `int32`s as
//! sign-extended 64-bit varints. Field numbers are those of the official `.proto` files
//! (`opentelemetry-proto` 0.33 bundles v1.10.0's; v1.9.0 differs only in `Sample`, see
//! [`Generation`]).

use std::marker::PhantomData;

use bytes::BufMut;

use super::super::request::{self, Request, Value};

/// The fields of `Sample` that moved between the generations (every other field of every message
/// has the same number in both).
pub(crate) trait Generation {
    /// `repeated int64 values`.
    const VALUES: u32;
    /// `repeated int32 attribute_indices`.
    const ATTRIBUTE_INDICES: u32;
}

/// Where a message's bytes go: a buffer, or a counter of how many there would be.
trait Out {
    fn byte(&mut self, byte: u8);
    fn slice(&mut self, bytes: &[u8]);
}

/// Counts the bytes a message would take.
#[derive(Default)]
struct Counter(usize);

impl Out for Counter {
    fn byte(&mut self, _: u8) {
        self.0 += 1;
    }

    fn slice(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
}

/// Writes into a buffer the caller reserved for the whole message.
struct Writer<'a, B>(&'a mut B);

impl<B: BufMut> Out for Writer<'_, B> {
    fn byte(&mut self, byte: u8) {
        self.0.put_u8(byte);
    }

    fn slice(&mut self, bytes: &[u8]) {
        self.0.put_slice(bytes);
    }
}

/// A message: what it writes between its length prefix's end and the next field.
trait Fields {
    fn fields(&self, out: &mut impl Out);

    /// Bytes its fields take.
    fn len(&self) -> usize {
        let mut counter = Counter::default();
        self.fields(&mut counter);
        counter.0
    }
}

/// Wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;

fn varint(out: &mut impl Out, mut value: u64) {
    while value >= 0x80 {
        // (the low 7 bits, with the bit that says more follows)
        out.byte((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.byte(value as u8);
}

fn varint_len(value: u64) -> usize {
    // 7 bits a byte, at least one byte.
    (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
}

fn key(out: &mut impl Out, field: u32, wire_type: u8) {
    varint(out, u64::from(field << 3 | u32::from(wire_type)));
}

/// An `int32` as protobuf writes it: sign-extended to 64 bits (a negative one takes 10 bytes).
fn int32(value: i32) -> u64 {
    i64::from(value) as u64
}

/// A `uint64`, `int64` or `int32` field (as its varint value), left out at 0.
fn scalar(out: &mut impl Out, field: u32, value: u64) {
    if value != 0 {
        key(out, field, VARINT);
        varint(out, value);
    }
}

/// A `fixed64` field, left out at 0.
fn fixed64(out: &mut impl Out, field: u32, value: u64) {
    if value != 0 {
        key(out, field, FIXED64);
        out.slice(&value.to_le_bytes());
    }
}

/// Length-delimited bytes, written even when empty (an element of a repeated field, a `oneof`
/// member).
fn bytes(out: &mut impl Out, field: u32, bytes: &[u8]) {
    key(out, field, LEN);
    varint(out, bytes.len() as u64);
    out.slice(bytes);
}

/// A singular `string` field, left out when empty.
fn string(out: &mut impl Out, field: u32, text: &str) {
    if !text.is_empty() {
        bytes(out, field, text.as_bytes());
    }
}

/// A message field: its length, then its fields.
fn message(out: &mut impl Out, field: u32, message: &impl Fields) {
    key(out, field, LEN);
    varint(out, message.len() as u64);
    message.fields(out);
}

/// A packed repeated `int32` field, left out when empty.
fn packed_int32(out: &mut impl Out, field: u32, values: &[i32]) {
    if values.is_empty() {
        return;
    }
    key(out, field, LEN);
    let len: usize = values.iter().map(|&v| varint_len(int32(v))).sum();
    varint(out, len as u64);
    for &v in values {
        varint(out, int32(v));
    }
}

/// The whole `ExportProfilesServiceRequest` of `request` in generation `G`.
pub(crate) struct Export<'a, G> {
    request: &'a Request,
    generation: PhantomData<G>,
}

impl<'a, G: Generation> Export<'a, G> {
    pub(crate) fn new(request: &'a Request) -> Self {
        Self {
            request,
            generation: PhantomData,
        }
    }

    /// Bytes the request takes.
    pub(crate) fn encoded_len(&self) -> usize {
        self.len()
    }

    /// Appends the request to `buf` (reserve [`Export::encoded_len`] first: it grows otherwise).
    pub(crate) fn write(&self, buf: &mut impl BufMut) {
        self.fields(&mut Writer(buf));
    }
}

impl<G: Generation> Fields for Export<'_, G> {
    fn fields(&self, out: &mut impl Out) {
        for resource in &self.request.resources {
            message(
                out,
                1,
                &ResourceProfiles::<G> {
                    request: self.request,
                    resource,
                    generation: PhantomData,
                },
            );
        }
        message(out, 2, &self.request.dictionary);
    }
}

/// One resource's `ResourceProfiles`: its resource, one `ScopeProfiles` with one `Profile`.
struct ResourceProfiles<'a, G> {
    request: &'a Request,
    resource: &'a request::ResourceProfile,
    generation: PhantomData<G>,
}

impl<G: Generation> Fields for ResourceProfiles<'_, G> {
    fn fields(&self, out: &mut impl Out) {
        message(out, 1, &Resource(&self.resource.resource));
        message(
            out,
            2,
            &ScopeProfiles(Profile::<G> {
                request: self.request,
                samples: &self.resource.samples,
                generation: PhantomData,
            }),
        );
        // schema_url (3): empty.
    }
}

/// `Resource`: its attributes.
struct Resource<'a>(&'a [request::KeyValue]);

impl Fields for Resource<'_> {
    fn fields(&self, out: &mut impl Out) {
        for kv in self.0 {
            message(out, 1, kv);
        }
    }
}

/// `KeyValue` (common.proto): key, value.
impl Fields for request::KeyValue {
    fn fields(&self, out: &mut impl Out) {
        string(out, 1, &self.key);
        message(out, 2, &self.value);
    }
}

/// `AnyValue`: the `oneof` member, written even at its default.
impl Fields for Value {
    fn fields(&self, out: &mut impl Out) {
        match self {
            Value::Str(text) => bytes(out, 1, text.as_bytes()),
            Value::Int(value) => {
                key(out, 3, VARINT);
                varint(out, *value as u64);
            }
        }
    }
}

/// `ScopeProfiles`: ember's scope and its one `Profile`.
struct ScopeProfiles<'a, G>(Profile<'a, G>);

impl<G: Generation> Fields for ScopeProfiles<'_, G> {
    fn fields(&self, out: &mut impl Out) {
        message(out, 1, &Scope);
        message(out, 2, &self.0);
    }
}

/// `InstrumentationScope`: ember and its version.
struct Scope;

impl Fields for Scope {
    fn fields(&self, out: &mut impl Out) {
        string(out, 1, super::super::SCOPE_NAME);
        string(out, 2, super::super::SCOPE_VERSION);
    }
}

/// `Profile`: one resource's samples of the interval, with the request's times and types.
struct Profile<'a, G> {
    request: &'a Request,
    samples: &'a [request::Sample],
    generation: PhantomData<G>,
}

impl<G: Generation> Fields for Profile<'_, G> {
    fn fields(&self, out: &mut impl Out) {
        let r = self.request;
        message(out, 1, &ValueType(r.sample_type));
        for sample in self.samples {
            message(out, 2, &Sample::<G>(sample, PhantomData));
        }
        fixed64(out, 3, r.time_unix_nano);
        scalar(out, 4, r.duration_nano);
        message(out, 5, &ValueType(r.period_type));
        scalar(out, 6, r.period as u64);
    }
}

/// `ValueType`: (type, unit) string indexes.
struct ValueType((i32, i32));

impl Fields for ValueType {
    fn fields(&self, out: &mut impl Out) {
        scalar(out, 1, int32(self.0 .0));
        scalar(out, 2, int32(self.0 .1));
    }
}

/// `Sample`: stack index, attribute indexes and its one value, at `G`'s field numbers (link
/// index 0 and no timestamps: left out).
struct Sample<'a, G>(&'a request::Sample, PhantomData<G>);

impl<G: Generation> Fields for Sample<'_, G> {
    fn fields(&self, out: &mut impl Out) {
        let s = self.0;
        scalar(out, 1, int32(s.stack));
        let values = |out: &mut _| {
            key(out, G::VALUES, LEN);
            varint(out, varint_len(s.count as u64) as u64);
            varint(out, s.count as u64);
        };
        if G::VALUES < G::ATTRIBUTE_INDICES {
            values(out);
            packed_int32(out, G::ATTRIBUTE_INDICES, &s.attributes);
        } else {
            packed_int32(out, G::ATTRIBUTE_INDICES, &s.attributes);
            values(out);
        }
    }
}

/// `ProfilesDictionary`, the same message in both generations. Index 0 of every table is the
/// empty element (the attribute table's too, whatever the neutral form holds there).
impl Fields for request::Dictionary {
    fn fields(&self, out: &mut impl Out) {
        for mapping in &self.mappings {
            message(out, 1, mapping);
        }
        for location in &self.locations {
            message(out, 2, location);
        }
        for function in &self.functions {
            message(out, 3, function);
        }
        // link_table (4): the one empty `Link` index 0 needs.
        bytes(out, 4, &[]);
        for text in &self.strings {
            bytes(out, 5, text.as_bytes());
        }
        for (i, attribute) in self.attributes.iter().enumerate() {
            match i {
                0 => bytes(out, 6, &[]),
                _ => message(out, 6, attribute),
            }
        }
        for stack in &self.stacks {
            message(out, 7, &Stack(stack));
        }
    }
}

impl Fields for request::Mapping {
    fn fields(&self, out: &mut impl Out) {
        scalar(out, 1, self.memory_start);
        scalar(out, 2, self.memory_limit);
        scalar(out, 3, self.file_offset);
        scalar(out, 4, int32(self.filename));
        packed_int32(out, 5, &self.attributes);
    }
}

impl Fields for request::Location {
    fn fields(&self, out: &mut impl Out) {
        scalar(out, 1, int32(self.mapping));
        scalar(out, 2, self.address);
        for line in &self.lines {
            message(out, 3, line);
        }
        packed_int32(out, 4, &self.attributes);
    }
}

/// `Line`: function index and line (column 0: left out).
impl Fields for request::Line {
    fn fields(&self, out: &mut impl Out) {
        scalar(out, 1, int32(self.function));
        scalar(out, 2, self.line as u64);
    }
}

/// `Function`: name, system name and file name indexes (start line 0: left out).
impl Fields for request::Function {
    fn fields(&self, out: &mut impl Out) {
        scalar(out, 1, int32(self.name));
        scalar(out, 2, int32(self.system_name));
        scalar(out, 3, int32(self.filename));
    }
}

/// `KeyValueAndUnit`: key index and value (unit 0: left out).
impl Fields for request::Attribute {
    fn fields(&self, out: &mut impl Out) {
        scalar(out, 1, int32(self.key));
        message(out, 2, &self.value);
    }
}

/// `Stack`: its location indexes.
struct Stack<'a>(&'a [i32]);

impl Fields for Stack<'_> {
    fn fields(&self, out: &mut impl Out) {
        packed_int32(out, 1, self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_take_the_bytes_protobuf_gives_them() {
        for (value, len) in [
            (0u64, 1),
            (1, 1),
            (127, 1),
            (128, 2),
            (16_383, 2),
            (16_384, 3),
            (u64::from(u32::MAX), 5),
            (int32(-1), 10),
            (u64::MAX, 10),
        ] {
            let mut counter = Counter::default();
            varint(&mut counter, value);
            assert_eq!((varint_len(value), counter.0), (len, len), "{value}");
        }
    }
}
