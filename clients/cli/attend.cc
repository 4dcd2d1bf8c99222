#include "clients/cli/attend.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "clients/cli/npy.h"
#include "clients/cli/remote.h"
#include "core/attention/attention.h"
#include "core/attention/chunkwise.h"
#include "core/attention/quadratic.h"
#include "core/attention/recurrent.h"
#include "core/util/status_macros.h"

namespace linattn {

namespace {

absl::Status CheckRank3(const NpyArray& a, const std::string& flag) {
  if (a.shape.size() != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected shape (T, H, d), got (",
                     absl::StrJoin(a.shape, ", "), ")"));
  }
  return absl::OkStatus();
}

// Reads a rule's per-token input from `path` when the rule takes it (shape
// (T, H) for one value per head, (T, H, width) otherwise), and refuses one
// the rule does not take.
absl::Status ReadRuleInput(const std::string& path, const std::string& flag,
                           bool taken, std::vector<int64_t> rows,
                           uint32_t width, NpyArray* out) {
  if (!taken) {
    if (!path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": this rule takes no such input"));
    }
    return absl::OkStatus();
  }
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": required by this rule"));
  }
  LINATTN_ASSIGN_OR_RETURN(*out, ReadNpy(path));
  std::vector<int64_t> want = rows;
  if (width > 1) want.push_back(width);
  if (out->shape != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected shape (", absl::StrJoin(want, ", "),
                     "), got (", absl::StrJoin(out->shape, ", "), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Attend(const AttendOptions& o) {
  LINATTN_ASSIGN_OR_RETURN(NpyArray q, ReadNpy(o.q_path));
  LINATTN_ASSIGN_OR_RETURN(NpyArray k, ReadNpy(o.k_path));
  LINATTN_ASSIGN_OR_RETURN(NpyArray v, ReadNpy(o.v_path));
  LINATTN_RETURN_IF_ERROR(CheckRank3(q, "--q"));
  LINATTN_RETURN_IF_ERROR(CheckRank3(k, "--k"));
  LINATTN_RETURN_IF_ERROR(CheckRank3(v, "--v"));
  if (k.shape != q.shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--k: shape (", absl::StrJoin(k.shape, ", "), ") differs from --q's (",
        absl::StrJoin(q.shape, ", "), ")"));
  }
  if (v.shape[0] != q.shape[0] || v.shape[1] != q.shape[1]) {
    return absl::InvalidArgumentError(
        absl::StrCat("--v: shape (", absl::StrJoin(v.shape, ", "),
                     ") must share T and H with --q's (",
                     absl::StrJoin(q.shape, ", "), ")"));
  }
  const int64_t T = q.shape[0], H = q.shape[1];
  if (H > kMaxDim || q.shape[2] > kMaxDim || v.shape[2] > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("--q/--v: dimensions above ", kMaxDim));
  }
  AttentionSpec spec;
  spec.num_heads = static_cast<uint32_t>(H);
  spec.key_dim = static_cast<uint32_t>(q.shape[2]);
  spec.value_dim = static_cast<uint32_t>(v.shape[2]);
  LINATTN_ASSIGN_OR_RETURN(spec.rule, ParseUpdateRule(o.rule));
  const bool linear = spec.rule == UpdateRule::kLinear;
  // rwkv7 and rwkv6 decay each key channel: their only gate shape, the
  // default.
  if (spec.rule == UpdateRule::kRwkv7 || spec.rule == UpdateRule::kRwkv6) {
    spec.gate = GateShape::kKey;
  }
  // rwkv6's bonus u, (H, d_k): a constant of the spec.
  {
    NpyArray bonus;
    LINATTN_RETURN_IF_ERROR(ReadRuleInput(o.bonus_path, "--bonus",
                                          spec.rule == UpdateRule::kRwkv6, {H},
                                          spec.key_dim, &bonus));
    spec.bonus = std::move(bonus.data);
  }
  if (!o.gate.empty()) {
    LINATTN_ASSIGN_OR_RETURN(spec.gate, ParseGateShape(o.gate));
  }
  spec.qk_l2norm = o.qk_l2norm;
  spec.scale = o.scale;
  LINATTN_ASSIGN_OR_RETURN(
      spec.feature_map, ParseFeatureMap(!o.feature_map.empty() ? o.feature_map
                                        : linear               ? "elu1"
                                                               : "identity"));
  spec.unnormalized = o.unnormalized || !linear;
  spec.epsilon = o.epsilon.value_or(0.0f);
  if (o.decay.size() == 1) {
    spec.decay.assign(spec.num_heads, o.decay[0]);
  } else {
    spec.decay = o.decay;
  }
  spec.feature_dim = o.feature_dim;
  spec.seed = o.seed;
  spec.horizon = o.horizon;
  if (spec.feature_map == FeatureMapKind::kCosine && spec.horizon == 0) {
    spec.horizon = static_cast<uint32_t>(std::max<int64_t>(T, 1));
  }
  LINATTN_ASSIGN_OR_RETURN(Attention attention, Attention::Create(spec));
  // The rule's per-token inputs.
  NpyArray g, beta, a, b;
  LINATTN_RETURN_IF_ERROR(ReadRuleInput(o.g_path, "--g", HasGates(spec.rule),
                                        {T, H}, GatesPerHead(spec), &g));
  LINATTN_RETURN_IF_ERROR(ReadRuleInput(o.beta_path, "--beta",
                                        HasBeta(spec.rule), {T, H}, 1, &beta));
  LINATTN_RETURN_IF_ERROR(ReadRuleInput(o.a_path, "--a", HasLowRank(spec.rule),
                                        {T, H}, spec.key_dim, &a));
  LINATTN_RETURN_IF_ERROR(ReadRuleInput(o.b_path, "--b", HasLowRank(spec.rule),
                                        {T, H}, spec.key_dim, &b));

  std::vector<float> y(uint64_t(T) * H * spec.value_dim), den(uint64_t(T) * H);
  std::vector<uint8_t> available(uint64_t(T) * H);
  SequenceInput in{q.data.data(), k.data.data(), v.data.data(), uint64_t(T)};
  if (!g.data.empty()) in.g = g.data.data();
  if (!beta.data.empty()) in.beta = beta.data.data();
  if (!a.data.empty()) in.a = a.data.data();
  if (!b.data.empty()) in.b = b.data.data();
  SequenceOutput out{y.data(), den.data(), available.data()};
  const std::string mode =
      !o.mode.empty() ? o.mode : (o.server.empty() ? "chunkwise" : "prefill");
  const bool remote_mode = mode == "decode" || mode == "prefill";
  if (remote_mode && o.server.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--mode ", mode, ": runs in a server session; give --server ADDR"));
  }
  if (!remote_mode && !o.server.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--mode ", mode,
        ": computes locally; with --server use decode or prefill"));
  }
  if (remote_mode) {
    RemoteAttention remote(o.server, o.connection);
    LINATTN_ASSIGN_OR_RETURN(v1::Session session,
                             remote.CreateSession(spec, o.epsilon));
    // Requests of ≤ 16 MiB, well inside the server's default message limit.
    const uint64_t token_bytes =
        4ull * spec.num_heads * (2 * spec.key_dim + spec.value_dim);
    const uint64_t max_tokens =
        std::max<uint64_t>(1, (16u << 20) / token_bytes);
    absl::Status s =
        mode == "decode"
            ? remote.Decode(session.session_id(), spec, in, out)
            : remote.Prefill(session.session_id(), spec, in, out, max_tokens);
    (void)remote.DeleteSession(session.session_id());
    LINATTN_RETURN_IF_ERROR(s);
  } else {
    AttentionState state = attention.NewState();
    if (mode == "recurrent") {
      LINATTN_RETURN_IF_ERROR(StepSequence(attention, state, in, out));
    } else if (mode == "chunkwise") {
      ChunkwiseRunner runner({.chunk_size = o.chunk});
      LINATTN_RETURN_IF_ERROR(runner.Run(attention, state, in, out));
    } else if (mode == "quadratic" && !linear) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mode quadratic: the materialised kernel is the linear rule's; "
          "rule ",
          o.rule, " runs recurrent or chunkwise"));
    } else if (mode == "quadratic") {
      LINATTN_RETURN_IF_ERROR(QuadraticAttention(attention, in, out));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mode: unknown '", mode,
          "' (expected recurrent, chunkwise, quadratic, decode or prefill)"));
    }
  }
  return WriteNpy(o.out_path, {T, H, int64_t(spec.value_dim)}, y.data());
}

}  // namespace linattn
