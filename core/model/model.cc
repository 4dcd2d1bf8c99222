#include "core/model/model.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/model/safetensors.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be opened"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// A 64-bit FNV-1a style hash, eight bytes at a time (then a final mix).
class Hasher {
 public:
  void Add(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      Mix(w);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, p + i, n - i);
    Mix(tail ^ (uint64_t{n - i} << 56));
  }
  void Add(absl::string_view s) { Add(s.data(), s.size()); }
  uint64_t Finish() const {
    uint64_t h = h_;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
  }

 private:
  void Mix(uint64_t w) {
    h_ ^= w;
    h_ *= 0x100000001b3ULL;
    h_ ^= h_ >> 29;
  }
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

// Loads tensors by name, checks shapes, and records what was used. Every
// buffer is allocated only after the file has shown a tensor of its shape,
// so sizes in config.json cannot make the loader allocate more than the
// file holds.
class TensorReader {
 public:
  explicit TensorReader(const SafetensorsFile& file) : file_(file) {}

  absl::Status Check(const std::string& name,
                     const std::vector<int64_t>& shape) const {
    return file_.Get(name, shape).status();
  }
  absl::Status Read(const std::string& name, std::vector<int64_t> shape,
                    float* out) {
    LINATTN_ASSIGN_OR_RETURN(const TensorView* t, file_.Get(name, shape));
    t->ToFloat(out);
    used_.insert(name);
    if (!AllFinite(out, t->numel())) {
      return absl::InvalidArgumentError(
          absl::StrCat("model.safetensors: ", name, ": has NaN or Inf values"));
    }
    count_ += t->numel();
    return absl::OkStatus();
  }
  absl::StatusOr<std::vector<float>> Vector(const std::string& name,
                                            int64_t n) {
    LINATTN_RETURN_IF_ERROR(Check(name, {n}));
    std::vector<float> v(n);
    LINATTN_RETURN_IF_ERROR(Read(name, {n}, v.data()));
    return v;
  }
  absl::StatusOr<AlignedBuffer> Matrix(const std::string& name, int64_t rows,
                                       int64_t cols) {
    LINATTN_RETURN_IF_ERROR(Check(name, {rows, cols}));
    AlignedBuffer m(rows * cols);
    LINATTN_RETURN_IF_ERROR(Read(name, {rows, cols}, m.data()));
    return m;
  }
  // Rows of several (rows_i × cols) tensors stacked into one matrix.
  absl::StatusOr<AlignedBuffer> Stacked(
      const std::vector<std::pair<std::string, int64_t>>& parts, int64_t cols) {
    int64_t rows = 0;
    for (const auto& [name, r] : parts) {
      LINATTN_RETURN_IF_ERROR(Check(name, {r, cols}));
      rows += r;
    }
    AlignedBuffer m(rows * cols);
    float* at = m.data();
    for (const auto& [name, r] : parts) {
      LINATTN_RETURN_IF_ERROR(Read(name, {r, cols}, at));
      at += r * cols;
    }
    return m;
  }
  void Skip(const std::string& name) { used_.insert(name); }
  bool Has(const std::string& name) const {
    return file_.Find(name) != nullptr;
  }

  // Every tensor in the file must belong to the model.
  absl::Status CheckAllUsed() const {
    for (const auto& [name, view] : file_.tensors()) {
      if (!used_.count(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model.safetensors: unexpected tensor '", name,
            "' (not part of the model this config.json describes)"));
      }
    }
    return absl::OkStatus();
  }
  uint64_t count() const { return count_; }

 private:
  const SafetensorsFile& file_;
  std::set<std::string> used_;
  uint64_t count_ = 0;
};

// A depthwise Conv1d weight (channels, 1, W) into `conv` time-major
// (W × total): tap j of channel `first + c` at j·total + first + c.
absl::Status ReadConv(TensorReader& r, const std::string& name,
                      int64_t channels, int64_t width, int64_t first,
                      int64_t total, AlignedBuffer& conv) {
  LINATTN_RETURN_IF_ERROR(r.Check(name, {channels, 1, width}));
  std::vector<float> w(channels * width);
  LINATTN_RETURN_IF_ERROR(r.Read(name, {channels, 1, width}, w.data()));
  for (int64_t ch = 0; ch < channels; ++ch) {
    for (int64_t j = 0; j < width; ++j) {
      conv.data()[j * total + first + ch] = w[ch * width + j];
    }
  }
  return absl::OkStatus();
}

// The first of `names` the file holds (the newest spelling when none).
std::string Either(const TensorReader& r,
                   std::initializer_list<std::string> names) {
  for (const std::string& n : names) {
    if (r.Has(n)) return n;
  }
  return *names.begin();
}

// One gated or delta-rule mixer's weights (fla's names; `p` ends in
// "attn." or, for mamba2, "mixer."), packed per MixerColumnsOf.
absl::Status LoadMixer(TensorReader& r, const ModelConfig& c,
                       const std::string& p, WeightType weights,
                       Model::Layer& L) {
  const int64_t H = c.hidden_size, dv = c.head_v_dim();
  const MixerColumns cols = MixerColumnsOf(c);
  const int64_t C = c.conv_channels(), W = c.conv_size;
  const int64_t heads = c.state_heads;
  std::vector<std::pair<std::string, int64_t>> parts;
  if (c.type == ModelType::kMamba2) {
    parts.push_back({p + "in_proj.weight", cols.width});
  } else {
    parts.push_back({p + "q_proj.weight", c.q_width()});
    parts.push_back({p + "k_proj.weight", c.k_width()});
    parts.push_back({p + "v_proj.weight", c.v_width()});
    switch (c.type) {
      case ModelType::kGla:
        parts.push_back({p + "gk_proj.0.weight", kGlaGateRank});
        break;
      case ModelType::kDeltaNet:
        // b_proj was beta_proj in fla's first DeltaNet.
        if (c.use_beta) {
          parts.push_back(
              {Either(r, {p + "b_proj.weight", p + "beta_proj.weight"}),
               heads});
        }
        break;
      case ModelType::kGatedDeltaNet:
        parts.push_back({p + "a_proj.weight", heads});
        parts.push_back({p + "b_proj.weight", heads});
        break;
      default:
        break;
    }
    if (c.output_gate) parts.push_back({p + "g_proj.weight", c.value_dim()});
  }
  {
    LINATTN_ASSIGN_OR_RETURN(AlignedBuffer w, r.Stacked(parts, H));
    LINATTN_ASSIGN_OR_RETURN(
        L.in_proj,
        PackedLinear::Create(w.data(), cols.width, H, false, weights));
  }
  if (C > 0) {
    // Shapes first: the window's size comes from config.json alone.
    if (c.type == ModelType::kMamba2) {
      LINATTN_RETURN_IF_ERROR(r.Check(p + "conv1d.weight", {C, 1, W}));
    } else {
      LINATTN_RETURN_IF_ERROR(
          r.Check(p + "q_conv1d.weight", {c.q_width(), 1, W}));
      LINATTN_RETURN_IF_ERROR(
          r.Check(p + "k_conv1d.weight", {c.k_width(), 1, W}));
      LINATTN_RETURN_IF_ERROR(
          r.Check(p + "v_conv1d.weight", {c.v_width(), 1, W}));
    }
    L.conv = AlignedBuffer(W * C);
    if (c.type == ModelType::kMamba2) {
      LINATTN_RETURN_IF_ERROR(
          ReadConv(r, p + "conv1d.weight", C, W, 0, C, L.conv));
      if (c.use_conv_bias) {
        LINATTN_ASSIGN_OR_RETURN(L.conv_bias, r.Vector(p + "conv1d.bias", C));
      }
    } else {
      LINATTN_RETURN_IF_ERROR(ReadConv(r, p + "q_conv1d.weight", c.q_width(), W,
                                       cols.q, C, L.conv));
      LINATTN_RETURN_IF_ERROR(ReadConv(r, p + "k_conv1d.weight", c.k_width(), W,
                                       cols.k, C, L.conv));
      LINATTN_RETURN_IF_ERROR(ReadConv(r, p + "v_conv1d.weight", c.v_width(), W,
                                       cols.v, C, L.conv));
    }
  }
  switch (c.type) {
    case ModelType::kRetNet:
      // fla's retention computes log(1 − 2^(−5−h)) in fp32: from head 20
      // on, 1 − 2^(−5−h) rounds to 1 and the head does not decay.
      for (int64_t h = 0; h < heads; ++h) {
        const float gamma = 1.0f - std::exp2(static_cast<float>(-5 - h));
        L.log_decay.push_back(std::log(gamma));
      }
      break;
    case ModelType::kGla: {
      LINATTN_ASSIGN_OR_RETURN(
          AlignedBuffer up,
          r.Matrix(p + "gk_proj.1.weight", c.k_width(), kGlaGateRank));
      LINATTN_ASSIGN_OR_RETURN(
          L.gk_up, PackedLinear::Create(up.data(), c.k_width(), kGlaGateRank,
                                        false, WeightType::kF32));
      LINATTN_ASSIGN_OR_RETURN(L.gk_bias,
                               r.Vector(p + "gk_proj.1.bias", c.k_width()));
      break;
    }
    case ModelType::kGatedDeltaNet:
    case ModelType::kMamba2: {
      LINATTN_ASSIGN_OR_RETURN(std::vector<float> a_log,
                               r.Vector(p + "A_log", heads));
      for (float a : a_log) L.neg_exp_a.push_back(-std::exp(a));
      LINATTN_ASSIGN_OR_RETURN(L.dt_bias, r.Vector(p + "dt_bias", heads));
      // GatedDeltaNet checkpoints before March 2025 carry an unused D.
      if (c.type == ModelType::kGatedDeltaNet) r.Skip(p + "D");
      break;
    }
    default:
      break;
  }
  if (c.type == ModelType::kMamba2) {
    if (c.use_bias) {
      LINATTN_ASSIGN_OR_RETURN(L.in_bias,
                               r.Vector(p + "in_proj.bias", cols.width));
      LINATTN_ASSIGN_OR_RETURN(L.out_bias, r.Vector(p + "out_proj.bias", H));
    }
    LINATTN_ASSIGN_OR_RETURN(
        L.d_skip,
        r.Vector(p + "D", c.d_has_hdim ? c.intermediate_size : heads));
    if (c.rmsnorm) {
      LINATTN_ASSIGN_OR_RETURN(
          L.head_norm, r.Vector(p + "norm.weight", c.intermediate_size));
    }
  } else if (c.elementwise_affine) {
    // RetNet/GLA: g_norm_swish_gate (fused norm and gate) or g_norm;
    // DeltaNet: o_norm (norm in its first release); Gated DeltaNet: o_norm.
    std::string name;
    if (c.type == ModelType::kRetNet || c.type == ModelType::kGla) {
      name = p +
             (c.fused_gate_norm ? "g_norm_swish_gate.weight" : "g_norm.weight");
    } else {
      name = Either(r, {p + "o_norm.weight", p + "norm.weight"});
    }
    LINATTN_ASSIGN_OR_RETURN(L.head_norm, r.Vector(name, dv));
  }
  LINATTN_ASSIGN_OR_RETURN(
      AlignedBuffer w,
      r.Matrix(p + (c.type == ModelType::kMamba2 ? "out_proj.weight"
                                                 : "o_proj.weight"),
               H, int64_t{c.value_dim()}));
  LINATTN_ASSIGN_OR_RETURN(
      L.o, PackedLinear::Create(w.data(), H, c.value_dim(), true, weights));
  return absl::OkStatus();
}

// The state update and read-out every layer of a gated or delta-rule model
// runs (docs/design.md §1): RetNet, GLA and Mamba-2 the gated rule (a
// scalar decay per head, or GLA's per key channel), DeltaNet the delta
// rule, Gated DeltaNet both; q scaled by d_k^−½ (Mamba-2: C unscaled).
AttentionSpec MixerSpec(const ModelConfig& c) {
  AttentionSpec spec;
  switch (c.type) {
    case ModelType::kDeltaNet:
      spec.rule = UpdateRule::kDelta;
      break;
    case ModelType::kGatedDeltaNet:
      spec.rule = UpdateRule::kGatedDelta;
      break;
    default:
      spec.rule = UpdateRule::kGated;
      break;
  }
  spec.gate = c.type == ModelType::kGla ? GateShape::kKey : GateShape::kHead;
  spec.num_heads = c.state_heads;
  spec.key_dim = c.head_k;
  spec.value_dim = c.head_v;
  spec.feature_map = FeatureMapKind::kIdentity;
  spec.unnormalized = true;
  spec.qk_l2norm = c.qk_l2norm;
  if (c.type != ModelType::kMamba2) {
    spec.scale =
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_k)));
  }
  return spec;
}

}  // namespace

ModelState ModelState::Copy() const {
  ModelState out;
  out.layers_.reserve(layers_.size());
  for (const AttentionState& s : layers_) out.layers_.push_back(s.Copy());
  out.conv_ = conv_;
  return out;
}

void ModelState::CopyFrom(const ModelState& other) {
  if (layers_.size() != other.layers_.size() ||
      conv_.size() != other.conv_.size()) {
    *this = other.Copy();
    return;
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    layers_[l].CopyFrom(other.layers_[l]);
  }
  for (size_t l = 0; l < conv_.size(); ++l) {
    conv_[l].assign(other.conv_[l].begin(), other.conv_[l].end());
  }
}

uint64_t ModelState::bytes() const {
  uint64_t total = 0;
  for (const AttentionState& s : layers_) total += s.bytes();
  for (const std::vector<float>& w : conv_) total += w.size() * sizeof(float);
  return total;
}

MixerColumns MixerColumnsOf(const ModelConfig& c) {
  MixerColumns m;
  if (c.type == ModelType::kMamba2) {
    const uint32_t I = c.intermediate_size, GN = c.n_groups * c.state_size;
    m.gate = 0;
    m.conv = m.v = I;
    m.k = 2 * I;
    m.q = 2 * I + GN;
    m.a = 2 * I + 2 * GN;
    m.width = m.a + c.num_heads;
    return m;
  }
  m.q = 0;
  m.k = c.q_width();
  m.v = m.k + c.k_width();
  uint32_t at = m.v + c.v_width();
  switch (c.type) {
    case ModelType::kGla:
      m.gk = at;
      at += kGlaGateRank;
      break;
    case ModelType::kDeltaNet:
      if (c.use_beta) {
        m.beta = at;
        at += c.state_heads;
      }
      break;
    case ModelType::kGatedDeltaNet:
      m.a = at;
      m.beta = at + c.state_heads;
      at += 2 * c.state_heads;
      break;
    default:
      break;
  }
  if (c.output_gate) {
    m.gate = at;
    at += c.value_dim();
  }
  m.width = at;
  return m;
}

std::string Model::fingerprint_hex() const {
  return absl::StrFormat("%016x", fingerprint_);
}

ModelState Model::NewState() const {
  ModelState state;
  state.layers_.reserve(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    state.layers_.push_back(attention_->NewState());
  }
  if (const uint64_t w = conv_window_floats(); w > 0) {
    state.conv_.assign(layers_.size(), std::vector<float>(w, 0.0f));
  }
  return state;
}

uint64_t Model::conv_window_floats() const {
  const uint64_t channels = config_.conv_channels();
  return channels == 0 ? 0 : channels * (config_.conv_size - 1);
}

uint64_t Model::attention_state_bytes() const {
  return layers_.size() * StateBytes(attention_->spec());
}

uint64_t Model::state_bytes() const {
  return attention_state_bytes() +
         layers_.size() * conv_window_floats() * sizeof(float);
}

bool Model::Matches(const ModelState& state) const {
  if (state.layers().size() != layers_.size()) return false;
  for (const AttentionState& s : state.layers()) {
    if (!s.Matches(attention_->spec())) return false;
  }
  const uint64_t w = conv_window_floats();
  if (state.conv().size() != (w == 0 ? 0 : layers_.size())) return false;
  for (const std::vector<float>& window : state.conv()) {
    if (window.size() != w) return false;
  }
  return true;
}

absl::StatusOr<std::shared_ptr<const Model>> Model::Load(
    const std::string& dir, const std::string& name, WeightType weights) {
  try {
    return LoadChecked(dir, name, weights);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        dir,
        ": allocating the model's weights failed (the machine has too "
        "little memory for the sizes its files give)"));
  }
}

absl::StatusOr<std::shared_ptr<const Model>> Model::LoadChecked(
    const std::string& dir, const std::string& name, WeightType weights) {
  if (absl::Status s = WeightTypeSupported(weights); !s.ok()) return s;
  std::shared_ptr<Model> model(new Model());
  model->dir_ = dir;
  model->name_ = name;
  model->weight_type_ = weights;
  if (model->name_.empty()) {
    std::string d = dir;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    size_t slash = d.rfind('/');
    model->name_ = slash == std::string::npos ? d : d.substr(slash + 1);
  }
  LINATTN_ASSIGN_OR_RETURN(std::string config_text,
                           ReadFile(dir + "/config.json"));
  auto config = ParseModelConfig(config_text);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, "/", config.status().message()));
  }
  const ModelConfig& c = *config;
  model->config_ = c;

  // Tokenizer: SentencePiece when tokenizer.model is there, else bytes.
  const std::string spm_path = dir + "/tokenizer.model";
  if (std::ifstream(spm_path).good()) {
    LINATTN_ASSIGN_OR_RETURN(model->tokenizer_,
                             LoadSentencePieceTokenizer(spm_path));
  } else {
    model->tokenizer_ = NewByteTokenizer();
  }
  if (model->tokenizer_->size() > c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, "/config.json: vocab_size: ", c.vocab_size,
                     " is smaller than the ", model->tokenizer_->kind(),
                     " tokenizer's ", model->tokenizer_->size(), " ids"));
  }

  AttentionSpec spec;
  if (c.is_linear_attn()) {
    spec.num_heads = c.num_heads;
    spec.key_dim = c.feature_dim();
    spec.value_dim = c.head_v_dim();
    spec.feature_map = FeatureMapKind::kIdentity;
    spec.premapped = true;
    spec.unnormalized = !c.norm_feature_map;
    spec.epsilon = c.norm_feature_map ? 1e-10f : 0.0f;
  } else {
    spec = MixerSpec(c);
  }
  auto attention = Attention::Create(spec);
  if (!attention.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, "/config.json: the attention it implies is not valid: ",
        attention.status().message()));
  }
  model->attention_ = std::make_unique<Attention>(std::move(*attention));

  LINATTN_ASSIGN_OR_RETURN(auto file,
                           SafetensorsFile::Open(dir + "/model.safetensors"));
  TensorReader r(*file);
  const int64_t H = c.hidden_size, V = c.vocab_size, I = c.intermediate_size;
  const int64_t dk = c.head_k_dim(), dv = c.head_v_dim();
  const int64_t Dq = c.key_dim(), Dk = int64_t{c.num_kv_heads} * dk,
                Dv = int64_t{c.num_kv_heads} * dv;
  // fla's Mamba2 is `backbone.*` (mamba_ssm's checkpoints say
  // `backbone.embedding`), the others `model.*`.
  const bool mamba = c.type == ModelType::kMamba2;
  const std::string base = mamba ? "backbone." : "model.";
  const std::string input_norm = mamba ? "norm.weight" : "attn_norm.weight";
  LINATTN_ASSIGN_OR_RETURN(
      model->embeddings_,
      r.Matrix(mamba ? Either(r, {"backbone.embeddings.weight",
                                  "backbone.embedding.weight"})
                     : "model.embeddings.weight",
               V, H));
  // The file must hold the last layer before layers are set up for it.
  if (absl::Status s =
          r.Check(absl::StrCat(base, "layers.", c.num_hidden_layers - 1, ".",
                               input_norm),
                  {H});
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, "/config.json: num_hidden_layers: ", c.num_hidden_layers,
        " does not match model.safetensors (", s.message(), ")"));
  }
  model->layers_.resize(c.num_hidden_layers);
  for (uint32_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat(base, "layers.", i, ".");
    Layer& L = model->layers_[i];
    LINATTN_ASSIGN_OR_RETURN(L.attn_norm, r.Vector(p + input_norm, H));
    if (!c.is_linear_attn()) {
      LINATTN_RETURN_IF_ERROR(
          LoadMixer(r, c, p + (mamba ? "mixer." : "attn."), weights, L));
    } else {
      {
        LINATTN_ASSIGN_OR_RETURN(AlignedBuffer w,
                                 r.Stacked({{p + "attn.q_proj.weight", Dq},
                                            {p + "attn.k_proj.weight", Dk},
                                            {p + "attn.v_proj.weight", Dv}},
                                           H));
        LINATTN_ASSIGN_OR_RETURN(
            L.qkv,
            PackedLinear::Create(w.data(), Dq + Dk + Dv, H, false, weights));
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
              LINATTN_ASSIGN_OR_RETURN(w,
                                       r.Matrix(pre + "layer.weight", dk, dk));
              break;
            }
            case ModelFeatureMap::kHedgehog: {
              LINATTN_ASSIGN_OR_RETURN(w,
                                       r.Matrix(pre + "layer.weight", dk, dk));
              LINATTN_ASSIGN_OR_RETURN(b, r.Vector(pre + "layer.bias", dk));
              break;
            }
            case ModelFeatureMap::kElementwiseProduct: {
              LINATTN_ASSIGN_OR_RETURN(w,
                                       r.Stacked({{pre + "layer1.weight", dk},
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
          for (const auto& [tname, view] : file->tensors()) {
            if (tname.rfind(other, 0) == 0) r.Skip(tname);
          }
        }
      }
      if (c.elementwise_affine) {
        LINATTN_ASSIGN_OR_RETURN(L.head_norm,
                                 r.Vector(p + "attn.norm.weight", dv));
      }
      {
        LINATTN_ASSIGN_OR_RETURN(
            AlignedBuffer w,
            r.Matrix(p + "attn.o_proj.weight", H, int64_t{c.value_dim()}));
        LINATTN_ASSIGN_OR_RETURN(
            L.o,
            PackedLinear::Create(w.data(), H, c.value_dim(), true, weights));
      }
    }
    if (!c.has_mlp()) continue;
    LINATTN_ASSIGN_OR_RETURN(L.mlp_norm, r.Vector(p + "mlp_norm.weight", H));
    {
      // Before February 2025 fla's MLP kept gate and up as one fused
      // gate_proj of 2·I rows (gate first), with no up_proj.
      const std::string gate = p + "mlp.gate_proj.weight",
                        up = p + "mlp.up_proj.weight";
      LINATTN_ASSIGN_OR_RETURN(AlignedBuffer w,
                               r.Has(up) ? r.Stacked({{gate, I}, {up, I}}, H)
                                         : r.Matrix(gate, 2 * I, H));
      LINATTN_ASSIGN_OR_RETURN(
          L.gate_up, PackedLinear::Create(w.data(), 2 * I, H, false, weights));
    }
    {
      LINATTN_ASSIGN_OR_RETURN(AlignedBuffer w,
                               r.Matrix(p + "mlp.down_proj.weight", H, I));
      LINATTN_ASSIGN_OR_RETURN(
          L.down, PackedLinear::Create(w.data(), H, I, true, weights));
    }
  }
  LINATTN_ASSIGN_OR_RETURN(
      model->final_norm_,
      r.Vector(mamba ? "backbone.norm_f.weight" : "model.norm.weight", H));
  if (c.tie_word_embeddings) {
    r.Skip("lm_head.weight");  // some exports keep the tied copy
    LINATTN_ASSIGN_OR_RETURN(
        model->lm_head_,
        PackedLinear::Create(model->embeddings_.data(), V, H, false, weights));
  } else {
    LINATTN_ASSIGN_OR_RETURN(AlignedBuffer w, r.Matrix("lm_head.weight", V, H));
    LINATTN_ASSIGN_OR_RETURN(
        model->lm_head_, PackedLinear::Create(w.data(), V, H, false, weights));
  }
  if (absl::Status s = r.CheckAllUsed(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/", s.message()));
  }
  model->parameter_count_ = r.count();

  Hasher hasher;
  hasher.Add(config_text);
  for (const auto& [tname, view] : file->tensors()) {
    hasher.Add(tname);
    hasher.Add(DTypeName(view.dtype));
    hasher.Add(view.shape.data(), view.shape.size() * sizeof(int64_t));
    hasher.Add(view.data, view.bytes);
  }
  model->fingerprint_ = hasher.Finish();
  return std::shared_ptr<const Model>(std::move(model));
}

}  // namespace linattn
