//! speedscope sink: `profile.speedscope.json` in speedscope's own file format
//! (<https://www.speedscope.app/file-format-schema.json>), which speedscope opens with every view
//! (time order, left heavy, sandwich) instead of guessing the format.
//!
//! Layout: one `sampled` profile per process, named `NAME (pid N)`, heaviest first (ties by
//! name, then pid); its samples are frame-index lists root first, one per unique stack of the
//! process (its threads merged), weighted by their sample counts (unit `none`: counts, as in
//! stacks.folded). Frames are shared by all profiles and named by [`Frame::text_name`], as in
//! stacks.folded and the flamegraph, with the binary or source file when known. One frame per
//! name and file, not per line: the other text outputs aggregate by function too, and the
//! per-line detail is in profile.pb.gz.
//!
//! Invariants: every sample index is below `shared.frames.len()`; `samples` and `weights` have
//! the same length (speedscope's importer refuses a file otherwise); a process whose samples
//! add up to zero has no profile. Rendering only, into the writer
//! the files sink gives (its file), serialized as written.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::{
    labels::labeled::LabeledProfile,
    model::{text_safe, Frame, SampleKind, UNKNOWN},
};

/// The `$schema` value speedscope recognises its format by.
pub const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

#[derive(Serialize)]
struct File<'a> {
    #[serde(rename = "$schema")]
    schema: &'static str,
    name: String,
    exporter: String,
    #[serde(rename = "activeProfileIndex")]
    active_profile_index: usize,
    shared: Shared<'a>,
    profiles: Vec<SampledProfile>,
}

#[derive(Serialize)]
struct Shared<'a> {
    frames: Vec<FrameEntry<'a>>,
}

#[derive(Serialize, PartialEq, Eq, Hash, Clone)]
struct FrameEntry<'a> {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<&'a str>,
}

#[derive(Serialize)]
struct SampledProfile {
    #[serde(rename = "type")]
    kind: &'static str,
    name: String,
    unit: &'static str,
    #[serde(rename = "startValue")]
    start_value: u64,
    #[serde(rename = "endValue")]
    end_value: u64,
    samples: Vec<Vec<usize>>,
    weights: Vec<u64>,
}

/// The frames shared by all profiles: each distinct (name, file) once, in first-seen order.
#[derive(Default)]
struct FrameTable<'a> {
    frames: Vec<FrameEntry<'a>>,
    index: HashMap<FrameEntry<'a>, usize, foldhash::fast::RandomState>,
}

impl<'a> FrameTable<'a> {
    fn intern(&mut self, frame: &'a Frame) -> usize {
        // The source file when symbolized with lines, else the binary the code is in.
        let file = frame
            .file
            .as_deref()
            .or_else(|| frame.module.as_deref().map(|m| &*m.path));
        let entry = FrameEntry {
            name: frame.text_name(),
            file,
        };
        if let Some(&i) = self.index.get(&entry) {
            return i;
        }
        let i = self.frames.len();
        self.frames.push(entry.clone());
        self.index.insert(entry, i);
        i
    }
}

/// One process's stacks while they are gathered: root-first frame indices -> weight, in the
/// order first seen.
#[derive(Default)]
struct ProcessStacks {
    name: String,
    order: Vec<Vec<usize>>,
    weights: HashMap<Vec<usize>, u64, foldhash::fast::RandomState>,
    total: u64,
}

/// The speedscope JSON document of `profile`.
#[cfg(test)]
pub fn render(profile: &LabeledProfile) -> Result<Vec<u8>, serde_json::Error> {
    let mut document = Vec::new();
    write(profile, &mut document)?;
    Ok(document)
}

/// Writes the speedscope JSON document of `profile` to `out` as it is serialized: only its
/// tables are held, not its text.
pub fn write(
    profile: &LabeledProfile,
    out: &mut dyn std::io::Write,
) -> Result<(), serde_json::Error> {
    let mut frames = FrameTable::default();
    let mut processes: BTreeMap<u32, ProcessStacks> = BTreeMap::new();
    for sample in profile.iter_of(SampleKind::Cpu) {
        if sample.count == 0 {
            continue;
        }
        let process = processes.entry(sample.thread.pid).or_default();
        if process.name.is_empty() {
            process.name = if sample.thread.process_name.is_empty() {
                UNKNOWN.to_owned()
            } else {
                text_safe(&sample.thread.process_name)
            };
        }
        // Root first: the model's stacks are leaf first.
        let stack: Vec<usize> = sample
            .stack
            .iter()
            .rev()
            .map(|frame| frames.intern(frame))
            .collect();
        let weight = process.weights.entry(stack.clone()).or_insert(0);
        if *weight == 0 {
            process.order.push(stack);
        }
        *weight = weight.saturating_add(sample.count);
        process.total = process.total.saturating_add(sample.count);
    }
    let mut processes: Vec<(u32, ProcessStacks)> = processes.into_iter().collect();
    processes.sort_by(|(pid_a, a), (pid_b, b)| {
        b.total
            .cmp(&a.total)
            .then_with(|| a.name.cmp(&b.name))
            .then_with(|| pid_a.cmp(pid_b))
    });
    let profiles = processes
        .into_iter()
        .map(|(pid, mut process)| {
            let weights = process
                .order
                .iter()
                .map(|stack| process.weights.remove(stack).unwrap_or(0))
                .collect();
            SampledProfile {
                kind: "sampled",
                name: format!("{} (pid {pid})", process.name),
                unit: "none",
                start_value: 0,
                end_value: process.total,
                samples: process.order,
                weights,
            }
        })
        .collect();
    let file = File {
        schema: SCHEMA,
        name: format!(
            "ember: {} samples at {} Hz",
            profile.total_samples(),
            profile.frequency_hz
        ),
        exporter: format!("ember-relay {}", env!("CARGO_PKG_VERSION")),
        active_profile_index: 0,
        shared: Shared {
            frames: frames.frames,
        },
        profiles,
    };
    serde_json::to_writer(out, &file)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::Value;

    use super::*;
    use crate::model::{FrameKind, Module, SymbolizedSample, Thread};

    fn frame(function: &str, kind: FrameKind) -> Frame {
        Frame::bare(function, kind, 0x1000)
    }

    fn native(function: &str) -> Frame {
        frame(function, FrameKind::Native)
    }

    fn thread(pid: u32, tid: u32, process_name: &str) -> Thread {
        Thread::bare((pid, tid), process_name, process_name, "")
    }

    fn add(profile: &mut LabeledProfile, thread: Thread, leaf_first: Vec<Frame>, count: u64) {
        profile.add(
            SymbolizedSample {
                thread,
                stack: leaf_first.into(),
                count,
            },
            1_000,
            2_000,
        );
    }

    /// What speedscope's importer requires of a sampled profile, and what it then shows: the
    /// per-frame totals (each frame counted once per sample it is in), by profile name.
    /// Panics on an index out of range or weights not matching samples.
    fn frame_totals(doc: &Value) -> BTreeMap<String, BTreeMap<String, u64>> {
        assert_eq!(doc["$schema"], SCHEMA);
        let frames = doc["shared"]["frames"].as_array().expect("shared.frames");
        let mut out = BTreeMap::new();
        for profile in doc["profiles"].as_array().expect("profiles") {
            assert_eq!(profile["type"], "sampled");
            let samples = profile["samples"].as_array().expect("samples");
            let weights = profile["weights"].as_array().expect("weights");
            assert_eq!(samples.len(), weights.len(), "samples and weights differ");
            let mut totals: BTreeMap<String, u64> = BTreeMap::new();
            let mut sum = 0;
            for (stack, weight) in samples.iter().zip(weights) {
                let weight = weight.as_u64().expect("integer weight");
                sum += weight;
                let mut names: Vec<String> = stack
                    .as_array()
                    .expect("stack")
                    .iter()
                    .map(|i| {
                        let i = usize::try_from(i.as_u64().expect("index")).expect("usize");
                        let frame = frames.get(i).unwrap_or_else(|| {
                            panic!("frame index {i} out of range ({} frames)", frames.len())
                        });
                        frame["name"].as_str().expect("name").to_owned()
                    })
                    .collect();
                names.sort();
                names.dedup();
                for name in names {
                    *totals.entry(name).or_insert(0) += weight;
                }
            }
            assert_eq!(profile["endValue"].as_u64(), Some(sum), "endValue");
            let name = profile["name"].as_str().expect("profile name").to_owned();
            out.insert(name, totals);
        }
        out
    }

    #[test]
    fn one_sampled_profile_per_process_heaviest_first_frames_named_as_folded() {
        // Given two threads of pid 1 sharing a stack, a kernel frame, an unnamed libc frame in
        // pid 2 (heavier), a `;` in a name and a zero count
        let libc = Arc::new(Module {
            path: "/usr/lib/libc.so.6".into(),
            build_id: None,
            start: 0x7f00_0000_0000,
            end: 0x7f00_0010_0000,
            file_offset: 0,
            file: None,
        });
        let unknown = Frame {
            module: Some(libc),
            ..native(UNKNOWN)
        };
        let mut profile = LabeledProfile::new(99);
        add(
            &mut profile,
            thread(1, 1, "app"),
            vec![native("compute"), native("main")],
            3,
        );
        add(
            &mut profile,
            thread(1, 2, "app"),
            vec![native("compute"), native("main")],
            2,
        );
        add(
            &mut profile,
            thread(1, 1, "app"),
            vec![frame("do_syscall_64", FrameKind::Kernel), native("main")],
            1,
        );
        add(
            &mut profile,
            thread(2, 2, "d;b"),
            vec![unknown, native("main")],
            7,
        );
        add(&mut profile, thread(3, 3, "idle"), vec![native("main")], 0);

        // When rendered
        let doc: Value = serde_json::from_slice(&render(&profile).unwrap()).unwrap();

        // Then pid 2 comes first, threads are merged, stacks are root first, names as folded
        let names: Vec<&str> = doc["profiles"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["d:b (pid 2)", "app (pid 1)"]);
        let app = &doc["profiles"][1];
        assert_eq!(app["unit"], "none");
        assert_eq!(app["weights"], serde_json::json!([5, 1]));
        let frames = &doc["shared"]["frames"];
        let leaf = app["samples"][0][1].as_u64().unwrap() as usize;
        assert_eq!(frames[leaf]["name"], "compute");
        let root = app["samples"][0][0].as_u64().unwrap() as usize;
        assert_eq!(frames[root]["name"], "main");
        let totals = frame_totals(&doc);
        assert_eq!(
            totals["app (pid 1)"],
            BTreeMap::from([
                ("compute".to_owned(), 5),
                ("do_syscall_64_[k]".to_owned(), 1),
                ("main".to_owned(), 6),
            ])
        );
        assert_eq!(
            totals["d:b (pid 2)"],
            BTreeMap::from([
                ("[unknown] libc.so.6".to_owned(), 7),
                ("main".to_owned(), 7)
            ])
        );
        let unknown = frames
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "[unknown] libc.so.6")
            .unwrap();
        assert_eq!(unknown["file"], "/usr/lib/libc.so.6");
    }

    #[test]
    fn the_checker_refuses_broken_files() {
        // The checks above must be able to fail: an index past the frames, weights missing.
        let mut profile = LabeledProfile::new(99);
        add(&mut profile, thread(1, 1, "app"), vec![native("main")], 2);
        let good: Value = serde_json::from_slice(&render(&profile).unwrap()).unwrap();
        frame_totals(&good);
        let mut out_of_range = good.clone();
        out_of_range["profiles"][0]["samples"][0][0] = serde_json::json!(9);
        assert!(std::panic::catch_unwind(|| frame_totals(&out_of_range)).is_err());
        let mut short = good;
        short["profiles"][0]["weights"] = serde_json::json!([]);
        assert!(std::panic::catch_unwind(|| frame_totals(&short)).is_err());
    }

    #[test]
    fn an_empty_profile_is_a_valid_file_without_profiles() {
        let doc: Value =
            serde_json::from_slice(&render(&LabeledProfile::new(99)).unwrap()).unwrap();
        assert_eq!(doc["$schema"], SCHEMA);
        assert_eq!(doc["profiles"], serde_json::json!([]));
        assert_eq!(doc["shared"]["frames"], serde_json::json!([]));
    }
}
