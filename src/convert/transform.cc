// Transforms between a conversion's content and its writer (transform.h): the plan (what each
// output tensor is made of) and the feed that makes its bytes when the writer asks.

#include "convert/transform.h"

#include <fnmatch.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <regex>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "ckpt/error.h"
#include "convert/numerics.h"

namespace ckpt::internal {

namespace {

enum class Source { kPass, kFp8, kMxfp4, kFuse };

// One output tensor: its description and how its bytes are made from the inputs.
struct Item {
  TensorInfo info;  // name, dtype, shape of the output so far (a kPass item: the input's view)
  Source src = Source::kPass;
  std::vector<size_t> inputs;  // the content's tensors (kFp8: scale, weight; kMxfp4: scales,
                               // blocks; kFuse: the parts in order)
  int64_t fuse_dim = 0;
  // After the source, in this order.
  int64_t narrow_dim = -1, narrow_off = 0, narrow_size = 0;
  bool transpose = false;
  std::optional<DType> cast;

  bool computed() const {
    return src != Source::kPass || narrow_dim >= 0 || transpose || cast.has_value();
  }
};

[[noreturn]] void refuse(const std::string& in, const std::string& name, const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, why, in, name);
}

bool glob(const std::string& pattern, const std::string& name) {
  return ::fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// The plan, built step by step over the items (transform.h's order).
class Planner {
 public:
  Planner(const TransformRecipe& recipe, const std::vector<Tensor>& tensors, std::string in,
          TransformReport& report)
      : recipe_(recipe), in_(std::move(in)), report_(report) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      Item it;
      it.info = tensors[i].info();
      it.inputs = {i};
      items_.push_back(std::move(it));
    }
  }

  std::vector<Item> run() {
    dequantize();
    rename();
    keep_drop();
    for (const SplitRule& s : recipe_.split) split(s);
    for (const FuseRule& f : recipe_.fuse) fuse(f);
    transpose();
    cast();
    std::unordered_set<std::string> names;
    for (const Item& it : items_)
      if (!names.insert(it.info.name).second)
        refuse(in_, it.info.name,
               "two tensors would be written under this name (check the "
               "rename, split and fuse rules)");
    return std::move(items_);
  }

 private:
  void count(const std::string& rule, size_t matched) {
    report_.rules.push_back({rule, matched});
    if (!matched) report_.unmatched.push_back(rule);
  }
  std::optional<size_t> find(const std::string& name) const {
    for (size_t i = 0; i < items_.size(); ++i)
      if (items_[i].info.name == name) return i;
    return std::nullopt;
  }
  bool wants(const char* scheme) const {
    return std::find(recipe_.dequantize.begin(), recipe_.dequantize.end(), scheme) !=
           recipe_.dequantize.end();
  }
  void erase(const std::unordered_set<size_t>& gone) {
    std::vector<Item> kept;
    for (size_t i = 0; i < items_.size(); ++i)
      if (!gone.count(i)) kept.push_back(std::move(items_[i]));
    items_ = std::move(kept);
  }

  void dequantize() {
    for (const auto& s : recipe_.dequantize)
      if (s != "fp8-block" && s != "mxfp4")
        throw Error(ErrorCode::kInvalidArgument,
                    "unknown dequantize scheme '" + s + "' (fp8-block, mxfp4)");
    std::unordered_set<size_t> gone;
    if (wants("fp8-block")) gone.merge(fp8_block());
    if (wants("mxfp4")) gone.merge(mxfp4());
    erase(gone);
  }

  std::unordered_set<size_t> fp8_block() {
    std::unordered_set<size_t> gone;
    size_t n = 0;
    for (size_t i = 0; i < items_.size(); ++i) {
      Item& w = items_[i];
      const std::string& name = w.info.name;
      if (name.size() > 10 && name.compare(name.size() - 10, 10, "_scale_inv") == 0) {
        auto base = find(name.substr(0, name.size() - 10));
        if (!base || (items_[*base].info.dtype != DType::kFloat8_e4m3fn &&
                      items_[*base].src != Source::kFp8))
          refuse(in_, name,
                 "a block scale without a float8_e4m3fn tensor '" +
                     name.substr(0, name.size() - 10) + "' to dequantize");
        continue;
      }
      if (w.info.dtype != DType::kFloat8_e4m3fn) continue;
      auto s = find(name + "_scale_inv");
      if (!s) refuse(in_, name, "float8_e4m3fn without its block scale '" + name + "_scale_inv'");
      const TensorInfo& si = items_[*s].info;
      if (w.info.shape.size() != 2)
        refuse(in_, name, "block-scaled FP8 is 2-D; this is " + shape_text(w.info.shape));
      const std::vector<int64_t> want = {(w.info.shape[0] + 127) / 128,
                                         (w.info.shape[1] + 127) / 128};
      if (si.dtype != DType::kFloat32 || si.shape != want)
        refuse(in_, si.name,
               "the block scale of '" + name + "' must be float32 " + shape_text(want) +
                   " (128x128 blocks), not " + std::string(dtype_name(si.dtype)) + " " +
                   shape_text(si.shape));
      w.src = Source::kFp8;
      w.inputs = {items_[*s].inputs[0], w.inputs[0]};
      w.info.dtype = DType::kBFloat16;
      gone.insert(*s);
      ++n;
    }
    count("dequantize fp8-block", n);
    return gone;
  }

  std::unordered_set<size_t> mxfp4() {
    std::unordered_set<size_t> gone;
    size_t n = 0;
    for (size_t i = 0; i < items_.size(); ++i) {
      Item& b = items_[i];
      const std::string& name = b.info.name;
      if (name.size() <= 7 || name.compare(name.size() - 7, 7, "_blocks") != 0) continue;
      const std::string base = name.substr(0, name.size() - 7);
      auto s = find(base + "_scales");
      if (!s) {
        if (b.info.dtype == DType::kUInt8)
          refuse(in_, name, "MXFP4 blocks without their scales '" + base + "_scales'");
        continue;
      }
      const TensorInfo& si = items_[*s].info;
      const auto& shape = b.info.shape;
      if (b.info.dtype != DType::kUInt8 || si.dtype != DType::kUInt8 || shape.size() < 2 ||
          std::vector<int64_t>(shape.begin(), shape.end() - 1) != si.shape)
        refuse(in_, name,
               "MXFP4 blocks (uint8 [..., G, B]) and scales (uint8 [..., G]) do not match: " +
                   std::string(dtype_name(b.info.dtype)) + " " + shape_text(shape) + " and " +
                   std::string(dtype_name(si.dtype)) + " " + shape_text(si.shape));
      std::vector<int64_t> out(shape.begin(), shape.end() - 2);
      out.push_back(shape[shape.size() - 2] * shape.back() * 2);
      if (out.size() >= 3) std::swap(out[1], out[2]);  // transformers' transpose(1, 2)
      b.src = Source::kMxfp4;
      b.inputs = {items_[*s].inputs[0], b.inputs[0]};
      b.info.name = base;
      b.info.dtype = DType::kBFloat16;
      b.info.shape = out;
      gone.insert(*s);
      ++n;
    }
    count("dequantize mxfp4", n);
    return gone;
  }

  void rename() {
    for (const RenameRule& r : recipe_.rename) {
      size_t n = 0;
      std::string rule;
      std::optional<std::regex> re;
      if (r.kind == RenameRule::kStripPrefix) {
        rule = "strip-prefix " + r.pattern;
      } else if (r.kind == RenameRule::kAddPrefix) {
        rule = "add-prefix " + r.pattern;
      } else {
        rule = "rename " + r.pattern + " -> " + r.replacement;
        try {
          re.emplace(r.pattern, std::regex::ECMAScript);
        } catch (const std::regex_error& e) {
          throw Error(ErrorCode::kInvalidArgument,
                      "rename: not a regular expression: " + r.pattern + " (" + e.what() + ")");
        }
      }
      for (Item& it : items_) {
        std::string& name = it.info.name;
        if (r.kind == RenameRule::kStripPrefix) {
          if (name.rfind(r.pattern, 0) != 0) continue;
          name.erase(0, r.pattern.size());
        } else if (r.kind == RenameRule::kAddPrefix) {
          name = r.pattern + name;
        } else {
          if (!std::regex_search(name, *re)) continue;
          name = std::regex_replace(name, *re, r.replacement);
        }
        ++n;
      }
      count(rule, n);
    }
  }

  void keep_drop() {
    if (recipe_.keep.empty() && recipe_.drop.empty()) return;
    std::vector<size_t> kept_by(recipe_.keep.size()), dropped_by(recipe_.drop.size());
    std::unordered_set<size_t> gone;
    for (size_t i = 0; i < items_.size(); ++i) {
      const std::string& name = items_[i].info.name;
      bool keep = recipe_.keep.empty();
      for (size_t k = 0; k < recipe_.keep.size(); ++k)
        if (glob(recipe_.keep[k], name)) {
          keep = true;
          ++kept_by[k];
        }
      for (size_t k = 0; k < recipe_.drop.size(); ++k)
        if (glob(recipe_.drop[k], name)) {
          keep = false;
          ++dropped_by[k];
        }
      if (!keep) gone.insert(i);
    }
    for (size_t k = 0; k < recipe_.keep.size(); ++k) count("keep " + recipe_.keep[k], kept_by[k]);
    for (size_t k = 0; k < recipe_.drop.size(); ++k)
      count("drop " + recipe_.drop[k], dropped_by[k]);
    erase(gone);
  }

  void split(const SplitRule& s) {
    std::string rule = "split " + s.name + " along " + std::to_string(s.dim) + " into ";
    for (size_t i = 0; i < s.parts.size(); ++i) rule += (i ? "," : "") + s.parts[i];
    auto at = find(s.name);
    if (!at) return count(rule, 0);
    const Item src = items_[*at];
    const auto& shape = src.info.shape;
    const int64_t nd = static_cast<int64_t>(shape.size());
    const int64_t dim = s.dim < 0 ? s.dim + nd : s.dim;
    if (dim < 0 || dim >= nd)
      refuse(in_, s.name, "split: no dim " + std::to_string(s.dim) + " in " + shape_text(shape));
    if (src.computed()) refuse(in_, s.name, "split: the tensor is itself made by a transform");
    std::vector<int64_t> sizes = s.sizes;
    if (s.parts.empty()) refuse(in_, s.name, "split: no parts named");
    if (sizes.empty()) {
      if (shape[dim] % static_cast<int64_t>(s.parts.size()))
        refuse(in_, s.name,
               "split: dim " + std::to_string(dim) + " of " + shape_text(shape) +
                   " does not divide into " + std::to_string(s.parts.size()) + " equal parts");
      sizes.assign(s.parts.size(), shape[dim] / static_cast<int64_t>(s.parts.size()));
    }
    int64_t total = 0;
    for (int64_t z : sizes) total += z;
    if (sizes.size() != s.parts.size() || total != shape[dim])
      refuse(in_, s.name,
             "split: sizes " + shape_text(sizes) + " do not make dim " + std::to_string(dim) +
                 " of " + shape_text(shape));
    std::vector<Item> parts;
    int64_t off = 0;
    for (size_t p = 0; p < sizes.size(); ++p) {
      Item it = src;
      it.info.name = s.parts[p];
      it.info.shape[dim] = sizes[p];
      it.narrow_dim = dim;
      it.narrow_off = off;
      it.narrow_size = sizes[p];
      off += sizes[p];
      parts.push_back(std::move(it));
    }
    items_.erase(items_.begin() + static_cast<ptrdiff_t>(*at));
    items_.insert(items_.begin() + static_cast<ptrdiff_t>(*at), parts.begin(), parts.end());
    count(rule, 1);
  }

  void fuse(const FuseRule& f) {
    std::string rule = "fuse ";
    for (size_t i = 0; i < f.parts.size(); ++i) rule += (i ? "," : "") + f.parts[i];
    rule += " along " + std::to_string(f.dim) + " into " + f.name;
    std::vector<size_t> at;
    for (const auto& p : f.parts)
      if (auto i = find(p)) at.push_back(*i);
    if (at.empty()) return count(rule, 0);
    if (at.size() != f.parts.size() || f.parts.size() < 2)
      refuse(in_, f.name,
             "fuse: " + std::to_string(f.parts.size() - at.size()) + " of its parts are missing (" +
                 rule + ")");
    const Item& first = items_[at[0]];
    const int64_t nd = static_cast<int64_t>(first.info.shape.size());
    const int64_t dim = f.dim < 0 ? f.dim + nd : f.dim;
    if (dim < 0 || dim >= nd)
      refuse(in_, f.parts[0],
             "fuse: no dim " + std::to_string(f.dim) + " in " + shape_text(first.info.shape));
    Item fused = first;
    fused.info.name = f.name;
    fused.src = Source::kFuse;
    fused.fuse_dim = dim;
    fused.inputs.clear();
    fused.info.shape[dim] = 0;
    for (size_t k = 0; k < at.size(); ++k) {
      const Item& p = items_[at[k]];
      auto a = p.info.shape, b = first.info.shape;
      if (a.size() == b.size()) a[dim] = b[dim] = 0;
      if (p.computed() || p.info.dtype != first.info.dtype || a != b)
        refuse(in_, p.info.name,
               "fuse: the parts must be untransformed tensors of one dtype whose shapes differ "
               "in dim " +
                   std::to_string(dim) + " only (" + std::string(dtype_name(p.info.dtype)) + " " +
                   shape_text(p.info.shape) + ")");
      fused.inputs.push_back(p.inputs[0]);
      fused.info.shape[dim] += p.info.shape[dim];
    }
    std::unordered_set<size_t> gone(at.begin() + 1, at.end());
    items_[at[0]] = std::move(fused);
    erase(gone);
    count(rule, 1);
  }

  void transpose() {
    for (const std::string& g : recipe_.transpose) {
      size_t n = 0;
      for (Item& it : items_) {
        if (!glob(g, it.info.name)) continue;
        if (it.info.shape.size() != 2)
          refuse(in_, it.info.name,
                 "transpose: the tensor is " + shape_text(it.info.shape) + ", not 2-D");
        it.transpose = !it.transpose;
        std::swap(it.info.shape[0], it.info.shape[1]);
        ++n;
      }
      count("transpose " + g, n);
    }
  }

  void cast() {
    if (!recipe_.cast) return;
    const DType to = *recipe_.cast;
    if (!castable_to(to))
      throw Error(ErrorCode::kInvalidArgument,
                  "cast: to float32, float16 or bfloat16, not " + std::string(dtype_name(to)));
    size_t n = 0;
    for (Item& it : items_) {
      if (it.info.quantization || !castable_from(it.info.dtype) || it.info.dtype == to) continue;
      it.cast = to;
      it.info.dtype = to;
      ++n;
    }
    count("cast " + std::string(dtype_name(to)), n);
  }

  const TransformRecipe& recipe_;
  const std::string in_;
  TransformReport& report_;
  std::vector<Item> items_;
};

// ---------------------------------------------------------------------------------------------
// Making the bytes

// Bytes of one dtype and shape, contiguous: a view of an input's or an owned buffer.
struct Block {
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const std::byte> bytes;
  std::shared_ptr<std::vector<std::byte>> owned;

  static Block own(DType d, std::vector<int64_t> shape, size_t nbytes) {
    Block b{d, std::move(shape), {}, std::make_shared<std::vector<std::byte>>(nbytes)};
    b.bytes = *b.owned;
    return b;
  }
  std::byte* data() { return owned->data(); }
};

Block view_of(const Tensor& t) {
  Block b{t.dtype(), t.shape(), {}, nullptr};
  if (t.info().is_contiguous()) {
    b.bytes = std::span<const std::byte>(t.data(), t.info().nbytes());
  } else {
    b.owned = std::make_shared<std::vector<std::byte>>(t.contiguous_bytes());
    b.bytes = *b.owned;
  }
  return b;
}

// Copies the slabs of `in` along `dim` ([off, off + size)) to `out` at `out_off` along the same
// dim of `out_shape`: narrow and concatenate both.
void copy_slab(const Block& in, int64_t dim, int64_t off, int64_t size, std::byte* out,
               const std::vector<int64_t>& out_shape, int64_t out_off) {
  const size_t es = dtype_size(in.dtype);
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= in.shape[d];
  for (size_t d = dim + 1; d < in.shape.size(); ++d) inner *= in.shape[d];
  const size_t row = static_cast<size_t>(inner) * es;
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(out + (o * out_shape[dim] + out_off) * row,
                in.bytes.data() + (o * in.shape[dim] + off) * row, size * row);
}

Block after_source(const Item& it, Block b) {
  if (it.narrow_dim >= 0) {
    std::vector<int64_t> shape = b.shape;
    shape[it.narrow_dim] = it.narrow_size;
    Block n = Block::own(b.dtype, shape, numel(shape) * dtype_size(b.dtype));
    copy_slab(b, it.narrow_dim, it.narrow_off, it.narrow_size, n.data(), shape, 0);
    b = std::move(n);
  }
  if (it.transpose) {
    const int64_t r = b.shape[0], c = b.shape[1];
    const size_t es = dtype_size(b.dtype);
    Block t = Block::own(b.dtype, {c, r}, b.bytes.size());
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j)
        std::memcpy(t.data() + (j * r + i) * es, b.bytes.data() + (i * c + j) * es, es);
    b = std::move(t);
  }
  if (it.cast && *it.cast != b.dtype) {
    const uint64_t n = numel(b.shape);
    Block c = Block::own(*it.cast, b.shape, n * dtype_size(*it.cast));
    cast_elements(b.dtype, b.bytes.data(), *it.cast, c.data(), n);
    b = std::move(c);
  }
  return b;
}

// The output tensors' bytes from the input tensors' (the inner feed's, or in memory).
class TransformFeed final : public TensorFeed {
 public:
  TransformFeed(std::vector<Tensor> inputs, std::vector<Item> items,
                std::shared_ptr<const TensorFeed> inner)
      : inputs_(std::move(inputs)), items_(std::move(items)), inner_(std::move(inner)) {
    for (size_t i = 0; i < items_.size(); ++i) by_name_.emplace(items_[i].info.name, i);
  }

  void each(std::span<const Tensor* const> outs,
            const std::function<void(size_t, const Tensor&)>& fn) const override {
    std::vector<const Tensor*> ins;
    std::vector<std::pair<size_t, size_t>> at;  // (k, slot)
    for (size_t k = 0; k < outs.size(); ++k) {
      const Item& it = items_[by_name_.at(outs[k]->name())];
      for (size_t s = 0; s < it.inputs.size(); ++s) {
        ins.push_back(&inputs_[it.inputs[s]]);
        at.emplace_back(k, s);
      }
    }
    std::optional<Block> held;  // kFp8/kMxfp4: the scales; kFuse: the output so far
    int64_t fused_at = 0;
    feed_each(inner_.get(), ins, [&](size_t j, const Tensor& t) {
      const auto [k, s] = at[j];
      const Item& it = items_[by_name_.at(outs[k]->name())];
      if (!it.computed()) {
        Tensor o = t;
        o.info().name = it.info.name;
        return fn(k, o);
      }
      const bool last = s + 1 == it.inputs.size();
      if (it.src == Source::kFuse) {
        if (s == 0) {
          std::vector<int64_t> shape = t.shape();
          shape[it.fuse_dim] = 0;
          for (size_t p : it.inputs) shape[it.fuse_dim] += inputs_[p].shape()[it.fuse_dim];
          held = Block::own(t.dtype(), shape, numel(shape) * dtype_size(t.dtype()));
          fused_at = 0;
        }
        const Block part = view_of(t);
        copy_slab(part, it.fuse_dim, 0, part.shape[it.fuse_dim], held->data(), held->shape,
                  fused_at);
        fused_at += part.shape[it.fuse_dim];
        if (last) emit(k, it, std::move(*held), fn);
        return;
      }
      if (!last) {  // a scale: kept until its tensor comes
        Block b = view_of(t);
        if (!b.owned) {
          b.owned = std::make_shared<std::vector<std::byte>>(b.bytes.begin(), b.bytes.end());
          b.bytes = *b.owned;
        }
        held = std::move(b);
        return;
      }
      if (it.src == Source::kPass) return emit(k, it, view_of(t), fn);
      const Block in = view_of(t);
      const auto& shape = in.shape;
      if (it.src == Source::kFp8) {
        Block out = Block::own(DType::kBFloat16, shape, numel(shape) * 2);
        dequant_fp8_block(in.bytes.data(), held->bytes.data(), shape[0], shape[1], out.data());
        return emit(k, it, std::move(out), fn);
      }
      // kMxfp4
      std::vector<int64_t> plain(shape.begin(), shape.end() - 2);
      plain.push_back(shape[shape.size() - 2] * shape.back() * 2);
      Block out = Block::own(DType::kBFloat16, plain, numel(plain) * 2);
      const int64_t rows = numel(shape) / shape.back();
      int64_t swap[3] = {0, 0, 0};
      if (plain.size() >= 3) {
        swap[1] = plain[1];
        swap[2] = shape[shape.size() - 2];
        std::swap(out.shape[1], out.shape[2]);
      }
      dequant_mxfp4(in.bytes.data(), held->bytes.data(), rows, shape.back(), out.data(),
                    plain.size() >= 3 ? swap : nullptr);
      emit(k, it, std::move(out), fn);
    });
  }

 private:
  static void emit(size_t k, const Item& it, Block b,
                   const std::function<void(size_t, const Tensor&)>& fn) {
    b = after_source(it, std::move(b));
    auto st = std::make_shared<Storage>();
    st->info.key = it.info.name;
    st->info.dtype = b.dtype;
    st->info.nbytes = b.bytes.size();
    st->data = b.bytes.data();
    st->owner = b.owned;
    st->writable = b.owned != nullptr;
    fn(k, Tensor(it.info, std::move(st)));
  }

  const std::vector<Tensor> inputs_;
  const std::vector<Item> items_;
  std::shared_ptr<const TensorFeed> inner_;
  std::unordered_map<std::string, size_t> by_name_;
};

// mxfp4 swaps dims 1 and 2 of a 3-D (or deeper) result only in the three-dimensional sense of
// transformers: the rows of [e, n, g] per expert. Deeper prefixes are refused in the plan.
void check_mxfp4_rank(const std::vector<Item>& items, const std::string& in) {
  for (const Item& it : items)
    if (it.src == Source::kMxfp4 && it.info.shape.size() > 3)
      refuse(in, it.info.name, "MXFP4 blocks of more than 4 dims are not dequantized");
}

}  // namespace

std::string renamed(const TransformRecipe& recipe, std::string name) {
  for (const RenameRule& r : recipe.rename) {
    if (r.kind == RenameRule::kStripPrefix) {
      if (name.rfind(r.pattern, 0) == 0) name.erase(0, r.pattern.size());
    } else if (r.kind == RenameRule::kAddPrefix) {
      name = r.pattern + name;
    } else {
      name = std::regex_replace(name, std::regex(r.pattern, std::regex::ECMAScript), r.replacement);
    }
  }
  return name;
}

void apply_transforms(const TransformRecipe& recipe, const Writer& w, const std::string& in,
                      WriteContent& content, ConvertReport& r) {
  std::vector<Item> items = Planner(recipe, content.tensors, in, r.transforms).run();
  check_mxfp4_rank(items, in);
  for (const Item& it : items)
    for (size_t i : it.inputs)
      if (it.computed() && content.tensors[i].storage() && content.tensors[i].storage()->info.meta)
        throw Error(ErrorCode::kUnsupported,
                    "is made from a meta tensor (no bytes) by a transform: leave it out (--drop) "
                    "or convert without transforms",
                    in, it.info.name);
  uint64_t bytes = 0;
  bool any_computed = false;
  for (Item& it : items) {
    if (!w.holds(it.info.dtype))
      refuse(in, it.info.name,
             "dtype " + std::string(dtype_name(it.info.dtype)) + " cannot be written to " +
                 w.caps().format);
    if (it.computed()) {
      it.info.strides = contiguous_strides(it.info.shape);
      it.info.storage_offset = 0;
      it.info.quantization.reset();
      any_computed = true;
    }
    bytes += it.info.nbytes();
  }
  r.tensors = items.size();
  r.tensor_bytes = bytes;
  std::vector<Tensor> out;
  out.reserve(items.size());
  for (const Item& it : items) {
    if (!it.computed()) {
      Tensor t = content.tensors[it.inputs[0]];
      t.info().name = it.info.name;
      out.push_back(std::move(t));
      continue;
    }
    auto st = std::make_shared<Storage>();  // no bytes: the feed makes them
    st->info.key = it.info.name;
    st->info.dtype = it.info.dtype;
    st->info.nbytes = it.info.nbytes();
    out.push_back(Tensor(it.info, std::move(st)));
  }
  if (any_computed)
    content.feed =
        std::make_shared<TransformFeed>(std::move(content.tensors), std::move(items), content.feed);
  content.tensors = std::move(out);
}

}  // namespace ckpt::internal
