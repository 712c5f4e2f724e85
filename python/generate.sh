#!/usr/bin/env bash
# Regenerates the protocol code of the `gpuprof` Python package (src/gpuprof/v1/) from the
# repository's proto/gpuprof/v1/gpuprof.proto, with type stubs (.pyi). Needs grpcio-tools
# (`pip install grpcio-tools`, or PYTHONPATH pointing at it). The output is committed;
# tests/tests/python_package.rs fails when it is out of date.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here/src}"
python="${PYTHON:-python3}"
"$python" -m grpc_tools.protoc -I "$here/../proto" \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  "$here/../proto/gpuprof/v1/gpuprof.proto"
