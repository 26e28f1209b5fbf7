#!/usr/bin/env bash
# bench/python.sh: what walking Python frames costs per sample, side by side with py-spy, in one
# run. Run `bench/python.sh --help` for what it measures and how.
set -euo pipefail
export LC_ALL=C

usage() {
  cat <<'EOF'
Usage: sudo bench/python.sh [options]

Measures the per-sample cost of ember's CPython frame walk. One CPU-bound Python process
(tests/workloads/python/truth.py: <module> -> outer -> alpha|beta, pure Python, as a process
named python-bench) runs throughout;
at each frequency, these profilers run one after the other for DURATION seconds each:

  ember        ember-relay run (as user nobody) + ember-sampler (as root), the whole machine,
               Python frames walked (the default)
  ember-off    the same with `ember-relay run --interpreters off`: native stacks only
  py-spy       py-spy record -r FREQ -p PID (the workload only; py-spy's default blocking mode,
               which stops the process for each sample), from a venv outside the checkout
               (/var/cache/ember/venvs/py-spy, made with `pip install py-spy` when missing)

For each it reports
  cpu_s/s      CPU seconds (user+sys, /proc/PID/stat) of the profiler's processes per wall second
               of the steady state (from SETTLE s after it is ready to SETTLE + DURATION s)
  bpf_s/s      run time of ember-sampler's BPF programs per wall second (fdinfo run_time_ns with
               kernel.bpf_stats_enabled=1; the kernel charges it to the interrupted task, so it is
               not in cpu_s/s). py-spy: - (it reads the process with process_vm_readv)
  samples/s    samples taken per second: ember, the whole machine's (the "samples" of the relay's
               "batch received" log lines); py-spy, the workload's (the counts of its raw output)
  py_samples/s of those, the workload's (ember: its lines in the relay's stacks.folded, written when
               the relay stops: the whole run, start-up included, per second of it)
  named%       ember: of the workload's samples, the share that holds a Python frame of truth.py
               (`name (truth.py:LINE)`); py-spy: the share of its samples in truth.py's functions
  us/sample    (cpu_s/s + bpf_s/s) / samples/s: the profiler's own cost of one sample
  wl_cpu_s/s   the workload's CPU seconds per wall second meanwhile (py-spy's blocking mode stops it)

ember against ember-off at one frequency is what the walk costs per sample (the eBPF walk in
bpf_s/s, naming and splicing in the relay's cpu_s/s); py-spy is the reference a Python user has.

Options (each also settable through the environment variable in brackets):
  -d, --duration SECONDS    steady-state time per profiler          [DURATION, default 20]
  -F, --frequencies LIST    comma-separated sampling frequencies    [FREQS, default 99,999]
  -p, --profilers LIST      subset of ember,ember-off,py-spy, in order [PROFILERS, default all]
      --python PATH         the interpreter running the workload    [PYTHON, default pyenv's
                            newest 3.12, else /usr/bin/python3]
      --bin-dir DIR         where ember-sampler and ember-relay are [BIN_DIR, default
                            target/release, built with cargo when missing]
      --py-spy PATH         the py-spy binary                       [PY_SPY, default the venv's]
  -k, --keep                keep the temporary directory with all logs and data   [KEEP=1]
  -h, --help                show this help

Needs root (eBPF; py-spy reading another process), setpriv, awk and pgrep. Everything it starts
is stopped on exit, also on Ctrl-C. Results with their date and machine go to bench/RESULTS.md.
Example: sudo bench/python.sh -d 10 -F 99,999      sudo bench/python.sh -p py-spy
EOF
}

DURATION=${DURATION:-20}
FREQS=${FREQS:-99,999}
PROFILERS=${PROFILERS:-ember,ember-off,py-spy}
PYTHON=${PYTHON:-}
BIN_DIR=${BIN_DIR:-}
PY_SPY=${PY_SPY:-}
KEEP=${KEEP:-0}
SETTLE=3
PY_SPY_VENV=/var/cache/ember/venvs/py-spy

die() { printf 'python.sh: error: %s\n' "$*" >&2; exit 1; }
log() { printf '[python %s] %s\n' "$(date +%T)" "$*" >&2; }

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
    -F | --frequencies) FREQS=${2:?"$arg needs a value"}; shift 2 ;;
    -p | --profilers) PROFILERS=${2:?"$arg needs a value"}; shift 2 ;;
    --python) PYTHON=${2:?"$arg needs a value"}; shift 2 ;;
    --bin-dir) BIN_DIR=${2:?"$arg needs a value"}; shift 2 ;;
    --py-spy) PY_SPY=${2:?"$arg needs a value"}; shift 2 ;;
    -k | --keep) KEEP=1; shift ;;
    *) printf 'python.sh: unknown argument: %s\n\n' "$arg" >&2; usage >&2; exit 2 ;;
  esac
done

[[ $DURATION =~ ^[1-9][0-9]*$ ]] || die "DURATION must be a whole number of seconds >= 1, got '$DURATION'"
IFS=, read -r -a FREQ_LIST <<<"$FREQS"
for f in "${FREQ_LIST[@]}"; do
  [[ $f =~ ^[1-9][0-9]*$ ]] && [ "$f" -le 10000 ] || die "frequencies must be 1-10000 Hz, got '$f'"
done
IFS=, read -r -a PROFILER_LIST <<<"$PROFILERS"
for p in "${PROFILER_LIST[@]}"; do
  case $p in ember | ember-off | py-spy) ;; *) die "unknown profiler '$p' (use ember,ember-off,py-spy)" ;; esac
done
[ "$(id -u)" -eq 0 ] || die "run as root (eBPF and py-spy -p need it): sudo $0 $*"
for tool in setpriv pgrep awk; do
  command -v "$tool" >/dev/null || die "$tool is required (util-linux, procps, awk)"
done

bench_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench_dir/.." && pwd)
clk_tck=$(getconf CLK_TCK)
nobody_uid=65534
nobody_gid=65534
wants() { [[ ",$PROFILERS," == *",$1,"* ]]; }

if [ -z "$PYTHON" ]; then
  pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
  PYTHON=$(ls -d "$pyenv_root"/versions/3.12.*/bin/python3 2>/dev/null | sort -V | tail -n1 || true)
  [ -n "$PYTHON" ] || PYTHON=/usr/bin/python3
fi
[ -x "$PYTHON" ] || die "no Python interpreter at $PYTHON (--python PATH)"

if wants ember || wants ember-off; then
  BIN_DIR=${BIN_DIR:-$root/target/release}
  if [ ! -x "$BIN_DIR/ember-sampler" ] || [ ! -x "$BIN_DIR/ember-relay" ]; then
    [ "$BIN_DIR" = "$root/target/release" ] || die "no ember-sampler and ember-relay in $BIN_DIR"
    command -v cargo >/dev/null || die "cargo not in PATH (needed to build $BIN_DIR); run with sudo -E or build first"
    log "building release binaries (cargo build --release -p ember-sampler -p ember-relay)"
    (cd "$root" && cargo build --release -p ember-sampler -p ember-relay) >&2
  fi
  "$BIN_DIR/ember-relay" run --help 2>/dev/null | grep -q -- '--interpreters' ||
    die "$BIN_DIR/ember-relay has no --interpreters flag: this build does not walk Python frames"
fi
if wants py-spy; then
  if [ -z "$PY_SPY" ]; then
    PY_SPY=$PY_SPY_VENV/bin/py-spy
    if [ ! -x "$PY_SPY" ]; then
      log "installing py-spy into $PY_SPY_VENV (pip install py-spy)"
      python3 -m venv "$PY_SPY_VENV"
      "$PY_SPY_VENV/bin/pip" install -q --disable-pip-version-check py-spy
    fi
  fi
  [ -x "$PY_SPY" ] || die "no py-spy at $PY_SPY"
fi

# ---------------------------------------------------------------------------------------------
# Bookkeeping and cleanup.

tmp=$(mktemp -d /tmp/ember-bench-python.XXXXXX)
chmod 755 "$tmp"
STARTED=() # every process this script started, stopped on exit
WORKLOAD_PID=
BPF_STATS_RESTORE=0

alive() { [ -d "/proc/$1" ] && ! grep -q '^State:.*[ZX]' "/proc/$1/status" 2>/dev/null; }

cleanup() {
  local rc=$? pid
  trap - EXIT INT TERM
  set +e
  for pid in "${STARTED[@]}"; do alive "$pid" && kill -TERM "$pid" 2>/dev/null; done
  sleep 0.5
  for pid in "${STARTED[@]}"; do alive "$pid" && kill -KILL "$pid" 2>/dev/null; done
  wait 2>/dev/null
  [ "$BPF_STATS_RESTORE" = 0 ] || echo 0 >/proc/sys/kernel/bpf_stats_enabled
  if [ "$KEEP" = 1 ] || [ $rc -ne 0 ]; then log "logs and data kept in $tmp"; else rm -rf "$tmp"; fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ "$(cat /proc/sys/kernel/bpf_stats_enabled 2>/dev/null || echo x)" = 0 ]; then
  echo 1 >/proc/sys/kernel/bpf_stats_enabled && BPF_STATS_RESTORE=1
fi

cpu_ticks() { # cpu_ticks PID...: utime+stime (clock ticks) summed over the PIDs
  local pid stat fields sum=0
  for pid in "$@"; do
    { read -r stat <"/proc/$pid/stat"; } 2>/dev/null || continue
    read -r -a fields <<<"${stat##*) }"
    sum=$((sum + fields[11] + fields[12]))
  done
  echo "$sum"
}

# shellcheck source=bench/lib/bpf-fdinfo.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/bpf-fdinfo.sh"
bpf_ns() { bpf_fdinfo_sum "$1" prog run_time_ns; } # bpf_ns PID: run_time_ns of PID's BPF programs

json_sum() { # json_sum FILE MESSAGE FIELD: sum of numeric FIELD over the JSON log lines of MESSAGE
  awk -v msg="\"message\":\"$2\"" -v key="\"$3\":" '
    index($0, msg) { i = index($0, key); if (i) s += substr($0, i + length(key)) + 0 }
    END { print s + 0 }' "$1" 2>/dev/null || echo 0
}

wait_for() { # wait_for FILE PATTERN SECONDS PID: waits for a fixed string in FILE
  local deadline=$((SECONDS + $3))
  until grep -qF -- "$2" "$1" 2>/dev/null; do
    alive "$4" || die "pid $4 exited while waiting for '$2' in $1: $(tail -n3 "$1" 2>/dev/null)"
    [ $SECONDS -lt $deadline ] || die "no '$2' in $1 after $3 s"
    sleep 0.1
  done
}

calc() { awk "BEGIN { printf \"$1\", $2 }"; }

# The workload: truth.py under a copy of the interpreter named python-bench (with PYTHONHOME, so it
# finds its library), since ember names a process after its executable's file: its samples are
# then filed under python-bench in stacks.folded. A copy is the same program (a shared build's
# executable only loads its libpython).
mkdir -p "$tmp/bin"
cp "$(readlink -f "$PYTHON")" "$tmp/bin/python-bench"
python_home=$("$PYTHON" -c 'import sys; print(sys.prefix)')
cp "$root/tests/workloads/python/truth.py" "$tmp/truth.py"
phases=$(( ${#FREQ_LIST[@]} * ${#PROFILER_LIST[@]} ))
PYTHONHOME=$python_home "$tmp/bin/python-bench" "$tmp/truth.py" $(( phases * (DURATION + 30) + 60 )) \
  >"$tmp/truth.out" 2>&1 &
WORKLOAD_PID=$!
STARTED+=("$WORKLOAD_PID")
wait_for "$tmp/truth.out" '"ready"' 30 "$WORKLOAD_PID"
log "workload: $("$PYTHON" --version 2>&1) ($PYTHON), truth.py as pid $WORKLOAD_PID"

declare -A ROW
# measure KEY PIDS...: the steady state of one phase; sets M_CPU (CPU s/s of PIDS), M_WL (the
# workload's), M_SECS and M_T0/M_T1 (epoch s); BPF run time of $M_BPF_PID when set.
measure() {
  local t0 t1 c0 c1 w0 w1 b0=0 b1=0
  sleep "$SETTLE"
  t0=$EPOCHREALTIME c0=$(cpu_ticks "$@") w0=$(cpu_ticks "$WORKLOAD_PID")
  [ -z "${M_BPF_PID:-}" ] || b0=$(bpf_ns "$M_BPF_PID")
  M_LOG_SAMPLES0=$( [ -z "${M_LOG:-}" ] || json_sum "$M_LOG" "batch received" samples)
  sleep "$DURATION"
  t1=$EPOCHREALTIME c1=$(cpu_ticks "$@") w1=$(cpu_ticks "$WORKLOAD_PID")
  [ -z "${M_BPF_PID:-}" ] || b1=$(bpf_ns "$M_BPF_PID")
  M_SECS=$(calc '%.3f' "$t1 - $t0")
  M_CPU=$(calc '%.4f' "($c1 - $c0) / $clk_tck / $M_SECS")
  M_WL=$(calc '%.3f' "($w1 - $w0) / $clk_tck / $M_SECS")
  M_BPF=$(calc '%.4f' "($b1 - $b0) / 1e9 / $M_SECS")
}

run_ember() { # run_ember KEY FREQ [RELAY FLAGS...]
  local key=$1 freq=$2
  shift 2
  local sockdir=$tmp/$key-$freq out=$tmp/$key-$freq-out rl=$tmp/$key-$freq-relay.log sl=$tmp/$key-$freq-sampler.log
  local sock=$sockdir/ember.sock
  # The relay runs as nobody: it must be able to write the socket's directory and its output.
  mkdir -p "$sockdir" "$out"
  chmod 1777 "$sockdir"
  chown "$nobody_uid:$nobody_gid" "$out"
  setpriv --reuid="$nobody_uid" --regid="$nobody_gid" --clear-groups \
    "$BIN_DIR/ember-relay" run --socket "$sock" --log-format json --output-dir "$out" \
    --format folded "$@" 2>"$rl" >/dev/null &
  local relay=$!
  STARTED+=("$relay")
  wait_for "$rl" '"message":"listening for ember-sampler"' 30 "$relay"
  "$BIN_DIR/ember-sampler" --socket "$sock" --log-format json --frequency "$freq" \
    --reporter-interval 1s --relay-uid "$nobody_uid" 2>"$sl" >/dev/null &
  local sampler=$!
  STARTED+=("$sampler")
  wait_for "$rl" '"message":"sampler hello"' 120 "$relay"
  M_BPF_PID=$sampler M_LOG=$rl
  local started=$EPOCHREALTIME
  measure "$sampler" "$relay"
  local samples=$(( $(json_sum "$rl" "batch received" samples) - M_LOG_SAMPLES0 ))
  kill -INT "$sampler"; wait "$sampler" 2>/dev/null || true
  sleep 1
  kill -TERM "$relay"; wait "$relay" 2>/dev/null || true
  local life py named
  life=$(calc '%.3f' "$EPOCHREALTIME - $started")
  read -r py named < <(awk -v file="(truth.py:" '
    /^python-bench;/ { n = $NF; py += n; if (index($0, file)) named += n }
    END { print py + 0, named + 0 }' "$out/stacks.folded" 2>/dev/null || echo "0 0")
  local rate
  rate=$(calc '%.1f' "$samples / $M_SECS")
  ROW[$key-$freq]=$(printf '%-10s %6s %8s %8s %10s %12s %7s %10s %11s' "$key" "$freq" "$M_CPU" "$M_BPF" \
    "$rate" "$(calc '%.1f' "$py / $life")" "$(calc '%.1f' "100 * $named / ($py > 0 ? $py : 1)")" \
    "$(calc '%.2f' "1e6 * ($M_CPU + $M_BPF) / ($rate > 0 ? $rate : 1)")" "$M_WL")
  unset M_BPF_PID M_LOG
}

run_py_spy() { # run_py_spy FREQ
  local freq=$1 raw=$tmp/py-spy-$1.txt err=$tmp/py-spy-$1.err
  local secs=$((SETTLE + DURATION + 2))
  "$PY_SPY" record -r "$freq" -p "$WORKLOAD_PID" -d "$secs" -f raw -o "$raw" >"$err" 2>&1 &
  local spy=$!
  STARTED+=("$spy")
  sleep 0.5
  alive "$spy" || die "py-spy did not start: $(tail -n3 "$err")"
  measure "$spy"
  wait "$spy" 2>/dev/null || true
  local samples named
  read -r samples named < <(awk '{ n = $NF; s += n; if (index($0, "(truth.py:")) named += n }
    END { print s + 0, named + 0 }' "$raw" 2>/dev/null || echo "0 0")
  local rate
  rate=$(calc '%.1f' "$samples / $secs")
  ROW[py-spy-$freq]=$(printf '%-10s %6s %8s %8s %10s %12s %7s %10s %11s' py-spy "$freq" "$M_CPU" - \
    "$rate" "$rate" "$(calc '%.1f' "100 * $named / ($samples > 0 ? $samples : 1)")" \
    "$(calc '%.2f' "1e6 * $M_CPU / ($rate > 0 ? $rate : 1)")" "$M_WL")
}

for freq in "${FREQ_LIST[@]}"; do
  for p in "${PROFILER_LIST[@]}"; do
    log "$p at $freq Hz: ${DURATION}s after ${SETTLE}s of settling"
    case $p in
      ember) run_ember ember "$freq" ;;
      ember-off) run_ember ember-off "$freq" --interpreters off ;;
      py-spy) run_py_spy "$freq" ;;
    esac
  done
done

echo "date:       $(date -u '+%Y-%m-%d %H:%M UTC'); $(nproc) CPUs; $(uname -r)"
echo "workload:   truth.py under $("$PYTHON" --version 2>&1) ($PYTHON); ${DURATION}s per phase"
echo "versions:   $([ -z "$BIN_DIR" ] || "$BIN_DIR/ember-relay" --version 2>/dev/null || true) $([ -z "$PY_SPY" ] || "$PY_SPY" --version 2>/dev/null || true)"
echo
printf '%-10s %6s %8s %8s %10s %12s %7s %10s %11s\n' profiler Hz cpu_s/s bpf_s/s samples/s py_samples/s named% us/sample wl_cpu_s/s
for freq in "${FREQ_LIST[@]}"; do
  for p in "${PROFILER_LIST[@]}"; do
    echo "${ROW[$p-$freq]}"
  done
done
