#include "core/session/snapshot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/util/crc.h"
#include "core/util/status_macros.h"

namespace linattn {

namespace {

constexpr char kMagic[8] = {'L', 'N', 'A', 'T', 'S', 'N', 'A', 'P'};
// Version 1's model-session magic, recognised only to name it.
constexpr char kModelMagicV1[8] = {'L', 'N', 'A', 'T', 'M', 'S', 'N', 'P'};
constexpr uint64_t kHeaderBytes = 24;
constexpr uint64_t kTableEntryBytes = 24;
constexpr uint32_t kMaxSections = 16;
constexpr uint32_t kRequired = 1;
constexpr uint32_t kSpecTag = SnapshotTag("SPEC");
constexpr uint32_t kModelTag = SnapshotTag("MODL");
constexpr uint32_t kStateTag = SnapshotTag("STAT");
constexpr uint32_t kSamplerTag = SnapshotTag("SMPL");
constexpr uint32_t kConvTag = SnapshotTag("CONV");
// RULE (attention sessions of the gated and delta rules; required, so a
// reader that does not know it refuses the blob rather than misread it):
// rule u8, gate u8, qk_l2norm u8, scale f32.
constexpr uint32_t kRuleTag = SnapshotTag("RULE");
constexpr uint64_t kRuleSectionBytes = 1 + 1 + 1 + 4;
// SMPL: seed u64, draws u64, set u8.
constexpr uint64_t kSamplerSectionBytes = 8 + 8 + 1;

std::string TagName(uint32_t tag) {
  std::string name;
  for (int i = 0; i < 4; ++i) {
    const char c = static_cast<char>((tag >> (8 * i)) & 0xff);
    name += (c >= 0x20 && c < 0x7f) ? c : '?';
  }
  return name;
}

absl::Status Malformed(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("state: snapshot ", why));
}

// Writes a container whose section sizes are known up front: the header and
// table first, then each section's fields in order, the checksum last.
// Finish() checks that every section got exactly its declared size.
class SnapshotWriter {
 public:
  struct Section {
    uint32_t tag;
    uint64_t size;
    bool required = true;
  };
  SnapshotWriter(SnapshotKind kind, std::span<const Section> sections)
      : sections_(sections.begin(), sections.end()) {
    uint64_t total = kHeaderBytes + kTableEntryBytes * sections.size() + 4;
    for (const Section& s : sections) total += s.size;
    out_.reserve(total);
    out_.append(kMagic, sizeof(kMagic));
    Put<uint32_t>(kSnapshotVersion);
    Put<uint32_t>(static_cast<uint32_t>(kind));
    Put<uint32_t>(static_cast<uint32_t>(sections.size()));
    Put<uint32_t>(0);
    uint64_t offset = kHeaderBytes + kTableEntryBytes * sections.size();
    for (const Section& s : sections) {
      Put<uint32_t>(s.tag);
      Put<uint32_t>(s.required ? kRequired : 0);
      Put<uint64_t>(offset);
      Put<uint64_t>(s.size);
      offset += s.size;
    }
    end_ = offset + 4;
  }
  template <typename T>
  void Put(T value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));  // x86-64 and aarch64: little-endian
    out_.append(bytes, sizeof(T));
  }
  void PutBytes(const void* data, size_t n) {
    out_.append(static_cast<const char*>(data), n);
  }
  void PutState(const AttentionState& state) {
    Put<uint64_t>(state.position());
    Put<uint64_t>(state.size());
    PutBytes(state.data(), state.size() * sizeof(float));
  }
  std::string Finish() {
    Put<uint32_t>(Crc32(out_));
    if (out_.size() != end_) {
      // A size function and its writer disagree: a defect, not input.
      std::abort();
    }
    return std::move(out_);
  }

 private:
  std::vector<Section> sections_;
  std::string out_;
  uint64_t end_ = 0;
};

// Reads one section's fields; running past its end is a malformed blob (the
// checksum matched, so the bytes are as written: the table lies).
class SectionReader {
 public:
  SectionReader(absl::string_view data, absl::string_view name)
      : data_(data), name_(name) {}
  template <typename T>
  absl::Status Get(T* value, absl::string_view field) {
    if (data_.size() - pos_ < sizeof(T)) return Short(field);
    std::memcpy(value, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }
  absl::StatusOr<absl::string_view> Bytes(uint64_t n, absl::string_view field) {
    if (data_.size() - pos_ < n) return Short(field);
    absl::string_view out = data_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  uint64_t remaining() const { return data_.size() - pos_; }
  absl::Status Done() const {
    if (remaining() == 0) return absl::OkStatus();
    return Malformed(absl::StrCat("section ", name_, " has ", remaining(),
                                  " bytes after its last field"));
  }

 private:
  absl::Status Short(absl::string_view field) const {
    return Malformed(
        absl::StrCat("section ", name_, " ends before its field ", field));
  }
  absl::string_view data_;
  absl::string_view name_;
  uint64_t pos_ = 0;
};

uint64_t StateSectionBytes(uint64_t states, uint64_t state_bytes) {
  return 4 + 16 * states + state_bytes;
}

// Reads the STAT section into `states`, whose shapes are already set (from
// the spec or the model).
absl::Status ReadStates(absl::string_view section,
                        std::span<AttentionState> states) {
  SectionReader r(section, "STAT");
  uint32_t count = 0;
  LINATTN_RETURN_IF_ERROR(r.Get(&count, "state count"));
  if (count != states.size()) {
    return Malformed(
        absl::StrCat("holds ", count, " states; ", states.size(), " expected"));
  }
  for (size_t i = 0; i < states.size(); ++i) {
    AttentionState& state = states[i];
    uint64_t position = 0, floats = 0;
    LINATTN_RETURN_IF_ERROR(r.Get(&position, "position"));
    LINATTN_RETURN_IF_ERROR(r.Get(&floats, "float count"));
    if (floats != state.size()) {
      return Malformed(absl::StrCat("state ", i, " holds ", floats,
                                    " floats; its shape needs ", state.size()));
    }
    LINATTN_ASSIGN_OR_RETURN(absl::string_view bytes,
                             r.Bytes(floats * sizeof(float), "floats"));
    std::memcpy(state.data(), bytes.data(), bytes.size());
    state.set_position(position);
  }
  return r.Done();
}

// The sections `wanted` of an opened container, in that order; a required
// section this reader does not know refuses the blob.
absl::StatusOr<std::vector<absl::string_view>> FindSections(
    const std::vector<SnapshotSection>& sections,
    std::initializer_list<uint32_t> wanted) {
  std::vector<absl::string_view> found(wanted.size());
  std::vector<bool> seen(wanted.size(), false);
  for (const SnapshotSection& s : sections) {
    size_t i = 0;
    for (uint32_t tag : wanted) {
      if (tag == s.tag) break;
      ++i;
    }
    if (i == wanted.size()) {
      if (s.flags & kRequired) {
        return Malformed(absl::StrCat("needs section ", TagName(s.tag),
                                      ", which this server does not read"));
      }
      continue;
    }
    if (seen[i]) {
      return Malformed(
          absl::StrCat("holds section ", TagName(s.tag), " twice"));
    }
    seen[i] = true;
    found[i] = s.bytes;
  }
  size_t i = 0;
  for (uint32_t tag : wanted) {
    if (!seen[i++]) {
      return Malformed(absl::StrCat("has no section ", TagName(tag)));
    }
  }
  return found;
}

absl::string_view KindName(uint32_t kind) {
  switch (kind) {
    case static_cast<uint32_t>(SnapshotKind::kAttentionSession):
      return "an attention session (AttentionService.Restore)";
    case static_cast<uint32_t>(SnapshotKind::kModelSession):
      return "a model session (GenerationService.Restore)";
  }
  return "an unknown kind of session";
}

}  // namespace

uint32_t Crc32Extend(uint32_t crc, absl::string_view more) {
  return Crc32IeeeExtend(crc, more);
}

uint32_t Crc32(absl::string_view data) { return Crc32Extend(0, data); }

absl::StatusOr<std::vector<SnapshotSection>> OpenSnapshot(
    absl::string_view blob, SnapshotKind kind) {
  if (blob.size() >= 8 &&
      std::memcmp(blob.data(), kModelMagicV1, sizeof(kModelMagicV1)) == 0) {
    return absl::InvalidArgumentError(
        "state: a version 1 model-session snapshot, which this server does not "
        "read (it reads version 2); restore the session by sending its "
        "context again");
  }
  if (blob.size() < 8 || std::memcmp(blob.data(), kMagic, sizeof(kMagic))) {
    return absl::InvalidArgumentError(
        "state: not a linattn snapshot (bad magic)");
  }
  if (blob.size() < kHeaderBytes + 4) {
    return absl::DataLossError(
        absl::StrCat("state: snapshot is truncated (", blob.size(), " bytes)"));
  }
  auto u32 = [&](uint64_t at) {
    uint32_t v;
    std::memcpy(&v, blob.data() + at, 4);
    return v;
  };
  auto u64 = [&](uint64_t at) {
    uint64_t v;
    std::memcpy(&v, blob.data() + at, 8);
    return v;
  };
  const uint32_t version = u32(8);
  if (version != kSnapshotVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state: snapshot format version ", version,
        " is not supported (this server reads version ", kSnapshotVersion,
        version == 1 ? "; restore the session by sending its context again)"
                     : ")"));
  }
  const absl::string_view body = blob.substr(0, blob.size() - 4);
  if (Crc32(body) != u32(blob.size() - 4)) {
    return absl::DataLossError(
        "state: snapshot checksum mismatch (truncated or altered)");
  }
  if (u32(12) != static_cast<uint32_t>(kind)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: this is a snapshot of ", KindName(u32(12)),
                     ", not of ", KindName(static_cast<uint32_t>(kind))));
  }
  const uint32_t count = u32(16);
  if (count == 0 || count > kMaxSections || u32(20) != 0 ||
      kHeaderBytes + kTableEntryBytes * count > body.size()) {
    return Malformed(
        "header is inconsistent (section count or reserved "
        "field)");
  }
  std::vector<SnapshotSection> sections(count);
  uint64_t next = kHeaderBytes + kTableEntryBytes * count;
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t entry = kHeaderBytes + kTableEntryBytes * i;
    SnapshotSection& s = sections[i];
    s.tag = u32(entry);
    s.flags = u32(entry + 4);
    s.offset = u64(entry + 8);
    const uint64_t size = u64(entry + 16);
    if (s.offset != next || size > body.size() - next) {
      return Malformed(absl::StrCat("layout table entry ", i, " (",
                                    TagName(s.tag),
                                    ") does not follow the one before it"));
    }
    s.bytes = body.substr(s.offset, size);
    next += size;
  }
  if (next != body.size()) {
    return Malformed(absl::StrCat("has ", body.size() - next,
                                  " bytes after its last section"));
  }
  return sections;
}

namespace {

uint64_t SpecSectionBytes(const AttentionSpec& spec) {
  // 3 dims, map, unnormalized, ε, decay count and values, feature_dim,
  // seed, horizon.
  return 3 * 4 + 1 + 1 + 4 + 4 + 4 * uint64_t{spec.decay.size()} + 4 + 8 + 4;
}

uint64_t ContainerBytes(uint64_t sections, uint64_t payload) {
  return kHeaderBytes + kTableEntryBytes * sections + payload + 4;
}

// The sections an attention snapshot's `wanted` (SPEC first) name, with
// RULE appended when the blob has one (*rule then points at it).
absl::StatusOr<std::vector<absl::string_view>> FindSpecSections(
    const std::vector<SnapshotSection>& sections, bool with_state,
    std::optional<absl::string_view>* rule) {
  const bool has_rule =
      std::any_of(sections.begin(), sections.end(),
                  [](const SnapshotSection& s) { return s.tag == kRuleTag; });
  std::vector<absl::string_view> found;
  if (with_state) {
    LINATTN_ASSIGN_OR_RETURN(
        found, has_rule
                   ? FindSections(sections, {kSpecTag, kStateTag, kRuleTag})
                   : FindSections(sections, {kSpecTag, kStateTag}));
  } else {
    LINATTN_ASSIGN_OR_RETURN(
        found, has_rule ? FindSections(sections, {kSpecTag, kRuleTag})
                        : FindSections(sections, {kSpecTag}));
  }
  if (has_rule) {
    *rule = found.back();
    found.pop_back();
  }
  return found;
}

absl::StatusOr<AttentionSpec> ReadSpec(absl::string_view section,
                                       std::optional<absl::string_view> rule) {
  SectionReader r(section, "SPEC");
  AttentionSpec spec;
  uint8_t map = 0, unnormalized = 0;
  uint32_t decay_count = 0;
  LINATTN_RETURN_IF_ERROR(r.Get(&spec.num_heads, "num_heads"));
  LINATTN_RETURN_IF_ERROR(r.Get(&spec.key_dim, "key_dim"));
  LINATTN_RETURN_IF_ERROR(r.Get(&spec.value_dim, "value_dim"));
  LINATTN_RETURN_IF_ERROR(r.Get(&map, "feature_map"));
  LINATTN_RETURN_IF_ERROR(r.Get(&unnormalized, "unnormalized"));
  LINATTN_RETURN_IF_ERROR(r.Get(&spec.epsilon, "epsilon"));
  LINATTN_RETURN_IF_ERROR(r.Get(&decay_count, "decay"));
  if (map > static_cast<uint8_t>(FeatureMapKind::kCosine) || unnormalized > 1 ||
      decay_count > kMaxDim || uint64_t{decay_count} * 4 > r.remaining()) {
    return Malformed("spec is malformed");
  }
  spec.feature_map = static_cast<FeatureMapKind>(map);
  spec.unnormalized = unnormalized == 1;
  spec.decay.resize(decay_count);
  for (float& g : spec.decay) LINATTN_RETURN_IF_ERROR(r.Get(&g, "decay"));
  LINATTN_RETURN_IF_ERROR(r.Get(&spec.feature_dim, "feature_dim"));
  LINATTN_RETURN_IF_ERROR(r.Get(&spec.seed, "seed"));
  LINATTN_RETURN_IF_ERROR(r.Get(&spec.horizon, "horizon"));
  LINATTN_RETURN_IF_ERROR(r.Done());
  if (rule.has_value()) {
    SectionReader rr(*rule, "RULE");
    uint8_t kind = 0, gate = 0, l2norm = 0;
    LINATTN_RETURN_IF_ERROR(rr.Get(&kind, "rule"));
    LINATTN_RETURN_IF_ERROR(rr.Get(&gate, "gate"));
    LINATTN_RETURN_IF_ERROR(rr.Get(&l2norm, "qk_l2norm"));
    LINATTN_RETURN_IF_ERROR(rr.Get(&spec.scale, "scale"));
    LINATTN_RETURN_IF_ERROR(rr.Done());
    if (kind == 0 || kind > static_cast<uint8_t>(UpdateRule::kGatedDelta) ||
        gate > static_cast<uint8_t>(GateShape::kKey) || l2norm > 1) {
      return Malformed("rule section is malformed");
    }
    spec.rule = static_cast<UpdateRule>(kind);
    spec.gate = static_cast<GateShape>(gate);
    spec.qk_l2norm = l2norm == 1;
  }
  if (absl::Status s = ValidateSpec(spec); !s.ok()) {
    return Malformed(absl::StrCat("spec is invalid: ", s.message()));
  }
  return spec;
}

void PutSpec(SnapshotWriter& w, const AttentionSpec& spec) {
  w.Put<uint32_t>(spec.num_heads);
  w.Put<uint32_t>(spec.key_dim);
  w.Put<uint32_t>(spec.value_dim);
  w.Put<uint8_t>(static_cast<uint8_t>(spec.feature_map));
  w.Put<uint8_t>(spec.unnormalized ? 1 : 0);
  w.Put<float>(spec.epsilon);
  w.Put<uint32_t>(static_cast<uint32_t>(spec.decay.size()));
  for (float g : spec.decay) w.Put<float>(g);
  w.Put<uint32_t>(spec.feature_dim);
  w.Put<uint64_t>(spec.seed);
  w.Put<uint32_t>(spec.horizon);
}

void PutRule(SnapshotWriter& w, const AttentionSpec& spec) {
  if (spec.rule == UpdateRule::kLinear) return;
  w.Put<uint8_t>(static_cast<uint8_t>(spec.rule));
  w.Put<uint8_t>(static_cast<uint8_t>(spec.gate));
  w.Put<uint8_t>(spec.qk_l2norm ? 1 : 0);
  w.Put<float>(spec.scale);
}

// SPEC, then STAT when `state_bytes` is set, then RULE for the gated and
// delta rules (the linear rule's snapshots are as they always were).
std::vector<SnapshotWriter::Section> SpecSections(
    const AttentionSpec& spec, std::optional<uint64_t> state_bytes) {
  std::vector<SnapshotWriter::Section> sections = {
      {kSpecTag, SpecSectionBytes(spec)}};
  if (state_bytes.has_value()) {
    sections.push_back({kStateTag, StateSectionBytes(1, *state_bytes)});
  }
  if (spec.rule != UpdateRule::kLinear) {
    sections.push_back({kRuleTag, kRuleSectionBytes});
  }
  return sections;
}

}  // namespace

uint64_t SnapshotBytes(const AttentionSpec& spec) {
  const std::vector<SnapshotWriter::Section> sections =
      SpecSections(spec, StateBytes(spec));
  uint64_t payload = 0;
  for (const SnapshotWriter::Section& s : sections) payload += s.size;
  return ContainerBytes(sections.size(), payload);
}

std::string SerializeSnapshot(const AttentionSpec& spec,
                              const AttentionState& state) {
  const std::vector<SnapshotWriter::Section> sections =
      SpecSections(spec, state.bytes());
  SnapshotWriter w(SnapshotKind::kAttentionSession, sections);
  PutSpec(w, spec);
  w.Put<uint32_t>(1);
  w.PutState(state);
  PutRule(w, spec);
  return w.Finish();
}

std::string SerializeSpec(const AttentionSpec& spec) {
  const std::vector<SnapshotWriter::Section> sections =
      SpecSections(spec, std::nullopt);
  SnapshotWriter w(SnapshotKind::kAttentionSession, sections);
  PutSpec(w, spec);
  PutRule(w, spec);
  return w.Finish();
}

absl::StatusOr<AttentionSpec> ParseSpec(absl::string_view blob) {
  LINATTN_ASSIGN_OR_RETURN(std::vector<SnapshotSection> sections,
                           OpenSnapshot(blob, SnapshotKind::kAttentionSession));
  std::optional<absl::string_view> rule;
  LINATTN_ASSIGN_OR_RETURN(std::vector<absl::string_view> found,
                           FindSpecSections(sections, false, &rule));
  return ReadSpec(found[0], rule);
}

absl::StatusOr<ParsedSnapshot> ParseSnapshot(absl::string_view blob) {
  LINATTN_ASSIGN_OR_RETURN(std::vector<SnapshotSection> sections,
                           OpenSnapshot(blob, SnapshotKind::kAttentionSession));
  std::optional<absl::string_view> rule;
  LINATTN_ASSIGN_OR_RETURN(std::vector<absl::string_view> found,
                           FindSpecSections(sections, true, &rule));
  LINATTN_ASSIGN_OR_RETURN(AttentionSpec spec, ReadSpec(found[0], rule));
  // The state is allocated only once the blob has shown it holds every
  // float of it: no blob makes us allocate more than its own size.
  if (found[1].size() != StateSectionBytes(1, StateBytes(spec))) {
    return Malformed(absl::StrCat("holds ", found[1].size(),
                                  " bytes of state; its spec needs ",
                                  StateSectionBytes(1, StateBytes(spec))));
  }
  std::optional<ParsedSnapshot> parsed;
  try {
    parsed.emplace(ParsedSnapshot{spec, AttentionState(spec)});
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory: allocating ", StateBytes(spec), " bytes of state failed"));
  }
  LINATTN_RETURN_IF_ERROR(
      ReadStates(found[1], std::span<AttentionState>(&parsed->state, 1)));
  // φ is non-negative for every map but identity, whatever the input.
  LINATTN_RETURN_IF_ERROR(CheckRestoredState(
      parsed->state, spec.feature_map != FeatureMapKind::kIdentity,
      spec.feature_map == FeatureMapKind::kCosine ? spec.horizon : 0,
      "snapshot"));
  return *std::move(parsed);
}

namespace {

uint64_t ModelSectionBytes(const Model& model) {
  return 8 + 4 + model.name().size() + 4;
}

// CONV: the short convolutions' windows, one per layer (models that have
// them; required, so a reader that does not know it refuses the blob).
uint64_t ConvSectionBytes(const Model& model) {
  const uint64_t w = model.conv_window_floats();
  return w == 0 ? 0
                : 4 + uint64_t{model.config().num_hidden_layers} *
                          (8 + w * sizeof(float));
}

}  // namespace

uint64_t ModelSnapshotBytes(const Model& model) {
  const uint64_t conv = ConvSectionBytes(model);
  return ContainerBytes(conv > 0 ? 4 : 3,
                        ModelSectionBytes(model) +
                            StateSectionBytes(model.config().num_hidden_layers,
                                              model.attention_state_bytes()) +
                            kSamplerSectionBytes + conv);
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
  return w.Finish();
}

namespace {

// The CONV section into `state`'s windows: present exactly when the model
// has windows, of their size, and finite (they are inputs the model saw).
absl::Status ReadConvWindows(std::optional<absl::string_view> conv,
                             const Model& model, ModelState& state) {
  if (state.conv().empty()) {
    if (conv.has_value()) {
      return Malformed("holds convolution windows; the model has none");
    }
    return absl::OkStatus();
  }
  if (!conv.has_value()) {
    return Malformed("has no convolution windows; the model needs them");
  }
  if (conv->size() != ConvSectionBytes(model)) {
    return Malformed(absl::StrCat("holds ", conv->size(),
                                  " bytes of convolution windows; the model "
                                  "needs ",
                                  ConvSectionBytes(model)));
  }
  SectionReader r(*conv, "CONV");
  uint32_t count = 0;
  LINATTN_RETURN_IF_ERROR(r.Get(&count, "window count"));
  if (count != state.conv().size()) {
    return Malformed(absl::StrCat("holds ", count, " convolution windows; ",
                                  state.conv().size(), " expected"));
  }
  for (std::vector<float>& window : state.conv()) {
    uint64_t floats = 0;
    LINATTN_RETURN_IF_ERROR(r.Get(&floats, "window floats"));
    if (floats != window.size()) {
      return Malformed(absl::StrCat("holds a convolution window of ", floats,
                                    " floats; the model needs ",
                                    window.size()));
    }
    LINATTN_ASSIGN_OR_RETURN(absl::string_view bytes,
                             r.Bytes(floats * sizeof(float), "window"));
    std::memcpy(window.data(), bytes.data(), bytes.size());
    if (!AllFinite(window.data(), window.size())) {
      return Malformed("holds a convolution window that is not finite");
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
  LINATTN_ASSIGN_OR_RETURN(
      std::vector<absl::string_view> found,
      has_conv ? FindSections(sections, {kModelTag, kStateTag, kConvTag})
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

absl::Status CheckRestoredState(const AttentionState& state,
                                bool nonnegative_features, uint32_t horizon,
                                absl::string_view what) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: the ", what, " ", why));
  };
  const uint64_t position = state.position();
  if (position > kMaxSnapshotPosition) {
    return bad(absl::StrCat("claims position ", position,
                            ", which no session reaches (at most ",
                            kMaxSnapshotPosition, ")"));
  }
  if (horizon != 0 && position > horizon) {
    return bad(absl::StrCat("is at position ", position,
                            ", past its cosine horizon ", horizon));
  }
  const uint32_t d_phi = state.feature_dim(), d_v = state.value_dim();
  const uint64_t s_floats = uint64_t{d_phi} * d_v;
  const uint64_t head_floats = s_floats + (state.has_z() ? d_phi : 0);
  for (uint32_t h = 0; h < state.num_heads(); ++h) {
    if (!AllFinite(state.s(h), head_floats)) {
      return bad("holds NaN or Inf sums");
    }
    bool zero = true;
    for (uint64_t i = 0; i < head_floats && zero; ++i) {
      zero = state.s(h)[i] == 0.0f;
    }
    if (position == 0 && !zero) {
      return bad("is at position 0 but holds sums (it has seen no token)");
    }
    if (nonnegative_features && state.has_z()) {
      const float* z = state.z(h);
      for (uint32_t i = 0; i < d_phi; ++i) {
        if (z[i] < 0.0f) {
          return bad(absl::StrCat("holds z[", i, "] = ", z[i], " in head ", h,
                                  ", a sum of non-negative features"));
        }
      }
    }
    if (state.has_key_shift()) {
      const float shift = state.key_shift(h);
      const bool seen = std::isfinite(shift);
      if (!seen && shift != -INFINITY) return bad("holds a NaN key scale");
      if (seen != (position > 0)) {
        return bad(position > 0 ? "has keys but no key scale"
                                : "is at position 0 but has a key scale");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace linattn
