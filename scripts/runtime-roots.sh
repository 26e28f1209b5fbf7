#!/usr/bin/env bash
# Makes (once) and caches the Debian roots whose runtimes the tests profile, outside the
# checkout, under $EMBER_ROOTS (default /var/cache/ember/roots; EMBER_PYTHON_ROOTS is read too):
#   trixie: CPython 3.13, Node 20, Go 1.24, OpenJDK 21
#   sid:    CPython 3.14, Node 24, OpenJDK 25
# The host's own Debian 12 gives the older line of each (CPython 3.11, Node 18, Go 1.19,
# OpenJDK 17: scripts/setup.sh), pyenv the other CPythons.
#
# Idempotent: a root that has every package is left as it is (well under a second); a root
# missing some gets only those; a root that does not run at all is made again.
#
# The tests (relay/src/interp/cpython/tests.rs, tests/tests/python.rs and the JIT and Go tests,
# which run the roots' programs under chroot) fail naming this script when a root is missing.
# scripts/setup.sh runs it (as root).
#
# Needs root (debootstrap, chroot) and the network; about 30 s for a root, then the packages
# (about 1 GiB for both roots, most of it the two JDKs).
set -euo pipefail
log() { printf '[runtime-roots] %s\n' "$*"; }
dest=${EMBER_ROOTS:-${EMBER_PYTHON_ROOTS:-/var/cache/ember/roots}}
# shellcheck source=scripts/lib/debian-mirror.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/debian-mirror.sh"
if [ "$(id -u)" -ne 0 ]; then
  echo "error: debootstrap and chroot need root; run: sudo $0" >&2
  exit 1
fi
if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi
# The packages of each root.
packages() {
  case "$1" in
    trixie) echo python3 nodejs golang-go openjdk-21-jdk-headless ;;
    sid) echo python3 nodejs openjdk-25-jdk-headless ;;
  esac
}
# The packages of root $1 not installed in it.
missing() {
  local p
  for p in $(packages "$1"); do
    chroot "$dest/$1" dpkg-query -W -f='${Status}' "$p" 2>/dev/null |
      grep -q 'install ok installed' || printf '%s ' "$p"
  done
}
# apt-get install in the root at $1 (suite $2; its log: $dest/$2.log). The JDKs' install
# scripts run `java`, which needs /proc: mounted in the root for the install only.
install() {
  local dir=$1 suite=$2 status=0
  shift 2
  mount -t proc proc "$dir/proc"
  {
    # A package an interrupted run left unpacked is configured first.
    DEBIAN_FRONTEND=noninteractive chroot "$dir" dpkg --configure -a &&
      # sid's Release file may be older than its Valid-Until on a snapshot mirror.
      chroot "$dir" apt-get -qq -o Acquire::Check-Valid-Until=false update &&
      DEBIAN_FRONTEND=noninteractive chroot "$dir" \
        apt-get install -y -qq --no-install-recommends "$@"
  } >>"$dest/$suite.log" 2>&1 || status=$?
  umount "$dir/proc"
  if [ "$status" -ne 0 ]; then
    echo "error: apt-get install $* in $suite failed; see $dest/$suite.log" >&2
    exit 1
  fi
}
mkdir -p "$dest"
for suite in trixie sid; do
  dir=$dest/$suite
  if chroot "$dir" true 2>/dev/null; then
    need=$(missing "$suite")
    if [ -z "$need" ]; then
      log "$suite: $(packages "$suite") already in $dir"
      continue
    fi
    log "$suite: installing $need into $dir"
    # shellcheck disable=SC2086 # one word per package
    install "$dir" "$suite" $need
    continue
  fi
  # A root left half-made by an interrupted run is made again from scratch.
  rm -rf "$dir.partial"
  log "$suite: debootstrap from $mirror into $dir"
  debootstrap --variant=minbase "$suite" "$dir.partial" "$mirror" >"$dest/$suite.log" 2>&1 || {
    echo "error: debootstrap $suite failed; see $dest/$suite.log" >&2
    exit 1
  }
  # shellcheck disable=SC2046 # one word per package
  install "$dir.partial" "$suite" $(packages "$suite")
  rm -rf "$dir"
  mv "$dir.partial" "$dir"
  log "$suite: $(chroot "$dir" python3 --version), $(packages "$suite") in $dir"
done
