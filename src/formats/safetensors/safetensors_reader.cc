// safetensors reader (spec: docs/formats/safetensors.md "safetensors", **Layout** and **Read
// validation**).
//
//   u64 LE  N                      header size (<= 100,000,000 and Limits::max_metadata_bytes)
//   N bytes UTF-8 JSON object      may carry leading/trailing whitespace (padding)
//     "__metadata__": {str: str}   optional
//     name: {"dtype": "F32", "shape": [u64...], "data_offsets": [begin, end]}
//   data buffer                    offsets relative to its start (absolute = 8 + N + begin)
//
// The tensors, sorted by (begin, end), must tile the data buffer exactly: no hole, no overlap,
// the last end equals the file's end. So every byte of the file is accounted for. A tensor that
// passes the end of the file is kTruncated (the file was cut), other mismatches kCorrupt.
//
// Tensor order: the tensor table and the root dict follow the data order (sorted by offset, file
// order breaking ties), which is also the order a coalesced read walks the file.

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <vector>

#include "ckpt/error.h"
#include "ckpt/sink.h"  // checkpoint.h needs it (until it includes it itself)
#include "formats/open.h"
#include "util/bytes.h"

namespace ckpt::internal {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;

using Json = nlohmann::ordered_json;

struct Entry {
  std::string name;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
  size_t file_order = 0;
};

class Parser {
 public:
  Parser(SourcePtr source, const OpenOptions& options)
      : src_(std::move(source)), opt_(options), name_(src_->name()) {}

  std::shared_ptr<CheckpointModel> run();

 private:
  [[noreturn]] void fail(ErrorCode code, const std::string& msg, const std::string& tensor = {},
                         std::optional<uint64_t> offset = std::nullopt) const {
    throw Error(code, msg, name_, tensor, offset);
  }
  Json parse_header(std::string_view text) const;
  Entry parse_entry(const std::string& name, const Json& v) const;
  uint64_t get_u64(const Json& v, const std::string& tensor, const char* what) const;

  SourcePtr src_;
  const OpenOptions& opt_;
  std::string name_;
  uint64_t data_start_ = 0;
};

Json Parser::parse_header(std::string_view text) const {
  // nlohmann keeps the last of duplicate keys; the callback sees every key first, so keys are
  // tracked per open object to refuse duplicates (as the reference does).
  std::vector<std::unordered_set<std::string>> open;
  auto cb = [&](int depth, Json::parse_event_t event, Json& parsed) -> bool {
    switch (event) {
      case Json::parse_event_t::object_start:
        open.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (!open.empty()) open.pop_back();
        break;
      case Json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!open.empty() && !open.back().insert(key).second)
          fail(ErrorCode::kCorrupt, "duplicate key \"" + key + "\" in the JSON header", key, 8);
        break;
      }
      default:
        break;
    }
    (void)depth;
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true);
  } catch (const nlohmann::json::exception& e) {
    fail(ErrorCode::kCorrupt, std::string("header is not valid JSON: ") + e.what(), {}, 8);
  }
}

uint64_t Parser::get_u64(const Json& v, const std::string& tensor, const char* what) const {
  if (!v.is_number_unsigned())
    fail(ErrorCode::kCorrupt, std::string(what) + " must be a non-negative integer", tensor);
  return v.get<uint64_t>();
}

Entry Parser::parse_entry(const std::string& name, const Json& v) const {
  if (!v.is_object()) fail(ErrorCode::kCorrupt, "tensor entry is not a JSON object", name);
  Entry e;
  e.name = name;
  auto dt = v.find("dtype");
  auto sh = v.find("shape");
  auto off = v.find("data_offsets");
  if (dt == v.end() || sh == v.end() || off == v.end())
    fail(ErrorCode::kCorrupt, "tensor entry needs \"dtype\", \"shape\" and \"data_offsets\"", name);
  if (!dt->is_string()) fail(ErrorCode::kCorrupt, "\"dtype\" must be a string", name);
  const auto& code = dt->get_ref<const std::string&>();
  auto dtype = dtype_from_safetensors(code);
  if (!dtype) fail(ErrorCode::kUnsupported, "unknown safetensors dtype \"" + code + "\"", name);
  e.dtype = *dtype;

  if (!sh->is_array()) fail(ErrorCode::kCorrupt, "\"shape\" must be an array", name);
  if (sh->size() > opt_.limits.max_dims)
    fail(ErrorCode::kLimitExceeded,
         "tensor has " + std::to_string(sh->size()) + " dimensions, more than Limits::max_dims (" +
             std::to_string(opt_.limits.max_dims) + ")",
         name);
  uint64_t numel = 1;
  for (const auto& d : *sh) {
    uint64_t dim = get_u64(d, name, "a dimension");
    if (dim > static_cast<uint64_t>(INT64_MAX))
      fail(ErrorCode::kCorrupt, "dimension " + std::to_string(dim) + " is too large", name);
    auto n = checked_mul(numel, dim);
    if (!n) fail(ErrorCode::kCorrupt, "element count overflows", name);
    numel = *n;
    e.shape.push_back(static_cast<int64_t>(dim));
  }

  if (!off->is_array() || off->size() != 2)
    fail(ErrorCode::kCorrupt, "\"data_offsets\" must be [begin, end]", name);
  e.begin = get_u64((*off)[0], name, "data_offsets[0]");
  e.end = get_u64((*off)[1], name, "data_offsets[1]");
  if (e.end < e.begin)
    fail(
        ErrorCode::kCorrupt,
        "data_offsets end " + std::to_string(e.end) + " is before begin " + std::to_string(e.begin),
        name);
  auto bits = checked_mul(numel, dtype_info(e.dtype).bits);
  if (!bits) fail(ErrorCode::kCorrupt, "tensor byte size overflows", name);
  if (*bits % 8 != 0)
    fail(ErrorCode::kCorrupt, "sub-byte elements do not end on a byte boundary", name);
  if (*bits / 8 != e.end - e.begin)
    fail(ErrorCode::kCorrupt,
         "shape and dtype need " + std::to_string(*bits / 8) + " bytes but data_offsets span " +
             std::to_string(e.end - e.begin),
         name);
  return e;
}

std::shared_ptr<CheckpointModel> Parser::run() {
  const uint64_t file_size = src_->size();
  if (file_size < 8)
    fail(ErrorCode::kTruncated, "file is shorter than the 8-byte header size", {}, 0);
  std::byte len_buf[8];
  src_->read_into(0, len_buf);
  const uint64_t n = load_le<uint64_t>(len_buf);
  const uint64_t limit = std::min(kMaxHeaderBytes, opt_.limits.max_metadata_bytes);
  if (n > limit)
    fail(ErrorCode::kLimitExceeded,
         "JSON header of " + std::to_string(n) + " bytes exceeds the limit of " +
             std::to_string(limit) + " (Limits::max_metadata_bytes, format maximum 100000000)",
         {}, 0);
  if (n > file_size - 8)
    fail(ErrorCode::kTruncated,
         "JSON header of " + std::to_string(n) + " bytes passes the end of the file (" +
             std::to_string(file_size) + " bytes)",
         {}, 0);
  data_start_ = 8 + n;
  const uint64_t buffer_size = file_size - data_start_;

  Bytes header = src_->read(8, n);
  Json root = parse_header(header.str());
  if (!root.is_object()) fail(ErrorCode::kCorrupt, "header is not a JSON object", {}, 8);

  auto data = std::make_shared<CheckpointModel>();
  data->format = Format::kSafetensors;
  data->source = src_;
  data->options = opt_;

  std::vector<Entry> entries;
  ValuePtr metadata;
  if (root.size() > opt_.limits.max_tensors + 1)
    fail(ErrorCode::kLimitExceeded, std::to_string(root.size()) +
                                        " header entries exceed Limits::max_tensors (" +
                                        std::to_string(opt_.limits.max_tensors) + ")");
  entries.reserve(root.size());
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() == "__metadata__") {
      const Json& m = it.value();
      if (m.is_null()) continue;
      if (!m.is_object())
        fail(ErrorCode::kCorrupt, "__metadata__ must be an object", "__metadata__");
      metadata = Value::dict();
      for (auto mit = m.begin(); mit != m.end(); ++mit) {
        if (!mit.value().is_string())
          fail(ErrorCode::kCorrupt,
               "__metadata__ value for \"" + mit.key() +
                   "\" is not a string (only string to "
                   "string metadata is allowed)",
               "__metadata__");
        const auto& s = mit.value().get_ref<const std::string&>();
        data->properties["metadata." + mit.key()] = s;
        metadata->entries().emplace_back(Value::string(mit.key()), Value::string(s));
      }
      continue;
    }
    entries.push_back(parse_entry(it.key(), it.value()));
    entries.back().file_order = entries.size() - 1;
  }
  if (entries.size() > opt_.limits.max_tensors)
    fail(ErrorCode::kLimitExceeded, std::to_string(entries.size()) +
                                        " tensors exceed Limits::max_tensors (" +
                                        std::to_string(opt_.limits.max_tensors) + ")");

  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.file_order < b.file_order;
  });
  uint64_t expect = 0;
  for (const Entry& e : entries) {
    // A file cut in its data: the header promises bytes the file does not have.
    if (e.end > buffer_size)
      fail(ErrorCode::kTruncated,
           "tensor data (" + std::to_string(e.end - e.begin) + " bytes at " +
               std::to_string(data_start_ + e.begin) + ") passes the end of the file (" +
               std::to_string(file_size) + " bytes)",
           e.name, data_start_ + std::min(e.begin, buffer_size));
    if (e.begin != expect) {
      const char* what = e.begin > expect ? "a hole" : "an overlap";
      fail(ErrorCode::kCorrupt,
           std::string("data_offsets begin ") + std::to_string(e.begin) + " leaves " + what +
               " (previous tensor ends at " + std::to_string(expect) + ")",
           e.name, data_start_ + e.begin);
    }
    expect = e.end;
  }
  if (expect != buffer_size)
    fail(ErrorCode::kCorrupt,
         "tensors end at data offset " + std::to_string(expect) + " but the data buffer has " +
             std::to_string(buffer_size) + " bytes",
         entries.empty() ? std::string() : entries.back().name, data_start_ + expect);

  data->tensors.reserve(entries.size());
  data->storages.reserve(entries.size());
  data->root = Value::dict();
  data->root->entries().reserve(entries.size());
  for (Entry& e : entries) {
    StorageInfo st;
    st.key = e.name;
    st.dtype = e.dtype;
    st.nbytes = e.end - e.begin;
    st.offset = data_start_ + e.begin;
    TensorInfo t;
    t.name = std::move(e.name);
    t.dtype = e.dtype;
    t.strides = contiguous_strides(e.shape);
    t.shape = std::move(e.shape);
    t.storage = data->storages.size();
    data->root->entries().emplace_back(Value::string(t.name), Value::tensor(data->tensors.size()));
    data->storages.push_back(std::move(st));
    data->tensors.push_back(std::move(t));
  }
  // String-to-string metadata rides on the root dict the way torch's OrderedDict carries its
  // _metadata: as the dict's state, so it never collides with a tensor name.
  data->root->set_state(metadata);

  uint64_t alignment = 1;
  while (alignment < 4096 && data_start_ % (alignment * 2) == 0) alignment *= 2;
  data->properties["header_bytes"] = std::to_string(n);
  data->properties["data_start"] = std::to_string(data_start_);
  data->properties["alignment"] = std::to_string(alignment);
  return data;
}

}  // namespace

std::shared_ptr<CheckpointModel> open_safetensors(SourcePtr source, const OpenOptions& options) {
  return Parser(std::move(source), options).run();
}

}  // namespace ckpt::internal
