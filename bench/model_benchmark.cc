// model_benchmark: a model's serving numbers in this process, as JSON.
//
//   model_benchmark --model DIR [--prompts 1024,8192,32768]
//                   [--batches 1,8,32,128] [--decode-tokens 64]
//                   [--contexts 1000,100000] [--weights f32|bf16] [--out FILE]
//
//   time to first token   prefill of a random prompt of each length and the
//                         logits of its next token (ForwardRunner, one call,
//                         after one warm-up prefill of 512 tokens)
//   decode                tokens/s per session and in aggregate with B
//                         sessions stepped together (one batched forward
//                         per token: GEMMs over the batch, one StepBatch)
//   products alone        per batch size, the same step's projections only
//                         (every layer's packed products and the lm_head
//                         on b rows, nothing between them): no step of b
//                         sessions can be faster
//   rule alone            per batch size, the same step's state updates
//                         only (one StepBatch per layer over the b
//                         sessions' states, random inputs): the step's
//                         reads and writes of every session's state.
//                         Products and rule run one after the other in a
//                         step, so 32 × (batch-1 step) / (products + rule
//                         at 32) bounds what batching can give over batch
//                         1 on this machine
//   flatness              decode time per token of one session whose
//                         context is each of --contexts tokens long (the
//                         contexts timed in turn, the fastest of 3 rounds)
//   state                 bytes of state per session
// bench/model_bench.py runs it beside the PyTorch reference.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>

#include "CLI/CLI.hpp"
#include "core/attention/recurrent.h"
#include "core/model/forward.h"
#include "core/onednn/linear.h"
#include "nlohmann/json.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using linattn::ForwardItem;
using linattn::ForwardRunner;
using linattn::Model;
using linattn::ModelState;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::vector<int32_t> RandomTokens(size_t n, uint32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::cerr << "model_benchmark: " << s << "\n";
    std::exit(1);
  }
}

// Seconds per decode step of `states.size()` sessions together (median of
// `steps` steps after two warm-up steps).
double DecodeStep(ForwardRunner& runner, std::vector<ModelState>& states,
                  uint32_t steps, uint32_t vocab) {
  const size_t b = states.size();
  std::vector<int32_t> tokens = RandomTokens(b, vocab, 7);
  std::vector<float> logits(b * vocab);
  std::vector<ForwardItem> items(b);
  std::vector<double> times;
  for (uint32_t s = 0; s < steps + 2; ++s) {
    for (size_t i = 0; i < b; ++i) {
      items[i] = ForwardItem{.state = &states[i],
                             .tokens = std::span<const int32_t>(&tokens[i], 1),
                             .logits = logits.data() + i * vocab};
    }
    const auto t0 = Clock::now();
    Check(runner.Run(items));
    // The next token: greedy, as a server would sample it.
    for (size_t i = 0; i < b; ++i) {
      const float* l = logits.data() + i * vocab;
      tokens[i] = static_cast<int32_t>(std::max_element(l, l + vocab) - l);
    }
    if (s >= 2) times.push_back(Seconds(t0, Clock::now()));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Seconds per step of the model's projections alone at b rows (median of
// `steps` after two warm-up steps): each layer's packed products in the
// order a step runs them, then the lm_head, on random activations.
double ProductsStep(const Model& model, uint32_t b, uint32_t steps) {
  std::vector<const linattn::PackedLinear*> chain;
  for (const Model::Layer& layer : model.layers()) {
    for (const auto* p : {layer.qkv.get(), layer.in_proj.get(), layer.o.get(),
                          layer.gate_up.get(), layer.down.get()}) {
      if (p != nullptr) chain.push_back(p);
    }
  }
  chain.push_back(&model.lm_head());
  int64_t widest = 0;
  for (const auto* p : chain) widest = std::max({widest, p->in(), p->out()});
  const uint64_t floats =
      static_cast<uint64_t>(linattn::PackedLinear::Bucket(b) * widest);
  std::vector<float> x(floats), y(floats);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  std::vector<double> times;
  for (uint32_t s = 0; s < steps + 2; ++s) {
    const auto t0 = Clock::now();
    for (const auto* p : chain) Check(p->Apply(x.data(), b, y.data()));
    if (s >= 2) times.push_back(Seconds(t0, Clock::now()));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Seconds per step of the state updates alone for `states` (median of
// `steps` after two warm-up steps): each layer's StepBatch over every
// session, on random unit-norm-ish q, k, v with the rule's gates and β.
double RuleStep(const Model& model, std::vector<ModelState>& states,
                uint32_t steps) {
  const linattn::Attention& attention = model.attention();
  const linattn::AttentionSpec& spec = attention.spec();
  const uint64_t b = states.size(), H = spec.num_heads, dk = spec.key_dim,
                 dv = spec.value_dim, G = linattn::GatesPerHead(spec);
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  auto fill = [&](uint64_t n, float scale) {
    std::vector<float> x(n);
    for (float& v : x) v = scale * normal(rng);
    return x;
  };
  const auto q = fill(b * H * dk, 0.125f), k = fill(b * H * dk, 0.125f),
             v = fill(b * H * dv, 1.0f);
  const std::vector<float> g(b * H * G, -0.05f), beta(b * H, 0.5f);
  std::vector<float> out(b * H * dv), den(b * H);
  std::vector<uint8_t> available(b * H);
  std::vector<double> times;
  std::vector<linattn::StepItem> items(b);
  for (uint32_t s = 0; s < steps + 2; ++s) {
    const auto t0 = Clock::now();
    for (size_t l = 0; l < model.layers().size(); ++l) {
      for (uint64_t i = 0; i < b; ++i) {
        items[i] = linattn::StepItem{
            &attention, &states[i].layers()[l],
            linattn::SequenceInput{
                .q = q.data() + i * H * dk,
                .k = k.data() + i * H * dk,
                .v = v.data() + i * H * dv,
                .tokens = 1,
                .g = linattn::HasGates(spec.rule) ? g.data() + i * H * G
                                                  : nullptr,
                .beta = linattn::HasBeta(spec.rule) ? beta.data() + i * H
                                                    : nullptr},
            linattn::SequenceOutput{out.data() + i * H * dv, den.data() + i * H,
                                    available.data() + i * H}};
      }
      Check(linattn::StepBatch(items));
    }
    if (s >= 2) times.push_back(Seconds(t0, Clock::now()));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"model_benchmark: time to first token, decode speed, state"};
  std::string dir, out;
  std::vector<uint64_t> prompts = {1024, 8192, 32768};
  std::vector<uint32_t> batches = {1, 8, 32, 128};
  std::vector<uint64_t> contexts = {1000, 100000};
  uint32_t decode_tokens = 64;
  app.add_option("--model", dir, "model directory")->required();
  app.add_option("--prompts", prompts, "prompt lengths for time to first token")
      ->delimiter(',');
  app.add_option("--batches", batches, "concurrent sessions")->delimiter(',');
  app.add_option("--contexts", contexts, "context lengths for flatness")
      ->delimiter(',');
  app.add_option("--decode-tokens", decode_tokens, "steps per measurement");
  app.add_option("--out", out, "write the JSON here too");
  std::string weights = "f32";
  app.add_option("--weights", weights, "f32 | bf16 (packed projection weights)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto weight_type = linattn::ParseWeightType(weights);
  Check(weight_type.status());
  auto model = Model::Load(dir, "", *weight_type);
  Check(model.status());
  const uint32_t V = (*model)->config().vocab_size;
  ForwardRunner runner(*model);
  nlohmann::json result;
  result["model"] = (*model)->name();
  result["weights"] = weights;
  result["parameters"] = (*model)->parameter_count();
  result["layers"] = (*model)->config().num_hidden_layers;
  result["hidden_size"] = (*model)->config().hidden_size;
  result["state_bytes_per_session"] = (*model)->state_bytes();

  std::vector<float> logits(V);
  {
    // Warm-up: the first call allocates the runner's workspaces and touches
    // the weights; a server pays that once, not per request.
    ModelState warm = (*model)->NewState();
    Check(runner.Run(warm, RandomTokens(512, V, 7), logits.data()));
    Check(runner.Run(warm, RandomTokens(1, V, 8), logits.data()));
  }
  for (uint64_t p : prompts) {
    ModelState state = (*model)->NewState();
    const auto tokens = RandomTokens(p, V, 1);
    const auto t0 = Clock::now();
    Check(runner.Run(state, tokens, logits.data()));
    const double s = Seconds(t0, Clock::now());
    result["ttft"].push_back({{"prompt_tokens", p},
                              {"seconds", s},
                              {"prefill_tokens_per_s", p / s}});
    std::cerr << "ttft " << p << " tokens: " << s * 1e3 << " ms\n";
  }
  for (uint32_t b : batches) {
    std::vector<ModelState> states;
    for (uint32_t i = 0; i < b; ++i) {
      states.push_back((*model)->NewState());
      const auto prompt = RandomTokens(16, V, 100 + i);
      Check(runner.Run(states.back(), prompt, nullptr));
    }
    const double step = DecodeStep(runner, states, decode_tokens, V);
    const double products = ProductsStep(**model, b, decode_tokens);
    const double rule = RuleStep(**model, states, decode_tokens);
    result["decode"].push_back({{"batch", b},
                                {"step_seconds", step},
                                {"products_step_seconds", products},
                                {"rule_step_seconds", rule},
                                {"tokens_per_s_per_session", 1.0 / step},
                                {"aggregate_tokens_per_s", b / step}});
    std::cerr << "decode batch " << b << ": " << b / step << " tokens/s\n";
  }
  // Each context's session is prefilled first; then the contexts' decode
  // steps are timed in turn, three rounds, the fastest round counting for
  // each (a shared machine's speed drifts over the long prefills).
  std::vector<std::vector<ModelState>> at_context;
  for (uint64_t c : contexts) {
    at_context.emplace_back();
    at_context.back().push_back((*model)->NewState());
    const auto context = RandomTokens(c, V, 3);
    Check(runner.Run(at_context.back()[0], context, nullptr));
  }
  std::vector<double> best(contexts.size(), 1e300);
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < contexts.size(); ++i) {
      best[i] = std::min(best[i],
                         DecodeStep(runner, at_context[i], decode_tokens, V));
    }
  }
  for (size_t i = 0; i < contexts.size(); ++i) {
    result["flatness"].push_back(
        {{"context_tokens", contexts[i]}, {"decode_step_seconds", best[i]}});
    std::cerr << "decode at context " << contexts[i] << ": " << best[i] * 1e3
              << " ms\n";
  }
  const std::string text = result.dump(2);
  std::cout << text << "\n";
  if (!out.empty()) std::ofstream(out) << text << "\n";
  return 0;
}
