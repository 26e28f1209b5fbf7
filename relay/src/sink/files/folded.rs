//! Folded-stacks sink: Brendan Gregg's collapsed format, one line per unique stack,
//! `process;root;...;leaf COUNT`, as read by flamegraph.pl, inferno and speedscope. Frames are
//! named by [`crate::model::Frame::text_name`] (the model's), so the flamegraph and
//! [`LabeledProfile::top_self`] show the same names.
//!
//! Invariants: lines are sorted and unique (stacks with the same text are merged, so two pids of
//! one program become one line); no name contains `;` or a line break, so every line splits back
//! into the frames it was made of; the count follows the last space (names may contain spaces).
//! Rendering only: the files sink writes the result.

use std::{
    cmp::Ordering,
    collections::HashMap,
    io::{self, Write},
};

use indexmap::IndexSet;

use super::FoldedRoot;
use crate::{
    labels::labeled::LabeledProfile,
    model::{text_safe, Frame, SampleKind, StackTable, UNKNOWN},
};

/// The folded lines of a profile, without line ends: sorted, one per unique stack text, stacks
/// whose samples add up to zero left out.
#[cfg(test)]
pub fn lines(profile: &LabeledProfile) -> Vec<String> {
    lines_with(profile, FoldedRoot::Process)
}

/// [`lines`] with the root frame naming the process or its `service.name` (`--folded-root`).
#[cfg(test)]
pub fn lines_with(profile: &LabeledProfile, root: FoldedRoot) -> Vec<String> {
    lines_of(profile, root, SampleKind::Cpu)
}

/// [`lines_with`] of one kind of rows (off-CPU: nanoseconds blocked per line).
#[cfg(test)]
pub fn lines_of(profile: &LabeledProfile, root: FoldedRoot, kind: SampleKind) -> Vec<String> {
    render_of(profile, root, kind)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The id of `name` in `names`, added when new.
fn name_id(names: &mut IndexSet<String, foldhash::fast::RandomState>, name: String) -> u32 {
    u32::try_from(names.insert_full(name).0).unwrap_or(u32::MAX)
}

/// A profile's folded lines, held compactly until written: each distinct name (process or
/// frame, made text-safe) once, each line as the ids of its names root first (one to three
/// bytes each, in the model's [`StackTable`]), its samples by line id, and the line ids in the
/// order of their text. A window of hundreds of thousands of stacks then costs tens of bytes
/// per line here, not its whole text (several hundred bytes) twice.
struct Folded {
    names: IndexSet<String, foldhash::fast::RandomState>,
    lines: StackTable,
    counts: Vec<u64>,
    /// Line ids with samples, sorted by their text.
    order: Vec<u32>,
}

impl Folded {
    /// The unique stack texts (root first) of `profile`'s rows of `kind`, with their samples;
    /// each frame named once, however many rows hold it.
    fn of(profile: &LabeledProfile, root: FoldedRoot, kind: SampleKind) -> Self {
        Self::of_named(profile, root, kind, |name| name)
    }

    /// [`Folded::of`] with each root name passed through `root_text` first.
    fn of_named(
        profile: &LabeledProfile,
        root: FoldedRoot,
        kind: SampleKind,
        root_text: impl Fn(String) -> String,
    ) -> Self {
        let mut names: IndexSet<String, foldhash::fast::RandomState> = IndexSet::default();
        let mut frame_names: HashMap<*const Frame, u32, foldhash::fast::RandomState> =
            HashMap::default();
        let mut lines = StackTable::default();
        let mut counts: Vec<u64> = Vec::new();
        let mut ids: Vec<u32> = Vec::new();
        for sample in profile.iter_of(kind) {
            let name = match root {
                FoldedRoot::Process => &*sample.thread.process_name,
                FoldedRoot::Service => sample.thread.service_name(),
            };
            ids.clear();
            ids.push(name_id(
                &mut names,
                root_text(if name.is_empty() {
                    UNKNOWN.to_owned()
                } else {
                    text_safe(name)
                }),
            ));
            // Root first: the model's stacks are leaf first.
            for frame in sample.stack.iter().rev() {
                let id = match frame_names.get(&std::ptr::from_ref(frame)) {
                    Some(&id) => id,
                    None => {
                        let id = name_id(&mut names, frame.text_name());
                        frame_names.insert(std::ptr::from_ref(frame), id);
                        id
                    }
                };
                ids.push(id);
            }
            let line = lines.intern(ids.iter().copied());
            if let Some(slot) = counts.get_mut(line as usize) {
                *slot = slot.saturating_add(sample.count);
            } else if line as usize == counts.len() {
                counts.push(sample.count);
            }
        }
        let mut folded = Self {
            names,
            lines,
            counts,
            order: Vec::new(),
        };
        let mut order: Vec<u32> = (0..folded.counts.len())
            .filter(|&line| folded.counts[line] > 0)
            .map(|line| u32::try_from(line).unwrap_or(u32::MAX))
            .collect();
        order.sort_unstable_by(|&a, &b| folded.compare(a, b));
        folded.order = order;
        folded
    }

    fn name(&self, id: u32) -> &str {
        self.names.get_index(id as usize).map_or("", String::as_str)
    }

    /// Orders two lines as their texts (`a;b;c`) compare, byte by byte, without making them:
    /// names equal in both are skipped, the rest compared as the bytes they would write.
    fn compare(&self, a: u32, b: u32) -> Ordering {
        let (mut x, mut y) = (
            self.lines.get(a).unwrap_or_default(),
            self.lines.get(b).unwrap_or_default(),
        );
        loop {
            match (x.next(), y.next()) {
                (Some(p), Some(q)) if p == q => {}
                (p, q) => {
                    let text = |first: Option<u32>, rest| {
                        first
                            .into_iter()
                            .chain(rest)
                            .enumerate()
                            .flat_map(|(i, id)| {
                                let separator = (i > 0).then_some(b';');
                                separator.into_iter().chain(self.name(id).bytes())
                            })
                    };
                    return text(p, x).cmp(text(q, y));
                }
            }
        }
    }

    /// Leaves out what a flame graph of these lines would not draw: inferno merges adjacent
    /// lines that share their first frames into one node, as wide as their samples, and drops
    /// every node narrower than `min_width` percent of all samples (its `Options::min_width`,
    /// compared as it compares). The lines under such a node (a run of adjacent lines; its
    /// children are narrower still) become one line: the run's first line, counted the run's
    /// samples. That line sorts where the run began and shares with its neighbours exactly the
    /// frames the run shared, so every drawn node keeps its position, width and order (a
    /// parent's width is its total), and inferno allocates a frame per drawn node, not per
    /// line. Lines inferno ignores (after its trim, those starting `# `, or with no frame)
    /// are kept as they are and counted nowhere, as inferno counts them.
    ///
    /// Nodes are told apart by name id, as inferno tells them apart by text, except where
    /// inferno reads part of a leaf name ending in ` <digits>` as a second count (its
    /// differential input): such lines are taken as written, so only the stacks of the
    /// process that named its functions so can draw differently.
    fn prune_for_flamegraph(&mut self, min_width: f64) {
        let ignored: Vec<bool> = self.order.iter().map(|&l| self.ignored(l)).collect();
        let total: u64 = self
            .order
            .iter()
            .zip(&ignored)
            .filter(|(_, &ignored)| !ignored)
            .map(|(&line, _)| self.counts.get(line as usize).copied().unwrap_or(0))
            .fold(0, u64::saturating_add);
        if total == 0 {
            return;
        }
        // inferno's own test: a frame is dropped when `width < min_width / (100 / total)`.
        let min_time = min_width / (100.0 / total as f64);
        let narrow = |samples: u64| (samples as f64) < min_time;
        // Pass 1: each node's samples, nodes numbered in the order lines open them.
        let mut totals: Vec<u64> = Vec::new();
        let mut path: Vec<(u32, usize)> = Vec::new();
        let mut next = 0;
        for (&line, &ignored) in self.order.iter().zip(&ignored) {
            if ignored {
                continue;
            }
            let count = self.counts.get(line as usize).copied().unwrap_or(0);
            self.open_nodes(line, &mut path, &mut next);
            totals.resize(next, 0);
            for &(_, node) in &path {
                if let Some(t) = totals.get_mut(node) {
                    *t = t.saturating_add(count);
                }
            }
        }
        // Pass 2: the same walk; a line under a narrow node is kept only when it opened the
        // shallowest narrow node on its path, and then ends there and counts that node's
        // samples.
        path.clear();
        next = 0;
        let mut kept = Vec::new();
        let order = std::mem::take(&mut self.order);
        for (&line, &ignored) in order.iter().zip(&ignored) {
            if ignored {
                kept.push(line);
                continue;
            }
            let shared = self.open_nodes(line, &mut path, &mut next);
            let first_narrow = path
                .iter()
                .position(|&(_, node)| narrow(totals.get(node).copied().unwrap_or(0)));
            match first_narrow {
                None => kept.push(line),
                Some(depth) if depth >= shared => {
                    let samples = path.get(depth).and_then(|&(_, node)| totals.get(node));
                    let line = self.cut_after(line, depth);
                    if let (Some(count), Some(&samples)) =
                        (self.counts.get_mut(line as usize), samples)
                    {
                        *count = samples;
                    }
                    kept.push(line);
                }
                Some(_) => {}
            }
        }
        self.order = kept;
    }

    /// `line` ending at its node at `depth` (root 0), which nothing is drawn from (a narrow
    /// node's children are narrower still): inferno then makes a frame for that node and not for
    /// each below it, and draws the same. Kept whole when the cut would end it in a name
    /// inferno reads otherwise at the end of a line (blank at its end, or a last word of
    /// digits, which it takes for a count) or leave it its root alone (which it may ignore).
    fn cut_after(&mut self, line: u32, depth: usize) -> u32 {
        let ids: Vec<u32> = self.lines.get(line).unwrap_or_default().collect();
        let Some((&last, _)) = ids.get(..=depth).and_then(<[u32]>::split_last) else {
            return line;
        };
        let name = self.name(last);
        let number = name.rsplit(' ').next().is_some_and(|word| {
            !word.is_empty() && word.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        });
        if depth == 0 || ids.len() == depth + 1 || name.ends_with(char::is_whitespace) || number {
            return line;
        }
        let cut = self.lines.intern(ids[..=depth].iter().copied());
        match (cut as usize).cmp(&self.counts.len()) {
            Ordering::Less => cut,
            Ordering::Equal => {
                self.counts.push(0);
                cut
            }
            // (the table is full: no id)
            Ordering::Greater => line,
        }
    }

    /// Moves `path` (the previous line's nodes: name id and node number) to `line`'s nodes,
    /// numbering the ones it opens from `next` on; returns how many it shares with the
    /// previous line.
    fn open_nodes(&self, line: u32, path: &mut Vec<(u32, usize)>, next: &mut usize) -> usize {
        let (mut depth, mut shared, mut diverged) = (0, 0, false);
        for id in self.lines.get(line).unwrap_or_default() {
            if !diverged && path.get(depth).is_some_and(|&(name, _)| name == id) {
                shared += 1;
            } else {
                if !diverged {
                    path.truncate(depth);
                    diverged = true;
                }
                path.push((id, *next));
                *next += 1;
            }
            depth += 1;
        }
        path.truncate(depth);
        shared
    }

    /// Whether inferno ignores `line`: after trimming it, it starts with `# ` (a comment) or
    /// holds no frame but its count.
    fn ignored(&self, line: u32) -> bool {
        let mut ids = self.lines.get(line).unwrap_or_default();
        let Some(root) = ids.next().map(|id| self.name(id).trim_start()) else {
            return true;
        };
        let alone = ids.next().is_none();
        root.starts_with("# ") || (alone && (root.is_empty() || root == "#"))
    }

    /// Writes the lines, each `text count\n`, in order.
    fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        for &line in &self.order {
            for (i, id) in self.lines.get(line).unwrap_or_default().enumerate() {
                if i > 0 {
                    out.write_all(b";")?;
                }
                out.write_all(self.name(id).as_bytes())?;
            }
            let count = self.counts.get(line as usize).copied().unwrap_or(0);
            writeln!(out, " {count}")?;
        }
        Ok(())
    }
}

/// The whole folded file, process names at the root.
#[cfg(test)]
pub fn render(profile: &LabeledProfile) -> String {
    render_with(profile, FoldedRoot::Process)
}

/// The whole folded file: [`lines_with`], each ended by `\n`, in one string (the files sink
/// streams them with [`write_of`]).
#[cfg(test)]
pub fn render_with(profile: &LabeledProfile, root: FoldedRoot) -> String {
    render_of(profile, root, SampleKind::Cpu)
}

/// [`render_with`] of one kind of rows: `stacks.offcpu.folded` is [`SampleKind::OffCpu`].
pub fn render_of(profile: &LabeledProfile, root: FoldedRoot, kind: SampleKind) -> String {
    let mut out = Vec::new();
    // (writing to memory cannot fail; names are text, so the bytes are UTF-8)
    let _ = Folded::of(profile, root, kind).write(&mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// The folded lines a flame graph of `profile`'s rows of `kind` draws, in one string: root
/// names trimmed at their start (as inferno trims each line, so the order here is the order
/// it reads), and the lines under nodes narrower than `min_width` percent folded into one
/// ([`Folded::prune_for_flamegraph`]): a window of hundreds of thousands of distinct stacks
/// gives inferno the few thousand lines it draws, the same picture.
pub fn render_for_flamegraph(
    profile: &LabeledProfile,
    root: FoldedRoot,
    kind: SampleKind,
    min_width: f64,
) -> String {
    let mut folded = Folded::of_named(profile, root, kind, |name| {
        match name.len() - name.trim_start().len() {
            0 => name,
            blank => name[blank..].to_owned(),
        }
    });
    folded.prune_for_flamegraph(min_width);
    let mut out = Vec::new();
    // (writing to memory cannot fail; names are text, so the bytes are UTF-8)
    let _ = folded.write(&mut out);
    String::from_utf8(out).unwrap_or_default()
}

/// Writes the folded file of `profile`'s rows of `kind` to `out` as it is made: only the
/// compact lines are held, never the file's text.
pub fn write_of(
    profile: &LabeledProfile,
    root: FoldedRoot,
    kind: SampleKind,
    out: &mut dyn Write,
) -> io::Result<()> {
    Folded::of(profile, root, kind).write(out)
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
            file: None,
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
    fn lines_are_in_the_byte_order_of_their_text_even_when_a_name_is_a_prefix_of_another() {
        // Given names that are prefixes of others, and names sorting around `;` (`:` is just
        // below it, `<` just above), in stacks of several processes
        let names = ["a", "a:x", "a<", "ab", "a b", "b", "main", "m"];
        let mut profile = LabeledProfile::new(99);
        let mut expected: std::collections::BTreeMap<String, u64> = Default::default();
        for (i, process) in ["p", "p:q", "p<"].iter().enumerate() {
            for (j, leaf) in names.iter().enumerate() {
                for caller in &names[..3] {
                    let count = (i * 100 + j * 10 + 1) as u64;
                    add(
                        &mut profile,
                        thread(i as u32 + 1, process),
                        vec![native(leaf), native(caller)],
                        count,
                    );
                    *expected
                        .entry(format!("{process};{caller};{leaf}"))
                        .or_default() += count;
                }
            }
        }
        // When rendered, then the lines are the text-sorted unique stacks, as sorting the
        // whole texts would give them
        let want: Vec<String> = expected
            .into_iter()
            .map(|(text, count)| format!("{text} {count}"))
            .collect();
        assert_eq!(lines(&profile), want);
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
