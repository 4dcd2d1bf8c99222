#include "core/model/types/rwkv_block.h"

#include <cmath>
#include <cstring>

#include "core/model/row_ops.h"
#include "core/util/parallel_for.h"
#include "core/util/status_macros.h"

namespace linattn {

uint32_t RwkvLayerIndex(const std::string& prefix) {
  const size_t end = prefix.size() - 1;
  size_t start = prefix.rfind('.', end - 1) + 1;
  return static_cast<uint32_t>(std::stoul(prefix.substr(start, end - start)));
}

absl::Status ReadRwkvBlockConfig(const json& j, double ratio, ModelConfig& c) {
  auto inter = Optional<int64_t>(j, "intermediate_size");
  if (!inter.ok()) return inter.status();
  if (inter->has_value()) {
    LINATTN_RETURN_IF_ERROR(Dim(j, "intermediate_size", &c.intermediate_size));
  } else {
    LINATTN_RETURN_IF_ERROR(Value(j, "hidden_ratio", &ratio));
    if (!(ratio > 0) || !std::isfinite(ratio)) {
      return ConfigFieldError("hidden_ratio", "must be > 0");
    }
    const double wanted = std::floor(c.hidden_size * ratio);
    const double rounded = 32 * std::ceil(wanted / 32);
    if (!(rounded >= 1) || rounded > kMaxModelDim) {
      return ConfigFieldError("hidden_ratio",
                              "gives an intermediate size out of range");
    }
    c.intermediate_size = static_cast<uint32_t>(rounded);
  }
  LINATTN_RETURN_IF_ERROR(Bool(j, "norm_first", &c.norm_first, true));
  LINATTN_RETURN_IF_ERROR(Bool(j, "norm_bias", &c.norm_bias, true));
  return Bool(j, "fuse_norm", &c.fuse_norm, true);
}

absl::Status LoadRwkvNorms(TensorReader& r, const ModelConfig& c,
                           const std::string& layer, RwkvNorms* norms) {
  const int64_t H = c.hidden_size;
  auto norm = [&](const std::string& name, std::vector<float>* weight,
                  std::vector<float>* bias) -> absl::Status {
    if (weight != nullptr) {
      LINATTN_ASSIGN_OR_RETURN(*weight, r.Vector(name + ".weight", H));
    }
    if (c.norm_bias) {
      LINATTN_ASSIGN_OR_RETURN(*bias, r.Vector(name + ".bias", H));
    }
    return absl::OkStatus();
  };
  if (RwkvLayerIndex(layer) == 0 && c.norm_first) {
    LINATTN_RETURN_IF_ERROR(
        norm(layer + "pre_norm", &norms->pre_norm_w, &norms->pre_norm_b));
  }
  LINATTN_RETURN_IF_ERROR(
      norm(layer + "attn_norm", nullptr, &norms->attn_norm_b));
  return norm(layer + "ffn_norm", &norms->ffn_norm_w, &norms->ffn_norm_b);
}

void RwkvTokenShift(const LayerPass& pass, const ModelConfig& c,
                    const float* xn, uint64_t offset, float* delta) {
  const uint32_t H = c.hidden_size;
  for (const ForwardPiece& p : pass.pieces) {
    const ForwardItem& item = pass.items[p.item];
    float* window = item.state->conv()[pass.layer].data() + offset;
    for (uint32_t t = 0; t < p.rows; ++t) {
      const uint64_t row = uint64_t{p.row0} + t;
      const float* prev = t == 0 ? window : xn + (row - 1) * H;
      const float* x = xn + row * H;
      float* d = delta + row * H;
      for (uint32_t i = 0; i < H; ++i) d[i] = prev[i] - x[i];
    }
    float* to = item.into != nullptr
                    ? item.into->conv()[pass.layer].data() + offset
                    : window;
    std::memcpy(to, xn + (uint64_t{p.row0} + p.rows - 1) * H,
                H * sizeof(float));
  }
}

namespace {

const float* BiasOf(const std::vector<float>& v) {
  return v.empty() ? nullptr : v.data();
}

}  // namespace

void RwkvMixerInput(const LayerPass& pass, const ModelConfig& c,
                    const Model::Layer& L, const RwkvNorms& norms,
                    ForwardWorkspace& ws) {
  const uint32_t rows = pass.rows, H = c.hidden_size;
  float* x = ws.x.data();
  if (pass.layer == 0 && c.norm_first) {
    LayerNorm(x, rows, H, norms.pre_norm_w.data(), BiasOf(norms.pre_norm_b),
              c.norm_eps, x);
  }
  LayerNorm(x, rows, H, L.attn_norm.data(), BiasOf(norms.attn_norm_b),
            c.norm_eps, ws.xn.data());
}

void RwkvTimeMixInput(const LayerPass& pass, const ModelConfig& c,
                      const Model::Layer& L, const RwkvNorms& norms,
                      ForwardWorkspace& ws, float* delta) {
  RwkvMixerInput(pass, c, L, norms, ws);
  RwkvTokenShift(pass, c, ws.xn.data(), 0, delta);
}

void RwkvChannelMixInput(const LayerPass& pass, const ModelConfig& c,
                         const RwkvNorms& norms, ForwardWorkspace& ws,
                         float* delta) {
  const uint32_t H = c.hidden_size;
  LayerNorm(ws.x.data(), pass.rows, H, norms.ffn_norm_w.data(),
            BiasOf(norms.ffn_norm_b), c.norm_eps, ws.xn.data());
  RwkvTokenShift(pass, c, ws.xn.data(), H, delta);
}

void RwkvReluSquare(float* h, uint64_t rows, uint64_t width) {
  ParallelFor(rows, rows * width >= kParallelFloats, [&](uint64_t r) {
    float* __restrict row = h + r * width;
    for (uint64_t i = 0; i < width; ++i) {
      // torch.relu: negative values (−inf included) to 0, NaN and −0 kept;
      // a mask rather than a select, which GCC leaves as a branch.
      const float x = row[i];
      const uint32_t keep = x < 0.0f ? 0u : ~0u;
      const float y =
          __builtin_bit_cast(float, __builtin_bit_cast(uint32_t, x) & keep);
      row[i] = y * y;
    }
  });
}

std::vector<float*> RwkvRowBlocks(ForwardWorkspace& ws,
                                  std::initializer_list<uint64_t> widths) {
  auto size = [&](uint64_t w) { return (ws.capacity * w + 15) / 16 * 16; };
  uint64_t total = 0;
  for (uint64_t w : widths) total += size(w);
  ws.extra1.EnsureSize(total);
  std::vector<float*> starts;
  float* at = ws.extra1.data();
  for (uint64_t w : widths) {
    starts.push_back(at);
    at += size(w);
  }
  return starts;
}

ModelTypeDef::CommonDefaults RwkvBlockDef::defaults() const {
  CommonDefaults d;
  d.layers = 24;
  d.hidden_act = "sqrelu";
  d.norm_eps = 1e-5;
  d.mlp = false;
  return d;
}

ModelTypeDef::TensorNames RwkvBlockDef::names() const {
  TensorNames n;
  n.final_norm_bias = "model.norm.bias";
  return n;
}

AttentionSpec RwkvBlockDef::RuleSpec(const ModelConfig& c, UpdateRule rule) {
  AttentionSpec spec;
  spec.rule = rule;
  spec.gate = GateShape::kKey;
  spec.num_heads = c.state_heads;
  spec.key_dim = c.head_k;
  spec.value_dim = c.head_v;
  spec.feature_map = FeatureMapKind::kIdentity;
  spec.unnormalized = true;
  return spec;
}

}  // namespace linattn
