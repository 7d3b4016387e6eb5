#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "common.h"

namespace ckpt::cli {

void add_progress_flags(CLI::App& cmd, ProgressMode& mode) {
  auto* on = cmd.add_flag_callback(
      "--progress", [&mode] { mode = ProgressMode::kOn; },
      "show a progress line on stderr even when it is not a terminal");
  cmd.add_flag_callback(
         "--no-progress", [&mode] { mode = ProgressMode::kOff; },
         "never show a progress line (default: only when stderr is a terminal)")
      ->excludes(on);
}

namespace {
bool drawn_for(ProgressMode mode) {
  return mode == ProgressMode::kOn || (mode == ProgressMode::kAuto && isatty(STDERR_FILENO) == 1);
}
}  // namespace

ProgressLine::ProgressLine(ProgressMode mode, std::string label)
    : draw_(drawn_for(mode)),
      // Asked for (--progress): drawn from the start, the final line always. On a terminal by
      // default: only once the work has taken a quarter of a second.
      pace_(std::chrono::milliseconds(100), mode == ProgressMode::kOn
                                                ? std::chrono::milliseconds(0)
                                                : std::chrono::milliseconds(250)),
      label_(std::move(label)),
      t0_(now_seconds()) {}

ProgressLine::~ProgressLine() { end_line(); }

ProgressFn ProgressLine::fn() {
  if (!draw_) return {};
  // The library's last call has done == total: the 100% line.
  return [this](uint64_t done, uint64_t total) { draw(done, total, total > 0 && done == total); };
}

void ProgressLine::update(uint64_t done, uint64_t total) { draw(done, total, false); }

void ProgressLine::set_label(std::string label) {
  std::lock_guard<std::mutex> lock(mu_);
  label_ = std::move(label);
  t0_ = now_seconds();  // a new phase: its own rate and time left
  pace_.restart();
}

void ProgressLine::finish(uint64_t done) {
  draw(done, done, true);
  end_line();
}

void ProgressLine::end_line() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!drawn_) return;
  std::fputc('\n', stderr);
  drawn_ = false;
}

void ProgressLine::draw(uint64_t done, uint64_t total, bool last) {
  if (!draw_) return;
  if (auto turn = pace_.due(done, total, last); turn.owns_lock()) show(done, total, last);
}

namespace {
std::string clock_str(double secs) {
  if (!(secs >= 0) || secs > 359999) return "--:--";
  const auto s = static_cast<uint64_t>(secs + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%llu:%02llu:%02llu", static_cast<unsigned long long>(s / 3600),
                  static_cast<unsigned long long>(s / 60 % 60),
                  static_cast<unsigned long long>(s % 60));
  else
    std::snprintf(buf, sizeof buf, "%llu:%02llu", static_cast<unsigned long long>(s / 60),
                  static_cast<unsigned long long>(s % 60));
  return buf;
}
}  // namespace

void ProgressLine::show(uint64_t done, uint64_t total, bool last) {
  std::lock_guard<std::mutex> lock(mu_);
  total = std::max(total, done);
  int pct = total ? static_cast<int>(std::min<uint64_t>(done * 100 / total, 99)) : 0;
  if (last) pct = 100;
  const double secs = std::max(now_seconds() - t0_, 1e-9);
  const double rate = static_cast<double>(done) / secs;
  std::string tail =
      last ? "in " + clock_str(secs)
           : "ETA " + clock_str(rate > 0 ? static_cast<double>(total - done) / rate : -1);
  // \r and erase-to-end: the line is redrawn in place, shorter text leaves nothing behind.
  if (!items_.empty())
    std::fprintf(stderr, "\r%s%s%llu / %llu %s  %3d%%  %s\033[K", label_.c_str(),
                 label_.empty() ? "" : "  ", static_cast<unsigned long long>(done),
                 static_cast<unsigned long long>(total), items_.c_str(), pct, tail.c_str());
  else
    std::fprintf(stderr, "\r%s%s%s / %s  %3d%%  %s/s  %s\033[K", label_.c_str(),
                 label_.empty() ? "" : "  ", human_bytes(done).c_str(), human_bytes(total).c_str(),
                 pct, human_bytes(static_cast<uint64_t>(rate)).c_str(), tail.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

}  // namespace ckpt::cli
