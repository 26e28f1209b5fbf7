#!/usr/bin/env bash
# Measures the control-channel spikes and prints one Markdown table, a column per
# server present: (b) plain capnp messages on SOCK_SEQPACKET (msg-server/, the one kept) and, if
# restored from the commit that added this spike, (a) capnp-rpc on a Unix stream socket
# (rpc-server/; its client half is in that commit's client/src/main.rs too). RESULTS.md holds
# the output of the run with both. Needs strace; run as root or as
# a user allowed to ptrace its own children (strace -p). Debug builds, into the repository's own
# target/ (no second target directory). Usage: spikes/control-channel/measure.sh [FLOOD_CHUNKS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
target="$root/target"
flood=${1:-1000}        # chunks of 48 KiB sent without waiting, against a server slowed to 2 ms/chunk
tmp=$(mktemp -d /tmp/ember-spike.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT

cd "$here"
kinds=(); pkgs=(-p spike-client)
for k in rpc msg; do [ -d "$here/$k-server" ] && kinds+=("$k") && pkgs+=(-p "spike-$k-server"); done
nice -n 10 cargo build -q --target-dir "$target" "${pkgs[@]}"
bin="$target/debug"

# The sampler's allowlist today: every SYS_* in `fn allowed` of sampler/src/harden.rs.
sed -n '/^fn allowed/,/^pub fn filter/p' "$root/sampler/src/harden.rs" \
    | grep -o 'libc::SYS_[a-z0-9_]*' | sed 's/libc::SYS_//' | sort -u > "$tmp/allowed"
sampler_tree=$(cd "$root" && cargo tree -q -p ember-sampler -e normal --prefix none | sed 's/ (\*)//;s/ (proc-macro)//' | sort -u)

hwm() { awk '/^VmHWM/ {print $2}' "/proc/$1/status"; }
rss() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

start() { # kind delay_us -> pid
    "$bin/spike-$1-server" "$tmp/$1.sock" "$2" >/dev/null 2>>"$tmp/$1.log" &
    local pid=$!; pids+=("$pid")
    for _ in $(seq 50); do [ -S "$tmp/$1.sock" ] && break; sleep 0.1; done
    echo "$pid"
}

declare -A row
for kind in "${kinds[@]}"; do
    code=$(grep -cvE '^\s*(//|$)' "$kind-server/src/main.rs")
    shared=$(grep -cvE '^\s*(//|$)' common/src/tables.rs)
    row[$kind.loc]="$code (+ $shared shared checker)"
    tree=$(cargo tree -q -p "spike-$kind-server" -e normal --prefix none | sed 's/ (\*)//;s/ (proc-macro)//;s/ (\/.*)//' | sort -u)
    new=$(comm -13 <(echo "$sampler_tree" | sed 's/ (\/.*)//') <(echo "$tree") | grep -v '^spike-' || true)
    row[$kind.tree]="$(cargo tree -q -p "spike-$kind-server" -e normal | wc -l) lines; not in the sampler's tree: $(echo "$new" | grep -c . || true) ($(echo $new | sed 's/ v[0-9.]*//g;s/ /, /g'))"

    # System calls while loading 100 tables of 1 MiB (strace attached after the server listens).
    pid=$(start "$kind" 0)
    idle=$(hwm "$pid")
    strace -f -c -p "$pid" -o "$tmp/$kind.strace" 2>/dev/null & spid=$!
    sleep 0.5
    "$bin/spike-client" "$kind" "$tmp/$kind.sock" load100 > "$tmp/$kind.load100"
    sleep 0.2; kill -INT "$spid"; wait "$spid" || true
    awk 'NF >= 5 && $NF ~ /^[a-z_0-9]+$/ && $NF != "total" && $NF != "syscall" {print $NF}' "$tmp/$kind.strace" | sort -u > "$tmp/$kind.calls"
    extra=$(comm -23 "$tmp/$kind.calls" "$tmp/allowed" | tr '\n' ' ')
    row[$kind.calls]="$(wc -l < "$tmp/$kind.calls") distinct; not on the allowlist: ${extra:-none}"
    row[$kind.hwm]="$idle kB idle, $(hwm "$pid") kB after 100 tables"

    row[$kind.lat]=$("$bin/spike-client" "$kind" "$tmp/$kind.sock" latency | sed -n 's/^latency 1 MiB: //p')
    kill "$pid"; wait "$pid" 2>/dev/null || true; rm -f "$tmp/$kind.sock"

    # Flood: the client sends $flood chunks without waiting; the server takes 2 ms per chunk.
    pid=$(start "$kind" 2000)
    idle=$(hwm "$pid"); peak=0
    "$bin/spike-client" "$kind" "$tmp/$kind.sock" flood "$flood" > "$tmp/$kind.flood" & cpid=$!
    while kill -0 "$cpid" 2>/dev/null; do r=$(rss "$pid"); [ "$r" -gt "$peak" ] && peak=$r; sleep 0.1; done
    wait "$cpid"
    client=$(sed -n 's/.*client_vmhwm_kib=\([0-9]*\).*/\1/p' "$tmp/$kind.flood")
    row[$kind.flood]="$(sed -n 's/^flood: //p' "$tmp/$kind.flood"); server VmHWM $idle -> $(hwm "$pid") kB (peak RSS $peak kB); client VmHWM $client kB"
    kill "$pid"; wait "$pid" 2>/dev/null || true; rm -f "$tmp/$kind.sock"

    pid=$(start "$kind" 0)
    row[$kind.hostile]=$("$bin/spike-client" "$kind" "$tmp/$kind.sock" hostile | tr '\n' ';' | sed 's/client_vmhwm_kib=[0-9]*//')
    kill "$pid"; wait "$pid" 2>/dev/null || true
done

declare -A title=([rpc]="(a) capnp-rpc, Unix stream socket" [msg]="(b) plain capnp messages, SOCK_SEQPACKET")
line="| figure |"; rule="|---|"
for kind in "${kinds[@]}"; do line+=" ${title[$kind]} |"; rule+="---|"; done
echo "$line"; echo "$rule"
for f in "loc:server code, lines (no blanks/comments)" "tree:cargo tree -e normal of the server" \
         "calls:system calls loading 100 x 1 MiB (strace -c -f)" "hwm:server VmHWM (debug build)" \
         "lat:1 MiB table load, 22 chunks pipelined, 20 runs" "flood:flood ($flood x 48 KiB, server 2 ms/chunk)" \
         "hostile:hostile inputs"; do
    key=${f%%:*}; line="| ${f#*:} |"
    for kind in "${kinds[@]}"; do line+=" ${row[$kind.$key]} |"; done
    echo "$line"
done
echo
for kind in "${kinds[@]}"; do echo "strace of $kind: $(tr '\n' ' ' < "$tmp/$kind.calls")"; done
