//! `_Py_DebugOffsets` (CPython 3.13 on): the offsets an outside reader needs, which CPython keeps
//! as the first member of `_PyRuntime`, filled in at compile time. Read from the file's initial
//! data for `_PyRuntime`, so the layout is the one this very build was compiled with.
//!
//! The struct itself is not stable between release lines (members are added in the middle), so
//! its shape per line is written out here ([`shape`]) from that line's
//! `Include/internal/pycore_debug_offsets.h` (3.14) or `pycore_runtime.h` (3.13): sections of
//! `uint64_t`s after an 8-byte cookie, each section's first member the size of the structure it
//! describes. A line without a shape is refused by name.
//!
//! Validation, since the file is hostile: the cookie is `xdebugpy`, the `version` member is the
//! version the file was recognized as (same release line, and the same `PY_VERSION_HEX` down to
//! the micro), not free-threaded (other object layouts), every size at most
//! [`MAX_STRUCT_BYTES`] ([`MAX_RUNTIME_BYTES`] for the runtime and interpreter states) and
//! every offset used
//! within its structure's size.

use super::{
    Anchors, Code, Frame, FrameKind, InterpreterState, Layout, RuntimeState, Source, ThreadState,
    Unicode, Version,
};

/// The cookie at the start of `_Py_DebugOffsets`.
pub const COOKIE: &[u8; 8] = b"xdebugpy";

/// Largest size accepted for an object, a frame or a thread state.
pub const MAX_STRUCT_BYTES: u64 = 64 << 10;

/// Largest size accepted for `_PyRuntimeState` and `PyInterpreterState`, which embed static
/// objects and caches (3.13's interpreter state is 190 KiB, 3.14's 220 KiB).
pub const MAX_RUNTIME_BYTES: u64 = 8 << 20;

/// One section: its name and its members (the first always `size`).
type Section = (&'static str, &'static [&'static str]);

/// 3.13's sections, in order, up to the last one a walker reads.
const SHAPE_3_13: &[Section] = &[
    ("header", &["version", "free_threaded"]),
    (
        "runtime_state",
        &["size", "finalizing", "interpreters_head"],
    ),
    (
        "interpreter_state",
        &[
            "size",
            "id",
            "next",
            "threads_head",
            "gc",
            "imports_modules",
            "sysdict",
            "builtins",
            "ceval_gil",
            "gil_runtime_state",
            "gil_runtime_state_enabled",
            "gil_runtime_state_locked",
            "gil_runtime_state_holder",
        ],
    ),
    (
        "thread_state",
        &[
            "size",
            "prev",
            "next",
            "interp",
            "current_frame",
            "thread_id",
            "native_thread_id",
            "datastack_chunk",
            "status",
        ],
    ),
    (
        "interpreter_frame",
        &[
            "size",
            "previous",
            "executable",
            "instr_ptr",
            "localsplus",
            "owner",
        ],
    ),
    (
        "code_object",
        &[
            "size",
            "filename",
            "name",
            "qualname",
            "linetable",
            "firstlineno",
            "argcount",
            "localsplusnames",
            "localspluskinds",
            "co_code_adaptive",
        ],
    ),
    ("pyobject", &["size", "ob_type"]),
    ("type_object", &["size", "tp_name", "tp_repr", "tp_flags"]),
    ("tuple_object", &["size", "ob_item", "ob_size"]),
    ("list_object", &["size", "ob_item", "ob_size"]),
    ("dict_object", &["size", "ma_keys", "ma_values"]),
    ("float_object", &["size", "ob_fval"]),
    ("long_object", &["size", "lv_tag", "ob_digit"]),
    ("bytes_object", &["size", "ob_size", "ob_sval"]),
    (
        "unicode_object",
        &["size", "state", "length", "asciiobject_size"],
    ),
];

/// 3.14's: `threads_main`, `code_object_generation`, `tlbc_generation` in the interpreter,
/// `stackpointer`, `tlbc_index` in the frame, `co_tlbc` in the code object, a set section.
const SHAPE_3_14: &[Section] = &[
    ("header", &["version", "free_threaded"]),
    (
        "runtime_state",
        &["size", "finalizing", "interpreters_head"],
    ),
    (
        "interpreter_state",
        &[
            "size",
            "id",
            "next",
            "threads_head",
            "threads_main",
            "gc",
            "imports_modules",
            "sysdict",
            "builtins",
            "ceval_gil",
            "gil_runtime_state",
            "gil_runtime_state_enabled",
            "gil_runtime_state_locked",
            "gil_runtime_state_holder",
            "code_object_generation",
            "tlbc_generation",
        ],
    ),
    (
        "thread_state",
        &[
            "size",
            "prev",
            "next",
            "interp",
            "current_frame",
            "thread_id",
            "native_thread_id",
            "datastack_chunk",
            "status",
        ],
    ),
    (
        "interpreter_frame",
        &[
            "size",
            "previous",
            "executable",
            "instr_ptr",
            "localsplus",
            "owner",
            "stackpointer",
            "tlbc_index",
        ],
    ),
    (
        "code_object",
        &[
            "size",
            "filename",
            "name",
            "qualname",
            "linetable",
            "firstlineno",
            "argcount",
            "localsplusnames",
            "localspluskinds",
            "co_code_adaptive",
            "co_tlbc",
        ],
    ),
    ("pyobject", &["size", "ob_type"]),
    ("type_object", &["size", "tp_name", "tp_repr", "tp_flags"]),
    ("tuple_object", &["size", "ob_item", "ob_size"]),
    ("list_object", &["size", "ob_item", "ob_size"]),
    ("set_object", &["size", "used", "table", "mask"]),
    ("dict_object", &["size", "ma_keys", "ma_values"]),
    ("float_object", &["size", "ob_fval"]),
    ("long_object", &["size", "lv_tag", "ob_digit"]),
    ("bytes_object", &["size", "ob_size", "ob_sval"]),
    (
        "unicode_object",
        &["size", "state", "length", "asciiobject_size"],
    ),
];

/// The shape of a release line's `_Py_DebugOffsets`, if known.
pub fn shape(version: Version) -> Option<&'static [Section]> {
    match (version.major, version.minor) {
        (3, 13) => Some(SHAPE_3_13),
        (3, 14) => Some(SHAPE_3_14),
        _ => None,
    }
}

/// Bytes to read from `_PyRuntime` for `version` (the cookie and every section of its shape; a
/// line without a shape reads the header only, to be refused by name).
pub fn read_len(version: Version) -> u64 {
    let words: usize = shape(version).map_or(2, |s| s.iter().map(|(_, m)| m.len()).sum());
    8 + 8 * words as u64
}

/// Why a `_Py_DebugOffsets` is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    #[error("_PyRuntime does not start with the debug offsets' cookie \"xdebugpy\"")]
    Cookie,
    #[error("CPython {0}.{1}'s debug offsets have no known shape (3.13 and 3.14 do)")]
    UnknownShape(u8, u8),
    #[error("{0} bytes of debug offsets, fewer than their shape's {1}")]
    Short(usize, usize),
    #[error("the debug offsets say version {found:#x}, the file is {expected}")]
    Version { found: u64, expected: Version },
    #[error("a free-threaded build (other object layouts): not supported")]
    FreeThreaded,
    #[error("{section}.size is {size}, over the limit of {limit}")]
    Size {
        section: &'static str,
        size: u64,
        limit: u64,
    },
    #[error("{section}.{member} is {offset}, outside its {size}-byte structure")]
    Offset {
        section: &'static str,
        member: &'static str,
        offset: u64,
        size: u64,
    },
}

/// The decoded words of one `_Py_DebugOffsets`, looked up by section and member.
struct Words<'a> {
    shape: &'static [Section],
    bytes: &'a [u8],
}

impl Words<'_> {
    /// The word of `section.member`; both names exist in every shape this module writes.
    fn get(&self, section: &str, member: &str) -> Option<u64> {
        let mut index = 0usize;
        for (name, members) in self.shape {
            if *name == section {
                let at = members.iter().position(|m| *m == member)?;
                let start = 8 + 8 * (index + at);
                let word = self.bytes.get(start..start + 8)?;
                return Some(u64::from_le_bytes(word.try_into().ok()?));
            }
            index += members.len();
        }
        None
    }
}

/// A validated offset: `section.member` within `section.size`, leaving room for `width` bytes.
fn offset(
    words: &Words<'_>,
    section: &'static str,
    member: &'static str,
    width: u64,
) -> Result<u64, Refused> {
    let limit = if section == "runtime_state" || section == "interpreter_state" {
        MAX_RUNTIME_BYTES
    } else {
        MAX_STRUCT_BYTES
    };
    let missing = || Refused::Offset {
        section,
        member,
        offset: u64::MAX,
        size: 0,
    };
    let size = words.get(section, "size").ok_or_else(missing)?;
    if size > limit {
        return Err(Refused::Size {
            section,
            size,
            limit,
        });
    }
    let value = words.get(section, member).ok_or_else(missing)?;
    if value.checked_add(width).is_none_or(|end| end > size) {
        return Err(Refused::Offset {
            section,
            member,
            offset: value,
            size,
        });
    }
    Ok(value)
}

/// Decodes and validates the `_Py_DebugOffsets` at the start of `bytes` for a file recognized
/// as `version`.
pub fn parse(bytes: &[u8], version: Version) -> Result<Layout, Refused> {
    if bytes.get(..8) != Some(COOKIE.as_slice()) {
        return Err(Refused::Cookie);
    }
    let shape = shape(version).ok_or(Refused::UnknownShape(version.major, version.minor))?;
    let needed = usize::try_from(read_len(version)).unwrap_or(usize::MAX);
    if bytes.len() < needed {
        return Err(Refused::Short(bytes.len(), needed));
    }
    let words = Words { shape, bytes };
    let found = words.get("header", "version").unwrap_or(0);
    let line = |hex: u64| (hex >> 16) & 0xffff;
    let expected_hex = (u64::from(version.major) << 24)
        | (u64::from(version.minor) << 16)
        | (u64::from(version.micro) << 8);
    if line(found) != line(expected_hex) || (found >> 8) & 0xff != u64::from(version.micro) {
        return Err(Refused::Version {
            found,
            expected: version,
        });
    }
    if words.get("header", "free_threaded") != Some(0) {
        return Err(Refused::FreeThreaded);
    }
    let ptr = 8;
    let o = |section, member, width| offset(&words, section, member, width);
    let ascii_size = words.get("unicode_object", "asciiobject_size").unwrap_or(0);
    if ascii_size == 0 || ascii_size > MAX_STRUCT_BYTES {
        return Err(Refused::Size {
            section: "unicode_object.asciiobject_size",
            size: ascii_size,
            limit: MAX_STRUCT_BYTES,
        });
    }
    Ok(Layout {
        source: Source::DebugOffsets,
        anchors: Anchors::default(),
        runtime: RuntimeState {
            interpreters_head: Some(o("runtime_state", "interpreters_head", ptr)?),
            tss_key: None,
            tstate_current: None,
        },
        interpreter: InterpreterState {
            threads_head: o("interpreter_state", "threads_head", ptr)?,
        },
        thread: ThreadState {
            next: o("thread_state", "next", ptr)?,
            interp: o("thread_state", "interp", ptr)?,
            frame: o("thread_state", "current_frame", ptr)?,
            cframe_current_frame: None,
            thread_id: o("thread_state", "thread_id", 8)?,
            native_thread_id: Some(o("thread_state", "native_thread_id", 8)?),
        },
        frame: Frame {
            kind: FrameKind::Interpreter,
            previous: o("interpreter_frame", "previous", ptr)?,
            code: o("interpreter_frame", "executable", ptr)?,
            // 3.14's f_executable is a _PyStackRef: a pointer with tag bits (Py_TAG_BITS = 3 in
            // builds with the GIL).
            code_tag_mask: if version.minor >= 14 { 3 } else { 0 },
            instruction: o("interpreter_frame", "instr_ptr", ptr)?,
            owner: Some(o("interpreter_frame", "owner", 1)?),
            is_entry: None,
        },
        code: Code {
            filename: o("code_object", "filename", ptr)?,
            name: o("code_object", "name", ptr)?,
            qualname: Some(o("code_object", "qualname", ptr)?),
            firstlineno: o("code_object", "firstlineno", 4)?,
            linetable: o("code_object", "linetable", ptr)?,
            // The instructions are inline at the end of the code object: at its size at most.
            code_adaptive: Some(o("code_object", "co_code_adaptive", 0)?),
        },
        unicode: Unicode {
            length: o("unicode_object", "length", 8)?,
            state: o("unicode_object", "state", 4)?,
            ascii_size,
        },
    })
}
