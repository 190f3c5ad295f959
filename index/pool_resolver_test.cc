#include "index/pool_resolver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace prefixd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;

using Answer = absl::StatusOr<std::vector<std::string>>;

// Answers the resolver would give, one per lookup.
class Script {
 public:
  explicit Script(std::vector<Answer> answers)
      : answers_(answers.begin(), answers.end()) {}
  PoolResolver::Resolve resolve() {
    return [this](const std::string& host) {
      hosts_.push_back(host);
      Answer a = std::move(answers_.front());
      answers_.pop_front();
      return a;
    };
  }
  const std::vector<std::string>& hosts() const { return hosts_; }

 private:
  std::deque<Answer> answers_;
  std::vector<std::string> hosts_;
};

Answer Unanswered() {
  return absl::UnavailableError(
      "resolving \"pool.test\": Temporary failure in name resolution");
}

TEST(PoolResolver, AnAnswerIsTheAddressesEvenNone) {
  Script s({std::vector<std::string>{}, std::vector<std::string>{},
            std::vector<std::string>{"10.0.0.1"},
            std::vector<std::string>{"10.0.0.1"}, std::vector<std::string>{}});
  PoolResolver r("p", "pool p (tcp://pool.test:5557)", "pool.test",
                 s.resolve());
  testing::internal::CaptureStderr();
  EXPECT_THAT(r.Next(), Optional(ElementsAre()));  // the first, of nothing
  EXPECT_EQ(r.Next(), std::nullopt);               // the same
  EXPECT_THAT(r.Next(), Optional(ElementsAre("10.0.0.1")));
  EXPECT_EQ(r.Next(), std::nullopt);
  EXPECT_THAT(r.Next(), Optional(ElementsAre()));  // NXDOMAIN: gone
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(log,
            "prefixd: pool p (tcp://pool.test:5557): pool.test resolves to 0 "
            "addresses\n"
            "prefixd: pool p (tcp://pool.test:5557): pool.test resolves to 1 "
            "address: 10.0.0.1\n"
            "prefixd: pool p (tcp://pool.test:5557): pool.test resolves to 0 "
            "addresses\n");
  EXPECT_THAT(s.hosts(), ElementsAre("pool.test", "pool.test", "pool.test",
                                     "pool.test", "pool.test"));
}

// A DNS outage used to read as "no addresses": every worker of the pool
// was retired, and each caught up from scratch when the name came back.
TEST(PoolResolver, AnUnansweredLookupLeavesTheLastAnswer) {
  const std::vector<std::string> two = {"10.0.0.1", "10.0.0.2"};
  Script s({two, Unanswered(), Unanswered(), two, Unanswered(),
            std::vector<std::string>{"10.0.0.2"}});
  PoolResolver r("sg", "SGLang pool sg (http://pool.test:30000)", "pool.test",
                 s.resolve());
  testing::internal::CaptureStderr();
  EXPECT_THAT(r.Next(), Optional(ElementsAre("10.0.0.1", "10.0.0.2")));
  EXPECT_EQ(r.Next(), std::nullopt);
  EXPECT_EQ(r.Next(), std::nullopt);
  EXPECT_EQ(r.Next(), std::nullopt);  // answered again, the same
  EXPECT_EQ(r.Next(), std::nullopt);
  EXPECT_THAT(r.Next(), Optional(ElementsAre("10.0.0.2")));
  const PoolLookups n = r.lookups();
  EXPECT_EQ(n.source, "sg");
  EXPECT_EQ(n.answered, 3u);
  EXPECT_EQ(n.failed, 3u);
  EXPECT_EQ(n.addresses, 1u);
  const std::string log = testing::internal::GetCapturedStderr();
  const std::string pool = "prefixd: SGLang pool sg (http://pool.test:30000): ";
  EXPECT_EQ(log,
            pool + "pool.test resolves to 2 addresses: 10.0.0.1, 10.0.0.2\n" +
                pool +
                "resolving \"pool.test\": Temporary failure in name "
                "resolution; its last answer (2 addresses: 10.0.0.1, "
                "10.0.0.2) stands until it resolves\n" +
                pool +
                "pool.test resolves again, to 2 addresses: 10.0.0.1, "
                "10.0.0.2\n" +
                pool +
                "resolving \"pool.test\": Temporary failure in name "
                "resolution; its last answer (2 addresses: 10.0.0.1, "
                "10.0.0.2) stands until it resolves\n" +
                pool + "pool.test resolves again, to 1 address: 10.0.0.2\n");
}

TEST(PoolResolver, NoAnswerYetFollowsNothing) {
  Script s({Unanswered(), std::vector<std::string>{"10.0.0.1"}});
  PoolResolver r("p", "pool p (tcp://pool.test:5557)", "pool.test",
                 s.resolve());
  testing::internal::CaptureStderr();
  EXPECT_EQ(r.Next(), std::nullopt);
  EXPECT_THAT(r.Next(), Optional(ElementsAre("10.0.0.1")));
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, HasSubstr("no address is followed until it resolves\n"));
  EXPECT_THAT(log, HasSubstr("pool.test resolves again, to 1 address: "
                             "10.0.0.1\n"));
}

}  // namespace
}  // namespace prefixd
