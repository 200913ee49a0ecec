/* A unit of a split build (mc_common.h): the AVX512-VNNI kernels on repacked weights. */
#define MC_UNIT_VNNI 1
#include "mc_gemm_vnni.h"
