#include "core/attention/kernels.h"

#include <atomic>
#include <cstdlib>
#include <string_view>

namespace linattn {

namespace generic {
extern const VectorKernels kKernels;
}
namespace avx2 {
extern const VectorKernels kKernels;
}
namespace avx512 {
extern const VectorKernels kKernels;
}

namespace {

bool CpuSupports(Isa isa) {
  switch (isa) {
    case Isa::kGeneric:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma");
  }
  return false;
}

const VectorKernels* Detect() {
  const char* env = std::getenv("LINATTN_ISA");
  std::string_view want = env != nullptr ? env : "";
  if (want == "generic") return &generic::kKernels;
  if (want == "avx2" && CpuSupports(Isa::kAvx2)) return &avx2::kKernels;
  if (CpuSupports(Isa::kAvx512) && (want.empty() || want == "avx512")) {
    return &avx512::kKernels;
  }
  if (CpuSupports(Isa::kAvx2)) return &avx2::kKernels;
  return &generic::kKernels;
}

std::atomic<const VectorKernels*> g_override{nullptr};

}  // namespace

const VectorKernels* KernelsFor(Isa isa) {
  if (!CpuSupports(isa)) return nullptr;
  switch (isa) {
    case Isa::kGeneric:
      return &generic::kKernels;
    case Isa::kAvx2:
      return &avx2::kKernels;
    case Isa::kAvx512:
      return &avx512::kKernels;
  }
  return nullptr;
}

const VectorKernels& ActiveKernels() {
  if (const VectorKernels* k = g_override.load(std::memory_order_acquire)) {
    return *k;
  }
  static const VectorKernels* const detected = Detect();
  return *detected;
}

std::vector<const VectorKernels*> SupportedKernels() {
  std::vector<const VectorKernels*> out;
  for (Isa isa : {Isa::kGeneric, Isa::kAvx2, Isa::kAvx512}) {
    if (const VectorKernels* k = KernelsFor(isa)) out.push_back(k);
  }
  return out;
}

ScopedKernelsOverride::ScopedKernelsOverride(const VectorKernels* kernels)
    : previous_(g_override.exchange(kernels, std::memory_order_acq_rel)) {}

ScopedKernelsOverride::~ScopedKernelsOverride() {
  g_override.store(previous_, std::memory_order_release);
}

}  // namespace linattn
