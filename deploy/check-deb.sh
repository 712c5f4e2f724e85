#!/usr/bin/env bash
# Builds the gpuprof .deb (cargo-deb, metadata in daemon/Cargo.toml), installs it, checks the
# installed files, then purges it and checks nothing is left. Needs root and dpkg; run from
# .ci/run. Installs cargo-deb when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ] || ! command -v dpkg >/dev/null 2>&1; then
  echo "!!! not root or no dpkg: NOT CHECKING the .deb package (deploy/check-deb.sh) !!!" >&2
  exit 0
fi
if dpkg -s gpuprof >/dev/null 2>&1; then
  echo "check-deb: a gpuprof package is already installed here; remove it first (dpkg --purge gpuprof)" >&2
  exit 1
fi
command -v cargo-deb >/dev/null 2>&1 || cargo install cargo-deb --locked
cargo build --release --locked -p gpuprofd -p gpuprofctl -p gpuprof-sampler -p gpuprof-inject
deb="$(cargo deb -p gpuprofd --no-build | tail -1)"
echo "check-deb: built $deb"
dpkg-deb --contents "$deb"
trap 'dpkg --purge gpuprof >/dev/null 2>&1 || true' EXIT
dpkg -i "$deb"

# The installed programs, from their installed paths.
/usr/bin/gpuprofd check-config /etc/gpuprof/gpuprofd.toml
/usr/bin/gpuprofctl --version
/usr/bin/gpuprofd --version
test -x /usr/bin/gpuprof-sampler
# The injector at its one documented path, exporting the entry point the CUDA driver calls.
test -f /usr/lib/gpuprof/libgpuprof_inject.so
if command -v nm >/dev/null 2>&1; then
  nm -D --defined-only /usr/lib/gpuprof/libgpuprof_inject.so | grep -qw InitializeInjection
fi
test -f /lib/systemd/system/gpuprofd.service
# The README and the guides it links to.
test -f /usr/share/doc/gpuprof/README.md && test -f /usr/share/doc/gpuprof/docs/operating.md
getent group gpuprof >/dev/null
test "$(stat -c %G /var/lib/gpuprof)" = gpuprof
# Nothing enabled or started by the installation.
if [ -d /run/systemd/system ]; then
  ! systemctl is-enabled --quiet gpuprofd
  ! systemctl is-active --quiet gpuprofd
fi
test ! -e /etc/systemd/system/multi-user.target.wants/gpuprofd.service

dpkg --purge gpuprof
trap - EXIT
for f in /usr/bin/gpuprofd /usr/bin/gpuprofctl /usr/bin/gpuprof-sampler /usr/lib/gpuprof \
  /lib/systemd/system/gpuprofd.service /etc/gpuprof /var/lib/gpuprof /usr/lib/sysusers.d/gpuprof.conf \
  /usr/lib/tmpfiles.d/gpuprof.conf; do
  if [ -e "$f" ]; then
    echo "check-deb: $f is left after dpkg --purge" >&2
    exit 1
  fi
done
echo "check-deb: install, check and purge of $deb passed"
