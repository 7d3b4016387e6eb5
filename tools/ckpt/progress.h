#pragma once
// The progress line of long commands: one line on stderr, redrawn in place — bytes done and
// total, percent, rate and time left. By default drawn only when stderr is a terminal and once the
// work has taken a quarter of a second (quick commands print nothing extra); --progress draws it
// anyway, from the start, ending with the 100% line; --no-progress never.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <mutex>
#include <string>

#include "ckpt/options.h"
#include "ckpt/sink.h"

namespace ckpt::cli {

enum class ProgressMode { kAuto, kOn, kOff };

// Adds --progress and --no-progress to a command.
void add_progress_flags(CLI::App& cmd, ProgressMode& mode);

class ProgressLine {
 public:
  explicit ProgressLine(ProgressMode mode, std::string label = {});
  // Counts items (e.g. "measurements") instead of bytes: "3 / 15 measurements  20%  ETA 0:40".
  void count_items(std::string unit) { items_ = std::move(unit); }
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  bool wanted() const { return draw_; }
  // A callback drawing into this line (a library ProgressFn: any thread, one at a time; its last
  // call, done == total, draws 100%); empty when no line is wanted, so the library skips its
  // counting.
  ProgressFn fn();
  // Bytes done of total. Thread-safe. Percent stays below 100 until finish().
  void update(uint64_t done, uint64_t total);
  // Starts a new phase: the label drawn before the numbers, and the clock its rate counts from.
  void set_label(std::string label);
  // The final line (100%) when anything was drawn, then ends the line.
  void finish(uint64_t done);
  // Ends the line so that what follows (notes, the summary, an error) starts on its own line.
  void end_line();

 private:
  void draw(uint64_t done, uint64_t total, bool last);

  void show(uint64_t done, uint64_t total, bool last);

  bool draw_;
  ProgressThrottle pace_;  // when a report is drawn (its turn serializes the drawing)
  std::string label_, items_;
  double t0_;  // the phase's start (rate, ETA)
  bool drawn_ = false;
  std::mutex mu_;  // label_, t0_, drawn_
};

}  // namespace ckpt::cli
