// The records of durable sessions (docs/design.md §4, "Durable sessions"):
// what each change of a session is written as, in the local journal and in
// the shared store alike, and how each is read back. Every record names its
// session (id) and the session's incarnation (a number unique among every
// session a store has recorded, so that records of a deleted session never
// reach a later one of the same id); its body is the incarnation (u64),
// then a payload of its type:
//   1 create              attention session, zero state: SerializeSpec
//   2 create with state   attention session (a restore, a fork):
//                         SerializeSnapshot
//   3 state               an attention session's state is replaced (the
//                         result of a prefill): SerializeSnapshot
//   4 delete              deleted or evicted: nothing
//   5 step                one decode token: steps u32 (its request's step
//                         count: 1, or a DecodeBatch's count on its first
//                         step and 0 on the others, which follow it), then
//                         q, k and v as float32 (heads × key_dim, heads ×
//                         key_dim, heads × value_dim), then the rules' g
//                         (heads × gates per head) and beta (heads)
//   6 model create        model session, empty context: fingerprint u64,
//                         model name
//   7 model create with   model session (a restore, a fork):
//     state               SerializeModelSnapshot
//   8 model state         a model session's context is replaced (after a
//                         rollback): SerializeModelSnapshot
//   9 tokens              tokens that joined a model session's context, i32
//                         each (the pending token, if any, and all but the
//                         last are fed; the last becomes pending)
//  10 sampler             where a model session's random stream stands after
//                         a sampled token: seed u64, draws u64
//  11 owner               the tenant a session belongs to (after its create,
//                         when not ""): its name
// A stored snapshot (a snapshot file's blob, the shared store's snap) is
// the incarnation, then for a session with a tenant the owner section
// (OwnerSection), then the snapshot itself.
#ifndef LINATTN_CORE_SESSION_RECORDS_H_
#define LINATTN_CORE_SESSION_RECORDS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/attention/attention.h"
#include "core/session/session_manager.h"

namespace linattn {

enum class DurableRecord : uint8_t {
  kCreate = 1,
  kCreateWithState = 2,
  kState = 3,
  kDelete = 4,
  kStep = 5,
  kModelCreate = 6,
  kModelCreateWithState = 7,
  kModelState = 8,
  kTokens = 9,
  kSampler = 10,
  kOwner = 11,
};
// "create", "step", …; "unknown" for a byte that is no type.
absl::string_view RecordName(uint8_t type);

// One record, typed: its body is built when a store writes it (Body), with
// the incarnation and (steps) the step count that store records.
struct Record {
  DurableRecord type = DurableRecord::kDelete;
  std::string id;
  uint64_t incarnation = 0;
  // A step record's count (see the file comment); 0 for other types.
  uint32_t steps = 0;
  // What follows the incarnation (and a step's count).
  std::string payload;
  // The request it belongs to in its group (RecordGroup::BeginRequest).
  uint32_t request = 0;

  // The body: `incarnation`, then (steps) `steps`, then the payload.
  std::string Body(uint64_t incarnation, uint32_t steps) const;
  // The body as the local journal writes it (the record's own numbers).
  std::string Body() const { return Body(incarnation, steps); }
  uint64_t BodySize() const;
};

// What a record of `body_bytes` for session id `id_bytes` long takes in the
// journal, framing included (the measure of a session's tail of records).
uint64_t JournalRecordBytes(uint64_t body_bytes, uint64_t id_bytes);

// The records of a session's creation: its create (of its kind, with its
// state when it holds one) and, with a tenant, its owner. Read from the
// session: call where its state may be read (it cannot change before the
// commit that writes them).
std::vector<Record> CreateRecords(const Session& session, uint64_t incarnation);
Record DeleteRecord(absl::string_view id, uint64_t incarnation);

// The records of one scheduler round or generation iteration, request by
// request (core/session/round_commit.h commits them).
class RecordGroup {
 public:
  // One decode token of `session` (in.tokens == 1); `steps`: see the file
  // comment.
  void AddStep(const AttentionSession& session, const SequenceInput& in,
               uint32_t steps);
  // `state` is what the session's state is about to become.
  void AddState(const AttentionSession& session, const AttentionState& state);
  void AddTokens(const ModelSession& session, std::span<const int32_t> tokens);
  // The session's context as it is now.
  void AddModelState(const ModelSession& session);
  void AddSampler(const ModelSession& session, const SamplerPosition& position);
  // The records added next belong to the next request (numbered from 0).
  void BeginRequest() { ++request_; }
  // The number of the request BeginRequest opened last.
  uint32_t request() const { return request_; }
  bool empty() const { return records_.empty(); }
  size_t size() const { return records_.size(); }
  const std::vector<Record>& records() const { return records_; }
  std::vector<Record> Take() { return std::move(records_); }

 private:
  void Add(DurableRecord type, const Session& session, std::string payload,
           uint32_t steps = 0);
  uint32_t request_ = UINT32_MAX;  // BeginRequest makes the first 0
  std::vector<Record> records_;
};

// --- Reading ---------------------------------------------------------------

// A record's body split: its incarnation and what follows.
struct RecordBody {
  uint64_t incarnation = 0;
  absl::string_view rest;
};
absl::StatusOr<RecordBody> SplitBody(absl::string_view body);

// A step's count and its floats (q, k, v, g, beta), whose number the
// session's spec checks (StepFloats).
struct StepPayload {
  uint32_t steps = 0;
  absl::string_view floats;
};
absl::StatusOr<StepPayload> ParseStepPayload(absl::string_view rest);
// The floats one step of `spec` records.
uint64_t StepFloats(const AttentionSpec& spec);
// The step's input in place (its floats must be StepFloats(spec) long).
SequenceInput StepInput(const AttentionSpec& spec, absl::string_view floats);

struct ModelCreatePayload {
  uint64_t fingerprint = 0;
  std::string model;
};
absl::StatusOr<ModelCreatePayload> ParseModelCreate(absl::string_view rest);
// Tokens, each in [0, vocab).
absl::StatusOr<std::vector<int32_t>> ParseTokens(absl::string_view rest,
                                                 int64_t vocab);
absl::StatusOr<SamplerPosition> ParseSampler(absl::string_view rest);
absl::StatusOr<std::string> ParseOwner(absl::string_view rest);

// A stored snapshot's prefix for `owner` ("" for none) and its reading.
std::string OwnerSection(const std::string& owner);
// Splits the owner section off `blob` (after the incarnation): the tenant,
// or "" for a blob without one.
absl::StatusOr<std::string> TakeOwnerSection(absl::string_view& blob);
// The incarnation as it starts a body or a stored snapshot.
std::string IncarnationBytes(uint64_t incarnation);

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_RECORDS_H_
