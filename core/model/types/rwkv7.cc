// rwkv7: fla's RWKV7ForCausalLM (fla/models/rwkv7/modeling_rwkv7.py) and
// RWKV7Attention (fla/layers/rwkv7.py). Its block is its own, so this type
// runs all of it (Pass runs no MLP after it):
//   layer 0 with norm_first: x = LayerNorm(x) (pre_norm, BlinkDL's ln0)
//   xn = LayerNorm(x) (attn_norm); δ = x̃_{t−1} − xn_t (token shift: the row
//     before, or the session's last one); x_* = xn + δ ⊙ mix_* for r w k v a g
//   r, k, v projections; w = −e^{−½}·σ(w_lora(x_w)) (tanh LoRA), the rule's
//   per-key log-decay; in every layer after the first v = lerp(v, v_first,
//   σ(v_lora(x_v))) with v_first the first layer's v of the same token;
//   a = σ(a_lora(x_a)); g = g_lora(x_g) (σ inside); κ̂ = L2-normalised
//   (k ⊙ k_k) per head; k = k ⊙ (1 + (a − 1) ⊙ k_a)
//   the rwkv7 rule with q = r, gate w, a = −κ̂, b = κ̂ ⊙ a (scale 1)
//   GroupNorm per head (eps head_dim·norm_eps) + (Σ r⊙k⊙r_k)·v per head, × g
//   x += o_proj(·)
//   xn = LayerNorm(x) (ffn_norm); its own token shift and mix x_k;
//   x += value(relu(key(·))²)
// The session keeps, per layer, S and the two token-shift rows (the
// model's window, model.h). The low-rank (LoRA) products stay fp32 whatever
// the weight type, like GLA's gate; the rest follows --weights.
// Reference: tools/linattn_ref.py's RWKV7Attention and RWKV7LM.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/model/row_ops.h"
#include "core/model/types/rule_mixer.h"
#include "core/model/types/rwkv_block.h"
#include "core/util/parallel_for.h"
#include "core/util/row_view.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

// e^{−½}: fla's −0.6065306597126334 (BlinkDL's 1/√e).
constexpr float kDecayScale = 0.6065306597126334f;

struct Rwkv7Layer final : LayerExtras {
  RwkvNorms norms;
  std::vector<float> mix;  // x_r, x_w, x_k, x_v, x_a, x_g: 6 × hidden
  std::vector<float> k_k, k_a, r_k;       // hidden each
  std::unique_ptr<PackedLinear> r, k, v;  // the projections
  std::unique_ptr<PackedLinear> w_down, a_down, v_down, g_down;  // lora.0
  std::unique_ptr<PackedLinear> w_up, a_up, v_up, g_up;          // lora.2
  std::vector<float> w_bias, a_bias, v_bias;
  std::vector<float> g_norm_w, g_norm_b;             // value_dim
  std::vector<float> ffn_mix;                        // hidden
  std::unique_ptr<PackedLinear> ffn_key, ffn_value;  // value adds into x

  std::vector<const PackedLinear*> Projections() const override {
    std::vector<const PackedLinear*> out;
    for (const auto* p : {&r, &k, &v, &w_down, &a_down, &v_down, &g_down, &w_up,
                          &a_up, &v_up, &g_up, &ffn_key, &ffn_value}) {
      if (*p != nullptr) out.push_back(p->get());
    }
    return out;
  }
};

// The workspace blocks of one pass (ws.extra1, capacity rows each).
struct Blocks {
  float* delta;   // H: the token shift's x_{t−1} − x_t
  float* mix[6];  // H each: x_r, x_w, x_k, x_v, x_a, x_g
  float* w_low;   // decay rank
  float* a_low;   // a rank
  float* v_low;   // v rank
  float* g_low;   // gate rank
  float* w_up;    // H
  float* a;       // H: a_up, then a
  float* v_gate;  // value_dim
  float* g;       // value_dim
  float* rule_a;  // H: −κ̂
  float* rule_b;  // H: κ̂ ⊙ a
  float* hidden;  // intermediate
};

class Rwkv7Def final : public RwkvBlockDef {
 public:
  Rwkv7Def() : RwkvBlockDef(ModelType::kRwkv7, "rwkv7", "RWKV7Attention") {}

  absl::Status ReadConfig(const json& j, ModelConfig& c) const override;
  absl::Status CheckSizes(const ModelConfig& c) const override;
  AttentionSpec Spec(const ModelConfig& c) const override {
    return RuleSpec(c, UpdateRule::kRwkv7);
  }
  absl::Status LoadMixer(TensorReader& r, const ModelConfig& c,
                         const std::string& layer, WeightType weights,
                         Model::Layer& L) const override;
  absl::Status RunMixer(ForwardRunner& runner,
                        const LayerPass& pass) const override;

 private:
  static Blocks BlocksOf(const ModelConfig& c, ForwardWorkspace& ws);
};

// A LoRA rank: the config's, or RWKV7Attention's own default when the
// config says null: max(32, round(scale·√hidden·factor / 32)·32), factor =
// head_dim / 64 for all but the gate's (Python's round: halves to even).
absl::Status ReadRank(const json& j, const char* field, uint32_t fallback,
                      double scale, double factor, uint32_t hidden,
                      uint32_t* out) {
  if (auto it = j.find(field); it != j.end() && it->is_null()) {
    const double x =
        scale * std::pow(static_cast<double>(hidden), 0.5) * factor / 32;
    const double rank = std::max(32.0, std::nearbyint(x) * 32);  // to even
    if (!(rank <= kMaxModelDim)) {
      return ConfigFieldError(
          field, absl::StrCat("null gives RWKV7Attention's default rank ", rank,
                              ", beyond linattn's limit ", kMaxModelDim));
    }
    *out = static_cast<uint32_t>(rank);
    return absl::OkStatus();
  }
  return Dim(j, field, out, fallback);
}

absl::Status Rwkv7Def::ReadConfig(const json& j, ModelConfig& c) const {
  const uint32_t H = c.hidden_size;
  // RWKV7Config: head_dim (default 64) from num_heads when null; then
  // RWKV7Attention takes head_dim over num_heads: heads = hidden / head_dim.
  auto head_dim = Optional<int64_t>(j, "head_dim");
  if (!head_dim.ok()) return head_dim.status();
  uint32_t dk = 64;
  if (j.contains("head_dim") && !head_dim->has_value()) {
    uint32_t heads = 0;
    if (auto s = Dim(j, "num_heads", &heads); !s.ok()) {
      return ConfigFieldError("num_heads",
                              "required when head_dim is null (must be in "
                              "[1, hidden_size])");
    }
    dk = H / heads;
    if (dk == 0) {
      return ConfigFieldError("num_heads", "must be at most hidden_size");
    }
  } else if (auto s = Dim(j, "head_dim", &dk, 64); !s.ok()) {
    return s;
  }
  LINATTN_RETURN_IF_ERROR(Divides("head_dim", H, dk, "hidden_size"));
  c.head_k = dk;
  c.num_heads = c.num_kv_heads = c.state_heads = H / dk;
  // value_dim: null (hidden_size), a number, or one per layer; each a
  // multiple of hidden_size. v_first (layer 0's v) is mixed into every
  // later layer's v, so fla's model only runs when they are all the same.
  uint64_t value_dim = H;
  if (auto it = j.find("value_dim"); it != j.end() && !it->is_null()) {
    std::vector<int64_t> dims;
    const auto integer = [](const json& v) {
      return v.is_number_integer() ? std::optional<int64_t>(v.get<int64_t>())
                                   : std::nullopt;
    };
    if (it->is_array()) {
      for (const json& v : *it) {
        const auto d = integer(v);
        if (!d) {
          return ConfigFieldError("value_dim",
                                  "must be an integer or a list of them");
        }
        dims.push_back(*d);
      }
      if (dims.size() != c.num_hidden_layers) {
        return ConfigFieldError(
            "value_dim", absl::StrCat("has ", dims.size(),
                                      " entries for num_hidden_layers = ",
                                      c.num_hidden_layers));
      }
    } else if (const auto d = integer(*it)) {
      dims.push_back(*d);
    } else {
      return ConfigFieldError("value_dim",
                              "must be an integer or a list of them");
    }
    for (int64_t d : dims) {
      if (d != dims[0]) {
        return ConfigFieldError(
            "value_dim",
            "differs between layers; the first layer's v (v_first) is "
            "mixed into every later layer's, so all must be the same");
      }
    }
    if (dims.empty() || dims[0] < H || dims[0] % H != 0 ||
        dims[0] > kMaxModelDim) {
      return ConfigFieldError(
          "value_dim", absl::StrCat("must be a multiple of hidden_size (", H,
                                    ") up to ", kMaxModelDim));
    }
    value_dim = static_cast<uint64_t>(dims[0]);
  }
  c.head_v = static_cast<uint32_t>(value_dim / c.num_heads);
  const double factor = dk / 64.0;
  LINATTN_RETURN_IF_ERROR(
      ReadRank(j, "decay_low_rank_dim", 64, 2.5, factor, H, &c.decay_rank));
  LINATTN_RETURN_IF_ERROR(
      ReadRank(j, "gate_low_rank_dim", 128, 5, 1, H, &c.gate_rank));
  LINATTN_RETURN_IF_ERROR(
      ReadRank(j, "a_low_rank_dim", 64, 2.5, factor, H, &c.a_rank));
  LINATTN_RETURN_IF_ERROR(
      ReadRank(j, "v_low_rank_dim", 16, 1.7, factor, H, &c.v_rank));
  // RWKV7FeedForward: the hidden ratio 4 when absent or null.
  return ReadRwkvBlockConfig(j, 4, c);
}

absl::Status Rwkv7Def::CheckSizes(const ModelConfig& c) const {
  if (c.head_k > kMaxDim || c.head_v > kMaxDim || c.state_heads > kMaxDim) {
    return ConfigFieldError(
        "head_dim",
        absl::StrCat("a state head of ", c.head_k, " × ", c.head_v, " (",
                     c.state_heads, " heads) is beyond linattn's limit ",
                     kMaxDim));
  }
  return absl::OkStatus();
}

absl::Status Rwkv7Def::LoadMixer(TensorReader& r, const ModelConfig& c,
                                 const std::string& layer, WeightType weights,
                                 Model::Layer& L) const {
  const int64_t H = c.hidden_size, dv = c.value_dim(), I = c.intermediate_size;
  const uint32_t index = RwkvLayerIndex(layer);
  auto w = std::make_unique<Rwkv7Layer>();
  const std::string a = layer + "attn.", f = layer + "ffn.";
  LINATTN_RETURN_IF_ERROR(LoadRwkvNorms(r, c, layer, &w->norms));

  // The six mixes, (1, 1, hidden) each; fla's first RWKV7Attention kept
  // them as one x_x of (6, hidden), which fla still loads.
  w->mix.resize(6 * H);
  if (r.Has(a + "x_x")) {
    LINATTN_RETURN_IF_ERROR(r.Check(a + "x_x", {6, H}));
    LINATTN_RETURN_IF_ERROR(r.Read(a + "x_x", {6, H}, w->mix.data()));
  } else {
    const char* names[6] = {"x_r", "x_w", "x_k", "x_v", "x_a", "x_g"};
    for (int i = 0; i < 6; ++i) {
      LINATTN_RETURN_IF_ERROR(r.Check(a + names[i], {1, 1, H}));
      LINATTN_RETURN_IF_ERROR(
          r.Read(a + names[i], {1, 1, H}, w->mix.data() + i * H));
    }
  }
  LINATTN_ASSIGN_OR_RETURN(w->k_k, r.Vector(a + "k_k", H));
  LINATTN_ASSIGN_OR_RETURN(w->k_a, r.Vector(a + "k_a", H));
  {
    const int64_t heads = c.num_heads, dk = c.head_k;
    LINATTN_RETURN_IF_ERROR(r.Check(a + "r_k", {heads, dk}));
    w->r_k.resize(H);
    LINATTN_RETURN_IF_ERROR(r.Read(a + "r_k", {heads, dk}, w->r_k.data()));
  }
  auto linear = [&](const std::string& name, int64_t out, int64_t in,
                    bool accumulate, WeightType type,
                    std::unique_ptr<PackedLinear>* into) -> absl::Status {
    LINATTN_ASSIGN_OR_RETURN(AlignedBuffer m, r.Matrix(name, out, in));
    LINATTN_ASSIGN_OR_RETURN(
        *into, PackedLinear::Create(m.data(), out, in, accumulate, type));
    return absl::OkStatus();
  };
  LINATTN_RETURN_IF_ERROR(
      linear(a + "r_proj.weight", H, H, false, weights, &w->r));
  LINATTN_RETURN_IF_ERROR(
      linear(a + "k_proj.weight", H, H, false, weights, &w->k));
  LINATTN_RETURN_IF_ERROR(
      linear(a + "v_proj.weight", dv, H, false, weights, &w->v));
  LINATTN_RETURN_IF_ERROR(
      linear(a + "o_proj.weight", H, dv, true, weights, &L.o));
  // The LoRAs: lora.0 (rank × hidden), an activation, lora.2 (out × rank)
  // with a bias (the gate's has none).
  auto lora = [&](const std::string& name, int64_t rank, int64_t out,
                  std::unique_ptr<PackedLinear>* down,
                  std::unique_ptr<PackedLinear>* up,
                  std::vector<float>* bias) -> absl::Status {
    const std::string p = a + name + ".lora.";
    LINATTN_RETURN_IF_ERROR(
        linear(p + "0.weight", rank, H, false, WeightType::kF32, down));
    LINATTN_RETURN_IF_ERROR(
        linear(p + "2.weight", out, rank, false, WeightType::kF32, up));
    if (bias != nullptr) {
      LINATTN_ASSIGN_OR_RETURN(*bias, r.Vector(p + "2.bias", out));
    }
    return absl::OkStatus();
  };
  LINATTN_RETURN_IF_ERROR(
      lora("w_lora", c.decay_rank, H, &w->w_down, &w->w_up, &w->w_bias));
  LINATTN_RETURN_IF_ERROR(
      lora("a_lora", c.a_rank, H, &w->a_down, &w->a_up, &w->a_bias));
  if (index != 0) {
    LINATTN_RETURN_IF_ERROR(
        lora("v_lora", c.v_rank, dv, &w->v_down, &w->v_up, &w->v_bias));
  }
  LINATTN_RETURN_IF_ERROR(
      lora("g_lora", c.gate_rank, dv, &w->g_down, &w->g_up, nullptr));
  LINATTN_ASSIGN_OR_RETURN(w->g_norm_w, r.Vector(a + "g_norm.weight", dv));
  LINATTN_ASSIGN_OR_RETURN(w->g_norm_b, r.Vector(a + "g_norm.bias", dv));

  LINATTN_ASSIGN_OR_RETURN(w->ffn_mix, r.Vector(f + "x_k", H));
  LINATTN_RETURN_IF_ERROR(
      linear(f + "key.weight", I, H, false, weights, &w->ffn_key));
  LINATTN_RETURN_IF_ERROR(
      linear(f + "value.weight", H, I, true, weights, &w->ffn_value));
  L.extras = std::move(w);
  return absl::OkStatus();
}

Blocks Rwkv7Def::BlocksOf(const ModelConfig& c, ForwardWorkspace& ws) {
  const uint64_t H = c.hidden_size, dv = c.value_dim();
  const std::vector<float*> p =
      RwkvRowBlocks(ws, {H, H, H, H, H, H, H, c.decay_rank, c.a_rank, c.v_rank,
                         c.gate_rank, H, H, dv, dv, H, H, c.intermediate_size});
  ws.extra2.EnsureSize(ws.capacity * dv);  // v_first, kept across layers
  auto at = p.begin();
  Blocks b;
  b.delta = *at++;
  for (float*& m : b.mix) m = *at++;
  b.w_low = *at++;
  b.a_low = *at++;
  b.v_low = *at++;
  b.g_low = *at++;
  b.w_up = *at++;
  b.a = *at++;
  b.v_gate = *at++;
  b.g = *at++;
  b.rule_a = *at++;
  b.rule_b = *at++;
  b.hidden = *at++;
  return b;
}

absl::Status Rwkv7Def::RunMixer(ForwardRunner& runner,
                                const LayerPass& pass) const {
  const Model& m = runner.model();
  const ModelConfig& c = m.config();
  const Model::Layer& L = m.layers()[pass.layer];
  const Rwkv7Layer& w = static_cast<const Rwkv7Layer&>(*L.extras);
  ForwardWorkspace& ws = runner.workspace();
  const uint32_t rows = pass.rows, H = c.hidden_size, nh = c.num_heads,
                 dk = c.head_k, dvh = c.head_v;
  const uint64_t dv = c.value_dim(), I = c.intermediate_size;
  const Blocks b = BlocksOf(c, ws);
  const bool first = pass.layer == 0;
  const bool parallel = uint64_t{rows} * H >= kParallelFloats;
  float* x = ws.x.data();
  float* xn = ws.xn.data();
  const VectorKernels& kernels = ActiveKernels();

  // --- Time mix ---
  RwkvTimeMixInput(pass, c, L, w.norms, ws, b.delta);
  ParallelFor(rows, parallel, [&](uint64_t r) {
    const float* xr = xn + r * H;
    const float* d = b.delta + r * H;
    for (int j = 0; j < 6; ++j) {
      const float* mix = w.mix.data() + static_cast<uint64_t>(j) * H;
      float* y = b.mix[j] + r * H;
      for (uint32_t i = 0; i < H; ++i) y[i] = xr[i] + d[i] * mix[i];
    }
  });
  float* const r_out = ws.fq.data();
  float* const k_out = ws.fk.data();
  float* const v_out = ws.v.data();
  LINATTN_RETURN_IF_ERROR(w.r->Apply(b.mix[0], rows, r_out));
  LINATTN_RETURN_IF_ERROR(w.w_down->Apply(b.mix[1], rows, b.w_low));
  LINATTN_RETURN_IF_ERROR(w.k->Apply(b.mix[2], rows, k_out));
  LINATTN_RETURN_IF_ERROR(w.v->Apply(b.mix[3], rows, v_out));
  if (!first) {
    LINATTN_RETURN_IF_ERROR(w.v_down->Apply(b.mix[3], rows, b.v_low));
  }
  LINATTN_RETURN_IF_ERROR(w.a_down->Apply(b.mix[4], rows, b.a_low));
  LINATTN_RETURN_IF_ERROR(w.g_down->Apply(b.mix[5], rows, b.g_low));
  // The LoRAs' inner activations: tanh (decay), σ (gate).
  ParallelFor(rows, parallel, [&](uint64_t r) {
    float* wl = b.w_low + r * c.decay_rank;
    for (uint32_t i = 0; i < c.decay_rank; ++i) wl[i] = std::tanh(wl[i]);
    float* gl = b.g_low + r * c.gate_rank;
    kernels.sigmoid(c.gate_rank, gl, gl);
  });
  LINATTN_RETURN_IF_ERROR(w.w_up->Apply(b.w_low, rows, b.w_up));
  LINATTN_RETURN_IF_ERROR(w.a_up->Apply(b.a_low, rows, b.a));
  LINATTN_RETURN_IF_ERROR(w.g_up->Apply(b.g_low, rows, b.g));
  if (!first) {
    LINATTN_RETURN_IF_ERROR(w.v_up->Apply(b.v_low, rows, b.v_gate));
  }
  float* const v_first = ws.extra2.data();
  float* const log_decay = ws.g.data();
  ParallelFor(rows, parallel, [&](uint64_t r) {
    float* wd = log_decay + r * H;
    const float* wu = b.w_up + r * H;
    float* av = b.a + r * H;
    // σ through the vector kernels' exp (within 2 ulp of std::exp's).
    for (uint32_t i = 0; i < H; ++i) wd[i] = wu[i] + w.w_bias[i];
    kernels.sigmoid(H, wd, wd);
    for (uint32_t i = 0; i < H; ++i) wd[i] *= -kDecayScale;
    for (uint32_t i = 0; i < H; ++i) av[i] += w.a_bias[i];
    kernels.sigmoid(H, av, av);
    float* v = v_out + r * dv;
    float* vf = v_first + r * dv;
    if (first) {
      std::memcpy(vf, v, dv * sizeof(float));
    } else {
      float* vg = b.v_gate + r * dv;
      for (uint64_t i = 0; i < dv; ++i) vg[i] += w.v_bias[i];
      kernels.sigmoid(static_cast<uint32_t>(dv), vg, vg);
      kernels.lerp(static_cast<uint32_t>(dv), v, vf, vg, v);
    }
    // κ̂ = k ⊙ k_k normalised per head; then k's update; the rule's a and b.
    float* k = k_out + r * H;
    float* ra = b.rule_a + r * H;
    float* rb = b.rule_b + r * H;
    for (uint32_t h = 0; h < nh; ++h) {
      const uint32_t o = h * dk;
      for (uint32_t i = 0; i < dk; ++i) ra[o + i] = k[o + i] * w.k_k[o + i];
      const float ss = kernels.dot(dk, ra + o, ra + o);
      if (c.fuse_norm) {
        const float inv = 1.0f / std::sqrt(ss + 1e-6f);
        for (uint32_t i = 0; i < dk; ++i) ra[o + i] *= inv;
      } else {
        const float norm = std::max(std::sqrt(ss), 1e-12f);
        for (uint32_t i = 0; i < dk; ++i) ra[o + i] /= norm;
      }
    }
    for (uint32_t i = 0; i < H; ++i) {
      k[i] = k[i] + k[i] * (av[i] - 1.0f) * w.k_a[i];
      rb[i] = ra[i] * av[i];
      ra[i] = -ra[i];
    }
  });
  LINATTN_RETURN_IF_ERROR(
      runner.RunAttention(pass, log_decay, nullptr, b.rule_a, b.rule_b));
  // GroupNorm per head, the bonus (Σ r⊙k⊙r_k)·v, the gate.
  const float group_eps = static_cast<float>(dk * double{c.norm_eps});
  float* const o_out = ws.o.data();
  ParallelFor(rows, parallel, [&](uint64_t r) {
    float* o = o_out + r * dv;
    const float* rr = r_out + r * H;
    const float* k = k_out + r * H;
    const float* v = v_out + r * dv;
    const float* g = b.g + r * dv;
    for (uint32_t h = 0; h < nh; ++h) {
      float* oh = o + uint64_t{h} * dvh;
      const uint64_t vo = uint64_t{h} * dvh;
      LayerNormRow(oh, dvh, w.g_norm_w.data() + vo, w.g_norm_b.data() + vo,
                   group_eps, oh);
      float bonus = 0;
      for (uint32_t i = 0; i < dk; ++i) {
        const uint32_t ki = h * dk + i;
        bonus += rr[ki] * k[ki] * w.r_k[ki];
      }
      for (uint32_t i = 0; i < dvh; ++i) {
        oh[i] = (oh[i] + bonus * v[vo + i]) * g[vo + i];
      }
    }
  });
  LINATTN_RETURN_IF_ERROR(L.o->Apply(o_out, rows, x));

  // --- Channel mix ---
  RwkvChannelMixInput(pass, c, w.norms, ws, b.delta);
  ParallelFor(rows, parallel, [&](uint64_t r) {
    const float* xr = xn + r * H;
    const float* d = b.delta + r * H;
    float* y = b.mix[0] + r * H;
    for (uint32_t i = 0; i < H; ++i) y[i] = xr[i] + d[i] * w.ffn_mix[i];
  });
  LINATTN_RETURN_IF_ERROR(w.ffn_key->Apply(b.mix[0], rows, b.hidden));
  RwkvReluSquare(b.hidden, rows, I);
  return w.ffn_value->Apply(b.hidden, rows, x);
}

}  // namespace

const ModelTypeDef& Rwkv7Type() {
  static const Rwkv7Def kDef;
  return kDef;
}

}  // namespace linattn
