// retnet: fla's MultiScaleRetention (fla/layers/multiscale_retention.py):
// q, k through the type's feature map and GPT-NeoX rotary embeddings (base
// 10000, the angles in fp32) at the session's position, a fixed decay per
// head g_h = log(1 − 2^(−5−h)) computed in fp32, the gated rule with q ×
// d_k^−½, k and v repeated over groups of q heads, the output norm fused
// with its swish gate. Reference: tools/linattn_ref.py's
// MultiScaleRetention.
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

constexpr std::pair<const char*, QkActivation> kRetNetMaps[] = {
    {"gelu", QkActivation::kGelu}};

class RetNetDef final : public RuleMixer {
 public:
  RetNetDef()
      : RuleMixer(ModelType::kRetNet, "retnet", "MultiScaleRetention") {}

  CommonDefaults defaults() const override {
    CommonDefaults d;
    d.hidden_ratio = 2;  // RetNetConfig's
    d.parallel_mode = true;
    return d;
  }
  absl::Status ReadConfig(const json& j, ModelConfig& c) const override {
    LINATTN_RETURN_IF_ERROR(ReadGroupedHeads(
        j, c, 8, 1.0, 2.0,
        {kRetNetMaps, "null, relu, sigmoid, silu, swish, gelu"}));
    // MultiScaleRetention asserts head_k_dim ≤ 256; rotary needs it even.
    if (c.head_k > 256 || c.head_k % 2 != 0) {
      return ConfigFieldError(
          "expand_k", absl::StrCat("retnet's head key dim must be even and "
                                   "at most 256, got ",
                                   c.head_k));
    }
    // RetNetBlock never passes use_short_conv or conv_size on: ignored.
    return absl::OkStatus();
  }

 protected:
  absl::Status LoadExtras(TensorReader&, const ModelConfig& c,
                          const std::string&, Model::Layer& L) const override {
    // fla's retention computes log(1 − 2^(−5−h)) in fp32: from head 20
    // on, 1 − 2^(−5−h) rounds to 1 and the head does not decay.
    for (int64_t h = 0; h < int64_t{c.state_heads}; ++h) {
      const float gamma = 1.0f - std::exp2(static_cast<float>(-5 - h));
      L.log_decay.push_back(std::log(gamma));
    }
    // fla's RotaryEmbedding: inv_freq = 1 / base^(2i/d), base 10000, in
    // fp32 as torch computes it.
    for (uint32_t i = 0; i < c.head_k / 2; ++i) {
      const float e = static_cast<float>(2 * i) / static_cast<float>(c.head_k);
      L.rotary_inv_freq.push_back(1.0f / std::pow(10000.0f, e));
    }
    return absl::OkStatus();
  }
  std::string HeadNormName(const TensorReader&, const ModelConfig& c,
                           const std::string& p) const override {
    return p +
           (c.fused_gate_norm ? "g_norm_swish_gate.weight" : "g_norm.weight");
  }
  void HeadInputs(const Head& x) const override {
    const uint32_t half = static_cast<uint32_t>(x.L.rotary_inv_freq.size());
    RotateHalves(x.L.rotary_inv_freq.data(), half, x.position, x.q);
    RotateHalves(x.L.rotary_inv_freq.data(), half, x.position, x.k);
    x.g[0] = x.L.log_decay[x.h];
  }
};

}  // namespace

const ModelTypeDef& RetNetType() {
  static const RetNetDef kDef;
  return kDef;
}

}  // namespace linattn
