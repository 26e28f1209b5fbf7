#!/usr/bin/env bash
# bench/scale.sh: how ember's cost grows with distinct stacks and with processes (node sizing).
# Run `bench/scale.sh --help` for what it measures and how.
set -euo pipefail
export LC_ALL=C

usage() {
  cat <<'EOF'
Usage: sudo bench/scale.sh [options]

Runs ember-relay (as nobody, `run` with stacks.folded written every interval) and a system-wide
ember-sampler against generated workloads, one case after the other, and prints one table of
the sampler's and the relay's CPU and memory per reporter interval:

  stacks cases  bench/distinct.c, one busy thread per CPU, each walk a path drawn from D distinct
                call paths (26 frames deep, _start to leaf): D distinct stacks. The interval is
                long enough for about 3 x D samples (at least 5 s, at most --max-interval), so
                nearly all D stacks are seen in each interval; the table shows how many were.
  procs cases   bench/procs.c: N idle processes (sleeping; with --wake-ms each wakes that often
                and burns 100 us, as daemons' timers do) plus --busy busy ones, each with stacks
                of its own (a recursion 8-23 deep whose functions follow from its index).

Each case runs one interval to warm up (tables compiled and loaded, files named), then measures
--intervals intervals. Columns, per interval unless said:
  samples        samples the relay received (sum of its `batch received` lines, measured ones)
  distinct       distinct stacks in the last measured window (lines of stacks.folded; window =
                 interval; folded stacks merge threads of one process): the workload's / all
                 (system-wide: whatever else runs on the host is profiled too)
  procs          processes the relay held at the last batch
  smp_cpu_ms     the sampler's CPU (user + sys, /proc/PID/stat) per interval, in ms
  bpf_ms         run time of the sampler's BPF programs per interval (kernel.bpf_stats_enabled;
                 charged to the interrupted tasks, not in smp_cpu_ms), in ms
  smp_rss        the sampler's VmRSS at the end / VmHWM (peak), MiB
  rly_cpu_ms     the relay's CPU per interval, in ms (all its threads)
  rly_rss        the relay's VmRSS at the end / VmHWM (peak), MiB
  lost           over the whole case: samples the sampler dropped (full: counts map full;
                 backlog), walked stacks it could not store (walked_full: the walked-stack map
                 was full, the sample kept its frame-pointer stack instead) and user stacks lost
                 to stack-map collisions (ustack_lost: the sample kept, its user frames not)
  map_MiB        kernel memory of the sampler's BPF maps (fdinfo memlock)

Options (each also settable through the environment variable in brackets):
  -F, --frequency HZ      ember-sampler --frequency                 [FREQ, default 4999]
  -s, --stacks LIST       distinct stack counts, comma separated    [STACKS, default 1000,10000,100000,1000000]
  -p, --procs LIST        idle process counts, comma separated      [PROCS, default 100,1000,10000]
      --busy N            busy processes beside the idle ones       [BUSY, default 50]
      --wake-ms MS        idle processes wake every MS ms (0: never) [WAKE_MS, default 0]
  -n, --intervals N       intervals measured per case               [INTERVALS, default 2]
      --max-interval S    longest reporter interval for a stacks case [MAX_INTERVAL, default 100]
      --procs-interval S  reporter interval of the procs cases      [PROCS_INTERVAL, default 5]
      --counts-map-size N ember-sampler --counts-map-size (default: the sampler's own, so its
                          losses show where the default is too small) [COUNTS_MAP_SIZE]
      --extra ARGS        more ember-sampler arguments              [SAMPLER_EXTRA]
  -b, --bin DIR           where ember-sampler and ember-relay are   [BIN_DIR, default
                          target/release if both are there, else target/debug]
  -k, --keep              keep the temporary directory (logs, outputs) [KEEP=1]
  -h, --help

Needs root and gcc. An empty --stacks or --procs skips those cases. A benchmark, not a test: it
prints what it saw (including losses) and exits non-zero only when ember did not start.
Example: sudo bench/scale.sh -s 1000,10000 -p 100,1000
EOF
}

FREQ=${FREQ:-4999} STACKS=${STACKS-1000,10000,100000,1000000} PROCS=${PROCS-100,1000,10000}
BUSY=${BUSY:-50} WAKE_MS=${WAKE_MS:-0} INTERVALS=${INTERVALS:-2} MAX_INTERVAL=${MAX_INTERVAL:-100}
PROCS_INTERVAL=${PROCS_INTERVAL:-5} COUNTS_MAP_SIZE=${COUNTS_MAP_SIZE:-} SAMPLER_EXTRA=${SAMPLER_EXTRA:-}
BIN_DIR=${BIN_DIR:-} KEEP=${KEEP:-0}
die() { printf 'scale.sh: error: %s\n' "$*" >&2; exit 1; }
log() { printf '[scale %s] %s\n' "$(date +%T)" "$*" >&2; }
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) usage; exit 0 ;;
    -F | --frequency) FREQ=${2:?}; shift 2 ;;
    -s | --stacks) STACKS=${2?}; shift 2 ;;
    -p | --procs) PROCS=${2?}; shift 2 ;;
    --busy) BUSY=${2:?}; shift 2 ;;
    --wake-ms) WAKE_MS=${2:?}; shift 2 ;;
    -n | --intervals) INTERVALS=${2:?}; shift 2 ;;
    --max-interval) MAX_INTERVAL=${2:?}; shift 2 ;;
    --procs-interval) PROCS_INTERVAL=${2:?}; shift 2 ;;
    --counts-map-size) COUNTS_MAP_SIZE=${2:?}; shift 2 ;;
    --extra) SAMPLER_EXTRA=${2:?}; shift 2 ;;
    -b | --bin) BIN_DIR=${2:?}; shift 2 ;;
    -k | --keep) KEEP=1; shift ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[ "$(id -u)" = 0 ] || die "needs root (eBPF): sudo $0"
command -v gcc >/dev/null || die "needs gcc (apt-get install gcc)"
bench_dir=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$bench_dir")
. "$bench_dir/lib/ember-bins.sh"
BIN_DIR=$(ember_bin_dir "$root" "$BIN_DIR") || exit 1
sampler_bin=$BIN_DIR/ember-sampler relay_bin=$BIN_DIR/ember-relay
cpus=$(nproc)
tck=$(getconf CLK_TCK)
nobody_uid=$(id -u nobody) nobody_gid=$(id -g nobody)

tmp=$(mktemp -d /tmp/ember-scale.XXXXXX)
chmod 755 "$tmp"
pids=()
old_stats=$(cat /proc/sys/kernel/bpf_stats_enabled)
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "$old_stats" >/proc/sys/kernel/bpf_stats_enabled
  if [ "$KEEP" = 1 ]; then log "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
echo 1 >/proc/sys/kernel/bpf_stats_enabled

cflags=(-O1 -g -fno-inline -fno-optimize-sibling-calls -fno-omit-frame-pointer)
gcc "${cflags[@]}" -pthread -o "$tmp/distinct" "$bench_dir/distinct.c"
gcc "${cflags[@]}" -o "$tmp/procs" "$bench_dir/procs.c"

cpu_ticks() { # utime + stime of PID, in clock ticks
  local stat f
  read -r stat <"/proc/$1/stat"
  read -r -a f <<<"${stat##*) }"
  echo $((f[11] + f[12]))
}
# shellcheck source=bench/lib/bpf-fdinfo.sh
. "$bench_dir/lib/bpf-fdinfo.sh"
bpf_ns() { bpf_fdinfo_sum "$1" prog run_time_ns; } # run time of PID's BPF programs, ns
map_mib() { echo $(($(bpf_fdinfo_sum "$1" map memlock) / 1048576)); }
mem_mib() { # "VmRSS/VmHWM" of PID in MiB
  awk '$1 == "VmRSS:" { r = $2 } $1 == "VmHWM:" { h = $2 } END { printf "%.0f/%.0f", r / 1024, h / 1024 }' "/proc/$1/status"
}
batches() { grep -c '"message":"batch received".*"part":0,' "$1" || true; }
json_last() { grep -F "\"message\":\"$2\"" "$1" | tail -n1 | grep -o "\"$3\":[0-9]*" | cut -d: -f2 || true; }
samples_since() { # samples_since LOG N: samples of the batch lines after the first N part-0 batches
  awk -v skip="$2" 'index($0, "\"message\":\"batch received\"") {
      if (index($0, "\"part\":0,")) n++
      if (n > skip) { i = index($0, "\"samples\":"); s += substr($0, i + 10) + 0 } }
    END { print s + 0 }' "$1"
}
wait_for() { # wait_for FILE PATTERN SECONDS PID
  local deadline=$((SECONDS + $3))
  until grep -qF "$2" "$1" 2>/dev/null; do
    kill -0 "$4" 2>/dev/null || die "$(basename "$1") exited: $(tail -n3 "$1")"
    [ $SECONDS -lt $deadline ] || die "no '$2' in $1 within $3 s"
    sleep 0.2
  done
}

printf '%-14s %5s %9s %15s %6s %10s %8s %9s %10s %9s %-56s %7s\n' case int_s samples distinct procs \
  smp_cpu_ms bpf_ms smp_rss rly_cpu_ms rly_rss lost map_MiB
rows=()

# measure NAME INTERVAL -- WORKLOAD...: one case (the workload is started first and stopped last).
measure() {
  local name=$1 interval=$2
  shift 3
  local dir=$tmp/$name
  mkdir -p "$dir/out"
  chmod 1777 "$dir"
  chown "$nobody_uid:$nobody_gid" "$dir/out"
  "$@" >"$dir/workload.out" 2>&1 &
  local wl=$!
  pids+=("$wl")
  if [[ $1 == */procs ]]; then wait_for "$dir/workload.out" '"started"' 120 "$wl"; fi
  setpriv --reuid="$nobody_uid" --regid="$nobody_gid" --clear-groups "$relay_bin" --log-format json \
    run --socket "$dir/sock" --window "${interval}s" --output-dir "$dir/out" >/dev/null 2>"$dir/relay.err" &
  local relay=$!
  pids+=("$relay")
  wait_for "$dir/relay.err" '"message":"listening for ember-sampler"' 30 "$relay"
  local args=(--log-format json --socket "$dir/sock" --relay-uid "$nobody_uid" --frequency "$FREQ"
    --reporter-interval "${interval}s")
  [ -z "$COUNTS_MAP_SIZE" ] || args+=(--counts-map-size "$COUNTS_MAP_SIZE")
  # shellcheck disable=SC2206 # extra arguments are words
  [ -z "$SAMPLER_EXTRA" ] || args+=($SAMPLER_EXTRA)
  "$sampler_bin" "${args[@]}" >/dev/null 2>"$dir/sampler.err" &
  local sampler=$!
  pids+=("$sampler")
  wait_for "$dir/sampler.err" '"message":"sampling"' 60 "$sampler"
  log "$name: interval ${interval}s, warming up"
  local deadline=$((SECONDS + 3 * interval + 60))
  until [ "$(batches "$dir/relay.err")" -ge 1 ]; do
    [ $SECONDS -lt $deadline ] || die "$name: no batch within $((3 * interval + 60)) s"
    sleep 0.2
  done
  local s0 r0 b0 windows distinct=0/0 w
  s0=$(cpu_ticks "$sampler") r0=$(cpu_ticks "$relay") b0=$(bpf_ns "$sampler")
  windows=$(grep -c '"message":"window complete' "$dir/relay.err" || true)
  log "$name: measuring $INTERVALS intervals"
  deadline=$((SECONDS + (INTERVALS + 2) * interval + 60))
  local seen=0 comm=${1##*/}
  # Until the measured batches are in and a window closed after the warm-up.
  until [ "$(batches "$dir/relay.err")" -ge $((1 + INTERVALS)) ] && [ "$seen" = 1 ]; do
    w=$(grep -c '"message":"window complete' "$dir/relay.err" || true)
    if [ "$w" -gt "$windows" ]; then
      windows=$w seen=1
      distinct="$(grep -c "^$comm;" "$dir/out/stacks.folded" || true)/$(wc -l <"$dir/out/stacks.folded")"
    fi
    [ $SECONDS -lt $deadline ] || die "$name: fewer than $INTERVALS batches in time"
    sleep 0.2
  done
  local s1 r1 b1 smem rmem maps
  s1=$(cpu_ticks "$sampler") r1=$(cpu_ticks "$relay") b1=$(bpf_ns "$sampler")
  smem=$(mem_mib "$sampler") rmem=$(mem_mib "$relay") maps=$(map_mib "$sampler")
  local samples procs full backlog ufull ulost
  samples=$(samples_since "$dir/relay.err" 1)
  procs=$(json_last "$dir/relay.err" "batch received" processes)
  full=$(json_last "$dir/relay.err" "batch received" counts_full)
  backlog=$(json_last "$dir/relay.err" "batch received" backlog_dropped_samples)
  ufull=$(grep -F '"message":"batch received"' "$dir/relay.err" | tail -n1 | grep -o 'unwind_map_full=[0-9]*' | cut -d= -f2 || true)
  ulost=$(json_last "$dir/relay.err" "batch received" user_stack_lost)
  local row
  row=$(printf '%-14s %5s %9s %15s %6s %10s %8s %9s %10s %9s %-56s %7s' "$name" "$interval" \
    "$((samples / INTERVALS))" "$distinct" "${procs:-?}" \
    "$(((s1 - s0) * 1000 / tck / INTERVALS))" "$(((b1 - b0) / 1000000 / INTERVALS))" "$smem" \
    "$(((r1 - r0) * 1000 / tck / INTERVALS))" "$rmem" \
    "full=${full:-0} backlog=${backlog:-0} walked_full=${ufull:-0} ustack_lost=${ulost:-0}" "$maps")
  echo "$row"
  rows+=("$row")
  kill -INT "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  kill -TERM "$relay" "$wl" 2>/dev/null || true
  wait "$relay" "$wl" 2>/dev/null || true
}

IFS=, read -r -a stack_cases <<<"$STACKS"
for d in "${stack_cases[@]}"; do
  [ -n "$d" ] || continue
  interval=$(((3 * d + FREQ * cpus - 1) / (FREQ * cpus)))
  ((interval < 5)) && interval=5
  ((interval > MAX_INTERVAL)) && interval=$MAX_INTERVAL
  secs=$(((INTERVALS + 4) * interval + 120))
  measure "stacks-$d" "$interval" -- "$tmp/distinct" "$cpus" "$secs" "$secs" "$d"
done
IFS=, read -r -a proc_cases <<<"$PROCS"
for n in "${proc_cases[@]}"; do
  [ -n "$n" ] || continue
  secs=$(((INTERVALS + 4) * PROCS_INTERVAL + 120))
  measure "procs-$n+$BUSY" "$PROCS_INTERVAL" -- "$tmp/procs" "$n" "$BUSY" "$secs" "$WAKE_MS"
done
echo
echo "at $FREQ Hz on $cpus CPUs; load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
