// The step kernels built for avx512 (flags set in core/CMakeLists.txt).
#include "core/attention/kernels.h"

#define LINATTN_KERNEL_NS avx512
#define LINATTN_KERNEL_ISA ::linattn::Isa::kAvx512
#define LINATTN_KERNEL_NAME "avx512"
#include "core/attention/kernels_impl.inc"
