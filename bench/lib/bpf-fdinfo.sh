# Sourced by the bench scripts: what the kernel says of a process's BPF objects.
#
# bpf_fdinfo_sum PID KIND FIELD: FIELD (a number in fdinfo, e.g. run_time_ns or memlock) summed
# over the BPF objects of KIND (prog or map) that PID holds open; 0 when it holds none or is gone.
bpf_fdinfo_sum() {
  local fd sum=0 v
  for fd in /proc/"$1"/fd/*; do
    [ "$(readlink "$fd" 2>/dev/null)" = "anon_inode:bpf-$2" ] || continue
    v=$(awk -v field="$3:" '$1 == field { print $2 }' "/proc/$1/fdinfo/${fd##*/}" 2>/dev/null) || v=
    sum=$((sum + ${v:-0}))
  done
  echo "$sum"
}
