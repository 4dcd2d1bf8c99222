#include "core/onednn/linear.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/onednn/matmul.h"
#include "core/util/aligned_buffer.h"

namespace linattn {

using dnnl::memory;

namespace {

// x rounded to bfloat16, nearest even (NaN stays NaN).
void ToBf16(const float* __restrict x, uint64_t n, uint16_t* __restrict out) {
  for (uint64_t i = 0; i < n; ++i) {
    const uint32_t u = __builtin_bit_cast(uint32_t, x[i]);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
    out[i] = static_cast<uint16_t>(nan ? (u >> 16) | 0x40u : rounded >> 16);
  }
}

// Below this largest magnitude a row is taken as zero (127/amax would
// overflow near 2^-121, and the step would be subnormal).
constexpr float kInt8ZeroRow = 0x1.0p-100f;

// Row r of x (m × n) quantised: q = rint(x · 127/amax), |q| ≤ 127, and its
// step amax/127 in scale[r] (0 for a row whose amax is below kInt8ZeroRow;
// NaN when the row holds Inf or NaN, so that the row's outputs come out
// NaN).
void QuantiseRows(const float* __restrict x, uint64_t m, uint64_t n,
                  int8_t* __restrict q, float* __restrict scale) {
  for (uint64_t r = 0; r < m; ++r) {
    const float* row = x + r * n;
    int8_t* qr = q + r * n;
    // |x| as bits: for non-negative floats the integer order is the float
    // order, Inf above every finite value and NaN above Inf.
    uint32_t top = 0;
    for (uint64_t i = 0; i < n; ++i) {
      top = std::max(top, __builtin_bit_cast(uint32_t, row[i]) & 0x7fffffffu);
    }
    if (top >= 0x7f800000u ||
        top < __builtin_bit_cast(uint32_t, kInt8ZeroRow)) {
      std::fill(qr, qr + n, int8_t{0});
      scale[r] = top >= 0x7f800000u ? std::nanf("") : 0.0f;
      continue;
    }
    const float amax = __builtin_bit_cast(float, top);
    const float inv = 127.0f / amax;
    // |row[i]·inv| ≤ 127 (to within three roundings), so adding and taking
    // away 1.5·2^23 rounds it to the nearest integer, ties to even, as
    // nearbyint does in the default rounding mode, but in vector registers.
    constexpr float kRound = 12582912.0f;
    for (uint64_t i = 0; i < n; ++i) {
      const float v = (row[i] * inv + kRound) - kRound;
      qr[i] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
    }
    scale[r] = amax / 127.0f;
  }
}

// Panel products spread over the OpenMP team from this many multiply-adds
// (a parallel region's wake-up and barrier cost a few microseconds; 2^16
// multiply-adds take about as long on one core).
constexpr uint64_t kPanelParallelMacs = uint64_t{1} << 16;

std::vector<int64_t> Buckets() {
  std::vector<int64_t> b = {1, 2, 4, 8};
  for (int64_t m = 16; m <= PackedLinear::kMaxRows; m += 16) b.push_back(m);
  return b;
}

}  // namespace

const char* WeightTypeName(WeightType type) {
  switch (type) {
    case WeightType::kBf16:
      return "bf16";
    case WeightType::kInt8:
      return "int8";
    case WeightType::kF32:
      break;
  }
  return "f32";
}

absl::StatusOr<WeightType> ParseWeightType(const std::string& name) {
  if (name == "f32") return WeightType::kF32;
  if (name == "bf16") return WeightType::kBf16;
  if (name == "int8") return WeightType::kInt8;
  return absl::InvalidArgumentError(
      absl::StrCat("weights: expected f32, bf16 or int8, got '", name, "'"));
}

absl::Status Bf16Supported() {
  if (NativeBf16Products()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "weights: bf16 needs a CPU with AVX512_BF16 or AMX (oneDNN's effective "
      "ISA here has neither); use f32");
}

absl::Status Int8Supported() {
  const dnnl::cpu_isa isa = dnnl::get_effective_cpu_isa();
  // (AVX_VNNI, which oneDNN 2.6 also knows, is left out until its int8
  // kernels there have been run and checked on such a CPU.)
  if (isa == dnnl::cpu_isa::avx512_core_vnni ||
      isa == dnnl::cpu_isa::avx512_core_bf16 ||
      isa == dnnl::cpu_isa::avx512_core_amx) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      "weights: int8 needs a CPU with AVX512_VNNI or AMX (oneDNN's effective "
      "ISA here has neither); use f32");
}

absl::Status WeightTypeSupported(WeightType type) {
  switch (type) {
    case WeightType::kBf16:
      return Bf16Supported();
    case WeightType::kInt8:
      return Int8Supported();
    case WeightType::kF32:
      break;
  }
  return absl::OkStatus();
}

struct PackedLinear::Shape {
  struct Entry {
    dnnl::matmul primitive;
    memory::desc src, dst;
    uint64_t scratchpad_bytes = 0;
  };
  memory::desc packed;               // the weights' layout
  std::map<int64_t, Entry> by_rows;  // bucket → primitive
};

int64_t PackedLinear::Bucket(int64_t m) {
  if (m <= 1) return 1;
  if (m <= 2) return 2;
  if (m <= 4) return 4;
  if (m <= 8) return 8;
  return (m + 15) / 16 * 16;
}

absl::StatusOr<std::unique_ptr<PackedLinear>> PackedLinear::Create(
    const float* weight, int64_t out, int64_t in, bool accumulate,
    WeightType type, LinearKernel kernel) {
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int64_t, bool, WeightType>,
                  std::unique_ptr<Shape>>
      shapes;
  if (in <= 0 || out <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weights: a (", in, " → ", out, ") product has no elements"));
  }
  if (kernel == LinearKernel::kPanels && type != WeightType::kF32) {
    return absl::InvalidArgumentError(
        absl::StrCat("weights: the panel kernels multiply f32 weights only, "
                     "not ",
                     WeightTypeName(type)));
  }
  if (absl::Status s = WeightTypeSupported(type); !s.ok()) return s;
  std::unique_ptr<PackedLinear> linear(new PackedLinear());
  linear->in_ = in;
  linear->out_ = out;
  linear->type_ = type;
  linear->accumulate_ = accumulate;
  const VectorKernels& kernels = ActiveKernels();
  if (type == WeightType::kF32 &&
      (kernel == LinearKernel::kPanels ||
       (kernel == LinearKernel::kAuto && kernels.isa == Isa::kAvx2))) {
    // Panel p holds columns [16p, 16p + 16) of Wᵀ (rows of W), k-major:
    // panels[(p·in + i)·16 + c] = W[16p + c][i], zero past `out`.
    const uint64_t count = (uint64_t(out) + kPanelColumns - 1) / kPanelColumns;
    try {
      linear->panels_ = AlignedBuffer(count * uint64_t(in) * kPanelColumns);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError("out of memory packing weights");
    }
    float* panels = linear->panels_.data();
    for (int64_t j = 0; j < out; ++j) {
      const float* row = weight + uint64_t(j) * in;
      float* dst = panels + uint64_t(j / kPanelColumns) * in * kPanelColumns +
                   j % kPanelColumns;
      for (int64_t i = 0; i < in; ++i)
        dst[uint64_t(i) * kPanelColumns] = row[i];
    }
    linear->panel_gemm_ = kernels.panel_gemm;
    return linear;
  }
  const bool int8 = type == WeightType::kInt8;
  const memory::data_type wt = type == WeightType::kBf16
                                   ? memory::data_type::bf16
                               : int8 ? memory::data_type::s8
                                      : memory::data_type::f32;
  // int8 products land in int32 sums; Apply scales (and adds) them.
  const memory::data_type dt =
      int8 ? memory::data_type::s32 : memory::data_type::f32;
  try {
    const dnnl::engine& engine = CpuEngine();
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (accumulate && !int8) {
      dnnl::post_ops ops;
      ops.append_sum(1.0f);
      attr.set_post_ops(ops);
    }
    auto describe = [&](int64_t rows, const memory::desc& w) {
      memory::desc src({rows, in}, wt, memory::format_tag::ab);
      memory::desc dst({rows, out}, dt, memory::format_tag::ab);
      return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, w, dst), attr,
                                          engine);
    };
    {
      std::lock_guard<std::mutex> lock(mu);
      auto& shape = shapes[{in, out, accumulate, type}];
      if (shape == nullptr) {
        auto created = std::make_unique<Shape>();
        // The kernels' preferred layout, asked for at 32 rows; every bucket
        // then takes that layout as given.
        created->packed =
            describe(32, memory::desc({in, out}, wt, memory::format_tag::any))
                .weights_desc();
        for (int64_t rows : Buckets()) {
          auto pd = describe(rows, created->packed);
          created->by_rows[rows] =
              Shape::Entry{dnnl::matmul(pd), pd.src_desc(), pd.dst_desc(),
                           pd.scratchpad_desc().get_size()};
        }
        shape = std::move(created);
      }
      linear->shape_ = shape.get();
    }
    // W (out × in) row-major is the (in × out) matrix in "ba" order.
    std::vector<int8_t> quantised;
    memory user({{in, out}, memory::data_type::f32, memory::format_tag::ba},
                engine, const_cast<float*>(weight));
    if (int8) {
      // Each output channel (a row of W) quantised with its own step.
      quantised.resize(uint64_t(out) * in);
      linear->scales_.resize(out);
      QuantiseRows(weight, out, in, quantised.data(), linear->scales_.data());
      for (int64_t j = 0; j < out; ++j) {
        if (std::isnan(linear->scales_[j])) {
          return absl::InvalidArgumentError(
              absl::StrCat("weights: output channel ", j, " of the (", in,
                           " → ", out, ") product holds Inf or NaN"));
        }
      }
      user = memory({{in, out}, memory::data_type::s8, memory::format_tag::ba},
                    engine, quantised.data());
    }
    linear->packed_ = memory(linear->shape_->packed, engine);
    dnnl::stream& stream = ThreadStream();
    dnnl::reorder(user, linear->packed_).execute(stream, user, linear->packed_);
    stream.wait();
  } catch (const dnnl::error& err) {
    return absl::InternalError(absl::StrCat("oneDNN cannot set up the (", in,
                                            " → ", out,
                                            ") product: ", err.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory packing weights");
  }
  return linear;
}

absl::Status PackedLinear::ApplyPanels(const float* x, int64_t m,
                                       float* y) const {
  const uint64_t count = (uint64_t(out_) + kPanelColumns - 1) / kPanelColumns;
  const uint64_t macs = uint64_t(m) * uint64_t(in_) * uint64_t(out_);
  const int threads =
      omp_in_parallel() || macs < kPanelParallelMacs
          ? 1
          : static_cast<int>(std::min<uint64_t>(omp_get_max_threads(), count));
  if (threads <= 1) {
    panel_gemm_(x, m, in_, panels_.data(), out_, 0, count, y, accumulate_);
    return absl::OkStatus();
  }
  // Each thread takes a contiguous run of panels: its columns of y, all
  // rows; the weights are read once in all.
#pragma omp parallel num_threads(threads)
  {
    const uint64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    panel_gemm_(x, m, in_, panels_.data(), out_, count * t / n,
                count * (t + 1) / n, y, accumulate_);
  }
  return absl::OkStatus();
}

absl::Status PackedLinear::Apply(const float* x, int64_t m, float* y) const {
  if (m <= 0 || m > kMaxRows) {
    return absl::InternalError(absl::StrCat("PackedLinear: ", m, " rows"));
  }
  if (panel_gemm_ != nullptr) return ApplyPanels(x, m, y);
  const Shape::Entry& e = shape_->by_rows.at(Bucket(m));
  // Decode steps call this a few dozen times per token with small products,
  // so the per-call cost matters: the memory objects for each primitive are
  // made once per thread and only re-pointed, and the primitive runs through
  // the C API without building an argument map.
  struct Bound {
    memory src, dst, pad;
  };
  thread_local std::map<const Shape::Entry*, Bound> bound;
  thread_local AlignedBuffer scratch;
  thread_local std::vector<uint16_t> x_bf16;
  thread_local std::vector<int8_t> x_s8;
  thread_local std::vector<float> row_scales;
  thread_local std::vector<int32_t> sums;
  const void* src = x;
  void* dst = y;
  const bool int8 = type_ == WeightType::kInt8;
  if (int8) {
    const uint64_t n = uint64_t(m) * in_, padded = uint64_t(Bucket(m)) * in_;
    if (x_s8.size() < padded) x_s8.resize(padded);
    if (row_scales.size() < uint64_t(m)) row_scales.resize(m);
    if (sums.size() < uint64_t(Bucket(m)) * out_) {
      sums.resize(uint64_t(Bucket(m)) * out_);
    }
    QuantiseRows(x, m, in_, x_s8.data(), row_scales.data());
    std::fill(x_s8.begin() + n, x_s8.begin() + padded, int8_t{0});
    src = x_s8.data();
    dst = sums.data();
  } else if (type_ == WeightType::kBf16) {
    // m rows rounded; the bucket's padding rows are zeros.
    const uint64_t n = uint64_t(m) * in_, padded = uint64_t(Bucket(m)) * in_;
    if (x_bf16.size() < padded) x_bf16.resize(padded);
    ToBf16(x, n, x_bf16.data());
    std::fill(x_bf16.begin() + n, x_bf16.begin() + padded, uint16_t{0});
    src = x_bf16.data();
  }
  try {
    auto it = bound.find(&e);
    if (it == bound.end()) {
      const dnnl::engine& engine = CpuEngine();
      it = bound
               .emplace(&e, Bound{memory(e.src, engine, nullptr),
                                  memory(e.dst, engine, nullptr),
                                  memory(memory::desc({static_cast<int64_t>(
                                                          e.scratchpad_bytes)},
                                                      memory::data_type::u8,
                                                      memory::format_tag::a),
                                         engine, nullptr)})
               .first;
    }
    scratch.EnsureSize((e.scratchpad_bytes + sizeof(float) - 1) /
                       sizeof(float));
    Bound& b = it->second;
    b.src.set_data_handle(const_cast<void*>(src));
    b.dst.set_data_handle(dst);
    b.pad.set_data_handle(scratch.data());
    dnnl::stream& stream = ThreadStream();
    const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, b.src.get()},
                                    {DNNL_ARG_WEIGHTS, packed_.get()},
                                    {DNNL_ARG_DST, b.dst.get()},
                                    {DNNL_ARG_SCRATCHPAD, b.pad.get()}};
    dnnl_status_t status =
        dnnl_primitive_execute(e.primitive.get(), stream.get(), 4, args);
    if (status == dnnl_success) status = dnnl_stream_wait(stream.get());
    if (status != dnnl_success) {
      return absl::InternalError(absl::StrCat(
          "oneDNN matmul failed with status ", static_cast<int>(status)));
    }
  } catch (const dnnl::error& err) {
    return absl::InternalError(
        absl::StrCat("oneDNN matmul failed: ", err.what()));
  }
  if (int8) {
    const float* __restrict s = scales_.data();
    for (int64_t r = 0; r < m; ++r) {
      const float t = row_scales[r];
      const int32_t* __restrict sum = sums.data() + uint64_t(r) * out_;
      float* __restrict yr = y + uint64_t(r) * out_;
      if (accumulate_) {
        for (int64_t j = 0; j < out_; ++j) yr[j] += t * s[j] * float(sum[j]);
      } else {
        for (int64_t j = 0; j < out_; ++j) yr[j] = t * s[j] * float(sum[j]);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace linattn
