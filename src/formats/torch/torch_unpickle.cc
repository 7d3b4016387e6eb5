// torch's pickle semantics on top of the restricted VM.
//
// data.pkl references storages through persistent ids
//   ('storage', <GLOBAL torch.XxxStorage | torch.UntypedStorage>, key:str, location:str, numel:int
//    [, view_metadata (legacy format only)])
// and rebuilds tensors with REDUCE of the allow-listed torch._utils._rebuild_* functions. Here
// those calls are interpreted: each rebuild adds a TensorInfo to the table and yields
// Value::tensor(index). See docs/formats/torch.md.

#include "formats/torch/torch_unpickle.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "ckpt/error.h"
#include "formats/torch/torch_dtensor.h"
#include "formats/torch/torch_numpy.h"
#include "formats/torch/weights_only.h"
#include "pickle/builtin_calls.h"
#include "pickle/unpickler.h"
#include "pickle/value_release.h"
#include "util/bytes.h"

namespace ckpt::internal {
namespace {

constexpr std::string_view kStorageMarker = "<storage>";

bool is_qscheme(std::string_view n) {
  return n == "per_tensor_affine" || n == "per_tensor_symmetric" || n == "per_channel_affine" ||
         n == "per_channel_symmetric" || n == "per_channel_affine_float_qparams";
}

bool allowed(const std::string& module, const std::string& name, bool torchscript) {
  static const std::unordered_set<std::string> kExact = {
      "collections.OrderedDict",
      "torch._tensor._rebuild_from_type_v2",
      "torch.tensor._rebuild_from_type_v2",
      "torch.nn.parameter.Parameter",
      "torch.Tensor",
      "torch.Size",
      "torch.device",
      "torch.UntypedStorage",
      "torch.storage.UntypedStorage",
      "torch.serialization._get_layout",
      "_codecs.encode",
      "builtins.set",
      "builtins.frozenset",
      "builtins.bytearray",
      "builtins.bytes",
      "builtins.complex",
      "__builtin__.set",
      "__builtin__.frozenset",
      "__builtin__.bytearray",
      "__builtin__.complex",
      // Data-only classes of training checkpoints: real values where ckpt knows them (numpy
      // scalars and arrays, Counter, defaultdict), else recorded objects; never called.
      "argparse.Namespace",
      "collections.defaultdict",
      "collections.Counter",
      "collections.deque",
      "datetime.datetime",
      "datetime.date",
      "datetime.time",
      "datetime.timedelta",
      "datetime.timezone",
      "pathlib.Path",
      "pathlib.PosixPath",
      "pathlib.WindowsPath",
      "pathlib.PurePath",
      "pathlib.PurePosixPath",
      "pathlib.PureWindowsPath",
      "builtins.slice",
      "__builtin__.slice",
      "numpy.ndarray",
      "numpy.dtype",
      "numpy.core.multiarray._reconstruct",
      "numpy.core.multiarray.scalar",
      "numpy._core.multiarray._reconstruct",
      "numpy._core.multiarray.scalar",
  };
  std::string full = module + "." + name;
  if (kExact.count(full)) return true;
  // The rebuild functions: torch's weights_only list names exactly the ones interpreted here.
  if (module == "torch._utils") return torch_weights_only_global(module, name);
  if (module == "torch") {
    if (dtype_from_name(name) || dtype_from_storage_class(name) || is_qscheme(name)) return true;
    if (name == "strided" || name == "sparse_coo" || name == "_mkldnn") return true;
    // Legacy tensor classes (torch.FloatTensor...).
    if (name.size() > 6 && name.substr(name.size() - 6) == "Tensor") return true;
  }
  if (torchscript) {
    if (module.rfind("__torch__", 0) == 0) return true;
    if (module == "torch.jit._pickle") return true;
  }
  return false;
}

class Builder {
 public:
  explicit Builder(const TorchUnpickleOptions& o) : opt_(o) {}

  TorchPickle run(std::span<const std::byte> data, size_t* consumed) {
    UnpicklerHooks hooks;
    // Which globals are interpreted (allowed) and which are kept as opaque data (foreign) is one
    // question; which are accepted at all is another: everything by default, and with `strict`
    // exactly torch's weights_only list (plus a TorchScript archive's own classes). A global on
    // torch's list that ckpt does not interpret (torch.cuda.FloatStorage, torch.int4) is data.
    hooks.allow_global = [this](const std::string& m, const std::string& n) {
      return allowed(m, n, opt_.torchscript) && (!opt_.strict || strict_accepts(m, n));
    };
    hooks.admit_foreign = [this](const std::string& m, const std::string& n) {
      return !opt_.strict || strict_accepts(m, n);
    };
    hooks.build = [this](PickleHeap& h, Ref obj, Ref state) { return build(h, obj, state); };
    hooks.persistent_load = [this](PickleHeap& h, Ref pid) { return persistent_load(h, pid); };
    hooks.call = [this](PickleHeap& h, Ref fn, std::span<const Ref> args) {
      return call(h, fn, args);
    };
    UnpickleOptions uo;
    uo.source = opt_.source;
    uo.record = opt_.record;
    uo.base_offset = opt_.base_offset;
    uo.limits = opt_.limits;
    uo.file_size = opt_.file_size;
    // A tensor takes at least ~60 bytes of pickle; reserving the tables (untouched capacity
    // costs address space, not memory) saves moving 20,000 TensorInfos several times.
    const size_t guess =
        std::min<size_t>({data.size() / 64, opt_.limits.max_tensors, size_t{1} << 18});
    out_.tensors.reserve(guess);
    out_.storages.reserve(guess);
    out_.root = unpickle(data, hooks, uo, consumed);
    try {
      name_tensors(out_.root, out_.tensors, opt_.limits.max_pickle_depth);
    } catch (...) {
      // The tree may be nested far deeper than max_pickle_depth (that is why naming stopped);
      // ~Value would free it recursively and overflow the stack, so release it iteratively.
      release_value(std::move(out_.root));
      throw;
    }
    return std::move(out_);
  }

 private:
  using Kind = Value::Kind;

  [[noreturn]] void fail(ErrorCode code, const std::string& msg) const {
    throw Error(code, msg, opt_.source, opt_.record);
  }

  int64_t as_int(const PickleHeap& h, Ref v, const char* what) const {
    if (!h.is_small_int(v))
      fail(ErrorCode::kCorrupt, std::string("expected an integer for ") + what);
    return h.int_value(v);
  }
  static bool as_flag(const PickleHeap& h, Ref v) { return h.truth(v); }

  std::vector<int64_t> int_tuple(const PickleHeap& h, Ref v, const char* what) const {
    if (h.kind(v) != Kind::kTuple && h.kind(v) != Kind::kList)
      fail(ErrorCode::kCorrupt, std::string("expected a tuple for ") + what);
    auto items = h.items(v);
    if (items.size() > opt_.limits.max_dims)
      throw Error(ErrorCode::kLimitExceeded,
                  std::string(what) + " has " + std::to_string(items.size()) +
                      " dimensions; the limit is " + std::to_string(opt_.limits.max_dims) +
                      " (Limits::max_dims)",
                  opt_.source, opt_.record);
    std::vector<int64_t> out;
    out.reserve(items.size());
    for (Ref it : items) {
      int64_t x = as_int(h, it, what);
      if (x < 0) fail(ErrorCode::kCorrupt, std::string("negative value in ") + what);
      out.push_back(x);
    }
    return out;
  }

  // Protocol 0 has no binary persistent ids: the pickler writes PERSID with str() of torch's
  // tuple, "('storage', <class 'torch.FloatStorage'>, '94', 'cpu', 3, None)" (torch.load itself
  // cannot read that back). Parsed as text into the tuple it stands for: quoted strings, one
  // <class 'module.Name'>, decimal ints and None, nothing else.
  Ref pid_from_text(PickleHeap& h, std::string_view t) const {
    auto bad = [&]() -> Ref {
      fail(ErrorCode::kCorrupt,
           "text persistent id is not a ('storage', ...) tuple: " + std::string(t.substr(0, 80)));
    };
    std::vector<Ref> items;
    size_t i = 0;
    auto skip_space = [&] {
      while (i < t.size() && t[i] == ' ') ++i;
    };
    auto quoted = [&](std::string& out) {
      if (i >= t.size() || (t[i] != '\'' && t[i] != '"')) return false;
      char q = t[i++];
      while (i < t.size() && t[i] != q) {
        if (t[i] == '\\') return false;  // torch's keys and locations need no escapes
        out += t[i++];
      }
      if (i >= t.size()) return false;
      ++i;
      return true;
    };
    if (t.empty() || t[0] != '(') return bad();
    ++i;
    for (;;) {
      skip_space();
      if (i >= t.size()) return bad();
      if (t[i] == ')') {
        ++i;
        break;
      }
      if (items.size() >= 8) return bad();
      std::string text;
      if (t[i] == '\'' || t[i] == '"') {
        if (!quoted(text)) return bad();
        items.push_back(h.string(text));
      } else if (t.substr(i, 7) == "<class ") {
        i += 7;
        if (!quoted(text) || i >= t.size() || t[i] != '>') return bad();
        ++i;
        size_t dot = text.rfind('.');
        if (dot == std::string::npos) return bad();
        std::string module = text.substr(0, dot), name = text.substr(dot + 1);
        if (!allowed(module, name, opt_.torchscript))
          throw Error(ErrorCode::kUnsupported,
                      "global '" + text + "' is not allowed (in a text persistent id)", opt_.source,
                      opt_.record);
        items.push_back(h.global(module, name));
      } else if (t.substr(i, 4) == "None") {
        i += 4;
        items.push_back(h.none());
      } else if (t[i] == '-' || (t[i] >= '0' && t[i] <= '9')) {
        size_t start = i++;
        while (i < t.size() && t[i] >= '0' && t[i] <= '9') ++i;
        int64_t v = 0;
        auto [ptr, ec] = std::from_chars(t.data() + start, t.data() + i, v);
        if (ec != std::errc() || ptr != t.data() + i) return bad();
        items.push_back(h.integer(v));
      } else {
        return bad();
      }
      skip_space();
      if (i < t.size() && t[i] == ',')
        ++i;
      else if (i >= t.size() || t[i] != ')')
        return bad();
    }
    if (i != t.size()) return bad();
    return h.tuple(items);
  }

  Ref persistent_load(PickleHeap& h, Ref pid) {
    if (h.kind(pid) == Kind::kString) pid = pid_from_text(h, std::string(h.text(pid)));
    auto p = h.items(pid);
    if (h.kind(pid) != Kind::kTuple || p.size() < 5 || h.kind(p[0]) != Kind::kString ||
        h.text(p[0]) != "storage") {
      CopyBudget budget(1 << 20);
      fail(ErrorCode::kCorrupt,
           "persistent id is not a ('storage', ...) tuple: " + h.to_value(pid, budget)->repr());
    }
    const Ref cls = p[1];
    if (h.kind(cls) != Kind::kGlobal)
      fail(ErrorCode::kCorrupt, "persistent id names no storage class");
    DType dtype;
    if (cls == last_storage_cls_) {  // memoized: the same global for every storage of a type
      dtype = last_storage_dtype_;
    } else if (h.name(cls) == "UntypedStorage" &&
               (h.module(cls) == "torch" || h.module(cls) == "torch.storage")) {
      dtype = DType::kUInt8;
    } else if (auto d = dtype_from_storage_class(h.name(cls))) {
      dtype = *d;
    } else {
      fail(ErrorCode::kUnsupported,
           "unknown storage class " + std::string(h.module(cls)) + "." + std::string(h.name(cls)));
    }
    const Ref key = p[2];
    if (h.kind(key) != Kind::kString && !h.is_small_int(key))
      fail(ErrorCode::kCorrupt, "storage key is not a string");
    std::string k =
        h.kind(key) == Kind::kString ? std::string(h.text(key)) : std::to_string(h.int_value(key));
    const Ref loc = p[3];
    int64_t numel = as_int(h, p[4], "storage numel");
    if (numel < 0) fail(ErrorCode::kCorrupt, "negative storage size");
    if (p.size() > 5 && h.kind(p[5]) != Kind::kNone)
      fail(ErrorCode::kUnsupported, "legacy storage views (view_metadata) are not supported");
    last_storage_cls_ = cls;
    last_storage_dtype_ = dtype;
    auto nbytes = checked_mul(static_cast<uint64_t>(numel), storage_element_size(dtype));
    if (!nbytes) fail(ErrorCode::kCorrupt, "storage size overflows");

    size_t index;
    if (std::optional<size_t> known = find_storage(k)) {
      index = *known;
      const StorageInfo& s = out_.storages[index];
      if (s.nbytes != *nbytes && *nbytes != 0 && s.nbytes != 0)
        fail(ErrorCode::kCorrupt, "storage " + k + " is referenced with two different sizes");
    } else {
      if (out_.storages.size() >= opt_.limits.max_tensors)
        throw Error(ErrorCode::kLimitExceeded,
                    "more storages than Limits::max_tensors (" +
                        std::to_string(opt_.limits.max_tensors) + ")",
                    opt_.source, opt_.record);
      StorageInfo s;
      s.key = k;
      s.dtype = dtype;
      s.nbytes = *nbytes;
      s.device = h.kind(loc) == Kind::kString ? std::string(h.text(loc)) : "cpu";
      index = out_.storages.size();
      out_.storages.push_back(std::move(s));
      remember_storage(std::move(k), index);
    }
    // One marker class per unpickle; the marker object's tag is the storage index.
    if (marker_cls_ == kNoRef) marker_cls_ = h.global("ckpt", kStorageMarker);
    return h.object(marker_cls_, h.empty_tuple(), static_cast<int64_t>(index));
  }

  // torch names storages "0", "1", ... in order, so decimal keys index a vector; any other key
  // (or a number far beyond the count, which would make the vector huge) goes to a map.
  static std::optional<uint32_t> small_number(std::string_view k) {
    if (k.empty() || k.size() > 9 || (k.size() > 1 && k[0] == '0')) return std::nullopt;
    uint32_t v = 0;
    for (char c : k) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + static_cast<uint32_t>(c - '0');
    }
    return v;
  }
  std::optional<size_t> find_storage(std::string_view k) const {
    if (auto n = small_number(k)) {
      if (*n < by_number_.size() && by_number_[*n] != kNone) return by_number_[*n];
    }
    if (by_key_.empty()) return std::nullopt;
    auto it = by_key_.find(std::string(k));
    if (it == by_key_.end()) return std::nullopt;
    return it->second;
  }
  void remember_storage(std::string k, size_t index) {
    auto n = small_number(k);
    if (n && *n <= 2 * by_number_.size() + 4096) {
      if (*n >= by_number_.size()) by_number_.resize(*n + 1, kNone);
      by_number_[*n] = static_cast<uint32_t>(index);
      return;
    }
    by_key_.emplace(std::move(k), index);
  }

  size_t storage_of(const PickleHeap& h, Ref v) const {
    if (marker_cls_ == kNoRef || h.kind(v) != Kind::kObject || h.cls(v) != marker_cls_)
      fail(ErrorCode::kCorrupt, "tensor rebuild without a storage");
    return static_cast<size_t>(h.int_value(v));
  }

  size_t tensor_of(const PickleHeap& h, Ref v) const {
    if (h.kind(v) != Kind::kTensor) fail(ErrorCode::kCorrupt, "expected a tensor argument");
    return static_cast<size_t>(h.int_value(v));
  }

  // An empty state: None, or an empty dict (torch writes {} for a tensor without attributes).
  static bool empty_state(const PickleHeap& h, Ref state) {
    if (h.kind(state) == Kind::kNone) return true;
    return h.kind(state) == Kind::kDict && h.module(state).empty() && h.items(state).empty() &&
           h.state(state) == kNoRef;
  }

  // A fresh node for tensor `i` whose origin records the Python wrapper torch pickled around it:
  // the call `fn` with arguments (type, state) — the class (None for a Parameter) and its state.
  Ref wrapped_tensor(PickleHeap& h, Ref fn, size_t i, Ref type, Ref state) {
    const Ref args[2] = {type, state};
    Ref call = h.object(fn, h.tuple(std::span<const Ref>(args, 2)));
    Ref t = h.tensor(i);
    h.set_origin(t, call);
    return t;
  }

  Ref add_tensor(PickleHeap& h, TensorInfo t) {
    if (out_.tensors.size() >= opt_.limits.max_tensors)
      throw Error(
          ErrorCode::kLimitExceeded,
          "more tensors than Limits::max_tensors (" + std::to_string(opt_.limits.max_tensors) + ")",
          opt_.source, opt_.record);
    if (t.strides.size() != t.shape.size())
      fail(ErrorCode::kCorrupt, "tensor size and stride have different lengths");
    out_.tensors.push_back(std::move(t));
    return h.tensor(out_.tensors.size() - 1);
  }

  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]) and
  // friends; `dtype` overrides the storage's (v3 and UntypedStorage).
  Ref rebuild_tensor(PickleHeap& h, std::span<const Ref> a, std::optional<DType> dtype) {
    TensorInfo t;
    t.storage = storage_of(h, a[0]);
    StorageInfo& st = out_.storages[t.storage];
    t.dtype = dtype.value_or(st.dtype);
    if (dtype && st.dtype == DType::kUInt8 && *dtype != DType::kUInt8) st.dtype = *dtype;
    t.storage_offset = as_int(h, a[1], "storage offset");
    if (t.storage_offset < 0) fail(ErrorCode::kCorrupt, "negative storage offset");
    t.shape = int_tuple(h, a[2], "size");
    t.strides = int_tuple(h, a[3], "stride");
    if (a.size() > 4) t.requires_grad = as_flag(h, a[4]);
    return add_tensor(h, std::move(t));
  }

  std::optional<DType> dtype_of(const PickleHeap& h, Ref v) const {
    if (h.kind(v) != Kind::kGlobal) return std::nullopt;
    return dtype_from_name(std::string(h.name(v)));
  }

  bool strict_accepts(const std::string& m, const std::string& n) const {
    if (torch_weights_only_global(m, n)) return true;
    return opt_.torchscript && allowed(m, n, true) && !allowed(m, n, false);
  }

  Ref call(PickleHeap& h, Ref fn, std::span<const Ref> a) {
    // torch memoizes the globals it calls, so one Ref comes back for every tensor: the two
    // answers given per tensor (the tensor rebuild, and "not mine" for the hooks' OrderedDict)
    // are remembered by Ref rather than found again by name. A global node never changes.
    if (fn == rebuild_v2_fn_ && a.size() >= 4) return rebuild_tensor(h, a, std::nullopt);
    if (fn == unhandled_fn_) return kNoRef;
    const std::string_view m = h.module(fn), n = h.name(fn);
    auto need = [&](size_t k) {
      if (a.size() < k)
        fail(ErrorCode::kCorrupt, std::string(m) + "." + std::string(n) + " called with " +
                                      std::to_string(a.size()) + " arguments, needs " +
                                      std::to_string(k));
    };
    if (m == "torch._utils") {
      if (n == "_rebuild_tensor_v2" || n == "_rebuild_tensor") {
        need(4);
        rebuild_v2_fn_ = fn;
        return rebuild_tensor(h, a, std::nullopt);
      }
      if (n == "_rebuild_tensor_v3") {
        need(7);
        auto dt = dtype_of(h, a[6]);
        if (!dt) fail(ErrorCode::kCorrupt, "_rebuild_tensor_v3 without a dtype");
        return rebuild_tensor(h, a, dt);
      }
      if (n == "_rebuild_parameter" || n == "_rebuild_parameter_with_state") {
        need(2);
        size_t i = tensor_of(h, a[0]);
        auto& t = out_.tensors[i];
        t.is_parameter = true;
        t.requires_grad = as_flag(h, a[1]);
        // A Parameter with Python attributes (param.tag = ...): the attributes are kept with
        // the tensor (origin: _rebuild_parameter_with_state(None, state)) for writers.
        if (n == "_rebuild_parameter_with_state" && a.size() >= 4 && !empty_state(h, a[3]))
          return wrapped_tensor(h, fn, i, h.none(), a[3]);
        return a[0];
      }
      if (n == "_rebuild_qtensor") {
        need(6);
        // Read everything the quantizer tuple holds before making nodes (spans move).
        const Ref q = a[4];
        std::vector<Ref> qi(h.items(q).begin(), h.items(q).end());
        const bool grad = a.size() > 5 && as_flag(h, a[5]);
        if (h.kind(q) != Kind::kTuple || qi.empty() || h.kind(qi[0]) != Kind::kGlobal)
          fail(ErrorCode::kCorrupt, "bad quantizer parameters");
        Quantization qz;
        qz.scheme = std::string(h.name(qi[0]));
        if ((qz.scheme == "per_tensor_affine" || qz.scheme == "per_tensor_symmetric") &&
            qi.size() >= 3) {
          qz.scale = h.kind(qi[1]) == Kind::kFloat ? h.float_value(qi[1])
                                                   : static_cast<double>(h.int_value(qi[1]));
          qz.zero_point = as_int(h, qi[2], "zero point");
        } else if (qi.size() >= 4 && h.kind(qi[1]) == Kind::kTensor &&
                   h.kind(qi[2]) == Kind::kTensor) {
          qz.scales_tensor = static_cast<size_t>(h.int_value(qi[1]));
          qz.zero_points_tensor = static_cast<size_t>(h.int_value(qi[2]));
          qz.axis = as_int(h, qi[3], "axis");
        } else {
          fail(ErrorCode::kUnsupported, "quantization scheme " + qz.scheme);
        }
        Ref v = rebuild_tensor(h, a.first(4), std::nullopt);
        auto& t = out_.tensors[static_cast<size_t>(h.int_value(v))];
        t.requires_grad = grad;
        if (qz.scales_tensor) {
          out_.tensors[*qz.scales_tensor].type = "qparams";
          out_.tensors[*qz.zero_points_tensor].type = "qparams";
        }
        t.quantization = qz;
        return v;
      }
      if (n == "_rebuild_meta_tensor_no_storage") {
        need(3);
        auto dt = dtype_of(h, a[0]);
        if (!dt) fail(ErrorCode::kCorrupt, "meta tensor without a dtype");
        StorageInfo s;
        s.key = "meta." + std::to_string(out_.storages.size());
        s.dtype = *dt;
        s.meta = true;
        s.device = "meta";
        TensorInfo t;
        t.dtype = s.dtype;
        t.shape = int_tuple(h, a[1], "size");
        t.strides = int_tuple(h, a[2], "stride");
        if (a.size() > 3) t.requires_grad = as_flag(h, a[3]);
        t.storage = out_.storages.size();
        uint64_t extent_elems = 0;
        for (size_t i = 0; i < t.shape.size(); ++i)
          if (t.shape[i] > 0) extent_elems += (t.shape[i] - 1) * t.strides[i];
        s.nbytes = t.numel() ? dtype_nbytes(s.dtype, extent_elems + 1).value_or(0) : 0;
        out_.storages.push_back(std::move(s));
        return add_tensor(h, std::move(t));
      }
      fail(ErrorCode::kUnsupported, "torch._utils." + std::string(n) +
                                        " (sparse, nested and device-wrapped tensors) is not "
                                        "supported");
    }
    if ((m == "torch._tensor" || m == "torch.tensor") && n == "_rebuild_from_type_v2") {
      need(3);
      if (h.kind(a[0]) != Kind::kGlobal || h.kind(a[2]) != Kind::kTuple)
        fail(ErrorCode::kCorrupt, "bad _rebuild_from_type_v2 call");
      const bool parameter =
          h.kind(a[1]) == Kind::kGlobal && h.name(a[1]) == "Parameter" &&
          (h.module(a[1]) == "torch.nn.parameter" || h.module(a[1]) == "torch.nn");
      const bool plain =
          h.kind(a[1]) == Kind::kGlobal && h.module(a[1]) == "torch" && h.name(a[1]) == "Tensor";
      const Ref type = a[1];
      const Ref state = a.size() > 3 ? a[3] : h.none();
      // A DTensor: its rank's shard is the tensor, the class and the state go with it as for
      // any subclass (torch_dtensor.h).
      if (Ref local = dtensor_local(h, a[0], type, state); local != kNoRef)
        return wrapped_tensor(h, h.global("torch._tensor", "_rebuild_from_type_v2"),
                              static_cast<size_t>(h.int_value(local)), type, state);
      std::vector<Ref> inner(h.items(a[2]).begin(), h.items(a[2]).end());
      Ref r = call(h, a[0], inner);
      if (r == kNoRef || h.kind(r) != Kind::kTensor) return r;
      const size_t i = static_cast<size_t>(h.int_value(r));
      if (parameter) out_.tensors[i].is_parameter = true;
      // A tensor subclass (its class is kept, never called) or a tensor with Python attributes:
      // the class and the state go with the tensor (origin: _rebuild_from_type_v2(type, state))
      // so that writers reproduce them.
      if ((!plain && !parameter) || !empty_state(h, state))
        return wrapped_tensor(h, h.global("torch._tensor", "_rebuild_from_type_v2"), i, type,
                              state);
      return r;
    }
    if (m == "torch" && n == "Size") {
      need(1);
      if (h.kind(a[0]) != Kind::kTuple && h.kind(a[0]) != Kind::kList)
        fail(ErrorCode::kCorrupt, "torch.Size of a " + std::string(kind_name(h.kind(a[0]))));
      // Kept as the torch.Size object it is (a tuple subclass: rewriting must not make it a
      // plain tuple); its argument becomes a tuple, as torch.Size's own __reduce__ writes it.
      if (a.size() != 1) fail(ErrorCode::kCorrupt, "torch.Size takes one argument");
      Ref dims = a[0];
      if (h.kind(dims) == Kind::kList) {
        std::vector<Ref> items(h.items(dims).begin(), h.items(dims).end());
        dims = h.tuple(items);
      }
      return h.object(fn, h.tuple(std::span<const Ref>(&dims, 1)));
    }
    if (m == "torch.serialization" && n == "_get_layout") return h.global("torch", "strided");
    if ((m == "numpy.core.multiarray" || m == "numpy._core.multiarray") && n == "scalar")
      return numpy_scalar(h, fn, a);
    if (m == "torch.jit._pickle") {
      // restore_type_tag(obj, type_str) and build_{int,double,bool,tensor}list(list): identity.
      need(1);
      return a[0];
    }
    unhandled_fn_ = fn;
    return kNoRef;  // VM built-ins (OrderedDict, set, bytes...) or a recorded object
  }

  // --- numpy (scalars and dtypes: torch_numpy.h) ---------------------------------------------

  // BUILD of numpy.core.multiarray._reconstruct(ndarray, (0,), b'b') with the state (version,
  // shape, dtype, is_fortran, raw bytes): a numeric array becomes a tensor whose bytes the
  // pickle holds (origin: the call). Object arrays and anything unusual stay as recorded.
  bool build(PickleHeap& h, Ref obj, Ref state) {
    if (h.kind(obj) != Kind::kObject || h.name(obj) != "_reconstruct" ||
        (h.module(obj) != "numpy.core.multiarray" && h.module(obj) != "numpy._core.multiarray"))
      return false;
    auto si = h.items(state);
    if (h.kind(state) != Kind::kTuple || si.size() != 5 || h.kind(si[4]) != Kind::kBytes)
      return false;
    const Ref shape_ref = si[1], dtype_ref = si[2], fortran_ref = si[3], data_ref = si[4];
    if (h.kind(shape_ref) != Kind::kTuple || h.kind(fortran_ref) != Kind::kBool) return false;
    auto t = numpy_type(h, dtype_ref);
    if (!t) return false;
    std::vector<int64_t> shape = int_tuple(h, shape_ref, "numpy array shape");
    const uint64_t item = dtype_info(t->dtype).bits / 8;
    uint64_t numel = 1;
    for (int64_t d : shape) {
      auto n = checked_mul(numel, static_cast<uint64_t>(d));
      if (!n) fail(ErrorCode::kCorrupt, "numpy array size overflows");
      numel = *n;
    }
    if (numel * item != h.text(data_ref).size()) return false;  // numpy would refuse it too
    if (out_.storages.size() >= opt_.limits.max_tensors)
      throw Error(ErrorCode::kLimitExceeded,
                  "more storages than Limits::max_tensors (" +
                      std::to_string(opt_.limits.max_tensors) + ")",
                  opt_.source, opt_.record);
    StorageInfo s;
    s.key = "numpy." + std::to_string(out_.storages.size());
    s.dtype = t->dtype;
    s.nbytes = numel * item;
    s.byteswap = t->swap;
    s.record = opt_.record + " (numpy array)";
    const size_t index = out_.storages.size();
    out_.inline_bytes.emplace(index, std::string(h.text(data_ref)));
    out_.storages.push_back(std::move(s));
    TensorInfo ti;
    ti.dtype = t->dtype;
    ti.storage = index;
    ti.shape = shape;
    ti.strides = contiguous_strides(shape);
    if (h.truth(fortran_ref)) {  // column-major: strides grow from the first dimension
      int64_t st = 1;
      for (size_t i = 0; i < shape.size(); ++i) {
        ti.strides[i] = st;
        st *= std::max<int64_t>(shape[i], 1);
      }
    }
    ti.type = "numpy";
    h.set_state(obj, state);
    Ref tensor = add_tensor(h, std::move(ti));
    h.become(obj, tensor);
    return true;
  }

  const TorchUnpickleOptions& opt_;
  TorchPickle out_;
  static constexpr uint32_t kNone = UINT32_MAX;
  std::vector<uint32_t> by_number_;  // storage index by decimal key, or kNone
  std::unordered_map<std::string, size_t> by_key_;
  Ref marker_cls_ = kNoRef;
  Ref last_storage_cls_ = kNoRef;  // the storage class last read, and its dtype
  DType last_storage_dtype_ = DType::kUInt8;
  Ref rebuild_v2_fn_ = kNoRef;  // a global known to be _rebuild_tensor(_v2)
  Ref unhandled_fn_ = kNoRef;   // a global known to be none of the calls handled here
};

class InlineDecoder final : public StorageDecoder {
 public:
  InlineDecoder(std::shared_ptr<const StorageDecoder> inner,
                std::unordered_map<size_t, std::string> bytes)
      : inner_(std::move(inner)), bytes_(std::move(bytes)) {}
  void read(size_t index, std::span<std::byte> dst, bool verify) const override {
    auto it = bytes_.find(index);
    if (it == bytes_.end()) {
      if (!inner_) throw Error(ErrorCode::kCorrupt, "storage has no decoder");
      return inner_->read(index, dst, verify);
    }
    if (it->second.size() != dst.size())
      throw Error(ErrorCode::kCorrupt, "inline storage size differs");
    if (!dst.empty()) std::memcpy(dst.data(), it->second.data(), dst.size());
  }

 private:
  std::shared_ptr<const StorageDecoder> inner_;
  std::unordered_map<size_t, std::string> bytes_;
};
}  // namespace

std::shared_ptr<const StorageDecoder> inline_decoder(
    std::shared_ptr<const StorageDecoder> inner, std::unordered_map<size_t, std::string> bytes) {
  if (bytes.empty()) return inner;
  return std::make_shared<InlineDecoder>(std::move(inner), std::move(bytes));
}

TorchPickle unpickle_torch(std::span<const std::byte> data, const TorchUnpickleOptions& options,
                           size_t* consumed) {
  Builder b(options);
  return b.run(data, consumed);
}

}  // namespace ckpt::internal
