//! The layouts of CPython 3.6 to 3.12 on x86-64, one per release line, for the builds everyone
//! ships (not `--with-pydebug`, not free-threaded): these versions publish no offsets of their
//! own. Each value is `offsetof` of the named field in that release's headers
//! (`Include/cpython/pystate.h`, `Include/internal/pycore_runtime.h`, `pycore_interp.h`,
//! `pycore_frame.h` or `frameobject.h`, `Include/cpython/code.h`, `unicodeobject.h`), built with
//! `Py_BUILD_CORE`; the tests check every line against a live interpreter of that version.
//!
//! `_PyRuntimeState` is internal and may move between patch releases of a line: the offsets in it
//! (`runtime`) are those of the line's later releases, and the tests check them against every
//! patch release found on the test machine (pyenv's and Debian's builds).

use super::{
    Anchors, Code, Frame, FrameKind, InterpreterState, Layout, RuntimeState, Source, ThreadState,
    Unicode, Version,
};

/// `sizeof(PyASCIIObject)` to 3.11 (`wstr` gone in 3.12) and the offsets before it.
const UNICODE_TO_3_11: Unicode = Unicode {
    length: 16,
    state: 32,
    ascii_size: 48,
};

/// `PyFrameObject`'s `f_back` and `f_code` (3.6-3.10; `f_lasti` varies).
const fn object_frame(f_lasti: u64) -> Frame {
    Frame {
        kind: FrameKind::Object,
        previous: 24,
        code: 32,
        code_tag_mask: 0,
        instruction: f_lasti,
        owner: None,
        is_entry: None,
    }
}

/// `PyThreadState` to 3.10: `next`, `interp`, `frame`, then `thread_id`.
const fn thread_to_3_10(thread_id: u64) -> ThreadState {
    ThreadState {
        next: 8,
        interp: 16,
        frame: 24,
        cframe_current_frame: None,
        thread_id,
        native_thread_id: None,
    }
}

/// `gilstate.autoTSSkey` (a `Py_tss_t`: `int _is_initialized; pthread_key_t _key;`, the key 4
/// bytes in) and `gilstate.tstate_current` in `_PyRuntimeState`, 3.7-3.11.
const fn runtime_to_3_11(
    interpreters_head: u64,
    auto_tss_key: u64,
    tstate_current: u64,
) -> RuntimeState {
    RuntimeState {
        interpreters_head: Some(interpreters_head),
        tss_key: Some(auto_tss_key + 4),
        tstate_current: Some(tstate_current),
    }
}

/// The layout of the release line of `version`, if it has a table.
pub fn layout(version: Version) -> Option<Layout> {
    if version.major != 3 {
        return None;
    }
    let interp_to_3_10 = InterpreterState { threads_head: 8 };
    let (runtime, interpreter, thread, frame, code, unicode) = match version.minor {
        6 => (
            // No _PyRuntime yet: the anchors are statics of pystate.c.
            RuntimeState::default(),
            interp_to_3_10,
            thread_to_3_10(152),
            object_frame(120),
            Code {
                filename: 96,
                name: 104,
                qualname: None,
                firstlineno: 36,
                linetable: 112,
                code_adaptive: None,
            },
            UNICODE_TO_3_11,
        ),
        7 => (
            runtime_to_3_11(24, 1504, 1480),
            interp_to_3_10,
            thread_to_3_10(176),
            object_frame(104),
            Code {
                filename: 96,
                name: 104,
                qualname: None,
                firstlineno: 36,
                linetable: 112,
                code_adaptive: None,
            },
            UNICODE_TO_3_11,
        ),
        // 3.8 added co_posonlyargcount before co_firstlineno.
        8..=10 => (
            if version.minor == 8 {
                runtime_to_3_11(32, 1392, 1368)
            } else {
                runtime_to_3_11(32, 584, 568)
            },
            interp_to_3_10,
            thread_to_3_10(176),
            // 3.10 reordered the frame's fields: f_lasti is 8 bytes earlier.
            object_frame(if version.minor == 10 { 96 } else { 104 }),
            Code {
                filename: 104,
                name: 112,
                qualname: None,
                firstlineno: 40,
                // co_lnotab to 3.9, co_linetable in its place from 3.10.
                linetable: 120,
                code_adaptive: None,
            },
            UNICODE_TO_3_11,
        ),
        11 => (
            runtime_to_3_11(40, 592, 576),
            InterpreterState { threads_head: 16 },
            ThreadState {
                next: 8,
                interp: 16,
                frame: 56,
                cframe_current_frame: Some(8),
                thread_id: 152,
                native_thread_id: Some(160),
            },
            Frame {
                kind: FrameKind::Interpreter,
                previous: 48,
                code: 32,
                code_tag_mask: 0,
                instruction: 56,
                owner: Some(69),
                // `bool is_entry;` just before `owner` (Include/internal/pycore_frame.h, v3.11).
                is_entry: Some(68),
            },
            Code {
                filename: 112,
                name: 120,
                qualname: Some(128),
                firstlineno: 72,
                linetable: 136,
                code_adaptive: Some(184),
            },
            UNICODE_TO_3_11,
        ),
        12 => (
            RuntimeState {
                interpreters_head: Some(40),
                // autoTSSkey moved out of gilstate; tstate_current became the thread-local
                // _Py_tss_tstate.
                tss_key: Some(1544 + 4),
                tstate_current: None,
            },
            InterpreterState { threads_head: 72 },
            ThreadState {
                next: 8,
                interp: 16,
                frame: 56,
                cframe_current_frame: Some(0),
                thread_id: 136,
                native_thread_id: Some(144),
            },
            Frame {
                kind: FrameKind::Interpreter,
                previous: 8,
                code: 0,
                code_tag_mask: 0,
                instruction: 56,
                owner: Some(70),
                is_entry: None,
            },
            Code {
                filename: 112,
                name: 120,
                qualname: Some(128),
                firstlineno: 68,
                linetable: 136,
                code_adaptive: Some(192),
            },
            Unicode {
                length: 16,
                state: 32,
                ascii_size: 40,
            },
        ),
        _ => return None,
    };
    Some(Layout {
        source: Source::Table,
        anchors: Anchors::default(),
        runtime,
        interpreter,
        thread,
        frame,
        code,
        unicode,
    })
}
