#!/usr/bin/env bash
# Sets up what recording needs (idempotent; no test tools), builds it, and records the whole machine for 10 s:
# writes ember-out/flamegraph.svg, ember-out/profile.pb.gz and ember-out/stacks.folded.
# Extra arguments go to `ember-relay record` (e.g. --duration 30s --pid 1234).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/setup.sh record
cargo build --release --locked -p ember-sampler -p ember-relay
# 10 s into ./ember-out are `record`'s own defaults, so --duration and --output may be passed here.
exec ./target/release/ember-relay record "$@"
