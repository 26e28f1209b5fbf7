//! profile.pb.gz as read by a pprof reader that is not ours: `go tool pprof -raw` from Debian's
//! golang-go (scripts/setup.sh installs it). The crate's own decoder (the `pprof` module) shares
//! our reading of profile.proto, so a field we both misread would pass there; Go's pprof is the
//! reference implementation of the format.
//!
//! `-raw` prints the profile after parsing it, without aggregating or trimming anything: the
//! header (period type, period, sample types), every sample with its values, location ids and
//! labels, then the locations with their function names. It needs no network: `GOTOOLCHAIN=local`,
//! `GOPROXY=off` and `GOFLAGS=` keep `go` from fetching toolchains or modules, and a temp
//! `HOME`/`GOCACHE` keeps it from reading or writing the user's.

use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    process::Command,
};

use crate::{skip, FoldedStack, KERNEL_SUFFIX};

/// What `go tool pprof -raw` reports of a profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawProfile {
    /// `PeriodType:` as (type, unit), e.g. ("cpu", "nanoseconds").
    pub period_type: (String, String),
    /// `Period:`.
    pub period: i64,
    /// The sample types in value order, as (type, unit).
    pub sample_types: Vec<(String, String)>,
    pub samples: Vec<RawSample>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawSample {
    /// One value per sample type.
    pub values: Vec<i64>,
    /// Function names, leaf first, inlined frames expanded (innermost first).
    pub stack: Vec<String>,
    /// (key, value) of every label, string and numeric.
    pub labels: Vec<(String, String)>,
}

impl RawSample {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Runs `go tool pprof -raw` on `path` and parses its output. `None` (after [`skip`], a failure
/// under `CI` or `EMBER_REQUIRE_ALL`) when `go` is not installed; panics when pprof rejects
/// the file or prints something this parser does not understand.
pub fn read_raw(path: &Path) -> Option<RawProfile> {
    pprof_output(&["-raw"], path).map(|stdout| parse_raw(&stdout))
}

/// Runs `go tool pprof -top` on `path` counting samples, every function listed and none
/// symbolized again; `None` when `go` is not installed (as [`read_raw`]).
pub fn top(path: &Path) -> Option<String> {
    pprof_output(
        &[
            "-top",
            "-sample_index=samples",
            "-nodecount=100000",
            "-nodefraction=0",
            "-symbolize=none",
        ],
        path,
    )
}

/// Runs `go tool pprof -top -sample_index=INDEX` on `path`, every function listed (e.g.
/// `off_cpu`: pprof refuses an index the profile has no sample type of); `None` when `go` is
/// not installed (as [`read_raw`]).
pub fn top_of(path: &Path, sample_index: &str) -> Option<String> {
    pprof_output(
        &[
            "-top",
            &format!("-sample_index={sample_index}"),
            "-nodecount=100000",
            "-nodefraction=0",
            "-symbolize=none",
        ],
        path,
    )
}

/// Runs `go tool pprof -top` on `path` symbolizing again what the profile left unnamed, as a
/// user's `-symbolize=demangle=full` does: pprof opens each such mapping's file by its name and
/// warns on stderr (`Local symbolization failed for NAME`) when it cannot. Returns (stdout,
/// stderr); `None` when `go` is not installed (as [`read_raw`]).
pub fn top_symbolized(path: &Path) -> Option<(String, String)> {
    pprof_run(&["-top", "-symbolize=demangle=full"], path)
}

/// The stdout of `go tool pprof ARGS PATH`, kept from fetching anything.
fn pprof_output(args: &[&str], path: &Path) -> Option<String> {
    pprof_run(args, path).map(|(stdout, _)| stdout)
}

/// The stdout and stderr of `go tool pprof ARGS PATH`, kept from fetching anything.
fn pprof_run(args: &[&str], path: &Path) -> Option<(String, String)> {
    let home = tempfile::tempdir().expect("temp HOME for go");
    let output = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(path)
        .env("HOME", home.path())
        .env("GOCACHE", home.path().join("cache"))
        .env("GOPATH", home.path().join("gopath"))
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .env("GOTELEMETRY", "off")
        .env("PPROF_TMPDIR", home.path())
        .output();
    let output = match output {
        Ok(output) => output,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            skip(
                "`go` is not installed, so profile.pb.gz cannot be checked with Go's pprof; \
                 install golang-go (scripts/setup.sh does)",
            );
            return None;
        }
        Err(err) => panic!("running `go tool pprof {args:?}`: {err}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        output.status.success(),
        "`go tool pprof {args:?} {}` failed ({}): {stderr}\n{stdout}",
        path.display(),
        output.status,
    );
    Some((stdout, stderr))
}

/// The rows of `go tool pprof -top` (or of `ember-relay report`, which prints the same five
/// columns): function name -> (self, total). Rows start after the header line naming `cum` (or
/// `total`); each is five numbers then the name.
pub fn parse_top(text: &str) -> BTreeMap<String, (i64, i64)> {
    text.lines()
        .skip_while(|l| {
            !(l.contains(" cum ") || l.trim_end().ends_with("cum%") || l.contains("total%"))
        })
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let flat: i64 = fields.next()?.parse().ok()?;
            let _flat_percent = fields.next()?;
            let _sum_percent = fields.next()?;
            let cum: i64 = fields.next()?.parse().ok()?;
            let _cum_percent = fields.next()?;
            let name = fields.collect::<Vec<_>>().join(" ");
            Some((name, (flat, cum)))
        })
        .collect()
}

/// Parses the text of `go tool pprof -raw` (the `String()` of pprof's `profile.Profile`).
pub fn parse_raw(text: &str) -> RawProfile {
    let mut period_type = None;
    let mut period = None;
    let mut sample_types = Vec::new();
    // Samples with location ids for stacks: (values, ids, labels), the ids resolved once the
    // Locations section is read.
    type Unresolved = (Vec<i64>, Vec<u64>, Vec<(String, String)>);
    let mut samples: Vec<Unresolved> = Vec::new();
    let mut locations: HashMap<u64, Vec<String>> = HashMap::new();
    let mut last_location = None;
    #[derive(PartialEq)]
    enum Section {
        Header,
        Samples,
        Locations,
        Mappings,
    }
    let mut section = Section::Header;
    for (i, line) in text.lines().enumerate() {
        match line {
            "Samples:" => {
                section = Section::Samples;
                continue;
            }
            "Locations" => {
                section = Section::Locations;
                continue;
            }
            "Mappings" => {
                section = Section::Mappings;
                continue;
            }
            _ => {}
        }
        match section {
            Section::Header => {
                if let Some(rest) = line.strip_prefix("PeriodType: ") {
                    let (r#type, unit) = rest.split_once(' ').unwrap_or_else(|| bad(i, line));
                    period_type = Some((r#type.to_owned(), unit.to_owned()));
                } else if let Some(rest) = line.strip_prefix("Period: ") {
                    period = Some(rest.trim().parse().unwrap_or_else(|_| bad(i, line)));
                }
            }
            Section::Samples if sample_types.is_empty() => {
                // `samples/count cpu/nanoseconds[dflt]`
                sample_types = line
                    .split_whitespace()
                    .map(|vt| {
                        let vt = vt.trim_end_matches("[dflt]");
                        let (r#type, unit) = vt.split_once('/').unwrap_or_else(|| bad(i, line));
                        (r#type.to_owned(), unit.to_owned())
                    })
                    .collect();
            }
            Section::Samples => {
                // `     1   10309278: 2 3 ` (values: location ids), then indented label lines
                // `process_name:[rustc] thread_name:[rustc]` and `pid:[23078] tid:[23080]`.
                let trimmed = line.trim();
                if trimmed.is_empty() {
                    continue;
                }
                let is_values = trimmed.split_once(':').is_some_and(|(values, _)| {
                    values.split_whitespace().all(|v| v.parse::<i64>().is_ok())
                });
                if is_values {
                    let (values, ids) = trimmed.split_once(':').unwrap_or_else(|| bad(i, line));
                    let values = values
                        .split_whitespace()
                        .map(|v| v.parse().unwrap_or_else(|_| bad(i, line)))
                        .collect();
                    let ids = ids
                        .split_whitespace()
                        .map(|id| id.parse().unwrap_or_else(|_| bad(i, line)))
                        .collect();
                    samples.push((values, ids, Vec::new()));
                } else {
                    let (_, _, labels) = samples.last_mut().unwrap_or_else(|| bad(i, line));
                    // Each label prints as `key:[value]` (one value per key in ember's files).
                    for label in trimmed.trim_end_matches(']').split("] ") {
                        let (key, value) = label.split_once(":[").unwrap_or_else(|| bad(i, line));
                        labels.push((key.to_owned(), value.to_owned()));
                    }
                }
            }
            Section::Locations => {
                // `     7: 0x7f269b473bb4 M=2 name file:line s=start`, inlined lines after it
                // indented, without the id and address. Names may hold spaces
                // (`[unknown] 0x5719`); the file (empty in most of ember's frames) is taken as
                // the last word.
                let rest = if let Some((id, rest)) = line
                    .split_once(": 0x")
                    .filter(|(id, _)| id.trim().parse::<u64>().is_ok())
                {
                    let id: u64 = id.trim().parse().unwrap_or_else(|_| bad(i, line));
                    last_location = Some(id);
                    locations.insert(id, Vec::new());
                    let (_address, rest) = rest.split_once(' ').unwrap_or((rest, ""));
                    rest
                } else {
                    line.trim_start()
                };
                let rest = rest
                    .split_once(' ')
                    .filter(|(word, _)| word.starts_with("M="))
                    .map_or(rest, |(_, rest)| rest);
                let rest = rest.strip_prefix("[F] ").unwrap_or(rest);
                if rest.is_empty() {
                    continue; // A location without lines.
                }
                let (rest, _start_line) = rest.rsplit_once(" s=").unwrap_or_else(|| bad(i, line));
                let (name_and_file, _line) = rest.rsplit_once(':').unwrap_or_else(|| bad(i, line));
                let name = match name_and_file.strip_suffix(' ') {
                    Some(name) => name, // empty file name
                    None => {
                        name_and_file
                            .rsplit_once(' ')
                            .unwrap_or_else(|| bad(i, line))
                            .0
                    }
                };
                let id = last_location.unwrap_or_else(|| bad(i, line));
                locations
                    .get_mut(&id)
                    .unwrap_or_else(|| bad(i, line))
                    .push(name.to_owned());
            }
            Section::Mappings => {}
        }
    }
    let samples = samples
        .into_iter()
        .map(|(values, ids, labels)| RawSample {
            values,
            stack: ids
                .iter()
                .flat_map(|id| {
                    locations
                        .get(id)
                        .cloned()
                        .unwrap_or_else(|| vec![format!("<location {id} not listed>")])
                })
                .collect(),
            labels,
        })
        .collect();
    RawProfile {
        period_type: period_type.expect("go tool pprof -raw printed no PeriodType"),
        period: period.expect("go tool pprof -raw printed no Period"),
        sample_types,
        samples,
    }
}

fn bad<T>(i: usize, line: &str) -> T {
    panic!("go tool pprof -raw, line {}: cannot parse {line:?}", i + 1)
}

/// Samples of `raw` summed by process name and stack, written as stacks.folded writes them:
/// `(process, frames root first) -> count` (the count being the `samples/count` value). Kernel
/// frames carry no `_[k]` in pprof; [`folded_by_stack`] strips it on the other side.
pub fn raw_by_stack(raw: &RawProfile) -> BTreeMap<(String, Vec<String>), u64> {
    let count_index = raw
        .sample_types
        .iter()
        .position(|(t, _)| t == "samples")
        .expect("go tool pprof reports no `samples` sample type");
    let mut stacks = BTreeMap::new();
    for sample in &raw.samples {
        let process = sample
            .label("process_name")
            .filter(|name| !name.is_empty())
            .unwrap_or("[unknown]")
            .to_owned();
        let frames = sample.stack.iter().rev().cloned().collect();
        let count = u64::try_from(sample.values[count_index]).expect("negative sample count");
        *stacks.entry((process, frames)).or_default() += count;
    }
    stacks.retain(|_, count| *count > 0);
    stacks
}

/// stacks.folded as `(process, frames root first, kernel suffix stripped) -> count`.
pub fn folded_by_stack(folded: &[FoldedStack]) -> BTreeMap<(String, Vec<String>), u64> {
    let mut stacks = BTreeMap::new();
    for stack in folded {
        let frames = stack
            .frames
            .iter()
            .map(|f| f.strip_suffix(KERNEL_SUFFIX).unwrap_or(f).to_owned())
            .collect();
        *stacks.entry((stack.process.clone(), frames)).or_default() += stack.count;
    }
    stacks
}

#[cfg(test)]
mod tests {
    use super::*;

    const RAW: &str = "\
Comment: ember: sampled at 97 Hz
PeriodType: cpu nanoseconds
Period: 10309278
Time: 2026-11-26 06:47:42.109194395 +0000 UTC
Duration: 1.01
Samples:
samples/count cpu/nanoseconds[dflt]
          1   10309278: 1 
                process_name:[my app] thread_name:[worker]
                pid:[23078] tid:[23080]
          2   20618556: 2 3 
                process_name:[my app] thread_name:[worker]
                pid:[23078] tid:[23080]
Locations
     1: 0x0 [lost user stack: stack-map collision] :0 s=0
     2: 0x55cce39e1267 M=2 inner /src/a.c:12 s=0
             inlined_outer /src/a.c:20 s=0
     3: 0x5719 [unknown] app+0x5719 :0 s=0
Mappings
1: 0x0/0xffffffffffffffff/0x0 [kernel.kallsyms]  [FN]
";

    #[test]
    fn parses_header_samples_labels_and_inlined_locations() {
        let raw = parse_raw(RAW);
        assert_eq!(raw.period_type, ("cpu".into(), "nanoseconds".into()));
        assert_eq!(raw.period, 10_309_278);
        assert_eq!(
            raw.sample_types,
            [
                ("samples".into(), "count".into()),
                ("cpu".into(), "nanoseconds".into())
            ]
        );
        assert_eq!(raw.samples.len(), 2);
        assert_eq!(raw.samples[0].values, [1, 10_309_278]);
        assert_eq!(
            raw.samples[0].stack,
            ["[lost user stack: stack-map collision]"]
        );
        assert_eq!(raw.samples[1].label("process_name"), Some("my app"));
        assert_eq!(raw.samples[1].label("tid"), Some("23080"));
        assert_eq!(
            raw.samples[1].stack,
            ["inner", "inlined_outer", "[unknown] app+0x5719"]
        );
        let by_stack = raw_by_stack(&raw);
        assert_eq!(
            by_stack.get(&(
                "my app".to_owned(),
                vec![
                    "[unknown] app+0x5719".to_owned(),
                    "inlined_outer".to_owned(),
                    "inner".to_owned()
                ]
            )),
            Some(&2)
        );
    }
}
