//===- apc/support/deadline.h - A point in time a stage must stop by -------===//
//
// The planner's stages (building the problem, the reductions, the solver, the memory search) stop
// at deadlines that their callers derive from the one time limit of a plan. A Deadline is such a
// point on the steady clock, or none (the stage runs to the end). It replaces the
// std::optional<std::chrono::steady_clock::time_point> that was passed around before, with the
// few operations the stages use: whether it has passed (strictly after it, as every check always
// was), the seconds left, the earlier of two.
//
//===----------------------------------------------------------------------===//
#pragma once

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>

namespace apc {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  /// No deadline: never passes, infinitely many seconds left.
  Deadline() = default;
  static Deadline none() { return Deadline(); }
  /// At time point `t`.
  static Deadline at(Clock::time_point t) {
    Deadline d;
    d.t_ = t;
    return d;
  }
  /// `seconds` after `start` (clamped to 1e9 s, about 31 years, so that a huge time limit does
  /// not overflow the clock).
  static Deadline after(Clock::time_point start, double seconds) {
    return at(start + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(std::min(seconds, 1e9))));
  }
  /// `seconds` from now (after(Clock::now(), seconds)).
  static Deadline in(double seconds) { return after(Clock::now(), seconds); }

  /// Whether there is one.
  bool isSet() const { return t_.has_value(); }
  explicit operator bool() const { return isSet(); }
  /// The time point; only when isSet().
  Clock::time_point time() const { return *t_; }

  /// Whether the clock is past it (strictly); never without one.
  bool passed() const { return t_ && Clock::now() > *t_; }
  /// Seconds from now until it (negative once passed); +infinity without one.
  double secondsLeft() const { return secondsLeft(Clock::now()); }
  /// The same from `now` (a caller that reads the clock once for several uses).
  double secondsLeft(Clock::time_point now) const {
    if (!t_) return std::numeric_limits<double>::infinity();
    return std::chrono::duration<double>(*t_ - now).count();
  }
  /// The earlier of the two (a deadline is earlier than none).
  Deadline earlier(const Deadline& o) const {
    if (!t_) return o;
    if (!o.t_) return *this;
    return *o.t_ < *t_ ? o : *this;
  }

  bool operator==(const Deadline& o) const { return t_ == o.t_; }

 private:
  std::optional<Clock::time_point> t_;
};

}  // namespace apc
