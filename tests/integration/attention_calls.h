// AttentionService calls the integration tests make the same way.
#ifndef LINATTN_TESTS_INTEGRATION_ATTENTION_CALLS_H_
#define LINATTN_TESTS_INTEGRATION_ATTENTION_CALLS_H_

#include <gtest/gtest.h>

#include <string>

#include "linattn/v1/attention.grpc.pb.h"

namespace linattn::testing {

// Snapshots session `id` and restores the blob as `new_id` (which must
// succeed); the restored session as the server reports it.
inline v1::Session SnapshotAndRestore(v1::AttentionService::Stub& stub,
                                      const std::string& id,
                                      const std::string& new_id) {
  grpc::ClientContext snap_ctx;
  v1::SnapshotRequest snap_req;
  snap_req.set_session_id(id);
  v1::SnapshotResponse snap;
  const grpc::Status snapped = stub.Snapshot(&snap_ctx, snap_req, &snap);
  EXPECT_TRUE(snapped.ok()) << snapped.error_message();
  grpc::ClientContext restore_ctx;
  v1::RestoreRequest restore_req;
  restore_req.set_state(snap.state());
  restore_req.set_session_id(new_id);
  v1::Session restored;
  const grpc::Status st = stub.Restore(&restore_ctx, restore_req, &restored);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return restored;
}

// Forks session `id` as `new_id` (empty: the server picks), which must
// succeed.
inline v1::Session ForkOf(v1::AttentionService::Stub& stub,
                          const std::string& id,
                          const std::string& new_id = "") {
  grpc::ClientContext ctx;
  v1::ForkRequest req;
  req.set_session_id(id);
  req.set_new_session_id(new_id);
  v1::Session forked;
  const grpc::Status st = stub.Fork(&ctx, req, &forked);
  EXPECT_TRUE(st.ok()) << st.error_message();
  return forked;
}

}  // namespace linattn::testing

#endif  // LINATTN_TESTS_INTEGRATION_ATTENTION_CALLS_H_
