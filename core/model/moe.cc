#include "core/model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <span>

#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/model/forward.h"
#include "core/model/row_ops.h"
#include "core/model/tensor_reader.h"
#include "core/util/aligned_buffer.h"
#include "core/util/parallel_for.h"
#include "core/util/row_view.h"
#include "core/util/status_macros.h"

namespace linattn {

absl::Status LoadExperts(TensorReader& r, const ModelConfig& c,
                         const std::string& p, const ExpertTensorNames& names,
                         WeightType weights, Experts& out) {
  const int64_t E = c.num_experts, H = c.hidden_size, I = c.expert_size;
  {
    LINATTN_ASSIGN_OR_RETURN(AlignedBuffer w, r.Matrix(p + names.router, E, H));
    LINATTN_ASSIGN_OR_RETURN(
        out.router,
        PackedLinear::Create(w.data(), E, H, false, WeightType::kF32));
  }
  const float m = static_cast<float>(c.residual_multiplier);
  auto pack_down = [&](AlignedBuffer& w) -> absl::Status {
    if (m != 1.0f) {
      for (int64_t i = 0; i < H * I; ++i) w.data()[i] *= m;
    }
    LINATTN_ASSIGN_OR_RETURN(
        auto packed, PackedLinear::Create(w.data(), H, I, false, weights));
    out.down.push_back(std::move(packed));
    return absl::OkStatus();
  };
  auto expert = [&](int64_t e, const char* what) {
    return absl::StrCat(p, names.each, e, ".", what, ".weight");
  };
  // One Linear per expert when the file has the first one, or the stacked
  // tensors are not there either (then the error names what is missing).
  if (!names.each.empty() &&
      (r.Has(expert(0, "gate_proj")) || !r.Has(p + names.gate_up))) {
    // Every shape first, then one expert at a time.
    for (int64_t e = 0; e < E; ++e) {
      LINATTN_RETURN_IF_ERROR(r.Check(expert(e, "gate_proj"), {I, H}));
      LINATTN_RETURN_IF_ERROR(r.Check(expert(e, "up_proj"), {I, H}));
      LINATTN_RETURN_IF_ERROR(r.Check(expert(e, "down_proj"), {H, I}));
    }
    AlignedBuffer w;
    for (int64_t e = 0; e < E; ++e) {
      LINATTN_ASSIGN_OR_RETURN(
          w, r.Stacked({{expert(e, "gate_proj"), I}, {expert(e, "up_proj"), I}},
                       H));
      LINATTN_ASSIGN_OR_RETURN(
          auto packed,
          PackedLinear::Create(w.data(), 2 * I, H, false, weights));
      out.gate_up.push_back(std::move(packed));
      LINATTN_ASSIGN_OR_RETURN(w, r.Matrix(expert(e, "down_proj"), H, I));
      LINATTN_RETURN_IF_ERROR(pack_down(w));
    }
    return absl::OkStatus();
  }
  const std::string up = p + names.gate_up, down = p + names.down;
  // Shapes first, then one tensor at a time.
  LINATTN_RETURN_IF_ERROR(r.Check(up, {E, 2 * I, H}));
  LINATTN_RETURN_IF_ERROR(r.Check(down, {E, H, I}));
  // One expert at a time: the load holds one expert's fp32 weights beside
  // the packed ones, not every expert's.
  AlignedBuffer w(2 * I * H);
  for (int64_t e = 0; e < E; ++e) {
    LINATTN_RETURN_IF_ERROR(r.ReadPart(up, {E, 2 * I, H}, e, w.data()));
    LINATTN_ASSIGN_OR_RETURN(
        auto packed, PackedLinear::Create(w.data(), 2 * I, H, false, weights));
    out.gate_up.push_back(std::move(packed));
  }
  for (int64_t e = 0; e < E; ++e) {
    LINATTN_RETURN_IF_ERROR(r.ReadPart(down, {E, H, I}, e, w.data()));
    LINATTN_RETURN_IF_ERROR(pack_down(w));
  }
  return absl::OkStatus();
}

absl::Status RunExperts(ForwardRunner& runner, const Experts& experts,
                        size_t layer, uint32_t rows) {
  const ModelConfig& c = runner.model().config();
  ForwardWorkspace& ws = runner.workspace();
  const uint32_t E = c.num_experts, K = c.experts_per_token, H = c.hidden_size,
                 I = c.expert_size;
  LINATTN_RETURN_IF_ERROR(
      experts.router->Apply(ws.xn.data(), rows, ws.moe_logits.data()));
  // Finite logits before any is ranked (a NaN has no place in an order).
  if (!ActiveKernels().all_finite(uint64_t{rows} * E, ws.moe_logits.data())) {
    return absl::InternalError(absl::StrCat(
        "layer ", layer,
        ": the model's activations are not finite (the experts' router)"));
  }
  const RowView<const float> logits(ws.moe_logits.data(), rows, E);
  // Each row's k experts and their gates: the top k logits (descending,
  // ties to the lower index), softmax over those k; or each one's softmax
  // probability over all experts, divided by their sum with norm_topk_prob
  // (the same gates, the sum over k computed again).
  std::vector<uint32_t> chosen(uint64_t{rows} * K);
  std::vector<float> gates(uint64_t{rows} * K);
  ParallelFor(rows, uint64_t{rows} * E * K >= kParallelFloats, [&](uint64_t r) {
    const float* l = logits.row(r);
    uint32_t* pick = chosen.data() + r * K;
    float* gate = gates.data() + r * K;
    thread_local std::vector<uint32_t> order;
    order.resize(E);
    std::iota(order.begin(), order.end(), 0u);
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [&](uint32_t a, uint32_t b) {
                        return l[a] > l[b] || (l[a] == l[b] && a < b);
                      });
    const float most = l[order[0]];
    float sum = 0;
    for (uint32_t i = 0; i < K; ++i) {
      pick[i] = order[i];
      gate[i] = std::exp(l[order[i]] - most);
      sum += gate[i];
    }
    if (c.router_softmax_all) {
      float all = 0;
      for (uint32_t e = 0; e < E; ++e) all += std::exp(l[e] - most);
      for (uint32_t i = 0; i < K; ++i) gate[i] /= all;
      if (!c.norm_topk_prob) return;
      sum /= all;
    }
    for (uint32_t i = 0; i < K; ++i) gate[i] /= sum;
  });
  const RowView<const float> xn(ws.xn.data(), rows, H);
  const RowView<float> x(ws.x.data(), rows, H);
  const RowView<float> in(ws.moe_in.data(), rows, H);
  const RowView<float> gu(ws.moe_gu.data(), rows, 2 * uint64_t{I});
  const RowView<float> act(ws.moe_act.data(), rows, I);
  const RowView<float> y(ws.moe_out.data(), rows, H);
  const VectorKernels& kernels = ActiveKernels();
  // The rows of each expert in row order (and their gates), bucketed in
  // one pass: expert e's are routed[start[e] .. start[e + 1]).
  std::vector<uint32_t> start(E + 1, 0);
  for (uint32_t e : chosen) ++start[e + 1];
  for (uint32_t e = 0; e < E; ++e) start[e + 1] += start[e];
  std::vector<uint32_t> all_rows(chosen.size());
  std::vector<float> all_gates(chosen.size());
  {
    std::vector<uint32_t> next(start.begin(), start.end() - 1);
    for (uint32_t r = 0; r < rows; ++r) {
      for (uint32_t i = 0; i < K; ++i) {
        const uint32_t e = chosen[uint64_t{r} * K + i];
        all_rows[next[e]] = r;
        all_gates[next[e]++] = gates[uint64_t{r} * K + i];
      }
    }
  }
  for (uint32_t e = 0; e < E; ++e) {
    const std::span<const uint32_t> routed(all_rows.data() + start[e],
                                           start[e + 1] - start[e]);
    const float* weight = all_gates.data() + start[e];
    if (routed.empty()) continue;
    const uint32_t n = static_cast<uint32_t>(routed.size());
    for (uint32_t i = 0; i < n; ++i) {
      std::memcpy(in.row(i), xn.row(routed[i]), H * sizeof(float));
    }
    LINATTN_RETURN_IF_ERROR(experts.gate_up[e]->Apply(in.data(), n, gu.data()));
    ParallelFor(n, uint64_t{n} * I >= kParallelFloats, [&](uint64_t i) {
      const float* g = gu.row(i);
      kernels.silu_mul(I, g, g + I, act.row(i));
    });
    LINATTN_RETURN_IF_ERROR(experts.down[e]->Apply(act.data(), n, y.data()));
    ParallelFor(n, uint64_t{n} * H >= kParallelFloats, [&](uint64_t i) {
      float* to = x.row(routed[i]);
      const float* from = y.row(i);
      const float w = weight[i];
      for (uint32_t j = 0; j < H; ++j) to[j] += w * from[j];
    });
  }
  return absl::OkStatus();
}

}  // namespace linattn
