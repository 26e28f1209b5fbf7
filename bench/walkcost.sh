#!/usr/bin/env bash
# bench/walkcost.sh: what one sample of the stack walker costs, ember builds against perf -g.
# Run `bench/walkcost.sh --help` for what it measures and how.
set -euo pipefail
export LC_ALL=C

usage() {
  cat <<'EOF'
Usage: sudo bench/walkcost.sh [options]

The per-sample cost of sampling one CPU-bound process (bench/burn.c, one thread per CPU, 12-20
user frames) at FREQ Hz, with its stacks walked, for ember builds and `perf record -g`, in
interleaved phases of SECONDS each: none, then for each round every profiler once (ember through
`ember-relay record --pid`, perf through `perf record -g -p`). Each ember phase first records
WARM seconds unmeasured, so the unwind tables are loaded when measuring starts.

Columns, per profiler (median of the rounds, min-max in brackets):
  bpf_ns/sample  run time of ember's BPF programs (kernel.bpf_stats_enabled, run_time_ns in the
                 sampler's /proc/PID/fdinfo; the perf_event program is nearly all of it) divided
                 by the workload's samples
                 (its CPU time x FREQ): the in-kernel walk and everything else the program does,
                 the cheap early exit of other processes' samples included. perf: n/a (its
                 in-kernel work is not a BPF program; see wl_us/sample)
  wl_us/sample   what each sample cost the workload, in CPU us: (1 - e / e0) x 1e6 / FREQ, where
                 e is the workload's rounds per CPU second it got in that phase and e0 the mean of
                 the profiler-free phases. It includes everything the profiler makes the kernel do
                 in the workload's context (the timer interrupt, perf's stack copy and ring buffer,
                 ember's BPF program), and none of the profilers' own processes
  samples        samples of the workload per phase (its CPU time x FREQ)

Options (each also settable through the environment variable in brackets):
  -F, --frequency HZ    sampling frequency per CPU                 [FREQ, default 4999]
  -d, --duration S      measured seconds per phase                 [SECONDS, default 10]
  -w, --warm S          unmeasured seconds at the start of an ember phase [WARM, default 3]
  -r, --rounds N        rounds                                     [ROUNDS, default 3]
      --nofp            build the workload without frame pointers (gcc -O2 -fomit-frame-pointer):
                        only ember's DWARF walker gets whole stacks; perf -g gets 1-2 frames [NOFP=1]
  -e, --ember LIST      ember builds, NAME=DIR,... (DIR holds ember-sampler and ember-relay)
                                                                   [EMBER, default ember=target/release]
      --no-perf         leave perf out                             [PERF=0]
  -k, --keep            keep the temporary directory               [KEEP=1]
  -h, --help

Needs root, gcc and perf (linux-perf). The per-sample figures need a CPU-bound workload
that gets its CPUs: on a shared machine read wl_us/sample with the load average it prints.
Example: sudo bench/walkcost.sh -e before=/tmp/before,after=target/release --nofp
EOF
}

FREQ=${FREQ:-4999} SECONDS_PER=${SECONDS_PER:-10} WARM=${WARM:-3} ROUNDS=${ROUNDS:-3} NOFP=${NOFP:-0}
EMBER=${EMBER:-} PERF=${PERF:-1} KEEP=${KEEP:-0}
die() { printf 'walkcost.sh: error: %s\n' "$*" >&2; exit 1; }
log() { printf '[walkcost %s] %s\n' "$(date +%T)" "$*" >&2; }
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    -F | --frequency) FREQ=${2:?}; shift 2 ;;
    -d | --duration) SECONDS_PER=${2:?}; shift 2 ;;
    -w | --warm) WARM=${2:?}; shift 2 ;;
    -r | --rounds) ROUNDS=${2:?}; shift 2 ;;
    --nofp) NOFP=1; shift ;;
    -e | --ember) EMBER=${2:?}; shift 2 ;;
    --no-perf) PERF=0; shift ;;
    -k | --keep) KEEP=1; shift ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[ "$(id -u)" = 0 ] || die "needs root (eBPF, perf): sudo $0"
command -v gcc >/dev/null || die "needs gcc"
[ "$PERF" = 0 ] || command -v perf >/dev/null || die "needs perf (apt-get install linux-perf), or --no-perf"
bench_dir=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$bench_dir")
[ -n "$EMBER" ] || EMBER=ember=$root/target/release
IFS=, read -r -a builds <<<"$EMBER"
for b in "${builds[@]}"; do
  [ -x "${b#*=}/ember-relay" ] && [ -x "${b#*=}/ember-sampler" ] || die "no ember-relay and ember-sampler in ${b#*=}"
done

tmp=$(mktemp -d /tmp/ember-walkcost.XXXXXX)
chmod 755 "$tmp"
burn_pid=
old_stats=$(cat /proc/sys/kernel/bpf_stats_enabled)
cleanup() {
  [ -z "$burn_pid" ] || kill -TERM "$burn_pid" 2>/dev/null || true
  wait 2>/dev/null || true
  echo "$old_stats" >/proc/sys/kernel/bpf_stats_enabled
  if [ "$KEEP" = 1 ]; then log "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
echo 1 >/proc/sys/kernel/bpf_stats_enabled

if [ "$NOFP" = 1 ]; then
  gcc -O2 -g -fomit-frame-pointer -fno-inline -fno-optimize-sibling-calls -pthread -o "$tmp/burn" "$bench_dir/burn.c"
else
  gcc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls -pthread -o "$tmp/burn" "$bench_dir/burn.c"
fi
chmod 755 "$tmp"/burn
"$tmp/burn" >"$tmp/burn.out" &
burn_pid=$!
sleep 1

mark() { tail -n1 "$tmp/burn.out"; } # "<monotonic ns> <rounds> <process CPU ns>"
prog_pid=
prog_stats() { # "<run_time_ns> <run_cnt>" of the BPF programs of $prog_pid (the sampler)
  local fd t=0 c=0 a b
  [ -n "$prog_pid" ] || { echo "0 0"; return; }
  for fd in /proc/"$prog_pid"/fd/*; do
    [ "$(readlink "$fd" 2>/dev/null)" = anon_inode:bpf-prog ] || continue
    read -r a b <<<"$(awk '$1 == "run_time_ns:" { t = $2 } $1 == "run_cnt:" { c = $2 } END { print t + 0, c + 0 }' \
      "/proc/$prog_pid/fdinfo/${fd##*/}" 2>/dev/null || echo "0 0")"
    t=$((t + a)) c=$((c + b))
  done
  echo "$t $c"
}
declare -A EFF BPF SAMPLES
# phase NAME: measures SECONDS_PER seconds of the workload; appends to EFF/BPF/SAMPLES of NAME.
phase() {
  local name=$1 m0 m1 p0 p1 r c ns n
  m0=$(mark) p0=$(prog_stats)
  sleep "$SECONDS_PER"
  m1=$(mark) p1=$(prog_stats)
  read -r _ r c <<<"$(awk -v a="$m0" -v b="$m1" 'BEGIN { split(a, x); split(b, y); print 0, y[2] - x[2], y[3] - x[3] }')"
  n=$(awk -v c="$c" -v f="$FREQ" 'BEGIN { printf "%.0f", c / 1e9 * f }')
  ns=$(awk -v a="$p0" -v b="$p1" -v n="$n" 'BEGIN { split(a, x); split(b, y); if (n > 0 && y[1] > x[1]) printf "%.0f", (y[1] - x[1]) / n; else print "n/a" }')
  EFF[$name]+="$(awk -v r="$r" -v c="$c" 'BEGIN { printf "%.1f", r / (c / 1e9) }') "
  BPF[$name]+="$ns "
  SAMPLES[$name]+="$n "
}
run_ember() { # run_ember NAME DIR
  local name=$1 dir=$2 pid
  "$dir/ember-relay" record --pid "$burn_pid" -F "$FREQ" -d "$((WARM + SECONDS_PER + 5))s" \
    --sampler "$dir/ember-sampler" --format folded -o "$tmp/$name-out" >"$tmp/$name.log" 2>&1 &
  pid=$!
  sleep "$WARM"
  kill -0 "$pid" 2>/dev/null || die "$name: ember-relay record exited: $(tail -n3 "$tmp/$name.log")"
  prog_pid=$(pgrep -x ember-sampler -P "$pid" | head -n1 || true)
  [ -n "$prog_pid" ] || die "$name: no ember-sampler under ember-relay record ($pid)"
  phase "$name"
  prog_pid=
  kill -INT "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
run_perf() {
  local pid
  perf record -F "$FREQ" -g -p "$burn_pid" -o "$tmp/perf.data" >"$tmp/perf.log" 2>&1 &
  pid=$!
  sleep 1
  phase perf
  kill -INT "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

log "workload $([ "$NOFP" = 1 ] && echo 'without' || echo 'with') frame pointers, pid $burn_pid; $ROUNDS rounds of $SECONDS_PER s per profiler"
phase none
for ((i = 1; i <= ROUNDS; i++)); do
  for b in "${builds[@]}"; do
    log "round $i: ${b%%=*}"
    run_ember "${b%%=*}" "${b#*=}"
  done
  if [ "$PERF" = 1 ]; then
    log "round $i: perf -g"
    run_perf
  fi
  log "round $i: none"
  phase none
done

e0=$(awk -v s="${EFF[none]}" 'BEGIN { n = split(s, x); for (i = 1; i <= n; i++) t += x[i]; print t / n }')
stat() { # stat "v1 v2 ...": "median [min-max]"
  awk -v s="$1" 'BEGIN { n = split(s, x); if (n == 0 || x[1] == "n/a") { print "n/a"; exit }
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (x[j] + 0 < x[i] + 0) { t = x[i]; x[i] = x[j]; x[j] = t }
    m = n % 2 ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2
    printf "%.2f [%.2f-%.2f]", m, x[1], x[n] }'
}
echo
echo "== per-sample cost, $(date -u '+%F %T') UTC, $FREQ Hz, workload $([ "$NOFP" = 1 ] && echo 'without' || echo 'with') frame pointers, $(nproc) CPUs =="
printf '%-14s %-26s %-26s %-10s\n' profiler bpf_ns/sample wl_us/sample samples/phase
names=()
for b in "${builds[@]}"; do names+=("${b%%=*}"); done
[ "$PERF" = 1 ] && names+=(perf)
for name in "${names[@]}"; do
  wl=$(awk -v s="${EFF[$name]}" -v e0="$e0" -v f="$FREQ" 'BEGIN { n = split(s, x); for (i = 1; i <= n; i++) printf "%.3f ", (1 - x[i] / e0) * 1e6 / f }')
  printf '%-14s %-26s %-26s %-10s\n' "$name" "$(stat "${BPF[$name]}")" "$(stat "$wl")" \
    "$(awk -v s="${SAMPLES[$name]}" 'BEGIN { n = split(s, x); for (i = 1; i <= n; i++) t += x[i]; printf "%.0f", t / n }')"
done
echo "no-profiler phases: $(stat "${EFF[none]}") rounds per workload CPU s; load average $(cut -d' ' -f1-3 /proc/loadavg)"
for b in "${builds[@]}"; do # whole stacks: the workload's samples whose stack reaches `worker`
  awk -v name="${b%%=*}" '{ n = $NF + 0; all += n; if (index($0, ";worker;") || $0 ~ /;worker /) ok += n }
    END { printf "%s: %.1f%% of %d samples with the whole stack (up to the thread entry worker)\n", name, all ? 100 * ok / all : 0, all }' \
    "$tmp/${b%%=*}-out/stacks.folded" 2>/dev/null || true
done
