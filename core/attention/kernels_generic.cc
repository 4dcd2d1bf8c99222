// The step kernels built for generic (flags set in core/CMakeLists.txt).
#include "core/attention/kernels.h"

#define LINATTN_KERNEL_NS generic
#define LINATTN_KERNEL_ISA ::linattn::Isa::kGeneric
#define LINATTN_KERNEL_NAME "generic"
#include "core/attention/kernels_impl.inc"
