// Replayer: sessions rebuilt from what a durable store holds — stored
// snapshots first (each where its session's replay starts), then records
// in order (core/session/records.h), one apply per record type — and then
// joined to the session table. The local store's recovery feeds it every
// snapshot file and the whole journal; a replica's takeover feeds it one
// session's snapshot and records from the shared store.
//
//   Replayer replayer(models, forward, "journal: DIR");
//   files.ForEach([&](auto& f) { return replayer.Snapshot(f.id, f.seq,
//                                                          f.blob(), f.path);
//                                                          });
//   ReadJournal(dir, [&](JournalRecord& r) { return replayer.Apply(r); });
//   replayer.Finish(scan);                 // a torn request goes with the tail
//   replayer.Adopt(table, incarnation_of); // the sessions join the table
//
// Records of a session that is not live (or is live as another
// incarnation) are skipped; only creates bring a session in. A damaged
// record or snapshot is DATA_LOSS naming where it was read; a session of a
// model that is not loaded is FAILED_PRECONDITION.
//
// Not thread-safe: one recovery or takeover at a time owns it.
#ifndef LINATTN_CORE_SESSION_REPLAYER_H_
#define LINATTN_CORE_SESSION_REPLAYER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/forward.h"
#include "core/model/model.h"
#include "core/session/journal.h"
#include "core/session/session_manager.h"

namespace linattn {

// What a recovery did (the server logs it at start).
struct RecoveryReport {
  uint64_t attention_sessions = 0;
  uint64_t model_sessions = 0;
  uint64_t snapshot_files = 0;
  uint64_t records = 0;   // journal records read
  uint64_t replayed = 0;  // records applied (the rest were covered by a
                          // snapshot file or were of deleted sessions)
  // A torn write dropped from the end of the journal (a crash mid-write).
  uint64_t dropped_tail_bytes = 0;
  std::string dropped_tail_file;
  uint64_t dropped_tail_offset = 0;
  double seconds = 0;
};

// A session as it joined the table, for the store's bookkeeping.
struct RebuiltSession {
  uint64_t incarnation = 0;
  std::string owner;
  SessionKind kind = SessionKind::kAttention;
  uint64_t state_bytes = 0;
  uint64_t first_needed = 0;  // the first record its replay needed
  uint64_t tail_bytes = 0;    // its records since its snapshot
};

class Replayer {
 public:
  // `models`: the loaded ones, for model sessions; `forward`: how their
  // recorded tokens run (the live forward's options, so a rebuilt state is
  // the one the session had); `where` names the records' source in errors.
  Replayer(std::span<const std::shared_ptr<const Model>> models,
           ForwardOptions forward, std::string where);
  ~Replayer();

  // One stored snapshot of session `id`, covering its records through
  // `covered`: the incarnation, the owner section, the snapshot. `path`
  // names it in errors.
  absl::Status Snapshot(const std::string& id, uint64_t covered,
                        absl::string_view blob, absl::string_view path);
  // The next record. A DecodeBatch request's steps (consecutive records,
  // the first holding their count) are applied together once all are read.
  absl::Status Apply(JournalRecord& record);
  // After the last record: a request whose steps were not all read (its
  // group commit never finished, so nothing of it was acknowledged) goes
  // with the torn tail of `scan`.
  void Finish(JournalScan& scan);
  // Runs the model sessions' recorded tokens, then adds every live session
  // to `table` under its id, its tenant and the incarnation
  // `incarnation_of` gives its recorded one. `joining` hears of each
  // (id, incarnation) before any joins.
  absl::StatusOr<std::map<std::string, RebuiltSession, std::less<>>> Adopt(
      SessionManager& table,
      const std::function<uint64_t(uint64_t recorded)>& incarnation_of,
      const std::function<void(const std::string&, uint64_t)>& joining);

  uint64_t max_incarnation() const { return max_incarnation_; }
  uint64_t max_covered() const { return max_covered_; }
  // The incarnation of each snapshot read, by id.
  const std::map<std::string, uint64_t, std::less<>>& snapshots() const {
    return snapshots_;
  }
  RecoveryReport& report() { return report_; }

 private:
  struct Live;
  using Records = std::span<const JournalRecord>;
  // One record, or a DecodeBatch request's steps together.
  absl::Status ApplyRequest(Records records);
  absl::Status ApplyCreate(const JournalRecord& rec, uint64_t incarnation,
                           absl::string_view rest);
  absl::Status ApplySteps(Records records);
  absl::Status ReplayTokens();
  absl::StatusOr<std::shared_ptr<const Attention>> AttentionOf(
      const AttentionSpec& spec);
  std::shared_ptr<const Model> FindModel(absl::string_view name,
                                         uint64_t fingerprint) const;
  // DATA_LOSS naming `rec` and `why`.
  absl::Status Bad(const JournalRecord& rec, absl::string_view why) const;

  const std::vector<std::shared_ptr<const Model>> models_;
  const ForwardOptions forward_;
  const std::string where_;
  std::map<std::string, std::unique_ptr<Live>, std::less<>> live_;
  std::map<std::string, uint64_t, std::less<>> snapshots_;
  // Attentions by spec (FAVOR+'s projection is drawn once per spec).
  std::vector<std::shared_ptr<const Attention>> attentions_;
  // A DecodeBatch request's steps read so far, and its count.
  std::vector<JournalRecord> request_;
  uint32_t request_steps_ = 0;
  std::vector<float> scratch_out_;
  std::vector<uint8_t> scratch_available_;
  uint64_t max_incarnation_ = 0;
  uint64_t max_covered_ = 0;
  RecoveryReport report_;
};

}  // namespace linattn

#endif  // LINATTN_CORE_SESSION_REPLAYER_H_
