// Scheduler::RunRound: one round of attention requests, as named steps
// (scheduler.h says what a round is). Each request is validated once:
// positions and the kernels' checks of every decode step before anything
// is recorded, prefill values by the chunkwise gather as it reads them;
// what passes is recorded in one group commit (RoundCommit), then made.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <tuple>
#include <unordered_map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/attention/recurrent.h"
#include "core/scheduler/prefill_shares.h"
#include "core/scheduler/scheduler.h"
#include "core/session/round_commit.h"

namespace linattn {

namespace {

// A chunkwise runner's error as its request reports it: without the
// "items[i]." the runner names its item by.
absl::Status AsRequest(absl::Status s) {
  if (s.ok() || !absl::StartsWith(s.message(), "items[")) return s;
  const size_t end = s.message().find("].");
  if (end == absl::string_view::npos) return s;
  return absl::Status(s.code(), s.message().substr(end + 2));
}

// The finiteness of tokens [from, from + tokens) of `in`, with errors naming
// the element's index in the whole request. Only for naming a value the
// chunkwise gather found bad: the happy path reads the input once, there.
absl::Status CheckSliceFinite(const AttentionSpec& spec,
                              const SequenceInput& in, uint64_t from,
                              uint64_t tokens) {
  const uint64_t qk = uint64_t{spec.num_heads} * spec.key_dim;
  const uint64_t vv = uint64_t{spec.num_heads} * spec.value_dim;
  for (auto [field, data, width] :
       {std::tuple<const char*, const float*, uint64_t>{"q", in.q, qk},
        {"k", in.k, qk},
        {"v", in.v, vv}}) {
    const float* first = data + from * width;
    const uint64_t n = tokens * width;
    if (AllFinite(first, n)) continue;
    for (uint64_t i = 0; i < n; ++i) {
      if (!std::isfinite(first[i])) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, "[", from * width + i, "]: must be finite, got ", first[i]));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPosition(const AttentionSession& session,
                           std::optional<uint64_t> expected) {
  if (!expected.has_value() || *expected == session.state().position()) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "expected_position: session '", session.id(), "' is at position ",
      session.state().position(), ", not ", *expected,
      "; nothing changed (another request moved it: read its position with "
      "GetSession)"));
}

// `s` of step `j` of a group, as the group's request reports it.
absl::Status OfStep(size_t j, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("steps[", j, "].", s.message()));
}

}  // namespace

// What one round knows of its requests (worker only).
struct Scheduler::Round {
  explicit Round(std::vector<Request>& r)
      : requests(r),
        results(r.size()),
        done(r.size(), true),
        gone(r.size(), false) {}
  std::vector<Request>& requests;
  std::vector<absl::Status> results;  // each request's answer
  std::vector<bool> done;  // false: it goes on next round (slices, memory)
  std::vector<bool> gone;  // its caller left before the round
  // Decode steps: one item per token, the request each belongs to (a step
  // group's items are consecutive), and the kernels' verdict on each.
  std::vector<StepItem> steps;
  std::vector<size_t> step_request;
  std::vector<absl::Status> step_results;
  std::vector<double> grown;
  std::vector<size_t> prefills;    // requests that are prefills
  std::vector<size_t> committing;  // prefills whose last slice ran
  uint64_t prefill_slices = 0;     // prefills with a slice this round
  uint64_t prefill_tokens = 0;
  bool one_thread = false;  // the steps ran without the OpenMP team
};

void Scheduler::RunRound(std::vector<Request>& requests,
                         std::vector<Request>& unfinished) {
  Round round(requests);
  // Callers that have gone are answered before anything of theirs runs.
  for (size_t i = 0; i < requests.size(); ++i) {
    round.results[i] = requests[i].caller.Check();
    round.gone[i] = !round.results[i].ok();
  }
  CheckRoundSteps(round);
  RunPrefillSlices(round);
  CommitRound(round);
  RunRoundSteps(round);
  ApplyPrefills(round);
  RunWork(round);
  RecordRound(round);
  AnswerRound(round, unfinished);
}

void Scheduler::CheckRoundSteps(Round& round) {
  for (size_t i = 0; i < round.requests.size(); ++i) {
    Request& r = round.requests[i];
    if (round.gone[i] || r.kind == Kind::kWork) continue;
    if (r.kind == Kind::kPrefill) {
      round.prefills.push_back(i);
      continue;
    }
    if (r.kind == Kind::kStep) {
      round.results[i] = CheckPosition(*r.session, r.expected_position);
      if (!round.results[i].ok()) continue;
      round.steps.push_back(
          {&r.session->attention(), &r.session->state(), r.in, r.out});
      round.step_request.push_back(i);
      continue;
    }
    for (size_t j = 0; j < r.group.size(); ++j) {
      const GroupStep& g = r.group[j];
      if (absl::Status s = CheckPosition(*g.session, g.expected_position);
          !s.ok()) {
        round.results[i] = OfStep(j, s);
        break;
      }
    }
    if (!round.results[i].ok()) continue;
    for (const GroupStep& g : r.group) {
      round.steps.push_back(
          {&g.session->attention(), &g.session->state(), g.in, g.out});
      round.step_request.push_back(i);
    }
  }
  // The kernels' checks, once, item by item; a step group fails whole, named
  // by its first refused step.
  round.step_results.resize(round.steps.size());
  round.grown.resize(round.steps.size());
  CheckSteps(round.steps, round.step_results, round.grown);
  for (size_t b = 0; b < round.steps.size();) {
    const size_t i = round.step_request[b];
    size_t e = b;
    while (e < round.steps.size() && round.step_request[e] == i) ++e;
    for (size_t j = b; j < e && round.results[i].ok(); ++j) {
      const absl::Status& s = round.step_results[j];
      if (s.ok()) continue;
      round.results[i] =
          round.requests[i].kind == Kind::kStepGroup ? OfStep(j - b, s) : s;
    }
    if (!round.results[i].ok()) RefuseSteps(round, i);
    b = e;
  }
}

void Scheduler::RefuseSteps(Round& round, size_t request) {
  for (size_t j = 0; j < round.steps.size(); ++j) {
    if (round.step_request[j] == request && round.step_results[j].ok()) {
      round.step_results[j] = round.results[request];
    }
  }
}

void Scheduler::RunPrefillSlices(Round& round) {
  if (round.prefills.empty()) return;
  std::vector<Request>& requests = round.requests;
  // The round's token budget shared evenly, the shortest first so that what
  // they leave goes to the longer ones; with several tenants prefilling,
  // among tenants first (PrefillShares).
  std::sort(round.prefills.begin(), round.prefills.end(),
            [&](size_t a, size_t b) {
              return requests[a].in.tokens - requests[a].prefilled <
                     requests[b].in.tokens - requests[b].prefilled;
            });
  PrefillShares shares(
      std::max<uint64_t>(1, options_.prefill_tokens_per_round));
  for (size_t i : round.prefills) {
    shares.Add(OwnerOf(requests[i]),
               requests[i].in.tokens - requests[i].prefilled);
  }
  shares.Split();
  uint64_t workspace = 0;  // of the chunkwise round, for the slices so far
  std::vector<PrefillItem> slices;
  std::vector<size_t> slice_request;
  const uint64_t C = std::max<uint32_t>(1, options_.chunkwise.chunk_size);
  for (size_t i : round.prefills) {
    Request& r = requests[i];
    uint64_t share = shares.Next(OwnerOf(r));
    // Its chunkwise jobs: round_chunks at most per head in one Run.
    const Attention& attention = r.session->attention();
    const uint64_t per_chunk = uint64_t{attention.num_heads()} *
                               runner_.WorkspaceBytesPerJob(attention.spec());
    const uint64_t room = options_.prefill_workspace_bytes > workspace
                              ? options_.prefill_workspace_bytes - workspace
                              : 0;
    uint64_t chunks = room / std::max<uint64_t>(per_chunk, 1);
    if (chunks == 0) {
      if (!slices.empty()) {
        round.done[i] = false;  // its turn is next round
        continue;
      }
      chunks = 1;
    }
    if (chunks < options_.chunkwise.round_chunks) {
      share = std::min(share, chunks * C);
    }
    if (!StartPrefill(r, share, &round.results[i])) {
      round.done[i] = false;  // waits for memory
      continue;
    }
    if (!round.results[i].ok() || r.in.tokens == 0) continue;
    shares.Took(OwnerOf(r), r.slice);
    workspace += per_chunk * std::min<uint64_t>(options_.chunkwise.round_chunks,
                                                (r.slice + C - 1) / C);
    const AttentionSpec& spec = r.session->spec();
    const uint64_t vv = uint64_t{spec.num_heads} * spec.value_dim;
    const uint64_t t0 = r.prefilled;
    SequenceInput slice = TokenOf(spec, r.in, t0);
    slice.tokens = r.slice;
    slices.push_back({&r.session->attention(), &*r.copy, slice,
                      SequenceOutput{r.out.output + t0 * vv,
                                     r.out.denominator + t0 * spec.num_heads,
                                     r.out.available + t0 * spec.num_heads}});
    slice_request.push_back(i);
  }
  if (!slices.empty()) {
    round.prefill_slices = slices.size();
    std::vector<absl::Status> refused(slices.size());
    const absl::Status s =
        runner_.Run(slices, PrefillCommit::kInPlace, refused);
    for (size_t p = 0; p < slices.size(); ++p) {
      const size_t i = slice_request[p];
      Request& r = requests[i];
      round.results[i] = AsRequest(s.ok() ? refused[p] : s);
      if (round.results[i].code() == absl::StatusCode::kInvalidArgument) {
        // A value that is not finite, named by its index in the slice: name
        // it in the whole request.
        const absl::Status named =
            CheckSliceFinite(r.session->spec(), r.in, r.prefilled, r.slice);
        if (!named.ok()) round.results[i] = named;
      }
      if (!round.results[i].ok()) continue;
      r.prefilled += r.slice;
      round.prefill_tokens += r.slice;
      if (r.prefilled < r.in.tokens) round.done[i] = false;
    }
  }
  // Prefills that finished commit, if their callers are still there.
  for (size_t i : round.prefills) {
    Request& r = requests[i];
    if (!round.done[i] || !r.copy.has_value()) continue;
    if (round.results[i].ok()) round.results[i] = r.caller.Check();
    if (round.results[i].ok()) round.committing.push_back(i);
  }
}

void Scheduler::CommitRound(Round& round) {
  // With a durable store, the round's changes are recorded before any of
  // them is made (docs/design.md §4, "Durable sessions"): the inputs of the
  // steps that passed their checks and the prefills' resulting states, as
  // one group commit. A request the commit does not take changes nothing.
  RoundCommit commit(options_.store);
  if (!commit.durable()) return;
  std::vector<size_t> request_of;  // by commit request number
  for (size_t b = 0; b < round.steps.size();) {
    const size_t i = round.step_request[b];
    size_t e = b;
    while (e < round.steps.size() && round.step_request[e] == i) ++e;
    if (round.results[i].ok()) {
      const Request& r = round.requests[i];
      commit.Begin();
      request_of.push_back(i);
      for (size_t j = b; j < e; ++j) {
        const AttentionSession& session =
            r.kind == Kind::kStepGroup ? *r.group[j - b].session : *r.session;
        commit.records().AddStep(session, round.steps[j].token,
                                 j == b ? static_cast<uint32_t>(e - b) : 0);
      }
    }
    b = e;
  }
  for (size_t i : round.committing) {
    commit.Begin();
    request_of.push_back(i);
    commit.records().AddState(*round.requests[i].session,
                              *round.requests[i].copy);
  }
  if (request_of.empty()) return;
  commit.Commit();
  for (uint32_t n = 0; n < request_of.size(); ++n) {
    const size_t i = request_of[n];
    if (absl::Status s = commit.Outcome(n); !s.ok()) {
      round.results[i] = s;
      RefuseSteps(round, i);
    }
  }
  std::erase_if(round.committing,
                [&](size_t i) { return !round.results[i].ok(); });
}

void Scheduler::RunRoundSteps(Round& round) {
  uint64_t state_bytes = 0;
  bool any = false;
  for (size_t j = 0; j < round.steps.size(); ++j) {
    if (!round.step_results[j].ok()) continue;
    any = true;
    state_bytes += round.steps[j].state->bytes();
  }
  if (!any) return;
  round.one_thread = state_bytes <= options_.single_thread_step_bytes;
  omp_set_num_threads(round.one_thread ? 1 : executor_->max_threads());
  RunCheckedSteps(round.steps, round.step_results, round.grown);
  omp_set_num_threads(executor_->max_threads());
}

void Scheduler::ApplyPrefills(Round& round) {
  for (size_t i : round.committing) {
    Request& r = round.requests[i];
    r.session->state() = *std::move(r.copy);  // the commit
  }
  // Working copies go back: of prefills that finished (or failed), and of
  // callers that went between rounds.
  for (size_t i = 0; i < round.requests.size(); ++i) {
    Request& r = round.requests[i];
    if (!r.copy.has_value() || (!round.done[i] && !round.gone[i])) continue;
    r.copy.reset();
    r.copy_lease.Release();
    --prefills_under_way_;
  }
}

void Scheduler::RunWork(Round& round) {
  for (size_t i = 0; i < round.requests.size(); ++i) {
    Request& r = round.requests[i];
    if (r.kind != Kind::kWork || round.gone[i]) continue;
    try {
      round.results[i] = std::move(r.work)(*r.session);
    } catch (const std::bad_alloc&) {
      round.results[i] = absl::ResourceExhaustedError(
          "memory: an allocation for this request failed");
    }
  }
}

void Scheduler::RecordRound(const Round& round) {
  uint64_t steps = 0;
  for (const absl::Status& s : round.step_results) steps += s.ok() ? 1 : 0;
  std::lock_guard<std::mutex> lock(mu_);
  ++stats_.rounds;
  stats_.steps += steps;
  stats_.step_batches += steps == 0 ? 0 : 1;
  stats_.single_thread_step_batches += round.one_thread ? 1 : 0;
  stats_.largest_step_batch = std::max(stats_.largest_step_batch, steps);
  stats_.prefills += round.committing.size();
  stats_.prefill_batches += round.prefill_slices == 0 ? 0 : 1;
  stats_.prefill_tokens += round.prefill_tokens;
  stats_.prefill_workspace_bytes = runner_.workspace_bytes();
}

void Scheduler::AnswerRound(Round& round, std::vector<Request>& unfinished) {
  for (size_t i = 0; i < round.requests.size(); ++i) {
    Request& r = round.requests[i];
    if (!round.done[i]) {
      unfinished.push_back(std::move(r));
      continue;
    }
    // A step or prefill that succeeded changed its sessions (a prefill of
    // no tokens aside); other work only read them.
    const bool stepped = round.results[i].ok() && r.kind != Kind::kWork &&
                         !(r.kind == Kind::kPrefill && r.in.tokens == 0);
    ForEachSession(r, [stepped](AttentionSession& s) {
      s.Publish(stepped);
      s.pending().fetch_sub(1);
    });
    std::move(r.done)(std::move(round.results[i]));
  }
}

}  // namespace linattn
