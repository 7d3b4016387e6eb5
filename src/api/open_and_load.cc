// Checkpoint::open_and_load: opening and an eager load, overlapped.
//
// A torch zip's central directory names every data/<key> record with its size, and the records'
// data offsets are computed from it, so the tensor bytes can be read before data.pkl says which
// tensors view them. The torch opener reports those byte ranges (OpenHooks::storage_ranges) as
// soon as the directory is parsed; a Preload starts reading them on background threads while
// this thread reads and unpickles data.pkl. Then the eager plan is executed with that Preload:
// this thread joins the reading, and each storage becomes a view into the preloaded arena. On a
// 20,000-tensor file most of the open time disappears behind the reads. When the ranges do not
// cover the plan (other formats, deflated records), the plan runs the ordinary way.

#include <algorithm>
#include <new>

#include "api/checkpoint_impl.h"
#include "api/opener.h"
#include "ckpt/remote.h"
#include "load/plan.h"
#include "load/preload.h"
#include "util/arena.h"

namespace ckpt {

LoadedCheckpoint Checkpoint::open_and_load(const std::string& path, const OpenOptions& open_options,
                                           const LoadOptions& load_options) {
  if (!load_options.device.is_cpu()) {
    // The overlap below is a host arena's; a device load reads through its own staging ring.
    Checkpoint c = Checkpoint::open(path, open_options);
    std::vector<Tensor> tensors = c.load_all(load_options);
    return {std::move(c), std::move(tensors)};
  }
  const int threads = load_options.threads > 0 ? load_options.threads : internal::default_threads();

  SourcePtr copy;  // a single file's source to copy from (the opener hands it over)
  std::unique_ptr<internal::Preload> pre;
  std::vector<internal::ByteRange> started;  // ascending offsets
  internal::OpenHooks hooks;
  hooks.file_opened = [&](const SourcePtr& source) {
    // Copies go through pread, as every eager load's do: reading out of a mapping would make
    // the file's pages resident beside the copy.
    copy = source->pread_twin() ? source->pread_twin() : source;
  };
  hooks.storage_ranges = [&](std::span<const internal::ByteRange> ranges) {
    started.assign(ranges.begin(), ranges.end());
    std::sort(started.begin(), started.end(),
              [](const auto& a, const auto& b) { return a.offset < b.offset; });
    std::vector<internal::PreloadRange> pr;
    pr.reserve(started.size());
    for (const auto& r : started) pr.push_back({r.offset, r.size});
    pre = std::make_unique<internal::Preload>(copy, std::move(pr), load_options.verify, threads - 1,
                                              0, load_options.drop_cache);
  };

  Checkpoint c = internal::open_path(path, open_options, hooks);
  if (!pre) {
    // Nothing started early (another format, a set, a folder): the ordinary load.
    std::vector<Tensor> tensors = c.load_all(load_options);
    return {std::move(c), std::move(tensors)};
  }
  internal::LoadPlan plan =
      internal::make_plan(internal::CheckpointAccess::model(c), copy, load_options, {}, false);
  internal::PlacedFn placed;
  if (load_options.on_placed)
    placed = [&](const std::vector<Tensor>& t) { load_options.on_placed(c, t); };
  std::vector<Tensor> tensors;
  try {
    tensors = internal::execute_eager(plan, std::move(pre), started, placed);
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kLimitExceeded, "out of memory loading the checkpoint's tensors",
                c.source().name());
  }
  return {std::move(c), std::move(tensors)};
}

}  // namespace ckpt
