// linattn-load's verifier without a server: sessions whose outputs are
// computed here as the server computes them pass, for every rule, decode
// only (bit for bit) and after a prefill (within the rule's bound); an
// output moved by one unit in the last place (decode only) or past its
// bound (after a prefill) fails.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "clients/load/inputs.h"
#include "clients/load/options.h"
#include "clients/load/report.h"
#include "clients/load/verify.h"
#include "core/attention/chunkwise.h"
#include "core/attention/recurrent.h"
#include "core/attention/reference.h"
#include "core/attention/rule_bounds.h"
#include "tests/attention/rule_bounds.h"

namespace linattn {
namespace {

using testing::RuleTokens;

// Session `index`'s first `total` inputs from the pool.
RuleTokens SessionTokens(const InputPool& pool, uint32_t index,
                         uint64_t total) {
  const uint64_t qk = pool.qk(), vv = pool.vv(), gg = pool.gg(), bb = pool.bb(),
                 ab = pool.ab();
  RuleTokens t;
  t.tokens = total;
  t.q.resize(total * qk);
  t.k.resize(total * qk);
  t.v.resize(total * vv);
  t.g.resize(total * gg);
  t.beta.resize(total * bb);
  t.a.resize(total * ab);
  t.b.resize(total * ab);
  for (uint64_t i = 0; i < total; ++i) {
    pool.Token(index, i, &t.q[i * qk], &t.k[i * qk], &t.v[i * vv],
               t.g.data() + i * gg, t.beta.data() + i * bb, t.a.data() + i * ab,
               t.b.data() + i * ab);
  }
  return t;
}

// Session `index`'s outputs for its first `prefill` tokens prefilled and
// `steps` decoded, as the server computes them: its steps' outputs.
std::vector<float> ServerOutputs(const AttentionSpec& spec,
                                 const InputPool& pool, uint32_t index,
                                 uint64_t prefill, uint64_t steps) {
  const uint64_t total = prefill + steps, vv = pool.vv();
  const RuleTokens t = SessionTokens(pool, index, total);
  const SequenceInput in = t.input();
  const Attention attention = *Attention::Create(spec);
  AttentionState state = attention.NewState();
  std::vector<float> y(total * vv), den(total * spec.num_heads);
  std::vector<uint8_t> avail(total * spec.num_heads);
  if (prefill > 0) {
    SequenceInput head = in;
    head.tokens = prefill;
    ChunkwiseRunner runner;
    EXPECT_TRUE(
        runner.Run(attention, state, head, {y.data(), den.data(), avail.data()})
            .ok());
  }
  SequenceInput tail = TokenOf(spec, in, prefill);
  tail.tokens = steps;
  EXPECT_TRUE(StepSequence(attention, state, tail,
                           {y.data() + prefill * vv,
                            den.data() + prefill * spec.num_heads,
                            avail.data() + prefill * spec.num_heads})
                  .ok());
  return {y.begin() + prefill * vv, y.end()};
}

TEST(LoadVerify, EveryRulePassesAndAMovedOutputFails) {
  for (const std::string rule :
       {"linear", "gated", "delta", "gated_delta", "rwkv7", "rwkv6"}) {
    for (const uint32_t prefill : {0u, 150u}) {
      SCOPED_TRACE(rule + " prefill " + std::to_string(prefill));
      LoadOptions o;
      o.rule = rule;
      o.heads = 2;
      o.dim = rule == "rwkv7" ? 64 : 16;  // rwkv7 at the load's default width
      o.sessions = 3;
      o.steps = 20;
      o.prefill = prefill;
      const absl::StatusOr<AttentionSpec> spec = LoadSpec(o);
      ASSERT_TRUE(spec.ok()) << spec.status();
      const InputPool pool(o.seed, *spec);
      std::vector<SessionRecord> records(o.sessions);
      for (uint32_t s = 0; s < o.sessions; ++s) {
        records[s].index = s;
        records[s].steps_done = o.steps;
        records[s].prefilled = prefill > 0;
        records[s].outputs = ServerOutputs(*spec, pool, s, prefill, o.steps);
      }
      LoadSummary summary;
      ASSERT_TRUE(
          VerifySessions(o, *spec, pool, records, o.sessions, &summary).ok());
      EXPECT_EQ(summary.verified_sessions, 3u);
      EXPECT_EQ(summary.mismatched_sessions, 0u);

      // Session 1's 7th output moved: one unit in the last place where the
      // check is bit for bit; after a prefill, 1e-3 of the outputs' scale
      // for the linear rule (its bound is ~1e-5 of it at these lengths),
      // and for the others to twice the derived bound of that entry past
      // the float64 reference, the bound itself a small part of the scale
      // (the bounds grow with the tokens: ~1e-2 of it for the delta rules
      // here).
      const uint64_t entry = 7 * uint64_t{o.dim} + 3;
      float& x = records[1].outputs[entry];
      double scale = 0;
      for (float y : records[1].outputs) {
        scale = std::max(scale, double(std::abs(y)));
      }
      if (prefill == 0) {
        x = std::nextafter(x, 1e30f);
      } else if (rule == "linear") {
        x += static_cast<float>(1e-3 * scale);
      } else {
        const RuleTokens t = SessionTokens(pool, 1, prefill + o.steps);
        const RuleReferenceResult ref = ReferenceRule(*spec, t.input());
        const std::vector<double> bound = RuleOutputBounds(
            *spec, t.input(), ref, ChunkwiseOptions{}.chunk_size);
        const uint64_t at = prefill * pool.vv() + entry;
        EXPECT_LT(bound[at], 0.05 * scale);
        x = static_cast<float>(ref.output[at] + 2 * bound[at]);
      }
      LoadSummary moved;
      ASSERT_TRUE(
          VerifySessions(o, *spec, pool, records, o.sessions, &moved).ok());
      EXPECT_EQ(moved.verified_sessions, 3u);
      EXPECT_EQ(moved.mismatched_sessions, 1u);
    }
  }
}

}  // namespace
}  // namespace linattn
