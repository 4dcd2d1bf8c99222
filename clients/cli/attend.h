// `linattn attend`: linear attention over .npy files, computed locally by
// one of the core evaluation orders.
//
//   Q, K: float32 (T, H, d_k);  V: float32 (T, H, d_v)  →  Y: (T, H, d_v)
// with NaN where a head's output is unavailable (zero denominator, ε = 0).
// The gated and delta rules (--rule) also read log-gates G, (T, H) or
// (T, H, d_k), and β, (T, H) (docs/design.md §1).
#ifndef LINATTN_CLIENTS_CLI_ATTEND_H_
#define LINATTN_CLIENTS_CLI_ATTEND_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "clients/common/connection.h"

namespace linattn {

struct AttendOptions {
  std::string q_path, k_path, v_path, out_path;
  // The gated, delta, rwkv7 and rwkv6 rules' inputs, and rwkv6's bonus.
  std::string g_path, beta_path, a_path, b_path, bonus_path;
  // Empty: elu1 for the linear rule, identity for the others.
  std::string feature_map;
  // linear | gated | delta | gated_delta | rwkv7 | rwkv6
  std::string rule = "linear";
  std::string gate;  // head | key (gated; default head)
  bool qk_l2norm = false;
  float scale = 0.0f;  // q's multiplier for the gated and delta rules (0 = 1)
  // Local: recurrent | chunkwise | quadratic. With `server`: decode (one
  // Decode stream) | prefill (Prefill requests) in a temporary session.
  // Empty: chunkwise locally, prefill (its server-side twin) with `server`.
  std::string mode;
  std::string server;            // host:port of a linattn-server
  ConnectionOptions connection;  // how to reach `server`
  uint32_t chunk = 64;
  std::vector<float> decay;  // one value for every head, or one per head
  std::optional<float>
      epsilon;  // unset: 0 locally, the server's default remotely
  bool unnormalized = false;
  uint32_t feature_dim = 0;  // FAVOR+ m (0 = 2·d_k)
  uint64_t seed = 0;         // FAVOR+ seed
  uint32_t horizon = 0;      // cosFormer M (0 = T)
};

// Reads the inputs, validates shapes, computes, writes `out_path`.
absl::Status Attend(const AttendOptions& options);

}  // namespace linattn

#endif  // LINATTN_CLIENTS_CLI_ATTEND_H_
