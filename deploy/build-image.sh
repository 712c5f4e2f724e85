#!/usr/bin/env bash
# Builds the gpuprof container image with buildah, without a registry or a container engine:
# a Debian root file system made by mmdebstrap from Debian's packages (libc6 and libgcc-s1,
# all that gpuprofd, gpuprofctl, gpuprof-sampler and libcupti load, and busybox for the `sh`,
# `cp` and `mv` of the DaemonSet's init container, deploy/k8s/gpuprofd.yaml), gpuprof's
# release binaries, libcupti for the PM samplers and the example configuration, committed
# from `buildah from scratch`. No compiler, package manager, documentation or package cache
# goes in. Needs root, buildah and mmdebstrap (apt-get install buildah mmdebstrap), the
# release build and Debian's mirror (for mmdebstrap):
#
#   cargo build --release --locked -p gpuprofd -p gpuprofctl -p gpuprof-sampler -p gpuprof-inject
#   deploy/build-image.sh [TAG]                 # default tag localhost/gpuprof:<version>
#
# libcupti (libcupti.so.13 and libnvperf_host.so, which it loads for PM sampling) comes from
# NVIDIA's nvidia-cuda-cupti 13.0 wheel, as in .ci/run: GPUPROF_CUPTI_DIR names a directory
# holding both, else target/ci-cupti/nvidia/cu13/lib is used, the wheel downloaded there with
# pip when it is missing. Without network access, put the two files in GPUPROF_CUPTI_DIR. The
# Debian release is this machine's (GPUPROF_IMAGE_SUITE overrides it, GPUPROF_IMAGE_MIRROR the
# mirror), so that the binaries find the glibc they were built against. Set
# CONTAINERS_STORAGE_CONF to keep the image in a storage of its own (deploy/check-image.sh does),
# GPUPROF_IMAGE_BIN_DIR to take the programs from elsewhere than target/release.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null 2>&1 || { echo "build-image: $tool is not installed (apt-get install $tool)" >&2; exit 1; }
done
[ "$(id -u)" = 0 ] || { echo "build-image: run as root (mmdebstrap and buildah's storage)" >&2; exit 1; }
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
tag="${1:-localhost/gpuprof:$version}"
rel="${GPUPROF_IMAGE_BIN_DIR:-target/release}"
for f in gpuprofd gpuprofctl gpuprof-sampler libgpuprof_inject.so; do
  [ -f "$rel/$f" ] || {
    echo "build-image: no $rel/$f: cargo build --release --locked -p gpuprofd -p gpuprofctl -p gpuprof-sampler -p gpuprof-inject" >&2
    exit 1
  }
done

cupti="${GPUPROF_CUPTI_DIR:-target/ci-cupti/nvidia/cu13/lib}"
if [ -z "${GPUPROF_CUPTI_DIR:-}" ] && [ ! -e "$cupti/libcupti.so.13" ]; then
  mkdir -p target/ci-cupti
  python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    -d target/ci-cupti nvidia-cuda-cupti==13.0.85
  (cd target/ci-cupti && python3 -m zipfile -e nvidia_cuda_cupti-*.whl .)
fi
for f in libcupti.so.13 libnvperf_host.so; do
  [ -f "$cupti/$f" ] || { echo "build-image: no $cupti/$f (see GPUPROF_CUPTI_DIR)" >&2; exit 1; }
done

suite="${GPUPROF_IMAGE_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")}"
work="$(mktemp -d "${TMPDIR:-/tmp}/gpuprof-image.XXXXXX")"
ctr=""
cleanup() {
  [ -z "$ctr" ] || buildah rm "$ctr" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
root="$work/root"

# The root file system: the packages' files only (variant extract runs no maintainer scripts:
# these have none that matter), without documentation, locales' converters or apt's state.
mmdebstrap --quiet --variant=extract --include=libc6,libgcc-s1,busybox "$suite" "$root" ${GPUPROF_IMAGE_MIRROR:+"$GPUPROF_IMAGE_MIRROR"}
rm -rf "$root"/usr/share/doc "$root"/usr/share/lintian "$root"/usr/share/man "$root"/usr/share/info \
  "$root"/usr/lib/x86_64-linux-gnu/gconv "$root"/etc/apt "$root"/var/cache/apt "$root"/var/lib/apt \
  "$root"/var/log/* "$root"/etc/resolv.conf "$root"/etc/hostname
# Accounts: root, and the group whose members administer gpuprofd (api.admin_group).
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\ngpuprof:x:999:\nnogroup:x:65534:\n' >"$root/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
install -d -m 1777 "$root/tmp"
install -d -m 0755 "$root/root" "$root/usr/bin" "$root/run/gpuprof" "$root/var/lib/gpuprof" "$root/usr/lib/gpuprof/cupti" "$root/etc/gpuprof"
install -m 0755 "$rel/gpuprofd" "$rel/gpuprofctl" "$rel/gpuprof-sampler" "$root/usr/bin/"
busybox=/bin/busybox
[ -e "$root$busybox" ] || busybox=/usr/bin/busybox
[ -e "$root$busybox" ] || { echo "build-image: busybox is not in the root file system" >&2; exit 1; }
for applet in sh cp mv; do
  [ -e "$root/usr/bin/$applet" ] || ln -s "$busybox" "$root/usr/bin/$applet"
done
[ -e "$root/bin/sh" ] || ln -s "$busybox" "$root/bin/sh"
install -m 0755 "$rel/libgpuprof_inject.so" "$root/usr/lib/gpuprof/libgpuprof_inject.so"
install -m 0644 "$cupti/libcupti.so.13" "$cupti/libnvperf_host.so" "$root/usr/lib/gpuprof/cupti/"
install -m 0644 deploy/gpuprofd.toml "$root/etc/gpuprof/gpuprofd.toml"
# Line tables (file and line in backtraces) serve the tests; the image's programs go without
# them (a fifth the size) and keep their symbols, so that backtraces still name functions.
if command -v strip >/dev/null 2>&1; then
  strip --strip-debug "$root"/usr/bin/gpuprofd "$root"/usr/bin/gpuprofctl "$root"/usr/bin/gpuprof-sampler \
    "$root/usr/lib/gpuprof/libgpuprof_inject.so"
fi
tar -C "$root" --numeric-owner -cf "$work/root.tar" .

ctr="$(buildah from --quiet scratch)"
buildah add --quiet "$ctr" "$work/root.tar" / >/dev/null
# The samplers' libcupti (the driver itself comes from the NVIDIA container runtime).
buildah config \
  --env GPUPROF_CUPTI_LIBRARY=/usr/lib/gpuprof/cupti/libcupti.so.13 \
  --env PATH=/usr/bin:/bin \
  --volume /run/gpuprof --volume /var/lib/gpuprof \
  --entrypoint '["/usr/bin/gpuprofd"]' --cmd '["--config", "/etc/gpuprof/gpuprofd.toml"]' \
  --label org.opencontainers.image.title=gpuprof \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.licenses=Apache-2.0 \
  --label org.opencontainers.image.base.name="debian:$suite (mmdebstrap: libc6 libgcc-s1 busybox)" \
  "$ctr"
buildah commit --quiet --rm "$ctr" "$tag" >/dev/null
ctr=""
echo "build-image: built $tag"
