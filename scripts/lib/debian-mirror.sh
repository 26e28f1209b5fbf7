# Sourced by the scripts that make Debian roots with debootstrap: sets `mirror` to the mirror
# this machine's apt already uses (deb822 .sources first, then one-line lists), unless
# EMBER_DEBIAN_MIRROR names one; deb.debian.org when neither says.
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
