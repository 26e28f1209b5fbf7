//! profile.speedscope.json as speedscope reads it: validated against speedscope's own JSON
//! schema of its file format (file-format-schema.json from the `speedscope` npm package,
//! 1.25.0) by Python's `jsonschema`, both put in `.tools/` by scripts/setup.sh; then checked as
//! speedscope's importer does what the schema cannot say (a sampled profile's `samples` and
//! `weights` have one length, every frame index names a frame: the importer throws, or draws
//! undefined frames, otherwise), and read into what speedscope's views show.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

use crate::skip;

/// The speedscope release whose schema scripts/setup.sh fetches.
pub const VERSION: &str = "1.25.0";

/// What a speedscope file holds, read as speedscope's importer reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpeedscopeFile {
    /// Per profile (by its name): frame name -> the weight of the samples it is in (counted once
    /// per sample, however often it recurs).
    pub profiles: BTreeMap<String, BTreeMap<String, u64>>,
    /// Per profile: the sum of its weights.
    pub weights: BTreeMap<String, u64>,
    /// The profile names in file order.
    pub order: Vec<String>,
}

impl SpeedscopeFile {
    /// Frame name -> total over every profile.
    pub fn frame_totals(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for totals in self.profiles.values() {
            for (name, weight) in totals {
                *out.entry(name.clone()).or_insert(0) += weight;
            }
        }
        out
    }
}

/// The schema file and a Python with `jsonschema`, or `None` after [`skip`] (a failure under
/// `CI`) when scripts/setup.sh has not installed them.
pub fn reader() -> Option<(PathBuf, PathBuf)> {
    let tools = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools");
    let schema = tools.join(format!("speedscope-{VERSION}/file-format-schema.json"));
    let python = tools.join("venv/bin/python");
    let importable = Command::new(&python)
        .args(["-c", "import jsonschema"])
        .status()
        .is_ok_and(|s| s.success());
    if !schema.is_file() || !importable {
        skip(&format!(
            "no speedscope schema at {} or no jsonschema in .tools/venv, so \
             profile.speedscope.json cannot be checked; scripts/setup.sh installs both",
            schema.display()
        ));
        return None;
    }
    Some((schema, python))
}

const VALIDATE: &str = "import json, sys, jsonschema
schema = json.load(open(sys.argv[1]))
doc = json.load(open(sys.argv[2]))
errors = list(jsonschema.Draft7Validator(schema).iter_errors(doc))
for e in errors[:5]:
    print('/'.join(map(str, e.absolute_path)) + ': ' + e.message[:300])
sys.exit(1 if errors else 0)
";

/// Validates `path` against the schema with `python` (from [`reader`]), then reads it as
/// speedscope's importer does; panics, saying why, on a file speedscope would refuse or misdraw.
pub fn read(schema: &Path, python: &Path, path: &Path) -> SpeedscopeFile {
    let output = Command::new(python)
        .arg("-c")
        .arg(VALIDATE)
        .arg(schema)
        .arg(path)
        .output()
        .expect("running python with jsonschema");
    assert!(
        output.status.success(),
        "{} does not match speedscope's file-format schema:\n{}{}",
        path.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read(path).expect("reading the speedscope file");
    let doc: Value = serde_json::from_slice(&text).expect("speedscope JSON");
    parse(&doc)
}

/// The importer's own checks and the views' totals, on a document the schema accepted.
pub fn parse(doc: &Value) -> SpeedscopeFile {
    assert_eq!(
        doc["$schema"], "https://www.speedscope.app/file-format-schema.json",
        "speedscope recognises its format by $schema"
    );
    let frames = doc["shared"]["frames"].as_array().expect("shared.frames");
    let mut file = SpeedscopeFile {
        profiles: BTreeMap::new(),
        weights: BTreeMap::new(),
        order: Vec::new(),
    };
    for profile in doc["profiles"].as_array().expect("profiles") {
        let name = profile["name"].as_str().expect("profile name").to_owned();
        assert_eq!(profile["type"], "sampled", "{name}: not a sampled profile");
        let samples = profile["samples"].as_array().expect("samples");
        let weights = profile["weights"].as_array().expect("weights");
        assert_eq!(
            samples.len(),
            weights.len(),
            "{name}: samples.length != weights.length (speedscope's importer throws)"
        );
        let mut totals: BTreeMap<String, u64> = BTreeMap::new();
        let mut sum = 0;
        for (stack, weight) in samples.iter().zip(weights) {
            let weight = weight.as_u64().expect("a whole-number weight");
            sum += weight;
            let mut names: Vec<&str> = stack
                .as_array()
                .expect("a stack")
                .iter()
                .map(|index| {
                    let i = index.as_u64().expect("a frame index");
                    let frame = usize::try_from(i)
                        .ok()
                        .and_then(|i| frames.get(i))
                        .unwrap_or_else(|| {
                            panic!(
                                "{name}: frame index {i} out of range ({} frames)",
                                frames.len()
                            )
                        });
                    frame["name"].as_str().expect("a frame name")
                })
                .collect();
            names.sort_unstable();
            names.dedup();
            for frame in names {
                *totals.entry(frame.to_owned()).or_insert(0) += weight;
            }
        }
        assert_eq!(
            profile["endValue"]
                .as_u64()
                .map(|end| end - profile["startValue"].as_u64().unwrap_or(0)),
            Some(sum),
            "{name}: endValue - startValue is not the weights' sum"
        );
        assert!(
            file.profiles.insert(name.clone(), totals).is_none(),
            "two profiles named {name}"
        );
        file.weights.insert(name.clone(), sum);
        file.order.push(name);
    }
    file
}
