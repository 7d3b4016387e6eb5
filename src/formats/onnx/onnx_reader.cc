// ONNX reader (docs/formats/onnx.md "ONNX"): a ModelProto read with the offset-keeping wire reader
// (onnx_wire.h). Tensors: the graph's initializers, those of every subgraph (If/Loop/Scan bodies,
// any graph-valued attribute, in the order they appear) and Constant nodes' `value` tensors
// (named by the node's output, as onnx names them).
//
//   raw_data      zero-copy: a raw storage at its offset in the .onnx file
//   typed fields  float_data, int32_data (also int8/16, uint8/16, bool, float16, bfloat16,
//                 float8 kinds, float4 pairs as ONNX packs them), int64_data, double_data,
//                 uint64_data: decoded at load by the model's StorageDecoder
//   external      data_location = EXTERNAL: location (relative to the model's folder; absolute
//                 paths and `..` refused), offset, length, checksum: read by the decoder from
//                 that file; `prepacked*` entries are onnxruntime's pre-packed blobs
//
// Refused with Error naming the tensor: string tensors, dtypes ckpt has no type for (int4,
// uint4, int2, uint2), segments, sparse initializers and sparse Constant values.

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "ckpt/error.h"
#include "formats/onnx/onnx_model.h"
#include "formats/onnx/onnx_tensor_proto.h"
#include "formats/onnx/onnx_typed.h"
#include "formats/onnx/onnx_wire.h"
#include "formats/open.h"
#include "io/inside.h"
#include "util/sha256.h"
#include "util/text.h"

namespace ckpt::internal {

using onnx::Field;
using onnx::Reader;

namespace {

constexpr int kMaxDepth = 64;

struct Slot {
  enum Kind : uint8_t { kNone, kTyped, kExternal } kind = kNone;
  // kTyped: the TensorProto's bytes in the .onnx
  uint64_t msg_offset = 0, msg_size = 0;
  DType dtype = DType::kUInt8;
  // kExternal
  std::string path;  // resolved
  std::string location;
  uint64_t offset = 0;
};

class OnnxDecoder final : public StorageDecoder {
 public:
  OnnxDecoder(SourcePtr src, std::vector<Slot> slots, std::vector<std::string> names)
      : src_(std::move(src)), slots_(std::move(slots)), names_(std::move(names)) {}

  void read(size_t index, std::span<std::byte> dst, bool verify) const override {
    (void)verify;
    const Slot& s = slots_.at(index);
    if (s.kind == Slot::kExternal) {
      SourcePtr f = external_file(index, dst.size());
      try {
        f->read_into(s.offset, dst);
      } catch (Error& e) {
        if (e.record().empty()) e.with_record(names_[index]);
        throw;
      }
      return;
    }
    if (s.kind != Slot::kTyped)
      throw Error(ErrorCode::kCorrupt, "no data for this storage", src_->name(), names_[index]);
    Bytes msg = src_->read(s.msg_offset, s.msg_size);
    auto bytes =
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(msg.begin()), msg.size());
    TypedField tf = typed_field(s.dtype);
    size_t at = 0;
    bool ok = for_each_typed(bytes, s.msg_offset, src_->size(), tf, [&](uint64_t v) {
      if (at + tf.width > dst.size()) {
        at = dst.size() + 1;
        return;
      }
      for (uint32_t k = 0; k < tf.width; ++k)
        dst[at + k] = static_cast<std::byte>((v >> (8 * k)) & 0xff);
      at += tf.width;
    });
    if (!ok || at != dst.size())
      throw Error(ErrorCode::kCorrupt,
                  std::string("the tensor's ") + tf.name + " does not hold its " +
                      std::to_string(dst.size()) + " bytes",
                  src_->name(), names_[index], s.msg_offset);
  }

  // Before a load allocates the tensor: its external file opens (a regular file) and holds its
  // range.
  void check(size_t index, uint64_t nbytes) const override {
    if (slots_.at(index).kind == Slot::kExternal) external_file(index, nbytes);
  }

  // The external data file of storage `index`, opened, with the storage's range checked against
  // it; errors name the file, the model and the tensor.
  SourcePtr external_file(size_t index, uint64_t nbytes) const {
    const Slot& s = slots_.at(index);
    SourcePtr f;
    try {
      f = file(s.path, names_[index]);
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kUnsupported) throw;
      throw Error(
          e.code(),
          "external data file \"" + s.location + "\" of model " + src_->name() + ": " + e.message(),
          s.path, names_[index]);
    }
    if (s.offset > f->size() || nbytes > f->size() - s.offset)
      throw Error(ErrorCode::kTruncated,
                  "external data (" + std::to_string(nbytes) + " bytes at " +
                      std::to_string(s.offset) + ") passes the end of " + s.location + " (" +
                      std::to_string(f->size()) + " bytes) for model " + src_->name(),
                  f->name(), names_[index], s.offset);
    return f;
  }

  SourcePtr file(const std::string& path, const std::string& tensor) const {
    std::lock_guard lock(mu_);
    auto it = files_.find(path);
    if (it != files_.end()) return it->second;
    if (onnx_model_dir(src_->name()).empty())
      throw Error(ErrorCode::kUnsupported,
                  "external data needs the model's folder, and this model was not opened from a "
                  "file",
                  src_->name(), tensor);
    check_inside(path, tensor);
    SourcePtr f;
    try {
      f = open_file_source(path);
    } catch (Error& e) {
      e.with_record(tensor);
      throw;
    }
    files_.emplace(path, f);
    return f;
  }

  // A location that passes lexical checks may still leave the folder through a symbolic link.
  void check_inside(const std::string& path, const std::string& tensor) const {
    internal::check_inside(path, onnx_model_dir(src_->name()), "external data file",
                           "the model's folder", src_->name(), tensor);
  }

  const std::vector<Slot>& slots() const { return slots_; }

 private:
  SourcePtr src_;
  std::vector<Slot> slots_;
  std::vector<std::string> names_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, SourcePtr> files_;
};

// The digest (util/sha256.h: Sha256Stream or Sha1Stream) of [offset, offset + len) of `f`.
template <class Stream>
std::string sha_hex(const ByteSource& f, uint64_t offset, uint64_t len) {
  Stream h;
  std::vector<std::byte> buf(std::min<uint64_t>(len, 4u << 20));
  for (uint64_t at = 0; at < len;) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), len - at));
    f.read_into(offset + at, std::span(buf.data(), n));
    h.update(buf.data(), n);
    at += n;
  }
  return to_hex(h.finish());
}

// What `verify` checks of an ONNX model: every external range inside its file, no overlaps
// between tensors or pre-packed buffers in one file, SHA-1 `checksum`s of whole files, SHA-256
// pre-pack checksums (ckpt's), and every typed storage decoded. Each step returns the number of
// things it checked.
struct VerifyRange {
  uint64_t begin, end;
  std::string what;
};
using RangesByFile = std::map<std::string, std::vector<VerifyRange>>;

// The tensors' external ranges (collected into `by_file`, their files' checksums into
// `checksums`) and typed storages, decoded.
size_t verify_tensors(const CheckpointModel& m, const OnnxExtension& ext,
                      const OnnxDecoder& decoder, RangesByFile& by_file,
                      std::map<std::string, std::string>& checksums) {
  size_t checked = 0;
  const auto& slots = decoder.slots();
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const Slot& s = slots[i];
    const auto& place = ext.places[i];
    if (s.kind == Slot::kExternal) {
      SourcePtr f = decoder.file(s.path, m.tensors[i].name);
      uint64_t n = m.storages[i].nbytes;
      if (s.offset > f->size() || n > f->size() - s.offset)
        throw Error(ErrorCode::kTruncated,
                    "external data (" + std::to_string(n) + " bytes at " +
                        std::to_string(s.offset) + ") passes the end of " + s.location + " (" +
                        std::to_string(f->size()) + " bytes)",
                    f->name(), m.tensors[i].name, s.offset);
      if (n) by_file[s.path].push_back({s.offset, s.offset + n, "tensor " + m.tensors[i].name});
      if (!place.checksum.empty()) {
        auto [it, fresh] = checksums.emplace(s.path, place.checksum);
        if (!fresh && it->second != place.checksum)
          throw Error(ErrorCode::kCorrupt, "two different checksums given for " + s.location,
                      f->name(), m.tensors[i].name);
      }
      ++checked;
    } else if (s.kind == Slot::kTyped) {
      std::vector<std::byte> tmp(m.storages[i].nbytes);
      decoder.read(i, tmp, true);
      ++checked;
    }
    // raw_data: inside the .onnx by construction, with nothing to check it against (not
    // counted: verify says "not verified" for a model that has only those)
  }
  return checked;
}

// onnxruntime's pre-packed buffers: inside their files (collected into `by_file`), SHA-256s.
size_t verify_prepacked(const CheckpointModel& m, const OnnxExtension& ext,
                        const OnnxDecoder& decoder, RangesByFile& by_file) {
  size_t checked = 0;
  std::string dir = onnx_model_dir(m.source->name());
  if (dir.empty()) dir = ".";
  for (const auto& p : ext.prepacked) {
    std::string path = onnx_external_path(dir, p.location, p.tensor);
    SourcePtr f = decoder.file(path, p.tensor);
    for (const auto& b : p.buffers) {
      if (b.offset > f->size() || b.length > f->size() - b.offset)
        throw Error(ErrorCode::kTruncated,
                    "pre-packed buffer " + p.key + " (" + std::to_string(b.length) + " bytes at " +
                        std::to_string(b.offset) + ") passes the end of " + p.location + " (" +
                        std::to_string(f->size()) + " bytes)",
                    f->name(), p.tensor, b.offset);
      if (b.length)
        by_file[path].push_back(
            {b.offset, b.offset + b.length, "pre-pack " + p.key + " of " + p.tensor});
      if (b.checksum.size() == 64) {
        std::string got = sha_hex<Sha256Stream>(*f, b.offset, b.length);
        if (got != b.checksum)
          throw Error(
              ErrorCode::kCorrupt,
              "pre-packed buffer " + p.key + " has SHA-256 " + got + ", expected " + b.checksum,
              f->name(), p.tensor, b.offset);
        ++checked;
      }
    }
  }
  return checked;
}

void refuse_overlapping_ranges(RangesByFile& by_file) {
  for (auto& [path, ranges] : by_file) {
    std::sort(ranges.begin(), ranges.end(),
              [](const VerifyRange& a, const VerifyRange& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < ranges.size(); ++i)
      if (ranges[i].begin < ranges[i - 1].end)
        throw Error(ErrorCode::kCorrupt,
                    ranges[i].what + " (at " + std::to_string(ranges[i].begin) + ") overlaps " +
                        ranges[i - 1].what + " (ending at " + std::to_string(ranges[i - 1].end) +
                        ")",
                    path, {}, ranges[i].begin);
  }
}

// Whole files against the SHA-1 the model gives them.
size_t verify_file_checksums(const std::map<std::string, std::string>& checksums,
                             const OnnxDecoder& decoder) {
  size_t checked = 0;
  for (const auto& [path, want] : checksums) {
    SourcePtr f = decoder.file(path, {});
    std::string got = sha_hex<Sha1Stream>(*f, 0, f->size());
    std::string w = want;
    std::transform(w.begin(), w.end(), w.begin(), [](unsigned char c) { return std::tolower(c); });
    if (got != w)
      throw Error(ErrorCode::kCorrupt, "SHA-1 of the file is " + got + ", the model says " + want,
                  path);
    ++checked;
  }
  return checked;
}

size_t verify_onnx(const CheckpointModel& m, const OnnxExtension& ext, const OnnxDecoder& decoder) {
  RangesByFile by_file;
  std::map<std::string, std::string> checksums;  // path → expected sha1
  size_t checked = verify_tensors(m, ext, decoder, by_file, checksums);
  checked += verify_prepacked(m, ext, decoder, by_file);
  refuse_overlapping_ranges(by_file);
  return checked + verify_file_checksums(checksums, decoder);
}

class Parser {
 public:
  Parser(SourcePtr src, const OpenOptions& opt) : src_(std::move(src)), opt_(opt) {}

  std::shared_ptr<CheckpointModel> run();
  void refuse_overlaps() const;

 private:
  void model(std::span<const uint8_t> b, uint64_t base);
  void graph(std::span<const uint8_t> b, uint64_t base, int depth);
  void node(std::span<const uint8_t> b, uint64_t base, int depth);
  void attribute(std::span<const uint8_t> b, uint64_t base, int depth, const std::string& op,
                 const std::string& out0);
  // A TensorProto: its fields read, checked, placed (raw_data, external, typed fields) and
  // appended to the model.
  struct Checked {
    DType dtype;
    uint64_t numel, nbytes;
  };
  void tensor(std::span<const uint8_t> b, uint64_t base, const std::string& kind,
              const std::string& fallback_name);
  Checked check_tensor(const TensorProtoFields& f, const std::string& name, const std::string& kind,
                       uint64_t base);
  void place_external(const TensorProtoFields& f, const std::string& name, const Checked& c,
                      uint64_t base, Slot& slot, OnnxTensorPlace& place);
  void place_typed(std::span<const uint8_t> b, uint64_t base, const TensorProtoFields& f,
                   const std::string& name, const Checked& c, Slot& slot, OnnxTensorPlace& place);
  [[noreturn]] void corrupt(const std::string& msg, uint64_t at, const std::string& t = {}) {
    throw Error(ErrorCode::kCorrupt, msg, src_->name(), t, at);
  }

  SourcePtr src_;
  const OpenOptions& opt_;
  uint64_t file_end_ = 0;
  std::string dir_;
  std::shared_ptr<CheckpointModel> m_;
  std::shared_ptr<OnnxExtension> ext_;
  std::vector<Slot> slots_;
  std::unordered_set<std::string> names_;
  size_t initializers_ = 0, constants_ = 0, subgraphs_ = 0;
};

void Parser::model(std::span<const uint8_t> b, uint64_t base) {
  Reader r(b, base, file_end_, "the ModelProto");
  Field f;
  bool have_graph = false;
  while (r.next(f)) {
    switch (f.number) {
      case 1:
        if (f.wire != onnx::kVarint) corrupt("ir_version is not a varint", f.tag_offset);
        m_->properties["ir_version"] = std::to_string(f.value);
        break;
      case 2:
        if (f.wire == onnx::kLen) m_->properties["producer_name"] = std::string(f.str());
        break;
      case 3:
        if (f.wire == onnx::kLen) m_->properties["producer_version"] = std::string(f.str());
        break;
      case 4:
        if (f.wire == onnx::kLen) m_->properties["domain"] = std::string(f.str());
        break;
      case 7:
        if (f.wire != onnx::kLen) corrupt("graph is not a message", f.tag_offset);
        if (have_graph) corrupt("a second graph field in the ModelProto", f.tag_offset);
        have_graph = true;
        graph(f.bytes, f.offset, 0);
        break;
      case 8: {
        if (f.wire != onnx::kLen) corrupt("opset_import is not a message", f.tag_offset);
        Reader o(f.bytes, f.offset, file_end_, "an OperatorSetIdProto");
        Field g;
        std::string domain;
        uint64_t version = 0;
        while (o.next(g)) {
          if (g.number == 1 && g.wire == onnx::kLen) domain = std::string(g.str());
          if (g.number == 2 && g.wire == onnx::kVarint) version = g.value;
        }
        m_->properties["opset." + (domain.empty() ? std::string("ai.onnx") : domain)] =
            std::to_string(version);
        break;
      }
      default:
        break;  // doc_string, metadata_props, functions, training_info: not weights
    }
  }
  if (!have_graph) corrupt("the ModelProto has no graph", base);
}

void Parser::graph(std::span<const uint8_t> b, uint64_t base, int depth) {
  if (depth > kMaxDepth)
    corrupt("subgraphs nested deeper than " + std::to_string(kMaxDepth) + " levels", base);
  if (depth > 0) ++subgraphs_;
  Reader r(b, base, file_end_, "a GraphProto");
  Field f;
  while (r.next(f)) {
    if (f.number == 5) {
      if (f.wire != onnx::kLen) corrupt("initializer is not a message", f.tag_offset);
      tensor(f.bytes, f.offset, depth ? "subgraph initializer" : "initializer", {});
      ++initializers_;
    } else if (f.number == 1) {
      if (f.wire != onnx::kLen) corrupt("node is not a message", f.tag_offset);
      node(f.bytes, f.offset, depth);
    } else if (f.number == 15) {
      std::string name;
      if (f.wire == onnx::kLen) {
        Reader s(f.bytes, f.offset, file_end_, "a SparseTensorProto");
        Field g;
        while (s.next(g))
          if (g.number == 1 && g.wire == onnx::kLen) {
            Reader t(g.bytes, g.offset, file_end_, "a TensorProto");
            Field h;
            while (t.next(h))
              if (h.number == 8 && h.wire == onnx::kLen) name = std::string(h.str());
          }
      }
      throw Error(ErrorCode::kUnsupported,
                  "sparse initializer \"" + name +
                      "\": ckpt reads dense tensors only (densify it with onnx first)",
                  src_->name(), name, f.tag_offset);
    }
  }
}

void Parser::node(std::span<const uint8_t> b, uint64_t base, int depth) {
  // Outputs and op_type may come after the attributes: find them first.
  std::string op, out0, name;
  {
    Reader r(b, base, file_end_, "a NodeProto");
    Field f;
    bool first_out = true;
    while (r.next(f)) {
      if (f.wire != onnx::kLen) continue;
      if (f.number == 4) op = std::string(f.str());
      if (f.number == 3) name = std::string(f.str());
      if (f.number == 2 && first_out) {
        out0 = std::string(f.str());
        first_out = false;
      }
    }
  }
  if (out0.empty()) out0 = name;
  Reader r(b, base, file_end_, "a NodeProto");
  Field f;
  while (r.next(f))
    if (f.number == 5 && f.wire == onnx::kLen) attribute(f.bytes, f.offset, depth, op, out0);
}

void Parser::attribute(std::span<const uint8_t> b, uint64_t base, int depth, const std::string& op,
                       const std::string& out0) {
  std::string name;
  {
    Reader r(b, base, file_end_, "an AttributeProto");
    Field f;
    while (r.next(f))
      if (f.number == 1 && f.wire == onnx::kLen) name = std::string(f.str());
  }
  const bool constant = op == "Constant";
  Reader r(b, base, file_end_, "an AttributeProto");
  Field f;
  while (r.next(f)) {
    if (f.wire != onnx::kLen) continue;
    if ((f.number == 6 || f.number == 11)) {  // g, graphs: If/Loop/Scan bodies
      graph(f.bytes, f.offset, depth + 1);
    } else if (f.number == 5 && constant && name == "value") {
      tensor(f.bytes, f.offset, "constant", out0);
      ++constants_;
    } else if (f.number == 22 && constant) {
      throw Error(ErrorCode::kUnsupported,
                  "Constant \"" + out0 + "\" holds a sparse tensor: ckpt reads dense tensors only",
                  src_->name(), out0, f.tag_offset);
    }
  }
}

void Parser::tensor(std::span<const uint8_t> b, uint64_t base, const std::string& kind,
                    const std::string& fallback_name) {
  TensorProtoFields f = read_tensor_proto(b, base, file_end_, opt_.limits.max_dims, src_->name());
  // A Constant's value is known in the graph by the node's output name (its TensorProto's own
  // name, often empty or reused, is not a graph name).
  std::string name = f.name;
  if (kind == "constant" && !fallback_name.empty()) name = fallback_name;
  if (name.empty()) name = fallback_name;
  if (name.empty()) corrupt("a " + kind + " without a name", base);
  const Checked c = check_tensor(f, name, kind, base);

  StorageInfo st;
  st.key = name;
  st.dtype = c.dtype;
  st.nbytes = c.nbytes;
  Slot slot;
  OnnxTensorPlace place;
  place.tensor = name;
  int sources = (f.raw ? 1 : 0) + (f.external ? 1 : 0) + (f.typed_seen.empty() ? 0 : 1);
  if (sources > 1)
    throw Error(ErrorCode::kCorrupt,
                "the tensor's data is in more than one place (raw_data, typed fields, external "
                "data)",
                src_->name(), name, base);
  if (f.raw) {
    if (f.raw->bytes.size() != c.nbytes)
      throw Error(ErrorCode::kCorrupt,
                  "raw_data holds " + std::to_string(f.raw->bytes.size()) + " bytes but " +
                      std::to_string(c.numel) + " elements of " + std::string(dtype_name(c.dtype)) +
                      " need " + std::to_string(c.nbytes),
                  src_->name(), name, f.raw->offset);
    st.offset = f.raw->offset;
    place.how = "raw_data";
    place.offset = f.raw->offset;
    place.length = c.nbytes;
  } else if (f.external) {
    place_external(f, name, c, base, slot, place);
  } else if (!f.typed_seen.empty()) {
    place_typed(b, base, f, name, c, slot, place);
  } else if (c.nbytes != 0) {
    throw Error(ErrorCode::kCorrupt,
                "the tensor has " + std::to_string(c.numel) +
                    " elements but no data (no raw_data, typed field or external data)",
                src_->name(), name, base);
  } else {
    place.how = "empty";
    st.offset = base;  // nothing to read
  }

  TensorInfo t;
  t.name = name;
  t.dtype = c.dtype;
  t.strides = contiguous_strides(f.dims);
  t.shape = std::move(f.dims);
  t.storage = m_->storages.size();
  t.type = kind;
  t.is_parameter = kind != "constant";
  m_->root->entries().emplace_back(Value::string(name), Value::tensor(m_->tensors.size()));
  m_->storages.push_back(std::move(st));
  m_->tensors.push_back(std::move(t));
  slots_.push_back(std::move(slot));
  ext_->places.push_back(std::move(place));
}

// The tensor's dtype and size: refuses segments, strings, dtypes ckpt lacks, bad dims, a second
// tensor of the name and more than Limits::max_tensors tensors.
Parser::Checked Parser::check_tensor(const TensorProtoFields& f, const std::string& name,
                                     const std::string& kind, uint64_t base) {
  auto fail = [&](ErrorCode c, const std::string& msg) -> void {
    throw Error(c, msg, src_->name(), name, base);
  };
  if (f.segment) fail(ErrorCode::kUnsupported, "segmented tensors are not supported");
  if (f.data_type == 8 || f.has_strings)
    fail(ErrorCode::kUnsupported, "string tensors are not supported (ckpt reads numeric tensors)");
  auto dt = dtype_from_onnx(f.data_type);
  if (!dt)
    fail(ErrorCode::kUnsupported, std::string("ONNX data type ") + std::to_string(f.data_type) +
                                      " (" + onnx_type_name(f.data_type) + ") has no ckpt dtype");
  uint64_t numel = 1;
  // The product of the non-zero dims bounds every contiguous stride (int64): a zero dim makes
  // the tensor empty but its strides still multiply the others.
  uint64_t extent = 1;
  for (int64_t d : f.dims) {
    if (d < 0) fail(ErrorCode::kCorrupt, "negative dimension " + std::to_string(d));
    if (d != 0 && extent > static_cast<uint64_t>(INT64_MAX) / static_cast<uint64_t>(d))
      fail(ErrorCode::kCorrupt, "element count overflows");
    if (d != 0) extent *= static_cast<uint64_t>(d);
    numel *= static_cast<uint64_t>(d);
  }
  auto nb = dtype_nbytes(*dt, numel);
  if (!nb)
    fail(ErrorCode::kCorrupt, std::to_string(numel) + " elements of " +
                                  std::string(dtype_name(*dt)) + " do not fill whole bytes");
  if (!names_.insert(name).second)
    fail(ErrorCode::kCorrupt, "a second tensor named \"" + name + "\" (" + kind + ")");
  if (m_->tensors.size() >= opt_.limits.max_tensors)
    throw Error(
        ErrorCode::kLimitExceeded,
        "more than " + std::to_string(opt_.limits.max_tensors) + " tensors (Limits::max_tensors)",
        src_->name(), name, base);
  return {*dt, numel, *nb};
}

// data_location = EXTERNAL: the file, offset and length of its bytes, checked against the file
// when it exists; onnxruntime's pre-packed entries.
void Parser::place_external(const TensorProtoFields& f, const std::string& name, const Checked& c,
                            uint64_t base, Slot& slot, OnnxTensorPlace& place) {
  const uint64_t ext_at = f.ext_at;
  std::string location;
  std::optional<uint64_t> offset, length;
  for (auto& [k, v] : f.ext) {
    if (k == "location")
      location = v;
    else if (k == "offset")
      offset = parse_decimal(v, "offset", name, ext_at);
    else if (k == "length")
      length = parse_decimal(v, "length", name, ext_at);
    else if (k == "checksum")
      place.checksum = v;
  }
  slot.kind = Slot::kExternal;
  slot.path = onnx_external_path(dir_, location, name);
  slot.location = location;
  slot.offset = offset.value_or(0);
  if (length && *length != c.nbytes)
    throw Error(ErrorCode::kCorrupt,
                "external data length " + std::to_string(*length) + " but " +
                    std::to_string(c.numel) + " elements of " + std::string(dtype_name(c.dtype)) +
                    " need " + std::to_string(c.nbytes),
                src_->name(), name, ext_at);
  // A range past the end of an existing file is refused now (a load would first allocate
  // the tensor's bytes); a missing file is reported when its bytes are read.
  if (!onnx_model_dir(src_->name()).empty()) {
    std::error_code ec;
    uint64_t fsize = std::filesystem::file_size(slot.path, ec);
    if (!ec && (slot.offset > fsize || c.nbytes > fsize - slot.offset))
      throw Error(ErrorCode::kTruncated,
                  "external data (" + std::to_string(c.nbytes) + " bytes at " +
                      std::to_string(slot.offset) + ") passes the end of " + location + " (" +
                      std::to_string(fsize) + " bytes)",
                  src_->name(), name, ext_at);
  }
  place.how = "external";
  place.location = location;
  place.offset = slot.offset;
  place.length = c.nbytes;
  for (auto& [k, v] : f.ext)
    if (k.rfind("prepacked", 0) == 0)
      ext_->prepacked.push_back(parse_prepacked(name, location, k, v, base, ext_at, src_->name()));
}

// Values in typed fields (float_data, int32_data...): only the dtype's field, as many values as
// the tensor needs; decoded at load.
void Parser::place_typed(std::span<const uint8_t> b, uint64_t base, const TensorProtoFields& f,
                         const std::string& name, const Checked& c, Slot& slot,
                         OnnxTensorPlace& place) {
  TypedField tf = typed_field(c.dtype);
  for (auto& [field, at] : f.typed_seen)
    if (field != tf.number)
      throw Error(ErrorCode::kCorrupt,
                  std::string("a ") + std::string(dtype_name(c.dtype)) +
                      " tensor's values must be in " + tf.name + " (field " +
                      std::to_string(tf.number) + "), not field " + std::to_string(field),
                  src_->name(), name, at);
  uint64_t count = 0;
  if (!for_each_typed(b, base, file_end_, tf, [&](uint64_t) { ++count; }))
    throw Error(ErrorCode::kCorrupt, std::string("malformed ") + tf.name, src_->name(), name, base);
  if (count * tf.width != c.nbytes)
    throw Error(ErrorCode::kCorrupt,
                std::string(tf.name) + " holds " + std::to_string(count) +
                    " values but the tensor needs " + std::to_string(c.nbytes / tf.width),
                src_->name(), name, base);
  slot.kind = Slot::kTyped;
  slot.msg_offset = base;
  slot.msg_size = b.size();
  slot.dtype = c.dtype;
  place.how = tf.name;
  place.offset = base;
  place.length = b.size();
}

// Two initializers whose external ranges in one file overlap would each load (and convert) their
// own copy of the shared bytes: 2,000 names for one MiB make 2 GiB. No exporter writes that, so
// it is refused at open, as verify always did.
void Parser::refuse_overlaps() const {
  struct Range {
    const std::string* path;
    uint64_t begin, end;
    size_t tensor;
  };
  std::vector<Range> ranges;
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    const uint64_t n = m_->storages[i].nbytes;
    if (s.kind == Slot::kExternal && n > 0) ranges.push_back({&s.path, s.offset, s.offset + n, i});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return std::tie(*a.path, a.begin) < std::tie(*b.path, b.begin);
  });
  for (size_t k = 1; k < ranges.size(); ++k) {
    const Range& a = ranges[k - 1];
    const Range& b = ranges[k];
    if (*a.path == *b.path && b.begin < a.end)
      throw Error(ErrorCode::kCorrupt,
                  "external data of " + m_->tensors[b.tensor].name + " (bytes " +
                      std::to_string(b.begin) + " to " + std::to_string(b.end) + " of " +
                      slots_[b.tensor].location + ") overlaps that of " +
                      m_->tensors[a.tensor].name + " (bytes " + std::to_string(a.begin) + " to " +
                      std::to_string(a.end) + ")",
                  src_->name(), m_->tensors[b.tensor].name);
  }
}

std::shared_ptr<CheckpointModel> Parser::run() {
  file_end_ = src_->size();
  if (file_end_ > opt_.limits.max_metadata_bytes && !src_->memory())
    throw Error(ErrorCode::kLimitExceeded,
                "a " + std::to_string(file_end_) +
                    "-byte .onnx read without a mapping exceeds Limits::max_metadata_bytes (" +
                    std::to_string(opt_.limits.max_metadata_bytes) + ")",
                src_->name(), {}, 0);
  if (file_end_ > (uint64_t{1} << 31))
    throw Error(ErrorCode::kCorrupt,
                "a .onnx file over 2 GiB (protobuf's limit): large weights go to external data",
                src_->name(), {}, 0);
  Bytes all = src_->read(0, file_end_);
  dir_ = onnx_model_dir(src_->name());
  if (dir_.empty()) dir_ = ".";  // for the location checks; reading refuses (OnnxDecoder::file)
  m_ = std::make_shared<CheckpointModel>();
  m_->format = Format::kOnnx;
  m_->source = src_;
  m_->options = opt_;
  m_->root = Value::dict();
  ext_ = std::make_shared<OnnxExtension>();
  try {
    model(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(all.begin()), all.size()), 0);
  } catch (Error& e) {
    e.with_source(src_->name());
    throw;
  }
  m_->properties["initializers"] = std::to_string(initializers_);
  m_->properties["constants"] = std::to_string(constants_);
  m_->properties["subgraphs"] = std::to_string(subgraphs_);
  m_->properties["prepacked"] = std::to_string(ext_->prepacked.size());

  refuse_overlaps();
  bool any_decoded = false;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].kind != Slot::kNone) any_decoded = true;
  std::vector<std::string> names;
  for (auto& t : m_->tensors) names.push_back(t.name);
  auto decoder = std::make_shared<OnnxDecoder>(src_, std::move(slots_), std::move(names));
  if (any_decoded) m_->decoder = decoder;
  m_->extension = ext_;

  // verify: verify_onnx, while the model lives.
  std::weak_ptr<CheckpointModel> weak = m_;
  std::shared_ptr<OnnxExtension> ext = ext_;
  m_->verify = [weak, ext, decoder](const ProgressFn&) -> size_t {
    auto m = weak.lock();
    return m ? verify_onnx(*m, *ext, *decoder) : 0;
  };
  return m_;
}

}  // namespace

std::shared_ptr<CheckpointModel> open_onnx(SourcePtr source, const OpenOptions& options) {
  return Parser(std::move(source), options).run();
}

}  // namespace ckpt::internal
