#!/usr/bin/env bash
# Rebuilds the CUDA fixtures of the real-toolchain tests from gather.ptx (a gather kernel with
# the source lines of a /src/gather.cu), with ptxas and fatbinary from NVIDIA's
# nvidia-cuda-nvcc 13.0 wheel (no GPU, no CUDA install needed), gcc and objcopy:
#   gather_sm90.cubin         ptxas -lineinfo, sm_90 (gpuprof-cupti: CRC and source lines)
#   gather_{plain,lz4,zstd,ptx}.fatbin
#                             fatbinary: uncompressed, --compress-mode=speed, size, and the
#                             cubin beside its PTX (gpuprof-inject's fatbin reader)
#   libgather.so              a gcc shared library with the zstd fatbin as its .nv_fatbin
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$tmp" nvidia-cuda-nvcc==13.0.88
(cd "$tmp" && python3 -m zipfile -e nvidia_cuda_nvcc-*.whl x)
bin=$tmp/x/nvidia/cu13/bin
chmod +x "$bin/ptxas" "$bin/fatbinary"
"$bin/ptxas" -arch=sm_90 -lineinfo -O3 -o gather_sm90.cubin gather.ptx
img=(--image3=kind=elf,sm=90,file=gather_sm90.cubin)
"$bin/fatbinary" --create=gather_plain.fatbin "${img[@]}"
"$bin/fatbinary" --create=gather_lz4.fatbin --compress-all --compress-mode=speed "${img[@]}"
"$bin/fatbinary" --create=gather_zstd.fatbin --compress-all --compress-mode=size "${img[@]}"
"$bin/fatbinary" --create=gather_ptx.fatbin --compress-all "${img[@]}" --image3=kind=ptx,sm=90,file=gather.ptx
echo 'int gather_host(void) { return 1; }' >"$tmp/host.c"
gcc -shared -fPIC -O2 -s -o libgather.so "$tmp/host.c"
objcopy --add-section .nv_fatbin=gather_zstd.fatbin libgather.so
ls -l gather* libgather.so
