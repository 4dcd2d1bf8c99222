#include "core/session/snapshot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/session/snapshot_container.h"
#include "core/util/status_macros.h"

namespace linattn {

using namespace snapshot_internal;  // NOLINT: the container's parts

namespace {

uint64_t SpecSectionBytes(const AttentionSpec& spec) {
  // 3 dims, map, unnormalized, ε, decay count and values, feature_dim,
  // seed, horizon.
  return 3 * 4 + 1 + 1 + 4 + 4 + 4 * uint64_t{spec.decay.size()} + 4 + 8 + 4;
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
    if (kind == 0 || kind > static_cast<uint8_t>(UpdateRule::kRwkv6) ||
        gate > static_cast<uint8_t>(GateShape::kKey) || l2norm > 1) {
      return Malformed("rule section is malformed");
    }
    if (static_cast<UpdateRule>(kind) == UpdateRule::kRwkv6) {
      // u, num_heads × key_dim floats: checked against what is left before
      // anything is allocated.
      const uint64_t count = uint64_t{spec.num_heads} * spec.key_dim;
      if (count > rr.remaining() / 4) {
        return Malformed("rule section is malformed");
      }
      spec.bonus.resize(count);
      for (float& u : spec.bonus) LINATTN_RETURN_IF_ERROR(rr.Get(&u, "bonus"));
    }
    LINATTN_RETURN_IF_ERROR(rr.Done());
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
  for (float u : spec.bonus) w.Put<float>(u);  // rwkv6 only
}

// SPEC, then STAT when `state_bytes` is set, then RULE for the gated,
// delta, rwkv7 and rwkv6 rules (the linear rule's snapshots are as they
// always were; rwkv6's RULE carries its bonus u after the fixed fields).
std::vector<SnapshotWriter::Section> SpecSections(
    const AttentionSpec& spec, std::optional<uint64_t> state_bytes) {
  std::vector<SnapshotWriter::Section> sections = {
      {kSpecTag, SpecSectionBytes(spec)}};
  if (state_bytes.has_value()) {
    sections.push_back({kStateTag, StateSectionBytes(1, *state_bytes)});
  }
  if (spec.rule != UpdateRule::kLinear) {
    sections.push_back(
        {kRuleTag, kRuleSectionBytes + 4 * uint64_t{spec.bonus.size()}});
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
