// model_benchmark: a model's serving numbers in this process, as JSON.
//
//   model_benchmark --model DIR [--prompts 1024,8192,32768]
//                   [--batches 1,8,32,128] [--decode-tokens 64]
//                   [--contexts 1000,100000] [--weights f32|bf16|int8]
//                   [--prefill-precision f32|bf16] [--session-groups N]
//                   [--out FILE]
//
//   time to first token   prefill of a random prompt of each length and the
//                         logits of its next token (ForwardRunner, one call,
//                         after one warm-up prefill of 512 tokens); the
//                         rule's chunkwise products in --prefill-precision
//                         (the server's flag of that name)
//   decode                tokens/s per session and in aggregate with B
//                         sessions stepped together (one batched forward
//                         per token: GEMMs over the batch, one StepBatch;
//                         a small model's step of 8 or more sessions per
//                         thread in groups of sessions, one per thread, as
//                         --session-groups and core/model/forward.h say)
//   products alone        per batch size, the same step's projections only
//                         (every layer's packed products, its type's own
//                         too, and the lm_head on b rows, nothing between
//                         them, one team over the rows): no step of b
//                         sessions in one team can be faster
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
//
//   model_benchmark --model DIR --loss-text FILE [--loss-window 256]
//                   [--weights f32|bf16|int8]
//
//   loss                  the text's loss in nats per byte: the text is
//                         encoded with the model's tokenizer and cut into
//                         windows of --loss-window tokens, each run from an
//                         empty state, every token after the first of a
//                         window predicted (tools/train_tiny.py's held-out
//                         loss). With bf16 or int8 weights the same windows
//                         also run on the model packed as f32, and the
//                         report holds both losses, the largest logit
//                         difference and how often their top tokens agree.
// bench/model_bench.py runs it beside the PyTorch reference.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <sstream>

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
// `steps` after two warm-up steps): each layer's packed products (its
// type's own too: rwkv7's and rwkv6's projections and LoRAs), then the
// lm_head, on random activations. A mixture of experts runs its router at b
// rows and its experts as evenly routed: min(E, b·k) experts at
// ⌈b·k / that⌉ rows each (a real step's routing is never more even).
double ProductsStep(const Model& model, uint32_t b, uint32_t steps) {
  std::vector<std::pair<const linattn::PackedLinear*, uint32_t>> chain;
  std::set<const linattn::PackedLinear*> expert_products;
  for (const Model::Layer& layer : model.layers()) {
    if (layer.experts == nullptr) continue;
    const uint64_t routed = uint64_t{b} * model.config().experts_per_token;
    const uint64_t used =
        std::min<uint64_t>(layer.experts->gate_up.size(), routed);
    const uint32_t rows = static_cast<uint32_t>((routed + used - 1) / used);
    for (uint64_t e = 0; e < layer.experts->gate_up.size(); ++e) {
      expert_products.insert(layer.experts->gate_up[e].get());
      expert_products.insert(layer.experts->down[e].get());
      if (e < used) {
        chain.emplace_back(layer.experts->gate_up[e].get(), rows);
        chain.emplace_back(layer.experts->down[e].get(), rows);
      }
    }
  }
  for (const auto* p : model.Projections()) {
    if (!expert_products.count(p)) chain.emplace_back(p, b);
  }
  int64_t widest = 0;
  for (const auto& [p, rows] : chain) {
    widest = std::max({widest, p->in(), p->out()});
  }
  const uint64_t floats =
      static_cast<uint64_t>(linattn::PackedLinear::Bucket(b) * widest);
  std::vector<float> x(floats), y(floats);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  std::vector<double> times;
  for (uint32_t s = 0; s < steps + 2; ++s) {
    const auto t0 = Clock::now();
    for (const auto& [p, rows] : chain) {
      Check(p->Apply(x.data(), rows, y.data()));
    }
    if (s >= 2) times.push_back(Seconds(t0, Clock::now()));
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Seconds per step of the state updates alone for `states` (median of
// `steps` after two warm-up steps): each recurrent layer's StepBatch over every
// session, on random unit-norm-ish q, k, v with the rule's gates and β (and
// rwkv7's a, b).
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
  // rwkv7's low-rank pair as RWKV-7 makes it: a = −κ̂, b = κ̂·a' with κ̂ a
  // unit vector per head and a' = ½.
  std::vector<float> low_a, low_b;
  if (linattn::HasLowRank(spec.rule)) {
    low_a = fill(b * H * dk, 1.0f);
    low_b.resize(low_a.size());
    for (uint64_t row = 0; row < b * H; ++row) {
      float* ar = low_a.data() + row * dk;
      float ss = 0;
      for (uint64_t i = 0; i < dk; ++i) ss += ar[i] * ar[i];
      const float inv = 1.0f / std::sqrt(ss);
      for (uint64_t i = 0; i < dk; ++i) {
        low_b[row * dk + i] = 0.5f * ar[i] * inv;
        ar[i] = -ar[i] * inv;
      }
    }
  }
  std::vector<float> out(b * H * dv), den(b * H);
  std::vector<uint8_t> available(b * H);
  std::vector<double> times;
  std::vector<linattn::StepItem> items(b);
  for (uint32_t s = 0; s < steps + 2; ++s) {
    const auto t0 = Clock::now();
    for (size_t l = 0; l < model.layers().size(); ++l) {
      // A hybrid's softmax-attention layers run no rule.
      if (model.config().attention_layer(l) != nullptr) continue;
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
                .beta =
                    linattn::HasBeta(spec.rule) ? beta.data() + i * H : nullptr,
                .a = low_a.empty() ? nullptr : low_a.data() + i * H * dk,
                .b = low_b.empty() ? nullptr : low_b.data() + i * H * dk},
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

void RunWindow(ForwardRunner& runner, const Model& model,
               std::span<const int32_t> tokens, std::vector<float>& all) {
  const uint32_t V = model.config().vocab_size;
  all.resize(tokens.size() * V);
  ModelState state = model.NewState();
  ForwardItem item{.state = &state, .tokens = tokens, .all_logits = all.data()};
  Check(runner.Run(std::span<const ForwardItem>(&item, 1)));
}

// −log softmax(row)[target], in double.
double Nats(const float* row, uint32_t V, int32_t target) {
  double top = row[0];
  for (uint32_t v = 1; v < V; ++v) top = std::max(top, double(row[v]));
  double sum = 0;
  for (uint32_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - top);
  return top + std::log(sum) - row[target];
}

uint32_t ArgMax(const float* row, uint32_t V) {
  return static_cast<uint32_t>(std::max_element(row, row + V) - row);
}

nlohmann::json Loss(const std::shared_ptr<const Model>& model,
                    const std::shared_ptr<const Model>& reference,
                    const std::string& path, uint32_t window) {
  std::ifstream in(path, std::ios::binary);
  if (!in) Check(absl::NotFoundError(path + ": cannot open"));
  std::stringstream text;
  text << in.rdbuf();
  auto tokens = model->tokenizer().Encode(text.str());
  Check(tokens.status());
  const uint32_t V = model->config().vocab_size;
  std::vector<uint64_t> bytes(V);
  for (uint32_t v = 0; v < V; ++v) {
    bytes[v] = model->tokenizer().TokenBytes(static_cast<int32_t>(v)).size();
  }
  ForwardRunner runner(model);
  std::unique_ptr<ForwardRunner> ref_runner;
  if (reference != nullptr)
    ref_runner = std::make_unique<ForwardRunner>(reference);
  double nats = 0, ref_nats = 0, max_diff = 0, max_logit = 0;
  uint64_t predicted = 0, nbytes = 0, agree = 0;
  std::vector<float> all, ref_all;
  const std::vector<int32_t>& t = *tokens;
  for (size_t s = 0; s + window < t.size(); s += window) {
    const std::span<const int32_t> piece(t.data() + s, window);
    RunWindow(runner, *model, piece, all);
    if (ref_runner != nullptr)
      RunWindow(*ref_runner, *reference, piece, ref_all);
    for (uint32_t i = 0; i < window; ++i) {
      const int32_t target = t[s + i + 1];
      const float* row = all.data() + uint64_t(i) * V;
      nats += Nats(row, V, target);
      nbytes += bytes[target];
      ++predicted;
      if (ref_runner == nullptr) continue;
      const float* ref = ref_all.data() + uint64_t(i) * V;
      ref_nats += Nats(ref, V, target);
      agree += ArgMax(row, V) == ArgMax(ref, V);
      for (uint32_t v = 0; v < V; ++v) {
        max_diff = std::max(max_diff, std::fabs(double(row[v]) - ref[v]));
        max_logit = std::max(max_logit, std::fabs(double(ref[v])));
      }
    }
  }
  if (predicted == 0 || nbytes == 0) {
    Check(absl::InvalidArgumentError(
        path + ": the text has fewer tokens than one window and one more"));
  }
  nlohmann::json loss = {{"text", path},
                         {"window", window},
                         {"predicted_tokens", predicted},
                         {"bytes", nbytes},
                         {"nats_per_byte", nats / nbytes}};
  if (ref_runner != nullptr) {
    loss["f32_nats_per_byte"] = ref_nats / nbytes;
    loss["max_abs_logit_diff"] = max_diff;
    loss["max_abs_f32_logit"] = max_logit;
    loss["top1_agreement"] = double(agree) / predicted;
  }
  return loss;
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
  app.add_option("--weights", weights,
                 "f32 | bf16 | int8 (packed projection weights)")
      ->capture_default_str();
  std::string prefill_precision = "f32";
  app.add_option("--prefill-precision", prefill_precision,
                 "f32 | bf16 (the rule's chunkwise products, as the server's "
                 "flag; bf16 needs AVX512_BF16 or AMX)")
      ->capture_default_str();
  uint32_t session_groups = 0;
  app.add_option("--session-groups", session_groups,
                 "groups a decode step of many sessions may run as (0: one "
                 "per thread, 1: never split)")
      ->capture_default_str();
  std::string loss_text;
  uint32_t loss_window = 256;
  app.add_option("--loss-text", loss_text,
                 "report the loss of this text (nats per byte) and stop");
  app.add_option("--loss-window", loss_window,
                 "tokens per window of --loss-text")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  auto weight_type = linattn::ParseWeightType(weights);
  Check(weight_type.status());
  auto precision = linattn::ParsePrefillPrecision(prefill_precision);
  Check(precision.status());
  Check(linattn::PrefillPrecisionSupported(*precision));
  auto model = Model::Load(dir, "", *weight_type);
  Check(model.status());
  const uint32_t V = (*model)->config().vocab_size;
  linattn::ForwardOptions forward_options;
  forward_options.chunkwise.precision = *precision;
  forward_options.session_groups = session_groups;
  ForwardRunner runner(*model, forward_options);
  nlohmann::json result;
  result["model"] = (*model)->name();
  result["weights"] = weights;
  result["prefill_precision"] = prefill_precision;
  result["parameters"] = (*model)->parameter_count();
  result["projection_bytes"] = (*model)->projection_bytes();
  result["layers"] = (*model)->config().num_hidden_layers;
  result["hidden_size"] = (*model)->config().hidden_size;
  result["state_bytes_per_session"] = (*model)->state_bytes();
  if (!loss_text.empty()) {
    std::shared_ptr<const Model> reference;
    if (*weight_type != linattn::WeightType::kF32) {
      auto f32 = Model::Load(dir);
      Check(f32.status());
      reference = *f32;
    }
    result["loss"] = Loss(*model, reference, loss_text, loss_window);
    std::cout << result.dump(2) << "\n";
    if (!out.empty()) std::ofstream(out) << result.dump(2) << "\n";
    return 0;
  }

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
