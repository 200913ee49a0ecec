/* The core unit of a split build (mc_common.h): the entry points of mc_api.h and all the
 * kernels that no other unit compiles. */
#define MC_UNIT_CORE 1
#include "mc_api.h" /* the declarations the definitions below must match */
#include "mc_quant.h"
#include "mc_ops.h"
#include "mc_recur.h"
#include "mc_quantize.h"
#include "mc_vocab.h"
