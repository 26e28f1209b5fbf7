//! Skips that cannot hide: every test (or part of one) that cannot run here goes through [`skip`],
//! and every eBPF test through [`privileged`].
//!
//! A skip prints `SKIPPED: <test>: <reason>` and appends a line to the record file; where nothing
//! may be skipped (`CI` or `EMBER_REQUIRE_ALL` set, as scripts/test.sh does) it panics instead, so
//! a missing tool or a non-root run fails loudly rather than passing in silence. [`privileged`]
//! also records each test that ran as root, so scripts/test.sh can say how many did.
//!
//! The record file is `$EMBER_TEST_RECORD`, else `ember-test-record.txt` in the target profile
//! dir. Test binaries run in several processes, so each outcome is one line written with one
//! `write` to a file opened `O_APPEND`: lines from different processes never interleave. Lines are
//! tab-separated: `root<TAB>binary::test` or `skipped<TAB>binary::test<TAB>reason`.

use std::{
    env,
    fs::OpenOptions,
    io::Write as _,
    path::{Path, PathBuf},
};

/// Names the record file (scripts/test.sh sets it and counts its lines).
pub const RECORD_ENV: &str = "EMBER_TEST_RECORD";

/// True when eBPF tests can run (euid 0), recorded as a test that ran as root. Otherwise the
/// test is skipped through [`skip`] (a failure under `CI` or `EMBER_REQUIRE_ALL`) and this
/// returns false.
pub fn privileged() -> bool {
    let euid = nix::unistd::geteuid();
    if euid.is_root() {
        record(&record_path(), &Outcome::Root, &current_test());
        return true;
    }
    skip(&format!(
        "this test loads eBPF and needs root (euid is {euid}); \
         run `sudo -E cargo test -p ember-tests -- --test-threads=1`"
    ));
    false
}

/// The calling test cannot do (part of) its job here, for `reason`. Panics when skipping is
/// forbidden (see [`forbidding_variable`]); otherwise prints `SKIPPED: <test>: <reason>` and
/// records it. The caller returns (or leaves out the part) afterwards.
pub fn skip(reason: &str) {
    skip_with(
        &|name| env::var(name).ok(),
        &record_path(),
        &current_test(),
        reason,
    );
}

fn skip_with(var: &dyn Fn(&str) -> Option<String>, record_file: &Path, test: &str, reason: &str) {
    if let Some(name) = forbidding_variable(var) {
        panic!(
            "{test} cannot run here: {reason}. Skipping is a failure because {name} is set \
             (unset it, or set it to 0, to allow skips)"
        );
    }
    eprintln!("SKIPPED: {test}: {reason}");
    record(record_file, &Outcome::Skipped(reason.to_owned()), test);
}

/// The variable that forbids skipping, if any: `CI` (set by CI services, usually to `true`)
/// or `EMBER_REQUIRE_ALL` (scripts/test.sh sets it to 1), when non-empty and not `0`/`false`.
fn forbidding_variable(var: &dyn Fn(&str) -> Option<String>) -> Option<&'static str> {
    ["CI", "EMBER_REQUIRE_ALL"].into_iter().find(|name| {
        var(name).is_some_and(|value| {
            let value = value.trim();
            !value.is_empty() && value != "0" && !value.eq_ignore_ascii_case("false")
        })
    })
}

#[derive(Debug)]
enum Outcome {
    Root,
    Skipped(String),
}

fn record_path() -> PathBuf {
    env::var_os(RECORD_ENV).map_or_else(
        || crate::target_dir().join("ember-test-record.txt"),
        PathBuf::from,
    )
}

/// Appends one line for `test`. A record that cannot be written is reported, not fatal: the
/// outcome itself was already printed.
fn record(path: &Path, outcome: &Outcome, test: &str) {
    let clean = |s: &str| s.replace(['\t', '\n', '\r'], " ");
    let line = match outcome {
        Outcome::Root => format!("root\t{}\n", clean(test)),
        Outcome::Skipped(reason) => format!("skipped\t{}\t{}\n", clean(test), clean(reason)),
    };
    let written = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .and_then(|mut file| file.write_all(line.as_bytes()));
    if let Err(err) = written {
        eprintln!(
            "cannot record `{}` in {}: {err}",
            line.trim_end(),
            path.display()
        );
    }
}

/// `binary::test`: the test binary's name without cargo's hash, and the test's name, which
/// libtest gives the thread running it (also with `--test-threads=1`).
fn current_test() -> String {
    let binary = env::current_exe()
        .ok()
        .and_then(|exe| exe.file_name().map(|n| n.to_string_lossy().into_owned()))
        .map(|name| match name.rsplit_once('-') {
            Some((stem, hash)) if hash.chars().all(|c| c.is_ascii_hexdigit()) => stem.to_owned(),
            _ => name,
        })
        .unwrap_or_default();
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    format!("{binary}::{test}")
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, fs, panic};

    use super::*;

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn ci_or_require_all_forbid_skipping() {
        let forbidden = |pairs: &[(&str, &str)]| forbidding_variable(&env_of(pairs));
        assert_eq!(forbidden(&[]), None);
        assert_eq!(forbidden(&[("CI", "true")]), Some("CI"));
        assert_eq!(forbidden(&[("CI", "1")]), Some("CI"));
        assert_eq!(
            forbidden(&[("EMBER_REQUIRE_ALL", "1")]),
            Some("EMBER_REQUIRE_ALL")
        );
        assert_eq!(
            forbidden(&[("CI", "false"), ("EMBER_REQUIRE_ALL", "1")]),
            Some("EMBER_REQUIRE_ALL")
        );
        for off in ["", "0", "false", "FALSE"] {
            assert_eq!(
                forbidden(&[("CI", off), ("EMBER_REQUIRE_ALL", off)]),
                None,
                "{off:?}"
            );
        }
    }

    #[test]
    fn a_forbidden_skip_panics_with_the_reason_and_records_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("record.txt");
        let env = env_of(&[("EMBER_REQUIRE_ALL", "1")]);
        let caught = panic::catch_unwind(|| skip_with(&env, &file, "e2e::t", "no tool"))
            .expect_err("a skip under EMBER_REQUIRE_ALL=1 must panic");
        let text = caught.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            text.contains("e2e::t") && text.contains("no tool"),
            "{text}"
        );
        assert!(text.contains("EMBER_REQUIRE_ALL"), "{text}");
        assert!(!file.exists(), "a failed test is not a skip");
    }

    #[test]
    fn allowed_skips_and_root_runs_are_appended_one_line_each() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("record.txt");
        let env = env_of(&[("CI", "0")]);
        skip_with(&env, &file, "e2e::a", "no venv");
        record(&file, &Outcome::Root, "e2e::b");
        // Tabs and newlines in a reason cannot break the line format.
        skip_with(&env, &file, "deploy::c", "line\none\ttab");
        assert_eq!(
            fs::read_to_string(&file).unwrap(),
            "skipped\te2e::a\tno venv\nroot\te2e::b\nskipped\tdeploy::c\tline one tab\n"
        );
    }

    #[test]
    fn the_test_is_named_after_its_binary_and_thread() {
        let name = current_test();
        assert!(
            name.ends_with("::gate::tests::the_test_is_named_after_its_binary_and_thread"),
            "{name}"
        );
        assert!(name.starts_with("ember_tests::"), "{name}");
    }
}
