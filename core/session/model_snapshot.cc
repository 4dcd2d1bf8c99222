// Model sessions' snapshots (core/session/snapshot.h): the model's name
// and fingerprint, every layer's state, the pending token, the random
// stream, the short convolutions' windows, and a hybrid's keys and values.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/session/snapshot.h"
#include "core/session/snapshot_container.h"
#include "core/util/status_macros.h"

namespace linattn {

using namespace snapshot_internal;  // NOLINT: the container's parts

namespace {

uint64_t ModelSectionBytes(const Model& model) {
  return 8 + 4 + model.name().size() + 4;
}

// CONV: the layers' windows, one per layer (models that have
// them; required, so a reader that does not know it refuses the blob).
uint64_t ConvSectionBytes(const Model& model) {
  const uint64_t w = model.conv_window_floats();
  return w == 0 ? 0
                : 4 + uint64_t{model.config().num_hidden_layers} *
                          (8 + w * sizeof(float));
}

// The keys and values a layer's cache holds at `position`: its first
// position and how many.
struct HeldRows {
  uint64_t first = 0, count = 0;
};
HeldRows Held(const KvCache& cache, uint64_t position) {
  const uint64_t first = cache.FirstHeld(position);
  return {first, position - first};
}

// KVCA at `position` (hybrids; 0 for other models).
uint64_t KvSectionBytes(const Model& model, uint64_t position) {
  const ModelConfig& c = model.config();
  uint64_t bytes = 0;
  for (uint32_t l = 0; l < c.num_hidden_layers; ++l) {
    const ModelConfig::SoftmaxAttention* a = c.attention_layer(l);
    if (a == nullptr) continue;
    const KvCache shape(a->num_kv_heads, a->head_dim, a->window);  // no block
    bytes +=
        4 + 8 + 8 +
        2 * Held(shape, position).count * shape.row_floats() * sizeof(float);
  }
  return bytes;
}

}  // namespace

uint64_t ModelSnapshotBytesAt(const Model& model, uint64_t position) {
  const uint64_t conv = ConvSectionBytes(model);
  const uint64_t kv = KvSectionBytes(model, position);
  return ContainerBytes(3 + (conv > 0 ? 1 : 0) + (kv > 0 ? 1 : 0),
                        ModelSectionBytes(model) +
                            StateSectionBytes(model.config().num_hidden_layers,
                                              model.attention_state_bytes()) +
                            kSamplerSectionBytes + conv + kv);
}

uint64_t ModelSnapshotBytes(const Model& model) {
  return ModelSnapshotBytesAt(model, 0);
}

std::string SerializeModelSnapshot(const Model& model, const ModelState& state,
                                   std::optional<int32_t> pending,
                                   const SamplerPosition& sampler) {
  // SMPL is optional: a reader that does not know it restores the context
  // and starts random streams afresh.
  std::vector<SnapshotWriter::Section> sections = {
      {kModelTag, ModelSectionBytes(model)},
      {kStateTag,
       StateSectionBytes(state.layers().size(), model.attention_state_bytes())},
      {kSamplerTag, kSamplerSectionBytes, /*required=*/false}};
  if (const uint64_t conv = ConvSectionBytes(model); conv > 0) {
    sections.push_back({kConvTag, conv});
  }
  const uint64_t kv = KvSectionBytes(model, state.position());
  if (kv > 0) sections.push_back({kKvTag, kv});
  SnapshotWriter w(SnapshotKind::kModelSession, sections);
  w.Put<uint64_t>(model.fingerprint());
  w.Put<uint32_t>(static_cast<uint32_t>(model.name().size()));
  w.PutBytes(model.name().data(), model.name().size());
  w.Put<int32_t>(pending.value_or(-1));
  w.Put<uint32_t>(static_cast<uint32_t>(state.layers().size()));
  for (const AttentionState& layer : state.layers()) w.PutState(layer);
  w.Put<uint64_t>(sampler.seed);
  w.Put<uint64_t>(sampler.draws);
  w.Put<uint8_t>(sampler.set ? 1 : 0);
  if (!state.conv().empty()) {
    w.Put<uint32_t>(static_cast<uint32_t>(state.conv().size()));
    for (const std::vector<float>& window : state.conv()) {
      w.Put<uint64_t>(window.size());
      w.PutBytes(window.data(), window.size() * sizeof(float));
    }
  }
  if (kv > 0) {
    for (size_t l = 0; l < state.kv().size(); ++l) {
      const KvCache& cache = state.kv()[l];
      if (cache.row_floats() == 0) continue;
      const HeldRows held = Held(cache, state.position());
      w.Put<uint32_t>(static_cast<uint32_t>(l));
      w.Put<uint64_t>(held.first);
      w.Put<uint64_t>(held.count);
      const uint64_t row = cache.row_floats() * sizeof(float);
      for (uint64_t p = held.first; p < state.position(); ++p) {
        w.PutBytes(cache.key(p), row);
      }
      for (uint64_t p = held.first; p < state.position(); ++p) {
        w.PutBytes(cache.value(p), row);
      }
    }
  }
  return w.Finish();
}

namespace {

// The CONV section into `state`'s windows: present exactly when the model
// has windows, of their size, and finite (they are inputs the model saw).
absl::Status ReadConvWindows(std::optional<absl::string_view> conv,
                             const Model& model, ModelState& state) {
  if (state.conv().empty()) {
    if (conv.has_value()) {
      return Malformed(
          "holds layer windows (convolution inputs or token-shift rows); the "
          "model has none");
    }
    return absl::OkStatus();
  }
  if (!conv.has_value()) {
    return Malformed(
        "has no layer windows (convolution inputs or token-shift rows); the "
        "model needs them");
  }
  if (conv->size() != ConvSectionBytes(model)) {
    return Malformed(absl::StrCat("holds ", conv->size(),
                                  " bytes of layer windows; the model "
                                  "needs ",
                                  ConvSectionBytes(model)));
  }
  SectionReader r(*conv, "CONV");
  uint32_t count = 0;
  LINATTN_RETURN_IF_ERROR(r.Get(&count, "window count"));
  if (count != state.conv().size()) {
    return Malformed(absl::StrCat("holds ", count, " layer windows; ",
                                  state.conv().size(), " expected"));
  }
  for (std::vector<float>& window : state.conv()) {
    uint64_t floats = 0;
    LINATTN_RETURN_IF_ERROR(r.Get(&floats, "window floats"));
    if (floats != window.size()) {
      return Malformed(absl::StrCat("holds a layer window of ", floats,
                                    " floats; the model needs ",
                                    window.size()));
    }
    LINATTN_ASSIGN_OR_RETURN(absl::string_view bytes,
                             r.Bytes(floats * sizeof(float), "window"));
    std::memcpy(window.data(), bytes.data(), bytes.size());
    if (!AllFinite(window.data(), window.size())) {
      return Malformed("holds a layer window that is not finite");
    }
  }
  return r.Done();
}

// The KVCA section into `state`'s caches, the state at its position
// already: present exactly when the model is a hybrid, every
// softmax-attention layer with exactly the positions its cache holds there
// (the section's size is checked against them before any block is
// allocated), every key and value finite.
absl::Status ReadKvCaches(std::optional<absl::string_view> section,
                          const Model& model, ModelState& state) {
  if (!model.config().is_hybrid()) {
    if (section.has_value()) {
      return Malformed(
          "holds keys and values; the model has no "
          "softmax-attention layers");
    }
    return absl::OkStatus();
  }
  if (!section.has_value()) {
    return Malformed(
        "has no keys and values; the model has softmax-attention layers");
  }
  const uint64_t position = state.position();
  // Each layer's rows are at most the section's bytes: bounded before the
  // size below is computed, so it cannot wrap around.
  for (const KvCache& cache : state.kv()) {
    if (cache.row_floats() != 0 &&
        Held(cache, position).count >
            section->size() / (2 * cache.row_floats() * sizeof(float))) {
      return Malformed(absl::StrCat(
          "holds ", section->size(),
          " bytes of keys and values, fewer than a session at position ",
          position, " has"));
    }
  }
  if (section->size() != KvSectionBytes(model, position)) {
    return Malformed(absl::StrCat("holds ", section->size(),
                                  " bytes of keys and values; a session at "
                                  "position ",
                                  position, " has ",
                                  KvSectionBytes(model, position)));
  }
  SectionReader r(*section, "KVCA");
  for (size_t l = 0; l < state.kv().size(); ++l) {
    KvCache& cache = state.kv()[l];
    if (cache.row_floats() == 0) continue;
    const HeldRows held = Held(cache, position);
    uint32_t index = 0;
    uint64_t first = 0, count = 0;
    LINATTN_RETURN_IF_ERROR(r.Get(&index, "layer"));
    LINATTN_RETURN_IF_ERROR(r.Get(&first, "first position"));
    LINATTN_RETURN_IF_ERROR(r.Get(&count, "positions"));
    if (index != l || first != held.first || count != held.count) {
      return Malformed(absl::StrCat(
          "holds keys and values of layer ", index, " at positions [", first,
          ", ", first + count, "); layer ", l, " at position ", position,
          " holds [", held.first, ", ", position, ")"));
    }
    const uint64_t bytes = cache.row_floats() * sizeof(float);
    LINATTN_ASSIGN_OR_RETURN(absl::string_view keys,
                             r.Bytes(count * bytes, "keys"));
    LINATTN_ASSIGN_OR_RETURN(absl::string_view values,
                             r.Bytes(count * bytes, "values"));
    if (!AllFinite(reinterpret_cast<const float*>(keys.data()),
                   count * cache.row_floats()) ||
        !AllFinite(reinterpret_cast<const float*>(values.data()),
                   count * cache.row_floats())) {
      return Malformed(absl::StrCat("holds keys or values of layer ", l,
                                    " that are not "
                                    "finite"));
    }
    cache.Reserve(position);
    std::vector<float> key(cache.row_floats()), value(cache.row_floats());
    for (uint64_t i = 0; i < count; ++i) {
      std::memcpy(key.data(), keys.data() + i * bytes, bytes);
      std::memcpy(value.data(), values.data() + i * bytes, bytes);
      cache.Write(first + i, key.data(), value.data());
    }
  }
  return r.Done();
}

}  // namespace

absl::StatusOr<ParsedModelSnapshot> ParseModelSnapshot(
    absl::string_view blob,
    std::span<const std::shared_ptr<const Model>> models) {
  LINATTN_ASSIGN_OR_RETURN(std::vector<SnapshotSection> sections,
                           OpenSnapshot(blob, SnapshotKind::kModelSession));
  // CONV is there for models with short convolutions (ReadConvWindows
  // checks it is there exactly when the model has them).
  const bool has_conv =
      std::any_of(sections.begin(), sections.end(),
                  [](const SnapshotSection& s) { return s.tag == kConvTag; });
  // KVCA likewise for hybrids (ReadKvCaches).
  const bool has_kv =
      std::any_of(sections.begin(), sections.end(),
                  [](const SnapshotSection& s) { return s.tag == kKvTag; });
  LINATTN_ASSIGN_OR_RETURN(
      std::vector<absl::string_view> found,
      has_conv && has_kv
          ? FindSections(sections, {kModelTag, kStateTag, kConvTag, kKvTag})
      : has_conv ? FindSections(sections, {kModelTag, kStateTag, kConvTag})
      : has_kv   ? FindSections(sections, {kModelTag, kStateTag, kKvTag})
                 : FindSections(sections, {kModelTag, kStateTag}));
  SectionReader r(found[0], "MODL");
  uint64_t fingerprint = 0;
  uint32_t name_len = 0;
  int32_t pending = -1;
  LINATTN_RETURN_IF_ERROR(r.Get(&fingerprint, "fingerprint"));
  LINATTN_RETURN_IF_ERROR(r.Get(&name_len, "name length"));
  LINATTN_ASSIGN_OR_RETURN(absl::string_view name, r.Bytes(name_len, "name"));
  LINATTN_RETURN_IF_ERROR(r.Get(&pending, "pending token"));
  LINATTN_RETURN_IF_ERROR(r.Done());
  std::shared_ptr<const Model> model;
  for (const auto& m : models) {
    if (m->name() == name) model = m;
  }
  if (model == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state: the snapshot is of model '", name, "', which is not loaded"));
  }
  if (model->fingerprint() != fingerprint) {
    return absl::FailedPreconditionError(absl::StrCat(
        "state: the snapshot was taken with a different '", name,
        "' (fingerprint ", absl::Hex(fingerprint, absl::kZeroPad16),
        ", loaded ", model->fingerprint_hex(), ")"));
  }
  if (found[1].size() != StateSectionBytes(model->config().num_hidden_layers,
                                           model->attention_state_bytes())) {
    return Malformed(absl::StrCat(
        "holds ", found[1].size(), " bytes of state; model '", name, "' needs ",
        StateSectionBytes(model->config().num_hidden_layers,
                          model->attention_state_bytes())));
  }
  ParsedModelSnapshot parsed;
  parsed.model = model;
  try {
    parsed.state = model->NewState();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory: allocating ", model->state_bytes(), " bytes of state failed"));
  }
  LINATTN_RETURN_IF_ERROR(ReadStates(found[1], parsed.state.layers()));
  // A checksum is not a seal: the contents must be a session's too.
  for (const AttentionState& layer : parsed.state.layers()) {
    if (layer.position() != parsed.state.position()) {
      return Malformed("holds layers at different positions");
    }
    LINATTN_RETURN_IF_ERROR(CheckRestoredState(
        layer, model->config().features_nonnegative(), 0, "snapshot"));
  }
  LINATTN_RETURN_IF_ERROR(ReadConvWindows(
      has_conv ? std::optional<absl::string_view>(found[2]) : std::nullopt,
      *model, parsed.state));
  LINATTN_RETURN_IF_ERROR(ReadKvCaches(
      has_kv ? std::optional<absl::string_view>(found.back()) : std::nullopt,
      *model, parsed.state));
  if (pending < -1 || (pending >= 0 && static_cast<uint32_t>(pending) >=
                                           model->config().vocab_size)) {
    return Malformed(absl::StrCat("holds pending token ", pending,
                                  ", outside the vocabulary"));
  }
  if (pending == -1 && parsed.state.position() > 0) {
    // Every context that has tokens ends with one not yet fed.
    return Malformed("has tokens in its state but no pending token");
  }
  if (pending >= 0) parsed.pending = pending;
  for (const SnapshotSection& s : sections) {
    if (s.tag != kSamplerTag) continue;
    SectionReader sampler(s.bytes, "SMPL");
    uint8_t set = 0;
    LINATTN_RETURN_IF_ERROR(sampler.Get(&parsed.sampler.seed, "seed"));
    LINATTN_RETURN_IF_ERROR(sampler.Get(&parsed.sampler.draws, "draws"));
    LINATTN_RETURN_IF_ERROR(sampler.Get(&set, "set"));
    LINATTN_RETURN_IF_ERROR(sampler.Done());
    if (set > 1) return Malformed("sampler position is malformed");
    parsed.sampler.set = set == 1;
  }
  return parsed;
}
}  // namespace linattn
