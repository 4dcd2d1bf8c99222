// qwen3_next: Qwen3-Next in transformers' layout
// (transformers/models/qwen3_next, Qwen3NextForCausalLM). Per layer, by
// layer_types:
//   x += linear_attn(rmsnorm(x)): Qwen3NextGatedDeltaNet — in_proj_qkvz
//     and in_proj_ba give q, k, v, z, b and a grouped per key head
//     (fix_query_key_value_ordering; reordered at load into RuleMixer's
//     q | k | v | a | β | gate columns), the depthwise conv1d over q|k|v
//     and SiLU, β = σ(b), g = −exp(A_log)·softplus(a + dt_bias), q and k
//     repeated over groups of value heads and L2-normalised, the gated
//     delta rule with q × d_k^−½, per head RMSNorm × weight × SiLU(z),
//     out_proj;
//   or x += self_attn(rmsnorm(x)): gated softmax attention (q_proj's query
//     and gate rows interleaved per head, q_norm and k_norm per head, the
//     rotary embedding on the first head_dim × partial_rotary_factor
//     channels, o · σ(gate) before o_proj; softmax_attention.h);
// then x += mlp(rmsnorm(x)): the sparse block (experts routed by a softmax
// over all of them, the top k, renormalised with norm_topk_prob, plus the
// shared expert times σ(shared_expert_gate · x)) in the layers
// decoder_sparse_step and mlp_only_layers give it, a dense MLP of
// intermediate_size in the others. Every RMSNorm but the linear layers'
// gated one is zero-centred, x̂ · (1 + w): the 1 is folded into the
// weights at load. Multi-token-prediction weights (mtp.*) are left unread,
// as transformers leaves them. Reference: tools/linattn_ref.py's
// Qwen3NextGatedDeltaNet and its language model.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/model/types/rule_mixer.h"
#include "core/model/types/transformers_fields.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

class Qwen3NextDef final : public RuleMixer {
 public:
  Qwen3NextDef()
      : RuleMixer(ModelType::kQwen3Next, "qwen3_next",
                  "Qwen3NextGatedDeltaNet") {}

  CommonDefaults defaults() const override {
    CommonDefaults d;
    d.layers = 48;
    d.vocab_size = 151936;
    d.hidden_act = "silu";
    d.norm_eps = 1e-6;
    d.rms_norm_eps = true;
    d.mlp = false;  // its sizes are read below
    return d;
  }
  absl::Status ReadConfig(const json& j, ModelConfig& c) const override;
  absl::Status CheckSizes(const ModelConfig& c) const override;
  TensorNames names() const override {
    TensorNames n = TransformersTensorNames();  // its dense MLP: mlp.*_proj
    n.experts = "mlp.";
    n.expert_names = {.router = "gate.weight",
                      .gate_up = "experts.gate_up_proj",
                      .down = "experts.down_proj",
                      .each = "experts."};
    n.expert_mlp_gate = "mlp.shared_expert.gate_proj.weight";
    n.expert_mlp_up = "mlp.shared_expert.up_proj.weight";
    n.expert_mlp_down = "mlp.shared_expert.down_proj.weight";
    n.expert_mlp_out_gate = "mlp.shared_expert_gate.weight";
    n.ignored = {{"mtp.", "multi-token-prediction layers"}};
    return n;
  }
  absl::Status LoadMixer(TensorReader& r, const ModelConfig& c,
                         const std::string& layer, WeightType weights,
                         Model::Layer& L) const override;

 protected:
  UpdateRule rule() const override { return UpdateRule::kGatedDelta; }
  const char* size_field() const override { return "linear_num_value_heads"; }
  const char* head_field() const override { return "linear_value_head_dim"; }
  void ExtraColumns(const ModelConfig& c, MixerColumns& m,
                    uint32_t& at) const override {
    m.a = at;
    m.beta = at + c.state_heads;
    at += 2 * c.state_heads;
  }
  void HeadInputs(const Head& x) const override {
    // g = −exp(A_log)·softplus(a + dt_bias), β = σ(b), per value head.
    x.g[0] =
        x.L.neg_exp_a[x.h] * Softplus(x.in[x.cols.a + x.h] + x.L.dt_bias[x.h]);
    x.beta[x.h] = Sigmoid(x.in[x.cols.beta + x.h]);
  }
};

absl::Status Qwen3NextDef::LoadMixer(TensorReader& r, const ModelConfig& c,
                                     const std::string& layer,
                                     WeightType weights,
                                     Model::Layer& L) const {
  const std::string p = layer + "linear_attn.";
  const int64_t H = c.hidden_size, nk = c.num_heads, nv = c.state_heads;
  const int64_t dk = c.head_k, dv = c.head_v, per = nv / nk;
  const int64_t key_dim = nk * dk, value_dim = nv * dv;
  const MixerColumns cols = Columns(c);
  const int64_t qkvz = 2 * key_dim + 2 * value_dim, ba = 2 * nv;
  const int64_t C = c.conv_channels(), W = c.conv_size;
  LINATTN_RETURN_IF_ERROR(r.Check(p + "in_proj_qkvz.weight", {qkvz, H}));
  LINATTN_RETURN_IF_ERROR(r.Check(p + "in_proj_ba.weight", {ba, H}));
  LINATTN_RETURN_IF_ERROR(r.Check(p + "conv1d.weight", {C, 1, W}));
  {
    // fix_query_key_value_ordering: per key head g, in_proj_qkvz's rows
    // are q_g (d_k) | k_g (d_k) | v_g (per·d_v) | z_g (per·d_v), and
    // in_proj_ba's b_g (per) | a_g (per); each part goes to its columns.
    AlignedBuffer w(int64_t{cols.width} * H);
    auto move = [&](const float* from, int64_t rows, int64_t to) {
      std::memcpy(w.data() + to * H, from, rows * H * sizeof(float));
    };
    {
      std::vector<float> m(qkvz * H);
      LINATTN_RETURN_IF_ERROR(
          r.Read(p + "in_proj_qkvz.weight", {qkvz, H}, m.data()));
      const int64_t block = 2 * dk + 2 * per * dv;
      for (int64_t g = 0; g < nk; ++g) {
        const float* at = m.data() + g * block * H;
        move(at, dk, cols.q + g * dk);
        move(at + dk * H, dk, cols.k + g * dk);
        move(at + 2 * dk * H, per * dv, cols.v + g * per * dv);
        move(at + (2 * dk + per * dv) * H, per * dv, cols.gate + g * per * dv);
      }
    }
    {
      std::vector<float> m(ba * H);
      LINATTN_RETURN_IF_ERROR(
          r.Read(p + "in_proj_ba.weight", {ba, H}, m.data()));
      for (int64_t g = 0; g < nk; ++g) {
        const float* at = m.data() + g * 2 * per * H;
        move(at, per, cols.beta + g * per);
        move(at + per * H, per, cols.a + g * per);
      }
    }
    LINATTN_ASSIGN_OR_RETURN(
        L.in_proj,
        PackedLinear::Create(w.data(), cols.width, H, false, weights));
  }
  L.conv = AlignedBuffer(W * C);
  LINATTN_RETURN_IF_ERROR(ReadConv(r, p + "conv1d.weight", C, W, 0, C, L.conv));
  LINATTN_RETURN_IF_ERROR(LoadDecay(r, c, p, L));
  // Qwen3NextRMSNormGated: weight × rmsnorm(o) × SiLU(z), its weight not
  // zero-centred.
  LINATTN_ASSIGN_OR_RETURN(L.head_norm, r.Vector(p + "norm.weight", dv));
  LINATTN_ASSIGN_OR_RETURN(AlignedBuffer o,
                           r.Matrix(p + "out_proj.weight", H, value_dim));
  LINATTN_ASSIGN_OR_RETURN(
      L.o, PackedLinear::Create(o.data(), H, value_dim, true, weights));
  return absl::OkStatus();
}

absl::Status Qwen3NextDef::CheckSizes(const ModelConfig& c) const {
  LINATTN_RETURN_IF_ERROR(RuleMixer::CheckSizes(c));
  // The in_proj's columns (q, k, v, a, β and z) and the attention's q_proj
  // (query and gate rows) are model dimensions too.
  if (uint64_t{Columns(c).width} > kMaxModelDim) {
    return ConfigFieldError(
        "linear_num_value_heads",
        absl::StrCat("gives an in_proj of ", Columns(c).width,
                     " columns, beyond linattn's limit ", kMaxModelDim));
  }
  for (const ModelConfig::SoftmaxAttention& a : c.attn) {
    if (2 * uint64_t{a.num_heads} * a.head_dim > kMaxModelDim) {
      return ConfigFieldError(
          "head_dim",
          absl::StrCat("gives a q_proj of ",
                       2 * uint64_t{a.num_heads} * a.head_dim,
                       " rows, beyond linattn's limit ", kMaxModelDim));
    }
  }
  return absl::OkStatus();
}

absl::Status Qwen3NextDef::ReadConfig(const json& j, ModelConfig& c) const {
  const uint32_t L = c.num_hidden_layers;
  LINATTN_RETURN_IF_ERROR(RefuseNulls(j, {"vocab_size",
                                          "hidden_size",
                                          "num_hidden_layers",
                                          "intermediate_size",
                                          "num_attention_heads",
                                          "num_key_value_heads",
                                          "head_dim",
                                          "rms_norm_eps",
                                          "rope_theta",
                                          "attention_bias",
                                          "tie_word_embeddings",
                                          "linear_num_key_heads",
                                          "linear_num_value_heads",
                                          "linear_key_head_dim",
                                          "linear_value_head_dim",
                                          "linear_conv_kernel_dim",
                                          "num_experts",
                                          "num_experts_per_tok",
                                          "moe_intermediate_size",
                                          "shared_expert_intermediate_size",
                                          "norm_topk_prob",
                                          "decoder_sparse_step"}));
  // The gated DeltaNet layers.
  if (auto s = Dim(j, "linear_num_key_heads", &c.num_heads, 16); !s.ok())
    return s;
  if (auto s = Dim(j, "linear_num_value_heads", &c.state_heads, 32); !s.ok())
    return s;
  LINATTN_RETURN_IF_ERROR(Divides("linear_num_value_heads", c.state_heads,
                                  c.num_heads, "linear_num_value_heads"));
  if (auto s = Dim(j, "linear_key_head_dim", &c.head_k, 128); !s.ok()) return s;
  if (auto s = Dim(j, "linear_value_head_dim", &c.head_v, 128); !s.ok())
    return s;
  if (auto s = Dim(j, "linear_conv_kernel_dim", &c.conv_size, 4); !s.ok())
    return s;
  c.num_kv_heads = c.num_heads;
  c.use_short_conv = true;
  c.silu_qk = c.silu_v = true;
  c.qk_l2norm = true;
  c.use_beta = true;
  c.output_gate = true;
  c.elementwise_affine = true;
  c.norm_weight_offset = 1;

  // Feed-forwards: the dense MLP's width, and the sparse blocks'.
  if (auto s = Dim(j, "intermediate_size", &c.intermediate_size, 5632); !s.ok())
    return s;
  LINATTN_RETURN_IF_ERROR(
      ReadExpertSizes(j,
                      {"num_experts", 512, "moe_intermediate_size", 512,
                       "num_experts_per_tok", 10},
                      c));
  if (c.num_experts > 0) {
    if (auto s =
            Dim(j, "shared_expert_intermediate_size", &c.expert_mlp_size, 512);
        !s.ok())
      return s;
    LINATTN_RETURN_IF_ERROR(Bool(j, "norm_topk_prob", &c.norm_topk_prob, true));
    c.router_softmax_all = true;
    c.shared_expert_gate = true;
    uint32_t step = 1;
    if (auto s = Dim(j, "decoder_sparse_step", &step, 1); !s.ok()) return s;
    std::set<int64_t> dense;
    if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
      if (!it->is_array()) {
        return ConfigFieldError("mlp_only_layers",
                                "must be a list of layer indices");
      }
      for (size_t i = 0; i < it->size(); ++i) {
        const json& v = (*it)[i];
        // transformers only asks whether a layer is listed: an index past
        // the last layer names none.
        if (!v.is_number_integer() || v.get<int64_t>() < 0) {
          return ConfigFieldError(
              absl::StrCat("mlp_only_layers[", i, "]"),
              absl::StrCat("must be a layer index ≥ 0, got ", v.dump()));
        }
        dense.insert(v.get<int64_t>());
      }
    }
    // Qwen3NextDecoderLayer: the sparse block unless the layer is listed,
    // in every decoder_sparse_step-th layer.
    c.expert_layers.assign(L, 0);
    for (uint32_t l = 0; l < L; ++l) {
      c.expert_layers[l] = !dense.count(l) && (l + 1) % step == 0;
    }
  }

  // layer_types, or every full_attention_interval-th layer full attention.
  c.attn_of_layer.assign(L, -1);
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != L) {
      return ConfigFieldError(
          "layer_types", absl::StrCat("must list num_hidden_layers = ", L,
                                      " layer types (\"linear_attention\" or "
                                      "\"full_attention\")"));
    }
    for (size_t l = 0; l < L; ++l) {
      // remap_legacy_layer_types: "attention" is full attention and
      // "mamba" a linear layer, as transformers reads them.
      const json& t = (*it)[l];
      if (t == "full_attention" || t == "attention") {
        c.attn_of_layer[l] = 0;
      } else if (t != "linear_attention" && t != "mamba") {
        return ConfigFieldError(
            absl::StrCat("layer_types[", l, "]"),
            absl::StrCat(t.dump(),
                         " is not \"linear_attention\" or \"full_attention\""));
      }
    }
  } else {
    uint32_t interval = 4;
    if (auto s = Dim(j, "full_attention_interval", &interval, 4); !s.ok())
      return s;
    for (uint32_t l = 0; l < L; ++l) {
      if ((l + 1) % interval == 0) c.attn_of_layer[l] = 0;
    }
  }
  if (!c.is_hybrid()) return absl::OkStatus();

  // The gated softmax attention.
  ModelConfig::SoftmaxAttention a;
  if (auto s = Dim(j, "num_attention_heads", &a.num_heads, 16); !s.ok())
    return s;
  if (auto s = Dim(j, "num_key_value_heads", &a.num_kv_heads, 2); !s.ok())
    return s;
  LINATTN_RETURN_IF_ERROR(Divides("num_key_value_heads", a.num_heads,
                                  a.num_kv_heads, "num_attention_heads"));
  if (auto s = Dim(j, "head_dim", &a.head_dim, 256); !s.ok()) return s;
  LINATTN_RETURN_IF_ERROR(Bool(j, "attention_bias", &a.qkv_bias, false));
  a.o_bias = a.qkv_bias;
  a.qk_norm = true;
  a.output_gate = true;
  a.rope = true;
  double factor = 0.25;
  LINATTN_RETURN_IF_ERROR(ReadRope(j, &a.rope_theta, &factor));
  // Qwen3NextRotaryEmbedding: int(head_dim × partial_rotary_factor)
  // channels, turned in halves.
  const auto rotated = static_cast<uint64_t>(a.head_dim * factor);
  if (rotated < 2 || rotated % 2 != 0) {
    return ConfigFieldError(
        "partial_rotary_factor",
        absl::StrCat("gives ", rotated, " rotary channels of head_dim ",
                     a.head_dim,
                     " (an even number ≥ 2 is needed: the "
                     "rotary turns halves)"));
  }
  a.rotary_dim = static_cast<uint32_t>(rotated);
  c.attn.push_back(a);
  return absl::OkStatus();
}

}  // namespace

const ModelTypeDef& Qwen3NextType() {
  static const Qwen3NextDef kDef;
  return kDef;
}

}  // namespace linattn
