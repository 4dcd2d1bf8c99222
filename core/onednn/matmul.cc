#include "core/onednn/matmul.h"

#include <map>
#include <new>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "core/util/aligned_buffer.h"

namespace linattn {

namespace {

using dnnl::memory;

memory::desc Desc(int64_t batch, int64_t rows, int64_t cols, bool transposed,
                  memory::data_type type = memory::data_type::f32) {
  // A logical (batch, rows, cols) matrix stored row-major, or stored as
  // (batch, cols, rows) when transposed.
  memory::dims dims = {batch, rows, cols};
  memory::dims strides = transposed ? memory::dims{rows * cols, 1, rows}
                                    : memory::dims{rows * cols, cols, 1};
  return memory::desc(dims, type, strides);
}

}  // namespace

dnnl::stream& ThreadStream() {
  thread_local dnnl::stream stream(CpuEngine());
  return stream;
}

const dnnl::engine& CpuEngine() {
  static const dnnl::engine* engine =
      new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *engine;
}

MatmulCache& MatmulCache::Global() {
  static MatmulCache* cache = new MatmulCache();
  return *cache;
}

size_t MatmulCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

const MatmulCache::Entry& MatmulCache::Get(const MatmulShape& shape) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(shape);
  if (it != entries_.end()) return *it->second;

  // Step 1: memory descriptors of the three operands.
  auto entry = std::make_unique<Entry>();
  const memory::data_type in =
      shape.bf16_inputs ? memory::data_type::bf16 : memory::data_type::f32;
  entry->a = Desc(shape.batch, shape.m, shape.k, shape.transpose_a, in);
  entry->b = Desc(shape.batch, shape.k, shape.n, shape.transpose_b, in);
  entry->c = Desc(shape.batch, shape.m, shape.n, false);
  // Step 2: attributes: a user-provided scratchpad (so concurrent calls
  // never share one) and, to accumulate, a sum post-op C ← A·B + C.
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (shape.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  // Step 3: operation descriptor → primitive descriptor → primitive.
  dnnl::matmul::desc desc(entry->a, entry->b, entry->c);
  dnnl::matmul::primitive_desc pd(desc, attr, CpuEngine());
  entry->scratchpad_bytes = pd.scratchpad_desc().get_size();
  entry->primitive = dnnl::matmul(pd);
  const Entry& ref = *entry;
  entries_.emplace(shape, std::move(entry));
  return ref;
}

namespace {

// A thread's binding of one cached primitive: its memory objects, created
// once and pointed at each call's buffers (set_data_handle), and its
// argument map. Looked up without the cache's lock: a prefill's fused round
// runs thousands of small products, and creating these per call showed in
// its profile as malloc/free, the lock and oneDNN's memory creation.
struct Binding {
  const MatmulCache::Entry* entry = nullptr;
  memory a, b, c, scratchpad;
  std::unordered_map<int, memory> args;
};

Binding& ThreadBinding(const MatmulShape& shape) {
  thread_local std::map<MatmulShape, Binding> bindings;
  auto it = bindings.find(shape);
  if (it != bindings.end()) return it->second;
  const MatmulCache::Entry& e = MatmulCache::Global().Get(shape);
  const dnnl::engine& engine = CpuEngine();
  Binding binding;
  binding.entry = &e;
  binding.a = memory(e.a, engine, DNNL_MEMORY_NONE);
  binding.b = memory(e.b, engine, DNNL_MEMORY_NONE);
  binding.c = memory(e.c, engine, DNNL_MEMORY_NONE);
  binding.args = {{DNNL_ARG_SRC, binding.a},
                  {DNNL_ARG_WEIGHTS, binding.b},
                  {DNNL_ARG_DST, binding.c}};
  if (e.scratchpad_bytes != 0) {
    binding.scratchpad =
        memory(memory::desc({static_cast<int64_t>(e.scratchpad_bytes)},
                            memory::data_type::u8, memory::format_tag::a),
               engine, DNNL_MEMORY_NONE);
    binding.args.emplace(DNNL_ARG_SCRATCHPAD, binding.scratchpad);
  }
  return bindings.emplace(shape, std::move(binding)).first->second;
}

absl::Status Execute(const MatmulShape& shape, const void* a, const void* b,
                     float* c) {
  try {
    Binding& binding = ThreadBinding(shape);
    const MatmulCache::Entry& e = *binding.entry;
    // Step 4: point the operands at the caller's buffers (no copies) and
    // execute.
    binding.a.set_data_handle(const_cast<void*>(a));
    binding.b.set_data_handle(const_cast<void*>(b));
    binding.c.set_data_handle(c);
    if (e.scratchpad_bytes != 0) {
      // A user scratchpad per thread, so concurrent calls never share one.
      thread_local AlignedBuffer scratch;
      scratch.EnsureSize((e.scratchpad_bytes + sizeof(float) - 1) /
                         sizeof(float));
      binding.scratchpad.set_data_handle(scratch.data());
    }
    dnnl::stream& stream = ThreadStream();
    e.primitive.execute(stream, binding.args);
    stream.wait();
  } catch (const dnnl::error& err) {
    return absl::InternalError(
        absl::StrCat("oneDNN matmul failed: ", err.what(), " (status ",
                     static_cast<int>(err.status), ")"));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory in oneDNN matmul");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BatchedMatmul(const MatmulShape& shape, const float* a,
                           const float* b, float* c) {
  if (shape.bf16_inputs) {
    return absl::InternalError("BatchedMatmul: fp32 inputs for a bf16 shape");
  }
  return Execute(shape, a, b, c);
}

absl::Status BatchedMatmul(const MatmulShape& shape, const uint16_t* a,
                           const uint16_t* b, float* c) {
  if (!shape.bf16_inputs) {
    return absl::InternalError("BatchedMatmul: bf16 inputs for an fp32 shape");
  }
  return Execute(shape, a, b, c);
}

bool NativeBf16Products() {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  return isa == dnnl::cpu_isa::avx512_core_bf16 ||
         isa == dnnl::cpu_isa::avx512_core_amx;
}

}  // namespace linattn
