// Streaming load under a memory budget, reads into caller buffers, and prefetch of mapped files.

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>

#include "ckpt/checkpoint.h"
#include "load/checkpoint_data.h"
#include "util/arena.h"
#include "util/crc32.h"

namespace ckpt {

namespace internal {

SourcePtr CheckpointData::copy_source() const {
  std::call_once(copy_once, [&] {
    copy_source_ = source->pread_twin();
    if (!copy_source_) copy_source_ = source;
  });
  return copy_source_;
}

void load_storage_into(const CheckpointData& d, size_t s, std::byte* dst, bool verify) {
  const StorageInfo& si = d.storages[s];
  if (si.meta) {
    std::memset(dst, 0, si.nbytes);
    return;
  }
  bool raw = si.offset != kNoOffset && !(d.decoder && d.decode_all);
  if (raw) {
    SourcePtr src = d.copy_source();
    constexpr uint64_t kPiece = 1 << 20;
    uint32_t crc = 0;
    for (uint64_t done = 0; done < si.nbytes; done += kPiece) {
      uint64_t n = std::min(kPiece, si.nbytes - done);
      src->read_into(si.offset + done, std::span<std::byte>(dst + done, n));
      if (verify) crc = internal::crc32(crc, std::span<const std::byte>(dst + done, n));
    }
    if (verify && si.crc32 && crc != *si.crc32) throw internal::crc_mismatch(d, s, crc);
  } else if (d.decoder) {
    d.decoder->read(s, std::span<std::byte>(dst, si.nbytes), verify);
  } else {
    throw Error(ErrorCode::kCorrupt, "storage has no data", d.source->name(), si.key);
  }
  if (si.byteswap)
    internal::byteswap_elements(dst, si.nbytes, dtype_size(si.dtype),
                                dtype_info(si.dtype).is_complex);
}

}  // namespace internal

void Checkpoint::read_into(size_t index, std::span<std::byte> dst,
                           const LoadOptions& options) const {
  const internal::CheckpointData& d = *data_;
  if (index >= d.tensors.size())
    throw Error(ErrorCode::kNotFound, "no tensor #" + std::to_string(index), d.source->name());
  const TensorInfo& t = d.tensors[index];
  if (dst.size() != t.nbytes())
    throw Error(ErrorCode::kInvalidArgument,
                "destination holds " + std::to_string(dst.size()) + " bytes; the tensor needs " +
                    std::to_string(t.nbytes()),
                d.source->name(), t.name);
  const StorageInfo& si = d.storages[t.storage];
  bool raw = !si.meta && si.offset != kNoOffset && !(d.decoder && d.decode_all);
  bool whole = t.byte_offset() == 0 && t.nbytes() == si.nbytes;
  if (t.is_contiguous() && ((raw && !si.byteswap && !options.verify) || whole)) {
    if (whole) {
      internal::load_storage_into(d, t.storage, dst.data(), options.verify);
    } else {
      d.copy_source()->read_into(si.offset + t.byte_offset(), dst);
    }
    return;
  }
  // Views of part of a storage with verification, non-contiguous views, decoded storages.
  Tensor full = tensor(index, options);
  auto bytes = full.contiguous_bytes();
  std::memcpy(dst.data(), bytes.data(), bytes.size());
}

void Checkpoint::stream(uint64_t budget, const std::function<void(const Tensor&)>& fn,
                        const LoadOptions& options,
                        const std::function<bool(const TensorInfo&)>& filter) const {
  const internal::CheckpointData& d = *data_;
  // The selected tensors of each storage, as one array (first[s], first[s + 1]) into `members`:
  // a vector per storage would cost an allocation per storage, inside the memory budget.
  const size_t ns = d.storages.size();
  if (d.tensors.size() >= UINT32_MAX)
    throw Error(ErrorCode::kLimitExceeded, "stream supports up to 2^32 tensors", d.source->name());
  std::vector<uint32_t> first(ns + 1, 0);
  std::vector<uint8_t> take(d.tensors.size(), 0);
  for (size_t i = 0; i < d.tensors.size(); ++i)
    if (!filter || filter(d.tensors[i])) {
      take[i] = 1;
      ++first[d.tensors[i].storage + 1];
    }
  for (size_t s = 0; s < ns; ++s) first[s + 1] += first[s];
  std::vector<uint32_t> members(first[ns]);
  {
    std::vector<uint32_t> fill(first.begin(), first.end() - 1);
    for (size_t i = 0; i < d.tensors.size(); ++i)
      if (take[i]) members[fill[d.tensors[i].storage]++] = static_cast<uint32_t>(i);
  }
  auto tensors_of = [&](size_t s) {
    return std::span<const uint32_t>(members.data() + first[s], first[s + 1] - first[s]);
  };
  std::vector<size_t> order;
  for (size_t s = 0; s < ns; ++s) {
    if (first[s + 1] == first[s]) continue;
    uint64_t need = (d.storages[s].nbytes + 63) & ~uint64_t(63);
    if (need > budget)
      throw Error(ErrorCode::kInvalidArgument,
                  "storage of " + std::to_string(d.storages[s].nbytes) +
                      " bytes does not fit the streaming budget of " + std::to_string(budget) +
                      " bytes",
                  d.source->name(), d.tensors[tensors_of(s)[0]].name);
    order.push_back(s);
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return d.storages[a].offset < d.storages[b].offset;  // kNoOffset (decoded) last
  });
  if (order.empty()) return;
  auto ring = internal::allocate_arena(std::max<uint64_t>(budget, 64));

  struct Slot {
    size_t storage;
    uint64_t off, len;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Slot> in_flight;  // FIFO of ring allocations, oldest first
  size_t ready = 0;            // slots at the front of in_flight that hold loaded bytes
  bool stop = false;
  std::exception_ptr failure;

  std::thread reader([&] {
    try {
      for (size_t s : order) {
        uint64_t len = (d.storages[s].nbytes + 63) & ~uint64_t(63);
        uint64_t off = 0;
        {
          std::unique_lock<std::mutex> lock(mu);
          // First fit after the newest allocation, wrapping to the start of the ring.
          cv.wait(lock, [&] {
            if (stop) return true;
            if (in_flight.empty()) {
              off = 0;
              return true;
            }
            uint64_t tail = in_flight.front().off;
            uint64_t head = in_flight.back().off + in_flight.back().len;
            if (head > tail) {
              if (head + len <= budget) {
                off = head;
                return true;
              }
              if (len <= tail) {
                off = 0;
                return true;
              }
              return false;
            }
            if (head + len <= tail) {
              off = head;
              return true;
            }
            return false;
          });
          if (stop) return;
          in_flight.push_back({s, off, len});
        }
        internal::load_storage_into(d, s, ring.get() + off, options.verify);
        {
          std::lock_guard<std::mutex> lock(mu);
          ++ready;
        }
        cv.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      failure = std::current_exception();
      stop = true;
      cv.notify_all();
    }
  });

  auto finish = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    reader.join();
  };
  try {
    for (size_t n = 0; n < order.size(); ++n) {
      Slot slot;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return ready > 0 || failure; });
        if (failure) break;
        slot = in_flight.front();
      }
      auto st = std::make_shared<Storage>();
      st->info = d.storages[slot.storage];
      st->data = ring.get() + slot.off;
      st->owner = ring;
      for (uint32_t i : tensors_of(slot.storage)) fn(Tensor(d.tensors[i], st));
      {
        std::lock_guard<std::mutex> lock(mu);
        in_flight.pop_front();
        --ready;
      }
      cv.notify_all();
    }
  } catch (...) {
    finish();
    throw;
  }
  finish();
  if (failure) std::rethrow_exception(failure);
}

void Checkpoint::prefetch(std::span<const size_t> tensors, bool populate) const {
  const internal::CheckpointData& d = *data_;
  const std::byte* base = d.source->memory();
  if (!base) return;
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto advise = [&](const StorageInfo& si) {
    if (si.meta || si.offset == kNoOffset || si.nbytes == 0) return;
    auto start = reinterpret_cast<uintptr_t>(base + si.offset) & ~(page - 1);
    auto end = reinterpret_cast<uintptr_t>(base + si.offset + si.nbytes);
    ::madvise(reinterpret_cast<void*>(start), end - start, MADV_WILLNEED);
#ifdef MADV_POPULATE_READ
    if (populate) ::madvise(reinterpret_cast<void*>(start), end - start, MADV_POPULATE_READ);
#else
    if (populate) {
      volatile std::byte sink{};
      for (uintptr_t p = start; p < end; p += page) sink = *reinterpret_cast<const std::byte*>(p);
      (void)sink;
    }
#endif
  };
  if (tensors.empty()) {
    for (const auto& si : d.storages) advise(si);
  } else {
    for (size_t i : tensors)
      if (i < d.tensors.size()) advise(d.storages[d.tensors[i].storage]);
  }
}

}  // namespace ckpt
