#include "clients/load/verify.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "clients/cli/remote.h"
#include "core/attention/chunkwise.h"
#include "core/attention/recurrent.h"
#include "core/attention/reference.h"
#include "core/attention/rule_bounds.h"
#include "core/session/snapshot.h"
#include "core/util/status_macros.h"

namespace linattn {

absl::Status VerifySessions(const LoadOptions& o, const AttentionSpec& spec,
                            const InputPool& pool,
                            const std::vector<SessionRecord>& records,
                            uint32_t verify, LoadSummary* summary) {
  const uint64_t qk = uint64_t(o.heads) * o.dim, vv = qk;
  // Recompute the sampled sessions locally. Decode-only sessions run the
  // same kernel as the server, so they must match bit for bit. After a
  // prefill the server's outputs carry fp32 rounding of the chunkwise
  // order:
  //  * linear rule: both sides are within e·Σ_j|w_j||v_j| of the truth,
  //    e = (3n + 2d_φ + 16)·u (tests/attention/test_util.h derives it), so
  //    the two are within twice that. For normalised read-outs
  //    Σ|w||v| / Σw ≤ max|v| = 1 here; unnormalised, the sum itself is
  //    computed by a second local pass over |v| (and |q|, |k| for
  //    identity, whose features are signed).
  //  * the gated, delta and RWKV rules: the server's outputs are held to
  //    the float64 recurrence (core/attention/reference.h) within the
  //    bound core/attention/rule_bounds.h derives for chunks of C.
  LINATTN_ASSIGN_OR_RETURN(Attention attention, Attention::Create(spec));
  const bool exact = o.prefill == 0;
  const uint64_t gg = pool.gg(), bb = pool.bb(), ab = pool.ab();
  const uint32_t C = ChunkwiseOptions{}.chunk_size;
  constexpr double u = 0x1.0p-24;
  auto run_local = [&](const SequenceInput& in, uint64_t prefix, uint64_t steps,
                       float* y) -> absl::Status {
    std::vector<float> den((prefix + steps) * o.heads);
    std::vector<uint8_t> avail((prefix + steps) * o.heads);
    AttentionState state = attention.NewState();
    if (prefix > 0) {
      SequenceInput head = in;
      head.tokens = prefix;
      ChunkwiseRunner runner;
      LINATTN_RETURN_IF_ERROR(
          runner.Run(attention, state, head, {y, den.data(), avail.data()}));
    }
    SequenceInput tail = TokenOf(spec, in, prefix);
    tail.tokens = steps;
    return StepSequence(attention, state, tail,
                        {y + prefix * vv, den.data() + prefix * o.heads,
                         avail.data() + prefix * o.heads});
  };
  for (uint32_t s = 0; s < verify; ++s) {
    const SessionRecord& rec = records[s];
    // A step applied without its answer has no output here.
    if (rec.steps_done == 0 || rec.gap) continue;
    const uint64_t prefix = rec.prefilled ? o.prefill : 0;
    // A continued session's earlier steps are recomputed too (step by step,
    // as the server ran them).
    const uint64_t total = prefix + rec.start + rec.steps_done;
    std::vector<float> q(total * qk), k(total * qk), v(total * vv),
        g(total * gg), beta(total * bb), a(total * ab), b(total * ab);
    for (uint64_t t = 0; t < total; ++t) {
      pool.Token(rec.index, t, &q[t * qk], &k[t * qk], &v[t * vv],
                 g.data() + t * gg, beta.data() + t * bb, a.data() + t * ab,
                 b.data() + t * ab);
    }
    SequenceInput in{q.data(), k.data(), v.data(), total};
    if (gg != 0) in.g = g.data();
    if (bb != 0) in.beta = beta.data();
    if (ab != 0) {
      in.a = a.data();
      in.b = b.data();
    }
    const uint64_t first = (prefix + rec.start) * vv;  // in y
    bool match = true;
    if (exact) {
      std::vector<float> y(total * vv);
      LINATTN_RETURN_IF_ERROR(
          run_local(in, prefix, rec.start + rec.steps_done, y.data()));
      match = std::memcmp(y.data() + first, rec.outputs.data(),
                          rec.outputs.size() * sizeof(float)) == 0;
    } else if (spec.rule != UpdateRule::kLinear) {
      const RuleReferenceResult ref = ReferenceRule(spec, in);
      const std::vector<double> bound = RuleOutputBounds(spec, in, ref, C);
      for (size_t i = 0; i < rec.outputs.size() && match; ++i) {
        match = std::abs(ref.output[first + i] - double(rec.outputs[i])) <=
                bound[first + i];
      }
    } else {
      std::vector<float> y(total * vv);
      LINATTN_RETURN_IF_ERROR(
          run_local(in, prefix, rec.start + rec.steps_done, y.data()));
      // Σ|w||v| per output (unnormalised), from a pass over magnitudes.
      std::vector<float> magnitude;
      auto abs_of = [](std::vector<float> x) {
        for (float& f : x) f = std::abs(f);
        return x;
      };
      if (spec.unnormalized) {
        const bool signed_features =
            spec.feature_map == FeatureMapKind::kIdentity;
        const std::vector<float> aq = signed_features ? abs_of(q) : q;
        const std::vector<float> ak = signed_features ? abs_of(k) : k;
        const std::vector<float> av = abs_of(v);
        SequenceInput abs_in = in;
        abs_in.q = aq.data();
        abs_in.k = ak.data();
        abs_in.v = av.data();
        magnitude.resize(total * vv);
        LINATTN_RETURN_IF_ERROR(run_local(
            abs_in, prefix, rec.start + rec.steps_done, magnitude.data()));
      }
      const double e = (3.0 * total + 2.0 * attention.feature_dim() + 16) * u;
      for (size_t i = 0; i < rec.outputs.size() && match; ++i) {
        const uint64_t at = first + i;
        // The magnitude pass is fp32 itself, within a relative error ≪ 1%
        // of the true sums: 1% covers it.
        const double bound =
            e * (magnitude.empty() ? 1.0 : 1.01 * magnitude[at]);
        match = std::abs(double(y[at]) - rec.outputs[i]) <= 2.0 * bound;
      }
    }
    ++summary->verified_sessions;
    if (!match) ++summary->mismatched_sessions;
  }
  return absl::OkStatus();
}

absl::Status WriteLedger(const LoadOptions& o,
                         const std::vector<SessionRecord>& records) {
  nlohmann::json ledger = nlohmann::json::object();
  if (std::ifstream in(o.ledger); in) {
    const std::string text((std::istreambuf_iterator<char>(in)),
                           std::istreambuf_iterator<char>());
    // An empty file (a fresh `mktemp`) is an empty ledger.
    if (text.find_first_not_of(" \t\r\n") != std::string::npos) {
      ledger = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    }
    if (!ledger.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--ledger: ", o.ledger, " is not a JSON object"));
    }
  }
  for (const SessionRecord& rec : records) {
    const uint64_t acknowledged = rec.start + rec.steps_done;
    const uint64_t before = ledger.value(rec.id, uint64_t{0});
    ledger[rec.id] = std::max(before, acknowledged);
  }
  std::ofstream out(o.ledger + ".tmp");
  out << ledger.dump(1) << "\n";
  out.close();
  if (!out || std::rename((o.ledger + ".tmp").c_str(), o.ledger.c_str())) {
    return absl::InternalError(
        absl::StrCat("--ledger: cannot write ", o.ledger));
  }
  return absl::OkStatus();
}

absl::StatusOr<LedgerCheck> CheckLedger(const LoadOptions& o) {
  if (o.ledger.empty()) {
    return absl::InvalidArgumentError("--check: needs --ledger FILE");
  }
  std::ifstream in(o.ledger);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("--ledger: cannot read ", o.ledger));
  }
  const nlohmann::json ledger =
      nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!ledger.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--ledger: ", o.ledger, " is not a JSON object"));
  }
  RemoteAttention remote(o.server, o.connection);
  LINATTN_ASSIGN_OR_RETURN(bool serving,
                           remote.Healthy("", std::chrono::seconds(30)));
  if (!serving)
    return absl::UnavailableError(absl::StrCat(o.server, " is not SERVING"));
  const uint64_t qk = uint64_t(o.heads) * o.dim, vv = qk;
  LINATTN_ASSIGN_OR_RETURN(const AttentionSpec spec, LoadSpec(o));
  const InputPool pool(o.seed, spec);
  LedgerCheck check;
  for (const auto& [id, value] : ledger.items()) {
    if (!value.is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ledger: the position of '", id, "' is not a whole number"));
    }
    const uint64_t acknowledged = value.get<uint64_t>();
    // Session i of the run is <prefix>-i: its inputs are row i's.
    const size_t dash = id.rfind('-');
    uint32_t index = 0;
    if (dash == std::string::npos ||
        !absl::SimpleAtoi(id.substr(dash + 1), &index)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--ledger: '", id, "' is not a <prefix>-<index> session id"));
    }
    ++check.sessions;
    check.acknowledged += acknowledged;
    auto blob = remote.Snapshot(id);
    if (!blob.ok()) {
      ++check.missing;
      check.problems.push_back(absl::StrCat(id, ": ", blob.status().ToString(),
                                            " (acknowledged position ",
                                            acknowledged, ")"));
      continue;
    }
    auto parsed = ParseSnapshot(*blob);
    if (!parsed.ok()) return parsed.status();
    const uint64_t position = parsed->state.position();
    check.recovered += position;
    if (position < acknowledged) {
      ++check.behind;
      check.problems.push_back(absl::StrCat(id, ": at position ", position,
                                            ", but steps up to ", acknowledged,
                                            " were acknowledged"));
      continue;
    }
    // The same steps, locally, one by one as the server decoded them.
    LINATTN_ASSIGN_OR_RETURN(Attention attention,
                             Attention::Create(parsed->spec));
    AttentionState state = attention.NewState();
    std::vector<float> q(qk), k(qk), v(vv), g(pool.gg()), beta(pool.bb()),
        a(pool.ab()), b(pool.ab()), y(vv), den(o.heads);
    std::vector<uint8_t> avail(o.heads);
    if (parsed->spec.num_heads != o.heads || parsed->spec.key_dim != o.dim ||
        parsed->spec.value_dim != o.dim) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--check: session '", id, "' has another shape than --heads/--dim"));
    }
    for (uint64_t t = 0; t < position; ++t) {
      pool.Token(index, t, q.data(), k.data(), v.data(), g.data(), beta.data(),
                 a.data(), b.data());
      SequenceInput token{q.data(), k.data(), v.data(), 1};
      if (!g.empty()) token.g = g.data();
      if (!beta.empty()) token.beta = beta.data();
      if (!a.empty()) {
        token.a = a.data();
        token.b = b.data();
      }
      LINATTN_RETURN_IF_ERROR(
          Step(attention, state, token, {y.data(), den.data(), avail.data()}));
    }
    if (state.size() != parsed->state.size() ||
        std::memcmp(state.data(), parsed->state.data(),
                    state.size() * sizeof(float)) != 0) {
      ++check.mismatched;
      check.problems.push_back(
          absl::StrCat(id, ": the state at position ", position,
                       " differs from the local recomputation"));
    }
  }
  return check;
}

std::string LedgerCheckText(const LedgerCheck& c) {
  std::string out;
  for (const std::string& p : c.problems) absl::StrAppend(&out, p, "\n");
  absl::StrAppend(
      &out,
      absl::StrFormat("checked %u sessions: %u missing, %u behind their "
                      "acknowledged position, %u with a state that differs; "
                      "positions: %llu acknowledged, %llu recovered\n%s\n",
                      c.sessions, c.missing, c.behind, c.mismatched,
                      static_cast<unsigned long long>(c.acknowledged),
                      static_cast<unsigned long long>(c.recovered),
                      c.ok() ? "OK" : "FAILED"));
  return out;
}

}  // namespace linattn
