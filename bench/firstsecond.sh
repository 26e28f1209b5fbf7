#!/usr/bin/env bash
# bench/firstsecond.sh: whole stacks over a whole `ember-relay record`, first second included,
# quiet or beside a Rust build. Run `bench/firstsecond.sh --help` for what it measures.
set -euo pipefail
export LC_ALL=C

usage() {
  cat <<'EOF'
Usage: sudo bench/firstsecond.sh [options]

Starts two workloads without frame pointers, waits 2 s, then records them:
  gt       tests/workloads/groundtruth.c built -O2 -fomit-frame-pointer (main -> outer_work ->
           middle_work -> inner_work)
  python3  Debian's /usr/bin/python3 running a pure-Python loop
and prints, per profiler, the share of each workload's samples whose stack is whole: from
`_start` through `main` (gt) or `Py_BytesMain` (python3) to the leaf, over the WHOLE recording,
so the time before the unwind tables reached the kernel counts. Profilers, one after the other:
  ember          ember-relay record -F FREQ -d DURATION --interval INTERVAL (system-wide)
  ember-before   the same with the binaries of --before DIR (an A/B of two builds)
  perf-dwarf     perf record -F FREQ -a --call-graph dwarf -- sleep DURATION (+ perf script)
With --busy, a Rust build stand-in runs throughout: two loops each compiling a small crate
with rustc -O (stable and nightly toolchains), so that processes mapping librustc_driver and
libLLVM (6 MB of .eh_frame each, ~350 MB of binaries per toolchain) start and exit all the time,
as in a `cargo build`. ember's own unwinding counters (tables loaded / evicted, samples of
processes not known yet) are printed from record's summary.

Options (each also settable through the environment variable in brackets):
  -d, --duration SECONDS   recording length                        [DURATION, default 10]
  -F, --frequency HZ       samples per second per CPU              [FREQ, default 999]
  -i, --interval DURATION  record --interval                       [INTERVAL, default 1s]
  -p, --profilers LIST     subset of ember,ember-before,perf-dwarf [PROFILERS, default ember,perf-dwarf]
      --before DIR         ember-sampler and ember-relay of the build to compare with [BEFORE_DIR]
      --bin DIR            this build's binaries [BIN_DIR, default target/release, else target/debug]
      --busy               run the Rust build stand-in throughout   [BUSY=1]
  -k, --keep               keep the temporary directory            [KEEP=1]
  -h, --help
Needs root, cc, python3, perf (for perf-dwarf) and rustup's stable and nightly rustc (for --busy).
Example: sudo bench/firstsecond.sh --busy -d 60 -i 5s --before /tmp/main-bin -p ember-before,ember
EOF
}

DURATION=${DURATION:-10} FREQ=${FREQ:-999} INTERVAL=${INTERVAL:-1s} PROFILERS=${PROFILERS:-ember,perf-dwarf}
BEFORE_DIR=${BEFORE_DIR:-} BIN_DIR=${BIN_DIR:-} BUSY=${BUSY:-0} KEEP=${KEEP:-0}
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    -d | --duration) DURATION=${2:?}; shift 2 ;;
    -F | --frequency) FREQ=${2:?}; shift 2 ;;
    -i | --interval) INTERVAL=${2:?}; shift 2 ;;
    -p | --profilers) PROFILERS=${2:?}; shift 2 ;;
    --before) BEFORE_DIR=${2:?}; shift 2 ;;
    --bin) BIN_DIR=${2:?}; shift 2 ;;
    --busy) BUSY=1; shift ;;
    -k | --keep) KEEP=1; shift ;;
    *) printf 'firstsecond.sh: unknown argument: %s\n\n' "$1" >&2; usage >&2; exit 2 ;;
  esac
done
die() { printf 'firstsecond.sh: error: %s\n' "$*" >&2; exit 1; }
log() { printf '[firstsecond %s] %s\n' "$(date +%T)" "$*" >&2; }
[ "$(id -u)" = 0 ] || die "needs root (eBPF, perf -a): run it with sudo"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$ROOT/bench/lib/ember-bins.sh"
BIN_DIR=$(ember_bin_dir "$ROOT" "$BIN_DIR") || exit 1
case ,$PROFILERS, in *,ember-before,*) [ -n "$BEFORE_DIR" ] || die "ember-before needs --before DIR" ;; esac

TMP=$(mktemp -d /tmp/firstsecond.XXXXXX)
chmod 755 "$TMP"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do pkill -P "$p" 2>/dev/null || true; kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ "$KEEP" = 1 ]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT

cc -O2 -fomit-frame-pointer -g -fno-inline -fno-optimize-sibling-calls -o "$TMP/gt-nofp" \
  "$ROOT/tests/workloads/groundtruth.c" || die "cc failed"
if [ "$BUSY" = 1 ]; then
  cat > "$TMP/small.rs" <<'RS'
use std::collections::HashMap;
fn work<T: std::fmt::Debug + Clone + std::hash::Hash + Eq>(v: Vec<T>) -> HashMap<T, usize> {
    v.iter().enumerate().map(|(i, x)| (x.clone(), i)).collect()
}
fn main() {
    println!("{:?} {:?} {:?}", work(vec![1u8, 2]), work(vec!["a".to_string()]), work(vec![(1u64, 2i32)]));
}
RS
  for tc in stable nightly; do
    ( while :; do rustc +$tc -O -o "$TMP/small-$tc" "$TMP/small.rs" 2>/dev/null || sleep 1; done ) &
    PIDS+=($!)
  done
fi
"$TMP/gt-nofp" 100000 > /dev/null &
PIDS+=($!)
python3 -c 'import time
x = 0
while True:
    for i in range(10000):
        x += i * i' &
PIDS+=($!)
sleep 2

# share FOLDED_OR_SCRIPT KIND: "gt W/T P%  python3 W/T P%" from stacks.folded (KIND folded) or
# from `perf script` output (KIND perf).
share() {
  python3 - "$1" "$2" <<'PY'
import sys
path, kind = sys.argv[1], sys.argv[2]
want = {"gt-nofp": "main", "python3": "Py_BytesMain"}
tot = {k: 0 for k in want}; whole = {k: 0 for k in want}
def count(proc, frames, n):  # frames root first
    for k, need in want.items():
        if proc.startswith(k):
            tot[k] += n
            if frames and frames[0] == "_start" and need in frames:
                whole[k] += n
if kind == "folded":
    for line in open(path):
        line = line.rstrip("\n")
        if not line: continue
        stack, n = line.rsplit(" ", 1)
        f = stack.split(";")
        count(f[0], [x for x in f[1:] if not x.endswith("_[k]")], int(n))
else:
    proc, frames = None, []
    for line in list(open(path, errors="replace")) + [""]:
        line = line.rstrip("\n")
        if not line.strip():
            if proc is not None:
                count(proc, [f for f in reversed(frames) if f], 1)
            proc, frames = None, []
        elif not line.startswith(("\t", " ")):
            proc = line.split()[0]
        else:
            parts = line.split()
            if len(parts) >= 2 and "[kernel.kallsyms]" not in line:
                frames.append(parts[1].split("+")[0])
print("  ".join(f"{k.split('-')[0]} {whole[k]}/{tot[k]} {100*whole[k]/max(tot[k],1):.1f}%" for k in want))
PY
}

run_ember() { # NAME DIR
  local out=$TMP/$1
  "$2/ember-relay" record -F "$FREQ" -d "${DURATION}s" --interval "$INTERVAL" -o "$out" --format folded \
    -v --sampler "$2/ember-sampler" > "$out.stdout" 2> "$out.stderr" || die "$1 failed: see $out.stderr"
  printf '%-14s %s\n' "$1" "$(share "$out/stacks.folded" folded)"
  grep -h '^unwinding: [0-9]' "$out.stdout" | sed 's/^/               /' || true
}

log "recording ${DURATION}s at ${FREQ} Hz, interval $INTERVAL, busy=$BUSY, $BIN_DIR"
printf '%-14s %s\n' profiler "whole stacks over the recording (_start .. main .. leaf)"
IFS=, read -ra LIST <<< "$PROFILERS"
for p in "${LIST[@]}"; do
  case $p in
    ember) run_ember ember "$BIN_DIR" ;;
    ember-before) run_ember ember-before "$BEFORE_DIR" ;;
    perf-dwarf)
      perf record -q -F "$FREQ" -a --call-graph dwarf -o "$TMP/perf.data" -- sleep "$DURATION" 2>/dev/null
      perf script -i "$TMP/perf.data" -F comm,ip,sym --no-inline 2>/dev/null > "$TMP/perf.script"
      printf '%-14s %s\n' perf-dwarf "$(share "$TMP/perf.script" perf)" ;;
    *) die "unknown profiler $p" ;;
  esac
done
