// The step kernels built for avx2 (flags set in core/CMakeLists.txt).
#include "core/attention/kernels.h"

#define LINATTN_KERNEL_NS avx2
#define LINATTN_KERNEL_ISA ::linattn::Isa::kAvx2
#define LINATTN_KERNEL_NAME "avx2"
#include "core/attention/kernels_impl.inc"
