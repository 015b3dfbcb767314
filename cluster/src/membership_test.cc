#include "oscarkv/cluster/membership.h"

#include <atomic>
#include <map>
#include <set>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "oscarkv/cluster/grpc_prober.h"

namespace oscarkv::cluster {
namespace {

BlockKey KeyN(uint32_t i) {
  BlockKey k;
  for (int b = 0; b < 4; ++b) k.bytes[b] = static_cast<uint8_t>(i >> (8 * b));
  k.bytes[15] = 0x5a;
  return k;
}

class FakeProber : public Prober {
 public:
  explicit FakeProber(std::shared_ptr<absl::Mutex> mu, std::shared_ptr<std::set<std::string>> down)
      : mu_(std::move(mu)), down_(std::move(down)) {}
  bool Probe(const std::string& address, absl::Duration) override {
    absl::MutexLock l(mu_.get());
    return !down_->count(address);
  }

 private:
  std::shared_ptr<absl::Mutex> mu_;
  std::shared_ptr<std::set<std::string>> down_;
};

struct Fixture {
  std::shared_ptr<absl::Mutex> mu = std::make_shared<absl::Mutex>();
  std::shared_ptr<std::set<std::string>> down = std::make_shared<std::set<std::string>>();
  std::unique_ptr<Prober> prober() { return std::make_unique<FakeProber>(mu, down); }
  void SetDown(const std::string& a, bool is_down) {
    absl::MutexLock l(mu.get());
    if (is_down) down->insert(a); else down->erase(a);
  }
};

TEST(Rendezvous, BalancedAndDeterministic) {
  std::vector<std::string> members = {"10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"};
  std::vector<int> counts(3, 0);
  for (uint32_t i = 0; i < 30000; ++i) counts[OwnerIndex(members, KeyN(i))]++;
  for (int c : counts) {
    EXPECT_GT(c, 9000);
    EXPECT_LT(c, 11000);
  }
  EXPECT_EQ(OwnerIndex(members, KeyN(7)), OwnerIndex(members, KeyN(7)));
}

TEST(Rendezvous, RemovingAMemberMovesOnlyItsKeys) {
  std::vector<std::string> all = {"a:1", "b:1", "c:1", "d:1"};
  std::vector<std::string> without_c = {"a:1", "b:1", "d:1"};
  for (uint32_t i = 0; i < 5000; ++i) {
    const std::string before = all[OwnerIndex(all, KeyN(i))];
    const std::string after = without_c[OwnerIndex(without_c, KeyN(i))];
    if (before != "c:1") {
      EXPECT_EQ(before, after);
    }
  }
}

TEST(Rendezvous, GroupByOwnerCoversEveryKeyOnce) {
  std::vector<std::string> members = {"a:1", "b:1"};
  std::vector<BlockKey> keys;
  for (uint32_t i = 0; i < 100; ++i) keys.push_back(KeyN(i));
  auto groups = GroupByOwner(members, keys);
  size_t total = 0;
  for (size_t m = 0; m < groups.size(); ++m) {
    for (size_t idx : groups[m]) EXPECT_EQ(OwnerIndex(members, keys[idx]), m);
    total += groups[m].size();
  }
  EXPECT_EQ(total, keys.size());
}

TEST(Membership, DeadMemberStopsOwningAndRejoins) {
  Fixture f;
  MembershipOptions o;
  o.static_members = {"a:1", "b:1", "c:1"};
  o.probe_interval = absl::Milliseconds(50);
  auto m = *Membership::Start(o, f.prober());
  EXPECT_EQ(m->Live().size(), 3u);
  f.SetDown("b:1", true);
  m->ProbeNow();
  EXPECT_EQ(m->Live(), (std::vector<std::string>{"a:1", "c:1"}));
  for (uint32_t i = 0; i < 200; ++i) EXPECT_NE(*m->OwnerOf(KeyN(i)), "b:1");
  f.SetDown("b:1", false);
  m->ProbeNow();
  EXPECT_EQ(m->Live().size(), 3u);
}

TEST(Membership, BackgroundProbesDetectDeathWithinBound) {
  Fixture f;
  MembershipOptions o;
  o.static_members = {"a:1", "b:1"};
  o.probe_interval = absl::Milliseconds(100);
  auto m = *Membership::Start(o, f.prober());
  f.SetDown("a:1", true);
  const absl::Time start = absl::Now();
  while (m->Live().size() != 1 && absl::Now() - start < absl::Seconds(5)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(m->Live(), std::vector<std::string>{"b:1"});
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
}

TEST(Membership, MarkDownIsImmediate) {
  Fixture f;
  MembershipOptions o;
  o.static_members = {"a:1", "b:1"};
  o.probe_interval = absl::Seconds(60);
  auto m = *Membership::Start(o, f.prober());
  m->MarkDown("a:1");
  EXPECT_EQ(m->Live(), std::vector<std::string>{"b:1"});
  m->ProbeNow();  // it still answers probes, so it comes back
  EXPECT_EQ(m->Live().size(), 2u);
}

// Answers every probe at once, except that once armed, the next probe of `address` answers
// "up" and then waits for Resume() before returning: an answer obtained just before the member
// hung, held while a failing call marks the member down.
class HeldAnswerProber : public Prober {
 public:
  struct Gate {
    std::string address;
    absl::Notification armed, answered, resume;
  };
  explicit HeldAnswerProber(std::shared_ptr<Gate> gate) : gate_(std::move(gate)) {}
  bool Probe(const std::string& address, absl::Duration) override {
    if (address == gate_->address && gate_->armed.HasBeenNotified() &&
        !gate_->answered.HasBeenNotified()) {
      gate_->answered.Notify();
      gate_->resume.WaitForNotification();
    }
    return true;
  }

 private:
  std::shared_ptr<Gate> gate_;
};

TEST(Membership, ProbeAnswerFromBeforeMarkDownDoesNotUndoIt) {
  auto gate = std::make_shared<HeldAnswerProber::Gate>();
  gate->address = "a:1";
  MembershipOptions o;
  o.static_members = {"a:1", "b:1"};
  o.probe_interval = absl::Seconds(60);  // only the rounds this test runs
  auto m = *Membership::Start(o, std::make_unique<HeldAnswerProber>(gate));
  ASSERT_EQ(m->Live().size(), 2u);
  gate->armed.Notify();
  std::thread round([&] { m->ProbeNow(); });
  gate->answered.WaitForNotification();  // a:1 answered "up"; the round has not applied it
  m->MarkDown("a:1");                    // then a call to a:1 failed
  EXPECT_EQ(m->Live(), std::vector<std::string>{"b:1"});
  gate->resume.Notify();
  round.join();
  EXPECT_EQ(m->Live(), std::vector<std::string>{"b:1"}) << "a stale probe answer revived a:1";
  for (const auto& st : m->All()) {
    if (st.address == "a:1") {
      EXPECT_FALSE(st.live);
    }
  }
  // A round that starts after the mark-down brings it back (it still answers).
  m->ProbeNow();
  EXPECT_EQ(m->Live().size(), 2u);
}

// The same when the member was already down (marked by an earlier call, or by the prober) and
// a call through a stale route fails on it again while a round is under way.
TEST(Membership, MarkDownOfADownMemberAlsoOutranksARoundUnderWay) {
  auto gate = std::make_shared<HeldAnswerProber::Gate>();
  gate->address = "a:1";
  MembershipOptions o;
  o.static_members = {"a:1", "b:1"};
  o.probe_interval = absl::Seconds(60);
  auto m = *Membership::Start(o, std::make_unique<HeldAnswerProber>(gate));
  m->MarkDown("a:1");
  gate->armed.Notify();
  std::thread round([&] { m->ProbeNow(); });
  gate->answered.WaitForNotification();
  m->MarkDown("a:1");
  gate->resume.Notify();
  round.join();
  EXPECT_EQ(m->Live(), std::vector<std::string>{"b:1"});
  m->ProbeNow();
  EXPECT_EQ(m->Live().size(), 2u);
}

TEST(Membership, DnsMembersJoinAndLeave) {
  Fixture f;
  auto names = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"x:1", "y:1"});
  auto fail = std::make_shared<std::atomic<bool>>(false);
  Resolver r = [names, fail](const std::string&) -> absl::StatusOr<std::vector<std::string>> {
    if (*fail) return absl::UnavailableError("dns down");
    return *names;
  };
  MembershipOptions o;
  o.dns_name = "oscarkv.default.svc:50051";
  o.probe_interval = absl::Seconds(60);
  auto m = *Membership::Start(o, f.prober(), r);
  EXPECT_EQ(m->Live().size(), 2u);
  *names = {"x:1", "y:1", "z:1"};
  m->ProbeNow();
  EXPECT_EQ(m->Live().size(), 3u);
  *fail = true;  // a DNS failure keeps the last known members
  m->ProbeNow();
  EXPECT_EQ(m->Live().size(), 3u);
  *fail = false;
  *names = {"z:1"};
  m->ProbeNow();
  EXPECT_EQ(m->Live(), std::vector<std::string>{"z:1"});
}

TEST(Membership, NoLiveMemberIsUnavailable) {
  Fixture f;
  f.SetDown("a:1", true);
  MembershipOptions o;
  o.static_members = {"a:1"};
  auto m = *Membership::Start(o, f.prober());
  EXPECT_TRUE(absl::IsUnavailable(m->OwnerOf(KeyN(1)).status()));
}

TEST(Membership, BadOptions) {
  Fixture f;
  EXPECT_FALSE(Membership::Start(MembershipOptions{}, f.prober()).ok());
  MembershipOptions o;
  o.static_members = {"a:1"};
  o.failures_to_dead = 0;
  EXPECT_FALSE(Membership::Start(o, f.prober()).ok());
}

TEST(Resolve, LocalhostAndErrors) {
  auto r = ResolveAll("127.0.0.1:50051");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, std::vector<std::string>{"127.0.0.1:50051"});
  EXPECT_FALSE(ResolveAll("no-port").ok());
  EXPECT_FALSE(ResolveAll("host.invalid:1").ok());
}

TEST(GrpcProber, NothingListeningIsDownQuickly) {
  auto p = NewGrpcProber();
  const absl::Time start = absl::Now();
  EXPECT_FALSE(p->Probe("127.0.0.1:1", absl::Milliseconds(300)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

}  // namespace
}  // namespace oscarkv::cluster
