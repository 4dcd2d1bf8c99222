#include "clients/load/inputs.h"

namespace linattn {

float* TensorRoom(bool bytes, uint64_t n,
                  google::protobuf::RepeatedField<float>* floats,
                  std::string* packed) {
  if (bytes) {
    packed->resize(n * sizeof(float));
    return reinterpret_cast<float*>(packed->data());
  }
  floats->Resize(static_cast<int>(n), 0.0f);
  return floats->mutable_data();
}

std::span<const float> TensorOf(
    const google::protobuf::RepeatedField<float>& floats,
    const std::string& packed) {
  if (!packed.empty()) {
    return {reinterpret_cast<const float*>(packed.data()),
            packed.size() / sizeof(float)};
  }
  return {floats.data(), static_cast<size_t>(floats.size())};
}

SharedLayout SharedLayoutOf(const InputPool& pool, uint64_t T) {
  SharedLayout l;
  l.q = 0;
  l.k = l.q + T * pool.qk() * sizeof(float);
  l.v = l.k + T * pool.qk() * sizeof(float);
  l.g = l.v + T * pool.vv() * sizeof(float);
  l.beta = l.g + T * pool.gg() * sizeof(float);
  l.a = l.beta + T * pool.bb() * sizeof(float);
  l.b = l.a + T * pool.ab() * sizeof(float);
  l.output = l.b + T * pool.ab() * sizeof(float);
  l.denominator = l.output + T * pool.vv() * sizeof(float);
  l.end = l.denominator + T * pool.heads() * sizeof(float);
  return l;
}

void BuildPrefill(const LoadOptions& o, const InputPool& pool, uint32_t s,
                  const std::string& id, const ClientSharedRegion* region,
                  v1::PrefillRequest* request) {
  request->set_session_id(id);
  request->set_tokens(o.prefill);
  const bool bytes = o.tensors_as_bytes;
  const uint64_t T = o.prefill;
  float *q, *k, *v, *g, *beta, *a, *b;
  if (region != nullptr) {
    const SharedLayout l = SharedLayoutOf(pool, T);
    v1::SharedMemoryTensors* shm = request->mutable_shared_memory();
    shm->set_path(region->path());
    shm->set_q_offset(l.q);
    shm->set_k_offset(l.k);
    shm->set_v_offset(l.v);
    if (pool.gg() != 0) shm->set_g_offset(l.g);
    if (pool.bb() != 0) shm->set_beta_offset(l.beta);
    if (pool.ab() != 0) {
      shm->set_a_offset(l.a);
      shm->set_b_offset(l.b);
    }
    shm->set_output_offset(l.output);
    shm->set_denominator_offset(l.denominator);
    q = region->floats(l.q);
    k = region->floats(l.k);
    v = region->floats(l.v);
    g = region->floats(l.g);
    beta = region->floats(l.beta);
    a = region->floats(l.a);
    b = region->floats(l.b);
  } else {
    q = TensorRoom(bytes, T * pool.qk(), request->mutable_q(),
                   request->mutable_q_bytes());
    k = TensorRoom(bytes, T * pool.qk(), request->mutable_k(),
                   request->mutable_k_bytes());
    v = TensorRoom(bytes, T * pool.vv(), request->mutable_v(),
                   request->mutable_v_bytes());
    g = TensorRoom(bytes, T * pool.gg(), request->mutable_g(),
                   request->mutable_g_bytes());
    beta = TensorRoom(bytes, T * pool.bb(), request->mutable_beta(),
                      request->mutable_beta_bytes());
    a = TensorRoom(bytes, T * pool.ab(), request->mutable_a(),
                   request->mutable_a_bytes());
    b = TensorRoom(bytes, T * pool.ab(), request->mutable_b(),
                   request->mutable_b_bytes());
  }
  for (uint64_t t = 0; t < T; ++t) {
    pool.Token(s, t, q + t * pool.qk(), k + t * pool.qk(), v + t * pool.vv(),
               g + t * pool.gg(), beta + t * pool.bb(), a + t * pool.ab(),
               b + t * pool.ab());
  }
}

void FillStep(const InputPool& pool, uint32_t s, const std::string& id,
              uint64_t token, bool expect, bool bytes,
              v1::DecodeRequest* request) {
  request->set_session_id(id);
  if (expect) {
    request->set_expected_position(token);
  } else {
    request->clear_expected_position();
  }
  pool.Token(s, token,
             TensorRoom(bytes, pool.qk(), request->mutable_q(),
                        request->mutable_q_bytes()),
             TensorRoom(bytes, pool.qk(), request->mutable_k(),
                        request->mutable_k_bytes()),
             TensorRoom(bytes, pool.vv(), request->mutable_v(),
                        request->mutable_v_bytes()),
             TensorRoom(bytes, pool.gg(), request->mutable_g(),
                        request->mutable_g_bytes()),
             TensorRoom(bytes, pool.bb(), request->mutable_beta(),
                        request->mutable_beta_bytes()),
             TensorRoom(bytes, pool.ab(), request->mutable_a(),
                        request->mutable_a_bytes()),
             TensorRoom(bytes, pool.ab(), request->mutable_b(),
                        request->mutable_b_bytes()));
}

}  // namespace linattn
