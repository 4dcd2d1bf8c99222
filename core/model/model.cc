#include "core/model/model.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/model/model_types.h"
#include "core/model/rwkv_world_tokenizer.h"
#include "core/model/safetensors.h"
#include "core/model/softmax_attention.h"
#include "core/model/tensor_reader.h"
#include "core/model/tokenizer_json/tokenizer_json.h"
#include "core/util/status_macros.h"

namespace linattn {
namespace {

// The tokenizer the directory names: UTF-8 bytes when config.json says so
// ("linattn_tokenizer": "bytes", over any tokenizer file beside it), else
// tokenizer.json (Hugging Face's, as transformers prefers it), else
// tokenizer.model (SentencePiece), else RWKV's World vocabulary
// (rwkv_vocab_v20230424.txt); a directory that names none is refused
// rather than given a tokenizer its model was not trained with.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelTokenizer(
    const std::string& dir, const ModelConfig& c) {
  if (c.byte_tokens) return NewByteTokenizer();
  const std::string json_path = dir + "/tokenizer.json";
  if (std::ifstream(json_path).good()) return LoadTokenizerJson(json_path);
  const std::string spm_path = dir + "/tokenizer.model";
  if (std::ifstream(spm_path).good()) {
    return LoadSentencePieceTokenizer(spm_path);
  }
  const std::string rwkv_path = absl::StrCat(dir, "/", kRwkvWorldVocabFile);
  if (std::ifstream(rwkv_path).good()) return LoadRwkvWorldTokenizer(rwkv_path);
  return absl::FailedPreconditionError(absl::StrCat(
      dir,
      ": names no tokenizer: linattn reads tokenizer.json, tokenizer.model "
      "or ",
      kRwkvWorldVocabFile,
      " beside config.json (a model whose tokens "
      "are UTF-8 bytes says \"linattn_tokenizer\": \"bytes\" in "
      "config.json)"));
}

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

}  // namespace

ModelState ModelState::Copy() const {
  ModelState out;
  out.layers_.reserve(layers_.size());
  for (const AttentionState& s : layers_) out.layers_.push_back(s.Copy());
  out.conv_ = conv_;
  out.kv_.reserve(kv_.size());
  for (const KvCache& kv : kv_) out.kv_.push_back(kv.Copy());
  return out;
}

uint64_t ModelState::kv_bytes() const {
  uint64_t total = 0;
  for (const KvCache& kv : kv_) total += kv.bytes();
  return total;
}

void ModelState::CopyFrom(const ModelState& other) {
  if (layers_.size() != other.layers_.size() ||
      conv_.size() != other.conv_.size() || kv_.size() != other.kv_.size()) {
    *this = other.Copy();
    return;
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    layers_[l].CopyFrom(other.layers_[l]);
  }
  for (size_t l = 0; l < conv_.size(); ++l) {
    conv_[l].assign(other.conv_[l].begin(), other.conv_[l].end());
  }
  // Keys and values: shared copy-on-write (kv_cache.h).
  for (size_t l = 0; l < kv_.size(); ++l) kv_[l] = other.kv_[l].Copy();
}

uint64_t ModelState::bytes() const {
  uint64_t total = 0;
  for (const AttentionState& s : layers_) total += s.bytes();
  for (const std::vector<float>& w : conv_) total += w.size() * sizeof(float);
  return total + kv_bytes();
}

MixerColumns MixerColumnsOf(const ModelConfig& c) {
  return ModelTypeOf(c.type).Columns(c);
}

std::string Model::fingerprint_hex() const {
  return absl::StrFormat("%016x", fingerprint_);
}

std::string Model::DefaultName(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  const size_t slash = d.rfind('/');
  return slash == std::string::npos ? d : d.substr(slash + 1);
}

ModelState Model::NewState() const {
  if (initial_state_ != nullptr) return initial_state_->Copy();
  ModelState state;
  state.layers_.reserve(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const ModelConfig::SoftmaxAttention* a = config_.attention_layer(i);
    state.layers_.push_back(a != nullptr ? position_only_->NewState()
                                         : attention_->NewState());
    if (config_.is_hybrid()) {
      state.kv_.push_back(a != nullptr
                              ? KvCache(a->num_kv_heads, a->head_dim, a->window)
                              : KvCache());
    }
  }
  if (const uint64_t w = conv_window_floats(); w > 0) {
    state.conv_.assign(layers_.size(), std::vector<float>(w, 0.0f));
  }
  return state;
}

std::vector<const PackedLinear*> Model::Projections() const {
  std::vector<const PackedLinear*> out;
  for (const Layer& layer : layers_) {
    for (const PackedLinear* p :
         {layer.qkv.get(), layer.in_proj.get(), layer.gk_up.get(),
          layer.o.get(), layer.gate_up.get(), layer.down.get()}) {
      if (p != nullptr) out.push_back(p);
    }
    if (layer.extras != nullptr) {
      for (const PackedLinear* p : layer.extras->Projections()) {
        out.push_back(p);
      }
    }
    if (layer.experts != nullptr) {
      out.push_back(layer.experts->router.get());
      for (size_t e = 0; e < layer.experts->gate_up.size(); ++e) {
        out.push_back(layer.experts->gate_up[e].get());
        out.push_back(layer.experts->down[e].get());
      }
    }
  }
  out.push_back(lm_head_.get());
  return out;
}

uint64_t Model::conv_window_floats() const {
  // rwkv7, rwkv6: the time mix's and the channel mix's token-shift rows.
  if (config_.is_rwkv()) return 2 * uint64_t{config_.hidden_size};
  const uint64_t channels = config_.conv_channels();
  return channels == 0 ? 0 : channels * (config_.conv_size - 1);
}

uint64_t Model::attention_state_bytes() const {
  uint64_t total = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    total += StateBytes(config_.attention_layer(l) != nullptr
                            ? position_only_->spec()
                            : attention_->spec());
  }
  return total;
}

uint64_t Model::kv_bytes_per_token() const {
  uint64_t total = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (const ModelConfig::SoftmaxAttention* a = config_.attention_layer(l)) {
      total += 2 * uint64_t{a->num_kv_heads} * a->head_dim * sizeof(float);
    }
  }
  return total;
}

uint64_t Model::kv_bytes_at(uint64_t position) const {
  if (!config_.is_hybrid()) return 0;
  uint64_t total = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (const ModelConfig::SoftmaxAttention* a = config_.attention_layer(l)) {
      const KvCache kv(a->num_kv_heads, a->head_dim, a->window);
      total += kv.BlocksFor(position) * kv.block_bytes();
    }
  }
  return total;
}

std::optional<uint64_t> Model::kv_bytes_max() const {
  for (size_t l = 0; l < layers_.size(); ++l) {
    const ModelConfig::SoftmaxAttention* a = config_.attention_layer(l);
    if (a != nullptr && a->window == 0) return std::nullopt;
  }
  return kv_bytes_at(~uint64_t{0});
}

uint64_t Model::working_copy_bytes() const {
  uint64_t total = state_bytes();
  for (size_t l = 0; l < layers_.size(); ++l) {
    if (const ModelConfig::SoftmaxAttention* a = config_.attention_layer(l)) {
      const KvCache kv(a->num_kv_heads, a->head_dim, a->window);
      // A ring's every block, or a growing cache's last one.
      total +=
          (a->window != 0 ? kv.BlocksFor(~uint64_t{0}) : 1) * kv.block_bytes();
    }
  }
  return total;
}

uint64_t Model::state_bytes() const {
  return attention_state_bytes() +
         layers_.size() * conv_window_floats() * sizeof(float);
}

bool Model::Matches(const ModelState& state) const {
  if (state.layers().size() != layers_.size()) return false;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const ModelConfig::SoftmaxAttention* a = config_.attention_layer(l);
    if (!state.layers()[l].Matches(a != nullptr ? position_only_->spec()
                                                : attention_->spec())) {
      return false;
    }
  }
  if (state.kv().size() != (config_.is_hybrid() ? layers_.size() : 0)) {
    return false;
  }
  for (size_t l = 0; l < state.kv().size(); ++l) {
    const ModelConfig::SoftmaxAttention* a = config_.attention_layer(l);
    const uint64_t row =
        a == nullptr ? 0 : uint64_t{a->num_kv_heads} * a->head_dim;
    if (state.kv()[l].row_floats() != row ||
        (a != nullptr && state.kv()[l].window() != a->window)) {
      return false;
    }
  }
  const uint64_t w = conv_window_floats();
  if (state.conv().size() != (w == 0 ? 0 : layers_.size())) return false;
  for (const std::vector<float>& window : state.conv()) {
    if (window.size() != w) return false;
  }
  return true;
}

absl::StatusOr<std::shared_ptr<const Model>> Model::Load(
    const std::string& dir, const std::string& name, WeightType weights,
    const std::string& initial_state) {
  try {
    return LoadChecked(dir, name, weights, initial_state);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        dir,
        ": allocating the model's weights failed (the machine has too "
        "little memory for the sizes its files give)"));
  }
}

absl::StatusOr<std::shared_ptr<const Model>> Model::LoadChecked(
    const std::string& dir, const std::string& name, WeightType weights,
    const std::string& initial_state) {
  if (absl::Status s = WeightTypeSupported(weights); !s.ok()) return s;
  std::shared_ptr<Model> model(new Model());
  model->dir_ = dir;
  model->name_ = name;
  model->weight_type_ = weights;
  if (model->name_.empty()) model->name_ = DefaultName(dir);
  LINATTN_ASSIGN_OR_RETURN(std::string config_text,
                           ReadFile(dir + "/config.json"));
  auto config = ParseModelConfig(config_text);
  if (!config.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, "/", config.status().message()));
  }
  const ModelConfig& c = *config;
  model->config_ = c;

  LINATTN_ASSIGN_OR_RETURN(model->tokenizer_, LoadModelTokenizer(dir, c));
  model->chat_template_ =
      std::make_unique<ChatTemplate>(ChatTemplate::ForModelDir(
          dir, &model->chat_template_note_,
          // RWKV's models (and the World tokenizer's) speak RWKV's convention.
          c.is_rwkv() || model->tokenizer_->kind() == "rwkv_world"
              ? ChatTemplate::Kind::kRwkv
              : ChatTemplate::Kind::kPlain));
  if (model->tokenizer_->size() > c.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, "/config.json: vocab_size: ", c.vocab_size,
                     " is smaller than the ", model->tokenizer_->kind(),
                     " tokenizer's ", model->tokenizer_->size(), " ids"));
  }

  const ModelTypeDef& type = ModelTypeOf(c.type);
  const AttentionSpec spec = type.Spec(c);
  auto attention = Attention::Create(spec);
  if (!attention.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, "/config.json: the attention it implies is not valid: ",
        attention.status().message()));
  }
  model->attention_ = std::make_unique<Attention>(std::move(*attention));
  if (c.is_hybrid()) {
    // One head of 1 × 1, unnormalised: a state that only keeps the position.
    AttentionSpec position_only{.num_heads = 1,
                                .key_dim = 1,
                                .value_dim = 1,
                                .feature_map = FeatureMapKind::kIdentity,
                                .unnormalized = true};
    model->position_only_ =
        std::make_unique<Attention>(*Attention::Create(position_only));
  }

  // One model.safetensors, or the shards its index names (transformers'
  // model.safetensors.index.json) when there is none.
  const std::string single = dir + "/model.safetensors",
                    index = dir + "/model.safetensors.index.json";
  // Decided by what is there (a single file that cannot be read is that
  // file's error, never a reason to read other weights).
  auto present = [](const std::string& path) {
    std::error_code ec;
    return std::filesystem::symlink_status(path, ec).type() !=
           std::filesystem::file_type::not_found;
  };
  if (!present(single) && !present(index)) {
    return absl::NotFoundError(absl::StrCat(
        dir,
        ": holds neither model.safetensors nor a sharded checkpoint's "
        "model.safetensors.index.json"));
  }
  LINATTN_ASSIGN_OR_RETURN(
      auto file, present(single) ? SafetensorsFile::Open(single)
                                 : SafetensorsFile::OpenSharded(index));
  TensorReader r(*file);
  const int64_t H = c.hidden_size, V = c.vocab_size;
  const ModelTypeDef::TensorNames names = type.names();
  LINATTN_ASSIGN_OR_RETURN(
      model->embeddings_,
      r.Matrix(names.embeddings.size() == 1
                   ? names.embeddings[0]
                   : Either(r, {names.embeddings[0], names.embeddings[1]}),
               V, H));
  // The file must hold the last layer before layers are set up for it.
  if (absl::Status s =
          r.Check(absl::StrCat(names.base, "layers.", c.num_hidden_layers - 1,
                               ".", names.input_norm),
                  {H});
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        dir, "/config.json: num_hidden_layers: ", c.num_hidden_layers,
        " does not match model.safetensors (", s.message(), ")"));
  }
  model->layers_.resize(c.num_hidden_layers);
  for (uint32_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat(names.base, "layers.", i, ".");
    Layer& L = model->layers_[i];
    LINATTN_ASSIGN_OR_RETURN(L.attn_norm, r.Vector(p + names.input_norm, H));
    if (const ModelConfig::SoftmaxAttention* a = c.attention_layer(i)) {
      LINATTN_RETURN_IF_ERROR(
          LoadSoftmaxAttention(r, c, *a, p + names.attention, weights, L));
      LINATTN_RETURN_IF_ERROR(type.LoadAttentionBlock(r, c, p, weights, L));
    } else {
      LINATTN_RETURN_IF_ERROR(type.LoadMixer(r, c, p, weights, L));
    }
    for (float& w : L.attn_norm) w += c.norm_weight_offset;
    if (!c.has_mlp()) continue;
    LINATTN_ASSIGN_OR_RETURN(L.mlp_norm, r.Vector(p + names.mlp_norm, H));
    for (float& w : L.mlp_norm) w += c.norm_weight_offset;
    const int64_t I = c.mlp_width(i);
    const bool experts = c.layer_has_experts(i);
    // A layer with experts may keep its MLP under its own names (qwen3_next's
    // shared expert).
    const bool own = experts && !names.expert_mlp_gate.empty();
    const std::string mlp_gate =
                          p + (own ? names.expert_mlp_gate : names.mlp_gate),
                      mlp_up = (own ? names.expert_mlp_up : names.mlp_up),
                      mlp_down =
                          p + (own ? names.expert_mlp_down : names.mlp_down);
    if (I == 0) {
      // A shared MLP of width 0 (granitemoehybrid's) adds nothing; an
      // export may keep its empty matrices.
      for (const auto& [tensor, shape] :
           {std::pair<std::string, std::vector<int64_t>>{mlp_gate, {0, H}},
            {mlp_down, {H, 0}}}) {
        if (r.Has(tensor)) LINATTN_RETURN_IF_ERROR(r.Check(tensor, shape));
        r.Skip(tensor);
      }
    } else {
      // Gate and up stacked, or one fused matrix of 2·I rows (gate first):
      // transformers' input_linear, and fla's gate_proj before February
      // 2025, with no up_proj.
      const std::string up = mlp_up.empty() ? "" : p + mlp_up;
      LINATTN_ASSIGN_OR_RETURN(AlignedBuffer w,
                               !up.empty() && r.Has(up)
                                   ? r.Stacked({{mlp_gate, I}, {up, I}}, H)
                                   : r.Matrix(mlp_gate, 2 * I, H));
      LINATTN_ASSIGN_OR_RETURN(
          L.gate_up, PackedLinear::Create(w.data(), 2 * I, H, false, weights));
      LINATTN_ASSIGN_OR_RETURN(AlignedBuffer down, r.Matrix(mlp_down, H, I));
      std::vector<float> no_bias;
      ScaleResidualBranch(c, down, no_bias);
      LINATTN_ASSIGN_OR_RETURN(
          L.down, PackedLinear::Create(down.data(), H, I, true, weights));
      if (experts && c.shared_expert_gate) {
        LINATTN_ASSIGN_OR_RETURN(AlignedBuffer g,
                                 r.Matrix(p + names.expert_mlp_out_gate, 1, H));
        L.mlp_out_gate.assign(g.data(), g.data() + H);
      }
    }
    if (experts) {
      auto loaded = std::make_unique<Experts>();
      LINATTN_RETURN_IF_ERROR(LoadExperts(
          r, c, p + names.experts, names.expert_names, weights, *loaded));
      L.experts = std::move(loaded);
    }
  }
  LINATTN_ASSIGN_OR_RETURN(model->final_norm_, r.Vector(names.final_norm, H));
  for (float& w : model->final_norm_) w += c.norm_weight_offset;
  if (!names.final_norm_bias.empty() && c.norm_bias) {
    LINATTN_ASSIGN_OR_RETURN(model->final_norm_bias_,
                             r.Vector(names.final_norm_bias, H));
  }
  if (c.logits_scaling != 1) {
    // logits_scaling divides the head's product (granitemoehybrid's):
    // lm_head(w ⊙ n) / s = lm_head((w / s) ⊙ n), folded into the final
    // norm's weight (a tied head stays the embeddings' matrix).
    const float inv = static_cast<float>(1 / c.logits_scaling);
    for (float& w : model->final_norm_) w *= inv;
    for (float& b : model->final_norm_bias_) b *= inv;
  }
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
  for (const ModelTypeDef::TensorNames::Ignored& ignored : names.ignored) {
    const size_t n = r.SkipPrefix(ignored.prefix);
    if (n == 0) continue;
    absl::StrAppend(&model->ignored_note_,
                    model->ignored_note_.empty() ? "" : "; ", n,
                    " tensors under '", ignored.prefix, "' (", ignored.what,
                    ", which linattn does not run) left unread");
  }
  if (absl::Status s = r.CheckAllUsed(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/", s.message()));
  }
  model->parameter_count_ = r.count();
  for (const PackedLinear* p : model->Projections()) {
    model->projection_bytes_ += p->weight_bytes();
  }

  Hasher hasher;
  hasher.Add(config_text);
  for (const auto& [tname, view] : file->tensors()) {
    hasher.Add(tname);
    hasher.Add(DTypeName(view.dtype));
    hasher.Add(view.shape.data(), view.shape.size() * sizeof(int64_t));
    hasher.Add(view.data, view.bytes);
  }
  if (!initial_state.empty()) {
    hasher.Add("initial state");
    LINATTN_RETURN_IF_ERROR(model->LoadInitialState(
        initial_state,
        [&](const std::string& tname, const void* data, size_t bytes) {
          hasher.Add(tname);
          hasher.Add(data, bytes);
        }));
  }
  model->fingerprint_ = hasher.Finish();
  return std::shared_ptr<const Model>(std::move(model));
}

absl::Status Model::LoadInitialState(
    const std::string& path,
    const std::function<void(const std::string&, const void*, size_t)>& hash) {
  const ModelConfig& c = config_;
  if (!c.is_rwkv()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path,
                     ": initial state files are RWKV-7's and RWKV-6's "
                     "(blocks.<i>.att.time_state); model '",
                     name_, "' is ", c.model_type));
  }
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) {
    return absl::Status(
        file.status().code(),
        absl::StrCat("initial state: ", file.status().message()));
  }
  TensorReader r(**file);
  ModelState state = NewState();
  const int64_t heads = c.state_heads, dk = c.head_k, dv = c.head_v;
  std::vector<float> t(heads * dv * dk);
  for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string tname = absl::StrCat("blocks.", l, ".att.time_state");
    absl::Status s = r.Check(tname, {heads, dv, dk});
    if (s.ok()) s = r.Read(tname, {heads, dv, dk}, t.data());
    if (!s.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", s.message(), " (an initial state of model '",
                       name_, "' holds ", c.num_hidden_layers,
                       " of these, each (", heads, ", ", dv, ", ", dk, "))"));
    }
    // RWKV keeps each head's S as value × key (RWKV-7's code, and RWKV-6's
    // state kernel, RWKV-v5/cuda/wkv6state_cuda.cu); linattn's is key ×
    // value.
    AttentionState& a = state.layers()[l];
    for (int64_t h = 0; h < heads; ++h) {
      float* sh = a.s(static_cast<uint32_t>(h));
      const float* th = t.data() + h * dv * dk;
      for (int64_t i = 0; i < dv; ++i) {
        for (int64_t j = 0; j < dk; ++j) sh[j * dv + i] = th[i * dk + j];
      }
    }
    a.MeasureMagnitude();  // the bound of what was written
  }
  if (absl::Status s = r.CheckAllUsed(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", s.message(),
        " (an initial state holds blocks.<i>.att.time_state alone)"));
  }
  for (const auto& [tname, view] : (*file)->tensors()) {
    hash(tname, view.data, view.bytes);
  }
  initial_state_ = std::make_unique<const ModelState>(std::move(state));
  initial_state_file_ = path;
  return absl::OkStatus();
}

std::string HybridSummary(const Model& model) {
  const ModelConfig& c = model.config();
  std::string out = "softmax attention in layers";
  const char* sep = " ";
  for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
    const ModelConfig::SoftmaxAttention* a = c.attention_layer(l);
    if (a == nullptr) continue;
    absl::StrAppend(&out, sep, l,
                    a->window != 0 ? absl::StrCat(" (window ", a->window, ")")
                                   : std::string(" (full)"));
    sep = ", ";
  }
  const std::optional<uint64_t> max = model.kv_bytes_max();
  absl::StrAppend(&out, "; keys and values ", model.kv_bytes_per_token(),
                  " bytes per position, ",
                  max ? absl::StrCat("at most ", *max, " (windows)")
                      : std::string("without bound (full attention)"));
  return out;
}

}  // namespace linattn
