#!/usr/bin/env bash
# Mutation testing with cargo-mutants over the modules .cargo/mutants.toml names (the codec,
# the relay's source, session, privilege drop and OTLP request builders, the sampler's
# hardening and link): each mutant is a small deliberate bug; a mutant the tests do not catch
# ("missed") is code no test checks.
#
#   scripts/mutants.sh                  every mutant of every configured module (hours on 2 cores)
#   scripts/mutants.sh REGEX...         only mutants whose name matches, e.g. '^relay/src/session'
#   scripts/mutants.sh --ci             only code changed since the base (below), capped in time:
#                                       what scripts/test.sh runs
#
# Environment:
#   EMBER_MUTANTS_BASE=REV    base of --ci's diff. Default: the merge base with origin/main when
#                             it differs from HEAD (a branch), else HEAD's first parent (the last
#                             commit or merge on main).
#   EMBER_MUTANTS_TIMEOUT=15m cap on the whole run (--ci default 15m, none otherwise). A capped
#                             run reports what it tested and exits 0: the cap is a budget.
#   EMBER_MUTANTS_STRICT=1    exit 1 when a mutant is missed (default for a full run; --ci
#                             only reports, so an untested line does not stop a merge by itself).
#   EMBER_MUTANTS_E2E=1       also run the root end-to-end tests (ember-tests) against each
#                             mutant, under the machine-wide eBPF lock. Needs root and a loaded
#                             kernel; slow (minutes per mutant).
#   EMBER_MUTANTS_IN_PLACE=1  mutate this tree in place (cargo-mutants restores each file) and
#                             reuse target/; default under CI (a throwaway clone). Otherwise the
#                             tree is copied and built once from scratch, which is safe but slow.
#
# Output: mutants.out/ (caught.txt, missed.txt, unviable.txt, timeout.txt) and one summary line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PATH="$root/.tools/bin:$PATH"
log() { printf '[mutants] %s\n' "$*"; }

if ! command -v cargo-mutants >/dev/null; then
    echo "error: cargo-mutants not found; scripts/setup.sh installs it into .tools/bin" >&2
    exit 1
fi

ci=0
filters=()
for arg in "$@"; do
    case "$arg" in
        --ci) ci=1 ;;
        -h | --help) sed -n '2,30p' "$0"; exit 0 ;;
        *) filters+=("$arg") ;;
    esac
done

args=(mutants --no-shuffle --output "$root")
in_place=${EMBER_MUTANTS_IN_PLACE:-}
[ -n "$in_place" ] || { [ -n "${CI:-}" ] && in_place=1 || in_place=0; }
if [ "$in_place" = 1 ]; then
    args+=(--in-place)
else
    args+=(--jobs 1)
fi
for re in "${filters[@]+"${filters[@]}"}"; do
    args+=(--re "$re")
done

strict=${EMBER_MUTANTS_STRICT:-1}
cap=${EMBER_MUTANTS_TIMEOUT:-}
if [ "$ci" = 1 ]; then
    strict=${EMBER_MUTANTS_STRICT:-0}
    cap=${cap:-15m}
    base=${EMBER_MUTANTS_BASE:-}
    if [ -z "$base" ]; then
        upstream=$(git merge-base HEAD origin/main 2>/dev/null || true)
        if [ -n "$upstream" ] && [ "$upstream" != "$(git rev-parse HEAD)" ]; then
            base=$upstream
        else
            base=$(git rev-parse --verify -q 'HEAD^1' || true)
        fi
    fi
    if [ -z "$base" ]; then
        log "no base commit to diff against (a single-commit history): nothing to mutate"
        exit 0
    fi
    diff_file=$(mktemp)
    trap 'rm -f "$diff_file"' EXIT
    git diff "$base" HEAD -- '*.rs' >"$diff_file"
    if [ ! -s "$diff_file" ]; then
        log "no Rust code changed since $(git rev-parse --short "$base"): nothing to mutate"
        exit 0
    fi
    log "mutating code changed since $(git rev-parse --short "$base") ($(grep -c '^+++ ' "$diff_file") files)"
    args+=(--in-diff "$diff_file")
fi

if [ "${EMBER_MUTANTS_E2E:-0}" = 1 ]; then
    # Each mutated crate's own tests plus the end-to-end tests, which run the rebuilt binaries;
    # skips fail (CI=true), and the e2e tests run one at a time.
    export CI=true
    args+=(--test-package ember-protocol,ember-relay,ember-sampler,ember-tests -- --test-threads=1)
    runner=(flock /tmp/ember-ebpf.lock)
else
    runner=()
fi

start=$(date +%s)
status=0
if [ -n "$cap" ]; then
    # SIGINT lets cargo-mutants restore the file it is mutating before it exits.
    "${runner[@]+"${runner[@]}"}" timeout --signal=INT --kill-after=60 "$cap" \
        nice -n 10 cargo mutants "${args[@]:1}" || status=$?
else
    "${runner[@]+"${runner[@]}"}" nice -n 10 cargo mutants "${args[@]:1}" || status=$?
fi
if [ "$in_place" = 1 ] && ! git diff --quiet -- '*.rs'; then
    log "warning: a mutation was left in the tree; restoring the changed .rs files"
    git diff --name-only -- '*.rs' | xargs git checkout --
fi

count() {
    if [ -f "mutants.out/$1.txt" ]; then grep -c . "mutants.out/$1.txt" || true; else echo 0; fi
}
caught=$(count caught)
missed=$(count missed)
unviable=$(count unviable)
timeouts=$(count timeout)
tested=$((caught + missed + timeouts))
score="n/a"
[ "$tested" -eq 0 ] || score="$((100 * (caught + timeouts) / tested))%"
capped=""
[ "$status" -ne 124 ] || capped=" (stopped at the $cap cap: partial)"
log "$caught caught, $missed missed, $unviable unviable, $timeouts timeouts; score $score in $(( $(date +%s) - start ))s$capped"
if [ "$missed" -gt 0 ]; then
    log "missed (code no test checks):"
    sed 's/^/  /' mutants.out/missed.txt
fi
case "$status" in
    0 | 124) ;;
    2 | 3) [ "$strict" = 1 ] && [ "$missed" -gt 0 ] && exit 1 ;;
    *) log "cargo mutants failed (exit $status)"; exit "$status" ;;
esac
exit 0
