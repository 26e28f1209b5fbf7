//! A minimal decode of pprof's profile.proto (only the fields the tests look at), to check
//! profile.pb.gz independently of the relay's own writer.

use std::{collections::HashMap, fs, io::Read as _, path::Path};

#[derive(Clone, PartialEq, prost::Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(int64, tag = "12")]
    pub period: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    /// Leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    /// The mapped file's name (a string table index).
    #[prost(int64, tag = "5")]
    pub filename: i64,
    /// Its build id (a string table index; 0 when unknown).
    #[prost(int64, tag = "6")]
    pub build_id: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// Innermost (inlined) function first.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// Reads and decodes a gzipped pprof file; panics with the reason if it is not one.
pub fn read(path: &Path) -> Profile {
    let gz = fs::read(path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut bytes)
        .unwrap_or_else(|err| panic!("{} is not gzip: {err}", path.display()));
    let profile = <Profile as prost::Message>::decode(&bytes[..])
        .unwrap_or_else(|err| panic!("{} is not a pprof Profile: {err}", path.display()));
    assert_eq!(
        profile.string_table.first().map(String::as_str),
        Some(""),
        "pprof string_table[0] must be the empty string"
    );
    profile
}

impl Profile {
    pub fn string(&self, index: i64) -> &str {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.string_table.get(i))
            .map_or("<bad string index>", String::as_str)
    }

    /// Index into `Sample::value` of the sample count: the value type named "samples" (or
    /// "count"), else the first.
    pub fn count_index(&self) -> usize {
        self.sample_type
            .iter()
            .position(|vt| matches!(self.string(vt.r#type), "samples" | "count" | "sample"))
            .unwrap_or(0)
    }

    pub fn sample_count(&self, sample: &Sample) -> u64 {
        sample
            .value
            .get(self.count_index())
            .map_or(0, |&v| u64::try_from(v).unwrap_or(0))
    }

    pub fn total_samples(&self) -> u64 {
        self.sample.iter().map(|s| self.sample_count(s)).sum()
    }

    /// The file names of the mappings, in order (pprof readers take the first for the main
    /// binary).
    pub fn mapping_files(&self) -> Vec<&str> {
        self.mapping
            .iter()
            .map(|m| self.string(m.filename))
            .collect()
    }

    /// Function names of a sample, leaf first (inlined frames expanded).
    pub fn stack(&self, sample: &Sample) -> Vec<String> {
        let locations: HashMap<u64, &Location> = self.location.iter().map(|l| (l.id, l)).collect();
        let functions: HashMap<u64, &Function> = self.function.iter().map(|f| (f.id, f)).collect();
        let mut names = Vec::new();
        for id in &sample.location_id {
            let Some(location) = locations.get(id) else {
                names.push(format!("<missing location {id}>"));
                continue;
            };
            if location.line.is_empty() {
                names.push(format!("[unknown] {:#x}", location.address));
            }
            for line in &location.line {
                names.push(functions.get(&line.function_id).map_or_else(
                    || "<missing function>".to_owned(),
                    |f| self.string(f.name).to_owned(),
                ));
            }
        }
        names
    }

    /// (function name, its file name, line) of a sample's frames, leaf first (inlined frames
    /// expanded): what a reader shows for an interpreter's frames, whose file is a source file.
    pub fn stack_lines(&self, sample: &Sample) -> Vec<(String, String, i64)> {
        let locations: HashMap<u64, &Location> = self.location.iter().map(|l| (l.id, l)).collect();
        let functions: HashMap<u64, &Function> = self.function.iter().map(|f| (f.id, f)).collect();
        let mut frames = Vec::new();
        for location in sample.location_id.iter().filter_map(|id| locations.get(id)) {
            for line in &location.line {
                let (name, file) = functions
                    .get(&line.function_id)
                    .map_or(("", ""), |f| (self.string(f.name), self.string(f.filename)));
                frames.push((name.to_owned(), file.to_owned(), line.line));
            }
        }
        frames
    }

    /// The numeric label `key` of a sample (e.g. `tid`), if it has one.
    pub fn num_label(&self, sample: &Sample, key: &str) -> Option<i64> {
        sample
            .label
            .iter()
            .find(|label| label.str == 0 && self.string(label.key) == key)
            .map(|label| label.num)
    }

    /// (key, string value or number) of every label of a sample.
    pub fn labels(&self, sample: &Sample) -> Vec<(String, String)> {
        sample
            .label
            .iter()
            .map(|label| {
                let value = if label.str != 0 {
                    self.string(label.str).to_owned()
                } else {
                    label.num.to_string()
                };
                (self.string(label.key).to_owned(), value)
            })
            .collect()
    }
}

/// Whether a label key names a process id ("pid", "process.pid", "process_id", ...).
pub fn is_pid_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key == "pid" || key.ends_with(".pid") || key == "process_id" || key == "process.id"
}
