// The seed's interactive module of the reassociation (docs/design.md §3,
// "Explainer"): a 2-D query attends over a preset's keys and values through
// the real recurrent step (ε = 0, so a zero denominator shows as
// unavailable), beside the quadratic-order reference and softmax attention.
// `linattn explain` prints it; the server's HTTP listener serves it as JSON
// to the explorer page at `/`. Both give the same JSON (ExplainJson).
//
// Presets:
//   general:  q = [0.5, 1]; keys [1,0], [0,1], [1,1], [−0.5,0.5];
//             values 1, 2, 3, 0.5
//   negative: q = [−1, −0.5]; keys [−1,−2], [−0.5,−1], [−2,−0.5];
//             values 1, −1, 2
// Feature maps: every map of the engine. elu1 and relu keep d_φ = 2;
// identity runs as premapped features (φ = x, so the denominator can cancel
// to zero or go negative); cosine (cosFormer, horizon M = the preset's key
// count) has d_φ = 4 and depends on the position (key i at position i, the
// query at the last position of the prefix); favor (FAVOR+) has d_φ = 4
// random features drawn from the spec's default seed.
#ifndef LINATTN_CORE_ATTENTION_EXPLAINER_H_
#define LINATTN_CORE_ATTENTION_EXPLAINER_H_

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/attention/attention.h"
#include "nlohmann/json.hpp"

namespace linattn {

struct ExplainOptions {
  std::string preset = "general";    // general | negative
  std::string feature_map = "elu1";  // any map of the engine
  std::optional<int> prefix;         // keys summed; default all
};

struct ExplainPresetInfo {
  std::string name;
  int keys = 0;
};
// The presets, and the feature maps the explainer takes, in display order.
std::vector<ExplainPresetInfo> ExplainPresets();
std::vector<std::string> ExplainFeatureMaps();

struct ExplainResult {
  std::string preset;
  std::string feature_map;
  int prefix = 0;
  std::array<float, 2> q{};
  std::vector<float> phi_q;  // d_φ (at the prefix's last position)
  std::vector<std::array<float, 2>> keys;
  std::vector<std::vector<float>> phi_keys;  // d_φ each, key i at position i
  std::vector<float> values;
  std::vector<float> z;   // Σ φ(k_i) over the prefix
  std::vector<float> s;   // Σ φ(k_i)·v_i over the prefix
  float numerator = 0;    // φ(q)·S
  float denominator = 0;  // φ(q)·z
  bool available = false;
  float output = 0;  // numerator / denominator (when available)
  bool reference_available = false;
  float reference = 0;         // quadratic order: Σ w_i v_i / Σ w_i
  std::vector<float> weights;  // linear-attention weights φ(q)·φ(k_i)/den
  std::vector<float> softmax_weights;  // softmax(q·k_i) over the prefix
  float softmax_output = 0;
  std::string server;  // where the state was computed ("" = locally)
};

// Where the prefix's steps run: fills `out` for `in` (one head) from a zero
// state of `spec`, and returns the state after them, head 0: S (d_φ × 1),
// z (d_φ) and, for FAVOR+, the keys' log-scale (the true S and z are e^{ls}
// times those). The default runs them in this process.
struct ExplainState {
  std::vector<float> s, z;
  std::optional<float> key_log_scale;
};
using ExplainStepper = std::function<absl::StatusOr<ExplainState>(
    const AttentionSpec& spec, const SequenceInput& in,
    const SequenceOutput& out)>;

absl::StatusOr<ExplainResult> Explain(const ExplainOptions& options,
                                      const ExplainStepper& stepper = {});
std::string FormatExplainText(const ExplainResult& result);
nlohmann::json ExplainJson(const ExplainResult& result);
// {"presets": [{"name", "keys"}], "feature_maps": [...], "defaults": {...}}
nlohmann::json ExplainOptionsJson();

// Shortest decimal that reads back as the same float ("5", "1.5", "0.3678794").
std::string FormatFloat(float value);

}  // namespace linattn

#endif  // LINATTN_CORE_ATTENTION_EXPLAINER_H_
