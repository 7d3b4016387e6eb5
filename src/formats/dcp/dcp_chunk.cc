// A tensor chunk's item read without open_model (formats/dcp/dcp_chunk.h).
//
// The zip is opened by ZipReader as open_model opens it (every check of the directory), and the
// small records are read and checked as there. data.pkl is run by a small machine that knows
// only the opcodes torch's pickler writes for one tensor (protocol 2: GLOBAL, MARK, BINUNICODE,
// BININT*, LONG1, TUPLE*, BINPERSID, NEWFALSE/NEWTRUE, REDUCE, BINPUT/BINGET, STOP) and the
// three globals it names; any other opcode, global or shape of the calls ends the attempt, and
// the item goes to open_model. Accepting only what open_model accepts (with the same result) is
// the contract: tests/unit/fmt_dcp_chunk_test.cc compares the two on every one-byte change of
// real items.

#include "formats/dcp/dcp_chunk.h"

#include <array>
#include <charconv>
#include <cstring>
#include <new>
#include <string_view>

#include "ckpt/error.h"
#include "pickle/heap.h"
#include "pickle/opcodes.h"
#include "util/bytes.h"
#include "zip/zip_reader.h"

namespace ckpt::internal {

DcpChunkFacts chunk_facts(const CheckpointModel& b) {
  DcpChunkFacts o;
  const ValuePtr& r = b.root;
  o.one_tensor = r && r->kind() == Value::Kind::kTensor && r->tensor_index() < b.tensors.size();
  if (!o.one_tensor) {
    o.root = r ? r->repr(40) : std::string("nothing");
    return o;
  }
  const TensorInfo& t = b.tensors[r->tensor_index()];
  const StorageInfo& bs = b.storages[t.storage];
  o.dtype = t.dtype;
  o.shape = t.shape;
  o.raw = t.is_contiguous() && !bs.meta && b.kind(t.storage) == StorageKind::kRaw && !bs.byteswap;
  if (o.raw) {
    o.offset = bs.offset + t.byte_offset();
    o.nbytes = t.nbytes();
  }
  return o;
}

namespace {

// The tensor data.pkl rebuilds.
struct ChunkTensor {
  DType dtype = DType::kFloat32;
  std::string_view key;  // its storage's key ("0")
  uint64_t storage_numel = 0;
  int64_t offset = 0;  // storage offset, in elements
  std::vector<int64_t> shape, strides;
};

// The pickle machine. Values are small tagged records in fixed arrays (a chunk's data.pkl makes
// about 20); running out of room is "not the usual form", never an error.
class ChunkPickle {
 public:
  ChunkPickle(std::span<const std::byte> pkl, const Limits& limits)
      : p_(reinterpret_cast<const uint8_t*>(pkl.data())), n_(pkl.size()), limits_(limits) {}

  bool run(ChunkTensor& out) {
    if (n_ < 2 || p_[0] != op::kProto || p_[1] != 2) return false;
    pos_ = 2;
    while (pos_ < n_) {
      const uint8_t code = p_[pos_++];
      if (!step(code)) return false;
      if (code == op::kStop) {
        // The pickle ends here, with the one tensor alone on the stack.
        if (pos_ != n_ || sp_ != 1 || mp_ != 0 || stack_[0].kind != K::kTensor) return false;
        out = std::move(tensor_);
        return true;
      }
    }
    return false;
  }

 private:
  enum class K : uint8_t {
    kRebuild,
    kOrderedDict,
    kStorageClass,
    kStr,
    kInt,
    kBool,
    kTuple,
    kStorage,
    kHooks,
    kTensor
  };
  // Trivial, so that the arrays below are not written before use (a few KiB per item, 400,000
  // items): every slot is read only below its array's count, after val() filled it.
  struct Val {
    K kind;
    int64_t i;         // kInt, kBool; kTuple: start in pool_; kStorageClass: the dtype
    uint32_t len;      // kTuple, kStr: its length
    const char* text;  // kStr
    std::string_view str() const { return {text, len}; }
  };
  static Val val(K kind, int64_t i = 0, uint32_t len = 0, std::string_view s = {}) {
    Val v;
    v.kind = kind;
    v.i = i;
    v.len = len;
    v.text = s.data();
    return v;
  }

  bool step(uint8_t code) {
    switch (code) {
      case op::kGlobal:
        return global();
      case op::kBinPut:
        return put(byte());
      case op::kLongBinPut:
        return put(u32());
      case op::kBinGet:
        return get(byte());
      case op::kLongBinGet:
        return get(u32());
      case op::kMark:
        if (mp_ == marks_.size() || sp_ + mp_ + 1 >= limits_.max_pickle_stack) return false;
        marks_[mp_++] = sp_;
        return true;
      case op::kBinUnicode:
        return text(u32());
      case op::kShortBinUnicode:
        return text(byte());
      case op::kBinInt1:
        return integer(byte());
      case op::kBinInt2:
        return integer(u16());
      case op::kBinInt:
        return integer(static_cast<int32_t>(u32()));
      case op::kLong1:
        return long1();
      case op::kNewFalse:
      case op::kNewTrue:
        return push(val(K::kBool, code == op::kNewTrue));
      case op::kEmptyTuple:
        return tuple(sp_);
      case op::kTuple1:
      case op::kTuple2:
      case op::kTuple3:
        return sp_ - fence() >= size_t{code - op::kTuple1 + 1u} &&
               tuple(sp_ - (code - op::kTuple1 + 1u));
      case op::kTuple: {
        if (mp_ == 0) return false;
        const size_t k = marks_[--mp_];
        return tuple(k);
      }
      case op::kBinPersId:
        return persistent_id();
      case op::kReduce:
        return reduce();
      case op::kStop:
        return true;
      default:
        return false;
    }
  }

  size_t fence() const { return mp_ ? marks_[mp_ - 1] : 0; }
  bool ok() const { return pos_ <= n_; }
  uint32_t byte() { return pos_ < n_ ? p_[pos_++] : (pos_ = n_ + 1, 0u); }
  uint32_t u16() {
    if (n_ - std::min(pos_, n_) < 2) return pos_ = n_ + 1, 0u;
    return load_le<uint16_t>(reinterpret_cast<const std::byte*>(p_ + (pos_ += 2) - 2));
  }
  uint32_t u32() {
    if (n_ - std::min(pos_, n_) < 4) return pos_ = n_ + 1, 0u;
    return load_le<uint32_t>(reinterpret_cast<const std::byte*>(p_ + (pos_ += 4) - 4));
  }

  bool push(Val v) {
    if (sp_ == stack_.size() || sp_ + mp_ + 1 >= limits_.max_pickle_stack) return false;
    stack_[sp_++] = v;
    return true;
  }
  // The memo: dense ids only, as torch's pickler writes them.
  bool put(uint32_t id) {
    if (!ok() || sp_ == fence() || id != memo_n_ || memo_n_ == memo_.size() ||
        memo_n_ + 1 > limits_.max_pickle_memo)
      return false;
    memo_[memo_n_++] = stack_[sp_ - 1];
    return true;
  }
  bool get(uint32_t id) { return ok() && id < memo_n_ && push(memo_[id]); }

  // A line of a GLOBAL argument, without its '\n'.
  bool line(std::string_view& out) {
    const void* nl = pos_ < n_ ? std::memchr(p_ + pos_, '\n', n_ - pos_) : nullptr;
    if (!nl) return false;
    const size_t len = static_cast<const uint8_t*>(nl) - (p_ + pos_);
    out = std::string_view(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len + 1;
    return true;
  }
  bool global() {
    std::string_view m, n;
    if (!line(m) || !line(n)) return false;
    if (m == "torch._utils" && n == "_rebuild_tensor_v2") return push(val(K::kRebuild));
    if (m == "collections" && n == "OrderedDict") return push(val(K::kOrderedDict));
    if (m != "torch" || n == "UntypedStorage") return false;
    const std::optional<DType> d = dtype_from_storage_class(n);
    if (!d) return false;
    const uint32_t bits = dtype_info(*d).bits;
    if (bits < 8 || bits % 8 != 0 || dtype_info(*d).is_quantized) return false;
    return push(val(K::kStorageClass, static_cast<int64_t>(*d)));
  }
  bool text(uint32_t len) {
    if (!ok() || len > n_ - pos_) return false;
    std::string_view s(reinterpret_cast<const char*>(p_ + pos_), len);
    for (char c : s)
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f)
        return false;  // printable ASCII: valid UTF-8, as the keys and locations torch writes
    pos_ += len;
    return push(val(K::kStr, 0, len, s));
  }
  bool integer(int64_t v) { return ok() && push(val(K::kInt, v)); }
  bool long1() {
    const uint32_t len = byte();
    if (!ok() || len > 8 || len > n_ - pos_) return false;
    uint64_t v = 0;
    for (uint32_t b = 0; b < len; ++b) v |= uint64_t{p_[pos_ + b]} << (8 * b);
    if (len > 0 && len < 8 && (p_[pos_ + len - 1] & 0x80)) v |= ~uint64_t{0} << (8 * len);
    pos_ += len;
    return push(val(K::kInt, static_cast<int64_t>(v)));
  }
  bool tuple(size_t k) {
    if (k < fence() && k != sp_) return false;
    const size_t len = sp_ - k;
    if (pool_n_ + len > pool_.size()) return false;
    const Val t = val(K::kTuple, static_cast<int64_t>(pool_n_), static_cast<uint32_t>(len));
    for (size_t i = k; i < sp_; ++i) pool_[pool_n_++] = stack_[i];
    sp_ = k;
    return push(t);
  }
  const Val* items(const Val& t) const { return pool_.data() + t.i; }

  // ('storage', torch.XxxStorage, key, location, numel): the one storage.
  bool persistent_id() {
    if (sp_ == fence() || have_storage_) return false;
    const Val pid = stack_[--sp_];
    if (pid.kind != K::kTuple || pid.len != 5) return false;
    const Val* p = items(pid);
    if (p[0].kind != K::kStr || p[0].str() != "storage" || p[1].kind != K::kStorageClass ||
        p[2].kind != K::kStr || p[3].kind != K::kStr || p[4].kind != K::kInt || p[4].i < 0)
      return false;
    if (limits_.max_tensors < 1) return false;
    tensor_.dtype = static_cast<DType>(p[1].i);
    tensor_.key = p[2].str();
    tensor_.storage_numel = static_cast<uint64_t>(p[4].i);
    have_storage_ = true;
    return push(val(K::kStorage));
  }
  static bool dims(const Val* v, uint32_t n, std::vector<int64_t>& out) {
    out.resize(n);
    for (uint32_t d = 0; d < n; ++d) {
      if (v[d].kind != K::kInt || v[d].i < 0) return false;
      out[d] = v[d].i;
    }
    return true;
  }
  // OrderedDict() (the backward hooks), then _rebuild_tensor_v2(storage, offset, size, stride,
  // requires_grad, hooks): the one tensor.
  bool reduce() {
    if (sp_ - fence() < 2) return false;
    const Val args = stack_[sp_ - 1], fn = stack_[sp_ - 2];
    sp_ -= 2;
    if (args.kind != K::kTuple) return false;
    if (fn.kind == K::kOrderedDict) return args.len == 0 && push(val(K::kHooks));
    if (fn.kind != K::kRebuild || args.len != 6 || have_tensor_) return false;
    const Val* a = items(args);
    if (a[0].kind != K::kStorage || a[1].kind != K::kInt || a[1].i < 0 || a[2].kind != K::kTuple ||
        a[3].kind != K::kTuple || a[2].len != a[3].len || a[4].kind != K::kBool ||
        a[5].kind != K::kHooks)
      return false;
    if (a[2].len > limits_.max_dims) return false;
    tensor_.offset = a[1].i;
    if (!dims(items(a[2]), a[2].len, tensor_.shape) ||
        !dims(items(a[3]), a[3].len, tensor_.strides))
      return false;
    have_tensor_ = true;
    return push(val(K::kTensor));
  }

  const uint8_t* p_;
  size_t n_, pos_ = 0;
  const Limits& limits_;
  std::array<Val, 16> stack_;
  std::array<size_t, 4> marks_{};
  std::array<Val, 48> pool_;
  std::array<Val, 32> memo_;
  size_t sp_ = 0, mp_ = 0, pool_n_ = 0, memo_n_ = 0;
  bool have_storage_ = false, have_tensor_ = false;
  ChunkTensor tensor_;
};

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' '))
    s.remove_suffix(1);
  return s;
}

// The small records open_torch_zip reads, and what it accepts of each; here only the values
// that also say little-endian order.
constexpr const char* kSmall[] = {".data/version",      "version",   ".format_version",
                                  ".storage_alignment", "byteorder", ".data/serialization_id"};

// The facts of the tensor whose storage's bytes start at `at` in the item: a non-empty,
// contiguous tensor whose elements lie inside its storage (what finalize() checks), else nullopt.
std::optional<DcpChunkFacts> tensor_facts(ChunkTensor t, uint64_t at) {
  const uint64_t elsize = dtype_size(t.dtype);
  TensorInfo ti;
  ti.dtype = t.dtype;
  ti.shape = std::move(t.shape);
  ti.strides = std::move(t.strides);
  ti.storage_offset = t.offset;
  uint64_t numel = 1;
  for (int64_t s : ti.shape) {
    const std::optional<uint64_t> m = checked_mul(numel, static_cast<uint64_t>(s));
    if (!m) return std::nullopt;
    numel = *m;
  }
  if (numel == 0 || !ti.is_contiguous()) return std::nullopt;
  for (size_t d = 0; d < ti.shape.size(); ++d)
    if (ti.shape[d] > 1 &&
        !checked_mul(static_cast<uint64_t>(ti.shape[d] - 1), static_cast<uint64_t>(ti.strides[d])))
      return std::nullopt;
  const std::optional<uint64_t> end_elem = checked_add(static_cast<uint64_t>(t.offset), numel);
  if (!end_elem || *end_elem > t.storage_numel) return std::nullopt;

  DcpChunkFacts o;
  o.one_tensor = true;
  o.dtype = ti.dtype;
  o.raw = true;
  o.offset = at + static_cast<uint64_t>(t.offset) * elsize;
  o.nbytes = numel * elsize;
  o.shape = std::move(ti.shape);
  return o;
}

std::optional<DcpChunkFacts> read_item(const SourcePtr& item, const OpenOptions& options) {
  const Limits& lim = options.limits;
  // Room for what a chunk's item makes, far inside every limit open_model applies.
  if (options.strict || item->size() > lim.max_metadata_bytes ||
      lim.object_bytes_for(item->size()) / PickleHeap::kBytesPerObject < 1024 ||
      lim.max_pickle_memo < 64 || lim.max_pickle_stack < 64 || lim.max_tensors < 1)
    return std::nullopt;
  const ZipReader zip(item, lim);
  const std::string& prefix = zip.prefix();
  std::string name = prefix + "data.pkl";
  const std::optional<size_t> pkl = zip.find(name);
  if (!pkl || zip.find(prefix + "constants.pkl")) return std::nullopt;
  const std::string code_dir = prefix + "code/";
  for (const ZipEntry& e : zip.entries())
    if (e.name.starts_with(code_dir)) return std::nullopt;
  const ZipEntry& pe = zip.entries()[*pkl];
  if (pe.method != 0 || pe.size > lim.max_metadata_bytes) return std::nullopt;
  std::array<size_t, 1 + std::size(kSmall)> want{*pkl};
  std::array<size_t, std::size(kSmall)> slot{};
  size_t nwant = 1;
  for (size_t k = 0; k < std::size(kSmall); ++k) {
    name.assign(prefix).append(kSmall[k]);
    if (const std::optional<size_t> i = zip.find(name)) {
      if (zip.entries()[*i].size > 4096) return std::nullopt;
      slot[k] = nwant;
      want[nwant++] = *i;
    }
  }
  const std::vector<Bytes> got = zip.read_many(std::span<const size_t>(want.data(), nwant));
  // The version (.data/version first) a number from 1 to 10; byteorder, when given, "little".
  const size_t version = slot[0] ? slot[0] : slot[1];
  if (version) {
    const std::string_view v = trimmed(got[version].str());
    uint64_t n = 0;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || end != v.data() + v.size() || n < 1 || n > 10) return std::nullopt;
  }
  if (slot[4] && trimmed(got[slot[4]].str()) != "little") return std::nullopt;

  ChunkTensor t;
  if (!ChunkPickle(got[0].data, lim).run(t)) return std::nullopt;
  name.assign(prefix).append("data/").append(t.key);
  const std::optional<size_t> rec = zip.find(name);
  if (!rec) return std::nullopt;
  const ZipEntry& re = zip.entries()[*rec];
  const uint64_t elsize = dtype_size(t.dtype);
  const std::optional<uint64_t> storage_bytes = checked_mul(t.storage_numel, elsize);
  if (!storage_bytes || re.method != 0 || re.size != *storage_bytes || re.size == 0)
    return std::nullopt;
  const uint64_t at = zip.data_offset(*rec);
  if (at > item->size() || re.size > item->size() - at) return std::nullopt;
  return tensor_facts(std::move(t), at);
}

}  // namespace

std::optional<DcpChunkFacts> read_chunk_item(const SourcePtr& item, const OpenOptions& options) {
  try {
    return read_item(item, options);
  } catch (const Error&) {
    return std::nullopt;  // open_model meets the same fault and names it
  } catch (const std::bad_alloc&) {
    return std::nullopt;
  }
}

}  // namespace ckpt::internal
