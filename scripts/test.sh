#!/usr/bin/env bash
# Sets up what ember needs (idempotent), then runs every check and test: formatting, clippy,
# unit tests and the end-to-end tests that load the real eBPF program (these need root).
#
# Then each fuzz target for a few seconds (scripts/fuzz.sh), and last, in CI (or with
# EMBER_MUTANTS=1), a time-capped mutation test of the changed Rust code (scripts/mutants.sh --ci).
#
# Nothing is skipped in silence: this script sets EMBER_REQUIRE_ALL=1, so a test that cannot run
# here (not root, a tool or the Python decoders missing) fails. `EMBER_REQUIRE_ALL=0
# scripts/test.sh` allows skips instead; either way the summary counts the tests that ran as root
# and lists the skipped ones, from the record file the tests append to (tests/src/gate.rs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
start=$(date +%s)
stage_start=$start
stage_name=""
# Prints how long the stage before took, then the next stage's name.
stage() {
    local now
    now=$(date +%s)
    [ -z "$stage_name" ] || echo "== $stage_name took $((now - stage_start))s"
    stage_name=$1
    stage_start=$now
    [ -z "$1" ] || echo "== $1"
}
stage "setup"
bash scripts/setup.sh
stage "cargo fmt --check"
cargo fmt --all -- --check
stage "cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
cargo check --locked -p ember-relay --no-default-features  # the relay without Kubernetes support
cargo clippy --locked -p ember-relay --features fuzzing -- -D warnings  # the fuzz targets' entry points
stage "cargo build"
cargo build --locked
stage "cargo test"
export EMBER_REQUIRE_ALL="${EMBER_REQUIRE_ALL:-1}"
export EMBER_TEST_RECORD="$root/target/ember-test-record.txt"
rm -f "$EMBER_TEST_RECORD"
# End-to-end tests share the CPUs and the eBPF sampler: run them one at a time.
status=0
cargo test --locked -- --test-threads=1 || status=$?
stage ""
# One line per test that ran as root or was skipped (several lines for one test count once).
count() {
    awk -F '\t' -v kind="$1" '$1 == kind { print $2 }' "$EMBER_TEST_RECORD" 2>/dev/null |
        sort -u | wc -l
}
echo "== $(count root) tests ran as root, $(count skipped) skipped (EMBER_REQUIRE_ALL=$EMBER_REQUIRE_ALL)"
if [ "$(count skipped)" -gt 0 ]; then
    awk -F '\t' '$1 == "skipped" { print "   SKIPPED: " $2 ": " $3 }' "$EMBER_TEST_RECORD"
fi
if [ "$status" -ne 0 ]; then
    echo "== cargo test failed (exit $status)"
    exit "$status"
fi
# Every fuzz target for a few seconds from its committed seeds (scripts/fuzz.sh): a panic, hang
# or unbounded allocation in a parser of untrusted input fails the run. EMBER_FUZZ_SECONDS
# (default 10) per target; 0 leaves it out.
if [ "${EMBER_FUZZ_SECONDS:-10}" != 0 ]; then
    echo "== fuzzing (${EMBER_FUZZ_SECONDS:-10}s per target)"
    fuzz_start=$(date +%s)
    bash scripts/fuzz.sh -t "${EMBER_FUZZ_SECONDS:-10}"
    echo "== fuzzing took $(( $(date +%s) - fuzz_start ))s"
fi
# Mutation testing of the Rust code changed since the base commit (scripts/mutants.sh --ci):
# capped at EMBER_MUTANTS_TIMEOUT (15m); lists the mutants no test caught, and fails on them
# only with EMBER_MUTANTS_STRICT=1. On by default in CI (a throwaway clone, mutated in place);
# elsewhere it would build a second copy of the tree from scratch, so it runs only with
# EMBER_MUTANTS=1. EMBER_MUTANTS=0 leaves it out everywhere.
mutants_default=0
[ -z "${CI:-}" ] || mutants_default=1
if [ "${EMBER_MUTANTS:-$mutants_default}" != 0 ]; then
    echo "== cargo mutants (changed code only)"
    mutants_start=$(date +%s)
    bash scripts/mutants.sh --ci
    echo "== cargo mutants took $(( $(date +%s) - mutants_start ))s"
fi
echo "== all checks passed in $(( $(date +%s) - start ))s"
