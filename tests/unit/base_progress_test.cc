// ProgressThrottle (include/ckpt/options.h): the pace the CLI's progress line and the Python
// module's callback share.

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "ckpt/options.h"

namespace ckpt {
namespace {

using std::chrono::milliseconds;

TEST(ProgressThrottle, EveryIntervalAndTheLastOnce) {
  ProgressThrottle pace(milliseconds(50));
  EXPECT_TRUE(pace.due(1, 10, false).owns_lock());   // the first report
  EXPECT_FALSE(pace.due(2, 10, false).owns_lock());  // too soon after it
  std::this_thread::sleep_for(milliseconds(60));
  EXPECT_TRUE(pace.due(3, 10, false).owns_lock());
  EXPECT_TRUE(pace.due(10, 10, true).owns_lock());   // the last: at once
  EXPECT_FALSE(pace.due(10, 10, true).owns_lock());  // and once
  pace.restart();                                    // a new phase
  EXPECT_TRUE(pace.due(10, 10, true).owns_lock());
}

TEST(ProgressThrottle, NothingBeforeTheDelayLastIncluded) {
  ProgressThrottle pace(milliseconds(0), milliseconds(200));
  EXPECT_FALSE(pace.due(1, 2, false).owns_lock());
  EXPECT_FALSE(pace.due(2, 2, true).owns_lock());  // a quick operation shows nothing
  ProgressThrottle later(milliseconds(0), milliseconds(20));
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_TRUE(later.due(1, 2, false).owns_lock());
}

TEST(ProgressThrottle, AReportDuringAnotherIsDroppedTheLastWaits) {
  ProgressThrottle pace(milliseconds(0));
  auto turn = pace.due(1, 3, false);
  ASSERT_TRUE(turn.owns_lock());
  bool dropped = false;
  std::thread other([&] { dropped = !pace.due(2, 3, false).owns_lock(); });
  other.join();
  EXPECT_TRUE(dropped);
  bool shown = false;
  std::thread last([&] { shown = pace.due(3, 3, true).owns_lock(); });
  std::this_thread::sleep_for(milliseconds(20));
  turn.unlock();
  last.join();
  EXPECT_TRUE(shown);
}

}  // namespace
}  // namespace ckpt
