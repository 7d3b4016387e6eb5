// Writes torch.save zip checkpoints.
//
// Records, in torch's modern order (docs/formats/torch.md "torch.save zip", **Records**): data.pkl,
// .format_version ("1"), .storage_alignment, byteorder ("little"), data/0..N (storage keys in the
// order the pickle first meets each storage), version ("3\n"), .data/serialization_id. data.pkl is
// pickled exactly as torch's pickler would (protocol 2): tensors as REDUCE of
// torch._utils._rebuild_tensor_v2 (v3 for dtypes without a legacy storage class), Parameters
// through _rebuild_parameter, storages as persistent ids ('storage', torch.XxxStorage, key, 'cpu',
// numel), with torch's object identities (one 'storage' and one 'cpu' string, one key string per
// storage) so that the memo numbering — and the bytes — match.

#include <zlib.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <optional>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "ckpt/error.h"
#include "ckpt/torch.h"
#include "formats/writer.h"
#include "pickle/pickler.h"
#include "util/crc32.h"
#include "util/host_check.h"
#include "util/text.h"
#include "zip/zip_writer.h"

namespace ckpt {
namespace {

constexpr const char* kStorageMarker = "<storage>";
// Storage bytes are checksummed and written a slice at a time, so that the write reads the slice
// from L2 (1 MiB here) rather than from memory.
constexpr size_t kSlice = 1 << 20;

class TorchPickleBuilder {
 public:
  // fed: the tensors' bytes come from a TensorFeed (their storages hold none yet).
  TorchPickleBuilder(const std::vector<Tensor>& tensors, bool fed) : tensors_(tensors), fed_(fed) {
    storage_str_ = Value::string("storage");
    cpu_str_ = Value::string("cpu");
  }

  ValuePtr convert(const ConstValuePtr& v, uint32_t depth = 0) {
    if (!v) return Value::none();
    // The pickler's own bound (a tree read with a larger limit is refused here, as it would be
    // there: kLimitExceeded either way).
    if (depth > Limits{}.max_pickle_depth)
      throw Error(ErrorCode::kLimitExceeded, "object tree deeper than Limits::max_pickle_depth (" +
                                                 std::to_string(Limits{}.max_pickle_depth) +
                                                 ") cannot be pickled");
    auto it = copied_.find(v.get());
    if (it != copied_.end()) return it->second;
    ValuePtr out;
    switch (v->kind()) {
      case Value::Kind::kTensor:
        reached_.insert(static_cast<size_t>(v->as_int()));
        // A DTensor read from one rank's file is that rank's shard: written as the plain tensor
        // it is (rebuilt as a DTensor, its size would be the shard's under a global spec).
        if (v->origin() && is_dtensor(*v->origin())) {
          out = plain_reduce(static_cast<size_t>(v->as_int()));
          break;
        }
        if (v->origin() && is_tensor_wrapper(*v->origin())) {
          out = wrapped_reduce(static_cast<size_t>(v->as_int()), *v->origin(), depth);
          break;
        }
        // A numpy array is written as the array it was (its bytes are in the origin's state).
        if (v->origin()) {
          out = convert(v->origin(), depth + 1);
          break;
        }
        out = tensor_reduce(static_cast<size_t>(v->as_int()));
        break;
      case Value::Kind::kList:
      case Value::Kind::kTuple:
      case Value::Kind::kSet:
      case Value::Kind::kObject:
      case Value::Kind::kDict: {
        out = std::make_shared<Value>(*v);
        copied_[v.get()] = out;  // before children: keeps cycles and sharing
        for (auto& item : out->items()) item = convert(item, depth + 1);
        for (auto& [k, val] : out->entries()) {
          k = convert(k, depth + 1);
          val = convert(val, depth + 1);
        }
        if (out->state()) out->set_state(convert(out->state(), depth + 1));
        if (!std::as_const(*out).appended().empty())
          for (auto& item : out->appended()) item = convert(item, depth + 1);
        return out;
      }
      default:
        // A leaf is shared, not copied: the pickler only reads the tree it is given.
        out = std::const_pointer_cast<Value>(v);
    }
    copied_[v.get()] = out;
    return out;
  }

  // Persistent id of a storage marker, else null.
  ValuePtr persistent_id(const Value& v) {
    if (v.kind() != Value::Kind::kObject || v.module() != "ckpt" || v.name() != kStorageMarker)
      return nullptr;
    size_t slot = static_cast<size_t>(v.as_int());
    StorageSlot& s = slots_[slot];
    if (!s.key) {
      s.key = Value::string(std::to_string(order_.size()));
      order_.push_back(slot);
    }
    const DTypeInfo& info = dtype_info(s.dtype);
    ValuePtr cls = info.storage_class ? global("torch", info.storage_class)
                                      : global("torch.storage", "UntypedStorage");
    uint64_t numel = info.storage_class ? s.storage->info.nbytes / storage_element_size(s.dtype)
                                        : s.storage->info.nbytes;
    return Value::tuple(
        {storage_str_, cls, s.key, cpu_str_, Value::integer(static_cast<int64_t>(numel))});
  }

  // Whether convert() met the tensor of this index.
  bool reached(size_t index) const { return reached_.count(index) != 0; }

  // Storages in key order.
  std::vector<const Storage*> ordered_storages() const {
    std::vector<const Storage*> out;
    for (size_t slot : order_) out.push_back(slots_[slot].storage);
    return out;
  }

 private:
  struct StorageSlot {
    const Storage* storage;
    DType dtype;
    ValuePtr key;
  };

  ValuePtr global(const std::string& m, const std::string& n) {
    auto& g = globals_[m + "." + n];
    if (!g) g = Value::global(m, n);
    return g;
  }

  ValuePtr storage_marker(const Tensor& t) {
    const Storage* st = t.storage().get();
    internal::require_host_tensor(t, {});
    if (!st || (!st->data && st->info.nbytes > 0 && !fed_))
      throw Error(ErrorCode::kInvalidArgument, "tensor has no data loaded", {}, t.name());
    auto [it, inserted] = slot_of_.emplace(st, slots_.size());
    if (inserted) {
      slots_.push_back({st, t.dtype(), nullptr});
    } else if (slots_[it->second].dtype != t.dtype()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "tensors that view one storage must have one dtype (torch.save refuses "
                  "otherwise)",
                  {}, t.name());
    }
    auto m = Value::object("ckpt", kStorageMarker, {}, nullptr, static_cast<int64_t>(it->second));
    return m;
  }

  // The origin a reader records for a tensor torch pickled inside a Python wrapper (a subclass,
  // or Python attributes on a tensor or Parameter): the call with arguments (type, state).
  static bool is_tensor_wrapper(const Value& o) {
    return o.kind() == Value::Kind::kObject && o.items().size() == 2 &&
           ((o.module() == "torch._tensor" && o.name() == "_rebuild_from_type_v2") ||
            (o.module() == "torch._utils" && o.name() == "_rebuild_parameter_with_state"));
  }

  // The origin torch_unpickle.cc records for a DTensor: _rebuild_from_type_v2(DTensor, state).
  static bool is_dtensor(const Value& o) {
    if (!is_tensor_wrapper(o) || o.name() != "_rebuild_from_type_v2") return false;
    const ValuePtr& type = o.items()[0];
    return type && type->kind() == Value::Kind::kGlobal && type->name() == "DTensor" &&
           type->module().starts_with("torch.distributed.");
  }

  // torch's own forms: _rebuild_parameter_with_state(data, requires_grad, hooks, state) and
  // _rebuild_from_type_v2(func, type, args, state) around the tensor's plain reduce.
  ValuePtr wrapped_reduce(size_t index, const Value& o, uint32_t depth) {
    if (index >= tensors_.size()) return tensor_reduce(index);  // throws the usual error
    const TensorInfo& info = tensors_[index].info();
    ValuePtr state = convert(o.items()[1], depth + 1);
    if (o.name() == "_rebuild_parameter_with_state") {
      if (!info.is_parameter) return tensor_reduce(index);
      return Value::object(
          "torch._utils", "_rebuild_parameter_with_state",
          {plain_reduce(index), Value::boolean(info.requires_grad), Value::ordered_dict(), state});
    }
    ValuePtr inner = info.is_parameter ? plain_reduce(index) : tensor_reduce(index);
    if (inner->kind() != Value::Kind::kObject) return inner;
    ValuePtr type = convert(o.items()[0], depth + 1);
    if (!type || type->kind() != Value::Kind::kGlobal) type = global("torch", "Tensor");
    return Value::object(
        "torch._tensor", "_rebuild_from_type_v2",
        {global(inner->module(), inner->name()), type, Value::tuple(inner->items()), state});
  }

  // The reduce of tensor `index` without its Parameter wrapper.
  ValuePtr plain_reduce(size_t index) {
    ValuePtr r = tensor_reduce(index);
    if (tensors_[index].info().is_parameter && r->kind() == Value::Kind::kObject &&
        r->name() == "_rebuild_parameter" && !r->items().empty())
      return r->items()[0];
    return r;
  }

  static ValuePtr int_tuple(const std::vector<int64_t>& v) {
    std::vector<ValuePtr> items;
    for (int64_t x : v) items.push_back(Value::integer(x));
    return Value::tuple(std::move(items));
  }

  ValuePtr tensor_reduce(size_t index) {
    if (index >= tensors_.size())
      throw Error(ErrorCode::kInvalidArgument, "object tree refers to tensor #" +
                                                   std::to_string(index) + " but only " +
                                                   std::to_string(tensors_.size()) + " were given");
    auto& cached = reduced_[index];
    if (cached) return cached;
    const Tensor& t = tensors_[index];
    const TensorInfo& info = t.info();
    if (info.strides.size() != info.shape.size())
      throw Error(ErrorCode::kInvalidArgument, "strides and shape differ in length", {}, t.name());
    auto hooks = [&] { return Value::ordered_dict(); };
    ValuePtr r;
    if (t.storage() && t.storage()->info.meta) {
      // A meta tensor has no bytes: torch.save writes its dtype, size and stride only.
      if (info.quantization)
        throw Error(ErrorCode::kInvalidArgument, "a quantized meta tensor cannot be written", {},
                    t.name());
      bool rg = info.requires_grad && !info.is_parameter;
      r = Value::object("torch._utils", "_rebuild_meta_tensor_no_storage",
                        {global("torch", dtype_info(info.dtype).name), int_tuple(info.shape),
                         int_tuple(info.strides), Value::boolean(rg)});
    } else if (info.quantization) {
      ValuePtr storage = storage_marker(t);
      const Quantization& q = *info.quantization;
      ValuePtr qparams;
      if (q.scales_tensor && q.zero_points_tensor) {
        // Plain tensors: a quantized one there (or the tensor itself) is no quantizer.
        for (size_t k : {*q.scales_tensor, *q.zero_points_tensor})
          if (k == index || (k < tensors_.size() && tensors_[k].info().quantization))
            throw Error(ErrorCode::kInvalidArgument,
                        "the scales and zero points of a per-channel quantized tensor must be "
                        "plain tensors",
                        {}, t.name());
        qparams = Value::tuple({global("torch", q.scheme), tensor_reduce(*q.scales_tensor),
                                tensor_reduce(*q.zero_points_tensor), Value::integer(q.axis)});
      } else {
        qparams = Value::tuple(
            {global("torch", q.scheme), Value::real(q.scale), Value::integer(q.zero_point)});
      }
      r = Value::object(
          "torch._utils", "_rebuild_qtensor",
          {storage, Value::integer(info.storage_offset), int_tuple(info.shape),
           int_tuple(info.strides), qparams, Value::boolean(info.requires_grad), hooks()});
    } else {
      ValuePtr storage = storage_marker(t);
      bool legacy = dtype_info(info.dtype).storage_class != nullptr;
      bool rg = info.requires_grad && !info.is_parameter;
      // safetensors' F4 (4-bit elements) is torch's float4_e2m1fn_x2 with the last dim halved,
      // as safetensors' own loader makes it.
      const TensorInfo x = info.dtype == DType::kFloat4_e2m1 ? float4_pairs(t) : info;
      std::vector<ValuePtr> args = {storage,
                                    Value::integer(x.storage_offset),
                                    int_tuple(x.shape),
                                    int_tuple(x.strides),
                                    Value::boolean(rg),
                                    hooks()};
      if (!legacy) args.push_back(global("torch", dtype_info(x.dtype).name));
      r = Value::object("torch._utils", legacy ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3",
                        std::move(args));
    }
    if (info.is_parameter) {
      r = Value::object("torch._utils", "_rebuild_parameter",
                        {r, Value::boolean(info.requires_grad), hooks()});
    }
    // Globals inside reduce forms must be the shared ones (memo identity).
    cached = r;
    return r;
  }

  // A float4_e2m1 tensor as float4_e2m1fn_x2: pairs of elements, last dim halved.
  static TensorInfo float4_pairs(const Tensor& t) {
    TensorInfo x = t.info();
    if (x.shape.empty() || x.shape.back() % 2 || x.storage_offset % 2 || !x.is_contiguous())
      throw Error(ErrorCode::kInvalidArgument,
                  "a float4_e2m1 tensor is written as torch's float4_e2m1fn_x2 (pairs along the "
                  "last dim): it must be contiguous with an even last dim and offset",
                  {}, t.name());
    x.dtype = DType::kFloat4_e2m1fn_x2;
    x.shape.back() /= 2;
    x.strides = contiguous_strides(x.shape);
    x.storage_offset /= 2;
    return x;
  }

  const std::vector<Tensor>& tensors_;
  const bool fed_;
  std::unordered_map<const Value*, ValuePtr> copied_;
  std::unordered_set<size_t> reached_;
  std::unordered_map<size_t, ValuePtr> reduced_;
  std::unordered_map<std::string, ValuePtr> globals_;
  std::unordered_map<const Storage*, size_t> slot_of_;
  std::vector<StorageSlot> slots_;
  std::vector<size_t> order_;
  ValuePtr storage_str_, cpu_str_;
};

std::string archive_name_for(const std::string& path) {
  auto slash = path.rfind('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  auto dot = base.find('.');
  base = base.substr(0, dot);
  return base.empty() ? "archive" : base;
}

uint64_t fnv1a(uint64_t h, std::string_view s) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// CRC32s of the storages of at most `max_size` bytes, computed in order on a thread of their own;
// crc(k) waits until storage k's is ready. Storages are read twice (here, and by the write), but
// on two cores.
class CrcAhead {
 public:
  CrcAhead(const std::vector<const Storage*>& storages, uint64_t max_size)
      : storages_(storages), max_(max_size), crc_(storages.size(), 0) {
    size_t small = 0;
    for (const Storage* st : storages) small += st->info.nbytes <= max_;
    // One small record or a handful: not worth a thread.
    if (small >= 16) {
      try {
        thread_ = std::thread([this] { run(); });
        return;
      } catch (const std::system_error&) {
      }
    }
    run();
  }
  ~CrcAhead() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  uint32_t crc(size_t k) {
    for (size_t d; (d = done_.load(std::memory_order_acquire)) <= k;) done_.wait(d);
    return crc_[k];
  }

 private:
  void run() {
    for (size_t k = 0; k < storages_.size() && !stop_.load(std::memory_order_relaxed); ++k) {
      const Storage* st = storages_[k];
      if (st->info.nbytes <= max_ && st->info.nbytes > 0)
        crc_[k] = internal::crc32(std::span<const std::byte>(st->data, st->info.nbytes));
      done_.store(k + 1, std::memory_order_release);
      done_.notify_one();
    }
  }
  const std::vector<const Storage*>& storages_;
  const uint64_t max_;
  std::vector<uint32_t> crc_;
  std::atomic<size_t> done_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The torch zip of `root` into `sink`, not committed; the tensors' bytes from `feed` when set.
// The tensors the tree does not reach (per-channel parameters aside: they are part of their
// tensor), and their storages' bytes that no written storage holds.
internal::WriteResult left_out(const TorchPickleBuilder& builder,
                               const std::vector<Tensor>& tensors,
                               const std::vector<const Storage*>& written) {
  internal::WriteResult r;
  std::unordered_set<const Storage*> counted(written.begin(), written.end());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (builder.reached(i) || tensors[i].info().type == "qparams") continue;
    ++r.tensors_left_out;
    const Storage* st = tensors[i].storage().get();
    if (st && counted.insert(st).second) r.bytes_left_out += st->info.nbytes;
  }
  return r;
}

internal::WriteResult write_torch_zip(ByteSink& sink, const ConstValuePtr& root,
                                      const std::vector<Tensor>& tensors,
                                      const SaveOptions& options,
                                      const internal::TensorFeed* feed = nullptr) {
  TorchPickleBuilder builder(tensors, feed != nullptr);
  ValuePtr tree = builder.convert(root);
  std::string pkl;
  internal::PicklerHooks hooks;
  hooks.persistent_id = [&](const Value& v) { return builder.persistent_id(v); };
  internal::pickle(tree, pkl, hooks);

  std::string folder = options.archive_name.empty() ? "archive" : options.archive_name;
  const uint32_t align = options.alignment ? options.alignment : 64;
  internal::ZipWriter zip(sink, folder + "/", align);
  zip.add("data.pkl", pkl);
  zip.add(".format_version", std::string_view("1"));
  zip.add(".storage_alignment", std::to_string(align));
  zip.add("byteorder", std::string_view("little"));
  auto storages = builder.ordered_storages();
  // Preallocate the storage records (ByteSink::reserve): their extent is computed, not guessed,
  // so no block is left allocated past the end of the file.
  uint64_t end = zip.position();
  for (size_t k = 0; k < storages.size(); ++k)
    end = zip.stored_end("data/" + std::to_string(k), storages[k]->info.nbytes, end);
  sink.reserve(end - zip.position());
  struct Slice {
    uint32_t crc = 0;
    uint64_t size = 0;
  };
  std::vector<Slice> slices;
  // Small storages' CRCs are taken ahead, on a second thread, while this one writes: a file of
  // 20,000 small tensors otherwise spends a quarter of its save checksumming on one core. Fed
  // bytes live only while they are written: their CRCs are taken then.
  std::optional<CrcAhead> ahead;
  if (!feed) ahead.emplace(storages, kSlice);
  auto write_storage = [&](size_t k, const Storage* st) {
    const uint64_t n = st->info.nbytes;
    const std::span<const std::byte> bytes(st->data, n);
    zip.begin("data/" + std::to_string(k), n);
    if (n <= kSlice) {
      zip.write_unchecked(bytes);
      zip.end(ahead ? ahead->crc(k) : (n ? internal::crc32(bytes) : 0));
      return;
    }
    // A file sink writes the slices of a large storage from two threads; each slice's CRC is
    // taken by the thread that writes it, just before, and the CRCs are joined afterwards.
    slices.assign(n / kSlice + 2, Slice{});
    zip.write_sliced(bytes, kSlice, [&](size_t i, uint64_t, std::span<const std::byte> slice) {
      slices[i] = {internal::crc32(slice), slice.size()};
    });
    uLong crc = slices[0].crc;
    for (size_t i = 1; i < slices.size() && slices[i].size > 0; ++i)
      crc = crc32_combine(crc, slices[i].crc, static_cast<z_off_t>(slices[i].size));
    zip.end(static_cast<uint32_t>(crc));
  };
  if (feed) {
    // A tensor of each storage, in key order: the feed reads the storage it views.
    std::unordered_map<const Storage*, const Tensor*> viewer;
    for (const Tensor& t : tensors) viewer.emplace(t.storage().get(), &t);
    std::vector<const Tensor*> order;
    order.reserve(storages.size());
    for (const Storage* st : storages) order.push_back(viewer.at(st));
    feed->each(order, [&](size_t k, const Tensor& t) { write_storage(k, t.storage().get()); });
  } else {
    for (size_t k = 0; k < storages.size(); ++k) write_storage(k, storages[k]);
  }
  zip.add("version", std::string_view("3\n"));
  uint64_t names = 14695981039346656037ull, crcs = 14695981039346656037ull;
  for (auto& [name, crc] : zip.written()) {
    names = fnv1a(names, name);
    crcs = fnv1a(crcs, internal::hex32(crc));
  }
  char sid[48];
  std::snprintf(sid, sizeof sid, "%020" PRIu64 "%020" PRIu64, names, crcs);
  zip.add(".data/serialization_id", std::string_view(sid, 40));
  zip.finish();
  return left_out(builder, tensors, storages);
}

class TorchWriter final : public internal::Writer {
 public:
  explicit TorchWriter(const SaveOptions& o) : o_(o) {}
  const internal::WriterCaps& caps() const override {
    static const internal::WriterCaps caps = [] {
      internal::WriterCaps c;
      c.format = "pt";
      c.object_tree = true;
      c.shared_bytes = true;
      c.meta_tensors = true;
      c.quantized = true;
      c.sharded = true;
      return c;
    }();
    return caps;
  }
  bool holds(DType) const override { return true; }
  internal::WriteResult write(internal::WriteOutput& out,
                              internal::WriteContent& content) override {
    ByteSink& sink = out.file();
    SaveOptions o = o_;
    if (o.archive_name.empty()) o.archive_name = archive_name_for(sink.name());
    return write_torch_zip(sink, content.root ? content.root : state_dict_value(content.tensors),
                           content.tensors, o, content.feed.get());
  }

 private:
  SaveOptions o_;
};

}  // namespace

std::unique_ptr<internal::Writer> internal::make_torch_writer(const SaveOptions& options) {
  return std::make_unique<TorchWriter>(options);
}

void save_torch(ByteSink& sink, const ConstValuePtr& root, const std::vector<Tensor>& tensors,
                const SaveOptions& options) {
  write_torch_zip(sink, root, tensors, options);
}

void save_torch(const std::string& path, const ConstValuePtr& root,
                const std::vector<Tensor>& tensors, const SaveOptions& options) {
  SaveOptions o = options;
  if (o.archive_name.empty()) o.archive_name = archive_name_for(path);
  FileSinkOptions fo;
  fo.atomic = options.atomic;
  fo.fsync = options.fsync;
  auto sink = create_file_sink(path, fo);
  save_torch(*sink, root, tensors, o);
  sink->commit();
}

ValuePtr state_dict_value(const std::vector<Tensor>& tensors) {
  auto d = Value::ordered_dict();
  // Value::set searches the entries linearly, which made a 1M-tensor state dict take hours;
  // an index keeps set()'s semantics (a repeated name replaces the value in its first slot).
  std::unordered_map<std::string_view, size_t> at;
  at.reserve(tensors.size());
  d->entries().reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto [it, fresh] = at.emplace(tensors[i].name(), d->entries().size());
    if (fresh)
      d->entries().emplace_back(Value::string(tensors[i].name()), Value::tensor(i));
    else
      d->entries()[it->second].second = Value::tensor(i);
  }
  return d;
}

}  // namespace ckpt
