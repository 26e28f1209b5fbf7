//! Folded-stacks sink: Brendan Gregg's collapsed format, one line per unique stack,
//! `process;root;...;leaf COUNT`, as read by flamegraph.pl, inferno and speedscope. Frames are
//! named by [`crate::model::Frame::text_name`] (the model's), so the flamegraph and
//! [`LabeledProfile::top_self`] show the same names.
//!
//! Invariants: lines are sorted and unique (stacks with the same text are merged, so two pids of
//! one program become one line); no name contains `;` or a line break, so every line splits back
//! into the frames it was made of; the count follows the last space (names may contain spaces).
//! Rendering only: the files sink writes the result.

use std::collections::BTreeMap;

use super::FoldedRoot;
use crate::{
    labels::labeled::LabeledProfile,
    model::{text_safe, SampleKind, UNKNOWN},
};

/// The folded lines of a profile, without line ends: sorted, one per unique stack text, stacks
/// whose samples add up to zero left out.
#[cfg(test)]
pub fn lines(profile: &LabeledProfile) -> Vec<String> {
    lines_with(profile, FoldedRoot::Process)
}

/// [`lines`] with the root frame naming the process or its `service.name` (`--folded-root`).
pub fn lines_with(profile: &LabeledProfile, root: FoldedRoot) -> Vec<String> {
    lines_of(profile, root, SampleKind::Cpu)
}

/// [`lines_with`] of one kind of rows (off-CPU: nanoseconds blocked per line).
pub fn lines_of(profile: &LabeledProfile, root: FoldedRoot, kind: SampleKind) -> Vec<String> {
    stack_counts(profile, root, kind)
        .into_iter()
        .map(|(text, count)| format!("{text} {count}"))
        .collect()
}

/// Each unique stack text (root first, without its count) with its samples, sorted; stacks
/// whose samples add up to zero left out. Each text is built once, in one string.
fn stack_counts(
    profile: &LabeledProfile,
    root: FoldedRoot,
    kind: SampleKind,
) -> BTreeMap<String, u64> {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for sample in profile.samples_of(kind) {
        let name = match root {
            FoldedRoot::Process => &*sample.thread.process_name,
            FoldedRoot::Service => sample.thread.service_name(),
        };
        // Root first: the model's stacks are leaf first.
        let mut text = if name.is_empty() {
            UNKNOWN.to_owned()
        } else {
            text_safe(name)
        };
        for frame in sample.stack.iter().rev() {
            text.push(';');
            text.push_str(&frame.text_name());
        }
        *counts.entry(text).or_insert(0) += sample.count;
    }
    counts.retain(|_, count| *count > 0);
    counts
}

/// The whole folded file, process names at the root.
#[cfg(test)]
pub fn render(profile: &LabeledProfile) -> String {
    render_with(profile, FoldedRoot::Process)
}

/// The whole folded file: [`lines_with`], each ended by `\n`, written into one string as the
/// lines are taken from the sorted map (a window of many stacks is held twice at most, not
/// three times).
pub fn render_with(profile: &LabeledProfile, root: FoldedRoot) -> String {
    render_of(profile, root, SampleKind::Cpu)
}

/// [`render_with`] of one kind of rows: `stacks.offcpu.folded` is [`SampleKind::OffCpu`].
pub fn render_of(profile: &LabeledProfile, root: FoldedRoot, kind: SampleKind) -> String {
    let counts = stack_counts(profile, root, kind);
    let length: usize = counts.keys().map(|text| text.len() + 22).sum();
    let mut out = String::with_capacity(length);
    for (text, count) in counts {
        out.push_str(&text);
        out.push(' ');
        out.push_str(&count.to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::{Frame, FrameKind, Module, SymbolizedSample, Thread};

    fn frame(function: &str, kind: FrameKind) -> Frame {
        Frame::bare(function, kind, 0x1000)
    }

    fn native(function: &str) -> Frame {
        frame(function, FrameKind::Native)
    }

    fn thread(pid: u32, process_name: &str) -> Thread {
        Thread::bare((pid, pid), process_name, process_name, "")
    }

    fn add(profile: &mut LabeledProfile, thread: Thread, leaf_first: Vec<Frame>, count: u64) {
        let sample = SymbolizedSample {
            thread,
            stack: leaf_first.into(),
            count,
        };
        profile.add(sample, 1_000, 2_000);
    }

    /// An unnamed frame in libc: shown as `[unknown] libc.so.6`.
    fn unknown_in_libc() -> Frame {
        let libc = Module {
            path: "/usr/lib/libc.so.6".into(),
            build_id: None,
            start: 0x7f00_0000_0000,
            end: 0x7f00_0010_0000,
            file_offset: 0x1000,
        };
        Frame {
            address: 0x7f00_0000_0234,
            module: Some(Arc::new(libc)),
            ..native(UNKNOWN)
        }
    }

    fn small_profile() -> LabeledProfile {
        let mut profile = LabeledProfile::new(99);
        add(
            &mut profile,
            thread(1, "app"),
            vec![native("compute"), native("main")],
            3,
        );
        // Another pid of the same program, same stack: merged with the line above.
        add(
            &mut profile,
            thread(2, "app"),
            vec![native("compute"), native("main")],
            2,
        );
        let syscall = vec![
            frame("do_syscall_64", FrameKind::Kernel),
            native("write"),
            native("main"),
        ];
        add(&mut profile, thread(1, "app"), syscall, 1);
        add(
            &mut profile,
            thread(3, "db"),
            vec![unknown_in_libc(), native("main")],
            4,
        );
        profile
    }

    #[test]
    fn folds_root_first_merges_same_process_name_and_marks_kernel_frames() {
        // Given two pids of "app" sharing a stack, a stack ending in the kernel, an unknown frame
        let profile = small_profile();

        // When rendered
        let text = render(&profile);

        // Then one sorted line per stack text, root first, kernel frames suffixed
        assert_eq!(
            text,
            "app;main;compute 5\n\
             app;main;write;do_syscall_64_[k] 1\n\
             db;main;[unknown] libc.so.6 4\n"
        );
    }

    #[test]
    fn separators_and_line_breaks_in_names_are_replaced() {
        // Given names containing `;`, a newline and a space
        let mut profile = LabeledProfile::new(99);
        let stack = vec![
            native("parse<[u8; 8]>"),
            native("line\nbreak"),
            native("a b"),
        ];
        add(&mut profile, thread(1, "my;app"), stack, 7);

        // When folded
        let lines = lines(&profile);

        // Then the frames still split on `;` and the count follows the last space
        assert_eq!(lines, ["my:app;a b;line\\u{a}break;parse<[u8: 8]> 7"]);
        let (stack, count) = lines[0].rsplit_once(' ').unwrap();
        assert_eq!(count, "7");
        assert_eq!(stack.split(';').count(), 4);
    }

    #[test]
    fn empty_process_name_and_zero_counts() {
        // Given a sample without a process name and a stack counted zero times
        let mut profile = LabeledProfile::new(99);
        add(&mut profile, thread(1, ""), vec![native("main")], 2);
        add(&mut profile, thread(2, "idle"), vec![native("main")], 0);

        // When folded
        let lines = lines(&profile);

        // Then the process is `[unknown]` and the zero line is left out
        assert_eq!(lines, ["[unknown];main 2"]);
    }

    #[test]
    fn empty_profile_renders_nothing() {
        assert_eq!(render(&LabeledProfile::new(99)), "");
    }

    #[test]
    fn top_self_orders_by_self_samples_then_name() {
        // Given leaves: compute 5 (two pids), `[unknown] libc.so.6` 4, kernel 1, and a
        // leaf `zz` tied with the kernel frame
        let mut profile = small_profile();
        add(
            &mut profile,
            thread(1, "app"),
            vec![native("zz"), native("main")],
            1,
        );

        // When asked for the top 3
        let top = profile.top_self(3);

        // Then most samples first, the tie broken by name, named as in folded output
        assert_eq!(
            top,
            [
                ("compute".to_owned(), 5),
                ("[unknown] libc.so.6".to_owned(), 4),
                ("do_syscall_64_[k]".to_owned(), 1),
            ]
        );
        assert_eq!(profile.top_self(10).len(), 4);
        assert_eq!(profile.top_self(10)[3], ("zz".to_owned(), 1));
    }
}
