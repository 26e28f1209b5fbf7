#!/usr/bin/env bash
# bench/soak.sh: ember under process churn for a long time; does its memory level off?
# Run `bench/soak.sh --help` for what it does.
set -euo pipefail
export LC_ALL=C

usage() {
  cat <<'USAGE'
Usage: sudo bench/soak.sh [options]

Runs `ember-relay run` (as nobody, exporting OTLP/HTTP to bench/otlp_sink.py and writing
--output-dir with a 1-minute window, stacks.folded only unless --formats says more; --formats
none: OTLP alone, no files, no window kept) and a system-wide `ember-sampler` while bench/churn.c starts
RATE short-lived processes per second, each burning MS ms of CPU through random call chains of
256 generated functions, and bench/distinct.c keeps THREADS busy threads walking random paths
through a 24-level binary tree of functions (2^24 call paths, so nearly every sample is a stack
not seen before; its process is replaced every 10 s). Samples are what limit the distinct stacks:
at HZ on 2 CPUs there are at most 2 x HZ a second, so 200 k distinct stacks a minute need
HZ >= ~3000 with distinct.c alone on both CPUs (hence the default 4999). The CPUs are meant to be
saturated: when the churn's processes fall behind they pile up (load 30-90 on 2 CPUs) and the
relay, sharing the run queue with them, gets a fraction of a CPU (relay_wait%); --nice lowers the
workloads' priority to see the daemons without that (but then other load on the machine can starve
the workloads, and the distinct stacks with them).

Every minute it prints the relay's and the sampler's RSS (VmRSS at the minute's end; the relay's
is also read every second: relay_min/relay_max are that minute's extremes), open descriptors (/proc/PID/fd)
and CPU (% of one CPU in that minute, from /proc/PID/stat; relay_wait%: the time its threads
were runnable but waited for a CPU, from /proc/PID/task/*/schedstat, so it can pass 100), the
samples the relay received in that minute, the samples the sampler dropped (counts map full +
backlog dropped) and the user stacks it lost (kept without their user frames) as the relay learnt
of them that minute (from its `batch received` lines: a relay that reads nothing shows none), the
distinct stacks of the last closed window (lines of its stacks.folded, counted as soon as the
relay logs `window written`) and the relay's symbolizer cache (heap MiB and hit rate, from its
/metrics on a loopback port) and how far behind the relay was (behind_s: the slowest interval of
the minute, from an interval's end as the sampler stamped it to its profile reaching the sinks,
as the upper bound of its bucket in ember_relay_batch_latency_seconds; `>30` past the last); at
the end first/last/max of each, and the relay's RSS over every second read: min, mean, max and
swing (max - min over the mean; mean and swing from minute 2 on, past the start). A benchmark, not a test: it
exits non-zero only when the relay or the sampler died (or did not start).

Options:
  -d, --minutes N       how long                                   [MINUTES, default 30]
  -r, --rate N          processes started per second               [RATE, default 100]
  -m, --ms N            CPU ms each process burns                  [MS, default 5]
  -s, --stacks THREADS  bench/distinct.c threads; 0: none, only the churn's stacks
                                                                   [STACKS, default 2]
      --omit-fp         build bench/distinct.c without frame pointers (only the DWARF
                        unwinder, the sampler's default, walks it; samples taken before the
                        unwinder knows a new worker fall back to frame pointers and collapse
                        into a few `leaf;[unknown]...` stacks, so fewer distinct) [OMIT_FP=1]
  -F, --frequency HZ    ember-sampler --frequency                  [FREQ, default 4999]
  -n, --nice N          nice value of both workloads                [NICE, default 0]
      --formats LIST    the relay's --format for --output-dir: folded is what the distinct
                        stacks are counted from; svg,pprof,folded,speedscope adds the cost of
                        rendering each closed window in every format; none: no
                        --output-dir, OTLP alone (no distinct stacks counted)
                                                                   [FORMATS, default folded]
  -b, --bin DIR         where ember-sampler and ember-relay are     [BIN_DIR, default
                        target/release if both are there, else target/debug]
  -k, --keep            keep the temporary directory (logs, outputs) [KEEP=1]
      --trace FILE      every second, a line to FILE: seconds since the workloads started,
                        Unix time, the relay's RSS and its anonymous part (MiB, /proc), its
                        symbolizer cache, resolvers closed so far, OTLP MiB sent so far and
                        queued (/metrics); the relay's log is copied to FILE.log
                                                                   [TRACE]
      --heaptrack FILE  run the relay under heaptrack (Debian's `heaptrack`), its profile
                        written to FILE.zst (read it with heaptrack_print); slows the relay
                        [HEAPTRACK]
  -h, --help
USAGE
}

MINUTES=${MINUTES:-30} RATE=${RATE:-100} MS=${MS:-5} FREQ=${FREQ:-4999} KEEP=${KEEP:-0} BIN_DIR=${BIN_DIR:-}
STACKS=${STACKS:-2} OMIT_FP=${OMIT_FP:-0} NICE=${NICE:-0} FORMATS=${FORMATS:-folded} HEAPTRACK=${HEAPTRACK:-}
TRACE=${TRACE:-}
while [ $# -gt 0 ]; do
  case $1 in
    -d | --minutes) MINUTES=$2; shift 2 ;;
    -r | --rate) RATE=$2; shift 2 ;;
    -m | --ms) MS=$2; shift 2 ;;
    -s | --stacks) STACKS=$2; shift 2 ;;
    --omit-fp) OMIT_FP=1; shift ;;
    -F | --frequency) FREQ=$2; shift 2 ;;
    -n | --nice) NICE=$2; shift 2 ;;
    --formats) FORMATS=${2:?"--formats needs a value"}; shift 2 ;;
    -b | --bin) BIN_DIR=$2; shift 2 ;;
    -k | --keep) KEEP=1; shift ;;
    --heaptrack) HEAPTRACK=${2:?"--heaptrack needs a file"}; shift 2 ;;
    --trace) TRACE=${2:?"--trace needs a file"}; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

die() { echo "soak: $*" >&2; exit 1; }
log() { echo "soak: $*" >&2; }
[ "$(id -u)" = 0 ] || die "run as root (the sampler loads eBPF): sudo $0"
bench_dir=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$bench_dir")
. "$bench_dir/lib/ember-bins.sh"
BIN_DIR=$(ember_bin_dir "$root" "$BIN_DIR") || exit 1
relay=$BIN_DIR/ember-relay sampler=$BIN_DIR/ember-sampler

tmp=$(mktemp -d /tmp/ember-soak.XXXXXX)
chmod 755 "$tmp"
pids=()
cleanup() {
  local pid
  # Only what this script started, by pid, in reverse order.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    pid=${pids[$i]}
    kill -TERM "$pid" 2>/dev/null || true
  done
  sleep 1
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$HEAPTRACK" ]; then
    sleep 2
    cp "$tmp"/heaptrack/relay*.zst "$HEAPTRACK.zst" 2>/dev/null && log "heaptrack profile: $HEAPTRACK.zst"
  fi
  [ -z "$TRACE" ] || cp "$tmp/relay.err" "$TRACE.log" 2>/dev/null || true
  if [ "$KEEP" = 1 ]; then log "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

cc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls \
  -o "$tmp/churn" "$bench_dir/churn.c" || die "building bench/churn.c"
chmod 755 "$tmp/churn"
fp=-fno-omit-frame-pointer
[ "$OMIT_FP" = 1 ] && fp=-fomit-frame-pointer
cc -O1 -g "$fp" -fno-inline -fno-optimize-sibling-calls -pthread \
  -o "$tmp/distinct" "$bench_dir/distinct.c" || die "building bench/distinct.c"
chmod 755 "$tmp/distinct"

nobody_uid=$(id -u nobody) nobody_gid=$(id -g nobody)
mkdir -p "$tmp/sock" "$tmp/out"
chmod 1777 "$tmp/sock"
chown "$nobody_uid:$nobody_gid" "$tmp/out"
sock=$tmp/sock/ember.sock

python3 "$bench_dir/otlp_sink.py" "$tmp/otlp.port" >"$tmp/otlp.out" 2>"$tmp/otlp.err" &
pids+=($!)
for ((i = 0; i < 100; i++)); do [ -s "$tmp/otlp.port" ] && break; sleep 0.05; done
[ -s "$tmp/otlp.port" ] || die "the OTLP sink did not start: $(cat "$tmp/otlp.err")"

wrap=()
if [ -n "$HEAPTRACK" ]; then
  command -v heaptrack >/dev/null || die "--heaptrack needs heaptrack (apt-get install heaptrack)"
  mkdir -p "$tmp/heaptrack" && chown "$nobody_uid:$nobody_gid" "$tmp/heaptrack"
  wrap=(heaptrack -o "$tmp/heaptrack/relay")
fi
files=(--output-dir "$tmp/out" --format "$FORMATS")
[ "$FORMATS" = none ] && files=()
setpriv --reuid="$nobody_uid" --regid="$nobody_gid" --clear-groups \
  "${wrap[@]}" "$relay" --log-format json run --socket "$sock" --metrics-address 127.0.0.1:0 \
  "${files[@]}" --window 1m \
  --otlp-endpoint "http://127.0.0.1:$(cat "$tmp/otlp.port")" --otlp-protocol http \
  >"$tmp/relay.out" 2>"$tmp/relay.err" &
relay_pid=$!
pids+=("$relay_pid")
descendants() {
  local c
  for c in $(pgrep -P "$1" || true); do echo "$c"; descendants "$c"; done
}
if [ -n "$HEAPTRACK" ]; then
  # heaptrack's script runs the relay as its child: watch (and stop) the relay itself.
  for ((i = 0; i < 100; i++)); do
    child=$(descendants "$relay_pid" | while read -r p; do
      [ "$(cat "/proc/$p/comm" 2>/dev/null)" = ember-relay ] && echo "$p"; done | head -n1)
    [ -n "$child" ] && break
    sleep 0.1
  done
  [ -n "$child" ] || die "heaptrack did not start the relay"
  relay_pid=$child
  pids+=("$relay_pid")
fi
for ((i = 0; i < 200; i++)); do [ -S "$sock" ] && break; sleep 0.1; done
[ -S "$sock" ] || die "the relay did not listen: $(tail -n3 "$tmp/relay.err")"

"$sampler" --log-format json --socket "$sock" --frequency "$FREQ" --reporter-interval 1s \
  --relay-uid "$nobody_uid" >"$tmp/sampler.out" 2>"$tmp/sampler.err" &
sampler_pid=$!
pids+=("$sampler_pid")
for ((i = 0; i < 600; i++)); do
  grep -qF '"message":"batch received"' "$tmp/relay.err" && break
  kill -0 "$sampler_pid" 2>/dev/null || die "the sampler exited: $(tail -n3 "$tmp/sampler.err")"
  sleep 0.1
done
grep -qF '"message":"batch received"' "$tmp/relay.err" || die "no batch within 60 s"
metrics=$(grep -F '"message":"serving metrics' "$tmp/relay.err" | grep -o '"address":"[^"]*"' | cut -d'"' -f4 | head -n1)

nice -n "$NICE" "$tmp/churn" spawn "$RATE" "$((MINUTES * 60))" "$MS" >"$tmp/churn.out" 2>"$tmp/churn.err" &
churn_pid=$!
pids+=("$churn_pid")
distinct_pid=
if [ "$STACKS" -gt 0 ]; then
  nice -n "$NICE" "$tmp/distinct" "$STACKS" "$((MINUTES * 60))" 10 >"$tmp/distinct.out" 2>"$tmp/distinct.err" &
  distinct_pid=$!
  pids+=("$distinct_pid")
fi
log "relay $relay_pid, sampler $sampler_pid, churn $churn_pid (${RATE}/s x ${MS} ms), distinct ${distinct_pid:-off} ($STACKS threads${distinct_pid:+, $fp}) at nice $NICE, $FREQ Hz for $MINUTES min, files $FORMATS; binaries $BIN_DIR; dir $tmp"

rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# One --trace line: "elapsed_s unix_s rss_MiB anon_MiB sym_cache_MiB resolvers_evicted
# export_MiB export_queue_MiB" (the last four from /metrics: the symbolizer cache's heap,
# resolvers it closed so far, OTLP bytes sent so far, bytes queued).
trace_line() {
  local scraped
  scraped=$({ [ -n "$metrics" ] && curl -s --max-time 1 "http://$metrics/metrics"; } 2>/dev/null |
    awk 'function mib(v) {return v == "" ? "-" : sprintf("%.1f", v / 1048576)}
      /^[a-z]/ {split($1, n, "{"); v[n[1]] += $2}
      END {printf "%s %s %s %s\n", mib(v["ember_relay_symbolizer_cache_bytes"]),
        v["ember_relay_symbolizer_resolvers_evicted_total"] == "" ? "-" : v["ember_relay_symbolizer_resolvers_evicted_total"],
        mib(v["ember_relay_export_bytes_total"]), mib(v["ember_relay_export_queue_bytes"])}')
  awk -v t="$1" -v now="$(date +%s.%N)" -v scraped="${scraped:-- - - -}" \
    '/^VmRSS:/ {r = $2} /^RssAnon:/ {a = $2}
     END {printf "%d %.2f %.1f %.1f %s\n", t, now, r / 1024, a / 1024, scraped}' "/proc/$2/status" 2>/dev/null
}
[ -z "$TRACE" ] || echo "elapsed_s unix_s rss_MiB anon_MiB sym_cache_MiB resolvers_evicted export_MiB export_queue_MiB" >"$TRACE"
fds() { find "/proc/$1/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
samples_so_far() {
  grep -F '"message":"batch received"' "$tmp/relay.err" |
    grep -o '"samples":[0-9]*' | awk -F: '{s += $2} END {printf "%.0f\n", s}'
}
alive() { kill -0 "$1" 2>/dev/null; }
# CPU ticks (user + system) of a process so far.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# Nanoseconds the threads of a process were runnable but waited for a CPU, so far (threads
# that exited are not counted).
run_wait_ns() { cat "/proc/$1"/task/*/schedstat 2>/dev/null | awk '{s += $2} END {printf "%.0f\n", s}'; }
hz=$(getconf CLK_TCK)
# The sampler's counters (totals since it started) at the last batch: "dropped user_stacks_lost",
# dropped being the samples lost whole (counts map full + backlog dropped).
losses() {
  { grep -F '"message":"batch received"' "$tmp/relay.err" || true; } | tail -n1 |
    grep -o '"\(counts_full\|backlog_dropped_samples\|user_stack_lost\)":[0-9]*' |
    awk -F'[":]+' '{v[$2] = $3} END {printf "%.0f %.0f\n", v["counts_full"] + v["backlog_dropped_samples"], v["user_stack_lost"]}'
}
# (written by the relay's window writer after the window closed: counted once it is written)
windows_closed() { grep -cF '"message":"window written' "$tmp/relay.err" || true; }
# The files are rewritten in place after a window closes: counted right after the relay logs
# that it wrote them.
seen_windows=0 distinct=0
[ "$FORMATS" != none ] || distinct=-
note_window() {
  local n
  n=$(windows_closed)
  [ "$n" -gt "$seen_windows" ] || return 0
  seen_windows=$n
  [ "$FORMATS" != none ] || { distinct=-; return 0; }
  distinct=$(wc -l <"$tmp/out/stacks.folded" 2>/dev/null || echo 0)
}
# The relay's symbolizer cache from /metrics: "MiB hit%" (hits over hits + misses, all time).
symbolizer() {
  [ -n "$metrics" ] || { echo "- -"; return; }
  python3 - "$metrics" <<'PY' 2>/dev/null || echo "- -"
import sys, urllib.request
text = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read().decode()
v = {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}
hits, misses = v["ember_relay_symbolizer_cache_hits_total"], v["ember_relay_symbolizer_cache_misses_total"]
rate = 100 * hits / (hits + misses) if hits + misses else 0
print(f"{v['ember_relay_symbolizer_cache_bytes'] / 2**20:.1f} {rate:.1f}")
PY
}
# The relay's batch latency histogram from /metrics: "le=count ..." (cumulative counts by bucket).
latency_buckets() {
  [ -n "$metrics" ] || { echo ""; return; }
  python3 - "$metrics" <<'PY' 2>/dev/null || echo ""
import sys, urllib.request
text = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read().decode()
out = []
for l in text.splitlines():
    if l.startswith("ember_relay_batch_latency_seconds_bucket{"):
        le = l.split('le="')[1].split('"')[0]
        out.append(f"{le}={float(l.split()[-1]):.0f}")
print(" ".join(out))
PY
}
# The upper bound of the slowest bucket that gained observations between two readings of
# latency_buckets ("-" when none did).
slowest() {
  python3 - "$1" "$2" <<'PY'
import sys
before = dict(kv.split("=") for kv in sys.argv[1].split())
after = dict(kv.split("=") for kv in sys.argv[2].split())
slow, prev_b, prev_a = "-", 0.0, 0.0
for le, a in after.items():
    a, b = float(a), float(before.get(le, 0))
    if a - prev_a > b - prev_b:
        slow = ">30" if le == "+Inf" else le
    prev_a, prev_b = a, b
print(slow)
PY
}

declare -a relay_rss relay_fds sampler_rss sampler_fds window_stacks relay_rss_each
printf '%-6s %12s %9s %9s %10s %14s %12s %14s %16s %12s %8s %10s %11s %12s %9s %11s %8s\n' minute relay_rss_MiB \
  relay_min relay_max relay_fds sampler_rss_MiB sampler_fds samples_in_min distinct_stacks sym_cache_MiB \
  sym_hit% relay_cpu% relay_wait% sampler_cpu% dropped ustack_lost behind_s
crashed=
prev_samples=$(samples_so_far)
read -r prev_dropped prev_lost <<<"$(losses)"
prev_relay_cpu=$(cpu_ticks "$relay_pid") prev_sampler_cpu=$(cpu_ticks "$sampler_pid")
prev_relay_wait=$(run_wait_ns "$relay_pid")
prev_latency=$(latency_buckets)
# Readings are paced by the clock (reading and scraping take time: a plain `sleep 1` would let
# the minutes run past the workloads' end).
paced_from=$(date +%s.%N) tick=0
pace() {
  tick=$((tick + 1))
  sleep "$(awk -v from="$paced_from" -v tick="$tick" -v now="$(date +%s.%N)" \
    'BEGIN {d = from + tick - now; printf "%.3f\n", (d > 0 ? d : 0)}')"
}
for ((minute = 1; minute <= MINUTES; minute++)); do
  min_kib= max_kib=0
  for ((s = 0; s < 60; s++)); do
    alive "$relay_pid" || crashed+="relay "
    alive "$sampler_pid" || crashed+="sampler "
    [ -z "$crashed" ] || break 2
    note_window
    r=$(rss_kib "$relay_pid")
    [ -z "$TRACE" ] || trace_line "$(((minute - 1) * 60 + s))" "$relay_pid" >>"$TRACE"
    [ "$minute" -gt 1 ] && relay_rss_each+=("$r")
    [ -z "$min_kib" ] || [ "$r" -lt "$min_kib" ] && min_kib=$r
    [ "$r" -gt "$max_kib" ] && max_kib=$r
    pace
  done
  rr=$(rss_kib "$relay_pid") rf=$(fds "$relay_pid") sr=$(rss_kib "$sampler_pid") sf=$(fds "$sampler_pid")
  relay_rss+=("$rr") relay_fds+=("$rf") sampler_rss+=("$sr") sampler_fds+=("$sf")
  now_samples=$(samples_so_far)
  note_window
  window_stacks+=("$distinct")
  read -r sym_mib sym_hits <<<"$(symbolizer)"
  read -r now_dropped now_lost <<<"$(losses)"
  relay_cpu=$(cpu_ticks "$relay_pid") sampler_cpu=$(cpu_ticks "$sampler_pid")
  relay_wait=$(run_wait_ns "$relay_pid")
  now_latency=$(latency_buckets)
  behind=$(slowest "$prev_latency" "$now_latency")
  prev_latency=$now_latency
  printf '%-6s %12.1f %9.1f %9.1f %10s %14.1f %12s %14s %16s %12s %8s %10.1f %11.1f %12.1f %9s %11s %8s\n' "$minute" \
    "$(echo "$rr / 1024" | bc -l)" "$(echo "$min_kib / 1024" | bc -l)" "$(echo "$max_kib / 1024" | bc -l)" \
    "$rf" "$(echo "$sr / 1024" | bc -l)" "$sf" "$((now_samples - prev_samples))" \
    "$distinct" "$sym_mib" "$sym_hits" "$(echo "($relay_cpu - $prev_relay_cpu) * 100 / ($hz * 60)" | bc -l)" \
    "$(echo "($relay_wait - $prev_relay_wait) / 600000000" | bc -l)" \
    "$(echo "($sampler_cpu - $prev_sampler_cpu) * 100 / ($hz * 60)" | bc -l)" \
    "$((now_dropped - prev_dropped))" "$((now_lost - prev_lost))" "$behind"
  prev_samples=$now_samples prev_dropped=$now_dropped prev_lost=$now_lost
  prev_relay_cpu=$relay_cpu prev_sampler_cpu=$sampler_cpu prev_relay_wait=$relay_wait
done

summary() {
  local name=$1 unit=$2
  shift 2
  [ $# -gt 0 ] || { echo "$name: no readings"; return; }
  local max=$1 v
  for v in "$@"; do [ "$v" -gt "$max" ] && max=$v; done
  if [ "$unit" = MiB ]; then
    printf '%s: first %.1f MiB, last %.1f MiB, max %.1f MiB\n' "$name" \
      "$(echo "$1 / 1024" | bc -l)" "$(echo "${!#} / 1024" | bc -l)" "$(echo "$max / 1024" | bc -l)"
  else
    printf '%s: first %s, last %s, max %s\n' "$name" "$1" "${!#}" "$max"
  fi
}
echo
summary "relay RSS" MiB "${relay_rss[@]}"
if [ "${#relay_rss_each[@]}" -gt 0 ]; then
  printf '%s\n' "${relay_rss_each[@]}" | awk '
    NR == 1 || $1 < min {min = $1} $1 > max {max = $1} {sum += $1}
    END {mean = sum / NR; printf "relay RSS every second from minute 2: min %.1f MiB, mean %.1f MiB, max %.1f MiB, swing %.0f%% of the mean\n", min / 1024, mean / 1024, max / 1024, 100 * (max - min) / mean}'
fi
summary "relay open fds" n "${relay_fds[@]}"
summary "sampler RSS" MiB "${sampler_rss[@]}"
summary "sampler open fds" n "${sampler_fds[@]}"
[ "$FORMATS" = none ] || summary "distinct stacks of a closed window" n "${window_stacks[@]}"
errors=$(cat "$tmp/relay.err" "$tmp/sampler.err" | { grep -cE '"level":"(ERROR|WARN)"' || true; })
echo "relay samples received: $(samples_so_far); WARN/ERROR log lines: $errors"
if [ -n "$crashed" ]; then
  echo "CRASH: ${crashed}exited during the soak; log tails:" >&2
  tail -n5 "$tmp/relay.err" "$tmp/sampler.err" >&2
  KEEP=1
  exit 1
fi
kill -TERM "$churn_pid" 2>/dev/null || true
wait "$churn_pid" 2>/dev/null || true
echo "churn: $(cat "$tmp/churn.out" 2>/dev/null || true)"
if [ -n "$distinct_pid" ]; then
  kill -TERM "$distinct_pid" 2>/dev/null || true
  wait "$distinct_pid" 2>/dev/null || true
  echo "distinct: $(cat "$tmp/distinct.out" 2>/dev/null || true)"
fi
windows=$({ grep -F '"message":"window complete' "$tmp/relay.err" || true; } | grep -o '"samples":[0-9]*' | cut -d: -f2 | tr '\n' ' ' || true)
echo "closed windows' samples: ${windows:-none}"
# (the samples lost are fields of their own; every other counter not zero is in `losses`)
echo "sampler counters at the last batch: $({ grep -F '"message":"batch received"' "$tmp/relay.err" || true; } | tail -n1 |
  grep -o '"\(user_stack_lost\|counts_full\|backlog_dropped_samples\|losses\)":\([0-9]*\|"[^"]*"\)' | tr '\n' ' ')"
