#!/usr/bin/env bash
# Builds the gpuprof container image (deploy/Containerfile) with buildah, without network
# access during the build. Two steps need the network and run before it, on this machine:
# vendoring the Rust crates (cargo vendor, from the local cargo cache when it has them all)
# and downloading the libcupti wheel (pip); `--offline-only` skips both and uses what
# target/image-vendor/ already holds. The base images must be present locally
# (`buildah pull docker.io/library/rust:1-bookworm docker.io/library/debian:bookworm-slim`).
#
#   deploy/build-image.sh [--offline-only] [TAG]      # default tag gpuprof:<version>
set -euo pipefail
cd "$(dirname "$0")/.."
offline_only=0
if [ "${1:-}" = --offline-only ]; then
  offline_only=1
  shift
fi
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
tag="${1:-gpuprof:$version}"
vendor=target/image-vendor
if ! command -v buildah >/dev/null 2>&1; then
  echo "build-image: buildah is not installed (apt-get install buildah)" >&2
  exit 1
fi
if [ "$offline_only" = 0 ]; then
  mkdir -p "$vendor/wheels"
  cargo vendor --locked --versioned-dirs "$vendor/crates" >/dev/null
  ls "$vendor"/wheels/nvidia_cuda_cupti-*.whl >/dev/null 2>&1 ||
    python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      -d "$vendor/wheels" nvidia-cuda-cupti==13.0.85
fi
test -d "$vendor/crates" || { echo "build-image: no $vendor/crates (run without --offline-only once)" >&2; exit 1; }
ls "$vendor"/wheels/nvidia_cuda_cupti-*.whl >/dev/null
for img in docker.io/library/rust:1-bookworm docker.io/library/debian:bookworm-slim; do
  buildah inspect --type image "$img" >/dev/null 2>&1 ||
    { echo "build-image: base image $img is not here: buildah pull $img" >&2; exit 1; }
done
buildah build --network=none --pull=never --layers -f deploy/Containerfile -t "$tag" .
echo "build-image: built $tag"
