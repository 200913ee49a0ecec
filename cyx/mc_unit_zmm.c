/* A unit of a split build (mc_common.h): the 512-bit kernels on repacked weights. */
#define MC_UNIT_ZMM 1
#include "mc_gemm_zmm.h"
#include "mc_gemm_zmm41.h"
