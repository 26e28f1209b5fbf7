#!/usr/bin/env bash
# Fuzzes every parser of untrusted input with cargo-fuzz (libFuzzer, nightly toolchain): the
# protocol decoders of both directions, and what the relay reads from hostile processes and
# files: /proc/kallsyms text, ELF files (symbolization and unwind-table compilation), Go's
# .gopclntab, jitdump files a JIT runtime writes about its code, cgroup text,
# OTEL_RESOURCE_ATTRIBUTES and the YAML config with its relabel rules.
#
#   scripts/fuzz.sh                 every target for 60 s
#   scripts/fuzz.sh -t SECONDS      every target for SECONDS (scripts/test.sh: 10)
#   scripts/fuzz.sh TARGET...       only these targets (names: fuzz/fuzz_targets/*.rs)
#
# Each target starts from its committed seeds (fuzz/seeds/TARGET, read-only) and grows a working
# corpus under fuzz/corpus/TARGET (git-ignored; kept between runs, so longer runs build on it).
# A finding (panic, a run over 10 s, more than 2 GiB) is saved under fuzz/artifacts/TARGET and
# fails the script; reproduce it with `cargo +nightly fuzz run TARGET fuzz/artifacts/TARGET/FILE`.
# Prints one line per target: runs, seconds, runs/s, corpus size, findings, and on stdout too
# the report of any finding. The targets read /dev/null as stdin, whatever the caller's is.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PATH="$root/.tools/bin:$PATH"
seconds=60
targets=()
while [ $# -gt 0 ]; do
    case "$1" in
        -t) seconds=$2; shift 2 ;;
        -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
        *) targets+=("$1"); shift ;;
    esac
done
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "error: cargo-fuzz not found; scripts/setup.sh installs it into .tools/bin" >&2
    exit 1
fi
if [ ${#targets[@]} -eq 0 ]; then
    for f in fuzz/fuzz_targets/*.rs; do targets+=("$(basename "$f" .rs)"); done
fi
# No sanitizer: the relay is safe Rust, so what fuzzing looks for is panics, hangs and unbounded
# memory, and an uninstrumented build is several times faster to build and to run.
build=(+nightly fuzz build --sanitizer none --fuzz-dir fuzz)
echo "[fuzz] building ${#targets[@]} targets (nightly, release with debug assertions)"
cargo "${build[@]}"
failed=0
printf '%-22s %10s %8s %10s %8s %s\n' target runs seconds runs/s corpus findings
for target in "${targets[@]}"; do
    corpus="fuzz/corpus/$target"
    seeds="fuzz/seeds/$target"
    artifacts="fuzz/artifacts/$target"
    mkdir -p "$corpus" "$artifacts"
    log=$(mktemp)
    before=$(find "$artifacts" -type f | wc -l)
    status=0
    cargo +nightly fuzz run --sanitizer none --fuzz-dir fuzz "$target" "$corpus" "$seeds" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=1048576 \
        -artifact_prefix="$artifacts/" -print_final_stats=1 </dev/null >"$log" 2>&1 || status=$?
    runs=$(awk '/^stat::number_of_executed_units:/ { print $2 }' "$log")
    elapsed=$(sed -n -E 's/^Done [0-9]+ runs in ([0-9]+) second.*/\1/p' "$log")
    runs=${runs:-0}
    elapsed=${elapsed:-$seconds}
    rate=$(( runs / (elapsed > 0 ? elapsed : 1) ))
    files=$(find "$corpus" -type f | wc -l)
    findings=$(( $(find "$artifacts" -type f | wc -l) - before ))
    printf '%-22s %10s %8s %10s %8s %s\n' "$target" "$runs" "$elapsed" "$rate" "$files" "$findings"
    if [ "$status" -ne 0 ] || [ "$findings" -gt 0 ]; then
        failed=1
        # On stdout, beside the table, so a CI log that keeps only stdout still shows it.
        echo "[fuzz] $target: FINDING (exit $status); libFuzzer's report:"
        grep -E -A20 'ERROR: libFuzzer|panicked at|==[0-9]+== ERROR|ALARM' "$log" | head -40 ||
            tail -20 "$log"
        find "$artifacts" -type f -printf '[fuzz]   saved %p\n' | tail -5
    fi
    rm -f "$log"
done
exit "$failed"
