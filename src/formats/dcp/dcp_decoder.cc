// The decoder of a torch.distributed.checkpoint folder (formats/dcp/dcp_layout.h). Every storage
// of the folder's model is decoded: the decoder reads each chunk once, straight into its place in
// the global tensor (one read when the chunk is a contiguous run of it; else each row read into
// place, or short rows a megabyte at a time through a small buffer and copied), the chunks of one
// storage in parallel when they are large. The load plan does the rest as for a single file
// (eager loads decode storages on its reader threads, streams through its ring); a box of a
// tensor reads only the chunks that meet it (read_box).

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "formats/dcp/dcp_layout.h"
#include "util/box.h"

namespace ckpt::internal {
namespace {

// Copies one chunk (its bytes `src`, row-major over p.sizes) into `dst`, the storage of the
// tensor of shape p.shape, or reads it straight there when the chunk is one run of it.
void place_chunk(const DcpLayout& l, const DcpPiece& p, std::span<std::byte> dst, size_t elsize) {
  const ByteSource& src = *l.sources[p.file];
  if (p.whole) {
    src.read_into(p.file_offset, dst.subspan(p.dst_offset, p.nbytes));
    return;
  }
  const size_t n = p.shape.size();
  std::vector<uint64_t> stride(n, 1);  // of the global tensor, in elements
  for (size_t d = n; d-- > 1;) stride[d - 1] = stride[d] * static_cast<uint64_t>(p.shape[d]);
  // k: the first dimension from which on the chunk spans whole rows of the tensor; a run is
  // sizes[k-1] * stride[k-1] elements (the chunk is one run when every outer size is 1).
  size_t k = n;
  while (k > 0 && p.sizes[k - 1] == p.shape[k - 1]) --k;
  uint64_t run = elsize;
  if (k > 0)
    run *= static_cast<uint64_t>(p.sizes[k - 1]) * stride[k - 1];
  else if (n > 0)
    run *= static_cast<uint64_t>(p.sizes[0]) * stride[0];
  uint64_t base = 0;
  for (size_t d = 0; d < n; ++d) base += static_cast<uint64_t>(p.offsets[d]) * stride[d];
  base *= elsize;
  size_t outer = k > 0 ? k - 1 : 0;  // dimensions that step between runs
  bool single = true;
  for (size_t d = 0; d < outer; ++d) single = single && p.sizes[d] == 1;
  if (single) {
    src.read_into(p.file_offset, dst.subspan(base, p.nbytes));
    return;
  }
  // Runs of 256 KiB or more are read straight into place; shorter ones a few at a time into a
  // small buffer that stays warm on this thread (a buffer the size of the chunk would be fresh
  // memory, page-faulted, for every chunk), then copied to their places.
  constexpr uint64_t kDirect = 256 << 10, kBuffer = 1 << 20;
  const uint64_t group = run >= kDirect ? 1 : std::max<uint64_t>(1, kBuffer / run);
  thread_local std::vector<std::byte> buf;
  if (group > 1 && buf.size() < group * run) buf.resize(group * run);
  std::vector<int64_t> idx(outer, 0);
  auto place = [&] {  // where the run at idx goes, and steps idx to the next run
    uint64_t at = 0;
    for (size_t d = 0; d < outer; ++d) at += static_cast<uint64_t>(idx[d]) * stride[d];
    for (size_t d = outer; d-- > 0;) {
      if (++idx[d] < p.sizes[d]) break;
      idx[d] = 0;
    }
    return dst.data() + base + at * elsize;
  };
  for (uint64_t from = 0; from < p.nbytes;) {
    const uint64_t n = std::min(group * run, p.nbytes - from);
    if (group == 1) {
      src.read_into(p.file_offset + from, std::span<std::byte>(place(), n));
    } else {
      src.read_into(p.file_offset + from, std::span<std::byte>(buf.data(), n));
      for (uint64_t r = 0; r < n; r += run) std::memcpy(place(), buf.data() + r, run);
    }
    from += n;
  }
}

class DcpDecoder final : public StorageDecoder {
 public:
  explicit DcpDecoder(std::shared_ptr<const DcpLayout> l) : l_(std::move(l)) {}
  void read(size_t index, std::span<std::byte> dst, bool) const override {
    const std::vector<DcpPiece>& pieces = l_->pieces.at(index);
    const size_t elsize = element_size(index, pieces, dst.size());
    uint64_t total = 0;
    for (const DcpPiece& p : pieces) total += p.nbytes;
    constexpr uint64_t kParallel = 8ull << 20;
    const size_t threads =
        std::min<size_t>({pieces.size(), 8, std::max(1u, std::thread::hardware_concurrency())});
    if (threads < 2 || total < kParallel) {
      for (const DcpPiece& p : pieces) place_chunk(*l_, p, dst, elsize);
      return;
    }
    std::atomic<size_t> next{0};
    std::exception_ptr failed;
    std::mutex mu;
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < pieces.size();) {
        try {
          place_chunk(*l_, pieces[i], dst, elsize);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!failed) failed = std::current_exception();
          next = pieces.size();
        }
      }
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (auto& t : pool) t.join();
    if (failed) std::rethrow_exception(failed);
  }

  // Only the chunks that meet the box are read, and of each only the runs of the part that
  // meets it (a tensor-parallel rank's slice): all of them in one batch, so that a remote
  // source fetches them together.
  bool read_box(size_t index, const TensorInfo& t, std::span<const int64_t> begin,
                std::span<const int64_t> end, std::span<std::byte> dst) const override {
    const std::vector<DcpPiece>& pieces = l_->pieces.at(index);
    if (pieces.empty() || pieces[0].whole) return false;
    const size_t elsize = dtype_size(t.dtype);
    struct Part {
      const DcpPiece* piece;
      std::vector<int64_t> begin, sizes;  // the part of the box in the chunk (global)
      uint64_t at, nbytes;                // its bytes in buf
    };
    std::vector<Part> parts;
    uint64_t total = 0;
    for (const DcpPiece& p : pieces) {
      Part part{&p, p.offsets, p.sizes, total, elsize};
      for (size_t d = 0; d < p.offsets.size() && part.nbytes; ++d) {
        const int64_t b = std::max(begin[d], p.offsets[d]);
        const int64_t e = std::min(end[d], p.offsets[d] + p.sizes[d]);
        part.begin[d] = b;
        part.sizes[d] = std::max<int64_t>(0, e - b);
        part.nbytes *= static_cast<uint64_t>(part.sizes[d]);
      }
      if (!part.nbytes) continue;
      total += part.nbytes;
      parts.push_back(std::move(part));
    }
    std::vector<std::byte> buf(total);
    std::vector<std::vector<ReadRequest>> reqs(l_->sources.size());
    for (const Part& part : parts) {
      const DcpPiece& p = *part.piece;
      std::vector<int64_t> lb(p.offsets.size()), le(p.offsets.size());
      for (size_t d = 0; d < lb.size(); ++d) {
        lb[d] = part.begin[d] - p.offsets[d];
        le[d] = lb[d] + part.sizes[d];
      }
      uint64_t at = part.at;
      for (const ByteRun& r : box_runs(p.sizes, lb, le, elsize)) {
        reqs[p.file].push_back({p.file_offset + r.offset, {buf.data() + at, r.length}});
        at += r.length;
      }
    }
    for (size_t f = 0; f < reqs.size(); ++f)
      if (!reqs[f].empty()) l_->sources[f]->read_batch(reqs[f]);
    for (const Part& part : parts)
      copy_box(part.begin, part.sizes, buf.data() + part.at, begin, end, dst.data(), elsize);
    return true;
  }

 private:
  // Bytes per element of the storage's tensor: storage bytes over its element count.
  static size_t element_size(size_t, const std::vector<DcpPiece>& pieces, size_t nbytes) {
    for (const DcpPiece& p : pieces) {
      if (p.whole) continue;
      uint64_t numel = 1;
      for (int64_t s : p.shape) numel *= static_cast<uint64_t>(s);
      return numel ? static_cast<size_t>(nbytes / numel) : 1;
    }
    return 1;
  }

  std::shared_ptr<const DcpLayout> l_;
};

}  // namespace

std::shared_ptr<const StorageDecoder> dcp_decoder(std::shared_ptr<const DcpLayout> layout) {
  return std::make_shared<const DcpDecoder>(std::move(layout));
}

}  // namespace ckpt::internal
