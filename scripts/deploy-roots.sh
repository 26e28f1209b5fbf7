#!/usr/bin/env bash
# Makes (once) and caches what tests/tests/deploy_live.rs runs the deployments on, outside the
# checkout, under $EMBER_DEPLOY_CACHE (default /var/cache/ember/deploy):
#   bookworm/, trixie/  Debian 12 and 13 roots (debootstrap minbase) with systemd (252 and 257),
#               dbus, libnss-systemd (the relay's DynamicUser= name resolves through it) and
#               ca-certificates: booted with `systemd-nspawn -b` to run systemd/*.service for
#               real under both systemd versions (they differ in what a unit grants).
#   bookworm.tar  the Debian 12 root as a tar stream, what `docker import` reads to make the
#               base image of compose/Dockerfile (no registry needed).
# The Docker image itself is imported by the test into its own dockerd (its --data-root lives
# under the same cache, so the import is done once too).
#
# Idempotent: a root that has its packages is left as it is (well under a second); a root
# left half-made by an interrupted run is made again.
#
# Needs root (debootstrap, chroot) and the Debian mirror apt uses; about a minute the first time.
# scripts/setup.sh runs it (test purpose only).
set -euo pipefail
log() { printf '[deploy-roots] %s\n' "$*"; }
dest=${EMBER_DEPLOY_CACHE:-/var/cache/ember/deploy}
packages="systemd systemd-sysv dbus libnss-systemd ca-certificates"
# shellcheck source=scripts/lib/debian-mirror.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/debian-mirror.sh"
if [ "$(id -u)" -ne 0 ]; then
  echo "error: debootstrap and chroot need root; run: sudo $0" >&2
  exit 1
fi
for tool in debootstrap; do
  command -v "$tool" >/dev/null || {
    echo "error: $tool is missing; run: sudo scripts/setup.sh" >&2
    exit 1
  }
done
mkdir -p "$dest"
complete() {
  local p
  chroot "$1" true 2>/dev/null || return 1
  for p in $packages; do
    chroot "$1" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
      return 1
  done
}
for suite in bookworm trixie; do
  dir=$dest/$suite
  if complete "$dir"; then
    log "$suite: $packages already in $dir"
  else
    rm -rf "$dir.partial" "$dest/$suite.tar"
    log "$suite: debootstrap from $mirror into $dir"
    # shellcheck disable=SC2086 # one word per package
    debootstrap --variant=minbase --include="$(echo $packages | tr ' ' ,)" "$suite" "$dir.partial" \
      "$mirror" >"$dest/$suite.log" 2>&1 || {
      echo "error: debootstrap $suite failed; see $dest/$suite.log" >&2
      exit 1
    }
    # No apt lists or caches in the image; a machine id is made at each boot.
    rm -rf "$dir.partial"/var/lib/apt/lists/* "$dir.partial"/var/cache/apt/*.bin
    : >"$dir.partial/etc/machine-id"
    complete "$dir.partial" || {
      echo "error: $suite root lacks some of: $packages; see $dest/$suite.log" >&2
      exit 1
    }
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
    log "$suite: $(chroot "$dir" systemctl --version | head -n1) in $dir"
  fi
done
suite=bookworm
dir=$dest/$suite
if [ ! -s "$dest/$suite.tar" ] || [ "$dest/$suite.tar" -ot "$dir" ]; then
  log "$suite: packing $dest/$suite.tar (docker import reads it)"
  tar -C "$dir" --numeric-owner -cf "$dest/$suite.tar.partial" .
  mv "$dest/$suite.tar.partial" "$dest/$suite.tar"
fi
log "ready: $dest/bookworm, $dest/trixie, $dest/$suite.tar"
