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
  // prefill, both sides carry fp32 rounding of the chunkwise order, each
  // within a bound of the truth (tests/attention/test_util.h and
  // rule_bounds.h derive them), so the two are within twice that:
  //  * linear rule: e·Σ_j|w_j||v_j|, e = (3n + 2d_φ + 16)·u. For normalised
  //    read-outs Σ|w||v| / Σw ≤ max|v| = 1 here; unnormalised, the sum
  //    itself is computed by a second local pass over |v| (and |q|, |k| for
  //    identity, whose features are signed).
  //  * gated rule: u·((4n + 2d_k + 2C + 32)·N + 4·N_g), N the same pass
  //    over |q|, |k|, |v| with the session's gates, N_g ≤ that pass with
  //    open gates (each term's L·e^{−L} ≤ 1).
  //  * delta rules (L2-normalised keys, β ≤ 1, α ≤ 1: no step grows an
  //    error): ‖q‖·Δ_t + (2d_k + 8)·u·‖q‖‖S_t‖ with Δ_t = Δ_{t−1} +
  //    u·(4(d_k + C) + 16 + 4·B_t)·(2‖S_{t−1}‖ + β‖v‖), the norms taken from
  //    a local token-by-token pass.
  LINATTN_ASSIGN_OR_RETURN(Attention attention, Attention::Create(spec));
  const bool exact = o.prefill == 0;
  const uint64_t gg = pool.gg(), bb = pool.bb();
  const uint64_t C = ChunkwiseOptions{}.chunk_size;
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
  // The delta rules' bound per output row (t, h), from a local pass.
  auto delta_bounds = [&](const SequenceInput& in, uint64_t total,
                          std::vector<double>* bound) -> absl::Status {
    AttentionState state = attention.NewState();
    std::vector<float> y(vv), den(o.heads);
    std::vector<uint8_t> avail(o.heads);
    std::vector<double> error(o.heads, 0.0), norm(o.heads, 0.0),
        window(o.heads, 0.0);
    bound->assign(total * o.heads, 0.0);
    for (uint64_t t = 0; t < total; ++t) {
      const SequenceInput token = TokenOf(spec, in, t);
      LINATTN_RETURN_IF_ERROR(
          Step(attention, state, token, {y.data(), den.data(), avail.data()}));
      for (uint32_t h = 0; h < o.heads; ++h) {
        if (token.g != nullptr) {
          window[h] += std::abs(double(token.g[h]));
          if (t >= C)
            window[h] -= std::abs(double(in.g[(t - C) * o.heads + h]));
        }
        double v_norm = 0, s_norm = 0;
        for (uint32_t c = 0; c < o.dim; ++c) {
          v_norm += double(token.v[h * o.dim + c]) * token.v[h * o.dim + c];
        }
        const float* sh = state.s(h);
        for (uint64_t e = 0; e < uint64_t{o.dim} * o.dim; ++e) {
          s_norm += double(sh[e]) * sh[e];
        }
        const double kappa =
            4.0 * (o.dim + C) + 16 + 4 * std::max(window[h], 0.0);
        error[h] +=
            u * kappa * (2 * norm[h] + token.beta[h] * std::sqrt(v_norm));
        norm[h] = std::sqrt(s_norm);
        // ‖q‖ ≤ 1: L2-normalised, scale 1.
        (*bound)[t * o.heads + h] = error[h] + (2.0 * o.dim + 8) * u * norm[h];
      }
    }
    return absl::OkStatus();
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
        g(total * gg), beta(total * bb);
    for (uint64_t t = 0; t < total; ++t) {
      pool.Token(rec.index, t, &q[t * qk], &k[t * qk], &v[t * vv],
                 g.data() + t * gg, beta.data() + t * bb);
    }
    SequenceInput in{q.data(), k.data(), v.data(), total};
    if (gg != 0) in.g = g.data();
    if (bb != 0) in.beta = beta.data();
    std::vector<float> y(total * vv);
    LINATTN_RETURN_IF_ERROR(
        run_local(in, prefix, rec.start + rec.steps_done, y.data()));
    // Σ|w||v| per output (linear, unnormalised; gated: N and the open-gate
    // pass), or the delta rules' bound per row.
    std::vector<float> magnitude, open_magnitude;
    std::vector<double> row_bound;
    auto abs_of = [](std::vector<float> x) {
      for (float& f : x) f = std::abs(f);
      return x;
    };
    if (!exact && HasBeta(spec.rule)) {
      LINATTN_RETURN_IF_ERROR(delta_bounds(in, total, &row_bound));
    } else if (!exact && spec.unnormalized) {
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
      if (gg != 0) {
        const std::vector<float> open(g.size(), 0.0f);
        abs_in.g = open.data();
        open_magnitude.resize(total * vv);
        LINATTN_RETURN_IF_ERROR(run_local(
            abs_in, prefix, rec.start + rec.steps_done, open_magnitude.data()));
      }
    }
    const float* expected = y.data() + (prefix + rec.start) * vv;
    bool match = true;
    if (exact) {
      match = std::memcmp(expected, rec.outputs.data(),
                          rec.outputs.size() * sizeof(float)) == 0;
    } else {
      for (size_t i = 0; i < rec.outputs.size() && match; ++i) {
        const uint64_t at = (prefix + rec.start) * vv + i;  // in y
        const double n = double(at / vv + 1);               // tokens seen
        double bound;
        // The magnitude passes are fp32 themselves, within a relative
        // error ≪ 1% of the true sums: 1% covers them.
        if (!row_bound.empty()) {
          bound = 1.01 * row_bound[at / o.dim] +
                  2 * u * std::abs(double(expected[i]));
        } else if (!open_magnitude.empty()) {
          bound = 1.01 * u *
                  ((4 * n + 2.0 * o.dim + 2.0 * C + 32) * magnitude[at] +
                   4 * open_magnitude[at]);
        } else {
          const double e =
              (3.0 * total + 2.0 * attention.feature_dim() + 16) * u;
          bound = e * (magnitude.empty() ? 1.0 : 1.01 * magnitude[at]);
        }
        match = std::abs(double(expected[i]) - rec.outputs[i]) <= 2.0 * bound;
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
        y(vv), den(o.heads);
    std::vector<uint8_t> avail(o.heads);
    if (parsed->spec.num_heads != o.heads || parsed->spec.key_dim != o.dim ||
        parsed->spec.value_dim != o.dim) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--check: session '", id, "' has another shape than --heads/--dim"));
    }
    for (uint64_t t = 0; t < position; ++t) {
      pool.Token(index, t, q.data(), k.data(), v.data(), g.data(), beta.data());
      SequenceInput token{q.data(), k.data(), v.data(), 1};
      if (!g.empty()) token.g = g.data();
      if (!beta.empty()) token.beta = beta.data();
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
