// ckpt ls FILE [--json]: one row per tensor.

#include <cstdio>

#include "common.h"

namespace ckpt::cli {

namespace {

struct LsOptions {
  std::vector<std::string> files;  // one checkpoint, an index, or shards
  std::string file;
  bool json = false;
  bool prepacked = false;
  Common common;
};

// --prepacked: onnxruntime's pre-packed blobs of an ONNX model.
void list_prepacked(const LsOptions& o, const Checkpoint& c) {
  if (!format_traits(c.format()).graph)
    throw Error(ErrorCode::kUnsupported,
                std::string("--prepacked lists ONNX models' pre-packed blobs; this is a ") +
                    format_name(c.format()) + " file",
                o.file);
  auto packs = onnx_prepacked(c);
  if (o.json) {
    nlohmann::ordered_json j;
    j["format"] = format_name(c.format());
    j["prepacked"] = nlohmann::ordered_json::array();
    for (const auto& p : packs) {
      nlohmann::ordered_json r;
      r["tensor"] = p.tensor;
      r["entry"] = p.entry;
      r["key"] = p.key;
      r["location"] = p.location;
      r["buffers"] = nlohmann::ordered_json::array();
      for (const auto& b : p.buffers)
        r["buffers"].push_back(
            {{"offset", b.offset}, {"length", b.length}, {"checksum", b.checksum}});
      j["prepacked"].push_back(std::move(r));
    }
    std::printf("%s\n", j.dump(1).c_str());
    return;
  }
  size_t wt = 6, wk = 3;
  for (const auto& p : packs) {
    wt = std::max(wt, p.tensor.size());
    wk = std::max(wk, p.key.size());
  }
  std::printf("%-*s  %-*s  %12s  %12s  %s\n", int(wt), "tensor", int(wk), "key", "offset", "length",
              "location");
  uint64_t total = 0;
  size_t nbuf = 0;
  for (const auto& p : packs)
    for (const auto& b : p.buffers) {
      std::printf("%-*s  %-*s  %12llu  %12llu  %s\n", int(wt), p.tensor.c_str(), int(wk),
                  p.key.c_str(), static_cast<unsigned long long>(b.offset),
                  static_cast<unsigned long long>(b.length), p.location.c_str());
      total += b.length;
      ++nbuf;
    }
  std::printf("%zu pre-packed blob%s in %zu buffer%s, %llu bytes (%s)\n", packs.size(),
              packs.size() == 1 ? "" : "s", nbuf, nbuf == 1 ? "" : "s",
              static_cast<unsigned long long>(total), human_bytes(total).c_str());
}

// --json: one object per listed tensor.
void list_json(const Checkpoint& c, const std::vector<OnnxTensorPlace>& places) {
  nlohmann::ordered_json j;
  j["format"] = format_name(c.format());
  j["tensors"] = nlohmann::ordered_json::array();
  for (const TensorInfo& t : c.tensors()) {
    if (!listed(t)) continue;
    nlohmann::ordered_json r;
    r["name"] = t.name;
    r["dtype"] = dtype_name(t.dtype);
    r["shape"] = t.shape;
    r["strides"] = t.strides;
    r["storage_offset"] = t.storage_offset;
    r["nbytes"] = t.nbytes();
    auto off = file_offset(c, t);
    r["offset"] = off ? nlohmann::ordered_json(*off) : nlohmann::ordered_json(nullptr);
    r["storage"] = c.storages()[t.storage].key;
    if (!c.shards().empty())  // a sharded set: the file the tensor (and offset) is in
      r["shard"] = c.files()[c.files_of(static_cast<size_t>(&t - c.tensors().data()))[0]];
    if (t.requires_grad) r["requires_grad"] = true;
    if (!t.type.empty()) r["type"] = t.type;
    if (c.storages()[t.storage].meta) r["meta"] = true;
    if (size_t ti = static_cast<size_t>(&t - c.tensors().data()); ti < places.size()) {
      const OnnxTensorPlace& p = places[ti];
      r["data"] = p.how;  // raw_data, external, float_data, int32_data, ...
      if (p.how == "external")
        r["external"] = {{"location", p.location}, {"offset", p.offset}, {"length", p.length}};
    }
    if (t.quantization) {
      // Per-channel scales and zero points are tensors of their own, listed here only as
      // part of their tensor (`ckpt extract` writes their values into index.json).
      r["qscheme"] = t.quantization->scheme;
      if (t.quantization->scales_tensor) {
        r["axis"] = t.quantization->axis;
      } else {
        r["scale"] = t.quantization->scale;
        r["zero_point"] = t.quantization->zero_point;
      }
    }
    j["tensors"].push_back(std::move(r));
  }
  std::printf("%s\n", j.dump(1).c_str());
}

// The table's cells in one buffer, six per row, rather than six strings per row (a DCP folder
// of 400,000 tensors made 2.4 million of them).
class Cells {
 public:
  void add(std::string_view s) {
    text_.append(s);
    ends_.push_back(text_.size());
  }
  std::string_view at(size_t row, size_t col) const {
    const size_t i = row * 6 + col, b = i ? ends_[i - 1] : 0;
    return {text_.data() + b, ends_[i] - b};
  }
  size_t rows() const { return ends_.size() / 6; }

 private:
  std::string text_;
  std::vector<size_t> ends_;
};

// `s` padded with spaces to `w` bytes, after it (`left`) or before it, as printf's %-*s and %*s.
void pad(std::string& out, std::string_view s, size_t w, bool left) {
  if (!left && s.size() < w) out.append(w - s.size(), ' ');
  out.append(s);
  if (left && s.size() < w) out.append(w - s.size(), ' ');
}

// The rows, written a megabyte at a time.
void print_rows(const Cells& cells, size_t wname, size_t wdtype, size_t wshape, bool sharded) {
  std::string out;
  for (size_t r = 0; r < cells.rows(); ++r) {
    pad(out, cells.at(r, 0), wname, true);
    out += "  ";
    pad(out, cells.at(r, 1), wdtype, true);
    out += "  ";
    pad(out, cells.at(r, 2), wshape, true);
    out += "  ";
    pad(out, cells.at(r, 3), 12, false);
    out += "  ";
    pad(out, cells.at(r, 4), 12, false);
    if (sharded) out += "  ";
    out += cells.at(r, 5);
    out += '\n';
    if (out.size() >= (1u << 20) || r + 1 == cells.rows()) {
      std::fwrite(out.data(), 1, out.size(), stdout);
      out.clear();
    }
  }
}

// The table, with totals as `unzip -l` ends.
void list_table(const Checkpoint& c, const std::vector<OnnxTensorPlace>& places) {
  // A sharded set gets a last column: the shard file (its name in the index's folder) that
  // holds the tensor, whose offset the offset column gives.
  const bool sharded = !c.shards().empty();
  auto base_name = [](const std::string& p) {
    auto slash = p.rfind('/');
    return slash == std::string::npos ? p : p.substr(slash + 1);
  };
  size_t wname = 4, wdtype = 5, wshape = 5, numpy_rows = 0;
  Cells rows;
  for (const TensorInfo& t : c.tensors()) {
    if (!listed(t)) continue;
    std::string shape = shape_str(t.shape);
    if (!t.is_contiguous()) shape += " strides " + shape_str(t.strides);
    auto off = file_offset(c, t);
    std::string shard;
    if (sharded)
      shard = base_name(c.files()[c.files_of(static_cast<size_t>(&t - c.tensors().data()))[0]]);
    // A numpy array's bytes are in the pickle (no offset of their own): marked "numpy".
    std::string where =
        off ? std::to_string(*off)
            : (c.storages()[t.storage].meta ? "meta" : (t.type == "numpy" ? "numpy" : "-"));
    if (t.type == "numpy") ++numpy_rows;
    // ONNX: external data shows as location:offset, typed fields by their field's name.
    if (size_t ti = static_cast<size_t>(&t - c.tensors().data()); ti < places.size()) {
      const OnnxTensorPlace& p = places[ti];
      if (p.how == "external")
        where = p.location + ":" + std::to_string(p.offset);
      else if (p.how != "raw_data" && p.how != "empty")
        where = p.how;
    }
    const std::string name = printable(t.name);
    const std::string_view dtype = dtype_name(t.dtype);
    rows.add(name);
    rows.add(dtype);
    rows.add(shape);
    rows.add(std::to_string(t.nbytes()));
    rows.add(printable(where));
    rows.add(printable(shard));
    wname = std::max(wname, name.size());
    wdtype = std::max(wdtype, dtype.size());
    wshape = std::max(wshape, shape.size());
  }
  std::printf("%-*s  %-*s  %-*s  %12s  %12s%s\n", int(wname), "name", int(wdtype), "dtype",
              int(wshape), "shape", "bytes", "offset", sharded ? "  shard" : "");
  print_rows(rows, wname, wdtype, wshape, sharded);
  // Totals, as `unzip -l` ends: the tensors listed and their bytes (a view counts its own
  // elements; storages shared by several tensors are counted once in the storage figure).
  uint64_t total = 0, stored = 0;
  for (const TensorInfo& t : c.tensors())
    if (listed(t)) total += t.nbytes();
  for (const auto& st : c.storages()) stored += st.nbytes;
  size_t wshard = 0;
  for (size_t r = 0; r < rows.rows(); ++r) wshard = std::max(wshard, rows.at(r, 5).size());
  const size_t width =
      wname + wdtype + wshape + 2 * 4 + 12 + 12 + (sharded ? 2 + std::max<size_t>(wshard, 5) : 0);
  std::printf("%s\n", std::string(width, '-').c_str());
  std::printf("%zu tensor%s, %llu bytes (%s); %zu storage%s, %llu bytes (%s)\n", rows.rows(),
              rows.rows() == 1 ? "" : "s", static_cast<unsigned long long>(total),
              human_bytes(total).c_str(), c.storages().size(), c.storages().size() == 1 ? "" : "s",
              static_cast<unsigned long long>(stored), human_bytes(stored).c_str());
  if (numpy_rows)
    std::printf(
        "%zu numpy array%s (offset \"numpy\"): pickled by numpy, bytes inside the "
        "pickle; Python's ckpt.load returns them as numpy.ndarray\n",
        numpy_rows, numpy_rows == 1 ? "" : "s");
}

void run_ls(LsOptions& o) {
  o.file = files_name(o.files);
  Checkpoint c = open_checkpoint(o.files, o.common);
  if (o.prepacked) {
    list_prepacked(o, c);
  } else {
    std::vector<OnnxTensorPlace> places = onnx_places(c);
    if (o.json)
      list_json(c, places);
    else
      list_table(c, places);
  }
  keep_until_exit(std::move(c));
}

}  // namespace

void add_ls(CLI::App& app) {
  auto o = std::make_shared<LsOptions>();
  auto* cmd = app.add_subcommand("ls", "list tensors: name, dtype, shape, bytes, file offset");
  cmd->add_option("FILE", o->files, "checkpoint, shard index, or shard files")->required();
  cmd->add_flag("--json", o->json, "machine-readable output");
  cmd->add_flag("--prepacked", o->prepacked,
                "ONNX: list onnxruntime's pre-packed blobs (initializer, key, offset, length)");
  add_common(*cmd, o->common);
  cmd->callback([o] { run_ls(*o); });
}

}  // namespace ckpt::cli
