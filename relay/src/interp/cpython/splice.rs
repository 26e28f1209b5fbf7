//! Splices a thread's Python frames into its native stack in place of the eval loop's C frames.
//! Pure: no state, no I/O.
//!
//! Each call of CPython's eval loop (`_PyEval_EvalFrameDefault`) runs one or more Python frames.
//! The kernel's walk gives all of the thread's Python frames, leaf first; [`groups`] cuts them
//! into one group per eval call, as the version marks them:
//!
//! - to 3.10, one frame per call ([`Boundary::EachFrame`]);
//! - 3.11, frames up to and including one whose `is_entry` is set ([`Boundary::Entry`]);
//! - 3.12 on, frames up to a shim frame the eval loop pushes on entry ([`Boundary::Shim`]),
//!   which is not a Python function and is dropped. Its `owner` is 3: `FRAME_OWNED_BY_CSTACK`
//!   in 3.12 and 3.13, `FRAME_OWNED_BY_INTERPRETER` in 3.14 (whose `FRAME_OWNED_BY_CSTACK`, 4,
//!   no frame carries); CPython's own readers skip `owner >= 3` in 3.14, and so does this.
//!
//! [`splice`] then walks the native stack leaf first and puts each eval frame's group in its
//! place. Groups left over (the native stack was cut short) go on the root side of the last eval
//! frame (at the root end when there is none); an eval frame with no group left stays as it is.
//! Either is a mismatch, returned for counting. C functions the symbolizer found inlined into
//! an eval frame at its address stay where they are, leaf-side of that call's Python frames:
//! they are what that Python frame's eval loop was running (a call being made, say).

use std::ops::Range;

use super::{Layout, Version};
use crate::{interp::raw::RawInterpFrame, model::Frame};

/// The eval loop's symbol. Its split parts and aliases (`.cold`, `.localalias`, `.part.0`) name
/// the same call.
pub const EVAL_LOOP: &str = "_PyEval_EvalFrameDefault";

/// The smallest `owner` of a shim frame (3.12 on).
pub const SHIM_OWNER: u8 = 3;

/// How a version marks where one eval call's frames end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Boundary {
    EachFrame,
    Entry,
    Shim,
}

impl Boundary {
    pub fn of(version: Version) -> Self {
        match (version.major, version.minor) {
            (3, ..=10) => Self::EachFrame,
            (3, 11) => Self::Entry,
            _ => Self::Shim,
        }
    }
}

/// Where in a frame the kernel reads the marker byte the grouping needs (the layout's
/// `frame_marker`): `is_entry` in 3.11, `owner` from 3.12; none to 3.10 (one frame, one call).
pub fn marker_offset(version: Version, layout: &Layout) -> Option<u64> {
    match Boundary::of(version) {
        Boundary::EachFrame => None,
        Boundary::Entry => layout.frame.is_entry,
        Boundary::Shim => layout.frame.owner,
    }
}

/// Whether a native frame is the eval loop's.
pub fn is_eval_loop(frame: &Frame) -> bool {
    frame.kind == crate::model::FrameKind::Native
        && frame
            .function
            .strip_prefix(EVAL_LOOP)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

/// The groups of `frames` (leaf first), one per eval call, leaf first, as ranges into `frames`
/// (shims left out). A last group without its boundary (a walk cut short) is still a group.
pub fn groups(frames: &[RawInterpFrame], boundary: Boundary) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, frame) in frames.iter().enumerate() {
        match boundary {
            Boundary::EachFrame => out.push(i..i + 1),
            Boundary::Entry if frame.marker != 0 => {
                out.push(start..i + 1);
                start = i + 1;
            }
            Boundary::Shim if frame.marker >= SHIM_OWNER => {
                // Two shims in a row (an eval call that had not pushed its frame yet) make no
                // group.
                if start < i {
                    out.push(start..i);
                }
                start = i + 1;
            }
            _ => {}
        }
    }
    if boundary != Boundary::EachFrame && start < frames.len() {
        out.push(start..frames.len());
    }
    out
}

/// How the groups and the eval frames did not pair up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mismatch {
    /// Groups with no eval frame left for them (placed root-side of the last).
    pub groups_left: usize,
    /// Eval frames with no group left (kept as they are).
    pub eval_frames_left: usize,
}

impl Mismatch {
    pub fn is_none(&self) -> bool {
        *self == Self::default()
    }
}

/// Whether a native frame is unnamed code of the interpreter's binary (`module`, its path):
/// where the eval loop runs when the binary's symbols do not cover it. Debian's stripped 3.14
/// exports a 1 KiB `_PyEval_EvalFrameDefault` that enters the interpreter's opcode handlers,
/// local functions that tail-call each other, so no frame of the loop bears its name.
fn is_unnamed_interpreter_code(frame: &Frame, module: Option<&str>) -> bool {
    frame.kind == crate::model::FrameKind::Native
        && frame.is_unknown()
        && module.is_some_and(|path| frame.module.as_ref().is_some_and(|m| &*m.path == path))
}

/// `native` (leaf first) with each eval-loop frame replaced by the next of `groups` (each leaf
/// first, in leaf-first order). In a stack with no frame named as the eval loop, the unnamed
/// frames of the interpreter's own binary (`module`, its path) stand for it.
pub fn splice(
    native: &[Frame],
    groups: &[Vec<Frame>],
    module: Option<&str>,
) -> (Vec<Frame>, Mismatch) {
    let mut out = Vec::with_capacity(native.len() + groups.iter().map(Vec::len).sum::<usize>());
    let mut used = 0;
    let mut mismatch = Mismatch::default();
    let named_loop = native.iter().any(is_eval_loop);
    let is_eval = |frame: &Frame| {
        if named_loop {
            is_eval_loop(frame)
        } else {
            is_unnamed_interpreter_code(frame, module)
        }
    };
    // Where the frames after the last eval frame's replacement start in `out`.
    let mut after_last_eval = None;
    for frame in native {
        if !is_eval(frame) {
            out.push(frame.clone());
            continue;
        }
        match groups.get(used) {
            Some(group) => {
                used += 1;
                out.extend(group.iter().cloned());
            }
            None => {
                mismatch.eval_frames_left += 1;
                out.push(frame.clone());
            }
        }
        after_last_eval = Some(out.len());
    }
    let rest: Vec<Frame> = groups
        .get(used..)
        .unwrap_or(&[])
        .iter()
        .flatten()
        .cloned()
        .collect();
    mismatch.groups_left = groups.len().saturating_sub(used);
    if !rest.is_empty() {
        let at = after_last_eval.unwrap_or(out.len());
        out.splice(at..at, rest);
    }
    (out, mismatch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::FrameKind;

    fn native(name: &str) -> Frame {
        Frame::bare(name, FrameKind::Native, 0x1000)
    }

    fn py(name: &str) -> Frame {
        Frame::bare(name, FrameKind::CPython, 0)
    }

    fn names(frames: &[Frame]) -> Vec<&str> {
        frames.iter().map(|f| &*f.function).collect()
    }

    fn raw(marker: u8) -> RawInterpFrame {
        RawInterpFrame {
            code: 0x10,
            instruction: 0,
            marker,
        }
    }

    #[test]
    fn the_eval_loop_is_recognized_with_its_suffixes_only() {
        for name in [
            "_PyEval_EvalFrameDefault",
            "_PyEval_EvalFrameDefault.cold",
            "_PyEval_EvalFrameDefault.localalias",
        ] {
            assert!(is_eval_loop(&native(name)), "{name}");
        }
        for name in [
            "PyEval_EvalFrameEx",
            "_PyEval_EvalFrameDefaultX",
            "_PyEval_EvalFrame",
            "x_PyEval_EvalFrameDefault",
        ] {
            assert!(!is_eval_loop(&native(name)), "{name}");
        }
        // A Python function that happens to bear the name is not the eval loop
        assert!(!is_eval_loop(&py("_PyEval_EvalFrameDefault")));
    }

    #[test]
    fn the_marker_is_is_entry_in_3_11_and_owner_from_3_12() {
        let layout =
            |minor| super::super::table::layout(Version::new(3, minor, 0)).expect("layout");
        assert_eq!(marker_offset(Version::new(3, 10, 0), &layout(10)), None);
        // 3.11: `bool is_entry` at 68, `char owner` at 69
        assert_eq!(marker_offset(Version::new(3, 11, 0), &layout(11)), Some(68));
        assert_eq!(marker_offset(Version::new(3, 12, 0), &layout(12)), Some(70));
    }

    #[test]
    fn groups_to_3_10_are_one_frame_each() {
        let frames = [raw(0), raw(0), raw(0)];
        assert_eq!(
            groups(&frames, Boundary::of(Version::new(3, 10, 1))),
            [0..1, 1..2, 2..3]
        );
    }

    #[test]
    fn groups_in_3_11_end_with_the_entry_frame() {
        // Given leaf-first frames whose second and fourth are entry frames, and a tail without
        let frames = [raw(0), raw(1), raw(0), raw(1), raw(0)];
        assert_eq!(
            groups(&frames, Boundary::of(Version::new(3, 11, 7))),
            [0..2, 2..4, 4..5]
        );
    }

    #[test]
    fn groups_from_3_12_end_at_a_shim_which_is_dropped() {
        // Given frames with shims (owner 3; 3.14's unused CSTACK 4 too) and two shims in a row
        let frames = [
            raw(0),
            raw(3),
            raw(0),
            raw(2),
            raw(3),
            raw(3),
            raw(0),
            raw(4),
        ];
        for v in [(3, 12), (3, 13), (3, 14)] {
            assert_eq!(
                groups(&frames, Boundary::of(Version::new(v.0, v.1, 0))),
                [0..1, 2..4, 6..7],
                "{v:?}"
            );
        }
        // And a walk cut before its last shim keeps its last group
        assert_eq!(
            groups(&[raw(0), raw(3), raw(0)], Boundary::Shim),
            [0..1, 2..3]
        );
        assert!(groups(&[], Boundary::Shim).is_empty());
    }

    #[test]
    fn each_eval_frame_takes_the_next_group() {
        // Given a native stack with two eval calls, and two groups
        let stack = [
            native("PyFloat_FromDouble"),
            native("_PyEval_EvalFrameDefault"),
            native("_PyObject_Call"),
            native("_PyEval_EvalFrameDefault.cold"),
            native("Py_RunMain"),
            native("main"),
        ];
        let groups = [vec![py("leaf"), py("mid")], vec![py("root")]];
        // When spliced
        let (out, mismatch) = splice(&stack, &groups, None);
        // Then each eval frame is replaced by its group in order, the rest kept
        assert_eq!(
            names(&out),
            [
                "PyFloat_FromDouble",
                "leaf",
                "mid",
                "_PyObject_Call",
                "root",
                "Py_RunMain",
                "main"
            ]
        );
        assert!(mismatch.is_none());
    }

    #[test]
    fn groups_left_over_go_root_side_of_the_last_eval_frame() {
        // Given a native stack cut short: one eval frame, then an unknown frame; three groups
        let stack = [native("_PyEval_EvalFrameDefault"), native("[unknown]")];
        let groups = [vec![py("a")], vec![py("b")], vec![py("c"), py("d")]];
        let (out, mismatch) = splice(&stack, &groups, None);
        // Then the first group replaces it and the others follow it, before the rest
        assert_eq!(names(&out), ["a", "b", "c", "d", "[unknown]"]);
        assert_eq!(
            mismatch,
            Mismatch {
                groups_left: 2,
                eval_frames_left: 0
            }
        );
        // And without any eval frame, they go at the root end
        let (out, mismatch) = splice(&[native("start_thread")], &groups[..1], None);
        assert_eq!(names(&out), ["start_thread", "a"]);
        assert_eq!(mismatch.groups_left, 1);
    }

    #[test]
    fn an_eval_frame_without_a_group_stays() {
        let stack = [
            native("_PyEval_EvalFrameDefault"),
            native("_PyEval_EvalFrameDefault"),
            native("main"),
        ];
        let (out, mismatch) = splice(&stack, &[vec![py("only")]], None);
        assert_eq!(names(&out), ["only", "_PyEval_EvalFrameDefault", "main"]);
        assert_eq!(
            mismatch,
            Mismatch {
                groups_left: 0,
                eval_frames_left: 1
            }
        );
        // And no groups at all leave the stack untouched
        let (out, mismatch) = splice(&stack, &[], None);
        assert_eq!(out, stack);
        assert_eq!(mismatch.eval_frames_left, 2);
    }

    #[test]
    fn a_stripped_interpreter_s_unnamed_frames_stand_for_the_eval_loop() {
        // Given a stack of a CPython whose eval loop has no symbol (Debian's 3.14: tail-called
        // opcode handlers), with a helper of the same binary root-side and libc's code
        let in_module = |function: &str, path: &str| {
            let mut frame = native(function);
            frame.module = Some(std::sync::Arc::new(crate::model::Module {
                path: std::sync::Arc::from(path),
                build_id: None,
                start: 0,
                end: 0,
                file_offset: 0,
                file: None,
            }));
            frame
        };
        let unknown = crate::model::UNKNOWN;
        let stack = [
            in_module(unknown, "/usr/bin/python3.14"),
            native("PyEval_EvalCode"),
            in_module(unknown, "/usr/bin/python3.14"),
            in_module(unknown, "/usr/lib/x86_64-linux-gnu/libc.so.6"),
            native("main"),
        ];
        // When the Python frames are spliced in
        let (out, mismatch) = splice(
            &stack,
            &[vec![py("leaf"), py("<module>")]],
            Some("/usr/bin/python3.14"),
        );
        // Then they take the leaf-most unnamed frame of the interpreter's binary
        assert_eq!(
            names(&out),
            [
                "leaf",
                "<module>",
                "PyEval_EvalCode",
                unknown,
                unknown,
                "main"
            ]
        );
        assert_eq!(mismatch.groups_left, 0);
        // And without the interpreter's path, nothing stands for the loop
        let (out, mismatch) = splice(&stack, &[vec![py("leaf")]], None);
        assert_eq!(names(&out)[..2], [unknown, "PyEval_EvalCode"]);
        assert_eq!(mismatch.groups_left, 1);
        // And a stack that names the eval loop keeps to it
        let mut named = stack.to_vec();
        named.insert(1, native("_PyEval_EvalFrameDefault"));
        let (out, _) = splice(&named, &[vec![py("leaf")]], Some("/usr/bin/python3.14"));
        assert_eq!(names(&out)[..3], [unknown, "leaf", "PyEval_EvalCode"]);
    }
}
