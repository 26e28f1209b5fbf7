#!/usr/bin/env bash
# bench/overhead.sh: profiler overhead side by side, in one run, on a CPU-busy machine.
# Run `bench/overhead.sh --help` for what it measures and how.
set -euo pipefail
export LC_ALL=C

usage() {
  cat <<'EOF'
Usage: sudo bench/overhead.sh [options]

Measures the overhead of system-wide CPU profilers while a CPU-bound workload (bench/burn.c, one
busy thread per CPU, 12-20 frame deep stacks) keeps every CPU busy. Profilers run one after the
other, each for DURATION seconds at FREQ Hz on every CPU, with the same workload running:

  baseline       no profiler (workload throughput reference; skip with --baseline 0)
  ember          ember-relay run (as user nobody) + ember-sampler --socket ... (as root)
  ember-before   the same with the binaries of --before DIR (an A/B of two ember builds)
  perf           perf record -F FREQ -a -g -o TMP/perf.data -- sleep DURATION
  perf-dwarf     perf record -F FREQ -a --call-graph dwarf -o TMP/perf-dwarf.data -- sleep DURATION
                 (copies 8 KiB of stack per sample: about 80 MiB/s of perf.data at 4999 Hz on 2 CPUs,
                 so keep DURATION short with it)
  bpftrace       bpftrace -e 'profile:hz:FREQ { @[kstack, ustack, comm] = count(); }'
                 (with BPFTRACE_MAP_KEYS_MAX=65536 unless set: the default 4096 keys overflow
                 within a minute on a busy machine and then new stacks' samples are dropped)

For each profiler process it reports
  cpu_s/s       CPU seconds (user+sys, /proc/PID/stat) per wall second while it was sampling
                (steady state: excludes start-up and shutdown)
  bpf_s/s       run time of its BPF programs per wall second (ember-sampler, bpftrace), from
                /proc/PID/fdinfo run_time_ns with kernel.bpf_stats_enabled=1. The kernel charges it
                to whichever task was interrupted, so it is NOT part of cpu_s/s
  cpu_s/s_all   all CPU seconds the process used from exec to exit (incl. start-up such as BPF
                load or bpftrace's LLVM compile, and shutdown such as perf's build-id pass or
                bpftrace printing its map), divided by the seconds sampled   (/usr/bin/time)
  peak_rss_MiB  peak resident set size over its whole life (/usr/bin/time %M, i.e. ru_maxrss)
  samples/s     samples collected per second sampled (ember: sum of "samples" in the relay's
                "batch received" log lines; perf: SAMPLE events of `perf report --stats`;
                bpftrace: sum of the map's counts). Expect about FREQ x CPUs when CPUs are busy.
  workload      the workload's throughput (rounds/s) during that phase, and its change against
                the baseline phase. On a shared machine this is noisy; treat small changes as 0.
  us/sample     the profiler's own cost per sample in microseconds: (cpu_s/s + bpf_s/s) / samples/s.
                perf's in-kernel work is not measurable per process, so its figure is user space and
                its own syscalls only; see wl_us/sample
  wl_us/sample  what each sample cost the workload, in CPU microseconds: the drop of the workload's
                rounds per CPU s against the baseline phase, times the CPUs it got, per sample. This
                catches in-kernel costs charged to the sampled tasks (interrupts, BPF, perf's stack
                copies); it is noisy at low frequencies (use -F 4999 to measure it)
  post_cpu_s    CPU s of the post-processing a profile needs before anyone can read it: `perf script
                --no-inline` for perf (ember symbolizes live, inside its cpu_s/s)
  allin_us/sample  everything per sample over the whole phase: the process's CPU s from exec to
                exit, its BPF run time and the post-processing, divided by the samples
  full_stack%   of the workload's samples (stacks holding one of burn.c's functions), the share that
                reaches the thread's entry function `worker`, i.e. the whole chain from the thread
                entry to the leaf. ember: from stacks.folded of the relay's --output-dir (switched on
                for this); perf: from `perf script`, whose run time is printed as post-processing.
                bpftrace: not computed (-)
  map_MiB       memory of the profiler's BPF maps (sum of memlock in /proc/PID/fdinfo of its maps)
  syscalls      (in the notes) the system calls each ember process made in its window (perf stat
                -e raw_syscalls:sys_enter -p PID, which adds a little to that process's CPU, alike
                for ember and ember-before), per churn start, and the pids the whole host created

Options (each also settable through the environment variable in brackets):
  -d, --duration SECONDS    sampling time per profiler             [DURATION, default 60]
  -F, --frequency HZ        sampling frequency per CPU             [FREQ, default 97]
  -b, --baseline SECONDS    no-profiler phase; 0 skips it          [BASELINE, default 10]
  -i, --interval DURATION   ember-sampler --reporter-interval      [INTERVAL, default 5s]
  -p, --profilers LIST      comma-separated subset of ember,ember-before,perf,bpftrace, in order
                                                                   [PROFILERS, default all]
  -t, --threads N           workload threads                       [THREADS, default nproc]
      --nofp                build the workload without frame pointers (gcc -O2
                            -fomit-frame-pointer): the case where only DWARF unwinding
                            recovers whole stacks                    [NOFP=1]
      --unwind MODE         pass --unwind MODE (fp or dwarf) to ember-sampler and ember-relay
                            (default: the binaries' own default)    [UNWIND]
  -c, --churn RATE          also start RATE short-lived processes per second (bench/churn.c,
                            each burning --churn-ms of CPU) throughout the run, baseline
                            included: the cost of process start-up tracking [CHURN, default 0]
      --churn-ms MS         CPU milliseconds each churn process burns [CHURN_MS, default 5]
      --relay-output        accepted for compatibility: ember-relay always gets --output-dir now
                            (full_stack% is computed from its stacks.folded, written when the
                            relay stops)
      --relay-otlp          also export over OTLP/HTTP from ember-relay, to a local sink that
                            accepts every request (bench/otlp_sink.py) [RELAY_OTLP=1]
  -w, --window DURATION     ember-relay run --window               [WINDOW, default 10m]
      --before DIR          a second ember build to compare with, in the same run: DIR holds its
                            ember-sampler and ember-relay; add the profiler `ember-before` to
                            --profilers (e.g. -p ember-before,ember) [BEFORE_DIR]
      --no-bpf-stats        do not switch kernel.bpf_stats_enabled on for the run (it is needed for
                            the bpf_s/s column; the previous value is restored on exit) [BPF_STATS=0]
      --build               run the cargo build even if the binaries exist (it is a no-op when
                            they are up to date; without it, stale binaries only get a warning)
                                                                   [BUILD=1]
  -k, --keep                keep the temporary directory with all logs and data   [KEEP=1]
  -h, --help                show this help

Needs root (eBPF, perf -a), gcc and /usr/bin/time. Builds target/release/ember-{sampler,relay}
with cargo if either is missing (or with --build). Everything it starts is stopped on exit, also on Ctrl-C.
Example: sudo DURATION=10 bench/overhead.sh      sudo bench/overhead.sh -d 30 -F 199 -p ember,perf
EOF
}

DURATION=${DURATION:-60}
FREQ=${FREQ:-97}
BASELINE=${BASELINE:-10}
INTERVAL=${INTERVAL:-5s}
PROFILERS=${PROFILERS:-ember,perf,bpftrace}
THREADS=${THREADS:-$(nproc)}
NOFP=${NOFP:-0}
UNWIND=${UNWIND:-}
CHURN=${CHURN:-0}
CHURN_MS=${CHURN_MS:-5}
RELAY_OUTPUT=${RELAY_OUTPUT:-0}
RELAY_OTLP=${RELAY_OTLP:-0}
WINDOW=${WINDOW:-10m}
BEFORE_DIR=${BEFORE_DIR:-}
KEEP=${KEEP:-0}
BUILD=${BUILD:-0}
BPF_STATS=${BPF_STATS:-1}
# bpftrace's maps hold 4096 keys by default; a busy machine has more distinct (kstack, ustack, comm)
# in a minute, and samples of new stacks are then dropped. Raised so that it keeps every sample.
BT_KEYS=${BPFTRACE_MAP_KEYS_MAX:-65536}

die() { printf 'overhead.sh: error: %s\n' "$*" >&2; exit 1; }
log() { printf '[overhead %s] %s\n' "$(date +%T)" "$*" >&2; }

while [ $# -gt 0 ]; do
  arg=$1
  if [[ $arg == --*=* ]]; then # --name=value -> --name value
    shift
    set -- "${arg%%=*}" "${arg#*=}" "$@"
    arg=$1
  fi
  case $arg in
    -h | --help) usage; exit 0 ;;
    -d | --duration) DURATION=${2:?"$arg needs a value"}; shift 2 ;;
    -F | --freq | --frequency) FREQ=${2:?"$arg needs a value"}; shift 2 ;;
    -b | --baseline) BASELINE=${2:?"$arg needs a value"}; shift 2 ;;
    -i | --interval) INTERVAL=${2:?"$arg needs a value"}; shift 2 ;;
    -p | --profilers) PROFILERS=${2:?"$arg needs a value"}; shift 2 ;;
    -t | --threads) THREADS=${2:?"$arg needs a value"}; shift 2 ;;
    --nofp) NOFP=1; shift ;;
    --unwind) UNWIND=${2:?"$arg needs a value"}; shift 2 ;;
    -c | --churn) CHURN=${2:?"$arg needs a value"}; shift 2 ;;
    --churn-ms) CHURN_MS=${2:?"$arg needs a value"}; shift 2 ;;
    --relay-output) RELAY_OUTPUT=1; shift ;;
    --relay-otlp) RELAY_OTLP=1; shift ;;
    -w | --window) WINDOW=${2:?"$arg needs a value"}; shift 2 ;;
    --before) BEFORE_DIR=${2:?"$arg needs a value"}; shift 2 ;;
    -k | --keep) KEEP=1; shift ;;
    --build) BUILD=1; shift ;;
    --no-bpf-stats) BPF_STATS=0; shift ;;
    *) printf 'overhead.sh: unknown argument: %s\n\n' "$arg" >&2; usage >&2; exit 2 ;;
  esac
done

[[ $DURATION =~ ^[1-9][0-9]*$ ]] || die "DURATION must be a whole number of seconds >= 1, got '$DURATION'"
[[ $FREQ =~ ^[1-9][0-9]*$ ]] && [ "$FREQ" -le 10000 ] || die "FREQ must be 1-10000 Hz, got '$FREQ'"
[[ $BASELINE =~ ^[0-9]+$ ]] || die "BASELINE must be a whole number of seconds, got '$BASELINE'"
[[ $THREADS =~ ^[1-9][0-9]*$ ]] && [ "$THREADS" -le 256 ] || die "THREADS must be 1-256, got '$THREADS'"
[[ $CHURN =~ ^[0-9]+$ ]] && [ "$CHURN" -le 1000 ] || die "CHURN must be 0-1000 processes per second, got '$CHURN'"
[[ $CHURN_MS =~ ^[1-9][0-9]*$ ]] || die "CHURN_MS must be a whole number of milliseconds >= 1, got '$CHURN_MS'"
[ -z "$UNWIND" ] || [ "$UNWIND" = fp ] || [ "$UNWIND" = dwarf ] || die "--unwind must be fp or dwarf, got '$UNWIND'"
[[ $INTERVAL =~ ^[0-9.]+(ms|s|m)?$ ]] || die "INTERVAL must look like 5s, 500ms or 1m, got '$INTERVAL'"
IFS=, read -r -a PROFILER_LIST <<<"$PROFILERS"
for p in "${PROFILER_LIST[@]}"; do
  case $p in ember | perf | perf-dwarf | bpftrace) ;;
    ember-before)
      [ -n "$BEFORE_DIR" ] || die "profiler ember-before needs --before DIR (the other build's binaries)"
      [ -x "$BEFORE_DIR/ember-sampler" ] && [ -x "$BEFORE_DIR/ember-relay" ] ||
        die "--before $BEFORE_DIR must hold executable ember-sampler and ember-relay"
      ;;
    *) die "unknown profiler '$p' in --profilers (use ember,ember-before,perf,perf-dwarf,bpftrace)" ;;
  esac
done
[[ $WINDOW =~ ^[0-9.]+(ms|s|m|h)?$ ]] || die "WINDOW must look like 10m, 30s or 1h, got '$WINDOW'"

[ "$(id -u)" -eq 0 ] || die "run as root (eBPF and perf -a need it): sudo $0 $*"
[ -x /usr/bin/time ] || die "/usr/bin/time (GNU time) is required: apt-get install time"
command -v gcc >/dev/null || die "gcc is required to build the workload (bench/burn.c)"
for tool in setpriv timeout pgrep awk; do
  command -v "$tool" >/dev/null || die "$tool is required (util-linux, coreutils, procps, awk)"
done

bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench_dir/.." && pwd)
sampler_bin=$root/target/release/ember-sampler
relay_bin=$root/target/release/ember-relay
nobody_uid=65534
nobody_gid=65534
clk_tck=$(getconf CLK_TCK)
# The steady-state window of each profiler starts SETTLE s after it is ready (start-up work such as
# attaching is done) and ends DURATION s after it became ready, when the script stops it.
SETTLE=1
STEADY=$((DURATION > 2 ? DURATION - SETTLE : DURATION))
ncpu=$(nproc)

# ---------------------------------------------------------------------------------------------
# Process bookkeeping and cleanup.

WRAPPERS=()   # /usr/bin/time processes (children of this shell)
TARGETS=()    # the measured processes (their descendants)
WORKLOAD_PID=
CHURN_PID=
tmp=
BPF_STATS_ON=0
BPF_STATS_RESTORE=0

# The readers below use bash builtins only, no command substitution: while a profiler runs, every
# process this script starts (an awk, a cat, a subshell) is one more process for the profiler to
# notice, describe and symbolize. The sampling loop started about 26 a second before.

# read_status PID: sets ST_STATE, ST_HWM (VmHWM, KiB) and ST_RSS ("RssAnon=x RssFile=y", MiB).
# Fails if PID is gone.
read_status() {
  local key value rest
  ST_STATE='' ST_HWM='' ST_RSS=''
  [ -r "/proc/$1/status" ] || return 1
  while read -r key value rest; do
    case $key in
      State:) ST_STATE=$value ;;
      VmHWM:) ST_HWM=$value ;;
      RssAnon: | RssFile:)
        ST_RSS+="${ST_RSS:+ }${key%:}=$((value / 1024)).$((value % 1024 * 10 / 1024))" ;;
    esac
  done 2>/dev/null <"/proc/$1/status" || true
  [ -n "$ST_STATE" ]
}

alive() { # alive PID: exists and is not a zombie
  read_status "$1" && [ "$ST_STATE" != Z ] && [ "$ST_STATE" != X ]
}

wait_gone() { # wait_gone SECONDS PID...: true once none of the PIDs is alive
  local deadline=$((SECONDS + $1)) pid any
  shift
  while :; do
    any=0
    for pid in "$@"; do alive "$pid" && any=1; done
    [ $any -eq 0 ] && return 0
    [ $SECONDS -ge $deadline ] && return 1
    sleep 0.1
  done
}

cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  local pid left=() kids
  for pid in "${TARGETS[@]}"; do
    if alive "$pid"; then
      kids=$(pgrep -P "$pid" 2>/dev/null)
      left+=("$pid" $kids)
      kill -INT "$pid" 2>/dev/null
    fi
  done
  if [ ${#left[@]} -gt 0 ]; then
    log "cleanup: stopping ${#left[@]} leftover process(es): ${left[*]}"
    wait_gone 10 "${left[@]}" || for pid in "${left[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  fi
  for pid in "${WRAPPERS[@]}"; do
    alive "$pid" && kill -TERM "$pid" 2>/dev/null
  done
  if [ -n "$CHURN_PID" ] && alive "$CHURN_PID"; then
    kill -TERM "$CHURN_PID" 2>/dev/null
    wait_gone 5 "$CHURN_PID" || kill -KILL "$CHURN_PID" 2>/dev/null
  fi
  if [ -n "$WORKLOAD_PID" ] && alive "$WORKLOAD_PID"; then
    kill -TERM "$WORKLOAD_PID" 2>/dev/null
    wait_gone 5 "$WORKLOAD_PID" || kill -KILL "$WORKLOAD_PID" 2>/dev/null
  fi
  wait 2>/dev/null
  if [ "$BPF_STATS_RESTORE" = 1 ]; then
    echo 0 >/proc/sys/kernel/bpf_stats_enabled 2>/dev/null
  fi
  if [ -n "$tmp" ] && [ -d "$tmp" ]; then
    if [ "$KEEP" = 1 ] || [ $rc -ne 0 ]; then
      log "logs and data kept in $tmp"
    else
      rm -rf "$tmp"
    fi
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# launch NAME DEPTH CMD...: starts CMD under /usr/bin/time (stdout/stderr to $tmp/NAME.out/.err,
# rusage to $tmp/NAME.time) and sets LAUNCHED_PID to the measured process, DEPTH generations below
# the time process (1: CMD itself; 2: the child of a `timeout` wrapper).
launch() {
  local name=$1 depth=$2
  shift 2
  /usr/bin/time -o "$tmp/$name.time" -f '%e %U %S %M' "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" &
  local pid=$! level child i
  WRAPPERS+=("$pid")
  for ((level = 0; level < depth; level++)); do
    child=
    for ((i = 0; i < 100; i++)); do
      child=$(pgrep -P "$pid" | head -n1) && [ -n "$child" ] && break
      alive "$pid" || break
      sleep 0.05
    done
    [ -n "$child" ] || die "$name did not start; see $tmp/$name.err: $(tail -n3 "$tmp/$name.err" 2>/dev/null)"
    pid=$child
  done
  LAUNCHED_PID=$pid
  TARGETS+=("$pid")
}

# wait_ready NAME FILE PATTERN SECONDS PID: waits for PATTERN (fixed string) in FILE.
wait_ready() {
  local name=$1 file=$2 pattern=$3 limit=$4 pid=$5
  local deadline=$((SECONDS + limit))
  until grep -qF -- "$pattern" "$file" 2>/dev/null; do
    alive "$pid" || die "$name exited during start-up; last lines of its log:
$(tail -n5 "$tmp/$name.err" "$tmp/$name.out" 2>/dev/null)"
    [ $SECONDS -lt $deadline ] || die "$name not ready after ${limit}s (no '$pattern' in $file)"
    sleep 0.05
  done
}

# read_cpu PID: sets CPU_READING to "<ticks> <ns> <tids>": utime+stime+cutime+cstime in clock
# ticks from /proc/PID/stat (includes exited threads, 10 ms resolution), the sum of the live
# threads' sum_exec_runtime in ns from /proc/PID/task/*/schedstat, and those threads' ids.
# Fails if PID is gone.
read_cpu() {
  local stat='' fields f ns=0 v rest tids=""
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  [ -n "$stat" ] || return 1
  read -r -a fields <<<"${stat##*) }" # fields[0] is field 3 (state)
  for f in /proc/"$1"/task/*/schedstat; do
    { read -r v rest <"$f"; } 2>/dev/null || continue
    ns=$((ns + v))
    f=${f%/schedstat}
    tids+=${f##*/},
  done
  CPU_READING="$((fields[11] + fields[12] + fields[13] + fields[14])) $ns ${tids:-none}"
}

# cpu_delta START END: CPU seconds between two CPU_READINGs: the ns sum when the same threads were
# alive at both, else the tick count (a thread that exited took its ns with it).
cpu_delta() {
  awk -v a="$1" -v b="$2" -v hz="$clk_tck" 'BEGIN {
    split(a, x, " "); split(b, y, " ");
    if (x[3] == y[3] && x[3] != "none") printf "%.6f", (y[2] - x[2]) / 1e9;
    else printf "%.6f", (y[1] - x[1]) / hz }'
}

workload_mark() { # "<monotonic ns> <rounds> <workload CPU ns>": the workload's latest report
  tail -n1 "$tmp/burn.out"
}

calc() { awk "BEGIN { printf \"$1\", $2 }"; }

json_sum() { # json_sum FILE MESSAGE FIELD: sum of numeric FIELD over the JSON log lines of MESSAGE
  awk -v msg="\"message\":\"$2\"" -v key="\"$3\":" '
    index($0, msg) { i = index($0, key); if (i) s += substr($0, i + length(key)) + 0 }
    END { print s + 0 }' "$1" 2>/dev/null || echo 0
}

json_last() { # json_last FILE MESSAGE FIELD: FIELD of the last line of MESSAGE (empty if none)
  awk -v msg="\"message\":\"$2\"" -v key="\"$3\":" '
    index($0, msg) { i = index($0, key); if (i) { v = substr($0, i + length(key)) + 0; found = 1 } }
    END { if (found) print v }' "$1" 2>/dev/null || true
}

# ---------------------------------------------------------------------------------------------
# Measurement window: samples /proc of every "LABEL:PID" every 0.5 s for DURATION seconds (or until
# the process exits), keeping the last reading. Results go to the W_* arrays, keyed by LABEL.

declare -A W_CPU W_SECS W_HWM W_GONE W_BPF_NS W_BPF_CNT T_ALL T_WALL T_RSS SAMPLES SAMPLE_SECS NOTE PHASE_RATE
declare -A OTHERS PHASE_EFF PHASE_SHARE W_RSS MAP_KIB FULL POST_CPU SYSCALLS
declare -A START_TICKS LAST_TICKS LAST_T START_T BPF_FDS START_BPF LAST_BPF

other_profilers() { # profilers running on the machine that this script did not start: "comm(pid) ..."
  local pid mine
  for pid in $(for name in ember-sampler ember-relay perf bpftrace; do pgrep -x "$name"; done || true); do
    for mine in "${TARGETS[@]}"; do [ "$pid" = "$mine" ] && continue 2; done
    printf '%s(%s) ' "$(cat "/proc/$pid/comm" 2>/dev/null)" "$pid"
  done
}

bpf_prog_fds() { # file descriptor numbers of PID that are BPF programs
  local fd
  for fd in /proc/"$1"/fd/*; do
    [ "$(readlink "$fd" 2>/dev/null)" = anon_inode:bpf-prog ] && echo "${fd##*/}"
  done
  return 0
}

# shellcheck source=bench/lib/bpf-fdinfo.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/bpf-fdinfo.sh"
# bpf_map_kib PID: KiB of memory of PID's BPF maps (sum of fdinfo memlock)
bpf_map_kib() { echo $(($(bpf_fdinfo_sum "$1" map memlock) / 1024)); }

# The workload's own functions (bench/burn.c): a sample whose stack holds one of them is the
# workload's; it is whole when it also holds the thread entry `worker`.
BURN_FUNCS='^(leaf_mix|leaf_hash|leaf_sum|depth_walk|chain_[a-h]|burn_round|worker)$'

full_stack_folded() { # full_stack_folded FILE: "<whole> <workload samples>" of a stacks.folded
  [ -s "$1" ] || { echo "0 0"; return; }
  awk -v re="$BURN_FUNCS" '{
      n = $NF + 0; line = $0; sub(/ [0-9]+$/, "", line)
      k = split(line, f, ";"); mine = 0; whole = 0
      for (i = 1; i <= k; i++) { g = f[i]; sub(/ .*/, "", g); if (g ~ re) mine = 1; if (g == "worker") whole = 1 }
      if (mine) { all += n; if (whole) ok += n }
    } END { printf "%d %d\n", ok, all }' "$1"
}

full_stack_perf() { # full_stack_perf: "<whole> <workload samples>" of `perf script -F comm,ip,sym` on stdin
  awk -v re="$BURN_FUNCS" '
    function flush() { if (mine) { all++; if (whole) ok++ } mine = 0; whole = 0 }
    /^[^ \t]/ || /^ +[^ 0-9a-f]/ { flush(); next }
    NF >= 2 { g = $2; sub(/\+0x[0-9a-f]+$/, "", g); if (g ~ re) mine = 1; if (g == "worker") whole = 1 }
    END { flush(); printf "%d %d\n", ok, all }'
}

# read_bpf PID FD...: sets BPF_READING to "<run_time_ns> <run_cnt>" summed over those BPF
# programs.
read_bpf() {
  local pid=$1 fd key value rest ns=0 n=0
  shift
  for fd in "$@"; do
    while read -r key value rest; do
      case $key in
        run_time_ns:) ns=$((ns + value)) ;;
        run_cnt:) n=$((n + value)) ;;
      esac
    done 2>/dev/null <"/proc/$pid/fdinfo/$fd" || true
  done
  BPF_READING="$ns $n"
}

# window PHASE SECONDS [LABEL:PID]...: follows the processes for SECONDS (or until all have exited),
# polling every 0.5 s and keeping the last reading of each: CPU ticks, VmHWM and the run time of
# their BPF programs. Also records the workload's throughput over the window in PHASE_RATE[PHASE].
window() {
  local phase=$1 seconds=$2
  shift 2
  local spec label pid now ticks t0 mark0 mark1 end any hwm
  t0=$EPOCHREALTIME
  mark0=$(workload_mark)
  OTHERS[$phase]=$(other_profilers)
  for spec in "$@"; do
    label=${spec%%:*} pid=${spec#*:}
    read_cpu "$pid" || die "$label (pid $pid) is gone before its window started"
    START_TICKS[$label]=$CPU_READING
    START_T[$label]=$t0
    LAST_TICKS[$label]=${START_TICKS[$label]}
    LAST_T[$label]=$t0
    W_HWM[$label]=0
    W_GONE[$label]=0
    BPF_FDS[$label]=$(bpf_prog_fds "$pid" | tr '\n' ' ')
    # shellcheck disable=SC2086 # word-splitting the fd list is intended
    read_bpf "$pid" ${BPF_FDS[$label]}
    START_BPF[$label]=$BPF_READING
    LAST_BPF[$label]=${START_BPF[$label]}
  done
  # Microseconds, compared with integer arithmetic: the loop below starts no process (see read_status).
  end=$((${t0/./} + seconds * 1000000))
  while :; do
    read -r -t 0.5 -u "$NAP_FD" || true
    now=$EPOCHREALTIME
    any=0
    for spec in "$@"; do
      label=${spec%%:*} pid=${spec#*:}
      if read_cpu "$pid" && alive "$pid"; then
        any=1
        LAST_TICKS[$label]=$CPU_READING
        LAST_T[$label]=$now
        [ -n "$ST_HWM" ] && W_HWM[$label]=$ST_HWM
        W_RSS[$label]=$ST_RSS
        # shellcheck disable=SC2086
        [ -n "${BPF_FDS[$label]}" ] && read_bpf "$pid" ${BPF_FDS[$label]} && LAST_BPF[$label]=$BPF_READING
      else
        W_GONE[$label]=1
      fi
    done
    if [ $# -gt 0 ] && [ $any -eq 0 ]; then break; fi
    [ "${now/./}" -ge "$end" ] && break
  done
  mark1=$(workload_mark)
  OTHERS[$phase]+=$(other_profilers)
  for spec in "$@"; do
    label=${spec%%:*}
    W_SECS[$label]=$(calc '%.3f' "${LAST_T[$label]} - ${START_T[$label]}")
    W_CPU[$label]=$(cpu_delta "${START_TICKS[$label]}" "${LAST_TICKS[$label]}")
    if [ -n "${BPF_FDS[$label]}" ]; then
      read -r W_BPF_NS[$label] W_BPF_CNT[$label] < <(awk -v a="${START_BPF[$label]}" -v b="${LAST_BPF[$label]}" \
        'BEGIN { split(a, x, " "); split(b, y, " "); print y[1] - x[1], y[2] - x[2] }')
    fi
  done
  PHASE_RATE[$phase]=$(awk -v a="$mark0" -v b="$mark1" 'BEGIN {
    split(a, x, " "); split(b, y, " ");
    if (y[1] > x[1]) printf "%.0f", (y[2] - x[2]) / ((y[1] - x[1]) / 1e9); else print "-" }')
  PHASE_EFF[$phase]=$(awk -v a="$mark0" -v b="$mark1" 'BEGIN {
    split(a, x, " "); split(b, y, " ");
    if (y[3] > x[3]) printf "%.0f", (y[2] - x[2]) / ((y[3] - x[3]) / 1e9); else print "-" }')
  PHASE_SHARE[$phase]=$(awk -v a="$mark0" -v b="$mark1" 'BEGIN {
    split(a, x, " "); split(b, y, " ");
    if (y[1] > x[1]) printf "%.2f", (y[3] - x[3]) / (y[1] - x[1]); else print "-" }')
}

read_time() { # read_time LABEL NAME: /usr/bin/time's "%e %U %S %M" (its last line) into T_*
  local line e u s m
  line=$(tail -n1 "$tmp/$2.time" 2>/dev/null || true)
  read -r e u s m <<<"$line"
  if [[ ${m:-} =~ ^[0-9]+$ ]]; then
    T_WALL[$1]=$e
    T_ALL[$1]=$(calc '%.3f' "$u + $s")
    T_RSS[$1]=$m
  else
    NOTE[$1]+="no rusage from /usr/bin/time ($(tr '\n' ' ' <"$tmp/$2.time" 2>/dev/null)); "
  fi
}

process_diag() { # process_diag PID: state, CPU and kernel stack of each thread, on one line
  local task
  for task in /proc/"$1"/task/*; do
    printf '[tid %s %s cpu_ticks=%s wchan=%s stack: %s] ' "${task##*/}" \
      "$(awk '/^State:/ {print $2}' "$task/status" 2>/dev/null)" \
      "$(awk '{ sub(/.*\) /, ""); split($0, f, " "); print f[12] + f[13] }' "$task/stat" 2>/dev/null)" \
      "$(cat "$task/wchan" 2>/dev/null)" \
      "$(head -n4 "$task/stack" 2>/dev/null | awk '{print $2}' | paste -sd' ' -)"
  done
}

declare -A STOP_SECS
stop_and_wait() { # stop_and_wait NAME SIGNAL SECONDS PID: signals PID, waits for it to exit
  local name=$1 sig=$2 limit=$3 pid=$4 t0
  t0=$EPOCHREALTIME
  kill "-$sig" "$pid" 2>/dev/null || true
  if ! wait_gone "$limit" "$pid"; then
    log "WARNING: $name (pid $pid) still running ${limit}s after SIG$sig; killing it"
    NOTE[$name]+="PROBLEM: did not exit within ${limit}s of SIG$sig, killed; it was: $(process_diag "$pid"); "
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone 5 "$pid" || true
  fi
  STOP_SECS[$name]=$(calc '%.1f' "$EPOCHREALTIME - $t0")
}

wait_wrapper() { # reaps the /usr/bin/time process so its -o file is complete
  local pid
  for pid in "${WRAPPERS[@]}"; do
    alive "$pid" || wait "$pid" 2>/dev/null || true
  done
  sleep 0.1
}

# ---------------------------------------------------------------------------------------------
# The profilers.

# run_ember KEY SAMPLER RELAY: one ember phase with these binaries. Its processes are labelled
# KEY-sampler and KEY-relay, its samples KEY.
run_ember_build() {
  local key=$1 sampler=$2 relay=$3
  local rl=$key-relay sl=$key-sampler
  local sockdir=$tmp/$key sock relay_pid sampler_pid t_ready t_stop sink_pid=
  # The relay runs as nobody: it must be able to reach and write the socket's directory.
  mkdir -p "$sockdir"
  chmod 1777 "$sockdir"
  sock=$sockdir/ember.sock
  local relay_args=(--log-format json run --socket "$sock" --window "$WINDOW")
  mkdir -p "$tmp/$key-out"
  chown "$nobody_uid:$nobody_gid" "$tmp/$key-out"
  relay_args+=(--output-dir "$tmp/$key-out")
  [ -z "$UNWIND" ] || relay_args+=(--unwind "$UNWIND")
  if [ "$RELAY_OTLP" = 1 ]; then
    python3 "$bench_dir/otlp_sink.py" "$tmp/$key-otlp.port" >"$tmp/$key-otlp.out" 2>"$tmp/$key-otlp.err" &
    sink_pid=$!
    local i
    for ((i = 0; i < 100; i++)); do [ -s "$tmp/$key-otlp.port" ] && break; sleep 0.05; done
    [ -s "$tmp/$key-otlp.port" ] || die "the OTLP sink did not start: $(cat "$tmp/$key-otlp.err")"
    relay_args+=(--otlp-endpoint "http://127.0.0.1:$(cat "$tmp/$key-otlp.port")" --otlp-protocol http)
  fi
  log "$key: starting ember-relay as nobody and ember-sampler -F $FREQ (${DURATION}s)"
  # `timeout` is a dead man's switch only (the script stops both itself).
  launch "$rl" 2 timeout -k 10 -s TERM "$((DURATION + 300))" \
    setpriv --reuid="$nobody_uid" --regid="$nobody_gid" --clear-groups "$relay" "${relay_args[@]}"
  relay_pid=$LAUNCHED_PID
  wait_ready "$rl" "$tmp/$rl.err" '"message":"listening for ember-sampler"' 20 "$relay_pid"
  local sampler_args=(--log-format json --socket "$sock" --frequency "$FREQ" --reporter-interval "$INTERVAL")
  [ -z "$UNWIND" ] || sampler_args+=(--unwind "$UNWIND")
  # Newer samplers drop CAP_DAC_OVERRIDE after attaching and reach the relay's 0660 socket through
  # the relay user's group, which they join (and check the relay's uid) with --relay-uid.
  if "$sampler" --help 2>/dev/null | grep -q -- '--relay-uid'; then
    sampler_args+=(--relay-uid "$nobody_uid")
  fi
  launch "$sl" 2 timeout -k 10 -s INT "$((DURATION + 300))" "$sampler" "${sampler_args[@]}"
  sampler_pid=$LAUNCHED_PID
  wait_ready "$sl" "$tmp/$sl.err" '"message":"sampling"' 60 "$sampler_pid"
  t_ready=$EPOCHREALTIME
  wait_ready "$rl" "$tmp/$rl.err" '"message":"sampler hello"' 20 "$relay_pid"
  sleep "$SETTLE"
  # The system calls each process makes during the window (perf stat on the raw_syscalls:sys_enter
  # tracepoint, only for that pid), and the pids the whole host created meanwhile.
  local sc_pids=() pid0 pid1 label
  if command -v perf >/dev/null; then
    for label in "$sl:$sampler_pid" "$rl:$relay_pid"; do
      perf stat -x, -e raw_syscalls:sys_enter -p "${label#*:}" -o "$tmp/${label%%:*}.syscalls" \
        -- sleep "$STEADY" >/dev/null 2>&1 &
      sc_pids+=($!)
    done
    pid0=$(cat /proc/sys/kernel/ns_last_pid)
  fi
  window "$key" "$STEADY" "$sl:$sampler_pid" "$rl:$relay_pid"
  t_stop=$EPOCHREALTIME
  if [ ${#sc_pids[@]} -gt 0 ]; then
    pid1=$(cat /proc/sys/kernel/ns_last_pid)
    wait "${sc_pids[@]}" 2>/dev/null || true
    local starts n per
    starts=$(calc '%.0f' "$CHURN * ${W_SECS[$sl]:-$STEADY}")
    NOTE[$key]+="host pids created in the window: $((pid1 >= pid0 ? pid1 - pid0 : 0)) (churn started about $starts); "
    for label in "$sl" "$rl"; do
      n=$(awk -F, '/raw_syscalls:sys_enter/ { print $1; exit }' "$tmp/$label.syscalls" 2>/dev/null || true)
      if [[ ${n:-} =~ ^[0-9]+$ ]]; then
        SYSCALLS[$label]=$n
        per=
        [ "$starts" -gt 0 ] && per=", $(calc '%.1f' "$n / $starts") per churn start"
        NOTE[$key]+="$label syscalls: $n ($(calc '%.1f' "$n / ${W_SECS[$sl]:-$STEADY}")/s$per); "
      fi
    done
  fi
  MAP_KIB[$sl]=$(bpf_map_kib "$sampler_pid")
  for label in "$sl" "$rl"; do
    [ "${W_GONE[$label]}" = 0 ] ||
      NOTE[$label]+="PROBLEM: exited on its own during the window; log tail: $(tail -n3 "$tmp/$label.err" | cut -c1-300 | tr '\n' ' ' || true); "
  done
  # Sampler first (it sends its last batch on the way out), then the relay once it has seen it go.
  stop_and_wait "$sl" INT 20 "$sampler_pid"
  local deadline=$((SECONDS + 10))
  until grep -qF '"message":"sampler disconnected"' "$tmp/$rl.err" || [ $SECONDS -ge $deadline ]; do
    sleep 0.1
  done
  grep -qF '"message":"sampler disconnected"' "$tmp/$rl.err" ||
    NOTE[$rl]+="never logged 'sampler disconnected' after the sampler stopped; "
  stop_and_wait "$rl" TERM 20 "$relay_pid"
  wait_wrapper
  read_time "$sl" "$sl"
  read_time "$rl" "$rl"
  if [ -n "$sink_pid" ]; then
    kill -TERM "$sink_pid" 2>/dev/null
    wait "$sink_pid" 2>/dev/null || true
    NOTE[$key]+="OTLP sink: $(tail -n1 "$tmp/$key-otlp.out" 2>/dev/null || echo 'no report'); "
  fi

  FULL[$key]=$(full_stack_folded "$tmp/$key-out/stacks.folded")
  local relay_log=$tmp/$rl.err sampler_log=$tmp/$sl.err
  local received sent stopping_samples batches errors
  received=$(json_sum "$relay_log" "batch received" samples)
  batches=$(grep -cF '"message":"batch received"' "$relay_log" || true)
  sent=$(json_last "$sampler_log" "sampler status" samples)
  stopping_samples=$(json_last "$relay_log" stopping samples)
  SAMPLES[$key]=$received
  SAMPLE_SECS[$key]=$(calc '%.3f' "$t_stop - $t_ready")
  NOTE[$key]+="relay received $received samples in $batches batch parts; sampler reports ${sent:-?} sent; relay's total at stop ${stopping_samples:-?}; "
  if [ "$batches" -gt 0 ]; then
    local k losses=""
    for k in user_stack_lost kernel_stack_lost counts_full backlog_dropped_samples unknown_frames frames; do
      losses+="$k=$(json_last "$relay_log" "batch received" "$k") "
    done
    NOTE[$key]+="relay/sampler counters at the last batch (cumulative): ${losses% }; "
  fi
  [ "$received" -gt 0 ] || NOTE[$key]+="PROBLEM: the relay received no samples; "
  [ -z "$sent" ] || [ "$sent" = "$received" ] || NOTE[$key]+="PROBLEM: sampler sent $sent but relay received $received; "
  errors=$(cat "$relay_log" "$sampler_log" | grep -cE '"level":"(ERROR|WARN)"' || true)
  if [ "${errors:-0}" -gt 0 ]; then
    NOTE[$key]+="$errors WARN/ERROR log line(s), first: $(cat "$sampler_log" "$relay_log" | grep -E '"level":"(ERROR|WARN)"' | sed -n 1p | cut -c1-300 || true); "
  fi
}

run_ember() { run_ember_build ember "$sampler_bin" "$relay_bin"; }
run_ember_before() { run_ember_build ember-before "$BEFORE_DIR/ember-sampler" "$BEFORE_DIR/ember-relay"; }

run_perf() { run_perf_mode perf -g; }
run_perf_dwarf() { run_perf_mode perf-dwarf --call-graph dwarf; }

# run_perf_mode KEY CALLGRAPH...: one perf record phase, labelled KEY, with those call-graph flags.
run_perf_mode() {
  local key=$1
  shift
  local perf_bin perf_pid t_ready
  perf_bin=$(command -v perf || true)
  if [ -z "$perf_bin" ]; then
    NOTE[$key]="MISSING: perf is not installed (scripts/setup.sh installs linux-perf)"
    return
  fi
  log "$key: perf record -F $FREQ -a $* (${DURATION}s)"
  launch "$key" 1 "$perf_bin" record -F "$FREQ" -a "$@" -o "$tmp/$key.data" -- sleep "$DURATION"
  perf_pid=$LAUNCHED_PID
  # perf forks the workload first and execs it once its events are set up: it samples while
  # `sleep` runs, then stops by itself. The window starts at that exec and follows perf to its end.
  local deadline=$((SECONDS + 60)) child ready=0
  while [ $ready -eq 0 ]; do
    for child in $(pgrep -P "$perf_pid" || true); do
      [ "$(cat "/proc/$child/comm" 2>/dev/null)" = sleep ] && ready=1
    done
    [ $ready -eq 1 ] && break
    alive "$perf_pid" || die "perf exited during start-up: $(tail -n5 "$tmp/$key.err")"
    [ $SECONDS -lt $deadline ] || die "perf did not start its workload within 60s"
    sleep 0.05
  done
  sleep "$SETTLE"
  window "$key" "$((DURATION + 120))" "$key:$perf_pid"
  if alive "$perf_pid"; then
    NOTE[$key]+="PROBLEM: still running 120s after its sleep should have ended; "
    stop_and_wait "$key" INT 60 "$perf_pid"
  fi
  wait_wrapper
  read_time "$key" "$key"
  local stats samples lost
  stats=$("$perf_bin" report -i "$tmp/$key.data" --stats 2>/dev/null || true)
  samples=$(awk '/SAMPLE events:/ { print $3; exit }' <<<"$stats")
  lost=$(awk '/LOST events:/ { print $3; exit }' <<<"$stats")
  if [ -z "$samples" ]; then # fall back to perf record's own summary line
    samples=$(grep -o '([0-9]* samples)' "$tmp/$key.err" | tr -dc '0-9' || true)
  fi
  SAMPLES[$key]=${samples:-?}
  SAMPLE_SECS[$key]=$DURATION
  local captured
  captured=$(grep -o 'Captured and wrote.*' "$tmp/$key.err" | sed -n 1p || true)
  # Full stacks and the post-processing cost: perf symbolizes (and, with dwarf, unwinds) only here.
  /usr/bin/time -o "$tmp/$key-script.time" -f '%U %S' "$perf_bin" script --no-inline -i "$tmp/$key.data" -F comm,ip,sym \
    2>"$tmp/$key-script.err" | full_stack_perf >"$tmp/$key-full" || true
  FULL[$key]=$(cat "$tmp/$key-full" 2>/dev/null || echo "0 0")
  POST_CPU[$key]=$(awk 'END { printf "%.3f", $1 + $2 }' "$tmp/$key-script.time" 2>/dev/null || echo -)
  local what=symbolizing
  [ "$key" != perf-dwarf ] || what="unwinding and symbolizing"
  NOTE[$key]+="perf script ($what): ${POST_CPU[$key]} CPU s; "
  NOTE[$key]+="$key.data $(du -h "$tmp/$key.data" 2>/dev/null | cut -f1 || true); SAMPLE events ${samples:-?}; LOST events ${lost:-0}; $captured; "
  [ "$KEEP" = 1 ] || rm -f "$tmp/$key.data"
}

run_bpftrace() {
  local bt_bin bt_pid t_ready t_stop
  bt_bin=$(command -v bpftrace || true)
  if [ -z "$bt_bin" ]; then
    NOTE[bpftrace]="MISSING: bpftrace is not installed (scripts/setup.sh installs it)"
    return
  fi
  log "bpftrace: profile:hz:$FREQ with kstack, ustack, comm (${DURATION}s after it attaches)"
  # Stopped with SIGINT (like `timeout -s INT`) DURATION seconds after it has attached, so that its
  # compile time is not taken out of its sampling time; `timeout` is a dead man's switch only.
  launch bpftrace 2 env BPFTRACE_MAP_KEYS_MAX="$BT_KEYS" timeout -k 10 -s INT "$((DURATION + 300))" \
    "$bt_bin" -e "profile:hz:$FREQ { @[kstack, ustack, comm] = count(); }"
  bt_pid=$LAUNCHED_PID
  wait_ready bpftrace "$tmp/bpftrace.out" 'Attaching' 120 "$bt_pid"
  # "Attaching" comes before the program is loaded: ready once it holds a BPF program and a perf
  # event per CPU.
  local deadline=$((SECONDS + 60)) links
  while :; do
    links=$(ls -l "/proc/$bt_pid/fd" 2>/dev/null | grep -c 'perf_event' || true)
    [ -n "$(bpf_prog_fds "$bt_pid")" ] && [ "$links" -ge "$ncpu" ] && break
    alive "$bt_pid" || die "bpftrace exited during start-up: $(tail -n5 "$tmp/bpftrace.err")"
    [ $SECONDS -lt $deadline ] || die "bpftrace did not attach within 60s"
    sleep 0.05
  done
  t_ready=$EPOCHREALTIME
  sleep "$SETTLE"
  window bpftrace "$STEADY" "bpftrace:$bt_pid"
  t_stop=$EPOCHREALTIME
  MAP_KIB[bpftrace]=$(bpf_map_kib "$bt_pid")
  [ "${W_GONE[bpftrace]}" = 0 ] ||
    NOTE[bpftrace]+="PROBLEM: exited on its own during the window: $(tail -n3 "$tmp/bpftrace.err" | tr '\n' ' ' || true); "
  stop_and_wait bpftrace INT 180 "$bt_pid"
  wait_wrapper
  read_time bpftrace bpftrace
  local samples stacks
  samples=$(awk '/\]: [0-9]+$/ { s += $NF } END { print s + 0 }' "$tmp/bpftrace.out")
  stacks=$(grep -cE '\]: [0-9]+$' "$tmp/bpftrace.out" || true)
  SAMPLES[bpftrace]=$samples
  SAMPLE_SECS[bpftrace]=$(calc '%.3f' "$t_stop - $t_ready")
  NOTE[bpftrace]+="$samples samples in $stacks distinct (kstack, ustack, comm) keys (BPFTRACE_MAP_KEYS_MAX=$BT_KEYS); map output $(du -h "$tmp/bpftrace.out" | cut -f1 || true); "
  [ "$stacks" -lt "$BT_KEYS" ] || NOTE[bpftrace]+="PROBLEM: its map filled up, samples of new stacks were dropped: raise BPFTRACE_MAP_KEYS_MAX; "
  NOTE[bpftrace]+="it keeps sampling while it prints its map on exit (${STOP_SECS[bpftrace]:-?} s), which inflates samples/s a little; "
  [ "$samples" -gt 0 ] || NOTE[bpftrace]+="PROBLEM: no samples; stderr: $(tail -n2 "$tmp/bpftrace.err" | tr '\n' ' ' || true); "
}

# ---------------------------------------------------------------------------------------------
# Main.

tmp=$(mktemp -d /tmp/ember-overhead.XXXXXX)
# A FIFO nobody writes to: `read -t` on it is a sleep that starts no process (see read_status).
mkfifo "$tmp/nap"
exec {NAP_FD}<>"$tmp/nap"
chmod 711 "$tmp" # nobody (the relay) must traverse it to reach its socket directory

if [[ " ${PROFILER_LIST[*]} " == *" ember "* ]] && [ "$BUILD" = 0 ] && [ -x "$sampler_bin" ] && [ -x "$relay_bin" ]; then
  newer=$(cd "$root" && find protocol sampler sampler-ebpf relay Cargo.toml Cargo.lock -newer "$sampler_bin" \
    -type f \( -name '*.rs' -o -name '*.toml' -o -name '*.lock' -o -name '*.capnp' \) 2>/dev/null | head -n3 || true)
  [ -z "$newer" ] || log "WARNING: sources are newer than $sampler_bin (e.g. $(echo $newer)); pass --build to rebuild"
fi
if [ ! -x "$sampler_bin" ] || [ ! -x "$relay_bin" ] || [ "$BUILD" = 1 ]; then
  if [[ " ${PROFILER_LIST[*]} " == *" ember "* ]]; then
    command -v cargo >/dev/null || die "cargo not in PATH (needed to build $sampler_bin); run with sudo -E or build first"
    log "building release binaries (cargo build --release -p ember-sampler -p ember-relay)"
    (cd "$root" && cargo build --release -p ember-sampler -p ember-relay) >&2
  fi
fi

if [ "$BPF_STATS" = 1 ]; then
  if [ "$(cat /proc/sys/kernel/bpf_stats_enabled 2>/dev/null || echo x)" = 0 ]; then
    BPF_STATS_RESTORE=1
    echo 1 >/proc/sys/kernel/bpf_stats_enabled && BPF_STATS_ON=1 || log "WARNING: cannot enable kernel.bpf_stats_enabled"
  elif [ "$(cat /proc/sys/kernel/bpf_stats_enabled 2>/dev/null)" = 1 ]; then
    BPF_STATS_ON=1
  fi
fi

if [ "$NOFP" = 1 ]; then
  log "building the workload (bench/burn.c) without frame pointers"
  gcc -O2 -g -fomit-frame-pointer -fno-inline -fno-optimize-sibling-calls -pthread \
    -o "$tmp/burn" "$bench_dir/burn.c"
else
  log "building the workload (bench/burn.c)"
  gcc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls -pthread \
    -o "$tmp/burn" "$bench_dir/burn.c"
fi
chmod 755 "$tmp/burn"
if [ "$CHURN" -gt 0 ]; then
  gcc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls \
    -o "$tmp/churn" "$bench_dir/churn.c" || die "building bench/churn.c"
  chmod 755 "$tmp/churn"
fi

load_before=$(cut -d' ' -f1-3 /proc/loadavg)
log "starting the workload: $THREADS busy thread(s) on $ncpu CPU(s); load average before: $load_before"
"$tmp/burn" "$THREADS" >"$tmp/burn.out" 2>"$tmp/burn.err" &
WORKLOAD_PID=$!
sleep 2 # let it reach steady state
alive "$WORKLOAD_PID" || die "workload exited: $(cat "$tmp/burn.err")"
if [ "$CHURN" -gt 0 ]; then
  # Runs through every phase; stopped by the cleanup (a generous upper bound on the run's length).
  log "starting $CHURN short-lived processes per second ($CHURN_MS ms each)"
  "$tmp/churn" spawn "$CHURN" "$((BASELINE + ${#PROFILER_LIST[@]} * (DURATION + 400)))" "$CHURN_MS" \
    >"$tmp/churn.out" 2>"$tmp/churn.err" &
  CHURN_PID=$!
fi

if [ "$BASELINE" -gt 0 ]; then
  log "baseline: workload alone for ${BASELINE}s"
  window baseline "$BASELINE"
fi
for p in "${PROFILER_LIST[@]}"; do
  "run_${p//-/_}"
  alive "$WORKLOAD_PID" || die "the workload died during the $p phase"
  sleep 1
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# ---------------------------------------------------------------------------------------------
# Report.

fmt_cpu() { [ -n "${1:-}" ] && calc '%.4f' "$1" || echo -; }
mib() { [ -n "${1:-}" ] && [ "$1" != 0 ] && calc '%.1f' "$1 / 1024" || echo -; }

rate_col() { # rate_col PHASE [eff]: "rounds/s (+x.x%)", or rounds per workload CPU s with "eff"
  local r=${PHASE_RATE[$1]:-} b=${PHASE_RATE[baseline]:-}
  if [ "${2:-}" = eff ]; then r=${PHASE_EFF[$1]:-} b=${PHASE_EFF[baseline]:-}; fi
  if [ -z "$r" ] || [ "$r" = - ]; then echo -; return; fi
  if [ "$1" != baseline ] && [ -n "$b" ] && [ "$b" != - ] && [ "$b" != 0 ]; then
    echo "$r ($(calc '%+.1f' "($r - $b) * 100 / $b")%)"
  else
    echo "$r"
  fi
}

row() { # row NAME CPU BPF CPU_ALL CPU_TOTAL RSS_MIB SAMPLES_PER_S WORKLOAD WORKLOAD_PER_CPU
  printf '%-20s %8s %8s %11s %11s %12s %9s %17s %18s\n' "$@"
}

# row_for LABEL DISPLAY SAMPLE_KEY SHOW_SAMPLES(0/1) PHASE
row_for() {
  local label=$1 name=$2 skey=$3 show=$4 phase=$5 cpu="" cpu_all="" total="" sps=-
  if [ -n "${W_SECS[$label]:-}" ] && [ "${W_SECS[$label]}" != 0.000 ]; then
    cpu=$(calc '%.6f' "${W_CPU[$label]} / ${W_SECS[$label]}")
  fi
  if [ -n "${T_ALL[$label]:-}" ] && [ -n "${SAMPLE_SECS[$skey]:-}" ]; then
    cpu_all=$(calc '%.6f' "${T_ALL[$label]} / ${SAMPLE_SECS[$skey]}")
    total=${T_ALL[$label]}
  fi
  if [ "$show" = 1 ] && [[ ${SAMPLES[$skey]:-} =~ ^[0-9]+$ ]] && [ -n "${SAMPLE_SECS[$skey]:-}" ]; then
    sps=$(calc '%.1f' "${SAMPLES[$skey]} / ${SAMPLE_SECS[$skey]}")
  fi
  local bpf=- w=- we=-
  if [ -n "${W_BPF_NS[$label]:-}" ] && [ -n "$cpu" ]; then
    bpf=$(calc '%.4f' "${W_BPF_NS[$label]} / 1e9 / ${W_SECS[$label]}")
    [ "$BPF_STATS_ON" = 1 ] || bpf=off
  elif [ "$label" = perf ] || [ "$label" = perf-dwarf ]; then
    bpf=n/a
  fi
  [ -n "$phase" ] && w=$(rate_col "$phase") && we=$(rate_col "$phase" eff)
  row "$name" "$(fmt_cpu "$cpu")" "$bpf" "$(fmt_cpu "$cpu_all")" "${total:--}" "$(mib "${T_RSS[$label]:-}")" "$sps" "$w" "$we"
}

echo
echo "== profiler overhead, $(date '+%F %T %Z') =="
echo "machine:    $(hostname), $ncpu CPU(s) ($(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)), kernel $(uname -r)"
echo "parameters: DURATION=${DURATION}s per profiler, FREQ=${FREQ} Hz per CPU (expect ~$((FREQ * ncpu)) samples/s on busy CPUs), BASELINE=${BASELINE}s, ember --reporter-interval $INTERVAL, relay --output-dir on$([ "$RELAY_OTLP" = 1 ] && echo ', relay OTLP/HTTP export on'), relay --window $WINDOW$([ -n "$BEFORE_DIR" ] && echo ", ember-before = $BEFORE_DIR")"
echo "workload:   bench/burn.c, $THREADS busy thread(s), running throughout; load average before $load_before, after $load_after"
echo "versions:   $("$relay_bin" --version 2>/dev/null || echo 'ember-relay ?'), $(perf --version 2>/dev/null || echo 'perf missing'), $(bpftrace --version 2>/dev/null || echo 'bpftrace missing')"
echo
row profiler cpu_s/s bpf_s/s cpu_s/s_all cpu_s_total peak_rss_MiB samples/s "wl rounds/s" "wl rounds/cpu_s"
[ "$BASELINE" -gt 0 ] && row "(no profiler)" - - - - - - "$(rate_col baseline)" "$(rate_col baseline eff)"
for p in "${PROFILER_LIST[@]}"; do
  case $p in
    ember | ember-before)
      row_for "$p-sampler" "$p-sampler" "$p" 1 ""
      row_for "$p-relay" "$p-relay" "$p" 0 ""
      # Total: the two processes' sums (the RSS sum is an upper bound: peaks need not coincide).
      W_CPU[$p-total]=$(calc '%.6f' "${W_CPU[$p-sampler]:-0} + ${W_CPU[$p-relay]:-0}")
      W_SECS[$p-total]=${W_SECS[$p-sampler]:-0}
      [ -z "${W_BPF_NS[$p-sampler]:-}" ] || W_BPF_NS[$p-total]=${W_BPF_NS[$p-sampler]}
      if [ -n "${T_ALL[$p-sampler]:-}" ] && [ -n "${T_ALL[$p-relay]:-}" ]; then
        T_ALL[$p-total]=$(calc '%.3f' "${T_ALL[$p-sampler]} + ${T_ALL[$p-relay]}")
        T_RSS[$p-total]=$((T_RSS[$p-sampler] + T_RSS[$p-relay]))
      fi
      row_for "$p-total" "$p (total)" "$p" 1 "$p"
      ;;
    perf | perf-dwarf)
      if [ -n "${NOTE[$p]:-}" ] && [[ ${NOTE[$p]} == MISSING* ]]; then
        row "$p record" - - - - - - - "${NOTE[$p]}"
      else
        row_for "$p" "$p record" "$p" 1 "$p"
      fi
      ;;
    bpftrace)
      if [ -n "${NOTE[bpftrace]:-}" ] && [[ ${NOTE[bpftrace]} == MISSING* ]]; then
        row bpftrace - - - - - - - "${NOTE[bpftrace]}"
      else
        row_for bpftrace bpftrace bpftrace 1 bpftrace
      fi
      ;;
  esac
done
echo
# Second table: what a sample costs, and how whole the workload's stacks are.
cost_row() { # cost_row PHASE LABEL...: the phase's figures over the labelled processes
  local phase=$1 label cpu=0 bpf=0 secs="" hwm=0 maps="" sps="" us=- wl=- full=- post=- all_cpu=0 allin=-
  shift
  for label in "$@"; do
    all_cpu=$(calc '%.6f' "$all_cpu + ${T_ALL[$label]:-0} + ${W_BPF_NS[$label]:-0} / 1e9")
    [ -n "${W_SECS[$label]:-}" ] && [ "${W_SECS[$label]}" != 0.000 ] || continue
    secs=${W_SECS[$label]}
    cpu=$(calc '%.6f' "$cpu + ${W_CPU[$label]} / $secs")
    [ -z "${W_BPF_NS[$label]:-}" ] || bpf=$(calc '%.6f' "$bpf + ${W_BPF_NS[$label]} / 1e9 / $secs")
    hwm=$((hwm + ${T_RSS[$label]:-0}))
    [ -z "${MAP_KIB[$label]:-}" ] || maps=$(calc '%.1f' "${MAP_KIB[$label]} / 1024")
  done
  if [[ ${SAMPLES[$phase]:-} =~ ^[0-9]+$ ]] && [ "${SAMPLES[$phase]}" -gt 0 ] && [ -n "${SAMPLE_SECS[$phase]:-}" ]; then
    sps=$(calc '%.1f' "${SAMPLES[$phase]} / ${SAMPLE_SECS[$phase]}")
    [ -z "$secs" ] || us=$(calc '%.2f' "($cpu + $bpf) * 1e6 / $sps")
    local post_s=${POST_CPU[$phase]:-0}
    [[ $post_s =~ ^[0-9.]+$ ]] || post_s=0
    allin=$(calc '%.2f' "($all_cpu + $post_s) * 1e6 / ${SAMPLES[$phase]}")
    local e=${PHASE_EFF[$phase]:-} b=${PHASE_EFF[baseline]:-} sh=${PHASE_SHARE[$phase]:-}
    if [[ $e =~ ^[0-9]+$ ]] && [[ $b =~ ^[0-9]+$ ]] && [ "$b" -gt 0 ] && [[ $sh =~ ^[0-9.]+$ ]]; then
      wl=$(calc '%.2f' "(1 - $e / $b) * $sh * 1e6 / $sps")
    fi
  fi
  local ok all
  read -r ok all <<<"${FULL[$phase]:-}"
  if [[ ${all:-} =~ ^[0-9]+$ ]] && [ "$all" -gt 0 ]; then full="$(calc '%.1f' "$ok * 100 / $all") ($ok/$all)"; fi
  post=${POST_CPU[$phase]:--}
  printf '%-20s %9s %10s %13s %11s %14s %22s %8s %12s\n' "$phase" "${sps:--}" "$us" "$wl" "$post" "$allin" "$full" "${maps:--}" "$(mib "$hwm")"
}
printf '%-20s %9s %10s %13s %11s %14s %22s %8s %12s\n' profiler samples/s us/sample wl_us/sample post_cpu_s allin_us/sample full_stack% map_MiB peak_rss_MiB
for p in "${PROFILER_LIST[@]}"; do
  case $p in
    ember | ember-before) cost_row "$p" "$p-sampler" "$p-relay" ;;
    *) [[ ${NOTE[$p]:-} == MISSING* ]] || cost_row "$p" "$p" ;;
  esac
done
echo "workload:   $([ "$NOFP" = 1 ] && echo 'built WITHOUT frame pointers (-O2 -fomit-frame-pointer)' || echo 'built with frame pointers')$([ -n "$UNWIND" ] && echo ", ember --unwind $UNWIND")$([ "$CHURN" -gt 0 ] && echo ", plus $CHURN short-lived processes/s (bench/churn.c, $CHURN_MS ms each)")"
echo
echo "cpu_s/s      the process's CPU s (user+sys) per wall s while sampling, steady state (/proc/PID/stat)"
echo "bpf_s/s      its BPF programs' run time per wall s (fdinfo run_time_ns, kernel.bpf_stats_enabled); this"
echo "             is charged to the interrupted tasks, not to cpu_s/s. perf's in-kernel sampling/unwinding"
echo "             cost is likewise charged to the interrupted tasks and is not measurable per process (n/a)"
echo "cpu_s/s_all  all CPU s of the process from exec to exit (start-up, shutdown) per s sampled (/usr/bin/time)"
echo "peak_rss_MiB ru_maxrss over the whole life (ember total = sum of both peaks: an upper bound)"
echo "wl rounds/s  workload (bench/burn.c) throughput in that phase, % vs the no-profiler phase: all costs,"
echo "             but on a shared machine mostly moved by other users' load"
echo "wl rounds/cpu_s  workload rounds per CPU s it got: insensitive to other load, lowered by the work"
echo "             profilers make the kernel do in the workload's context (interrupts, unwinding, BPF)"
echo
echo "notes:"
for key in ember-before ember-before-sampler ember-before-relay ember ember-sampler ember-relay perf perf-dwarf bpftrace; do
  [ -n "${NOTE[$key]:-}" ] && echo "  $key: ${NOTE[$key]%; }"
done
for key in ember-before-sampler ember-sampler bpftrace; do
  if [ -n "${W_BPF_CNT[$key]:-}" ] && [ "$BPF_STATS_ON" = 1 ]; then
    echo "  $key BPF programs (fds ${BPF_FDS[$key]% }): $(calc '%.1f' "${W_BPF_CNT[$key]} / ${W_SECS[$key]}") runs/s, $(
      [ "${W_BPF_CNT[$key]}" -gt 0 ] && calc '%.0f' "${W_BPF_NS[$key]} / ${W_BPF_CNT[$key]}" || echo -) ns/run"
  fi
done
printf '  seconds from the stop signal to exit:'
for key in ember-before-sampler ember-before-relay ember-sampler ember-relay bpftrace; do
  [ -n "${STOP_SECS[$key]:-}" ] && printf ' %s=%s' "$key" "${STOP_SECS[$key]}"
done
echo " (perf stops by itself when sleep ends)"
printf '  workload CPU share (CPUs it got, of %s):' "$ncpu"
for key in baseline "${PROFILER_LIST[@]}"; do
  [ -n "${PHASE_SHARE[$key]:-}" ] && printf ' %s=%s' "$key" "${PHASE_SHARE[$key]}"
done
echo
for key in baseline "${PROFILER_LIST[@]}"; do
  if [ -n "${OTHERS[$key]:-}" ]; then
    echo "  interference: during the $key phase other profilers were running: $(tr ' ' '\n' <<<"${OTHERS[$key]}" | sort -u | tr '\n' ' ')"
  fi
done
echo "  memory at the end of the window (MiB):$(for k in ember-before-sampler ember-before-relay ember-sampler ember-relay perf perf-dwarf bpftrace; do
  [ -n "${W_RSS[$k]:-}" ] && printf ' %s: %s;' "$k" "${W_RSS[$k]}"; done)"
echo "  peak VmHWM seen while sampling (KiB): $(for k in ember-before-sampler ember-before-relay ember-sampler ember-relay perf perf-dwarf bpftrace; do [ -n "${W_HWM[$k]:-}" ] && printf '%s=%s ' "$k" "${W_HWM[$k]}"; done)"
[ "$KEEP" = 1 ] && echo "  logs and data: $tmp"
exit 0
