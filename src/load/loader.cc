// Eager loading: the selected raw storages go through a Preload (one huge-page arena mirroring
// the file when they are dense, several reader threads doing positional reads straight into
// place, CRC32 fused with the reads); decoded storages (encrypted, meta) by the same threads.

#include <atomic>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "ckpt/checkpoint.h"
#include "load/checkpoint_data.h"
#include "load/preload.h"
#include "util/arena.h"

namespace ckpt {

std::vector<Tensor> Checkpoint::load_all(
    const LoadOptions& options, const std::function<bool(const TensorInfo&)>& filter) const {
  const internal::CheckpointData& d = *data_;
  std::vector<size_t> wanted;
  std::vector<uint8_t> need(d.storages.size(), 0);
  for (size_t i = 0; i < d.tensors.size(); ++i) {
    if (filter && !filter(d.tensors[i])) continue;
    wanted.push_back(i);
    need[d.tensors[i].storage] = 1;
  }
  // Raw storages (read from the file) vs decoded ones (decrypt/inflate/meta).
  std::vector<size_t> raw, decoded;
  for (size_t s = 0; s < d.storages.size(); ++s) {
    if (!need[s]) continue;
    const StorageInfo& si = d.storages[s];
    bool is_raw = !si.meta && si.offset != kNoOffset && !(d.decoder && d.decode_all);
    (is_raw ? raw : decoded).push_back(s);
  }
  std::vector<internal::PreloadRange> ranges;
  ranges.reserve(raw.size());
  for (size_t s : raw) ranges.push_back({d.storages[s].offset, d.storages[s].nbytes});
  std::vector<uint64_t> decoded_off(decoded.size());
  uint64_t extra = 0;
  for (size_t k = 0; k < decoded.size(); ++k) {
    decoded_off[k] = extra;
    extra = (extra + d.storages[decoded[k]].nbytes + 63) & ~uint64_t(63);
  }

  int threads = options.threads > 0 ? options.threads : internal::default_threads();
  // Raw bytes are read by the preload's chunk queue; decoded storages by the same threads first.
  internal::Preload pre(d.copy_source(), std::move(ranges), options.verify, 0, extra);
  std::atomic<size_t> next_decoded{0};
  std::exception_ptr failure;
  std::mutex failure_mu;
  auto worker = [&] {
    try {
      for (size_t k; (k = next_decoded.fetch_add(1)) < decoded.size();) {
        const StorageInfo& si = d.storages[decoded[k]];
        std::byte* dst = pre.extra_bytes() + decoded_off[k];
        if (si.meta)
          std::memset(dst, 0, si.nbytes);
        else
          d.decoder->read(decoded[k], std::span<std::byte>(dst, si.nbytes), options.verify);
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mu);
      if (!failure) failure = std::current_exception();
      next_decoded = decoded.size();
    }
    pre.help();
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  pre.finish();

  if (options.verify) {
    for (size_t k = 0; k < raw.size(); ++k) {
      const StorageInfo& si = d.storages[raw[k]];
      if (si.crc32 && pre.crc(k) != *si.crc32) throw internal::crc_mismatch(d, raw[k], pre.crc(k));
    }
  }

  std::vector<StoragePtr> storages(d.storages.size());
  auto make = [&](size_t s, std::byte* data) {
    auto st = std::make_shared<Storage>();
    st->info = d.storages[s];
    st->data = data;
    st->owner = pre.arena();
    if (st->info.byteswap)
      internal::byteswap_elements(st->data, st->info.nbytes, dtype_size(st->info.dtype),
                                  dtype_info(st->info.dtype).is_complex);
    storages[s] = std::move(st);
  };
  for (size_t k = 0; k < raw.size(); ++k) make(raw[k], pre.data(k));
  for (size_t k = 0; k < decoded.size(); ++k) make(decoded[k], pre.extra_bytes() + decoded_off[k]);
  std::vector<Tensor> out;
  out.reserve(wanted.size());
  for (size_t i : wanted) out.emplace_back(d.tensors[i], storages[d.tensors[i].storage]);
  return out;
}

Error internal::crc_mismatch(const CheckpointData& d, size_t s, uint32_t computed) {
  const StorageInfo& si = d.storages[s];
  char buf[96];
  std::snprintf(buf, sizeof buf, "CRC32 mismatch: stored %08x, computed %08x", *si.crc32,
                computed);
  std::string names;
  for (const auto& t : d.tensors)
    if (t.storage == s) names += (names.empty() ? "" : ", ") + t.name;
  return Error(ErrorCode::kCorrupt, std::string(buf) + " (tensors: " + names + ")",
               d.source->name(), si.record.empty() ? si.key : si.record, si.offset);
}

}  // namespace ckpt
