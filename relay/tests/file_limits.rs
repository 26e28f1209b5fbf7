//! `FileLimits::clamped_to_rlimit` through the public API (kills a cargo-mutants survivor in
//! relay/src/session.rs): however many open files are asked for, the relay keeps fewer than its
//! soft RLIMIT_NOFILE, so passed descriptors can never exhaust it.

use ember_relay::session::FileLimits;
use nix::sys::resource::{getrlimit, Resource};

#[test]
fn max_open_files_stays_below_the_soft_nofile_limit() {
    let (soft, _) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit(RLIMIT_NOFILE)");
    let soft = usize::try_from(soft).unwrap_or(usize::MAX);
    // Given a request for more descriptors than the process may ever open
    let asked = FileLimits {
        max_open_files: usize::MAX,
        ..FileLimits::default()
    };
    // When clamped
    let clamped = asked.clamped_to_rlimit();
    // Then it stays below the limit (with room for the relay's own files), never 0, and the
    // other limit is untouched
    assert!(
        (1..soft).contains(&clamped.max_open_files),
        "max_open_files {} with a soft RLIMIT_NOFILE of {soft}",
        clamped.max_open_files
    );
    assert_eq!(clamped.max_copy_bytes, asked.max_copy_bytes);
    // And a small request is kept as asked
    let small = FileLimits {
        max_open_files: 3,
        ..FileLimits::default()
    };
    assert_eq!(small.clamped_to_rlimit().max_open_files, 3);
}
