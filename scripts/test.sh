#!/usr/bin/env bash
# Sets up what ember needs (idempotent), then runs every check and test: formatting, clippy,
# unit tests and the end-to-end tests that load the real eBPF program (these need root; as
# another user they skip with a printed reason, except under CI=true where they fail).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
start=$(date +%s)
bash scripts/setup.sh
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --locked --all-targets -- -D warnings
echo "== cargo build"
cargo build --locked
echo "== cargo test"
# End-to-end tests share the CPUs and the eBPF sampler: run them one at a time.
cargo test --locked -- --test-threads=1
echo "== all checks passed in $(( $(date +%s) - start ))s"
