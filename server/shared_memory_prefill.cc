// AttentionService's Prefill with its tensors in a co-located client's
// memfd (PrefillRequest.shared_memory; docs/design.md, "Shared-memory
// tensors"): every size and range is checked before anything is allocated
// or read; the inputs are copied out of the region, so the call sees one
// version of them whatever the client does meanwhile; the outputs are
// written into it once the prefill has succeeded.
#include <algorithm>
#include <atomic>
#include <memory>
#include <new>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/attention_service.h"
#include "server/shared_memory.h"
#include "server/status.h"

namespace linattn {

namespace {

// A share of the bytes shared-memory Prefills may hold at once, returned
// when it goes.
class InFlightBytes {
 public:
  InFlightBytes(InFlightBytes&& other) noexcept
      : counter_(std::move(other.counter_)),
        bytes_(std::exchange(other.bytes_, 0)) {}
  InFlightBytes& operator=(InFlightBytes&&) = delete;
  ~InFlightBytes() {
    if (counter_ != nullptr) counter_->fetch_sub(bytes_);
  }

  // `bytes` more, unless that passes `limit`.
  static std::optional<InFlightBytes> Take(
      const std::shared_ptr<std::atomic<uint64_t>>& counter, uint64_t bytes,
      uint64_t limit) {
    uint64_t held = counter->load();
    do {
      if (bytes > limit || held > limit - bytes) return std::nullopt;
    } while (!counter->compare_exchange_weak(held, held + bytes));
    return InFlightBytes(counter, bytes);
  }

 private:
  InFlightBytes(std::shared_ptr<std::atomic<uint64_t>> counter, uint64_t bytes)
      : counter_(std::move(counter)), bytes_(bytes) {}
  std::shared_ptr<std::atomic<uint64_t>> counter_;
  uint64_t bytes_ = 0;
};

// A shared-memory Prefill's tensors, read out of the client's region, and
// room for its outputs; they live until the call's last callback.
struct SharedPrefillBuffers {
  SharedRegion region;
  InFlightBytes share;
  std::unique_ptr<float[]> q, k, v, g, beta, a, b, output, denominator;
  std::vector<uint8_t> available;
};

// Default-initialised floats: every one is written before it is read.
std::unique_ptr<float[]> Floats(uint64_t n) {
  return n == 0 ? nullptr : std::unique_ptr<float[]>(new float[n]);
}

}  // namespace

grpc::ServerUnaryReactor* AttentionServiceImpl::PrefillShared(
    grpc::CallbackServerContext* ctx, const v1::PrefillRequest* request,
    v1::PrefillResponse* response, std::shared_ptr<AttentionSession> session) {
  const v1::SharedMemoryTensors& shm = request->shared_memory();
  if (!shared_memory_.enabled) {
    return FinishCall(
        ctx, absl::FailedPreconditionError(
                 "shared_memory: this server takes no shared-memory tensors "
                 "(linattn-server --shared-memory, listening on a unix "
                 "socket, does)"));
  }
  const v1::PrefillRequest& r = *request;
  const std::pair<const char*, bool> inline_tensors[] = {
      {"q", !r.q().empty() || !r.q_bytes().empty()},
      {"k", !r.k().empty() || !r.k_bytes().empty()},
      {"v", !r.v().empty() || !r.v_bytes().empty()},
      {"g", !r.g().empty() || !r.g_bytes().empty()},
      {"beta", !r.beta().empty() || !r.beta_bytes().empty()},
      {"a", !r.a().empty() || !r.a_bytes().empty()},
      {"b", !r.b().empty() || !r.b_bytes().empty()}};
  for (const auto& [name, given] : inline_tensors) {
    if (given) {
      return FinishCall(ctx,
                        absl::InvalidArgumentError(absl::StrCat(
                            name,
                            ": given beside shared_memory; each tensor comes "
                            "in one form, here from the region")));
    }
  }
  const AttentionSpec& spec = session->spec();
  const uint64_t T = request->tokens();
  const uint64_t rows = T * spec.num_heads;  // ≤ 2^32 · 2^16
  const uint64_t gates = GatesPerHead(spec);
  const bool beta = HasBeta(spec.rule);
  const absl::string_view rule = UpdateRuleName(spec.rule);
  if ((gates != 0) != shm.has_g_offset()) {
    return FinishCall(
        ctx, absl::InvalidArgumentError(
                 absl::StrCat("shared_memory.g_offset: rule ", rule,
                              gates != 0 ? " takes log-gates; give their offset"
                                         : " takes no log-gates")));
  }
  if (beta != shm.has_beta_offset()) {
    return FinishCall(
        ctx, absl::InvalidArgumentError(absl::StrCat(
                 "shared_memory.beta_offset: rule ", rule,
                 beta ? " takes beta; give its offset" : " takes no beta")));
  }
  const bool low_rank = HasLowRank(spec.rule);
  for (auto [field, given] :
       {std::pair{"shared_memory.a_offset", shm.has_a_offset()},
        std::pair{"shared_memory.b_offset", shm.has_b_offset()}}) {
    if (low_rank != given) {
      return FinishCall(ctx, absl::InvalidArgumentError(absl::StrCat(
                                 field, ": rule ", rule,
                                 low_rank ? " takes a and b; give their offsets"
                                          : " takes no a or b")));
    }
  }
  // Floats per token and head in and out: each side is bounded as the
  // request or response message carrying it would be, before anything is
  // formed from them.
  const uint64_t low_rank_floats = low_rank ? spec.key_dim : 0;
  const uint64_t in_per_row = 2 * uint64_t{spec.key_dim} + spec.value_dim +
                              gates + (beta ? 1 : 0) + 2 * low_rank_floats;
  const uint64_t out_per_row = uint64_t{spec.value_dim} + 1;
  const uint64_t max_floats = shared_memory_.max_tensor_bytes / sizeof(float);
  if (rows > max_floats / std::max(in_per_row, out_per_row)) {
    return FinishCall(
        ctx, absl::InvalidArgumentError(absl::StrCat(
                 "tokens: ", T, " tokens of ", spec.num_heads, " heads take ",
                 rows * in_per_row * sizeof(float), " bytes of inputs and ",
                 rows * out_per_row * sizeof(float),
                 " of outputs; a Prefill carries at most ",
                 shared_memory_.max_tensor_bytes,
                 " each way (--max-message-bytes)")));
  }
  const uint64_t qk_floats = rows * spec.key_dim;
  const uint64_t v_floats = rows * spec.value_dim;
  absl::StatusOr<SharedRegion> region =
      SharedRegion::Open("shared_memory.path", shm.path());
  if (!region.ok()) return FinishCall(ctx, region.status());
  const struct {
    const char* field;
    uint64_t offset, floats;
  } ranges[] = {
      {"shared_memory.q_offset", shm.q_offset(), qk_floats},
      {"shared_memory.k_offset", shm.k_offset(), qk_floats},
      {"shared_memory.v_offset", shm.v_offset(), v_floats},
      {"shared_memory.g_offset", shm.g_offset(), rows * gates},
      {"shared_memory.beta_offset", shm.beta_offset(), beta ? rows : 0},
      {"shared_memory.a_offset", shm.a_offset(), rows * low_rank_floats},
      {"shared_memory.b_offset", shm.b_offset(), rows * low_rank_floats},
      {"shared_memory.output_offset", shm.output_offset(), v_floats},
      {"shared_memory.denominator_offset", shm.denominator_offset(), rows}};
  for (const auto& range : ranges) {
    if (absl::Status s = region->CheckRange(range.field, range.offset,
                                            range.floats * sizeof(float));
        !s.ok()) {
      return FinishCall(ctx, s);
    }
  }
  // Each call holds the region's descriptor too: it counts at least a
  // 64th of the budget, so at most 64 such calls are in flight.
  const uint64_t held =
      std::max(rows * (in_per_row + out_per_row) * sizeof(float) + rows,
               shared_memory_.max_bytes_in_flight / 64);
  std::optional<InFlightBytes> share = InFlightBytes::Take(
      shared_bytes_in_flight_, held, shared_memory_.max_bytes_in_flight);
  if (!share.has_value()) {
    return FinishCall(
        ctx, absl::ResourceExhaustedError(absl::StrCat(
                 "shared_memory: the server holds as many shared-memory "
                 "prefills' tensors as it takes at once (",
                 shared_memory_.max_bytes_in_flight,
                 " bytes, --transport-memory); this one needs ", held,
                 "; try again when others are done")));
  }
  if (absl::Status s = gate()->limiter().Take(TenantOf(ctx), T); !s.ok()) {
    return FinishCall(ctx, s);
  }
  ContextOf(ctx).tokens_in.fetch_add(T, std::memory_order_relaxed);
  auto buffers = std::make_shared<SharedPrefillBuffers>(SharedPrefillBuffers{
      .region = *std::move(region), .share = *std::move(share)});
  SharedPrefillBuffers& b = *buffers;
  try {
    b.q = Floats(qk_floats);
    b.k = Floats(qk_floats);
    b.v = Floats(v_floats);
    b.g = Floats(rows * gates);
    b.beta = Floats(beta ? rows : 0);
    b.a = Floats(rows * low_rank_floats);
    b.b = Floats(rows * low_rank_floats);
    b.output = Floats(v_floats);
    b.denominator = Floats(rows);
    b.available.resize(rows);
  } catch (const std::bad_alloc&) {
    return FinishCall(ctx, absl::ResourceExhaustedError(
                               "out of memory for the prefill's tensors"));
  }
  SequenceInput in{.tokens = T};
  // In the order of `ranges`.
  float* const inputs[] = {b.q.get(),    b.k.get(), b.v.get(), b.g.get(),
                           b.beta.get(), b.a.get(), b.b.get()};
  for (size_t i = 0; i < std::size(inputs); ++i) {
    if (inputs[i] == nullptr) continue;
    if (absl::Status s = b.region.Read(
            ranges[i].offset, ranges[i].floats * sizeof(float), inputs[i]);
        !s.ok()) {
      return FinishCall(ctx, s);
    }
  }
  in.q = b.q.get();
  in.k = b.k.get();
  in.v = b.v.get();
  in.g = b.g.get();
  in.beta = b.beta.get();
  in.a = b.a.get();
  in.b = b.b.get();
  const SequenceOutput out{b.output.get(), b.denominator.get(),
                           b.available.data()};
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  AttentionSession* raw = session.get();
  const uint64_t output_offset = shm.output_offset();
  const uint64_t denominator_offset = shm.denominator_offset();
  sessions_->Prefill(
      std::move(session), in, out,
      [reactor, response, raw, buffers = std::move(buffers), v_floats, rows,
       output_offset, denominator_offset, o = gate()->observability(),
       start = ContextOf(ctx).start](absl::Status status) mutable {
        // The prefill is applied. Should the region refuse the outputs
        // now (the client sealed it against writes meanwhile), they go
        // back in the response instead, so the call still succeeds whole.
        if (status.ok() &&
            !(buffers->region
                  .Write(output_offset, v_floats * sizeof(float),
                         buffers->output.get())
                  .ok() &&
              buffers->region
                  .Write(denominator_offset, rows * sizeof(float),
                         buffers->denominator.get())
                  .ok())) {
          response->set_output_bytes(
              reinterpret_cast<const char*>(buffers->output.get()),
              v_floats * sizeof(float));
          response->set_denominator_bytes(
              reinterpret_cast<const char*>(buffers->denominator.get()),
              rows * sizeof(float));
        }
        const std::vector<uint8_t> available = std::move(buffers->available);
        buffers.reset();  // the region is closed with the call
        FinishPrefill(status, available, *raw, o, start, response, reactor);
      },
      LivenessOf(ctx));
  return reactor;
}

}  // namespace linattn
