// Progress from Python: a callable called with (done, total) bytes while a load or save runs
// with the GIL released. The bytes a writer puts in a file are counted by ckpt::ProgressSink
// (include/ckpt/sink.h), as for convert() and the CLI.

#include <string>
#include <utility>

#include "binding.h"

namespace ckpt::py {

PyProgress::PyProgress(pyb::object fn) : fn_(std::move(fn)) {}

PyProgress::~PyProgress() {
  if (error_) {
    pyb::gil_scoped_acquire gil;  // the kept exception is a Python object
    error_.reset();
  }
}

void PyProgress::report(uint64_t done, uint64_t total, bool last) {
  if (!active()) return;
  if (raised_) throw Error(ErrorCode::kInvalidArgument, "the progress callback raised");
  // A reader thread that finds another one reporting skips its report rather than wait.
  auto turn = pace_.due(done, total, last);
  if (!turn.owns_lock()) return;
  pyb::gil_scoped_acquire gil;
  try {
    fn_(done, total);
  } catch (pyb::error_already_set& e) {
    error_.emplace(std::move(e));
    raised_ = true;
    throw Error(ErrorCode::kInvalidArgument, "the progress callback raised");
  }
}

ProgressFn PyProgress::fn() {
  if (!active()) return {};
  // The library may call it on a reader thread, where an exception cannot go: after fn raised,
  // reports stop and the load runs to its end, then rethrow() raises it.
  return [this](uint64_t done, uint64_t total) {
    try {
      report(done, total, done >= total);
    } catch (const Error&) {
    }
  };
}

namespace {

// The callback raised after the output was committed: the caller's exception is raised as it
// is, marked (ckpt_committed = True; on Python 3.11+ a note naming the file) so that a caller
// can tell a complete output from a stopped one.
void mark_committed(const pyb::object& exc, const std::string& name) {
  try {
    exc.attr("ckpt_committed") = true;
    if (pyb::hasattr(exc, "add_note"))
      exc.attr("add_note")("ckpt: " + name +
                           " was written completely (committed) before the "
                           "progress callback raised");
  } catch (pyb::error_already_set&) {  // an exception type that takes no attributes
  }
}

}  // namespace

void PyProgress::rethrow() {
  if (error_) {
    pyb::error_already_set e = std::move(*error_);
    error_.reset();
    if (!committed_.empty()) mark_committed(e.value(), committed_);
    throw std::move(e);
  }
}

}  // namespace ckpt::py
