#include "core/session/snapshot.h"

#include <array>
#include <cmath>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/attention/attention.h"
#include "core/util/status_macros.h"

namespace linattn {

namespace {

constexpr char kMagic[8] = {'L', 'N', 'A', 'T', 'S', 'N', 'A', 'P'};

std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}

class Writer {
 public:
  template <typename T>
  void Put(T value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));  // x86-64 and aarch64: little-endian
    out_.append(bytes, sizeof(T));
  }
  void PutBytes(const void* data, size_t n) {
    out_.append(static_cast<const char*>(data), n);
  }
  std::string& out() { return out_; }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(absl::string_view data) : data_(data) {}
  template <typename T>
  absl::Status Get(T* value, absl::string_view field) {
    if (data_.size() - pos_ < sizeof(T)) return Truncated(field);
    std::memcpy(value, data_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }
  absl::Status GetBytes(void* out, uint64_t n, absl::string_view field) {
    if (data_.size() - pos_ < n) return Truncated(field);
    std::memcpy(out, data_.data() + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  size_t remaining() const { return data_.size() - pos_; }

 private:
  static absl::Status Truncated(absl::string_view field) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: snapshot is truncated (at ", field, ")"));
  }
  absl::string_view data_;
  size_t pos_ = 0;
};

}  // namespace

uint32_t Crc32(absl::string_view data) {
  static const std::array<uint32_t, 256> table = MakeCrcTable();
  uint32_t c = 0xffffffffu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint64_t SnapshotBytes(const AttentionSpec& spec) {
  // magic, version, 3 dims, map, unnormalized, ε, decay count and values,
  // feature_dim, seed, horizon, position, float count, floats, CRC.
  return 8 + 4 + 3 * 4 + 1 + 1 + 4 + 4 + 4 * uint64_t{spec.decay.size()} + 4 +
         8 + 4 + 8 + 8 + StateBytes(spec) + 4;
}

std::string SerializeSnapshot(const AttentionSpec& spec,
                              const AttentionState& state) {
  Writer w;
  w.PutBytes(kMagic, sizeof(kMagic));
  w.Put<uint32_t>(kSnapshotVersion);
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
  w.Put<uint64_t>(state.position());
  w.Put<uint64_t>(state.size());
  w.PutBytes(state.data(), state.size() * sizeof(float));
  w.Put<uint32_t>(Crc32(w.out()));
  return std::move(w.out());
}

absl::StatusOr<ParsedSnapshot> ParseSnapshot(absl::string_view blob) {
  if (blob.size() < sizeof(kMagic) + 8 ||
      std::memcmp(blob.data(), kMagic, sizeof(kMagic)) != 0) {
    return absl::InvalidArgumentError(
        "state: not a linattn attention snapshot (bad magic)");
  }
  uint32_t stored_crc = 0;
  std::memcpy(&stored_crc, blob.data() + blob.size() - 4, 4);
  const absl::string_view body = blob.substr(0, blob.size() - 4);
  Reader r(body);
  char magic[8];
  LINATTN_RETURN_IF_ERROR(r.GetBytes(magic, 8, "magic"));
  uint32_t version = 0;
  LINATTN_RETURN_IF_ERROR(r.Get(&version, "version"));
  if (version != kSnapshotVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state: snapshot format version ", version,
        " is not supported (this server reads ", kSnapshotVersion, ")"));
  }
  if (Crc32(body) != stored_crc) {
    return absl::DataLossError(
        "state: snapshot checksum mismatch (truncated or altered)");
  }
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
      decay_count > kMaxDim || uint64_t(decay_count) * 4 > r.remaining()) {
    return absl::InvalidArgumentError("state: snapshot spec is malformed");
  }
  spec.feature_map = static_cast<FeatureMapKind>(map);
  spec.unnormalized = unnormalized == 1;
  spec.decay.resize(decay_count);
  for (float& g : spec.decay) LINATTN_RETURN_IF_ERROR(r.Get(&g, "decay"));
  LINATTN_RETURN_IF_ERROR(r.Get(&spec.feature_dim, "feature_dim"));
  LINATTN_RETURN_IF_ERROR(r.Get(&spec.seed, "seed"));
  LINATTN_RETURN_IF_ERROR(r.Get(&spec.horizon, "horizon"));
  if (absl::Status s = ValidateSpec(spec); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: snapshot spec is invalid: ", s.message()));
  }
  uint64_t position = 0, floats = 0;
  LINATTN_RETURN_IF_ERROR(r.Get(&position, "position"));
  LINATTN_RETURN_IF_ERROR(r.Get(&floats, "state size"));
  if (floats * sizeof(float) != StateBytes(spec) ||
      r.remaining() != floats * sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat("state: snapshot holds ", r.remaining(),
                     " bytes of state, its spec needs ", StateBytes(spec)));
  }
  // The state is no larger than the blob already received.
  std::optional<ParsedSnapshot> parsed;
  try {
    parsed.emplace(ParsedSnapshot{spec, AttentionState(spec)});
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory: allocating ", StateBytes(spec), " bytes of state failed"));
  }
  ParsedSnapshot& out = *parsed;
  LINATTN_RETURN_IF_ERROR(
      r.GetBytes(out.state.data(), floats * sizeof(float), "state"));
  out.state.set_position(position);
  // φ is non-negative for every map but identity, whatever the input.
  LINATTN_RETURN_IF_ERROR(CheckRestoredState(
      out.state, spec.feature_map != FeatureMapKind::kIdentity,
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
  for (uint32_t h = 0; h < state.num_heads(); ++h) {
    if (!AllFinite(state.s(h), s_floats + d_phi)) {
      return bad("holds NaN or Inf sums");
    }
    const float* z = state.z(h);
    bool zero = true;
    for (uint64_t i = 0; i < s_floats + d_phi && zero; ++i) {
      zero = state.s(h)[i] == 0.0f;
    }
    if (position == 0 && !zero) {
      return bad("is at position 0 but holds sums (it has seen no token)");
    }
    if (nonnegative_features) {
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
