#include "server/attention_tensors.h"

#include <algorithm>
#include <bit>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"

namespace linattn {

static_assert(std::endian::native == std::endian::little,
              "bytes tensors are little-endian float32, read in place");

absl::Status TensorOf(const char* name,
                      const google::protobuf::RepeatedField<float>& floats,
                      const std::string& bytes, uint64_t want,
                      absl::string_view shape, const float** data) {
  if (!floats.empty() && !bytes.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ", ", name, "_bytes: one tensor given twice; send ",
                     name, " or ", name, "_bytes, not both"));
  }
  if (!bytes.empty()) {
    if (bytes.size() != want * sizeof(float)) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, "_bytes: expected ", want * sizeof(float), " bytes (", want,
          " float32 values: ", shape, "), got ", bytes.size()));
    }
    // A std::string's buffer is aligned for any fundamental type (operator
    // new) or sits 8-aligned inside the string object (short strings).
    if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(float) != 0) {
      return absl::InternalError(
          absl::StrCat(name, "_bytes: the parsed buffer is not aligned"));
    }
    *data = reinterpret_cast<const float*>(bytes.data());
    return absl::OkStatus();
  }
  if (uint64_t(floats.size()) != want) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": expected ", want,
                                                   " floats (", shape,
                                                   "), got ", floats.size()));
  }
  *data = floats.empty() ? nullptr : floats.data();
  return absl::OkStatus();
}

namespace {

// InputOf for either request type: they share the tensors' field names.
template <typename Request>
absl::StatusOr<SequenceInput> InputOfRequest(const AttentionSpec& spec,
                                             uint64_t tokens,
                                             const Request& r) {
  const uint64_t rows = tokens * spec.num_heads;  // ≤ 2^32 · 2^16
  const uint64_t gates = GatesPerHead(spec);
  // No message carries more than 2 GiB (protobuf's limit), so a tensor of
  // more than 2^29 floats cannot have arrived: refusing those first keeps
  // every size below (floats and their bytes) far from uint64's range.
  constexpr uint64_t kMaxTensorFloats = uint64_t{1} << 29;
  const uint64_t widest =
      std::max<uint64_t>({spec.key_dim, spec.value_dim, gates});
  if (rows > kMaxTensorFloats / widest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens: ", tokens, " tokens of ", spec.num_heads, " heads × ", widest,
        " values are more than any message carries (at most ", kMaxTensorFloats,
        " floats per tensor)"));
  }
  auto shape = [&](absl::string_view dim) {
    return absl::StrCat("tokens ", tokens, " × num_heads ", spec.num_heads,
                        dim);
  };
  SequenceInput in{.tokens = tokens};
  LINATTN_RETURN_IF_ERROR(TensorOf("q", r.q(), r.q_bytes(), rows * spec.key_dim,
                                   shape(" × key_dim"), &in.q));
  LINATTN_RETURN_IF_ERROR(TensorOf("k", r.k(), r.k_bytes(), rows * spec.key_dim,
                                   shape(" × key_dim"), &in.k));
  LINATTN_RETURN_IF_ERROR(TensorOf("v", r.v(), r.v_bytes(),
                                   rows * spec.value_dim, shape(" × value_dim"),
                                   &in.v));
  const absl::string_view rule = UpdateRuleName(spec.rule);
  if (gates == 0 && (!r.g().empty() || !r.g_bytes().empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.g().empty() ? "g_bytes" : "g", ": rule ", rule,
                     " takes no log-gates"));
  }
  if (gates != 0) {
    LINATTN_RETURN_IF_ERROR(
        TensorOf("g", r.g(), r.g_bytes(), rows * gates,
                 shape(gates == 1 ? "" : " × key_dim (gate key)"), &in.g));
  }
  if (!HasBeta(spec.rule) && (!r.beta().empty() || !r.beta_bytes().empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(r.beta().empty() ? "beta_bytes" : "beta", ": rule ", rule,
                     " takes no beta"));
  }
  if (HasBeta(spec.rule)) {
    LINATTN_RETURN_IF_ERROR(
        TensorOf("beta", r.beta(), r.beta_bytes(), rows, shape(""), &in.beta));
  }
  for (auto [name, floats, bytes, data] :
       {std::tuple{"a", &r.a(), &r.a_bytes(), &in.a},
        std::tuple{"b", &r.b(), &r.b_bytes(), &in.b}}) {
    if (!HasLowRank(spec.rule)) {
      if (!floats->empty() || !bytes->empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, floats->empty() ? "_bytes" : "", ": rule ", rule,
                         " takes no ", name));
      }
      continue;
    }
    LINATTN_RETURN_IF_ERROR(TensorOf(name, *floats, *bytes, rows * spec.key_dim,
                                     shape(" × key_dim"), data));
  }
  return in;
}

template <typename Response>
std::pair<float*, float*> OutputOfResponse(bool as_bytes, uint64_t rows,
                                           uint32_t value_dim, Response* r) {
  if (as_bytes) {
    r->mutable_output_bytes()->resize(rows * value_dim * sizeof(float));
    r->mutable_denominator_bytes()->resize(rows * sizeof(float));
    return {reinterpret_cast<float*>(r->mutable_output_bytes()->data()),
            reinterpret_cast<float*>(r->mutable_denominator_bytes()->data())};
  }
  r->mutable_output()->Resize(static_cast<int>(rows * value_dim), 0);
  r->mutable_denominator()->Resize(static_cast<int>(rows), 0);
  return {r->mutable_output()->mutable_data(),
          r->mutable_denominator()->mutable_data()};
}

}  // namespace

absl::StatusOr<SequenceInput> InputOf(const AttentionSpec& spec,
                                      uint64_t tokens,
                                      const v1::PrefillRequest& request) {
  return InputOfRequest(spec, tokens, request);
}

absl::StatusOr<SequenceInput> InputOf(const AttentionSpec& spec,
                                      uint64_t tokens,
                                      const v1::DecodeRequest& request) {
  return InputOfRequest(spec, tokens, request);
}

std::pair<float*, float*> OutputOf(bool as_bytes, uint64_t rows,
                                   uint32_t value_dim,
                                   v1::PrefillResponse* response) {
  return OutputOfResponse(as_bytes, rows, value_dim, response);
}

std::pair<float*, float*> OutputOf(bool as_bytes, uint64_t rows,
                                   uint32_t value_dim,
                                   v1::DecodeResponse* response) {
  return OutputOfResponse(as_bytes, rows, value_dim, response);
}

void CopyAvailable(const std::vector<uint8_t>& from,
                   google::protobuf::RepeatedField<bool>* to) {
  to->Resize(static_cast<int>(from.size()), false);
  for (size_t i = 0; i < from.size(); ++i) {
    to->Set(static_cast<int>(i), from[i] != 0);
  }
}

}  // namespace linattn
