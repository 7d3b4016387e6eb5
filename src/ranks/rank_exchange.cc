// load_group's exchange: the Replicate tensors' bytes lie one after another in one allocation
// (the stream), cut into rounds; each rank reads its part of a round into place (into device
// memory through the copy engine) and the caller's RankExchange::gather_parts fills in the other
// ranks' parts, in place. The reads run on a reader thread ahead of the collective, which waits
// for its round's part only.

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <stop_token>
#include <thread>

#include "ckpt/error.h"
#include "load/device_load.h"
#include "ranks/rank_stream.h"
#include "util/bytes.h"

namespace ckpt {
namespace internal {
namespace {

constexpr uint64_t kStreamAlign = 256;  // a device allocation's: every tensor starts aligned

// True where read_part reads bytes [a, b) of rt exactly (raw in one range of a file); else it
// reads whole rows along dim 0.
bool by_ranges(const RankTensor& rt, const LoadOptions& o) {
  return rt.exact && rt.ranges.size() == 1 && !o.verify;
}

// Bytes [a, b) of a whole tensor's contiguous bytes into dst: one positional read where they lie
// raw in a file (batched), else the rows along dim 0 that hold them (a DCP folder reads only the
// chunks that meet those rows), then the bytes copied out.
void read_part(const Checkpoint& c, const RankTensor& rt, uint64_t a, uint64_t b, std::byte* dst,
               const LoadOptions& o, Batches& batches) {
  if (a >= b) return;
  const TensorInfo& t = c.tensors()[rt.tensor];
  if (by_ranges(rt, o)) return batches.add(rt, a, b, dst);
  std::vector<int64_t> begin(t.shape.size(), 0), end = t.shape;
  uint64_t first = 0;
  if (!t.shape.empty() && t.shape[0] > 0) {
    const uint64_t row = rt.nbytes / static_cast<uint64_t>(t.shape[0]);
    begin[0] = static_cast<int64_t>(a / row);
    end[0] = static_cast<int64_t>((b + row - 1) / row);
    first = static_cast<uint64_t>(begin[0]) * row;
  }
  uint64_t n = rt.nbytes;
  if (!t.shape.empty()) n = n / static_cast<uint64_t>(t.shape[0]) * (end[0] - begin[0]);
  std::vector<std::byte> rows(n);
  c.read_slice(rt.tensor, begin, end, rows, o);
  std::memcpy(dst, rows.data() + (a - first), b - a);
}

// The tensor whose place in the stream starts at or before `at`.
size_t tensor_at(const Replicated& r, uint64_t at) {
  return static_cast<size_t>(std::upper_bound(r.start.begin(), r.start.end(), at) -
                             r.start.begin()) -
         1;
}

// fn(k, a, b) for the bytes [a, b) of each tensor k (offsets in the tensor) in stream [from, to).
template <typename Fn>
void each_in(const Replicated& r, uint64_t from, uint64_t to, Fn fn) {
  for (size_t k = tensor_at(r, from); k < r.tensors.size() && r.start[k] < to; ++k) {
    const uint64_t a = std::max(from, r.start[k]);
    const uint64_t b = std::min(to, r.start[k] + r.tensors[k]->nbytes);
    if (a < b) fn(k, a - r.start[k], b - r.start[k]);
  }
}

// Stream bytes [from, to) into host memory `out`.
void read_stream(const Checkpoint& c, const Replicated& r, uint64_t from, uint64_t to,
                 std::byte* out, const LoadOptions& o) {
  Batches batches(c);
  each_in(r, from, to, [&](size_t k, uint64_t a, uint64_t b) {
    read_part(c, *r.tensors[k], a, b, out + (r.start[k] + a - from), o, batches);
  });
  batches.read();
}

// Stream bytes [from, to) into device memory `out` through the staging ring: raw bytes from
// their file, others read by rows into host memory of the part's size first.
void stream_to_device(const Checkpoint& c, const Replicated& r, uint64_t from, uint64_t to,
                      std::byte* out, const LoadOptions& o, const RankTarget& t) {
  std::vector<DeviceRun> runs;
  std::deque<std::vector<std::byte>> host;
  Batches none(c);
  each_in(r, from, to, [&](size_t k, uint64_t a, uint64_t b) {
    const RankTensor& rt = *r.tensors[k];
    std::byte* dst = out + (r.start[k] + a - from);
    if (by_ranges(rt, t.host)) {
      const FileRange& fr = rt.ranges[0];
      runs.push_back({&source_of(c, fr.file), fr.offset + a, nullptr, b - a, dst});
      return;
    }
    std::vector<std::byte>& bytes = host.emplace_back(b - a);
    read_part(c, rt, a, b, bytes.data(), t.host, none);
    runs.push_back({nullptr, 0, bytes.data(), b - a, dst});
  });
  fill_device_runs(*t.engine, runs, o);
}

// The names of the tensors that stream bytes [from, to) belong to, for errors.
std::string names_in(const Checkpoint& c, const Replicated& r, uint64_t from, uint64_t to) {
  size_t k0 = tensor_at(r, from);
  if (from >= r.start[k0] + r.tensors[k0]->nbytes && k0 + 1 < r.tensors.size()) ++k0;
  size_t k1 = k0;
  while (k1 + 1 < r.tensors.size() && r.start[k1 + 1] < to) ++k1;
  const std::string& first = c.tensors()[r.tensors[k0]->tensor].name;
  if (k1 == k0) return "'" + first + "'";
  return "'" + first + "' to '" + c.tensors()[r.tensors[k1]->tensor].name + "' (" +
         std::to_string(k1 - k0 + 1) + " tensors)";
}

// Stream offset `at` moved to where a part may end: anywhere in a tensor read by byte ranges or
// between tensors, at a row boundary (down, or `up`) in one read by rows, so that no row is read
// by two ranks.
uint64_t snap(const Checkpoint& c, const Replicated& r, uint64_t at, bool up,
              const LoadOptions& o) {
  if (at >= r.total) return at;
  const size_t k = tensor_at(r, at);
  const RankTensor& rt = *r.tensors[k];
  const uint64_t in = at - r.start[k];
  if (in == 0 || in >= rt.nbytes || by_ranges(rt, o)) return at;
  const TensorInfo& t = c.tensors()[rt.tensor];
  uint64_t row = rt.nbytes;
  if (!t.shape.empty() && t.shape[0] > 0) row = std::max<uint64_t>(1, row / t.shape[0]);
  uint64_t off = in / row * row;
  if (up && off < in) off += row;
  return r.start[k] + off;
}

// The rounds of the stream in order: round i is stream bytes [cut[0], cut[world]), rank k's
// part of it [cut[k], cut[k + 1]), each round at most `budget` bytes and ending where a part may
// end (snap). The exchange and its reader walk them each (the same cuts on every rank).
class Rounds {
 public:
  Rounds(const Checkpoint& c, const Replicated& r, uint64_t world, uint64_t budget,
         const LoadOptions& o)
      : cut(world + 1),
        c_(c),
        r_(r),
        o_(o),
        world_(world),
        per_rank_(std::max<uint64_t>(1, budget / world)) {}
  // The next round into `cut`; false after the last.
  bool next() {
    if (at_ >= r_.total) return false;
    const uint64_t want = std::min(r_.total, at_ + per_rank_ * world_);
    uint64_t end = snap(c_, r_, want, false, o_);
    if (end <= at_) end = snap(c_, r_, want, true, o_);
    cut[0] = at_;
    cut[world_] = end;
    for (uint64_t k = 1; k < world_; ++k)
      cut[k] = std::max(cut[k - 1], snap(c_, r_, at_ + (end - at_) * k / world_, false, o_));
    at_ = end;
    return true;
  }
  std::vector<uint64_t> cut;

 private:
  const Checkpoint& c_;
  const Replicated& r_;
  const LoadOptions& o_;
  uint64_t world_, per_rank_, at_ = 0;
};

// What the exchange's reader thread has done: the rounds whose part it has read, and its first
// failure (after which it reads nothing more).
class Ahead {
 public:
  // Runs fn (the reads) on the reader, keeping what it throws for rethrow().
  template <typename Fn>
  void run(Fn fn) {
    try {
      fn();
    } catch (...) {
      std::lock_guard<std::mutex> l(m_);
      error_ = std::current_exception();
      cv_.notify_all();
    }
  }
  void part_read() {
    std::lock_guard<std::mutex> l(m_);
    ++parts_;
    cv_.notify_all();
  }
  // Blocks until round i's part is read (true) or a read before it failed (false).
  bool wait_part(uint64_t i) {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return parts_ > i || error_; });
    return parts_ > i;
  }
  // The reader's failure, once it is joined.
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  uint64_t parts_ = 0;
  std::exception_ptr error_;
};

}  // namespace

void Replicated::add(const RankTensor& rt) {
  start.push_back(align_up(total, kStreamAlign));
  tensors.push_back(&rt);
  total = start.back() + rt.nbytes;
}

void exchange_replicated(const Checkpoint& c, const Replicated& r, RankExchange& ex,
                         uint64_t budget, const LoadOptions& o, std::byte* stream,
                         const RankTarget& t, const std::function<void()>& after) {
  const uint64_t world = static_cast<uint64_t>(ex.world()), rank = static_cast<uint64_t>(ex.rank());
  Ahead ahead;
  std::jthread reader([&](std::stop_token stop) {
    ahead.run([&] {
      Rounds rounds(c, r, world, budget, t.host);
      while (rounds.next()) {
        if (stop.stop_requested()) return;
        const std::vector<uint64_t>& cut = rounds.cut;
        if (t.engine)
          stream_to_device(c, r, cut[rank], cut[rank + 1], stream + cut[rank], o, t);
        else
          read_stream(c, r, cut[rank], cut[rank + 1], stream + cut[rank], t.host);
        ahead.part_read();
      }
      if (!stop.stop_requested()) after();
    });
  });
  Rounds rounds(c, r, world, budget, t.host);
  for (uint64_t i = 0; rounds.next(); ++i) {
    if (!ahead.wait_part(i)) break;  // its read failed: this rank issues no further collective
    const uint64_t at = rounds.cut[0], end = rounds.cut[world];
    try {
      ex.gather_parts(std::span<std::byte>(stream + at, end - at), rounds.cut, t.device);
    } catch (const std::exception& e) {
      reader.request_stop();
      reader.join();
      throw Error(ErrorCode::kIo,
                  "rank " + std::to_string(rank) + " of " + std::to_string(world) +
                      ": the exchange of " + names_in(c, r, at, end) + " failed: " + e.what(),
                  c.source().name(), c.tensors()[r.tensors[0]->tensor].name);
    }
  }
  reader.join();
  ahead.rethrow();
}

}  // namespace internal

void RankExchange::all_gather(std::span<const std::byte>, std::span<std::byte>) {
  throw Error(ErrorCode::kUnsupported, "this exchange implements gather_parts only");
}

void RankExchange::gather_parts(std::span<std::byte> round, std::span<const uint64_t> cuts,
                                const Device& device) {
  const size_t n = cuts.size() - 1, me = static_cast<size_t>(rank());
  uint64_t q = 1;  // the largest part: every rank's is padded to it
  for (size_t k = 0; k < n; ++k) q = std::max(q, cuts[k + 1] - cuts[k]);
  internal::CopyEngine* engine = device.is_cpu() ? nullptr : &internal::engine_for(device);
  auto part = [&](size_t k) { return round.data() + (cuts[k] - cuts[0]); };
  std::vector<std::byte> mine(q), all(q * n);
  if (const uint64_t len = cuts[me + 1] - cuts[me]; len && engine)
    engine->to_host(mine.data(), part(me), len);
  else if (len)
    std::memcpy(mine.data(), part(me), len);
  all_gather(mine, all);
  for (size_t k = 0; k < n; ++k) {
    const uint64_t len = cuts[k + 1] - cuts[k];
    if (k == me || !len) continue;
    if (engine)
      engine->to_device(part(k), all.data() + k * q, len);
    else
      std::memcpy(part(k), all.data() + k * q, len);
  }
}

}  // namespace ckpt
