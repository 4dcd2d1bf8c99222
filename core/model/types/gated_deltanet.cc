// gated_deltanet: fla's GatedDeltaNet (fla/layers/gated_deltanet.py): q, k,
// v from short convolutions through SiLU, L2-normalised q and k, β =
// σ(b_proj x) (× 2 with allow_neg_eigval), g = −exp(A_log) ·
// softplus(a_proj x + dt_bias) per value head, the gated delta rule with q
// × d_k^−½, q and k repeated over groups of value heads (GVA), the output
// norm × SiLU gate. Reference: tools/linattn_ref.py's GatedDeltaNet.
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

class GatedDeltaNetDef final : public RuleMixer {
 public:
  GatedDeltaNetDef()
      : RuleMixer(ModelType::kGatedDeltaNet, "gated_deltanet",
                  "GatedDeltaNet") {}

  CommonDefaults defaults() const override {
    CommonDefaults d;
    d.layers = 21;  // GatedDeltaNetConfig's
    return d;
  }
  absl::Status ReadConfig(const json& j, ModelConfig& c) const override;

 protected:
  UpdateRule rule() const override { return UpdateRule::kGatedDelta; }
  void ExtraProjections(
      const TensorReader&, const ModelConfig& c, const std::string& p,
      std::vector<std::pair<std::string, int64_t>>& parts) const override {
    parts.push_back({p + "a_proj.weight", c.state_heads});
    parts.push_back({p + "b_proj.weight", c.state_heads});
  }
  void ExtraColumns(const ModelConfig& c, MixerColumns& m,
                    uint32_t& at) const override {
    m.a = at;
    m.beta = at + c.state_heads;
    at += 2 * c.state_heads;
  }
  absl::Status LoadExtras(TensorReader& r, const ModelConfig& c,
                          const std::string& p,
                          Model::Layer& L) const override {
    LINATTN_RETURN_IF_ERROR(LoadDecay(r, c, p, L));
    // Checkpoints before March 2025 carry an unused D.
    r.Skip(p + "D");
    return absl::OkStatus();
  }
  void HeadInputs(const Head& x) const override {
    // g = −exp(A_log)·softplus(a + dt_bias), per value head.
    x.g[0] =
        x.L.neg_exp_a[x.h] * Softplus(x.in[x.cols.a + x.h] + x.L.dt_bias[x.h]);
    float b = Sigmoid(x.in[x.cols.beta + x.h]);
    if (x.c.allow_neg_eigval) b *= 2.0f;
    x.beta[x.h] = b;
  }
};

absl::Status GatedDeltaNetDef::ReadConfig(const json& j, ModelConfig& c) const {
  if (auto s = Dim(j, "num_heads", &c.num_heads, 6); !s.ok()) return s;
  if (auto s = Dim(j, "head_dim", &c.head_k, 256); !s.ok()) return s;
  if (auto s = Dim(j, "num_v_heads", &c.state_heads, c.num_heads); !s.ok())
    return s;
  LINATTN_RETURN_IF_ERROR(
      Divides("num_v_heads", c.state_heads, c.num_heads, "num_v_heads"));
  double expand_v = 2.0;
  LINATTN_RETURN_IF_ERROR(Value(j, "expand_v", &expand_v));
  const double dv = c.head_k * expand_v;
  // GatedDeltaNet.__init__ refuses a head_v_dim that is not whole.
  if (!(dv >= 1) || dv > kMaxModelDim ||
      std::fabs(dv - std::floor(dv)) > 1e-5 * dv) {
    return ConfigFieldError("expand_v",
                            absl::StrCat("head_dim × expand_v must be a whole "
                                         "number ≥ 1, got ",
                                         dv));
  }
  c.head_v = static_cast<uint32_t>(dv);
  LINATTN_RETURN_IF_ERROR(ReadDeltaCommon(j, c, true));
  c.use_beta = true;
  c.silu_qk = c.silu_v = true;
  c.qk_l2norm = true;
  return absl::OkStatus();
}

}  // namespace

const ModelTypeDef& GatedDeltaNetType() {
  static const GatedDeltaNetDef kDef;
  return kDef;
}

}  // namespace linattn
