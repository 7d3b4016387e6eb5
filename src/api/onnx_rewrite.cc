// onnx_rewrite (include/ckpt/onnx.h): the model is written again field by field with the wire
// reader (formats/onnx/onnx_wire.h). Every field is copied byte for byte except:
//   - the messages on the path to an initializer (ModelProto.graph, GraphProto.node,
//     NodeProto.attribute, AttributeProto.g/graphs), whose length prefixes change;
//   - each initializer's data fields (raw_data, the typed fields, external_data, data_location),
//     which are written again: raw_data when inline, else location/offset/length (+ pre-packs).
// The traversal is the reader's (onnx_reader.cc), so the n-th tensor met here is the model's
// tensor n. Constant nodes' tensors are kept as they are.

#include <filesystem>
#include <unordered_map>
#include <unordered_set>

#include "api/checkpoint_impl.h"
#include "ckpt/onnx.h"
#include "ckpt/sink.h"
#include "formats/onnx/onnx_model.h"
#include "formats/onnx/onnx_wire.h"

namespace ckpt {

namespace {

using internal::onnx::Field;
using internal::onnx::Reader;
namespace w = internal::onnx;

uint64_t align_up(uint64_t v, uint64_t a) { return a <= 1 ? v : (v + a - 1) / a * a; }

class Rewriter {
 public:
  Rewriter(const Checkpoint& c, const OnnxRewriteOptions& o, const internal::OnnxExtension& ext,
           std::string location, ByteSink* data, const Checkpoint* weights)
      : c_(c), o_(o), ext_(ext), location_(std::move(location)), data_(data), weights_(weights) {
    for (size_t i = 0; i < ext.prepacked.size(); ++i) packs_[ext.prepacked[i].tensor].push_back(i);
    file_end_ = c.source().size();
  }

  std::string model(std::span<const uint8_t> b, uint64_t base) {
    std::string out;
    Reader r(b, base, file_end_, "the ModelProto");
    Field f;
    while (r.next(f)) {
      if (f.number == 7 && f.wire == w::kLen)
        w::put_len(out, 7, graph(f.bytes, f.offset, 0));
      else
        copy(out, f, b, base);
    }
    return out;
  }

  OnnxRewriteReport report;

 private:
  void copy(std::string& out, const Field& f, std::span<const uint8_t> b, uint64_t base) {
    out.append(reinterpret_cast<const char*>(b.data() + (f.tag_offset - base)),
               static_cast<size_t>(f.end - f.tag_offset));
  }

  std::string graph(std::span<const uint8_t> b, uint64_t base, int depth) {
    std::string out;
    Reader r(b, base, file_end_, "a GraphProto");
    Field f;
    while (r.next(f)) {
      if (f.number == 5 && f.wire == w::kLen)
        w::put_len(out, 5, tensor(f, b, base));
      else if (f.number == 1 && f.wire == w::kLen)
        w::put_len(out, 1, node(f.bytes, f.offset, depth));
      else
        copy(out, f, b, base);
    }
    return out;
  }

  std::string node(std::span<const uint8_t> b, uint64_t base, int depth) {
    std::string op;
    {
      Reader r(b, base, file_end_, "a NodeProto");
      Field f;
      while (r.next(f))
        if (f.number == 4 && f.wire == w::kLen) op = std::string(f.str());
    }
    std::string out;
    Reader r(b, base, file_end_, "a NodeProto");
    Field f;
    while (r.next(f)) {
      if (f.number == 5 && f.wire == w::kLen)
        w::put_len(out, 5, attribute(f.bytes, f.offset, depth, op));
      else
        copy(out, f, b, base);
    }
    return out;
  }

  std::string attribute(std::span<const uint8_t> b, uint64_t base, int depth,
                        const std::string& op) {
    std::string name;
    {
      Reader r(b, base, file_end_, "an AttributeProto");
      Field f;
      while (r.next(f))
        if (f.number == 1 && f.wire == w::kLen) name = std::string(f.str());
    }
    std::string out;
    Reader r(b, base, file_end_, "an AttributeProto");
    Field f;
    while (r.next(f)) {
      if ((f.number == 6 || f.number == 11) && f.wire == w::kLen) {
        w::put_len(out, f.number, graph(f.bytes, f.offset, depth + 1));
      } else {
        if (f.number == 5 && f.wire == w::kLen && op == "Constant" && name == "value") {
          ++next_;  // a Constant's tensor: kept as it is
          ++report.tensors;
        }
        copy(out, f, b, base);
      }
    }
    return out;
  }

  std::string tensor(const Field& tf, std::span<const uint8_t> pb, uint64_t pbase) {
    const size_t index = next_++;
    ++report.tensors;
    const TensorInfo& info = c_.tensors().at(index);
    Tensor t;
    bool replaced = false;
    if (weights_) {
      if (auto wi = weights_->find(info.name)) {
        const TensorInfo& wt = weights_->tensors()[*wi];
        if (wt.dtype != info.dtype || wt.shape != info.shape)
          throw Error(ErrorCode::kInvalidArgument,
                      "the new weight is " + std::string(dtype_name(wt.dtype)) + " " +
                          shape_text(wt.shape) + ", the model's initializer " +
                          std::string(dtype_name(info.dtype)) + " " + shape_text(info.shape),
                      weights_->source().name(), info.name);
        t = weights_->tensor(*wi);
        replaced = true;
        ++report.replaced;
        used_.insert(info.name);
      }
    }
    if (!replaced) t = c_.tensor(index);
    std::vector<std::byte> contiguous;
    std::span<const std::byte> bytes;
    if (t.info().is_contiguous()) {
      bytes = {t.data(), static_cast<size_t>(t.info().nbytes())};
    } else {
      contiguous = t.contiguous_bytes();
      bytes = contiguous;
    }
    const uint64_t n = bytes.size();
    const bool external = data_ && !o_.inline_all && n >= o_.size_threshold && n > 0;
    std::string out;
    Reader r(tf.bytes, tf.offset, file_end_, "a TensorProto");
    Field f;
    while (r.next(f)) {
      switch (f.number) {
        case 4:
        case 5:
        case 7:
        case 9:
        case 10:
        case 11:
        case 13:
        case 14:
          break;  // the data: written below
        default:
          copy(out, f, pb, pbase);
      }
    }
    auto packs = packs_.find(info.name);
    const size_t npacks = packs == packs_.end() ? 0 : packs->second.size();
    if (!external) {
      w::put_len(out, 9, std::string_view(reinterpret_cast<const char*>(bytes.data()), n));
      ++report.inlined;
      report.prepacked_dropped += npacks;  // onnxruntime reads pre-packs of external ones only
      return out;
    }
    uint64_t at = data_->position();
    if (n >= o_.align_threshold) at = pad_to(align_up(at, o_.align));
    data_->write(bytes);
    ++report.external;
    auto entry = [&](std::string_view k, std::string_view v) {
      std::string e;
      w::put_len(e, 1, k);
      w::put_len(e, 2, v);
      w::put_len(out, 13, e);
    };
    entry("location", location_);
    entry("offset", std::to_string(at));
    entry("length", std::to_string(n));
    if (npacks) {
      if (o_.drop_prepacked || replaced) {
        report.prepacked_dropped += npacks;
      } else {
        for (size_t k : packs->second) {
          const OnnxPrepacked& p = ext_.prepacked[k];
          std::string v = p.key;
          for (const OnnxPrepackedBuffer& b : p.buffers) {
            uint64_t pos = pad_to(align_up(data_->position(), std::max<uint64_t>(o_.align, 1)));
            copy_blob(p, b);
            v += "|" + std::to_string(pos) + ";" + std::to_string(b.length) + ";0";
          }
          entry(p.entry, v);
          ++report.prepacked_carried;
        }
      }
    }
    out += '\x70';  // data_location (field 14, varint) = EXTERNAL
    out += '\x01';
    return out;
  }

  uint64_t pad_to(uint64_t pos) {
    static const std::byte zeros[4096] = {};
    while (data_->position() < pos) {
      uint64_t k = std::min<uint64_t>(sizeof zeros, pos - data_->position());
      data_->write(std::span(zeros, static_cast<size_t>(k)));
    }
    return pos;
  }

  void copy_blob(const OnnxPrepacked& p, const OnnxPrepackedBuffer& b) {
    std::string dir = internal::onnx_model_dir(c_.source().name());
    if (dir.empty()) dir = ".";
    std::string path = internal::onnx_external_path(dir, p.location, p.tensor);
    std::error_code ec;
    auto rel = std::filesystem::weakly_canonical(path, ec).lexically_relative(
        std::filesystem::weakly_canonical(dir, ec));
    if (!ec && (rel.empty() || *rel.begin() == ".."))
      throw Error(ErrorCode::kCorrupt, "pre-packed data resolves outside the model's folder", path,
                  p.tensor);
    auto& src = blob_files_[path];
    if (!src) src = open_file_source(path);
    if (b.offset > src->size() || b.length > src->size() - b.offset)
      throw Error(ErrorCode::kTruncated,
                  "pre-packed buffer " + p.key + " (" + std::to_string(b.length) + " bytes at " +
                      std::to_string(b.offset) + ") passes the end of " + p.location,
                  src->name(), p.tensor, b.offset);
    std::vector<std::byte> buf(std::min<uint64_t>(b.length, 8u << 20));
    for (uint64_t done = 0; done < b.length;) {
      size_t k = static_cast<size_t>(std::min<uint64_t>(buf.size(), b.length - done));
      src->read_into(b.offset + done, std::span(buf.data(), k));
      data_->write(std::span<const std::byte>(buf.data(), k));
      done += k;
    }
  }

  static std::string shape_text(const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  }

 public:
  std::unordered_set<std::string> used_;

 private:
  const Checkpoint& c_;
  const OnnxRewriteOptions& o_;
  const internal::OnnxExtension& ext_;
  std::string location_;
  ByteSink* data_;
  const Checkpoint* weights_;
  std::unordered_map<std::string, std::vector<size_t>> packs_;
  std::unordered_map<std::string, SourcePtr> blob_files_;
  uint64_t file_end_ = 0;
  size_t next_ = 0;
};

}  // namespace

OnnxRewriteReport onnx_rewrite(const std::string& in, const std::string& out,
                               const OnnxRewriteOptions& o) {
  if (o.align == 0 || (o.align & (o.align - 1)))
    throw Error(ErrorCode::kInvalidArgument,
                "--align " + std::to_string(o.align) + " is not a power of two");
  OpenOptions oo;
  oo.mmap = false;  // the output may replace the input's files
  Checkpoint c = Checkpoint::open(in, oo);
  if (!format_traits(c.format()).graph)
    throw Error(ErrorCode::kInvalidArgument,
                std::string("not an ONNX model (a ") + format_name(c.format()) + " file)", in);
  const auto* ext = dynamic_cast<const internal::OnnxExtension*>(
      internal::CheckpointAccess::model(c).extension.get());
  if (!ext) throw Error(ErrorCode::kCorrupt, "no ONNX state", in);
  // The output carries no checksum of the input's (external-data SHA-1s are dropped, pre-packs
  // get new ones): a model that fails verification would come out verifying clean. Refused.
  try {
    c.verify();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCorrupt) throw;
    throw Error(ErrorCode::kCorrupt,
                "refusing to rewrite a model that fails verification (the output would carry no "
                "checksum to show it): " +
                    e.message(),
                e.source(), e.record(), e.offset());
  }
  std::optional<Checkpoint> weights;
  if (!o.weights.empty()) weights = Checkpoint::open(o.weights);

  // The external-data file's location, relative to OUT's folder.
  std::string data_path, location;
  std::unique_ptr<ByteSink> data;
  if (!o.inline_all) {
    data_path = o.external_data.empty() ? out + ".data" : o.external_data;
    auto out_dir = std::filesystem::absolute(std::filesystem::path(out)).parent_path();
    auto dp = std::filesystem::absolute(std::filesystem::path(data_path));
    auto rel = dp.lexically_normal().lexically_relative(out_dir.lexically_normal());
    if (rel.empty() || *rel.begin() == ".." || rel.is_absolute())
      throw Error(ErrorCode::kInvalidArgument, "the external-data file " + data_path +
                                                   " must be inside the output model's folder (" +
                                                   out_dir.string() + ")");
    location = rel.generic_string();
    if (std::filesystem::absolute(out).lexically_normal() == dp.lexically_normal())
      throw Error(ErrorCode::kInvalidArgument, "the external-data file is the model file itself");
    data = create_file_sink(data_path);
  }
  Bytes all = c.source().read(0, c.source().size());
  Rewriter rw(c, o, *ext, location, data.get(), weights ? &*weights : nullptr);
  std::string model = rw.model(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(all.begin()), all.size()), 0);
  if (weights) {
    for (const TensorInfo& t : weights->tensors())
      if (!rw.used_.count(t.name))
        throw Error(ErrorCode::kInvalidArgument,
                    "the new weights hold a tensor the model has no initializer for",
                    weights->source().name(), t.name);
  }
  if (model.size() > (uint64_t{1} << 31) - 1)
    throw Error(ErrorCode::kLimitExceeded,
                "the rewritten .onnx would be " + std::to_string(model.size()) +
                    " bytes, over protobuf's 2 GiB: move initializers to external data",
                out);
  OnnxRewriteReport r = rw.report;
  auto sink = create_file_sink(out);
  sink->write(std::span(reinterpret_cast<const std::byte*>(model.data()), model.size()));
  r.model_bytes = model.size();
  if (data) {
    r.data_bytes = data->position();
    r.data_path = data_path;
    if (r.external == 0) {
      data.reset();  // nothing went external: no data file (the sink removes its temporary)
      r.data_path.clear();
    } else {
      data->commit();
    }
  }
  sink->commit();
  return r;
}

}  // namespace ckpt
