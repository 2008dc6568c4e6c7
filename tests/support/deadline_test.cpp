//===- tests/support/deadline_test.cpp - apc::Deadline ---------------------===//
#include "apc/support/deadline.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

namespace apc {
namespace {

using Clock = std::chrono::steady_clock;

TEST(Deadline, NoneNeverPasses) {
  Deadline d;
  EXPECT_FALSE(d.isSet());
  EXPECT_FALSE(static_cast<bool>(d));
  EXPECT_FALSE(d.passed());
  EXPECT_TRUE(std::isinf(d.secondsLeft()));
  EXPECT_EQ(d, Deadline::none());
}

TEST(Deadline, AtAndIn) {
  const auto now = Clock::now();
  Deadline past = Deadline::at(now - std::chrono::seconds(1));
  EXPECT_TRUE(past.isSet());
  EXPECT_TRUE(past.passed());
  EXPECT_LT(past.secondsLeft(), 0);
  EXPECT_EQ(past.time(), now - std::chrono::seconds(1));
  Deadline later = Deadline::in(3600);
  EXPECT_FALSE(later.passed());
  EXPECT_GT(later.secondsLeft(), 3500);
  EXPECT_LE(later.secondsLeft(), 3600);
  // secondsLeft(now) reads no clock: exact.
  EXPECT_DOUBLE_EQ(Deadline::after(now, 2.5).secondsLeft(now), 2.5);
  // A huge time limit is clamped, not overflowed.
  EXPECT_NEAR(Deadline::after(now, 1e300).secondsLeft(now), 1e9, 1);
}

TEST(Deadline, EarlierOfTwo) {
  const auto now = Clock::now();
  Deadline a = Deadline::after(now, 1), b = Deadline::after(now, 2);
  EXPECT_EQ(a.earlier(b), a);
  EXPECT_EQ(b.earlier(a), a);
  EXPECT_EQ(a.earlier(Deadline::none()), a);
  EXPECT_EQ(Deadline::none().earlier(b), b);
  EXPECT_EQ(Deadline::none().earlier(Deadline::none()), Deadline::none());
}

}  // namespace
}  // namespace apc
