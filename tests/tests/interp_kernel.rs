//! Python frames walked in the kernel, end to end up to the relay: `ember-relay record --pid`
//! of a pure-Python busy loop (`hot()`) in Debian's static `/usr/bin/python3.11` and in pyenv's
//! shared-libpython 3.12. The relay recognizes the interpreter and describes it to the sampler
//! (`interpreterProcess`), the sampler checks and loads it, the eBPF program walks the frames
//! and copies the code objects, and the relay receives them: its `batch received` lines count
//! the samples that carry interpreter frames, and its debug lines show each copied code
//! object's raw name bytes. Fails when the kernel walk is broken (no frames, or no `hot`).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use ember_tests::{attack::tail, scenario::Scenario, *};

/// A pure-Python busy loop: every sample of its main thread is in `hot`.
const BUSY: &str = "def hot():\n    x = 0\n    while True:\n        x += 1\n\nhot()\n";

/// Records `python` running [`BUSY`] for a few seconds and checks what the relay received.
fn record_busy_python(python: &Path) {
    let Some(_lock) = scenario::ebpf_gate() else {
        return;
    };
    let mut busy = Command::new(python);
    busy.args(["-c", BUSY])
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let workload = ChildGuard::spawn("busy python", &mut busy);
    let pid = workload.pid();
    let mut recording = Scenario::new("interp record")
        .relay_args([
            "-v",
            "--duration",
            "6s",
            "--interval",
            "1s",
            "--pid",
            &pid.to_string(),
        ])
        .record();
    recording.finish(Duration::from_secs(60));
    let lines = recording.log.json();
    // The samples of the batches since the sampler took the interpreter (the relay describes
    // it after the process's first samples): how many carried interpreter frames. The first
    // batch with frames is left out too: the interpreter was taken part way through it (on a
    // busy machine, 2 of its 19 samples had frames).
    let batches: Vec<(u64, u64)> = lines
        .iter()
        .filter(|(_, line)| is_batch(line))
        .map(|(_, line)| {
            (
                field_u64(line, "samples").unwrap_or(0),
                field_u64(line, "interp_samples").unwrap_or(0),
            )
        })
        .collect();
    let walking: Vec<&(u64, u64)> = batches
        .iter()
        .skip_while(|(_, i)| *i == 0)
        .skip(1)
        .collect();
    let samples: u64 = walking.iter().map(|(s, _)| s).sum();
    let with_frames: u64 = walking.iter().map(|(_, i)| i).sum();
    let log = || tail(&recording.log.text(), 80);
    assert!(
        samples >= 60,
        "too few samples once the kernel walked {} ({samples}, batches {batches:?}):\n{}",
        python.display(),
        log()
    );
    assert!(
        with_frames * 10 >= samples * 9,
        "{} of {samples} samples of {} carried interpreter frames (want >= 90%; batches \
         (samples, with frames) {batches:?}):\n{}",
        with_frames,
        python.display(),
        log()
    );
    // And the kernel copied `hot`'s code object, in every interval that walked it (each batch's
    // code objects are logged right after it): a cache that kept a code object from being
    // copied again after a drain would leave the later intervals without it.
    let mut per_batch: Vec<(u64, bool)> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (_, line) in &lines {
        if is_batch(line) {
            per_batch.push((field_u64(line, "interp_samples").unwrap_or(0), false));
        } else if message(line) == "interpreter code object received"
            && field_u64(line, "pid") == Some(u64::from(pid))
        {
            let name = field_text(line, "name_bytes").unwrap_or_default();
            if let Some(batch) = per_batch.last_mut() {
                batch.1 |= name.contains("hot");
            }
            names.push(name);
        }
    }
    eprintln!(
        "{}: {with_frames} of {samples} samples with interpreter frames once walking \
         (batches (samples, with frames): {batches:?}); code names copied: {names:?}",
        python.display()
    );
    // The last batch (the end of the recording) may hold a sample or two of other code.
    let walked = &per_batch[..per_batch.len().saturating_sub(1)];
    assert!(
        walked.iter().filter(|(n, _)| *n > 0).count() >= 3
            && walked.iter().all(|&(n, hot)| n == 0 || hot),
        "an interval with interpreter frames of {} but no copied code object named hot \
         (batches (interp samples, hot copied): {per_batch:?}); names: {names:?}\n{}",
        python.display(),
        log()
    );
}

#[test]
fn debian_static_python_3_11_frames_are_walked_in_the_kernel() {
    let python = Path::new("/usr/bin/python3.11");
    assert!(
        python.exists(),
        "no /usr/bin/python3.11: install Debian's python3.11"
    );
    record_busy_python(python);
}

/// pyenv's newest `3.MINOR` (a shared build: its frames are in libpython3.MINOR.so).
fn pyenv_python(minor: u8) -> Option<PathBuf> {
    let prefix = format!("3.{minor}.");
    let root = std::env::var_os("PYENV_ROOT").map_or_else(
        || PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".pyenv"),
        PathBuf::from,
    );
    let mut found: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
        .ok()?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .map(|p| p.join("bin/python3"))
        .filter(|p| p.exists())
        .collect();
    found.sort();
    found.pop()
}

#[test]
fn pyenv_shared_python_3_12_frames_are_walked_in_the_kernel() {
    let python =
        pyenv_python(12).expect("no pyenv CPython 3.12: run `pyenv install 3.12` (a shared build)");
    record_busy_python(&python);
}

/// 3.13: the thread's current frame directly (no `_PyCFrame` hop), offsets from the file's own
/// `_Py_DebugOffsets`.
#[test]
fn pyenv_shared_python_3_13_frames_are_walked_in_the_kernel() {
    let python =
        pyenv_python(13).expect("no pyenv CPython 3.13: run `pyenv install 3.13` (a shared build)");
    record_busy_python(&python);
}

/// 3.9: no native thread id, so the thread state is matched through glibc's `struct pthread`;
/// `PyFrameObject`s, no frame marker.
#[test]
fn pyenv_shared_python_3_9_frames_are_walked_in_the_kernel_through_the_pthread_tid() {
    let python =
        pyenv_python(9).expect("no pyenv CPython 3.9: run `pyenv install 3.9` (a shared build)");
    record_busy_python(&python);
}
