// gla: fla's GatedLinearAttention (fla/layers/gla.py): q, k, v (through
// SiLU after short convolutions with use_short_conv), the type's feature map
// on q and k, log-gates per key channel from a rank-16 projection of the
// normed input, g = max(logsigmoid(W₂W₁x + b)/16, clamp_min), the gated
// rule (gate = key) with q × d_k^−½, k, v and gates repeated over groups of
// q heads, the output norm fused with its swish gate. Reference:
// tools/linattn_ref.py's GatedLinearAttention.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/model/row_ops.h"
#include "core/model/types/rule_mixer.h"
#include "core/util/parallel_for.h"
#include "core/util/row_view.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

constexpr std::pair<const char*, QkActivation> kGlaMaps[] = {
    {"logsigmoid", QkActivation::kLogSigmoid},
    {"sqrelu", QkActivation::kSqRelu}};

class GlaDef final : public RuleMixer {
 public:
  GlaDef() : RuleMixer(ModelType::kGla, "gla", "GatedLinearAttention") {}
  absl::Status ReadConfig(const json& j, ModelConfig& c) const override;

 protected:
  GateShape gate() const override { return GateShape::kKey; }
  void ExtraProjections(
      const TensorReader&, const ModelConfig&, const std::string& p,
      std::vector<std::pair<std::string, int64_t>>& parts) const override {
    parts.push_back({p + "gk_proj.0.weight", kGlaGateRank});
  }
  void ExtraColumns(const ModelConfig&, MixerColumns& m,
                    uint32_t& at) const override {
    m.gk = at;
    at += kGlaGateRank;
  }
  absl::Status LoadExtras(TensorReader& r, const ModelConfig& c,
                          const std::string& p,
                          Model::Layer& L) const override {
    LINATTN_ASSIGN_OR_RETURN(
        AlignedBuffer up,
        r.Matrix(p + "gk_proj.1.weight", c.k_width(), kGlaGateRank));
    LINATTN_ASSIGN_OR_RETURN(
        L.gk_up, PackedLinear::Create(up.data(), c.k_width(), kGlaGateRank,
                                      false, WeightType::kF32));
    LINATTN_ASSIGN_OR_RETURN(L.gk_bias,
                             r.Vector(p + "gk_proj.1.bias", c.k_width()));
    return absl::OkStatus();
  }
  std::string HeadNormName(const TensorReader&, const ModelConfig& c,
                           const std::string& p) const override {
    return p +
           (c.fused_gate_norm ? "g_norm_swish_gate.weight" : "g_norm.weight");
  }
  absl::Status PrepareInputs(ForwardRunner& runner, const LayerPass& pass,
                             const Model::Layer& L) const override {
    // gk = gk_proj.1(gk_proj.0(x)) + b from the normed input (not the
    // convolution's output): the rank-16 columns through one GEMM, into
    // the workspace's extra1 (rows × 16) and extra2 (rows × k_width).
    const ModelConfig& c = runner.model().config();
    ForwardWorkspace& ws = runner.workspace();
    const uint32_t rows = pass.rows;
    const uint64_t capacity = ws.capacity;
    ws.extra1.EnsureSize(capacity * kGlaGateRank);
    ws.extra2.EnsureSize(capacity * c.k_width());
    const MixerColumns cols = Columns(c);
    const RowView<const float> proj(ws.proj.data(), rows, cols.width);
    const RowView<float> low(ws.extra1.data(), rows, kGlaGateRank);
    for (uint32_t r = 0; r < rows; ++r) {
      std::memcpy(low.row(r), proj.row(r) + cols.gk,
                  kGlaGateRank * sizeof(float));
    }
    return L.gk_up->Apply(low.data(), rows, ws.extra2.data());
  }
  void HeadInputs(const Head& x) const override {
    // fla: logsigmoid(gk) / gate_logit_normalizer (16), then clamp.
    const ModelConfig& c = x.c;
    const uint32_t dk = c.head_k, kg = c.state_heads / c.num_kv_heads;
    const float clamp_min = c.clamp_min.value_or(-INFINITY);
    const float* raw =
        x.ws.extra2.data() + x.row * c.k_width() + uint64_t{x.h / kg} * dk;
    const float* bias = x.L.gk_bias.data() + uint64_t{x.h / kg} * dk;
    for (uint32_t i = 0; i < dk; ++i) {
      x.g[i] = std::max(LogSigmoid(raw[i] + bias[i]) / 16.0f, clamp_min);
    }
  }
};

absl::Status GlaDef::ReadConfig(const json& j, ModelConfig& c) const {
  LINATTN_RETURN_IF_ERROR(ReadGroupedHeads(
      j, c, 4, 0.5, 1.0,
      {kGlaMaps, "null, relu, sigmoid, logsigmoid, silu, swish, sqrelu"}));
  LINATTN_RETURN_IF_ERROR(Bool(j, "use_short_conv", &c.use_short_conv, false));
  if (auto s = Dim(j, "conv_size", &c.conv_size, 4); !s.ok()) return s;
  c.silu_qk = c.silu_v = c.use_short_conv;  // the convolutions' activation
  auto clamp = Optional<double>(j, "clamp_min");
  if (!clamp.ok()) return clamp.status();
  if (clamp->has_value()) {
    // A log-gate: above 0 it would grow the state.
    if (!(**clamp <= 0)) {
      return ConfigFieldError(
          "clamp_min",
          absl::StrCat("must be ≤ 0 (a log forget gate), got ", **clamp));
    }
    c.clamp_min = static_cast<float>(**clamp);
  }
  return absl::OkStatus();
}

}  // namespace

const ModelTypeDef& GlaType() {
  static const GlaDef kDef;
  return kDef;
}

}  // namespace linattn
