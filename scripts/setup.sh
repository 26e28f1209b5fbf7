#!/usr/bin/env bash
# Installs what ember needs on a fresh Debian 12 machine: `scripts/setup.sh` for building and
# testing (everything below), `scripts/setup.sh record` for building and recording only (the
# capnp compiler, a C compiler, the nightly rust-src and bpf-linker; what scripts/record.sh uses).
# Idempotent: each step checks first and returns in well under a second when already done.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
log() { printf '[setup] %s\n' "$*"; }
purpose=${1:-test}
case "$purpose" in
  test | record) ;;
  *) echo "usage: scripts/setup.sh [test|record]" >&2; exit 2 ;;
esac

# 1. Debian packages: capnp compiler (protocol schema), perf + bpftrace (benchmark comparison),
#    gcc/make (ground-truth workloads), libcap2-bin (capsh, used by tests to inspect sets),
#    and the deployment gates (tests/tests/deploy.rs): systemd (systemd-analyze verify/security
#    for systemd/*.service), docker-compose (Debian's v1, `config` for compose/compose.yaml; it
#    needs no Docker engine for that), python3-venv (the venvs of kubernetes-validate, step 4,
#    and of the OTLP decoders, step 5), openssl (certificates for the TLS export tests),
#    golang-go (`go tool pprof -raw`, a pprof reader that is not ours, reads profile.pb.gz in
#    tests/tests/e2e.rs; and Go 1.19, whose programs the Go tests profile), and the other
#    runtimes the JIT tests profile: nodejs (Node 18) and openjdk-17-jdk-headless (`java`,
#    `jcmd`; the newer lines of each are in the roots of scripts/runtime-roots.sh, step 9), and
#    what tests/tests/deploy_live.rs runs the deployments on for real: docker.io (an engine the
#    test starts and stops itself; it never runs as a service here), debootstrap and
#    systemd-container (systemd-nspawn boots the root of scripts/deploy-roots.sh, step 10).
#    EMBER_SETUP_GATES=0 leaves the gate and test tools out (compose/Dockerfile, which only builds).
gates=${EMBER_SETUP_GATES:-1}
if [ "$purpose" = record ]; then
  gates=0
  pkgs=(capnproto gcc make)
else
  pkgs=(capnproto gcc make linux-perf bpftrace libcap2-bin procps)
fi
[ "$gates" = 0 ] || pkgs+=(systemd docker-compose python3-venv openssl golang-go nodejs
  openjdk-17-jdk-headless docker.io debootstrap systemd-container)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing Debian packages: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "error: need root to apt-get install ${missing[*]}; run as root or install them yourself" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. Nightly rust-src for -Z build-std=core (the eBPF target has no prebuilt core).
if ! rustup component list --toolchain nightly --installed 2>/dev/null | grep -q '^rust-src'; then
  log "adding rust-src to the nightly toolchain"
  rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
  rustup component add rust-src --toolchain nightly || {
    echo "error: 'rustup component add rust-src --toolchain nightly' failed; the eBPF build needs it" >&2
    exit 1
  }
fi

# 3. bpf-linker 0.13.0 built against the nightly toolchain's own libLLVM, installed in .tools/.
sysroot=$(rustc +nightly --print sysroot)
llvm_real=$(find "$sysroot/lib" -maxdepth 1 -name 'libLLVM.so.*' -type f | head -n1)
if [ -z "$llvm_real" ]; then
  echo "error: no libLLVM.so.* under $sysroot/lib; reinstall the nightly toolchain" >&2
  exit 1
fi
llvm_name=$(basename "$llvm_real")
llvm_major=$(echo "$llvm_name" | sed -E 's/^libLLVM\.so\.([0-9]+).*/\1/')
linker="$root/.tools/bin/bpf-linker"
need_build=1
if [ -x "$linker" ] && "$linker" --version 2>/dev/null | grep -q '0.13.0' \
  && readelf -d "$linker" 2>/dev/null | grep -q "NEEDED.*\[$llvm_name\]" \
  && readelf -d "$linker" 2>/dev/null | grep -q "$root/.tools/llvm/lib"; then
  need_build=0
fi
if [ $need_build -eq 1 ]; then
  log "building bpf-linker 0.13.0 against $llvm_name (about a minute)"
  mkdir -p .tools/llvm/lib
  ln -sf "$llvm_real" .tools/llvm/lib/libLLVM.so
  ln -sf "$llvm_real" ".tools/llvm/lib/$llvm_name"
  LLVM_PREFIX="$root/.tools/llvm" cargo +nightly install --locked --root "$root/.tools" \
    bpf-linker@0.13.0 --no-default-features --features "llvm-$llvm_major" --force -q
fi
# 4. kubernetes-validate (PyPI) in its own venv under .tools/, for the deploy/kubernetes/ gate.
#    It ships the Kubernetes JSON schemas, so validating needs no network. Skipped (fast) when the
#    venv already has this version and its interpreter still runs. The same venv holds the
#    official Prometheus Python client, whose text parser reads the relay's /metrics in
#    tests/tests/metrics.rs.
kv_version=1.37.0
pc_version=0.26.0
venv="$root/.tools/venv"
if [ "$gates" != 0 ] && ! { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c '' 2>/dev/null \
  && compgen -G "$venv/lib/python3*/site-packages/kubernetes_validate-$kv_version.dist-info" >/dev/null; }; then
  log "installing kubernetes-validate $kv_version into .tools/venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "kubernetes-validate==$kv_version"
fi
if [ "$gates" != 0 ] && ! "$venv/bin/python" -c "import importlib.metadata as m, sys; \
    sys.exit(m.version('prometheus-client') != '$pc_version')" 2>/dev/null; then
  log "installing prometheus-client $pc_version (the /metrics parser) into .tools/venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "prometheus-client==$pc_version"
fi

# 5. Independent OTLP decoders for the export tests: the official Python `opentelemetry-proto`
#    package, 1.40.0 (profiles v1.9 layout) and 1.45.2 (v1.10), each in its own venv under .tools/.
for pair in "1.9:1.40.0" "1.10:1.45.2"; do
  [ "$gates" != 0 ] || break
  gen=${pair%%:*}
  version=${pair#*:}
  venv="$root/.tools/py-otlp-$gen"
  if ! "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('opentelemetry-proto') != '$version')" 2>/dev/null; then
    log "installing opentelemetry-proto==$version (OTLP profiles v$gen decoder) into $venv"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check "opentelemetry-proto==$version"
  fi
done

# 6. cargo-mutants 27.1.0 in .tools/bin, for the mutation step of scripts/test.sh
#    (scripts/mutants.sh --ci). Skipped (fast) when that version is already there.
mutants_version=27.1.0
if [ "$gates" != 0 ] && ! "$root/.tools/bin/cargo-mutants" mutants --version 2>/dev/null \
  | grep -qx "cargo-mutants $mutants_version"; then
  log "building cargo-mutants $mutants_version into .tools/bin (a few minutes)"
  cargo install --locked --root "$root/.tools" "cargo-mutants@$mutants_version" --force -q
fi

# 7. cargo-fuzz 0.13.2 in .tools/bin, for scripts/fuzz.sh (libFuzzer targets under fuzz/, built
#    with the nightly toolchain of step 2). Skipped (fast) when that version is already there.
fuzz_version=0.13.2
if [ "$gates" != 0 ] && ! "$root/.tools/bin/cargo-fuzz" --version 2>/dev/null \
  | grep -qx "cargo-fuzz $fuzz_version"; then
  log "building cargo-fuzz $fuzz_version into .tools/bin (about a minute)"
  cargo install --locked --root "$root/.tools" "cargo-fuzz@$fuzz_version" --force -q
fi

# 8. speedscope's own JSON schema of its file format (shipped in the `speedscope` npm package)
#    and `jsonschema` (PyPI) in .tools/venv: tests/tests/record.rs validates the
#    profile.speedscope.json that `record --format speedscope` writes against them. npm comes
#    with Node.js; Debian's npm package is installed when it is missing.
ss_version=1.25.0
ss_schema="$root/.tools/speedscope-$ss_version/file-format-schema.json"
if [ "$gates" != 0 ] && [ ! -s "$ss_schema" ]; then
  if ! command -v npm >/dev/null; then
    log "installing npm (to fetch speedscope's file-format schema)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends npm >/dev/null
  fi
  log "fetching speedscope $ss_version's file-format schema into $(dirname "$ss_schema")"
  ss_tmp=$(mktemp -d)
  (cd "$ss_tmp" && npm pack --silent "speedscope@$ss_version" >/dev/null)
  mkdir -p "$(dirname "$ss_schema")"
  tar -xzf "$ss_tmp/speedscope-$ss_version.tgz" -C "$ss_tmp" package/dist/release/file-format-schema.json
  mv "$ss_tmp/package/dist/release/file-format-schema.json" "$ss_schema"
  rm -rf "$ss_tmp"
fi
js_version=4.26.0
if [ "$gates" != 0 ] && ! "$root/.tools/venv/bin/python" -c "import importlib.metadata as m, sys; \
    sys.exit(m.version('jsonschema') != '$js_version')" 2>/dev/null; then
  log "installing jsonschema $js_version (the speedscope file check) into .tools/venv"
  "$root/.tools/venv/bin/pip" install -q --disable-pip-version-check "jsonschema==$js_version"
fi

# 9. The runtimes the tests profile beyond the host's own (scripts/runtime-roots.sh): Debian
#    trixie (CPython 3.13, Node 20, Go 1.24, OpenJDK 21) and sid (CPython 3.14, Node 24,
#    OpenJDK 25) roots under /var/cache/ember/roots, run under chroot, made once, before
#    scripts/test.sh runs any test; pyenv's 3.6-3.13 and the host's python3 are the machine's own
#    (docs/runtimes.md).
if [ "$gates" != 0 ] && [ "$(id -u)" -eq 0 ]; then
  bash "$root/scripts/runtime-roots.sh"
fi

# 10. The Debian 12 root with systemd that tests/tests/deploy_live.rs boots with systemd-nspawn
#     and imports as the base image of compose/Dockerfile (scripts/deploy-roots.sh), cached under
#     /var/cache/ember/deploy: about two minutes the first time, then well under a second.
if [ "$gates" != 0 ] && [ "$(id -u)" -eq 0 ]; then
  bash "$root/scripts/deploy-roots.sh"
fi

gate_tools=""
[ "$gates" = 0 ] || gate_tools=", kubernetes-validate $kv_version, prometheus-client $pc_version, cargo-mutants $mutants_version, cargo-fuzz $fuzz_version, speedscope schema $ss_version, jsonschema $js_version"
log "ready: capnp $(capnp --version | awk '{print $NF}'), $("$linker" --version)$gate_tools"
