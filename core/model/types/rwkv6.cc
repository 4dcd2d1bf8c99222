// rwkv6: fla's RWKV6ForCausalLM (fla/models/rwkv6/modeling_rwkv6.py) and
// RWKV6Attention, LerpLinear, DDLerpLinear and LoRA (fla/layers/rwkv6.py).
// Its block is its own, so this type runs all of it (Pass runs no MLP):
//   layer 0 with norm_first: x = LayerNorm(x) (pre_norm, BlinkDL's ln0)
//   xn = LayerNorm(x) (attn_norm); δ = x̃_{t−1} − xn_t (token shift: the row
//     before, or the session's last one)
//   m = tanh(x_proj.0(xn + δ ⊙ μ)) in five groups of proj_low_rank_dim, each
//     through its slice of x_proj.2 back to hidden, + x_bias: the
//     data-dependent mixes m_r, m_w, m_k, m_v, m_g
//   r, k, v, g = Linear(xn + δ ⊙ m_*); w = −exp(LoRA(xn + δ ⊙ m_w)) (tanh,
//     with bias), the rule's per-key log-decay
//   the rwkv6 rule per head with q = r (scale 1; its bonus u is added here,
//     (Σ r⊙u⊙k)·v per head, as the rule's spec carries none: one spec
//     serves every layer and u is each layer's)
//   GroupNorm per head (eps linattn_group_norm_eps, else norm_eps) × SiLU(g);
//   x += o_proj(·)
//   xn = LayerNorm(x) (ffn_norm); its own token shift;
//   x += σ(receptance(xn + δ ⊙ μ_r)) ⊙ value(relu(key(xn + δ ⊙ μ_k))²)
// The session keeps, per layer, S and the two token-shift rows (the
// model's window, model.h). The low-rank products stay fp32 whatever the
// weight type, like rwkv7's; the rest follows --weights.
// Reference: tools/linattn_ref.py's RWKV6Attention and RWKV6LM.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/model/row_ops.h"
#include "core/model/softmax_attention.h"
#include "core/model/types/rule_mixer.h"
#include "core/model/types/rwkv_block.h"
#include "core/util/parallel_for.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

// The five data-dependent mixes, in x_proj's (and x_bias's) order.
constexpr int kMixes = 5;
enum Mix { kR = 0, kW, kK, kV, kG };

struct Rwkv6Layer final : LayerExtras {
  RwkvNorms norms;
  std::vector<float> x_mu;                     // x_proj.0.mu, hidden
  std::vector<float> x_bias;                   // 5 × hidden
  std::unique_ptr<PackedLinear> x_down;        // x_proj.0: 5·rank × hidden
  std::unique_ptr<PackedLinear> x_up[kMixes];  // x_proj.2's slices
  std::unique_ptr<PackedLinear> r, k, v, g;    // the projections
  // w_proj: a LoRA (w_down, w_up, w_bias), or with decay_rank 0 a plain
  // Linear (w_down alone, key_dim × hidden, no bias).
  std::unique_ptr<PackedLinear> w_down, w_up;
  std::vector<float> w_bias;                         // key_dim, or empty
  std::vector<float> bonus;                          // u: key_dim
  std::vector<float> g_norm_w, g_norm_b;             // value_dim
  std::vector<float> ffn_key_mu, ffn_receptance_mu;  // hidden each
  std::unique_ptr<PackedLinear> ffn_key, ffn_receptance;
  std::unique_ptr<PackedLinear> ffn_value;  // into its own rows

  std::vector<const PackedLinear*> Projections() const override {
    std::vector<const PackedLinear*> out;
    for (const auto* p :
         {&x_down, &x_up[0], &x_up[1], &x_up[2], &x_up[3], &x_up[4], &r, &k, &v,
          &g, &w_down, &w_up, &ffn_key, &ffn_receptance, &ffn_value}) {
      if (*p != nullptr) out.push_back(p->get());
    }
    return out;
  }
};

// The workspace blocks of one pass (ws.extra1, capacity rows each).
struct Blocks {
  float* delta;        // H: the token shift's x_{t−1} − x_t
  float* lerp;         // H: xn + δ ⊙ μ, then each projection's input
  float* low;          // 5·rank: tanh(x_proj.0(·))
  float* group;        // rank: one group of `low`
  float* mix[kMixes];  // H each: m_r … m_g
  float* w_low;        // decay rank
  float* g;            // value_dim
  float* hidden;       // intermediate
  float* receptance;   // H
  float* value;        // H
};

class Rwkv6Def final : public RwkvBlockDef {
 public:
  Rwkv6Def() : RwkvBlockDef(ModelType::kRwkv6, "rwkv6", "RWKV6Attention") {}

  absl::Status ReadConfig(const json& j, ModelConfig& c) const override;
  absl::Status CheckSizes(const ModelConfig& c) const override;
  AttentionSpec Spec(const ModelConfig& c) const override {
    AttentionSpec spec = RuleSpec(c, UpdateRule::kRwkv6);
    // u is each layer's: the rule runs with none and the layer adds its
    // term (RunMixer).
    spec.bonus.assign(uint64_t{c.state_heads} * c.head_k, 0.0f);
    return spec;
  }
  absl::Status LoadMixer(TensorReader& r, const ModelConfig& c,
                         const std::string& layer, WeightType weights,
                         Model::Layer& L) const override;
  absl::Status RunMixer(ForwardRunner& runner,
                        const LayerPass& pass) const override;
  // A hybrid's attention layer: RWKV6Block with Attention in place of the
  // time mix (its LayerNorms, no time-mix token shift), then the channel
  // mix as in every layer.
  absl::Status LoadAttentionBlock(TensorReader& r, const ModelConfig& c,
                                  const std::string& layer, WeightType weights,
                                  Model::Layer& L) const override;
  absl::Status RunAttentionBlock(ForwardRunner& runner,
                                 const LayerPass& pass) const override;

 private:
  static Blocks BlocksOf(const ModelConfig& c, ForwardWorkspace& ws);
  // The channel mix's weights (ffn.*) into `w`.
  static absl::Status LoadChannelMix(TensorReader& r, const ModelConfig& c,
                                     const std::string& layer,
                                     WeightType weights, Rwkv6Layer& w);
  // x += the channel mix of ffn_norm(x) for the rows of `pass`.
  static absl::Status RunChannelMix(ForwardRunner& runner,
                                    const LayerPass& pass, const Rwkv6Layer& w,
                                    const Blocks& b);
};

absl::Status Rwkv6Def::ReadConfig(const json& j, ModelConfig& c) const {
  // RWKV6Config: num_heads 4, expand_k 0.5, expand_v 1; RWKV6Attention
  // splits key_dim and value_dim evenly over the heads.
  LINATTN_RETURN_IF_ERROR(Dim(j, "num_heads", &c.num_heads, 4));
  c.num_kv_heads = c.num_heads;
  LINATTN_RETURN_IF_ERROR(ReadHeadWidths(j, c, 0.5, 1.0));
  // proj_low_rank_dim sizes x_proj (null would not build in fla);
  // gate_low_rank_dim null makes w_proj a plain Linear (DDLerpLinear with
  // no low_rank_dim): decay_rank 0 here.
  auto null = [&](const char* field) {
    auto it = j.find(field);
    return it != j.end() && it->is_null();
  };
  if (null("proj_low_rank_dim")) {
    return ConfigFieldError("proj_low_rank_dim",
                            "must be a positive integer (x_proj's rank)");
  }
  LINATTN_RETURN_IF_ERROR(Dim(j, "proj_low_rank_dim", &c.mix_rank, 32));
  if (null("gate_low_rank_dim")) {
    c.decay_rank = 0;
  } else {
    LINATTN_RETURN_IF_ERROR(Dim(j, "gate_low_rank_dim", &c.decay_rank, 64));
  }
  // RWKV6FeedForward: the hidden ratio 3.5 when absent or null; fuse_norm
  // picks fla's fused kernels only, the same function either way.
  LINATTN_RETURN_IF_ERROR(ReadRwkvBlockConfig(j, 3.5, c));
  // The group norm's ε: fla's RWKV6Attention passes norm_eps; BlinkDL's
  // own code uses 64e-5, which tools/convert_rwkv.py writes here (a field
  // of linattn's, which fla ignores).
  double group_eps = c.norm_eps;
  LINATTN_RETURN_IF_ERROR(Value(j, "linattn_group_norm_eps", &group_eps));
  if (!(group_eps > 0) || !std::isfinite(group_eps)) {
    return ConfigFieldError("linattn_group_norm_eps", "must be > 0");
  }
  c.group_norm_eps = static_cast<float>(group_eps);
  return absl::OkStatus();
}

absl::Status Rwkv6Def::CheckSizes(const ModelConfig& c) const {
  if (c.head_k > kMaxDim || c.head_v > kMaxDim || c.state_heads > kMaxDim) {
    return ConfigFieldError(
        "num_heads",
        absl::StrCat("a state head of ", c.head_k, " × ", c.head_v, " (",
                     c.state_heads, " heads) is beyond linattn's limit ",
                     kMaxDim));
  }
  if (uint64_t{kMixes} * c.mix_rank > kMaxModelDim) {
    return ConfigFieldError(
        "proj_low_rank_dim",
        absl::StrCat("5 × ", c.mix_rank, " is beyond linattn's limit ",
                     kMaxModelDim));
  }
  return absl::OkStatus();
}

absl::Status Rwkv6Def::LoadMixer(TensorReader& r, const ModelConfig& c,
                                 const std::string& layer, WeightType weights,
                                 Model::Layer& L) const {
  const int64_t H = c.hidden_size, dk = c.key_dim(), dv = c.value_dim(),
                rank = c.mix_rank;
  auto w = std::make_unique<Rwkv6Layer>();
  const std::string a = layer + "attn.";
  LINATTN_RETURN_IF_ERROR(LoadRwkvNorms(r, c, layer, &w->norms));

  auto pack = [&](const float* m, int64_t out, int64_t in, WeightType type,
                  std::unique_ptr<PackedLinear>* into) -> absl::Status {
    LINATTN_ASSIGN_OR_RETURN(
        *into, PackedLinear::Create(m, out, in, /*accumulate=*/false, type));
    return absl::OkStatus();
  };
  auto linear = [&](const std::string& name, int64_t out, int64_t in,
                    WeightType type, std::unique_ptr<PackedLinear>* into,
                    bool accumulate = false) -> absl::Status {
    LINATTN_ASSIGN_OR_RETURN(AlignedBuffer m, r.Matrix(name, out, in));
    LINATTN_ASSIGN_OR_RETURN(
        *into, PackedLinear::Create(m.data(), out, in, accumulate, type));
    return absl::OkStatus();
  };
  // x_proj: LerpLinear(hidden, 5·rank) (its mu and bias-free linear), tanh,
  // Linear(5·rank, hidden) whose columns [n·rank, (n+1)·rank) make mix n.
  LINATTN_ASSIGN_OR_RETURN(w->x_mu, r.Vector(a + "x_proj.0.mu", H));
  LINATTN_RETURN_IF_ERROR(linear(a + "x_proj.0.linear.weight", kMixes * rank, H,
                                 WeightType::kF32, &w->x_down));
  {
    LINATTN_ASSIGN_OR_RETURN(AlignedBuffer up,
                             r.Matrix(a + "x_proj.2.weight", H, kMixes * rank));
    std::vector<float> slice(static_cast<uint64_t>(H) * rank);
    for (int n = 0; n < kMixes; ++n) {
      for (int64_t row = 0; row < H; ++row) {
        std::memcpy(slice.data() + row * rank,
                    up.data() + row * kMixes * rank + n * rank,
                    rank * sizeof(float));
      }
      LINATTN_RETURN_IF_ERROR(
          pack(slice.data(), H, rank, WeightType::kF32, &w->x_up[n]));
    }
  }
  LINATTN_RETURN_IF_ERROR(r.Check(a + "x_bias", {kMixes, H}));
  w->x_bias.resize(kMixes * H);
  LINATTN_RETURN_IF_ERROR(r.Read(a + "x_bias", {kMixes, H}, w->x_bias.data()));
  LINATTN_RETURN_IF_ERROR(
      linear(a + "r_proj.linear.weight", dk, H, weights, &w->r));
  LINATTN_RETURN_IF_ERROR(
      linear(a + "k_proj.linear.weight", dk, H, weights, &w->k));
  LINATTN_RETURN_IF_ERROR(
      linear(a + "v_proj.linear.weight", dv, H, weights, &w->v));
  LINATTN_RETURN_IF_ERROR(
      linear(a + "g_proj.linear.weight", dv, H, weights, &w->g));
  // w_proj's LoRA: lora.0 (rank × hidden), tanh, lora.2 (key_dim × rank)
  // with its bias; or a plain Linear. fp32 either way, as the LoRAs.
  if (c.decay_rank == 0) {
    LINATTN_RETURN_IF_ERROR(linear(a + "w_proj.linear.weight", dk, H,
                                   WeightType::kF32, &w->w_down));
  } else {
    const std::string lora = a + "w_proj.linear.lora.";
    LINATTN_RETURN_IF_ERROR(linear(lora + "0.weight", c.decay_rank, H,
                                   WeightType::kF32, &w->w_down));
    LINATTN_RETURN_IF_ERROR(linear(lora + "2.weight", dk, c.decay_rank,
                                   WeightType::kF32, &w->w_up));
    LINATTN_ASSIGN_OR_RETURN(w->w_bias, r.Vector(lora + "2.bias", dk));
  }
  {
    const int64_t heads = c.num_heads, hk = c.head_k;
    LINATTN_RETURN_IF_ERROR(r.Check(a + "bonus", {heads, hk}));
    w->bonus.resize(dk);
    LINATTN_RETURN_IF_ERROR(r.Read(a + "bonus", {heads, hk}, w->bonus.data()));
  }
  LINATTN_ASSIGN_OR_RETURN(w->g_norm_w, r.Vector(a + "g_norm.weight", dv));
  LINATTN_ASSIGN_OR_RETURN(w->g_norm_b, r.Vector(a + "g_norm.bias", dv));
  LINATTN_RETURN_IF_ERROR(
      linear(a + "o_proj.weight", H, dv, weights, &L.o, /*accumulate=*/true));

  LINATTN_RETURN_IF_ERROR(LoadChannelMix(r, c, layer, weights, *w));
  L.extras = std::move(w);
  return absl::OkStatus();
}

absl::Status Rwkv6Def::LoadChannelMix(TensorReader& r, const ModelConfig& c,
                                      const std::string& layer,
                                      WeightType weights, Rwkv6Layer& w) {
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  const std::string f = layer + "ffn.";
  auto linear = [&](const std::string& name, int64_t out, int64_t in,
                    std::unique_ptr<PackedLinear>* into) -> absl::Status {
    LINATTN_ASSIGN_OR_RETURN(AlignedBuffer m, r.Matrix(name, out, in));
    LINATTN_ASSIGN_OR_RETURN(
        *into, PackedLinear::Create(m.data(), out, in, false, weights));
    return absl::OkStatus();
  };
  LINATTN_ASSIGN_OR_RETURN(w.ffn_key_mu, r.Vector(f + "key.mu", H));
  LINATTN_ASSIGN_OR_RETURN(w.ffn_receptance_mu,
                           r.Vector(f + "receptance.mu", H));
  LINATTN_RETURN_IF_ERROR(linear(f + "key.linear.weight", I, H, &w.ffn_key));
  LINATTN_RETURN_IF_ERROR(
      linear(f + "receptance.linear.weight", H, H, &w.ffn_receptance));
  return linear(f + "value.weight", H, I, &w.ffn_value);
}

absl::Status Rwkv6Def::LoadAttentionBlock(TensorReader& r, const ModelConfig& c,
                                          const std::string& layer,
                                          WeightType weights,
                                          Model::Layer& L) const {
  auto w = std::make_unique<Rwkv6Layer>();
  LINATTN_RETURN_IF_ERROR(LoadRwkvNorms(r, c, layer, &w->norms));
  LINATTN_RETURN_IF_ERROR(LoadChannelMix(r, c, layer, weights, *w));
  L.extras = std::move(w);
  return absl::OkStatus();
}

absl::Status Rwkv6Def::RunAttentionBlock(ForwardRunner& runner,
                                         const LayerPass& pass) const {
  const Model& m = runner.model();
  const ModelConfig& c = m.config();
  const Model::Layer& L = m.layers()[pass.layer];
  const Rwkv6Layer& w = static_cast<const Rwkv6Layer&>(*L.extras);
  RwkvMixerInput(pass, c, L, w.norms, runner.workspace());
  LINATTN_RETURN_IF_ERROR(RunSoftmaxAttention(runner, pass));
  return RunChannelMix(runner, pass, w, BlocksOf(c, runner.workspace()));
}

Blocks Rwkv6Def::BlocksOf(const ModelConfig& c, ForwardWorkspace& ws) {
  const uint64_t H = c.hidden_size, dv = c.value_dim();
  const std::vector<float*> p =
      RwkvRowBlocks(ws, {H, H, uint64_t{kMixes} * c.mix_rank, c.mix_rank, H, H,
                         H, H, H, c.decay_rank, dv, c.intermediate_size, H, H});
  auto at = p.begin();
  Blocks b;
  b.delta = *at++;
  b.lerp = *at++;
  b.low = *at++;
  b.group = *at++;
  for (float*& m : b.mix) m = *at++;
  b.w_low = *at++;
  b.g = *at++;
  b.hidden = *at++;
  b.receptance = *at++;
  b.value = *at++;
  return b;
}

absl::Status Rwkv6Def::RunMixer(ForwardRunner& runner,
                                const LayerPass& pass) const {
  const Model& m = runner.model();
  const ModelConfig& c = m.config();
  const Model::Layer& L = m.layers()[pass.layer];
  const Rwkv6Layer& w = static_cast<const Rwkv6Layer&>(*L.extras);
  ForwardWorkspace& ws = runner.workspace();
  const uint32_t rows = pass.rows, H = c.hidden_size, nh = c.num_heads,
                 dk = c.head_k, dvh = c.head_v, rank = c.mix_rank;
  const uint64_t key_dim = c.key_dim(), dv = c.value_dim();
  const Blocks b = BlocksOf(c, ws);
  const bool parallel = uint64_t{rows} * H >= kParallelFloats;
  float* x = ws.x.data();
  float* xn = ws.xn.data();
  // y = xn + δ ⊙ mix (mix one vector, or one row per token).
  auto lerp = [&](const float* mix, uint64_t mix_stride, float* y) {
    ParallelFor(rows, parallel, [&](uint64_t r) {
      const float* xr = xn + r * H;
      const float* d = b.delta + r * H;
      const float* mr = mix + r * mix_stride;
      float* yr = y + r * H;
      for (uint32_t i = 0; i < H; ++i) yr[i] = xr[i] + d[i] * mr[i];
    });
  };

  // --- Time mix ---
  RwkvTimeMixInput(pass, c, L, w.norms, ws, b.delta);
  // The data-dependent mixes: tanh(x_proj.0(xn + δ ⊙ μ)), each group of
  // `rank` through its slice of x_proj.2, + x_bias.
  lerp(w.x_mu.data(), 0, b.lerp);
  LINATTN_RETURN_IF_ERROR(w.x_down->Apply(b.lerp, rows, b.low));
  const uint64_t low_width = uint64_t{kMixes} * rank;
  ParallelFor(rows, parallel, [&](uint64_t r) {
    float* lr = b.low + r * low_width;
    for (uint64_t i = 0; i < low_width; ++i) lr[i] = std::tanh(lr[i]);
  });
  for (int n = 0; n < kMixes; ++n) {
    // Group n of every row, copied to rows of `rank`.
    for (uint32_t r = 0; r < rows; ++r) {
      std::memcpy(b.group + uint64_t{r} * rank,
                  b.low + r * low_width + n * rank, rank * sizeof(float));
    }
    LINATTN_RETURN_IF_ERROR(w.x_up[n]->Apply(b.group, rows, b.mix[n]));
    ParallelFor(rows, parallel, [&](uint64_t r) {
      float* mr = b.mix[n] + r * H;
      const float* xb = w.x_bias.data() + uint64_t(n) * H;
      for (uint32_t i = 0; i < H; ++i) mr[i] += xb[i];
    });
  }
  float* const r_out = ws.fq.data();
  float* const k_out = ws.fk.data();
  float* const v_out = ws.v.data();
  float* const log_decay = ws.g.data();
  lerp(b.mix[kR], H, b.lerp);
  LINATTN_RETURN_IF_ERROR(w.r->Apply(b.lerp, rows, r_out));
  lerp(b.mix[kW], H, b.lerp);
  const bool w_lora = c.decay_rank != 0;
  LINATTN_RETURN_IF_ERROR(
      w.w_down->Apply(b.lerp, rows, w_lora ? b.w_low : log_decay));
  lerp(b.mix[kK], H, b.lerp);
  LINATTN_RETURN_IF_ERROR(w.k->Apply(b.lerp, rows, k_out));
  lerp(b.mix[kV], H, b.lerp);
  LINATTN_RETURN_IF_ERROR(w.v->Apply(b.lerp, rows, v_out));
  lerp(b.mix[kG], H, b.lerp);
  LINATTN_RETURN_IF_ERROR(w.g->Apply(b.lerp, rows, b.g));
  if (w_lora) {
    ParallelFor(rows, parallel, [&](uint64_t r) {
      float* wl = b.w_low + r * c.decay_rank;
      for (uint32_t i = 0; i < c.decay_rank; ++i) wl[i] = std::tanh(wl[i]);
    });
    LINATTN_RETURN_IF_ERROR(w.w_up->Apply(b.w_low, rows, log_decay));
  }
  // w = −exp(w_proj(·)): the rule's log-decay, ≤ 0 (−inf past exp's
  // range, which the rule refuses by name).
  // The exp is the vector kernels' (within 2 ulp of std::exp's, +inf past
  // 89 like it).
  const VectorKernels& kernels = ActiveKernels();
  ParallelFor(rows, parallel, [&](uint64_t r) {
    float* wd = log_decay + r * key_dim;
    if (w_lora) {
      for (uint64_t i = 0; i < key_dim; ++i) wd[i] += w.w_bias[i];
    }
    kernels.exp_shifted(static_cast<uint32_t>(key_dim), 0.0f, -1.0f, wd);
  });
  LINATTN_RETURN_IF_ERROR(runner.RunAttention(pass, log_decay, nullptr));
  // The bonus (Σ r⊙u⊙k)·v per head, GroupNorm per head, × SiLU(g).
  float* const o_out = ws.o.data();
  ParallelFor(rows, parallel, [&](uint64_t r) {
    float* o = o_out + r * dv;
    const float* rr = r_out + r * key_dim;
    const float* k = k_out + r * key_dim;
    const float* v = v_out + r * dv;
    float* g = b.g + r * dv;
    kernels.silu(static_cast<uint32_t>(dv), g, g);
    for (uint32_t h = 0; h < nh; ++h) {
      float* oh = o + uint64_t{h} * dvh;
      const uint64_t vo = uint64_t{h} * dvh;
      float own = 0;
      for (uint32_t i = 0; i < dk; ++i) {
        const uint32_t ki = h * dk + i;
        own += rr[ki] * w.bonus[ki] * k[ki];
      }
      for (uint32_t i = 0; i < dvh; ++i) oh[i] += own * v[vo + i];
      LayerNormRow(oh, dvh, w.g_norm_w.data() + vo, w.g_norm_b.data() + vo,
                   c.group_norm_eps, oh);
      for (uint32_t i = 0; i < dvh; ++i) oh[i] *= g[vo + i];
    }
  });
  LINATTN_RETURN_IF_ERROR(L.o->Apply(o_out, rows, x));

  return RunChannelMix(runner, pass, w, b);
}

absl::Status Rwkv6Def::RunChannelMix(ForwardRunner& runner,
                                     const LayerPass& pass, const Rwkv6Layer& w,
                                     const Blocks& b) {
  const ModelConfig& c = runner.model().config();
  ForwardWorkspace& ws = runner.workspace();
  const uint32_t rows = pass.rows, H = c.hidden_size;
  const uint64_t I = c.intermediate_size;
  const bool parallel = uint64_t{rows} * H >= kParallelFloats;
  float* x = ws.x.data();
  float* xn = ws.xn.data();
  auto lerp = [&](const float* mix, float* y) {
    ParallelFor(rows, parallel, [&](uint64_t r) {
      const float* xr = xn + r * H;
      const float* d = b.delta + r * H;
      float* yr = y + r * H;
      for (uint32_t i = 0; i < H; ++i) yr[i] = xr[i] + d[i] * mix[i];
    });
  };
  RwkvChannelMixInput(pass, c, w.norms, ws, b.delta);
  lerp(w.ffn_key_mu.data(), b.lerp);
  LINATTN_RETURN_IF_ERROR(w.ffn_key->Apply(b.lerp, rows, b.hidden));
  lerp(w.ffn_receptance_mu.data(), b.lerp);
  LINATTN_RETURN_IF_ERROR(w.ffn_receptance->Apply(b.lerp, rows, b.receptance));
  RwkvReluSquare(b.hidden, rows, I);
  LINATTN_RETURN_IF_ERROR(w.ffn_value->Apply(b.hidden, rows, b.value));
  const VectorKernels& kernels = ActiveKernels();
  ParallelFor(rows, parallel, [&](uint64_t r) {
    float* xr = x + r * H;
    float* rc = b.receptance + r * H;
    const float* v = b.value + r * H;
    kernels.sigmoid(H, rc, rc);
    for (uint32_t i = 0; i < H; ++i) xr[i] += rc[i] * v[i];
  });
  return absl::OkStatus();
}

}  // namespace

const ModelTypeDef& Rwkv6Type() {
  static const Rwkv6Def kDef;
  return kDef;
}

}  // namespace linattn
