// delta_net: fla's DeltaNet (fla/layers/delta_net.py): q, k, v from short
// convolutions, q and k through qk_activation (silu, relu, elu + 1 or
// identity; v through SiLU always) and qk_norm (the rule's L2 norm, or ÷
// the sum), β = σ(b_proj x) (1 without use_beta; × 2 with
// allow_neg_eigval), the delta rule with q × d_k^−½, the output norm (×
// SiLU gate with use_gate). Reference: tools/linattn_ref.py's DeltaNet.
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

class DeltaNetDef final : public RuleMixer {
 public:
  DeltaNetDef() : RuleMixer(ModelType::kDeltaNet, "delta_net", "DeltaNet") {}
  absl::Status ReadConfig(const json& j, ModelConfig& c) const override;

 protected:
  UpdateRule rule() const override { return UpdateRule::kDelta; }
  void ExtraProjections(
      const TensorReader& r, const ModelConfig& c, const std::string& p,
      std::vector<std::pair<std::string, int64_t>>& parts) const override {
    // b_proj was beta_proj in fla's first DeltaNet.
    if (c.use_beta) {
      parts.push_back({Either(r, {p + "b_proj.weight", p + "beta_proj.weight"}),
                       c.state_heads});
    }
  }
  void ExtraColumns(const ModelConfig& c, MixerColumns& m,
                    uint32_t& at) const override {
    if (!c.use_beta) return;
    m.beta = at;
    at += c.state_heads;
  }
  void HeadInputs(const Head& x) const override {
    float b = x.c.use_beta ? Sigmoid(x.in[x.cols.beta + x.h]) : 1.0f;
    if (x.c.allow_neg_eigval) b *= 2.0f;
    x.beta[x.h] = b;
  }
};

absl::Status DeltaNetDef::ReadConfig(const json& j, ModelConfig& c) const {
  if (auto s = Dim(j, "num_heads", &c.num_heads, 16); !s.ok()) return s;
  LINATTN_RETURN_IF_ERROR(ReadHeadWidths(j, c, 1.0, 1.0));
  LINATTN_RETURN_IF_ERROR(ReadDeltaCommon(j, c, false));
  LINATTN_RETURN_IF_ERROR(Bool(j, "use_beta", &c.use_beta, true));
  auto act = Optional<std::string>(j, "qk_activation");
  if (!act.ok()) return act.status();
  const std::string a = act->value_or("silu");
  // v goes through SiLU whatever qk_activation says (its convolution's
  // activation, or F.silu without one); q and k only for "silu".
  c.silu_v = true;
  if (a == "silu") {
    c.silu_qk = true;
  } else if (a == "relu") {
    c.qk_activation = QkActivation::kRelu;
  } else if (a == "elu") {
    c.qk_activation = QkActivation::kElu1;
  } else if (a != "identity") {
    return ConfigFieldError("qk_activation",
                            absl::StrCat("'", a,
                                         "' is not supported (silu, relu, elu, "
                                         "identity)"));
  }
  auto norm = Optional<std::string>(j, "qk_norm");
  if (!norm.ok()) return norm.status();
  const std::string n = norm->value_or("l2");
  if (n == "l2") {
    c.qk_l2norm = true;
  } else if (n == "sum") {
    c.qk_sum_norm = true;
  } else {
    return ConfigFieldError(
        "qk_norm", absl::StrCat("'", n, "' is not supported (l2, sum)"));
  }
  return absl::OkStatus();
}

}  // namespace

const ModelTypeDef& DeltaNetType() {
  static const DeltaNetDef kDef;
  return kDef;
}

}  // namespace linattn
