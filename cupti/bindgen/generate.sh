#!/usr/bin/env bash
# Regenerates the gpuprof-cupti crate's generated files from the CUDA 13.0 headers of the PyPI
# wheels nvidia-cuda-cupti and nvidia-cuda-runtime (plus nvidia-cuda-crt, whose
# crt/host_defines.h the runtime headers include):
#   src/sys/cupti.rs   CUPTI types, constants and a run-time loaded function table (activity
#                      tracing, callbacks, PM sampling, PC sampling, profiler host) for the injector and the
#                      PM sampler;
#   src/sys/cuda.rs    the CUDA driver calls both make (cuInit, device facts, waiting for the
#                      primary contexts before a trace detaches);
#   src/cbid_names.rs  runtime and driver API callback id -> function name, from the enums of
#                      cupti_runtime_cbid.h and cupti_driver_cbid.h.
# Run at development time only; the output is committed, so building gpuprof needs neither
# CUDA nor libclang.
#
# Needs: python3 -m pip, bindgen (`cargo install bindgen-cli --locked`), libclang
# (`apt-get install -y libclang-dev clang`), rustfmt.
#
# Usage: cupti/bindgen/generate.sh               (downloads the wheels into a temp dir)
#        CUDA_INCLUDE=/path/to/include cupti/bindgen/generate.sh   (use existing headers)
set -euo pipefail

CUPTI_WHEEL_VERSION=${CUPTI_WHEEL_VERSION:-13.0.85}
RUNTIME_WHEEL_VERSION=${RUNTIME_WHEEL_VERSION:-13.0.96}
CRT_WHEEL_VERSION=${CRT_WHEEL_VERSION:-13.0.88}

here=$(cd "$(dirname "$0")" && pwd)
src=$here/../src
out=$src/sys

if [ -z "${CUDA_INCLUDE:-}" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tmp" \
    "nvidia-cuda-cupti==$CUPTI_WHEEL_VERSION" "nvidia-cuda-runtime==$RUNTIME_WHEEL_VERSION" \
    "nvidia-cuda-crt==$CRT_WHEEL_VERSION"
  for w in "$tmp"/*.whl; do (cd "$tmp" && python3 -m zipfile -e "$w" .); done
  CUDA_INCLUDE=$tmp/nvidia/cu13/include
fi

api_version=$(sed -n 's/^#define CUPTI_API_VERSION \([0-9]*\).*/\1/p' "$CUDA_INCLUDE/cupti_version.h")
echo "CUPTI_API_VERSION=$api_version from $CUDA_INCLUDE" >&2

common=(
  --no-prepend-enum-name
  --default-enum-style consts
  --no-doc-comments
  --use-core
  --merge-extern-blocks
  --rust-edition 2024
  --rust-target 1.85
)

# CUPTI: types, constants and a run-time loaded function table (struct Cupti).
bindgen "$here/wrapper.h" "${common[@]}" \
  --dynamic-loading Cupti \
  --allowlist-function 'cupti(GetVersion|GetResultString|GetTimestamp|Finalize|Subscribe|Unsubscribe|EnableCallback|EnableDomain|GetCallbackName|GetContextId|GetDeviceId|GetStreamIdEx|DeviceGetChipName)' \
  --allowlist-function 'cuptiActivity(Enable|Disable|EnableRuntimeApi|EnableDriverApi|GetNextRecord|GetNumDroppedRecords|RegisterCallbacks|FlushAll|FlushPeriod|GetAttribute|SetAttribute|PushExternalCorrelationId|PopExternalCorrelationId|EnableLatencyTimestamps|EnableLaunchAttributes|EnableAllSyncRecords)' \
  --allowlist-function 'cuptiPmSampling.*' \
  --allowlist-function 'cuptiPCSampling(GetNumStallReasons|GetStallReasons|SetConfigurationAttribute|GetConfigurationAttribute|Enable|Disable|GetData|Start|Stop)' \
  --allowlist-function 'cupti(GetSassToSourceCorrelation|GetCubinCrc|RegisterComputeCrcCallback)' \
  --allowlist-function 'cuptiProfiler(Host.*|Initialize|DeInitialize|DeviceSupported)' \
  --allowlist-type 'CUpti_Activity(Kind|Flag|Attribute|ObjectKind|OverheadKind|MemcpyKind|MemoryKind|SynchronizationType|StreamFlag|LaunchType|ThreadIdType|ComputeApiKind)' \
  --allowlist-type 'CUpti_Activity(Kernel10|Memcpy6|MemcpyPtoP4|Memset4|API|Synchronization2|Overhead3|Marker2|MarkerData2|ExternalCorrelation|Device5|Context3|Stream|GraphTrace2|Name)' \
  --allowlist-type 'CUpti_(ExternalCorrelationKind|CallbackDomain|CallbackId|CallbackFunc|SubscriberHandle|ApiCallbackSite|CallbackData|ResourceData|BuffersCallbackRequestFunc|BuffersCallbackCompleteFunc)' \
  --allowlist-type 'CUpti_(runtime_api_trace_cbid|driver_api_trace_cbid|nvtx_api_trace_cbid).*' \
  --allowlist-type 'CUpti_(PmSampling|Profiler|Device_).*' \
  --allowlist-type 'CUpti_(PCSampling.*|GetSassToSourceCorrelationParams|GetCubinCrcParams|ComputeCrcCallbackFunc|ModuleResourceData|CallbackIdResource)' \
  --allowlist-type 'CUpti_(MetricType|ProfilerType)' \
  --allowlist-type 'CUptiResult' \
  --allowlist-type 'CUuuid|CUdevice|CUresult|CUdevice_attribute|CUcontext' \
  --allowlist-var 'CUPTI_API_VERSION' \
  --allowlist-var 'CUPTI_STALL_REASON_STRING_SIZE' \
  --output "$out/cupti.rs" \
  -- -I"$here/stub" -I"$CUDA_INCLUDE" -x c

# CUDA driver: cuInit (the PM sampler initialises the driver itself), the device facts every
# agent's hello reports, and waiting for the active primary contexts before a trace detaches
# (struct CudaDriver). Types come from cupti.rs.
bindgen "$here/wrapper.h" "${common[@]}" \
  --dynamic-loading CudaDriver \
  --allowlist-function 'cu(Init|DriverGetVersion|DeviceGetCount|DeviceGet|DeviceGetName|DeviceGetUuid_v2|DeviceGetAttribute|DeviceTotalMem_v2|DeviceGetPCIBusId)' \
  --allowlist-function 'cu(DevicePrimaryCtxGetState|DevicePrimaryCtxRetain|DevicePrimaryCtxRelease_v2|CtxPushCurrent_v2|CtxPopCurrent_v2|CtxSynchronize)' \
  --blocklist-type '.*' \
  --raw-line 'use super::cupti::*;' \
  --output "$out/cuda.rs" \
  -- -I"$here/stub" -I"$CUDA_INCLUDE" -x c

for f in "$out/cupti.rs" "$out/cuda.rs"; do
  { echo "// Generated by cupti/bindgen/generate.sh from the CUDA headers of nvidia-cuda-cupti $CUPTI_WHEEL_VERSION"
    echo "// and nvidia-cuda-runtime $RUNTIME_WHEEL_VERSION (CUPTI_API_VERSION $api_version). Do not edit."
    cat "$f"; } >"$f.tmp" && mv "$f.tmp" "$f"
done

# Callback id -> name tables from the enums (version suffixes such as _v3020 removed; the
# *_SIZE/INVALID/FORCE_INT entries skipped), sorted by id for binary search.
python3 - "$CUDA_INCLUDE" "$src/cbid_names.rs" "$CUPTI_WHEEL_VERSION" "$api_version" <<'PY'
import re, sys
inc, out, wheel, api = sys.argv[1:5]
def table(header, prefix):
    rows = {}
    for m in re.finditer(prefix + r"(\w+?)\s*=\s*(\d+)", open(f"{inc}/{header}").read()):
        name, cbid = m.group(1), int(m.group(2))
        if name in ("INVALID", "SIZE", "FORCE_INT"):
            continue
        name = re.sub(r"_v\d+$", "", name)
        rows.setdefault(cbid, name)
    return sorted(rows.items())
with open(out, "w") as f:
    f.write(f"// Generated by cupti/bindgen/generate.sh from cupti_runtime_cbid.h and cupti_driver_cbid.h of\n")
    f.write(f"// nvidia-cuda-cupti {wheel} (CUPTI_API_VERSION {api}). Do not edit.\n\n")
    for const, header, prefix in (("RUNTIME", "cupti_runtime_cbid.h", "CUPTI_RUNTIME_TRACE_CBID_"),
                                  ("DRIVER", "cupti_driver_cbid.h", "CUPTI_DRIVER_TRACE_CBID_")):
        f.write(f"/// `{header}`: (callback id, API function).\n")
        f.write(f"pub const {const}: &[(u32, &str)] = &[\n")
        for cbid, name in table(header, prefix):
            f.write(f"    ({cbid}, \"{name}\"),\n")
        f.write("];\n\n")
PY
rustfmt --edition 2024 "$out/cupti.rs" "$out/cuda.rs" "$src/cbid_names.rs"
echo "wrote $out/cupti.rs $out/cuda.rs $src/cbid_names.rs" >&2
