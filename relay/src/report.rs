//! `ember-relay report FILE`: the top functions of a saved pprof profile (`profile.pb.gz`), by
//! self and by total samples, as `go tool pprof -top` prints them, so reading a recording needs
//! no Go toolchain. Reads one local file the user named; runs as whoever runs it.
//!
//! Functions are counted as pprof counts them at function granularity: a sample's self count goes
//! to its leaf function (the innermost line of the leaf location, inlined frames included), and
//! its total count once to every distinct function in its stack (recursion counts once).

use std::{collections::HashMap, io::Read as _, path::Path};

use anyhow::{bail, Context as _};
use flate2::read::GzDecoder;
use prost::Message as _;

use crate::{
    model::{disarm_annotation, text_safe},
    sink::files::pprof::proto,
};

/// Largest uncompressed profile read (a recording's profile is a few MiB at most).
const MAX_PROFILE_BYTES: u64 = 1 << 30;

/// One function's counts, in the unit of the sample type reported.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Row {
    pub(crate) name: String,
    pub(crate) flat: i64,
    pub(crate) cum: i64,
}

/// The table of `pprof -top`: rows by self count (then total, then name), and the total.
#[derive(Debug)]
pub(crate) struct Top {
    pub(crate) sample_type: String,
    pub(crate) total: i64,
    pub(crate) rows: Vec<Row>,
}

/// Reads a pprof file, gzipped or not.
pub(crate) fn read(path: &Path) -> anyhow::Result<proto::Profile> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut message = Vec::new();
    if bytes.starts_with(&[0x1f, 0x8b]) {
        GzDecoder::new(bytes.as_slice())
            .take(MAX_PROFILE_BYTES)
            .read_to_end(&mut message)
            .with_context(|| format!("decompressing {}", path.display()))?;
    } else {
        message = bytes;
    }
    proto::Profile::decode(message.as_slice()).with_context(|| {
        format!(
            "{} is not a pprof profile (e.g. the profile.pb.gz of `ember-relay record`)",
            path.display()
        )
    })
}

/// The top table of `profile` for the sample type named `sample_index` (pprof's
/// `-sample_index`), else `samples` when the profile has it (ember's do), else the profile's
/// default type, else its last.
pub(crate) fn top(profile: &proto::Profile, sample_index: Option<&str>) -> anyhow::Result<Top> {
    let index = value_index(profile, sample_index)?;
    let locations = printed_locations(profile);
    let (rows, total) = rows(profile, &locations, index);
    let sample_type = profile
        .sample_type
        .get(index)
        .map(|t| {
            let (kind, unit) = (string(profile, t.r#type), string(profile, t.unit));
            text_safe(&format!("{kind}/{unit}"))
        })
        .unwrap_or_default();
    Ok(Top {
        sample_type,
        total,
        rows,
    })
}

/// The string `id` of the profile's string table ("" when out of range).
fn string(profile: &proto::Profile, id: i64) -> &str {
    usize::try_from(id)
        .ok()
        .and_then(|i| profile.string_table.get(i))
        .map_or("", String::as_str)
}

/// Which of each sample's values [`top`] counts (see there); an error naming the profile's
/// types when `sample_index` names none of them.
fn value_index(profile: &proto::Profile, sample_index: Option<&str>) -> anyhow::Result<usize> {
    let by_name = |name: &str| {
        profile
            .sample_type
            .iter()
            .find(|t| string(profile, t.r#type) == name)
            .map(|t| t.r#type)
    };
    let wanted = match sample_index {
        Some(name) => by_name(name).unwrap_or(-1),
        None => by_name("samples").unwrap_or(profile.default_sample_type),
    };
    let index = profile
        .sample_type
        .iter()
        .position(|t| t.r#type == wanted)
        .or_else(|| {
            sample_index
                .is_none()
                .then(|| profile.sample_type.len().checked_sub(1))?
        });
    let Some(index) = index else {
        let types: Vec<&str> = profile
            .sample_type
            .iter()
            .map(|t| string(profile, t.r#type))
            .collect();
        bail!("no sample type {sample_index:?} in the profile; it has {types:?}");
    };
    Ok(index)
}

/// Each location's names as printed, innermost first: made safe for a terminal once here (the
/// profile may come from anywhere; a name must not drive the terminal that shows it), with no
/// flame-graph annotation of its own: `_[k]` marks kernel frames in ember's other text outputs,
/// so no name here may end in one.
fn printed_locations(profile: &proto::Profile) -> HashMap<u64, Vec<String>> {
    let functions: HashMap<u64, &str> = profile
        .function
        .iter()
        .map(|f| (f.id, string(profile, f.name)))
        .collect();
    profile
        .location
        .iter()
        .map(|l| {
            let names = l
                .line
                .iter()
                .map(|line| {
                    let name = functions.get(&line.function_id).copied().unwrap_or("?");
                    let mut printed = text_safe(name);
                    disarm_annotation(&mut printed);
                    printed
                })
                .collect();
            (l.id, names)
        })
        .collect()
}

/// Every function's flat (leaf) and cumulative (anywhere in the stack, once per sample) sum of
/// value `index`, heaviest first, and the sum over all samples.
fn rows(
    profile: &proto::Profile,
    locations: &HashMap<u64, Vec<String>>,
    index: usize,
) -> (Vec<Row>, i64) {
    let mut counts: HashMap<&str, (i64, i64)> = HashMap::new();
    let mut total = 0i64;
    for sample in &profile.sample {
        let value = sample.value.get(index).copied().unwrap_or(0);
        total = total.saturating_add(value);
        // Leaf first; within a location, line[0] is the innermost (inlined) function.
        let names: Vec<&str> = sample
            .location_id
            .iter()
            .filter_map(|id| locations.get(id))
            .flatten()
            .map(String::as_str)
            .collect();
        if let Some(leaf) = names.first() {
            let entry = counts.entry(leaf).or_default();
            entry.0 = entry.0.saturating_add(value);
        }
        let mut seen: Vec<&str> = Vec::with_capacity(names.len());
        for name in names {
            if !seen.contains(&name) {
                seen.push(name);
                let entry = counts.entry(name).or_default();
                entry.1 = entry.1.saturating_add(value);
            }
        }
    }
    let mut rows: Vec<Row> = counts
        .into_iter()
        .map(|(name, (flat, cum))| Row {
            name: name.to_owned(),
            flat,
            cum,
        })
        .collect();
    rows.sort_by(|a, b| {
        b.flat
            .cmp(&a.flat)
            .then(b.cum.cmp(&a.cum))
            .then_with(|| a.name.cmp(&b.name))
    });
    (rows, total)
}

/// `ember-relay report`: prints the top `count` functions of the profile at `path`.
pub(crate) fn report(path: &Path, count: usize, sample_index: Option<&str>) -> anyhow::Result<()> {
    let profile = read(path)?;
    let top = top(&profile, sample_index)?;
    let seconds = profile.duration_nanos as f64 / 1e9;
    println!(
        "{}: {} {} over {seconds:.1}s; top {} of {} functions",
        path.display(),
        top.total,
        top.sample_type,
        count.min(top.rows.len()),
        top.rows.len()
    );
    println!(
        "{:>10} {:>6} {:>6} {:>10} {:>6}  function",
        "self", "self%", "sum%", "total", "total%"
    );
    let percent = |n: i64| 100.0 * n as f64 / top.total.max(1) as f64;
    let mut sum = 0i64;
    for row in top.rows.iter().take(count) {
        sum = sum.saturating_add(row.flat);
        println!(
            "{:>10} {:>5.1}% {:>5.1}% {:>10} {:>5.1}%  {}",
            row.flat,
            percent(row.flat),
            percent(sum),
            row.cum,
            percent(row.cum),
            row.name
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        labels::labeled::LabeledProfile,
        model::{Frame, FrameKind, SymbolizedSample, Thread},
    };

    fn frame(function: &str, address: u64) -> Frame {
        Frame::bare(function, FrameKind::Native, address)
    }

    fn thread() -> Thread {
        Thread::bare((1, 1), "app", "app", "/app")
    }

    #[test]
    fn self_goes_to_the_leaf_and_total_once_to_every_function_of_the_stack() {
        // Given main -> work (3 samples), main -> work -> work (recursion, 2) and main (1)
        let profile = profile_of(&[
            (&["work", "main"], 3),
            (&["work", "work", "main"], 2),
            (&["main"], 1),
        ]);
        // When its pprof rendering is summed up
        let top = top(&crate::sink::files::pprof::render(&profile), None).expect("top");
        // Then work has 5 self and 5 total (the recursive sample once), main 1 self and 6 total
        assert_eq!(top.sample_type, "samples/count");
        assert_eq!(top.total, 6);
        let rows: Vec<(&str, i64, i64)> = top
            .rows
            .iter()
            .map(|r| (r.name.as_str(), r.flat, r.cum))
            .collect();
        assert_eq!(rows, [("work", 5, 5), ("main", 1, 6)]);
        // And the cpu type counts nanoseconds (10 ms per sample at 100 Hz)
        let cpu = top_of(&profile, "cpu");
        assert_eq!(cpu.total, 60_000_000);
        assert!(super::top(&crate::sink::files::pprof::render(&profile), Some("bytes")).is_err());
    }

    #[test]
    fn names_are_escaped_before_they_reach_the_terminal() {
        // Given a profile whose function names carry an OSC title, an OSC 52 clipboard write,
        // a colour and a bidi override
        let profile = profile_of(&[(
            &[
                "\u{1b}]0;pwned\u{7}",
                "\u{1b}]52;c;ZWNobw==\u{7}",
                "\u{1b}[31mred",
                "main\u{202e}",
            ],
            1,
        )]);
        // When summed up for printing
        let top = top(&crate::sink::files::pprof::render(&profile), None).expect("top");
        // Then no printed name holds a control or bidi character, and each shows its escapes
        let printed: Vec<&str> = top.rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(printed.len(), 4, "{printed:?}");
        for name in &printed {
            assert!(
                !name
                    .chars()
                    .any(|c| c.is_control() || ('\u{202a}'..='\u{202e}').contains(&c)),
                "{name:?}"
            );
        }
        assert!(printed.contains(&"\\u{1b}]0:pwned\\u{7}"), "{printed:?}");
        assert!(printed.contains(&"main\\u{202e}"), "{printed:?}");
    }

    /// A profile of one thread with these stacks (leaf first) and counts.
    fn profile_of(stacks: &[(&[&str], u64)]) -> LabeledProfile {
        let mut profile = LabeledProfile::new(100);
        for &(stack, count) in stacks {
            let stack: Vec<Frame> = stack
                .iter()
                .enumerate()
                .map(|(i, f)| frame(f, 0x1000 * (i as u64 + 1)))
                .collect();
            profile.add(
                SymbolizedSample {
                    thread: thread(),
                    stack: stack.into(),
                    count,
                },
                1,
                2,
            );
        }
        profile
    }

    fn top_of(profile: &LabeledProfile, index: &str) -> Top {
        top(&crate::sink::files::pprof::render(profile), Some(index)).expect("top")
    }
}
