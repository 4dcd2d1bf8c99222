// linear_attn: fla's LinearAttention (fla/layers/linear_attn.py) — q, k,
// v from one GEMM, the feature map φ (elu, relu, identity, or a learned
// t2r, hedgehog, dpfp or elementwise_product map) on q and k, an optional
// normalised read-out (÷ φ(q)ᵀz), a per-head RMSNorm and o_proj
// (docs/design.md §1, "Model types"). Reference: tools/linattn_ref.py's
// LinearAttention.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/attention/kernels.h"
#include "core/model/forward.h"
#include "core/model/model_types.h"
#include "core/model/row_ops.h"
#include "core/model/tensor_reader.h"
#include "core/onednn/gemm.h"
#include "core/util/parallel_for.h"
#include "core/util/row_view.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

// φ of one head's raw vector x (d_k) into out (d_φ); `lin` is the learned
// linear output for the maps that have one.
void ApplyFeatureMap(ModelFeatureMap map, const float* x, const float* lin,
                     uint32_t dk, float* out) {
  switch (map) {
    case ModelFeatureMap::kElu:  // F.elu(x) + 1, vectorised
      ActiveKernels().elu1(dk, x, out);
      break;
    case ModelFeatureMap::kRelu:
      for (uint32_t i = 0; i < dk; ++i) out[i] = std::max(x[i], 0.0f);
      break;
    case ModelFeatureMap::kIdentity:
      std::memcpy(out, x, dk * sizeof(float));
      break;
    case ModelFeatureMap::kT2R:
      for (uint32_t i = 0; i < dk; ++i) out[i] = std::max(lin[i], 0.0f);
      break;
    case ModelFeatureMap::kHedgehog: {
      // softmax over [2y, −2y]
      float m = 0;
      for (uint32_t i = 0; i < dk; ++i) m = std::max(m, std::fabs(2 * lin[i]));
      float sum = 0;
      for (uint32_t i = 0; i < dk; ++i) {
        out[i] = std::exp(2 * lin[i] - m);
        out[dk + i] = std::exp(-2 * lin[i] - m);
        sum += out[i] + out[dk + i];
      }
      const float inv = 1.0f / sum;
      for (uint32_t i = 0; i < 2 * dk; ++i) out[i] *= inv;
      break;
    }
    case ModelFeatureMap::kDpfp: {
      // fla's DPFPFeatureMap (fla/modules/feature_map.py): x2 = [r, −r] with
      // r = relu(x) — the negative of relu(x), not relu(−x) as in the DPFP
      // paper; fla's checkpoints are trained with fla's. torch.roll by j
      // gives x2[(i − j) mod n]; block b (j = b + 1) is x2 ⊙ roll(x2, j).
      const uint32_t n = 2 * dk;
      thread_local std::vector<float> x2;
      x2.resize(n);
      for (uint32_t i = 0; i < dk; ++i) {
        x2[i] = std::max(x[i], 0.0f);
        x2[dk + i] = -x2[i];
      }
      for (uint32_t b = 0; b < 4; ++b) {
        const uint32_t shift = (b + 1) % n;
        for (uint32_t i = 0; i < n; ++i) {
          out[b * n + i] = x2[i] * x2[(i + n - shift) % n];
        }
      }
      break;
    }
    case ModelFeatureMap::kElementwiseProduct:
      for (uint32_t i = 0; i < dk; ++i) out[i] = lin[i] * lin[dk + i];
      break;
  }
}

// φ(q)·d_φ^−½ and φ(k) into ws.fq, ws.fk and the values into ws.v, every
// key/value head repeated over its group.
absl::Status FeatureMaps(const ModelConfig& c, const Model::Layer& layer,
                         uint32_t rows, ForwardWorkspace& ws) {
  const uint32_t nh = c.num_heads, nkv = c.num_kv_heads, g = c.kv_groups();
  const uint32_t dk = c.head_k_dim(), dv = c.head_v_dim(),
                 dphi = c.feature_dim();
  const float scale = 1.0f / std::sqrt(static_cast<float>(dphi));
  const bool learned = c.feature_map_has_weights();
  const uint32_t lin_dim =
      c.feature_map == ModelFeatureMap::kElementwiseProduct ? 2 * dk : dk;
  // A row of qkv_ is [q heads | k heads | v heads], each head d_k (d_v)
  // wide; each part is viewed as rows of its heads, `stride` apart.
  const uint64_t stride = c.key_dim() + uint64_t{nkv} * (dk + dv);
  const uint64_t k_col = c.key_dim(), v_col = k_col + uint64_t{nkv} * dk;

  // which = 0: q (nh heads at column 0), 1: k (nkv heads after q).
  for (int which = 0; which < 2; ++which) {
    const uint32_t src_heads = which == 0 ? nh : nkv;
    const uint32_t expand = which == 0 ? 1 : g;
    const uint64_t col = which == 0 ? 0 : k_col;
    const bool normalize = which == 0 ? c.norm_q : c.norm_k;
    // Source heads: row r's head h at qkv_ row r, column col + h·d_k.
    const RowView<const float> src(ws.qkv.data() + col, rows,
                                   uint64_t{src_heads} * dk, stride);
    const RowView<float> dst(which == 0 ? ws.fq.data() : ws.fk.data(),
                             uint64_t{rows} * nh, dphi);  // (row, head)
    const RowView<float> heads(ws.heads.data(), uint64_t{rows} * src_heads, dk);
    const RowView<float> mapped(ws.mapped.data(), uint64_t{rows} * src_heads,
                                lin_dim);
    if (learned) {
      // (rows·heads × d_k) · Wᵀ as one GEMM, then bias.
      for (uint32_t r = 0; r < rows; ++r) {
        std::memcpy(heads.row(uint64_t{r} * src_heads), src.row(r),
                    uint64_t{src_heads} * dk * sizeof(float));
      }
      const AlignedBuffer& w = which == 0 ? layer.fq_w : layer.fk_w;
      const std::vector<float>& b = which == 0 ? layer.fq_b : layer.fk_b;
      LINATTN_RETURN_IF_ERROR(
          LinearGemm(heads.data(), int64_t{rows} * src_heads, dk, w.data(),
                     lin_dim, mapped.data(), false));
      if (!b.empty()) {
        for (uint64_t i = 0; i < mapped.rows(); ++i) {
          float* y = mapped.row(i);
          for (uint32_t j = 0; j < lin_dim; ++j) y[j] += b[j];
        }
      }
    }
    ParallelFor(
        rows, uint64_t{rows} * nh * dphi >= kParallelFloats, [&](uint64_t r) {
          for (uint32_t sh = 0; sh < src_heads; ++sh) {
            const float* x = src.row(r) + uint64_t{sh} * dk;
            const float* lin = mapped.row(uint64_t{r} * src_heads + sh);
            float* out = dst.row(uint64_t{r} * nh + uint64_t{sh} * expand);
            ApplyFeatureMap(c.feature_map, x, lin, dk, out);
            if (normalize) {
              float sum = 0;
              for (uint32_t i = 0; i < dphi; ++i) sum += out[i];
              const float inv = 1.0f / (sum + 1e-4f);
              for (uint32_t i = 0; i < dphi; ++i) out[i] *= inv;
            }
            if (which == 0) {
              for (uint32_t i = 0; i < dphi; ++i) out[i] *= scale;
            }
            for (uint32_t e = 1; e < expand; ++e) {
              std::memcpy(dst.row(uint64_t{r} * nh + uint64_t{sh} * expand + e),
                          out, dphi * sizeof(float));
            }
          }
        });
  }
  // v: query head h reads key/value head h / g.
  const RowView<const float> v_src(ws.qkv.data() + v_col, rows,
                                   uint64_t{nkv} * dv, stride);
  const BlockView<float> v(ws.v.data(), rows, nh, dv);
  for (uint32_t r = 0; r < rows; ++r) {
    for (uint32_t h = 0; h < nh; ++h) {
      std::memcpy(v.row(r, h), v_src.row(r) + uint64_t{h / g} * dv,
                  dv * sizeof(float));
    }
  }
  return absl::OkStatus();
}

class LinearAttnDef final : public ModelTypeDef {
 public:
  LinearAttnDef()
      : ModelTypeDef(ModelType::kLinearAttn, "linear_attn", "LinearAttention") {
  }

  absl::Status ReadConfig(const json& j, ModelConfig& c) const override;
  AttentionSpec Spec(const ModelConfig& c) const override;
  absl::Status LoadMixer(TensorReader& r, const ModelConfig& c,
                         const std::string& p, WeightType weights,
                         Model::Layer& L) const override;
  absl::Status RunMixer(ForwardRunner& runner,
                        const LayerPass& pass) const override;
};

absl::Status LinearAttnDef::ReadConfig(const json& j, ModelConfig& c) const {
  if (auto s = Dim(j, "num_heads", &c.num_heads, 4); !s.ok()) return s;
  if (auto s = Dim(j, "num_kv_heads", &c.num_kv_heads, c.num_heads); !s.ok())
    return s;
  for (const char* field : {"expand_k", "expand_v"}) {
    double* out = field[7] == 'k' ? &c.expand_k : &c.expand_v;
    if (auto s = Value(j, field, out); !s.ok()) return s;
    if (!(*out > 0) || !std::isfinite(*out)) {
      return ConfigFieldError(field, "must be > 0");
    }
    double dim = c.hidden_size * *out;
    if (dim != std::floor(dim) || dim < 1 || dim > kMaxModelDim) {
      return ConfigFieldError(
          field, absl::StrCat("hidden_size × ", field,
                              " must be a whole number ≥ 1, got ", dim));
    }
  }
  auto fm = Optional<std::string>(j, "feature_map");
  if (!fm.ok()) return fm.status();
  std::string fm_name = fm->value_or("elementwise_product");
  bool known = false;
  for (ModelFeatureMap m : {ModelFeatureMap::kElu, ModelFeatureMap::kRelu,
                            ModelFeatureMap::kIdentity, ModelFeatureMap::kT2R,
                            ModelFeatureMap::kHedgehog, ModelFeatureMap::kDpfp,
                            ModelFeatureMap::kElementwiseProduct}) {
    if (ModelFeatureMapName(m) == fm_name) {
      c.feature_map = m;
      known = true;
    }
  }
  if (!known) {
    return ConfigFieldError(
        "feature_map",
        absl::StrCat("'", fm_name,
                     "' is not supported (elu, relu, identity, "
                     "t2r, hedgehog, dpfp, elementwise_product)"));
  }
  for (auto [field, out] : {std::pair<const char*, bool*>{
                                "tie_feature_map_qk", &c.tie_feature_map_qk},
                            {"norm_q", &c.norm_q},
                            {"norm_k", &c.norm_k},
                            {"norm_feature_map", &c.norm_feature_map},
                            {"elementwise_affine", &c.elementwise_affine}}) {
    if (auto s = Value(j, field, out); !s.ok()) return s;
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return ConfigFieldError(
        "num_kv_heads", absl::StrCat("must divide num_heads = ", c.num_heads,
                                     ", got ", c.num_kv_heads));
  }
  if (c.key_dim() % c.num_heads != 0) {
    return ConfigFieldError("expand_k", absl::StrCat("key dim ", c.key_dim(),
                                                     " must be divisible by "
                                                     "num_heads = ",
                                                     c.num_heads));
  }
  if (c.value_dim() % c.num_heads != 0) {
    return ConfigFieldError("expand_v",
                            absl::StrCat("value dim ", c.value_dim(),
                                         " must be divisible by "
                                         "num_heads = ",
                                         c.num_heads));
  }
  c.state_heads = c.num_heads;
  return absl::OkStatus();
}

// Premapped features (φ applied by the model), d_φ = feature_dim(),
// normalised per norm_feature_map with fla's 1e-10 in the denominator.
AttentionSpec LinearAttnDef::Spec(const ModelConfig& c) const {
  AttentionSpec spec;
  spec.num_heads = c.num_heads;
  spec.key_dim = c.feature_dim();
  spec.value_dim = c.head_v_dim();
  spec.feature_map = FeatureMapKind::kIdentity;
  spec.premapped = true;
  spec.unnormalized = !c.norm_feature_map;
  spec.epsilon = c.norm_feature_map ? 1e-10f : 0.0f;
  return spec;
}

absl::Status LinearAttnDef::LoadMixer(TensorReader& r, const ModelConfig& c,
                                      const std::string& p, WeightType weights,
                                      Model::Layer& L) const {
  const int64_t H = c.hidden_size;
  const int64_t dk = c.head_k_dim(), dv = c.head_v_dim();
  const int64_t Dq = c.key_dim(), Dk = int64_t{c.num_kv_heads} * dk,
                Dv = int64_t{c.num_kv_heads} * dv;
  {
    LINATTN_ASSIGN_OR_RETURN(AlignedBuffer w,
                             r.Stacked({{p + "attn.q_proj.weight", Dq},
                                        {p + "attn.k_proj.weight", Dk},
                                        {p + "attn.v_proj.weight", Dv}},
                                       H));
    LINATTN_ASSIGN_OR_RETURN(
        L.qkv, PackedLinear::Create(w.data(), Dq + Dk + Dv, H, false, weights));
  }
  if (c.feature_map_has_weights()) {
    // Tied maps are one module in fla; its export may keep either name.
    const bool tied = c.tie_feature_map_qk;
    std::string fq = p + "attn.feature_map_q.";
    std::string fk = p + "attn.feature_map_k.";
    if (tied &&
        !r.Has(fq + (c.feature_map == ModelFeatureMap::kElementwiseProduct
                         ? "layer1.weight"
                         : "layer.weight"))) {
      fq = fk;
    }
    for (int which = 0; which < (tied ? 1 : 2); ++which) {
      const std::string& pre = which == 0 ? fq : fk;
      AlignedBuffer& w = which == 0 ? L.fq_w : L.fk_w;
      std::vector<float>& b = which == 0 ? L.fq_b : L.fk_b;
      switch (c.feature_map) {
        case ModelFeatureMap::kT2R: {
          LINATTN_ASSIGN_OR_RETURN(w, r.Matrix(pre + "layer.weight", dk, dk));
          break;
        }
        case ModelFeatureMap::kHedgehog: {
          LINATTN_ASSIGN_OR_RETURN(w, r.Matrix(pre + "layer.weight", dk, dk));
          LINATTN_ASSIGN_OR_RETURN(b, r.Vector(pre + "layer.bias", dk));
          break;
        }
        case ModelFeatureMap::kElementwiseProduct: {
          LINATTN_ASSIGN_OR_RETURN(w, r.Stacked({{pre + "layer1.weight", dk},
                                                 {pre + "layer2.weight", dk}},
                                                dk));
          LINATTN_ASSIGN_OR_RETURN(std::vector<float> b1,
                                   r.Vector(pre + "layer1.bias", dk));
          LINATTN_ASSIGN_OR_RETURN(std::vector<float> b2,
                                   r.Vector(pre + "layer2.bias", dk));
          b = b1;
          b.insert(b.end(), b2.begin(), b2.end());
          break;
        }
        default:
          break;
      }
    }
    if (tied) {
      L.fk_w = L.fq_w.Copy();
      L.fk_b = L.fq_b;
      // A file that kept both names of the one tied module: the other
      // copy is the same tensor.
      const std::string other = fq == fk ? p + "attn.feature_map_q." : fk;
      r.SkipPrefix(other);
    }
  }
  if (c.elementwise_affine) {
    LINATTN_ASSIGN_OR_RETURN(L.head_norm, r.Vector(p + "attn.norm.weight", dv));
  }
  {
    LINATTN_ASSIGN_OR_RETURN(
        AlignedBuffer w,
        r.Matrix(p + "attn.o_proj.weight", H, int64_t{c.value_dim()}));
    LINATTN_ASSIGN_OR_RETURN(
        L.o, PackedLinear::Create(w.data(), H, c.value_dim(), true, weights));
  }
  return absl::OkStatus();
}

// x += o_proj(headnorm(attention(φ(q), φ(k), v))) with (q|k|v) from
// rmsnorm(x): one-token rows through one StepBatch, longer pieces through
// one chunkwise prefill, each on its session's layer-l state.
absl::Status LinearAttnDef::RunMixer(ForwardRunner& runner,
                                     const LayerPass& pass) const {
  const Model& m = runner.model();
  ForwardWorkspace& ws = runner.workspace();
  const uint32_t rows = pass.rows;
  const size_t l = pass.layer;
  const ModelConfig& c = m.config();
  const Model::Layer& L = m.layers()[l];
  const uint32_t H = c.hidden_size, nh = c.num_heads, dv = c.head_v_dim();
  RmsNorm(ws.x.data(), rows, H, L.attn_norm.data(), c.norm_eps, ws.xn.data());
  LINATTN_RETURN_IF_ERROR(L.qkv->Apply(ws.xn.data(), rows, ws.qkv.data()));
  LINATTN_RETURN_IF_ERROR(FeatureMaps(c, L, rows, ws));
  LINATTN_RETURN_IF_ERROR(runner.RunAttention(pass, nullptr, nullptr));
  RmsNorm(ws.o.data(), uint64_t{rows} * nh, dv,
          L.head_norm.empty() ? nullptr : L.head_norm.data(), c.norm_eps,
          ws.o.data());
  return L.o->Apply(ws.o.data(), rows, ws.x.data());
}

}  // namespace

const ModelTypeDef& LinearAttnType() {
  static const LinearAttnDef kDef;
  return kDef;
}

}  // namespace linattn
