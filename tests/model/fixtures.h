// The model fixtures written by tests/python/make_model_fixtures.py (a
// ctest fixture runs it before these tests): random fla-layout models, token
// sequences and the PyTorch reference logits, in LINATTN_MODEL_FIXTURES.
#ifndef LINATTN_TESTS_MODEL_FIXTURES_H_
#define LINATTN_TESTS_MODEL_FIXTURES_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/model/config.h"

namespace linattn::testing {

inline std::string FixtureRoot() {
  const char* dir = std::getenv("LINATTN_MODEL_FIXTURES");
  return dir == nullptr ? "" : dir;
}

struct FixtureCase {
  std::string name;
  std::string dir;
  std::vector<int32_t> tokens;
  std::vector<double> logits;  // tokens × vocab
};

inline std::vector<std::string> FixtureNames() {
  std::vector<std::string> names;
  const std::string root = FixtureRoot();
  if (root.empty() || !std::filesystem::exists(root)) return names;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    if (std::filesystem::exists(entry.path() / "logits.f64")) {
      names.push_back(entry.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

inline FixtureCase LoadFixture(const std::string& name) {
  FixtureCase c;
  c.name = name;
  c.dir = FixtureRoot() + "/" + name;
  std::ifstream tokens(c.dir + "/tokens.txt");
  for (int32_t t; tokens >> t;) c.tokens.push_back(t);
  std::ifstream logits(c.dir + "/logits.f64", std::ios::binary);
  logits.seekg(0, std::ios::end);
  const size_t n = static_cast<size_t>(logits.tellg()) / sizeof(double);
  logits.seekg(0);
  c.logits.resize(n);
  logits.read(reinterpret_cast<char*>(c.logits.data()), n * sizeof(double));
  return c;
}

// How far an fp32 forward may be from the exact logits. Each logit is the
// end of a chain of dependent fp32 accumulations: per layer the q/k/v and
// gate/up products (hidden terms), o_proj (value_dim), down (intermediate)
// and the attention sums over up to T tokens of d_φ-long products, then the
// lm_head (hidden). The gated and delta-rule types add each layer's short
// convolution (W terms); their rules carry earlier errors without growth:
// gates are ≤ 1, and the delta rules' I − βkkᵀ has norm ≤ 1 for β ∈ [0, 2]
// and ‖k‖₂ ≤ 1 (L2-normalised keys, or non-negative keys divided by their
// sum). A mixture of experts adds its router's and its experts' products
// (hidden, then expert_size terms). First-order rounding analysis bounds the
// error of such a chain by n·u times the magnitudes it carries (u = 2⁻²⁴); the
// magnitudes are those of the logits (≥ 1: the normalised stream has unit RMS).
inline double LogitTolerance(const ModelConfig& c, size_t tokens,
                             double max_abs_logit) {
  const double u = std::ldexp(1.0, -24);
  const double chain =
      double(c.num_hidden_layers) *
          (2.0 * c.hidden_size + c.value_dim() + c.intermediate_size +
           double(tokens) + c.feature_dim() + c.conv_size +
           (c.num_experts > 0 ? c.hidden_size + c.expert_size : 0)) +
      c.hidden_size;
  return chain * u * std::max(1.0, max_abs_logit);
}

}  // namespace linattn::testing

#endif  // LINATTN_TESTS_MODEL_FIXTURES_H_
