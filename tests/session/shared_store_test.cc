// Replicas sharing sessions through a real Redis (redis-server started here
// on a loopback port): a session one replica wrote is resumed by another bit
// for bit; the replica it was taken from can no longer write it (its writes
// are fenced by the epoch) and lets it go; a holder that is asked hands a
// session over at once; an id the store holds cannot be created twice; a
// delete reaches every replica; and a Redis that goes away fails requests
// cleanly, losing nothing that was acknowledged.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <random>
#include <thread>

#include "core/attention/recurrent.h"
#include "core/scheduler/scheduler.h"
#include "core/session/durable_store.h"
#include "core/session/round_commit.h"
#include "core/session/snapshot.h"
#include "core/util/status_macros.h"
#include "server/redis/redis_shared_store.h"
#include "server/replica/shared_record_log.h"
#include "tests/util/redis_server.h"
#include "tests/util/temp_dir.h"

namespace linattn {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

std::string PositionAndState(const AttentionState& state);

// One replica: its store, its table, its scheduler, and its heartbeat
// (which `paused` stops, as a SIGSTOP would).
struct Replica {
  std::unique_ptr<DurableStore> store;
  std::unique_ptr<SessionManager> table;
  std::unique_ptr<Scheduler> scheduler;
  std::atomic<bool> paused{false}, stop{false};
  std::thread heart;

  ~Replica() {
    stop = true;
    if (heart.joinable()) heart.join();
  }

  static absl::StatusOr<std::unique_ptr<Replica>> Open(
      const std::string& url, const std::string& name,
      milliseconds lease = milliseconds(400)) {
    auto r = std::make_unique<Replica>();
    LINATTN_ASSIGN_OR_RETURN(
        std::unique_ptr<SharedStore> shared,
        RedisSharedStore::Open({.url = url,
                                .replica = name,
                                .lease = lease,
                                .timeout = milliseconds(1000)}));
    DurableStoreOptions options;
    options.log = std::make_shared<SharedRecordLog>(std::move(shared));
    LINATTN_ASSIGN_OR_RETURN(r->store, DurableStore::Open(options));
    LINATTN_ASSIGN_OR_RETURN(
        r->table, SessionManager::Create({.observer = r->store.get()}));
    LINATTN_RETURN_IF_ERROR(r->store->Recover(*r->table, {}).status());
    r->scheduler =
        std::make_unique<Scheduler>(SchedulerOptions{.store = r->store.get()});
    r->heart = std::thread([p = r.get(), lease] {
      auto next = std::chrono::steady_clock::now();
      while (!p->stop) {
        if (std::chrono::steady_clock::now() >= next) {
          if (!p->paused) (void)p->store->replica()->Beat();
          next += lease / 4;
        }
        std::this_thread::sleep_for(milliseconds(10));
      }
    });
    return r;
  }

  absl::StatusOr<std::shared_ptr<AttentionSession>> Create(
      const std::string& id, const AttentionSpec& spec) {
    LINATTN_ASSIGN_OR_RETURN(auto s,
                             table->CreateSession(spec, std::nullopt, id));
    LINATTN_RETURN_IF_ERROR(store->AwaitCreate(*table, *s));
    return s;
  }

  // One step of session `id` with input `x` (looked up as a request is).
  absl::Status Step(const std::string& id, const std::vector<float>& x) {
    LINATTN_ASSIGN_OR_RETURN(auto s, table->FindAttention(id));
    return StepSession(s, x);
  }
  // The same on a session looked up before (as a Decode stream's message
  // waiting while its replica was paused).
  absl::Status StepSession(const std::shared_ptr<AttentionSession>& s,
                           const std::vector<float>& x) {
    const AttentionSpec& spec = s->spec();
    const uint64_t qk = spec.num_heads * spec.key_dim;
    std::vector<float> y(spec.num_heads * spec.value_dim), den(spec.num_heads);
    std::vector<uint8_t> avail(spec.num_heads);
    std::promise<absl::Status> done;
    scheduler->Step(s, {x.data(), x.data() + qk, x.data() + 2 * qk, 1},
                    {y.data(), den.data(), avail.data()},
                    [&](absl::Status st) { done.set_value(st); });
    return done.get_future().get();
  }

  // The session's position and state (through a lookup, so a takeover).
  absl::StatusOr<std::string> Contents(const std::string& id) {
    LINATTN_ASSIGN_OR_RETURN(auto s, table->FindAttention(id));
    std::promise<std::string> blob;
    scheduler->Run(
        s,
        [&](AttentionSession& a) {
          blob.set_value(PositionAndState(a.state()));
          return absl::OkStatus();
        },
        [](absl::Status) {});
    return blob.get_future().get();
  }
};

// A state's position and floats, as bytes: what two replicas must agree
// on bit for bit.
std::string PositionAndState(const AttentionState& state) {
  std::string out = std::to_string(state.position()) + ":";
  out.append(reinterpret_cast<const char*>(state.data()),
             state.size() * sizeof(float));
  return out;
}

const AttentionSpec kSpec{.num_heads = 2, .key_dim = 8, .value_dim = 8};

// Token t's input (q, k, v), the same for every replica.
std::vector<float> Input(uint64_t t) {
  std::mt19937 rng(static_cast<uint32_t>(t * 7919 + 1));
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(3 * 16);
  for (float& f : x) f = u(rng);
  return x;
}

// PositionAndState of a session that took tokens [0, n) one by one.
std::string Expected(uint64_t n) {
  Attention attention = *Attention::Create(kSpec);
  AttentionState state = attention.NewState();
  std::vector<float> y(16), den(2);
  std::vector<uint8_t> avail(2);
  for (uint64_t t = 0; t < n; ++t) {
    const std::vector<float> x = Input(t);
    EXPECT_TRUE(Step(attention, state,
                     {x.data(), x.data() + 16, x.data() + 32, 1},
                     {y.data(), den.data(), avail.data()})
                    .ok());
  }
  return PositionAndState(state);
}

TEST(SharedStore, AnotherReplicaResumesTheSessionAndTheOldOwnerIsFenced) {
  testing::TempDir dir;
  testing::RedisServer redis(dir.Path(""));
  auto a = Replica::Open(redis.url(), "a");
  auto b = Replica::Open(redis.url(), "b");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  ASSERT_TRUE((*a)->Create("s1", kSpec).ok());
  for (uint64_t t = 0; t < 5; ++t) ASSERT_TRUE((*a)->Step("s1", Input(t)).ok());
  auto held = (*a)->table->FindAttention("s1");
  ASSERT_TRUE(held.ok());

  // A stops renewing its lease (a pause): once it lapses, B takes the
  // session.
  (*a)->paused = true;
  auto taken = (*b)->Contents("s1");
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, Expected(5));
  ASSERT_TRUE((*b)->Step("s1", Input(5)).ok());

  // A's step that was under way carries the old epoch: refused, nothing
  // written, and the session leaves A.
  const absl::Status late = (*a)->StepSession(*held, Input(5));
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted) << late;
  EXPECT_THAT(late.message(), HasSubstr("taken over by another replica"));
  EXPECT_FALSE((*a)->table->Contains("s1"));
  // A request that reaches A again cannot take it from B, which holds it
  // (and is not asked here to hand it over).
  EXPECT_EQ((*a)->Step("s1", Input(5)).code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE((*b)->Step("s1", Input(6)).ok());

  // A third replica reads what B wrote, and nothing of A's late steps.
  auto c = Replica::Open(redis.url(), "c");
  ASSERT_TRUE(c.ok());
  (*b)->paused = true;
  ASSERT_TRUE((*b)->store->replica()->DropLease().ok());
  auto resumed = (*c)->Contents("s1");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(*resumed, Expected(7));
}

TEST(SharedStore, AHolderThatIsAskedHandsTheSessionOverAtOnce) {
  testing::TempDir dir;
  testing::RedisServer redis(dir.Path(""));
  // A long lease: only the hand-over can make this quick.
  auto a = Replica::Open(redis.url(), "a", milliseconds(60'000));
  auto b = Replica::Open(redis.url(), "b", milliseconds(60'000));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Create("s1", kSpec).ok());
  for (uint64_t t = 0; t < 3; ++t) ASSERT_TRUE((*a)->Step("s1", Input(t)).ok());

  // A's hand-over thread, as the server runs it.
  std::thread holder([&] {
    for (int i = 0; i < 5; ++i) {
      auto wanted = (*a)->store->replica()->AwaitWanted();
      ASSERT_TRUE(wanted.ok()) << wanted.status();
      if (wanted->empty()) continue;
      EXPECT_EQ(wanted->front().first, "s1");
      EXPECT_TRUE(
          (*a)->store->replica()->HandOver(*wanted, /*release=*/true).ok());
      return;
    }
  });
  const auto start = std::chrono::steady_clock::now();
  auto taken = (*b)->Contents("s1");
  const auto took = std::chrono::steady_clock::now() - start;
  holder.join();
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, Expected(3));
  EXPECT_LT(took, std::chrono::seconds(5));
  EXPECT_FALSE((*a)->table->Contains("s1"));
  // A request that reaches A now takes it back the same way.
  ASSERT_TRUE((*b)->Step("s1", Input(3)).ok());
}

TEST(SharedStore, AnIdTheStoreHoldsCannotBeCreatedAgainAndDeletesReachAll) {
  testing::TempDir dir;
  testing::RedisServer redis(dir.Path(""));
  auto a = Replica::Open(redis.url(), "a");
  auto b = Replica::Open(redis.url(), "b");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Create("s1", kSpec).ok());
  auto twice = (*b)->Create("s1", kSpec);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kAlreadyExists)
      << twice.status();
  EXPECT_THAT(twice.status().message(), HasSubstr("session_id: 's1'"));
  EXPECT_FALSE((*b)->table->Contains("s1"));

  ASSERT_TRUE(
      (*a)->store->Delete(*(*a)->table, "s1", SessionKind::kAttention).ok());
  EXPECT_EQ((*b)->table->FindAttention("s1").status().code(),
            absl::StatusCode::kNotFound);
  // The id is free again, on any replica.
  ASSERT_TRUE((*b)->Create("s1", kSpec).ok());
  ASSERT_TRUE((*b)->Step("s1", Input(0)).ok());
  (*b)->paused = true;
  ASSERT_TRUE((*b)->store->replica()->DropLease().ok());
  auto c = Replica::Open(redis.url(), "c");
  ASSERT_TRUE(c.ok());
  auto got = (*c)->Contents("s1");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, Expected(1));
}

TEST(SharedStore, ARedisThatGoesAwayFailsStepsCleanlyAndLosesNothing) {
  testing::TempDir dir;
  testing::RedisServer redis(dir.Path(""));
  auto a = Replica::Open(redis.url(), "a", milliseconds(60'000));
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->Create("s1", kSpec).ok());
  for (uint64_t t = 0; t < 4; ++t) ASSERT_TRUE((*a)->Step("s1", Input(t)).ok());

  redis.Kill();
  const absl::Status down = (*a)->Step("s1", Input(4));
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  // Whether that write landed is not known: the session leaves the table,
  // and while Redis is away it cannot come back.
  EXPECT_FALSE((*a)->table->Contains("s1"));
  EXPECT_EQ((*a)->table->FindAttention("s1").status().code(),
            absl::StatusCode::kUnavailable);

  // Back (from its append-only file): the store says where s1 stands.
  redis.Start();
  auto back = (*a)->Contents("s1");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, Expected(4));
  ASSERT_TRUE((*a)->Step("s1", Input(4)).ok());
  auto after = (*a)->Contents("s1");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(*after, Expected(5));
}

// A session deleted here whose delete is not written yet is not released
// to a replica that asks for it: the asker waits (and gives up), and once
// the delete is written the session is gone everywhere. (Released, the
// other replica would take it over and keep a session its client deleted.)
TEST(SharedStore, ASessionBeingDeletedIsNotHandedOver) {
  testing::TempDir dir;
  testing::RedisServer redis(dir.Path(""));
  auto a = Replica::Open(redis.url(), "a");
  auto b = Replica::Open(redis.url(), "b");
  ASSERT_TRUE(a.ok() && b.ok());
  auto s1 = (*a)->Create("s1", kSpec);
  ASSERT_TRUE(s1.ok());
  const std::pair<std::string, uint64_t> key{"s1", (*s1)->incarnation()};
  // Deleted from the table; its delete is staged, not yet committed.
  ASSERT_TRUE((*a)->table->Delete("s1", SessionKind::kAttention).ok());
  ASSERT_TRUE((*a)->store->replica()->HandOver({&key, 1}, true).ok());
  auto early = (*b)->Contents("s1");
  EXPECT_EQ(early.status().code(), absl::StatusCode::kUnavailable)
      << early.status();
  ASSERT_TRUE((*a)->store->Tick().ok());
  EXPECT_EQ((*b)->Contents("s1").status().code(), absl::StatusCode::kNotFound);
}

TEST(SharedStore, RequestsOfASessionHandedOverAreRefusedAloneTheRestCommits) {
  testing::TempDir dir;
  testing::RedisServer redis(dir.Path(""));
  auto a = Replica::Open(redis.url(), "a");
  ASSERT_TRUE(a.ok());
  auto s1 = (*a)->Create("s1", kSpec);
  auto s2 = (*a)->Create("s2", kSpec);
  ASSERT_TRUE(s1.ok() && s2.ok());
  // s1 goes to another replica while a request of it is under way.
  const std::pair<std::string, uint64_t> due{"s1", (*s1)->incarnation()};
  ASSERT_TRUE(
      (*a)->store->replica()->HandOver({&due, 1}, /*release=*/true).ok());
  EXPECT_FALSE((*a)->table->Contains("s1"));

  const std::vector<float> x = Input(0);
  const SequenceInput in{x.data(), x.data() + 16, x.data() + 32, 1};
  RoundCommit round((*a)->store.get());
  const uint32_t first = round.Begin();
  round.records().AddStep(**s1, in, 1);
  const uint32_t second = round.Begin();
  round.records().AddStep(**s2, in, 1);
  round.Commit();
  ASSERT_TRUE(round.status().ok()) << round.status();
  EXPECT_EQ(round.Outcome(first).code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(round.Outcome(first).message()),
              HasSubstr("handed over to another replica"));
  EXPECT_TRUE(round.Outcome(second).ok());
  // Without `refused`, such a group is refused whole.
  DurableStore::Group whole;
  whole.BeginRequest();
  whole.AddStep(**s1, in, 1);
  EXPECT_EQ((*a)->store->Commit(std::move(whole)).code(),
            absl::StatusCode::kAborted);

  // What the store holds: s2 took its step, s1 none.
  (*a)->paused = true;
  ASSERT_TRUE((*a)->store->replica()->DropLease().ok());
  auto b = Replica::Open(redis.url(), "b");
  ASSERT_TRUE(b.ok());
  auto got1 = (*b)->Contents("s1");
  auto got2 = (*b)->Contents("s2");
  ASSERT_TRUE(got1.ok() && got2.ok()) << got1.status() << got2.status();
  EXPECT_EQ(*got1, Expected(0));
  EXPECT_EQ(*got2, Expected(1));
}

TEST(RedisUrl, IsParsedAndBadOnesAreRefusedNamingTheProblem) {
  auto u = ParseRedisUrl("redis://10.0.0.7:6380/2");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "10.0.0.7");
  EXPECT_EQ(u->port, 6380);
  EXPECT_EQ(u->db, 2);
  u = ParseRedisUrl("redis://redis");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "redis");
  EXPECT_EQ(u->port, 6379);
  u = ParseRedisUrl("redis://[::1]:7000");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->host, "::1");
  EXPECT_EQ(u->port, 7000);
  EXPECT_THAT(ParseRedisUrl("http://x").status().message(),
              HasSubstr("expected redis://"));
  EXPECT_THAT(ParseRedisUrl("redis://x:99999").status().message(),
              HasSubstr("port"));
  EXPECT_THAT(ParseRedisUrl("redis://x:1/77").status().message(),
              HasSubstr("database"));
  EXPECT_THAT(ParseRedisUrl("redis://:1").status().message(),
              HasSubstr("host"));
}

}  // namespace
}  // namespace linattn
