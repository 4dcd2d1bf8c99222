#include "core/session/records.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/session/snapshot.h"
#include "core/util/little_endian.h"

namespace linattn {

namespace {

// A record's bytes in the journal beyond its body and session id: length,
// two checksums, seq, type, id length (core/session/journal.h).
constexpr uint64_t kJournalFraming = 4 + 4 + 4 + 8 + 1 + 2;

// A stored snapshot with a tenant: this magic, the tenant's length (u16)
// and name, then the snapshot (which starts with its own magic, so stores
// written before tenants existed read as owned by "").
constexpr char kOwnerMagic[8] = {'L', 'N', 'A', 'T', 'O', 'W', 'N', 'R'};
constexpr size_t kMaxOwnerBytes = 1024;

void AppendFloats(std::string& out, const float* data, uint64_t n) {
  out.append(reinterpret_cast<const char*>(data), n * sizeof(float));
}

}  // namespace

absl::string_view RecordName(uint8_t type) {
  switch (static_cast<DurableRecord>(type)) {
    case DurableRecord::kCreate:
      return "create";
    case DurableRecord::kCreateWithState:
      return "create with state";
    case DurableRecord::kState:
      return "state";
    case DurableRecord::kDelete:
      return "delete";
    case DurableRecord::kStep:
      return "step";
    case DurableRecord::kModelCreate:
      return "model create";
    case DurableRecord::kModelCreateWithState:
      return "model create with state";
    case DurableRecord::kModelState:
      return "model state";
    case DurableRecord::kTokens:
      return "tokens";
    case DurableRecord::kSampler:
      return "sampler";
    case DurableRecord::kOwner:
      return "owner";
  }
  return "unknown";
}

std::string IncarnationBytes(uint64_t incarnation) {
  std::string out;
  PutLittleEndian<uint64_t>(out, incarnation);
  return out;
}

std::string Record::Body(uint64_t body_incarnation, uint32_t body_steps) const {
  std::string out;
  out.reserve(BodySize());
  PutLittleEndian<uint64_t>(out, body_incarnation);
  if (type == DurableRecord::kStep) {
    PutLittleEndian<uint32_t>(out, body_steps);
  }
  out += payload;
  return out;
}

uint64_t Record::BodySize() const {
  return 8 + (type == DurableRecord::kStep ? 4 : 0) + payload.size();
}

uint64_t JournalRecordBytes(uint64_t body_bytes, uint64_t id_bytes) {
  return body_bytes + id_bytes + kJournalFraming;
}

std::vector<Record> CreateRecords(const Session& session,
                                  uint64_t incarnation) {
  Record create;
  create.id = session.id();
  create.incarnation = incarnation;
  if (session.kind() == SessionKind::kAttention) {
    const auto& s = static_cast<const AttentionSession&>(session);
    // A state at position 0 holds nothing (CheckRestoredState): the spec
    // says it all.
    if (s.state().position() == 0) {
      create.type = DurableRecord::kCreate;
      create.payload = SerializeSpec(s.spec());
    } else {
      create.type = DurableRecord::kCreateWithState;
      create.payload = SerializeSnapshot(s.spec(), s.state());
    }
  } else {
    const auto& s = static_cast<const ModelSession&>(session);
    if (s.context_position() == 0) {
      create.type = DurableRecord::kModelCreate;
      PutLittleEndian<uint64_t>(create.payload, s.model().fingerprint());
      create.payload += s.model().name();
    } else {
      create.type = DurableRecord::kModelCreateWithState;
      create.payload = SerializeModelSnapshot(s.model(), s.state(),
                                              s.pending_token(), s.sampler());
    }
  }
  std::vector<Record> out;
  out.push_back(std::move(create));
  if (!session.owner().empty()) {
    Record owner;
    owner.type = DurableRecord::kOwner;
    owner.id = session.id();
    owner.incarnation = incarnation;
    owner.payload = session.owner();
    out.push_back(std::move(owner));
  }
  return out;
}

Record DeleteRecord(absl::string_view id, uint64_t incarnation) {
  Record r;
  r.type = DurableRecord::kDelete;
  r.id = std::string(id);
  r.incarnation = incarnation;
  return r;
}

// --- RecordGroup -----------------------------------------------------------

void RecordGroup::Add(DurableRecord type, const Session& session,
                      std::string payload, uint32_t steps) {
  records_.push_back(Record{type, session.id(), session.incarnation(), steps,
                            std::move(payload), request_});
}

void RecordGroup::AddStep(const AttentionSession& session,
                          const SequenceInput& in, uint32_t steps) {
  const AttentionSpec& spec = session.spec();
  const uint64_t qk = uint64_t{spec.num_heads} * spec.key_dim;
  const uint64_t vv = uint64_t{spec.num_heads} * spec.value_dim;
  std::string payload;
  payload.reserve(StepFloats(spec) * sizeof(float));
  AppendFloats(payload, in.q, qk);
  AppendFloats(payload, in.k, qk);
  AppendFloats(payload, in.v, vv);
  // The gated, delta and rwkv7 rules' log-gates, β, a and b follow (none
  // for the linear rule, whose records are as they were).
  const uint64_t gates = uint64_t{spec.num_heads} * GatesPerHead(spec);
  if (gates != 0) AppendFloats(payload, in.g, gates);
  if (HasBeta(spec.rule)) AppendFloats(payload, in.beta, spec.num_heads);
  if (HasLowRank(spec.rule)) {
    AppendFloats(payload, in.a, qk);
    AppendFloats(payload, in.b, qk);
  }
  Add(DurableRecord::kStep, session, std::move(payload), steps);
}

void RecordGroup::AddState(const AttentionSession& session,
                           const AttentionState& state) {
  Add(DurableRecord::kState, session, SerializeSnapshot(session.spec(), state));
}

void RecordGroup::AddTokens(const ModelSession& session,
                            std::span<const int32_t> tokens) {
  std::string payload;
  payload.reserve(tokens.size() * 4);
  for (int32_t t : tokens) PutLittleEndian<int32_t>(payload, t);
  Add(DurableRecord::kTokens, session, std::move(payload));
}

void RecordGroup::AddModelState(const ModelSession& session) {
  Add(DurableRecord::kModelState, session,
      SerializeModelSnapshot(session.model(), session.state(),
                             session.pending_token(), session.sampler()));
}

void RecordGroup::AddSampler(const ModelSession& session,
                             const SamplerPosition& position) {
  std::string payload;
  PutLittleEndian<uint64_t>(payload, position.seed);
  PutLittleEndian<uint64_t>(payload, position.draws);
  Add(DurableRecord::kSampler, session, std::move(payload));
}

// --- Reading ---------------------------------------------------------------

absl::StatusOr<RecordBody> SplitBody(absl::string_view body) {
  if (body.size() < 8) return absl::DataLossError("too short");
  return RecordBody{GetLittleEndian<uint64_t>(body.data()), body.substr(8)};
}

absl::StatusOr<StepPayload> ParseStepPayload(absl::string_view rest) {
  if (rest.size() < 4) return absl::DataLossError("too short");
  return StepPayload{GetLittleEndian<uint32_t>(rest.data()), rest.substr(4)};
}

uint64_t StepFloats(const AttentionSpec& spec) {
  const uint64_t H = spec.num_heads;
  return H * (2 * uint64_t{spec.key_dim} + spec.value_dim + GatesPerHead(spec) +
              (HasBeta(spec.rule) ? 1 : 0) +
              (HasLowRank(spec.rule) ? 2 * uint64_t{spec.key_dim} : 0));
}

SequenceInput StepInput(const AttentionSpec& spec, absl::string_view floats) {
  const uint64_t qk = uint64_t{spec.num_heads} * spec.key_dim;
  const uint64_t vv = uint64_t{spec.num_heads} * spec.value_dim;
  const uint64_t gates = uint64_t{spec.num_heads} * GatesPerHead(spec);
  const float* q = reinterpret_cast<const float*>(floats.data());
  SequenceInput token{q, q + qk, q + 2 * qk, 1};
  if (gates != 0) token.g = q + 2 * qk + vv;
  const uint64_t betas = HasBeta(spec.rule) ? spec.num_heads : 0;
  if (betas != 0) token.beta = q + 2 * qk + vv + gates;
  if (HasLowRank(spec.rule)) {
    token.a = q + 2 * qk + vv + gates + betas;
    token.b = token.a + qk;
  }
  return token;
}

absl::StatusOr<ModelCreatePayload> ParseModelCreate(absl::string_view rest) {
  if (rest.size() < 8) return absl::DataLossError("too short");
  return ModelCreatePayload{GetLittleEndian<uint64_t>(rest.data()),
                            std::string(rest.substr(8))};
}

absl::StatusOr<std::vector<int32_t>> ParseTokens(absl::string_view rest,
                                                 int64_t vocab) {
  if (rest.size() % 4 != 0 || rest.empty()) {
    return absl::DataLossError("does not hold whole tokens");
  }
  std::vector<int32_t> tokens;
  tokens.reserve(rest.size() / 4);
  for (size_t t = 0; t < rest.size(); t += 4) {
    const int32_t token = GetLittleEndian<int32_t>(rest.data() + t);
    if (token < 0 || token >= vocab) {
      return absl::DataLossError(
          absl::StrCat("token ", token, " is outside the model's vocabulary"));
    }
    tokens.push_back(token);
  }
  return tokens;
}

absl::StatusOr<SamplerPosition> ParseSampler(absl::string_view rest) {
  if (rest.size() != 16) {
    return absl::DataLossError("is not a seed and a draw count");
  }
  return SamplerPosition{GetLittleEndian<uint64_t>(rest.data()),
                         GetLittleEndian<uint64_t>(rest.data() + 8), true};
}

absl::StatusOr<std::string> ParseOwner(absl::string_view rest) {
  if (rest.empty() || rest.size() > kMaxOwnerBytes) {
    return absl::DataLossError("does not name a tenant");
  }
  return std::string(rest);
}

std::string OwnerSection(const std::string& owner) {
  if (owner.empty()) return "";
  std::string out(kOwnerMagic, sizeof(kOwnerMagic));
  PutLittleEndian<uint16_t>(out, static_cast<uint16_t>(owner.size()));
  return out + owner;
}

absl::StatusOr<std::string> TakeOwnerSection(absl::string_view& blob) {
  if (blob.size() < sizeof(kOwnerMagic) ||
      std::memcmp(blob.data(), kOwnerMagic, sizeof(kOwnerMagic)) != 0) {
    return std::string();
  }
  blob.remove_prefix(sizeof(kOwnerMagic));
  if (blob.size() < 2) return absl::DataLossError("tenant cut short");
  const uint16_t n = GetLittleEndian<uint16_t>(blob.data());
  if (n == 0 || n > kMaxOwnerBytes || blob.size() < 2 + size_t{n}) {
    return absl::DataLossError("tenant cut short");
  }
  std::string owner(blob.substr(2, n));
  blob.remove_prefix(2 + size_t{n});
  return owner;
}

}  // namespace linattn
