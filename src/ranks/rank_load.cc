// load_rank and load_group: a resolved rank plan's tensors read into owned memory; for
// load_group, the Replicate tensors' bytes read once across the group and assembled through the
// caller's RankExchange, round by round.

#include <algorithm>
#include <cstring>
#include <memory>

#include "ckpt/error.h"
#include "ckpt/rank_plan.h"

namespace ckpt {
namespace {

using Buffer = std::shared_ptr<std::vector<std::byte>>;

Tensor make_tensor(const Checkpoint& c, const RankTensor& rt, Buffer& buf) {
  const TensorInfo& t = c.tensors()[rt.tensor];
  buf = std::make_shared<std::vector<std::byte>>(rt.nbytes);
  return Tensor::from_bytes(t.name, t.dtype, rt.shape(), *buf, buf);
}

// Reads of raw bytes gathered per file and made together (one read_batch per file: a remote
// source runs them in parallel, as one window of ranged requests).
class Batches {
 public:
  explicit Batches(const Checkpoint& c) : c_(c) {}
  // Bytes [a, b) of rt's box into dst, where they lie raw in one range of a file.
  void add(const RankTensor& rt, uint64_t a, uint64_t b, std::byte* dst) {
    const FileRange& r = rt.ranges[0];
    of(r.file).push_back({r.offset + a, std::span<std::byte>(dst, b - a)});
  }
  // rt's whole box into dst: its ranges one after another.
  void add_box(const RankTensor& rt, std::byte* dst) {
    for (const FileRange& r : rt.ranges) {
      of(r.file).push_back({r.offset, std::span<std::byte>(dst, r.length)});
      dst += r.length;
    }
  }
  void read() {
    for (auto& [file, reqs] : files_) source(file).read_batch(reqs);
    files_.clear();
  }

 private:
  const ByteSource& source(uint32_t file) const {
    return c_.shards().empty() ? c_.source() : c_.shards()[file].source();
  }
  std::vector<ReadRequest>& of(uint32_t file) {
    for (auto& [f, reqs] : files_)
      if (f == file) return reqs;
    return files_.emplace_back(file, std::vector<ReadRequest>{}).second;
  }
  const Checkpoint& c_;
  std::vector<std::pair<uint32_t, std::vector<ReadRequest>>> files_;
};

// rt's box into dst: batched where its bytes lie raw (and no CRC is to be checked, which covers
// whole storages), else through Checkpoint::read_slice.
void read_box(const Checkpoint& c, const RankTensor& rt, std::span<std::byte> dst,
              const LoadOptions& o, Batches& batches) {
  if (rt.exact && !o.verify) return batches.add_box(rt, dst.data());
  c.read_slice(rt.tensor, rt.begin, rt.end, dst, o);
}

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

// The Replicate tensors of a group, their bytes one after another (the "stream").
struct Replicated {
  std::vector<const RankTensor*> tensors;
  std::vector<std::byte*> dst;
  std::vector<uint64_t> start;  // stream offset of each; start.back() is the total
};

// Stream bytes [from, to) into out.
void read_stream(const Checkpoint& c, const Replicated& r, uint64_t from, uint64_t to,
                 std::byte* out, const LoadOptions& o) {
  Batches batches(c);
  auto it = std::upper_bound(r.start.begin(), r.start.end(), from);
  for (size_t k = static_cast<size_t>(it - r.start.begin()) - 1;
       k < r.tensors.size() && r.start[k] < to; ++k) {
    const uint64_t a = std::max(from, r.start[k]), b = std::min(to, r.start[k + 1]);
    read_part(c, *r.tensors[k], a - r.start[k], b - r.start[k], out + (a - from), o, batches);
  }
  batches.read();
}

// Stream bytes [from, to) of `all` copied to the tensors' memory.
void scatter(const Replicated& r, uint64_t from, uint64_t to, const std::byte* all) {
  auto it = std::upper_bound(r.start.begin(), r.start.end(), from);
  for (size_t k = static_cast<size_t>(it - r.start.begin()) - 1;
       k < r.tensors.size() && r.start[k] < to; ++k) {
    const uint64_t a = std::max(from, r.start[k]), b = std::min(to, r.start[k + 1]);
    std::memcpy(r.dst[k] + (a - r.start[k]), all + (a - from), b - a);
  }
}

// The names of the tensors that stream bytes [from, to) belong to, for errors.
std::string names_in(const Checkpoint& c, const Replicated& r, uint64_t from, uint64_t to) {
  auto it = std::upper_bound(r.start.begin(), r.start.end(), from);
  size_t k0 = static_cast<size_t>(it - r.start.begin()) - 1, k1 = k0;
  while (k1 + 1 < r.tensors.size() && r.start[k1 + 1] < to) ++k1;
  const std::string& first = c.tensors()[r.tensors[k0]->tensor].name;
  if (k1 == k0) return "'" + first + "'";
  return "'" + first + "' to '" + c.tensors()[r.tensors[k1]->tensor].name + "' (" +
         std::to_string(k1 - k0 + 1) + " tensors)";
}

// Stream offset `at` moved to where a part may end: anywhere in a tensor read by byte ranges, at
// a row boundary (down, or `up`) in one read by rows, so that no row is read by two ranks.
uint64_t snap(const Checkpoint& c, const Replicated& r, uint64_t at, bool up,
              const LoadOptions& o) {
  auto it = std::upper_bound(r.start.begin(), r.start.end(), at);
  if (it == r.start.end()) return at;
  const size_t k = static_cast<size_t>(it - r.start.begin()) - 1;
  const RankTensor& rt = *r.tensors[k];
  if (at == r.start[k] || by_ranges(rt, o)) return at;
  const TensorInfo& t = c.tensors()[rt.tensor];
  uint64_t row = rt.nbytes;
  if (!t.shape.empty() && t.shape[0] > 0) row = std::max<uint64_t>(1, row / t.shape[0]);
  uint64_t off = (at - r.start[k]) / row * row;
  if (up && off < at - r.start[k]) off += row;
  return r.start[k] + off;
}

void exchange_replicated(const Checkpoint& c, const Replicated& r, RankExchange& ex,
                         uint64_t budget, const LoadOptions& o) {
  const uint64_t total = r.start.back();
  const uint64_t world = static_cast<uint64_t>(ex.world()), rank = static_cast<uint64_t>(ex.rank());
  const uint64_t per_rank = std::max<uint64_t>(1, budget / world);
  std::vector<std::byte> mine, all;
  std::vector<uint64_t> cut(world + 1);  // rank k's part of a round: [cut[k], cut[k + 1])
  for (uint64_t at = 0; at < total;) {
    const uint64_t want = std::min(total, at + per_rank * world);
    uint64_t end = snap(c, r, want, false, o);
    if (end <= at) end = snap(c, r, want, true, o);
    cut[0] = at;
    cut[world] = end;
    uint64_t q = 1;  // the largest part: every rank's is padded to it
    for (uint64_t k = 1; k <= world; ++k) {
      if (k < world)
        cut[k] = std::max(cut[k - 1], snap(c, r, at + (end - at) * k / world, false, o));
      q = std::max(q, cut[k] - cut[k - 1]);
    }
    mine.assign(q, std::byte{0});
    read_stream(c, r, cut[rank], cut[rank + 1], mine.data(), o);
    all.resize(q * world);
    try {
      ex.all_gather(mine, all);
    } catch (const std::exception& e) {
      throw Error(ErrorCode::kIo,
                  "rank " + std::to_string(rank) + " of " + std::to_string(world) +
                      ": the exchange of " + names_in(c, r, at, end) + " failed: " + e.what(),
                  c.source().name(), c.tensors()[r.tensors[0]->tensor].name);
    }
    for (uint64_t k = 0; k < world; ++k) scatter(r, cut[k], cut[k + 1], all.data() + k * q);
    at = end;
  }
}

}  // namespace

std::vector<Tensor> load_rank(const Checkpoint& c, const RankLoadPlan& plan,
                              const LoadOptions& options) {
  std::vector<Tensor> out;
  out.reserve(plan.tensors.size());
  Batches batches(c);
  for (const RankTensor& rt : plan.tensors) {
    Buffer buf;
    out.push_back(make_tensor(c, rt, buf));
    read_box(c, rt, *buf, options, batches);
  }
  batches.read();
  return out;
}

std::vector<Tensor> load_group(const Checkpoint& c, const RankLoadPlan& plan, RankExchange& ex,
                               uint64_t budget, const LoadOptions& options) {
  if (plan.rank != ex.rank() || plan.world != ex.world())
    throw Error(ErrorCode::kInvalidArgument,
                "the plan is for rank " + std::to_string(plan.rank) + " of " +
                    std::to_string(plan.world) + "; the exchange is rank " +
                    std::to_string(ex.rank()) + " of " + std::to_string(ex.world()),
                c.source().name());
  std::vector<Tensor> out;
  out.reserve(plan.tensors.size());
  Replicated rep;
  rep.start.push_back(0);
  Batches batches(c);
  for (const RankTensor& rt : plan.tensors) {
    Buffer buf;
    out.push_back(make_tensor(c, rt, buf));
    if (rt.placement.kind == Placement::Kind::kReplicate && plan.world > 1) {
      rep.tensors.push_back(&rt);
      rep.dst.push_back(buf->data());
      rep.start.push_back(rep.start.back() + rt.nbytes);
    } else {
      read_box(c, rt, *buf, options, batches);
    }
  }
  batches.read();
  if (rep.start.back() > 0) exchange_replicated(c, rep, ex, budget, options);
  return out;
}

}  // namespace ckpt
