#include "core/attention/explainer.h"

#include <charconv>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/attention/feature_map.h"
#include "core/attention/quadratic.h"
#include "core/attention/recurrent.h"
#include "core/util/status_macros.h"

namespace linattn {

namespace {

struct Preset {
  const char* name;
  std::array<float, 2> q;
  std::vector<std::array<float, 2>> keys;
  std::vector<float> values;
};

const std::vector<Preset>& Presets() {
  static const std::vector<Preset> presets = {
      {"general",
       {0.5f, 1.0f},
       {{1, 0}, {0, 1}, {1, 1}, {-0.5f, 0.5f}},
       {1, 2, 3, 0.5f}},
      {"negative",
       {-1.0f, -0.5f},
       {{-1, -2}, {-0.5f, -1}, {-2, -0.5f}},
       {1, -1, 2}},
  };
  return presets;
}

// FAVOR+'s feature count here: two orthogonal blocks of the 2-D keys.
constexpr uint32_t kFavorFeatures = 4;

std::string Vec(std::span<const float> v) {
  std::vector<std::string> parts;
  for (float x : v) parts.push_back(FormatFloat(x));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

nlohmann::json NullableFloat(bool available, float value) {
  return available ? nlohmann::json(value) : nlohmann::json(nullptr);
}

float Dot(std::span<const float> a, std::span<const float> b) {
  float sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
  return sum;
}

// φ(x) at `position`, unscaled (FAVOR+'s features times e^{log-scale}).
std::vector<float> Phi(const FeatureMap& fm, const float* x,
                       uint64_t position) {
  std::vector<float> phi(fm.dim());
  const float log_scale = fm.Apply(x, position, phi.data());
  if (log_scale != 0.0f) {
    for (float& f : phi) f *= std::exp(log_scale);
  }
  return phi;
}

absl::StatusOr<ExplainState> StepLocally(const AttentionSpec& spec,
                                         const SequenceInput& in,
                                         const SequenceOutput& out) {
  LINATTN_ASSIGN_OR_RETURN(Attention attention, Attention::Create(spec));
  AttentionState state = attention.NewState();
  LINATTN_RETURN_IF_ERROR(StepSequence(attention, state, in, out));
  const uint32_t d = state.feature_dim();
  ExplainState r;
  r.s.assign(state.s(0), state.s(0) + d * state.value_dim());
  r.z.assign(state.z(0), state.z(0) + d);
  if (state.has_key_shift()) r.key_log_scale = state.key_shift(0);
  return r;
}

}  // namespace

std::vector<ExplainPresetInfo> ExplainPresets() {
  std::vector<ExplainPresetInfo> out;
  for (const Preset& p : Presets()) {
    out.push_back({p.name, static_cast<int>(p.keys.size())});
  }
  return out;
}

std::vector<std::string> ExplainFeatureMaps() {
  return {"elu1", "relu", "identity", "cosine", "favor"};
}

std::string FormatFloat(float value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // The shortest digits that read back as the same float, in positional
  // notation where that is how people write the number (10, not 1e+01).
  const float magnitude = std::fabs(value);
  const bool positional =
      magnitude == 0.0f || (magnitude >= 1e-4f && magnitude < 1e15f);
  char buffer[64];
  const auto [end, error] = std::to_chars(
      buffer, buffer + sizeof(buffer), value,
      positional ? std::chars_format::fixed : std::chars_format::scientific);
  return std::string(buffer, end);
}

absl::StatusOr<ExplainResult> Explain(const ExplainOptions& options,
                                      const ExplainStepper& stepper) {
  const Preset* preset = nullptr;
  for (const Preset& p : Presets()) {
    if (options.preset == p.name) preset = &p;
  }
  if (preset == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("preset: unknown '", options.preset,
                     "' (expected general or negative)"));
  }
  auto map = ParseFeatureMap(options.feature_map);
  if (!map.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "feature_map: unknown '", options.feature_map, "' (expected ",
        absl::StrJoin(ExplainFeatureMaps(), ", "), ")"));
  }
  const int n = static_cast<int>(preset->keys.size());
  const int prefix = options.prefix.value_or(n);
  if (prefix < 1 || prefix > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefix: must be in [1, ", n, "] for preset ",
                     options.preset, ", got ", prefix));
  }
  AttentionSpec spec{.num_heads = 1,
                     .key_dim = 2,
                     .value_dim = 1,
                     .feature_map = *map,
                     .epsilon = 0.0f};
  switch (*map) {
    case FeatureMapKind::kIdentity:
      spec.premapped = true;  // φ = x, read out normalised
      break;
    case FeatureMapKind::kCosine:
      spec.horizon = static_cast<uint32_t>(n);
      break;
    case FeatureMapKind::kFavor:
      spec.feature_dim = kFavorFeatures;
      break;
    default:
      break;
  }
  LINATTN_ASSIGN_OR_RETURN(FeatureMap fm, FeatureMap::Create(spec));

  ExplainResult r;
  r.preset = options.preset;
  r.feature_map = options.feature_map;
  r.prefix = prefix;
  r.q = preset->q;
  r.keys = preset->keys;
  r.values = preset->values;
  // The query reads out at the prefix's last position.
  r.phi_q = Phi(fm, r.q.data(), uint64_t(prefix - 1));
  for (int i = 0; i < n; ++i) {
    r.phi_keys.push_back(Phi(fm, r.keys[i].data(), uint64_t(i)));
  }

  // The prefix through the recurrent step, the same q at every token: the
  // last token's read-out is the module's output.
  std::vector<float> q_seq, k_seq;
  for (int i = 0; i < prefix; ++i) {
    q_seq.insert(q_seq.end(), r.q.begin(), r.q.end());
    k_seq.insert(k_seq.end(), r.keys[i].begin(), r.keys[i].end());
  }
  SequenceInput in{q_seq.data(), k_seq.data(), r.values.data(),
                   uint64_t(prefix)};
  std::vector<float> y(prefix), den(prefix), ry(prefix), rden(prefix);
  std::vector<uint8_t> avail(prefix), ravail(prefix);
  LINATTN_ASSIGN_OR_RETURN(ExplainState state,
                           (stepper ? stepper : ExplainStepper(StepLocally))(
                               spec, in, {y.data(), den.data(), avail.data()}));
  if (state.s.size() != fm.dim() || state.z.size() != fm.dim()) {
    return absl::InternalError("the state has the wrong size");
  }
  const float state_scale =
      state.key_log_scale ? std::exp(*state.key_log_scale) : 1.0f;
  r.s = state.s;
  r.z = state.z;
  if (state_scale != 1.0f) {
    for (float& x : r.s) x *= state_scale;
    for (float& x : r.z) x *= state_scale;
  }
  r.numerator = Dot(r.phi_q, r.s);
  r.denominator = den.back();
  r.available = avail.back() != 0;
  r.output = y.back();

  LINATTN_ASSIGN_OR_RETURN(Attention attention, Attention::Create(spec));
  LINATTN_RETURN_IF_ERROR(QuadraticAttention(
      attention, in, {ry.data(), rden.data(), ravail.data()}));
  r.reference_available = ravail.back() != 0;
  r.reference = ry.back();

  float max_logit = -INFINITY;
  std::vector<float> logits;
  for (int i = 0; i < prefix; ++i) {
    const float w = Dot(r.phi_q, r.phi_keys[i]);
    r.weights.push_back(r.available ? w / r.denominator : NAN);
    logits.push_back(r.q[0] * r.keys[i][0] + r.q[1] * r.keys[i][1]);
    max_logit = std::max(max_logit, logits.back());
  }
  double sum = 0;
  for (float l : logits) sum += std::exp(double(l - max_logit));
  double out = 0;
  for (int i = 0; i < prefix; ++i) {
    const double w = std::exp(double(logits[i] - max_logit)) / sum;
    r.softmax_weights.push_back(static_cast<float>(w));
    out += w * r.values[i];
  }
  r.softmax_output = static_cast<float>(out);
  return r;
}

std::string FormatExplainText(const ExplainResult& r) {
  std::string o;
  absl::StrAppend(
      &o, "Linear attention reassociation: preset ", r.preset, ", feature map ",
      r.feature_map, ", prefix ", r.prefix, " of ", r.keys.size(), " keys",
      r.server.empty() ? ""
                       : absl::StrCat(" (state from server ", r.server, ")"),
      "\n\n");
  absl::StrAppend(&o, "q        = ", Vec(r.q), "\nφ(q)     = ", Vec(r.phi_q),
                  "\n\n");
  for (size_t i = 0; i < r.keys.size(); ++i) {
    absl::StrAppend(
        &o,
        absl::StripTrailingAsciiWhitespace(absl::StrFormat(
            "k_%d = %-13s φ(k_%d) = %-26s v_%d = %-5s%s", i, Vec(r.keys[i]), i,
            Vec(r.phi_keys[i]), i, FormatFloat(r.values[i]),
            int(i) < r.prefix ? "" : "  (outside the prefix)")),
        "\n");
  }
  absl::StrAppend(&o, "\nrunning sums after ", r.prefix,
                  r.prefix == 1 ? " key" : " keys", ":\n");
  absl::StrAppend(&o, "  z = Σ φ(k_i)      = ", Vec(r.z), "\n");
  absl::StrAppend(&o, "  S = Σ φ(k_i)·v_i  = ", Vec(r.s), "\n\n");
  absl::StrAppend(&o, "numerator    φ(q)·S = ", FormatFloat(r.numerator), "\n");
  absl::StrAppend(&o, "denominator  φ(q)·z = ", FormatFloat(r.denominator),
                  "\n");
  if (r.available) {
    absl::StrAppend(&o, "output       numerator / denominator = ",
                    FormatFloat(r.output), "\n");
    absl::StrAppend(
        &o, "weights      φ(q)·φ(k_i) / denominator = ", Vec(r.weights), "\n");
  } else {
    absl::StrAppend(&o,
                    "output       unavailable (the denominator is exactly 0: "
                    "φ(q)·z vanishes, so the attention is undefined)\n");
  }
  absl::StrAppend(
      &o, "reference    Σ (φ(q)·φ(k_i)) v_i / Σ φ(q)·φ(k_i) = ",
      r.reference_available ? FormatFloat(r.reference) : "unavailable", "\n\n");
  absl::StrAppend(
      &o, "softmax attention for contrast: weights softmax(q·k_i) = ",
      Vec(r.softmax_weights), ", output ", FormatFloat(r.softmax_output), "\n");
  return o;
}

nlohmann::json ExplainJson(const ExplainResult& r) {
  nlohmann::json keys = nlohmann::json::array();
  for (size_t i = 0; i < r.keys.size(); ++i) {
    keys.push_back({{"k", r.keys[i]},
                    {"phi_k", r.phi_keys[i]},
                    {"v", r.values[i]},
                    {"in_prefix", int(i) < r.prefix}});
  }
  return {
      {"preset", r.preset},
      {"feature_map", r.feature_map},
      {"prefix", r.prefix},
      {"q", r.q},
      {"phi_q", r.phi_q},
      {"keys", keys},
      {"z", r.z},
      {"s", r.s},
      {"numerator", r.numerator},
      {"denominator", r.denominator},
      {"available", r.available},
      {"output", NullableFloat(r.available, r.output)},
      {"reference", NullableFloat(r.reference_available, r.reference)},
      {"weights",
       r.available ? nlohmann::json(r.weights) : nlohmann::json(nullptr)},
      {"softmax",
       {{"weights", r.softmax_weights}, {"output", r.softmax_output}}},
      {"server",
       r.server.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.server)},
  };
}

nlohmann::json ExplainOptionsJson() {
  nlohmann::json presets = nlohmann::json::array();
  for (const ExplainPresetInfo& p : ExplainPresets()) {
    presets.push_back({{"name", p.name}, {"keys", p.keys}});
  }
  return {{"presets", presets},
          {"feature_maps", ExplainFeatureMaps()},
          {"defaults", {{"preset", "general"}, {"feature_map", "elu1"}}}};
}

}  // namespace linattn
