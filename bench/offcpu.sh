#!/usr/bin/env bash
# bench/offcpu.sh: the cost of off-CPU profiling, side by side with a bpftrace peer, in one run.
# Run `bench/offcpu.sh --help` for what it measures and how.
set -euo pipefail
export LC_ALL=C

usage() {
  cat <<'EOF'
Usage: sudo bench/offcpu.sh [options]

Measures what recording off-CPU time costs while a workload switches context tens of thousands
of times a second: tests/workloads/offcpu.c in its ping-pong mode (two threads passing a byte
over two pipes, ping burning BURN_NS of CPU per round trip), started once and kept running.
Phases, one after the other, each DURATION seconds of steady state (after a 3 s warm-up):

  baseline        no profiler
  ember           ember-relay record (whole machine, CPU samples only)
  ember-offcpu    ember-relay record --off-cpu (whole machine)
  bpftrace        a bpftrace script doing the same off-CPU work on tracepoint:sched:sched_switch:
                  stamp + kernel and user stack (frame pointers) at switch-out, the wait summed
                  by stacks at switch-in (bcc's offcputime cannot run here: it needs kernel
                  headers, which this kernel has none of; bpftrace's kfunc probes are refused)

Columns:
  switches/s      voluntary context switches of the workload's threads per second
                  (/proc/PID/task/*/status): the event rate, and the workload's throughput
  cpu_s/s         CPU seconds per second of the profiler's processes (user+sys, /proc/PID/stat;
                  ember: relay + sampler)
  bpf_s/s         run time of the profiler's BPF programs per second (/proc/PID/fdinfo,
                  kernel.bpf_stats_enabled=1); charged to the tasks they interrupt, not in cpu_s/s
  switch_prog_ns  mean run time of the sched_switch program per run (ember-offcpu, bpftrace):
                  the kernel time each context switch costs
  runs/s          runs of that program per second (every context switch of the machine)

Options:
  -d, --duration SECONDS   steady-state seconds per phase        [DURATION, default 20]
      --burn NS            CPU ns ping burns per round trip      [BURN_NS, default 80000]
  -k, --keep               keep the temporary directory          [KEEP=1]
  -h, --help               show this help

Needs root, gcc, bpftrace (tracefs is mounted for it at /sys/kernel/tracing if it is not) and
target/release/ember-{relay,sampler} (target/debug is used, with a warning, when they are
missing). Example: sudo bench/offcpu.sh -d 10
EOF
}

DURATION=${DURATION:-20}
BURN_NS=${BURN_NS:-80000}
KEEP=${KEEP:-0}
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    -d | --duration) DURATION=${2:?"$1 needs a value"}; shift 2 ;;
    --burn) BURN_NS=${2:?"$1 needs a value"}; shift 2 ;;
    -k | --keep) KEEP=1; shift ;;
    *) printf 'offcpu.sh: unknown option %s (see --help)\n' "$1" >&2; exit 2 ;;
  esac
done

die() { printf 'offcpu.sh: error: %s\n' "$*" >&2; exit 1; }
log() { printf '[offcpu %s] %s\n' "$(date +%T)" "$*" >&2; }
[ "$(id -u)" = 0 ] || die "needs root (eBPF): run it with sudo"
command -v gcc >/dev/null || die "gcc is missing (apt-get install gcc)"
command -v bpftrace >/dev/null || die "bpftrace is missing (apt-get install bpftrace)"

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=$ROOT/target/release
if [ ! -x "$BIN/ember-relay" ] || [ ! -x "$BIN/ember-sampler" ]; then
  BIN=$ROOT/target/debug
  log "WARNING: no release build; using $BIN (cargo build --release for honest relay figures)"
fi
[ -x "$BIN/ember-relay" ] || die "no ember-relay in $BIN: cargo build first"

TMP=$(mktemp -d /tmp/ember-offcpu-bench.XXXXXX)
chmod 755 "$TMP"
WORKLOAD_PID=
PROFILER_PID=
STATS_BEFORE=$(cat /proc/sys/kernel/bpf_stats_enabled)
cleanup() {
  [ -n "$PROFILER_PID" ] && kill "$PROFILER_PID" 2>/dev/null || true
  [ -n "$WORKLOAD_PID" ] && kill "$WORKLOAD_PID" 2>/dev/null || true
  echo "$STATS_BEFORE" > /proc/sys/kernel/bpf_stats_enabled
  if [ "$KEEP" = 1 ]; then log "kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
echo 1 > /proc/sys/kernel/bpf_stats_enabled
if [ ! -e /sys/kernel/tracing/events ]; then
  mount -t tracefs nodev /sys/kernel/tracing || die "cannot mount tracefs for bpftrace"
fi

gcc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls -pthread \
  -o "$TMP/offcpu" "$ROOT/tests/workloads/offcpu.c"
mkfifo "$TMP/go"
"$TMP/offcpu" 100000 pingpong "$BURN_NS" < "$TMP/go" > /dev/null &
WORKLOAD_PID=$!
exec 3> "$TMP/go"
echo go >&3

# The workload's voluntary context switches so far (all its threads).
switches() {
  awk '$1 == "voluntary_ctxt_switches:" { s += $2 } END { print s + 0 }' \
    /proc/"$WORKLOAD_PID"/task/*/status
}
# CPU ticks (user+sys) of the processes named.
ticks() {
  local total=0 pid stat
  for pid in "$@"; do
    stat=$(cat /proc/"$pid"/stat 2>/dev/null) || continue
    stat=${stat##*) }
    read -r -a f <<< "$stat"
    total=$((total + f[11] + f[12]))
  done
  echo "$total"
}
# "run_time_ns run_cnt" of the BPF programs of the processes named whose prog_type is $1
# (26: tracing, tp_btf; 5: tracepoint; 7: perf_event).
bpf_runs() {
  local type=$1 time=0 count=0 pid fd ptype rt rc key value
  shift
  for pid in "$@"; do
    for fd in /proc/"$pid"/fdinfo/*; do
      ptype= rt=0 rc=0
      while read -r key value; do
        case $key in
          prog_type:) ptype=$value ;;
          run_time_ns:) rt=$value ;;
          run_cnt:) rc=$value ;;
        esac
      done < "$fd" 2>/dev/null || true
      if [ -n "$ptype" ] && { [ "$type" = all ] || [ "$ptype" = "$type" ]; }; then
        time=$((time + rt)); count=$((count + rc))
      fi
    done
  done
  echo "$time $count"
}

TICK=$(getconf CLK_TCK)
RESULTS=()
# phase NAME PROG_TYPE PIDS_FUNCTION: measures DURATION seconds of steady state.
measure() {
  local name=$1 type=$2 pids=$3
  sleep 3
  local p; p=$($pids)
  local s0 t0 b0 a0 s1 t1 b1 a1
  s0=$(switches); t0=$(ticks $p); read -r b0 _ <<< "$(bpf_runs all $p)"
  read -r a0 n0 <<< "$(bpf_runs "$type" $p)"
  sleep "$DURATION"
  s1=$(switches); t1=$(ticks $p); read -r b1 _ <<< "$(bpf_runs all $p)"
  read -r a1 n1 <<< "$(bpf_runs "$type" $p)"
  local runs=$((n1 - n0))
  RESULTS+=("$(awk -v n="$name" -v s=$((s1 - s0)) -v t=$((t1 - t0)) -v b=$((b1 - b0)) \
    -v a=$((a1 - a0)) -v r="$runs" -v d="$DURATION" -v hz="$TICK" -v typ="$type" 'BEGIN {
      per = (r > 0 && typ != "none") ? sprintf("%.0f", a / r) : "-";
      rs = (typ != "none") ? sprintf("%.0f", r / d) : "-";
      printf "%-14s %11.0f %9.4f %9.4f %15s %9s\n", n, s / d, t / hz / d, b / 1e9 / d, per, rs }')")
}
none() { :; }
ember_pids() { echo "$PROFILER_PID" $(pgrep -P "$PROFILER_PID" -x ember-sampler); }
bpftrace_pids() { echo "$PROFILER_PID"; }

log "baseline: no profiler"
measure baseline none none

for phase in ember ember-offcpu; do
  flags=()
  [ "$phase" = ember-offcpu ] && flags=(--off-cpu)
  log "$phase: ember-relay record ${flags[*]:-}"
  "$BIN/ember-relay" record --sampler "$BIN/ember-sampler" --duration $((DURATION + 30))s \
    --output "$TMP/$phase" --format folded "${flags[@]}" > "$TMP/$phase.out" 2> "$TMP/$phase.log" &
  PROFILER_PID=$!
  measure "$phase" 26 ember_pids
  kill -INT "$PROFILER_PID"; wait "$PROFILER_PID" || true
  PROFILER_PID=
done

log "bpftrace: tracepoint:sched:sched_switch off-CPU stacks"
cat > "$TMP/offcpu.bt" <<'EOF'
tracepoint:sched:sched_switch
{
  if (args->prev_state != 0 && args->prev_pid != 0) {
    @start[args->prev_pid] = nsecs;
    @kst[args->prev_pid] = kstack;
    @ust[args->prev_pid] = ustack;
  }
  $s = @start[args->next_pid];
  if ($s != 0) {
    @off[@kst[args->next_pid], @ust[args->next_pid]] = sum(nsecs - $s);
    delete(@start[args->next_pid]);
    delete(@kst[args->next_pid]);
    delete(@ust[args->next_pid]);
  }
}
END { clear(@start); clear(@kst); clear(@ust); }
EOF
BPFTRACE_MAP_KEYS_MAX=65536 bpftrace "$TMP/offcpu.bt" > "$TMP/bpftrace.out" 2> "$TMP/bpftrace.log" &
PROFILER_PID=$!
measure bpftrace 5 bpftrace_pids
kill -INT "$PROFILER_PID"; wait "$PROFILER_PID" || true
PROFILER_PID=

printf '\n%s, %s CPUs, %s s per phase, ping burns %s ns per round trip (%s)\n' \
  "$(uname -r)" "$(nproc)" "$DURATION" "$BURN_NS" "$BIN"
printf '%-14s %11s %9s %9s %15s %9s\n' phase switches/s cpu_s/s bpf_s/s switch_prog_ns runs/s
printf '%s\n' "${RESULTS[@]}"
grep -h "^off-CPU:" "$TMP/ember-offcpu.out" || true
