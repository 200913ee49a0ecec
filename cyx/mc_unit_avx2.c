/* A unit of a split build (mc_common.h): the AVX2 kernels on repacked weights. */
#define MC_UNIT_AVX2 1
#include "mc_gemm_vnni.h"
