// Checkpoint::open_and_load: opening and an eager load, overlapped.
//
// A torch zip's central directory names every data/<key> record with its size and CRC32, and
// the records' data offsets are computed from it (ZipReader), so the tensor bytes can be read
// before data.pkl says which tensors view them. As soon as the directory is parsed, a Preload
// starts reading the whole data region on background threads while this thread reads and
// unpickles data.pkl; then this thread joins the reading, and each storage becomes a view into
// the preloaded arena. On a 20,000-tensor file most of the open time disappears behind the reads.
//
// Other formats (and archives whose storages are not all raw records: deflated zips) are opened
// and then loaded with load_all: their metadata is small or their bytes need decoding.

#include <algorithm>
#include <cstring>

#include "ckpt/checkpoint.h"
#include "load/checkpoint_data.h"
#include "load/preload.h"
#include "util/arena.h"
#include "zip/zip_reader.h"

namespace ckpt {

LoadedCheckpoint Checkpoint::open_and_load(const std::string& path,
                                           const OpenOptions& open_options,
                                           const LoadOptions& load_options) {
  SourcePtr source = open_options.mmap ? open_mmap_source(path) : open_file_source(path);
  // Copies go through pread, as load_all's do (copy_source()): reading out of a mapping would
  // make the file's pages resident beside the copy.
  SourcePtr copy = source->pread_twin() ? source->pread_twin() : source;
  const int threads =
      load_options.threads > 0 ? load_options.threads : internal::default_threads();

  std::unique_ptr<internal::Preload> pre;
  std::vector<uint64_t> offsets;  // of the preloaded ranges, ascending
  internal::ZipDirectoryHook hook = [&](const internal::ZipReader& zip) {
    const std::string data_prefix = zip.prefix() + "data/";
    std::vector<internal::PreloadRange> ranges;
    for (size_t i = 0; i < zip.entries().size(); ++i) {
      const internal::ZipEntry& e = zip.entries()[i];
      if (e.size == 0 || e.name.compare(0, data_prefix.size(), data_prefix) != 0) continue;
      // A deflated record, or one whose offset needs a read, is loaded the ordinary way.
      if (e.method != 0 || !zip.offset_is_computed(i)) return;
      ranges.push_back({zip.data_offset(i), e.size});
    }
    if (ranges.empty()) return;
    std::sort(ranges.begin(), ranges.end(),
              [](const auto& a, const auto& b) { return a.offset < b.offset; });
    for (const auto& r : ranges) offsets.push_back(r.offset);
    pre = std::make_unique<internal::Preload>(copy, std::move(ranges), load_options.verify,
                                              threads - 1);
  };

  Checkpoint c(internal::open_checkpoint(source, open_options, &hook));
  const internal::CheckpointData& d = *c.data_;
  // Every storage must be a preloaded record or a meta tensor; otherwise load the usual way.
  std::vector<size_t> range_of(d.storages.size(), SIZE_MAX);
  uint64_t meta_bytes = 0;
  bool covered = pre != nullptr && !(d.decoder && d.decode_all);
  for (size_t s = 0; covered && s < d.storages.size(); ++s) {
    const StorageInfo& si = d.storages[s];
    if (si.meta) {
      meta_bytes = (meta_bytes + si.nbytes + 63) & ~uint64_t(63);
      continue;
    }
    if (si.nbytes == 0) continue;
    if (si.offset == kNoOffset) {
      covered = false;
      break;
    }
    auto it = std::lower_bound(offsets.begin(), offsets.end(), si.offset);
    if (it == offsets.end() || *it != si.offset) {
      covered = false;
      break;
    }
    range_of[s] = static_cast<size_t>(it - offsets.begin());
  }
  if (!covered) {
    pre.reset();
    std::vector<Tensor> tensors = c.load_all(load_options);
    return {std::move(c), std::move(tensors)};
  }

  // The tensor table is built while the background threads are still reading (the pointers are
  // known; the bytes are not needed yet), then this thread joins the reading.
  std::shared_ptr<std::byte> meta_arena;
  if (meta_bytes) {
    meta_arena = internal::allocate_arena(meta_bytes);
    std::memset(meta_arena.get(), 0, meta_bytes);
  }
  std::vector<StoragePtr> storages(d.storages.size());
  uint64_t meta_off = 0;
  for (size_t s = 0; s < d.storages.size(); ++s) {
    auto st = std::make_shared<Storage>();
    st->info = d.storages[s];
    if (st->info.meta) {
      st->data = meta_arena.get() + meta_off;
      st->owner = meta_arena;
      meta_off = (meta_off + st->info.nbytes + 63) & ~uint64_t(63);
    } else if (range_of[s] != SIZE_MAX) {
      st->data = pre->data(range_of[s]);
      st->owner = pre->arena();
    }
    storages[s] = std::move(st);
  }
  std::vector<Tensor> tensors;
  tensors.reserve(d.tensors.size());
  for (const TensorInfo& t : d.tensors) tensors.emplace_back(t, storages[t.storage]);

  pre->finish();
  // The preload's ranges are in offset order, so range k's CRC is pre->crc(k).
  if (load_options.verify)
    for (size_t s = 0; s < d.storages.size(); ++s) {
      const StorageInfo& si = d.storages[s];
      if (range_of[s] == SIZE_MAX || !si.crc32) continue;
      if (pre->crc(range_of[s]) != *si.crc32)
        throw internal::crc_mismatch(d, s, pre->crc(range_of[s]));
    }
  for (size_t s = 0; s < d.storages.size(); ++s) {
    const StorageInfo& si = d.storages[s];
    if (si.byteswap && range_of[s] != SIZE_MAX)
      internal::byteswap_elements(storages[s]->data, si.nbytes, dtype_size(si.dtype),
                                  dtype_info(si.dtype).is_complex);
  }
  return {std::move(c), std::move(tensors)};
}

}  // namespace ckpt
