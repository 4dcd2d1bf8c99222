#include "clients/load/options.h"

#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "clients/common/shared_region.h"
#include "core/util/status_macros.h"

namespace linattn {

absl::Status CheckLoadOptions(const LoadOptions& o) {
  if (!IsLoopbackAddress(o.server) && !o.allow_non_loopback) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--server: ", o.server,
        " is not a loopback address; load runs target this machine only "
        "(--allow-non-loopback to override)"));
  }
  if (o.sessions == 0 || o.steps == 0) {
    return absl::InvalidArgumentError(
        "--sessions and --steps: must be at least 1");
  }
  if (o.duration_s <= 0 || o.rate < 0) {
    return absl::InvalidArgumentError("--duration must be > 0 and --rate >= 0");
  }
  if (!o.session_prefix.empty() && o.prefill != 0) {
    return absl::InvalidArgumentError(
        "--session-prefix: runs that continue sessions decode only (--prefill "
        "0), so that every state can be checked bit for bit");
  }
  if (!o.only.empty() &&
      (o.session_prefix.empty() || o.only.size() != o.sessions)) {
    return absl::InvalidArgumentError(
        "--only: needs --session-prefix, and is the list of the sessions run "
        "(--sessions is its length)");
  }
  if (o.shared_memory) {
    if (o.prefill == 0 || !absl::StartsWith(o.server, "unix:")) {
      return absl::InvalidArgumentError(
          "--shared-memory: prefills' tensors through a memfd need --prefill "
          "and a server on a unix socket (--server unix:PATH)");
    }
    // Refused here rather than unit by unit when memfds are not available.
    LINATTN_RETURN_IF_ERROR(
        ClientSharedRegion::Create("linattn-load", sizeof(float)).status());
  }
  if (o.failover && o.session_prefix.empty()) {
    return absl::InvalidArgumentError(
        "--failover: needs --session-prefix (a broken stream continues its "
        "sessions from where the server says they stand)");
  }
  if (!o.ledger.empty() && o.session_prefix.empty()) {
    return absl::InvalidArgumentError(
        "--ledger: needs --session-prefix (sessions the run keeps)");
  }
  return absl::OkStatus();
}

// The sessions' spec these options give.
absl::StatusOr<AttentionSpec> LoadSpec(const LoadOptions& o) {
  AttentionSpec spec{
      .num_heads = o.heads, .key_dim = o.dim, .value_dim = o.dim};
  LINATTN_ASSIGN_OR_RETURN(spec.rule, ParseUpdateRule(o.rule));
  if (spec.rule != UpdateRule::kLinear) {
    // The gated and delta rules take q and k as given; the delta rules'
    // keys are L2-normalised, as DeltaNet's are.
    spec.feature_map = FeatureMapKind::kIdentity;
    spec.unnormalized = true;
    spec.qk_l2norm = HasBeta(spec.rule);
    if (spec.rule == UpdateRule::kRwkv7 || spec.rule == UpdateRule::kRwkv6) {
      spec.gate = GateShape::kKey;
    }
    if (spec.rule == UpdateRule::kRwkv6) {
      // The bonus u, from the seed (a stream of its own, apart from the
      // input pool's).
      std::mt19937_64 rng(o.seed ^ 0xb0b05eedull);
      std::uniform_real_distribution<float> unit(-1.0f, 1.0f);
      spec.bonus.resize(uint64_t{o.heads} * o.dim);
      for (float& u : spec.bonus) u = unit(rng);
    }
  } else {
    LINATTN_ASSIGN_OR_RETURN(spec.feature_map, ParseFeatureMap(o.feature_map));
    // identity has no normalised form (its weights can cancel in z).
    spec.unnormalized =
        o.unnormalized || spec.feature_map == FeatureMapKind::kIdentity;
  }
  if (spec.feature_map == FeatureMapKind::kCosine) {
    spec.horizon = o.horizon != 0 ? o.horizon : o.prefill + o.steps;
  }
  if (absl::Status s = ValidateSpec(spec); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the session spec these options give is not valid: ", s.message()));
  }
  return spec;
}

uint32_t Streams(const LoadOptions& o) {
  const uint32_t per_stream = std::max<uint32_t>(o.batch, 1);
  const uint32_t units = (o.sessions + per_stream - 1) / per_stream;
  return o.concurrency == 0 ? units : std::min(o.concurrency, units);
}

bool IsLoopbackAddress(const std::string& address) {
  // A unix socket reaches only processes on this machine.
  if (address.rfind("unix:", 0) == 0) return true;
  const size_t colon = address.rfind(':');
  std::string host = address.substr(0, colon);
  if (host.rfind("ipv4:", 0) == 0) host = host.substr(5);
  if (host == "localhost" || host == "[::1]" || host == "::1") return true;
  return host.rfind("127.", 0) == 0;
}

}  // namespace linattn
