/* Headers the PM sampler binds. bindgen/generate.sh turns this into ../sys/{cupti,cuda}.rs. */
#include <cuda.h>
#include <cupti_result.h>
#include <cupti_version.h>
#include <cupti_target.h>
#include <cupti_profiler_target.h>
#include <cupti_profiler_host.h>
#include <cupti_pmsampling.h>
