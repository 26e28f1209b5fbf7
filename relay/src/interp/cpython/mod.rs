//! CPython recognized from a mapped binary (the `python3.X` executable when statically linked,
//! or `libpython3.X.so`), its exact version, and the [`Layout`] a kernel-side walker needs to
//! find a thread's current Python frame and name it.
//!
//! Recognition (`version`): the file must define CPython's entry points in its dynamic symbol
//! table (`Py_InitializeEx`, and `PyUnicode_AsUTF8` for Python 3). The version comes from the
//! file: `Py_Version`'s initial value where it exists (3.11+); before 3.11 the `PY_VERSION`
//! string in `.rodata`, among candidates narrowed by the symbols the file defines (`_PyRuntime`
//! from 3.7). The file name only breaks a tie.
//!
//! Layout: from 3.13 CPython publishes the offsets an outside reader needs in `_Py_DebugOffsets`,
//! the first member of `_PyRuntime`; they are read from the file's initial data
//! ([`debug_offsets`]), validated, never taken from a table. 3.6 to 3.12 come from a table per
//! release line ([`table`]) derived from that release's headers. Two frame families: a chain of
//! `PyFrameObject`s up to 3.10, of `_PyInterpreterFrame`s from 3.11.

pub mod codes;
pub mod debug_offsets;
pub mod instruction;
pub mod lines;
pub mod naming;
pub mod splice;
pub mod strings;
pub mod table;
mod version;

use std::{fmt, fs::File};

pub use self::version::Version;
use super::{
    elf::{self, Tables},
    Error, Limits, Recognized,
};

/// A recognized CPython.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interpreter {
    pub version: Version,
    /// A shared library (`libpython3.X.so`) rather than an executable with the interpreter
    /// linked in.
    pub shared_library: bool,
    /// The lowest `PT_LOAD` address: an anchor minus this is its offset from the start of the
    /// mapping of file offset 0.
    pub first_vaddr: u64,
    /// What a walker needs, or why there is nothing a walker could use (a version without a
    /// table, a refused `_Py_DebugOffsets`, a free-threaded build).
    pub layout: Result<Layout, String>,
}

/// Where a layout's offsets came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The relay's table for the release line, derived from its headers (3.6 to 3.12).
    Table,
    /// The file's own `_Py_DebugOffsets` (3.13 on).
    DebugOffsets,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Table => "table",
            Self::DebugOffsets => "_Py_DebugOffsets",
        })
    }
}

/// Anchors: ELF virtual addresses in the file (add the mapping's load bias in a process).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Anchors {
    /// `_PyRuntime` (3.7 on): the runtime state, where the interpreters list and (3.7-3.12) the
    /// thread-state key are.
    pub runtime: Option<u64>,
    /// `_PyThreadState_Current` (3.6): the thread state of the thread holding the GIL.
    pub thread_state_current: Option<u64>,
    /// `autoTLSkey` (3.6, a local symbol: only in unstripped files): the thread-state key.
    pub auto_tls_key: Option<u64>,
    /// `interp_head` (3.6, local): the first interpreter.
    pub interp_head: Option<u64>,
    /// `PyCode_Type`: the type of every code object (a walker checks a frame's code pointer
    /// against it before copying anything).
    pub code_type: Option<u64>,
}

/// Offsets in `_PyRuntimeState` (from `_PyRuntime`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeState {
    /// `interpreters.head` (3.7 on).
    pub interpreters_head: Option<u64>,
    /// The `pthread_key_t` of the thread-state key (`gilstate.autoTSSkey._key` 3.7-3.11,
    /// `autoTSSkey._key` 3.12): `pthread_getspecific` of it is the thread's `PyThreadState`.
    pub tss_key: Option<u64>,
    /// `gilstate.tstate_current` (3.7-3.11): the thread holding the GIL.
    pub tstate_current: Option<u64>,
}

/// Offsets in `PyInterpreterState`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InterpreterState {
    /// `tstate_head` (to 3.10), `threads.head` (3.11 on).
    pub threads_head: u64,
}

/// Offsets in `PyThreadState`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadState {
    pub next: u64,
    pub interp: u64,
    /// The current frame: `frame` (to 3.10), `cframe` (3.11, 3.12: then one more hop through
    /// [`ThreadState::cframe_current_frame`]), `current_frame` (3.13 on).
    pub frame: u64,
    /// `_PyCFrame.current_frame` (3.11, 3.12).
    pub cframe_current_frame: Option<u64>,
    /// `thread_id`: the thread's `pthread_t`.
    pub thread_id: u64,
    /// `native_thread_id` (3.11 on): the kernel's thread id.
    pub native_thread_id: Option<u64>,
}

/// The frame family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// `PyFrameObject` (3.6-3.10): `f_back`, `f_code`, `f_lasti` (an instruction index).
    Object,
    /// `_PyInterpreterFrame` (3.11 on): `previous`, `f_code`/`f_executable`, an instruction
    /// pointer, `owner`.
    Interpreter,
}

/// Offsets in a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    pub previous: u64,
    /// The code object (`f_code`, `f_executable`).
    pub code: u64,
    /// Low bits to clear from the code pointer (3.14: a tagged `_PyStackRef`).
    pub code_tag_mask: u64,
    /// `f_lasti` (to 3.10, an `int`), `prev_instr` (3.11, 3.12), `instr_ptr` (3.13 on).
    pub instruction: u64,
    /// `owner` (3.11 on, one byte): whether the thread, a generator or the C stack owns it.
    pub owner: Option<u64>,
    /// `is_entry` (3.11 only, a `bool`): set on the first frame an eval loop call runs, so a
    /// walker knows where one C-level `_PyEval_EvalFrameDefault` ends (3.12 marks that with a
    /// shim frame owned by the C stack instead).
    pub is_entry: Option<u64>,
}

/// Offsets in `PyCodeObject`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Code {
    pub filename: u64,
    pub name: u64,
    /// `co_qualname` (3.11 on).
    pub qualname: Option<u64>,
    /// `co_firstlineno` (an `int`).
    pub firstlineno: u64,
    /// `co_lnotab` (to 3.9), `co_linetable` (3.10 on).
    pub linetable: u64,
    /// `co_code_adaptive` (3.11 on): where the instructions an instruction pointer points into
    /// start.
    pub code_adaptive: Option<u64>,
}

/// Offsets of a compact ASCII `str` (what names and file names are).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unicode {
    /// `length` (characters).
    pub length: u64,
    /// `state` (the kind, compact and ascii bits).
    pub state: u64,
    /// `sizeof(PyASCIIObject)`: a compact ASCII string's characters follow it.
    pub ascii_size: u64,
}

/// What a kernel walker needs to find a thread's frames and name them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub source: Source,
    pub anchors: Anchors,
    pub runtime: RuntimeState,
    pub interpreter: InterpreterState,
    pub thread: ThreadState,
    pub frame: Frame,
    pub code: Code,
    pub unicode: Unicode,
}

/// Symbols a CPython exports that recognition and the anchors need (`.dynsym`).
const DYNAMIC: &[&str] = &[
    "Py_InitializeEx",
    "PyUnicode_AsUTF8",
    "Py_Version",
    "_PyRuntime",
    "_PyThreadState_Current",
    "PyCode_Type",
];

/// Local symbols (3.6's anchors), read from `.symtab` only for a file already recognized.
const LOCAL: &[&str] = &["autoTLSkey", "interp_head"];

/// The recognizer: `Ok(None)` unless `file` defines CPython's entry points.
pub fn recognize(
    file: &File,
    name_hint: &str,
    limits: &Limits,
) -> Result<Option<Recognized>, Error> {
    let facts = elf::read(file, DYNAMIC, Tables::Dynamic, limits)?;
    if facts.symbol("Py_InitializeEx").is_none() {
        return Ok(None);
    }
    let version = match version::detect(file, &facts, name_hint, limits) {
        Ok(version) => version,
        Err(reason) => {
            tracing::debug!(file = name_hint, %reason, "a CPython whose version could not be told");
            return Ok(None);
        }
    };
    let layout = layout(file, &facts, version, limits);
    Ok(Some(Recognized::CPython(Interpreter {
        version,
        shared_library: facts.shared_library,
        first_vaddr: facts.first_vaddr,
        layout,
    })))
}

/// The layout of a recognized `version`, or why there is none.
fn layout(
    file: &File,
    facts: &elf::ElfFacts,
    version: Version,
    limits: &Limits,
) -> Result<Layout, String> {
    let mut anchors = Anchors {
        runtime: facts.symbol("_PyRuntime").map(|s| s.value),
        thread_state_current: facts.symbol("_PyThreadState_Current").map(|s| s.value),
        code_type: facts.symbol("PyCode_Type").map(|s| s.value),
        ..Anchors::default()
    };
    let mut layout = if version.major == 3 && version.minor >= 13 {
        let runtime = facts
            .symbol("_PyRuntime")
            .ok_or("no _PyRuntime symbol, where 3.13 on keeps its debug offsets")?;
        let len = debug_offsets::read_len(version);
        if runtime.size != 0 && runtime.size < len {
            return Err(format!(
                "_PyRuntime is {} bytes, fewer than its debug offsets' {len}",
                runtime.size
            ));
        }
        let bytes = facts
            .read_vaddr(file, runtime.value, len, limits)
            .map_err(|e| format!("reading _PyRuntime's initial data: {e}"))?;
        debug_offsets::parse(&bytes, version).map_err(|e| e.to_string())?
    } else {
        table::layout(version).ok_or_else(|| {
            format!("CPython {version} is not supported (3.6 to 3.14 are): no layout for it")
        })?
    };
    if version.major == 3 && version.minor == 6 {
        // 3.6 keeps the thread-state key and the interpreter list in statics of pystate.c.
        match elf::read(file, LOCAL, Tables::All, limits) {
            Ok(locals) => {
                anchors.auto_tls_key = locals.symbol("autoTLSkey").map(|s| s.value);
                anchors.interp_head = locals.symbol("interp_head").map(|s| s.value);
            }
            Err(err) => tracing::debug!(%err, "CPython 3.6: no local symbols"),
        }
    }
    if version.major == 3 && version.minor >= 7 && anchors.runtime.is_none() {
        return Err(format!("CPython {version} without a _PyRuntime symbol"));
    }
    layout.anchors = anchors;
    Ok(layout)
}

#[cfg(test)]
mod live_tests;
#[cfg(test)]
pub(crate) mod tests;
