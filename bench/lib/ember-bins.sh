# Sourced by the bench scripts: which ember build a run uses.
#
# ember_bin_dir ROOT [DIR]: prints DIR when given, else ROOT/target/release when it holds both
# ember-sampler and ember-relay, else ROOT/target/debug; returns 1 with the fix on stderr when
# the chosen directory lacks either binary.
ember_bin_dir() {
  local root=$1 dir=${2:-}
  if [ -z "$dir" ]; then
    dir=$root/target/release
    [ -x "$dir/ember-sampler" ] && [ -x "$dir/ember-relay" ] || dir=$root/target/debug
  fi
  if [ ! -x "$dir/ember-sampler" ] || [ ! -x "$dir/ember-relay" ]; then
    echo "no ember-sampler and ember-relay in $dir: cargo build --release -p ember-sampler -p ember-relay" >&2
    return 1
  fi
  echo "$dir"
}
