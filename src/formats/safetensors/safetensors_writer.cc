// safetensors writer (layout: safetensors_reader.cc; the reference writer's choices this one
// follows: docs/formats/safetensors.md "safetensors", **Dtype order**).
//
// The header is compact JSON ("__metadata__" first, then the tensors in data order) padded with
// trailing spaces so that 8 + N is a multiple of the alignment. Tensors are ordered like the
// reference writer (descending dtype alignment rank, then name), so with an 8-aligned buffer
// start every tensor begins at a multiple of its element size.

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_set>

#include "ckpt/error.h"
#include "ckpt/safetensors.h"
#include "formats/writer.h"
#include "io/gather.h"
#include "util/bytes.h"
#include "util/host_check.h"

namespace ckpt {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// The reference `Dtype` enum order (docs/formats/safetensors.md "safetensors", **Dtype order**),
// which its writer sorts by (descending).
int alignment_rank(DType d) {
  switch (d) {
    case DType::kBool:
      return 0;
    case DType::kFloat4_e2m1:
    case DType::kFloat4_e2m1fn_x2:  // written as F4
      return 1;
    case DType::kFloat6_e2m3:
      return 2;
    case DType::kFloat6_e3m2:
      return 3;
    case DType::kUInt8:
      return 4;
    case DType::kInt8:
      return 5;
    case DType::kFloat8_e5m2:
      return 6;
    case DType::kFloat8_e4m3fn:
      return 7;
    case DType::kFloat8_e8m0fnu:
      return 8;
    case DType::kFloat8_e4m3fnuz:
      return 9;
    case DType::kFloat8_e5m2fnuz:
      return 10;
    case DType::kInt16:
      return 11;
    case DType::kUInt16:
      return 12;
    case DType::kFloat16:
      return 13;
    case DType::kBFloat16:
      return 14;
    case DType::kInt32:
      return 15;
    case DType::kUInt32:
      return 16;
    case DType::kFloat32:
      return 17;
    case DType::kComplex64:
      return 18;
    case DType::kFloat64:
      return 19;
    case DType::kInt64:
      return 20;
    case DType::kUInt64:
      return 21;
    default:
      return -1;
  }
}

// The dtype a tensor is stored as: torch's float4_e2m1fn_x2 (two 4-bit floats a byte) is F4,
// as safetensors writes it.
DType stored_dtype(DType d) { return d == DType::kFloat4_e2m1fn_x2 ? DType::kFloat4_e2m1 : d; }

// save_safetensors, with the tensors' bytes from `feed` when it is set.
void write_safetensors(ByteSink& sink, const std::vector<Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata,
                       const SafetensorsSaveOptions& options, const internal::TensorFeed* feed) {
  const uint64_t align = options.alignment ? options.alignment : 8;
  if (!internal::is_pow2(align) || align > (1ull << 30))
    throw Error(ErrorCode::kInvalidArgument,
                "alignment must be a power of two up to 1 GiB, got " + std::to_string(align),
                sink.name());

  struct Item {
    const Tensor* t;
    uint64_t nbytes;
  };
  std::vector<Item> items;
  items.reserve(tensors.size());
  std::unordered_set<std::string> names;
  std::unordered_set<const void*> storages;
  for (const Tensor& t : tensors) {
    const std::string& name = t.name();
    if (name.empty() || name == "__metadata__")
      throw Error(ErrorCode::kInvalidArgument, "tensor name \"" + name + "\" is not allowed",
                  sink.name(), name);
    if (!names.insert(name).second)
      throw Error(ErrorCode::kInvalidArgument, "duplicate tensor name", sink.name(), name);
    if (t.dtype() == DType::kFloat4_e2m1fn_x2 && t.shape().empty())
      throw Error(ErrorCode::kInvalidArgument,
                  "a 0-d float4_e2m1fn_x2 tensor has no last dim to write as F4 pairs", sink.name(),
                  name);
    if (!dtype_info(stored_dtype(t.dtype())).safetensors)
      throw Error(ErrorCode::kUnsupported,
                  "dtype " + std::string(dtype_name(t.dtype())) + " has no safetensors code",
                  sink.name(), name);
    auto nbytes = dtype_nbytes(t.dtype(), t.info().numel());
    if (!nbytes)
      throw Error(ErrorCode::kInvalidArgument,
                  "element count does not fill whole bytes for a sub-byte dtype", sink.name(),
                  name);
    if (dtype_size(t.dtype()) == 0 && !t.info().is_contiguous())
      throw Error(ErrorCode::kInvalidArgument, "a sub-byte tensor must be contiguous", sink.name(),
                  name);
    internal::require_host_tensor(t, sink.name());
    if (*nbytes > 0 && !t.data() && !feed)
      throw Error(ErrorCode::kInvalidArgument, "tensor has no bytes loaded", sink.name(), name);
    if (t.storage() && !options.copy_shared) {
      // Identity of the Storage, and of its memory (two Storage objects over one buffer).
      bool shared = !storages.insert(t.storage().get()).second;
      if (t.storage()->data && t.storage()->info.nbytes > 0)
        shared |= !storages.insert(t.storage()->data).second;
      if (shared)
        throw Error(ErrorCode::kInvalidArgument,
                    "tensor shares its storage with another tensor; safetensors cannot express "
                    "sharing: set SafetensorsSaveOptions::copy_shared to write separate copies",
                    sink.name(), name);
    }
    items.push_back({&t, *nbytes});
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    int ra = alignment_rank(a.t->dtype()), rb = alignment_rank(b.t->dtype());
    if (ra != rb) return ra > rb;
    return a.t->name() < b.t->name();
  });

  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) json += ',';
      first = false;
      json += nlohmann::json(k).dump() + ":" + nlohmann::json(v).dump();
    }
    json += "}";
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const Tensor& t = *items[i].t;
    if (i || !metadata.empty()) json += ',';
    json += nlohmann::json(t.name()).dump();
    json += ":{\"dtype\":\"";
    json += dtype_info(stored_dtype(t.dtype())).safetensors;
    json += "\",\"shape\":[";
    for (size_t d = 0; d < t.shape().size(); ++d) {
      if (d) json += ',';
      // float4_e2m1fn_x2: F4 elements, twice as many along the last dim (as safetensors).
      const bool pairs = t.dtype() == DType::kFloat4_e2m1fn_x2 && d + 1 == t.shape().size();
      json += std::to_string(t.shape()[d] * (pairs ? 2 : 1));
    }
    uint64_t end = offset + items[i].nbytes;
    json += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(end) + "]}";
    offset = end;
  }
  json += "}";
  const uint64_t padded = internal::align_up(8 + json.size(), align) - 8;
  json.append(padded - json.size(), ' ');
  if (json.size() > kMaxHeaderBytes)
    throw Error(ErrorCode::kLimitExceeded,
                "JSON header of " + std::to_string(json.size()) +
                    " bytes exceeds the safetensors maximum of 100000000",
                sink.name());

  // The file's exact size is known: a file sink preallocates it (ByteSink::reserve).
  sink.reserve(8 + json.size() + offset);
  // Small tensors are gathered into 1 MiB writes; big ones go straight from the tensor's memory.
  internal::Gather out(sink);
  std::byte len[8];
  internal::store_le<uint64_t>(len, json.size());
  out.write(len);
  out.write(internal::as_bytes(json));
  std::vector<const Tensor*> order;
  std::vector<uint64_t> sizes;
  for (const Item& it : items)
    if (it.nbytes > 0) {
      order.push_back(it.t);
      sizes.push_back(it.nbytes);
    }
  internal::feed_each(feed, order, [&](size_t k, const Tensor& t) {
    if (t.info().is_contiguous()) {
      out.write({t.data(), sizes[k]});
    } else {
      std::vector<std::byte> c = t.contiguous_bytes();
      out.write(c);
    }
  });
  out.flush();
}

}  // namespace

void save_safetensors(ByteSink& sink, const std::vector<Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata,
                      const SafetensorsSaveOptions& options) {
  write_safetensors(sink, tensors, metadata, options, nullptr);
}

void save_safetensors(const std::string& path, const std::vector<Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata,
                      const SafetensorsSaveOptions& options) {
  auto sink = create_file_sink(path, FileSinkOptions{options.atomic, options.fsync});
  save_safetensors(*sink, tensors, metadata, options);
  sink->commit();
}

namespace internal {
namespace {

class SafetensorsWriter final : public Writer {
 public:
  explicit SafetensorsWriter(const SafetensorsSaveOptions& o) : o_(o) {}
  const WriterCaps& caps() const override {
    static const WriterCaps caps = [] {
      WriterCaps c;
      c.format = "safetensors";
      c.metadata = true;
      c.digests = true;
      c.sharded = true;
      return c;
    }();
    return caps;
  }
  bool holds(DType dtype) const override { return dtype_info(stored_dtype(dtype)).safetensors; }
  bool copies_shared() const override { return o_.copy_shared; }
  WriteResult write(WriteOutput& out, WriteContent& content) override {
    write_safetensors(out.file(), content.tensors, content.metadata, o_, content.feed.get());
    return {};
  }

 private:
  SafetensorsSaveOptions o_;
};

}  // namespace

std::unique_ptr<Writer> make_safetensors_writer(const SafetensorsSaveOptions& options) {
  return std::make_unique<SafetensorsWriter>(options);
}

}  // namespace internal

}  // namespace ckpt
