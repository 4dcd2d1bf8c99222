// `linattn explain`: the seed's interactive module as text or JSON.
//
// A 2-D query attends over a preset's keys and values through the real
// recurrent step (ε = 0, so a zero denominator shows as unavailable), and
// the result is set beside the quadratic-order reference and softmax
// attention. Presets (docs/design.md §3):
//   general:  q = [0.5, 1]; keys [1,0], [0,1], [1,1], [−0.5,0.5]; values 1, 2,
//   3, 0.5 negative: q = [−1, −0.5]; keys [−1,−2], [−0.5,−1], [−2,−0.5]; values
//   1, −1, 2
#ifndef LINATTN_CLIENTS_CLI_EXPLAIN_H_
#define LINATTN_CLIENTS_CLI_EXPLAIN_H_

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace linattn {

struct ExplainOptions {
  std::string preset = "general";    // general | negative
  std::string feature_map = "elu1";  // elu1 | relu
  std::optional<int> prefix;         // keys summed; default all
  std::string server;  // host:port: run the steps in a server session
};

struct ExplainResult {
  std::string preset;
  std::string feature_map;
  int prefix = 0;
  std::array<float, 2> q{};
  std::array<float, 2> phi_q{};
  std::vector<std::array<float, 2>> keys;
  std::vector<std::array<float, 2>> phi_keys;
  std::vector<float> values;
  std::array<float, 2> z{};  // Σ φ(k_i) over the prefix
  std::array<float, 2> s{};  // Σ φ(k_i)·v_i over the prefix
  float numerator = 0;       // φ(q)·S
  float denominator = 0;     // φ(q)·z
  bool available = false;
  float output = 0;  // numerator / denominator (when available)
  bool reference_available = false;
  float reference = 0;         // quadratic order: Σ w_i v_i / Σ w_i
  std::vector<float> weights;  // linear-attention weights φ(q)·φ(k_i)/den
  std::vector<float> softmax_weights;  // softmax(q·k_i) over the prefix
  float softmax_output = 0;
  std::string server;  // where the state was computed ("" = locally)
};

absl::StatusOr<ExplainResult> Explain(const ExplainOptions& options);
std::string FormatExplainText(const ExplainResult& result);
nlohmann::json ExplainJson(const ExplainResult& result);

// Shortest decimal that reads back as the same float ("5", "1.5", "0.3678794").
std::string FormatFloat(float value);

}  // namespace linattn

#endif  // LINATTN_CLIENTS_CLI_EXPLAIN_H_
