#!/usr/bin/env bash
# Makes (once) and caches the Debian roots whose CPython builds the relay's interpreter tests
# read: trixie (CPython 3.13) and sid (CPython 3.14), outside the checkout, under
# $EMBER_PYTHON_ROOTS (default /var/cache/ember/roots). Idempotent: a root whose python3 already
# runs is left as it is, so a second run returns in well under a second.
#
# The tests (relay/src/interp/cpython/tests.rs, and tests/tests/python.rs which runs
# <root>/usr/bin/python3 under chroot) look for <root>/{trixie,sid}/usr/bin/python3* and fail
# naming this script when a binary they expect is missing. scripts/setup.sh runs it (as root).
#
# Needs root (debootstrap, chroot) and the network; about 30 s and 200 MiB per root.
set -euo pipefail
log() { printf '[python-roots] %s\n' "$*"; }
dest=${EMBER_PYTHON_ROOTS:-/var/cache/ember/roots}
# The mirror this machine's apt already uses (deb822 .sources first, then one-line lists).
mirror=${EMBER_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' |
    grep -v security | head -n1 || true)
fi
if [ -z "$mirror" ]; then
  mirror=$(grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
    awk '$2 ~ /debian\/?$/ {print $2}' | head -n1 || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}
if [ "$(id -u)" -ne 0 ]; then
  echo "error: debootstrap and chroot need root; run: sudo $0" >&2
  exit 1
fi
if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi
mkdir -p "$dest"
for suite in trixie sid; do
  dir=$dest/$suite
  if chroot "$dir" python3 -c 'import sys' 2>/dev/null; then
    log "$suite: $(chroot "$dir" python3 --version) already in $dir"
    continue
  fi
  # A root left half-made by an interrupted run is made again from scratch.
  rm -rf "$dir.partial"
  log "$suite: debootstrap from $mirror into $dir"
  debootstrap --variant=minbase "$suite" "$dir.partial" "$mirror" >"$dest/$suite.log" 2>&1 || {
    echo "error: debootstrap $suite failed; see $dest/$suite.log" >&2
    exit 1
  }
  # sid's Release file may be older than its Valid-Until on a snapshot mirror.
  chroot "$dir.partial" apt-get -qq -o Acquire::Check-Valid-Until=false update >>"$dest/$suite.log" 2>&1
  DEBIAN_FRONTEND=noninteractive chroot "$dir.partial" \
    apt-get install -y -qq --no-install-recommends python3 >>"$dest/$suite.log" 2>&1 || {
    echo "error: apt-get install python3 in $suite failed; see $dest/$suite.log" >&2
    exit 1
  }
  rm -rf "$dir"
  mv "$dir.partial" "$dir"
  log "$suite: $(chroot "$dir" python3 --version) in $dir"
done
