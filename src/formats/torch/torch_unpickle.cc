// torch's pickle semantics on top of the restricted VM.
//
// data.pkl references storages through persistent ids
//   ('storage', <GLOBAL torch.XxxStorage | torch.UntypedStorage>, key:str, location:str, numel:int
//    [, view_metadata (legacy format only)])
// and rebuilds tensors with REDUCE of the allow-listed torch._utils._rebuild_* functions. Here
// those calls are interpreted: each rebuild adds a TensorInfo to the table and yields
// Value::tensor(index). See docs/formats.md.

#include "formats/torch/torch_unpickle.h"

#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "ckpt/error.h"
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
      "torch._utils._rebuild_tensor",
      "torch._utils._rebuild_tensor_v2",
      "torch._utils._rebuild_tensor_v3",
      "torch._utils._rebuild_parameter",
      "torch._utils._rebuild_parameter_with_state",
      "torch._utils._rebuild_qtensor",
      "torch._utils._rebuild_meta_tensor_no_storage",
      "torch._utils._rebuild_sparse_tensor",
      "torch._utils._rebuild_nested_tensor",
      "torch._utils._rebuild_wrapper_subclass",
      "torch._utils._rebuild_device_tensor_from_numpy",
      "torch._utils._rebuild_device_tensor_from_cpu_tensor",
      "torch._tensor._rebuild_from_type_v2",
      "torch.tensor._rebuild_from_type_v2",
      "torch.nn.parameter.Parameter",
      "torch.Tensor",
      "torch.Size",
      "torch.device",
      "torch.UntypedStorage",
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
  };
  std::string full = module + "." + name;
  if (kExact.count(full)) return true;
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
    hooks.allow_global = [this](const std::string& m, const std::string& n) {
      return allowed(m, n, opt_.torchscript);
    };
    hooks.persistent_load = [this](const ValuePtr& pid) { return persistent_load(pid); };
    hooks.call = [this](const Value& fn, const ValuePtr& args) { return call(fn, args); };
    UnpickleOptions uo;
    uo.source = opt_.source;
    uo.record = opt_.record;
    uo.base_offset = opt_.base_offset;
    uo.limits = opt_.limits;
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
  [[noreturn]] void fail(ErrorCode code, const std::string& msg) const {
    throw Error(code, msg, opt_.source, opt_.record);
  }

  static int64_t as_int(const ValuePtr& v, const char* what, const Builder& b) {
    if (!v || v->kind != Value::Kind::kInt || !v->s.empty())
      b.fail(ErrorCode::kCorrupt, std::string("expected an integer for ") + what);
    return v->i;
  }

  std::vector<int64_t> int_tuple(const ValuePtr& v, const char* what) const {
    if (!v || !(v->kind == Value::Kind::kTuple || v->kind == Value::Kind::kList))
      fail(ErrorCode::kCorrupt, std::string("expected a tuple for ") + what);
    if (v->items.size() > opt_.limits.max_dims)
      throw Error(ErrorCode::kLimitExceeded,
                  std::string(what) + " has " + std::to_string(v->items.size()) +
                      " dimensions; the limit is " + std::to_string(opt_.limits.max_dims) +
                      " (Limits::max_dims)",
                  opt_.source, opt_.record);
    std::vector<int64_t> out;
    out.reserve(v->items.size());
    for (auto& it : v->items) {
      int64_t x = as_int(it, what, *this);
      if (x < 0) fail(ErrorCode::kCorrupt, std::string("negative value in ") + what);
      out.push_back(x);
    }
    return out;
  }

  ValuePtr persistent_load(const ValuePtr& pid) {
    if (!pid || pid->kind != Value::Kind::kTuple || pid->items.size() < 5 ||
        pid->items[0]->kind != Value::Kind::kString || pid->items[0]->s != "storage")
      fail(ErrorCode::kCorrupt, "persistent id is not a ('storage', ...) tuple: " +
                                    (pid ? pid->repr() : std::string("null")));
    const Value& cls = *pid->items[1];
    if (cls.kind != Value::Kind::kGlobal)
      fail(ErrorCode::kCorrupt, "persistent id names no storage class");
    DType dtype;
    if (cls.name == "UntypedStorage") {
      dtype = DType::kUInt8;
    } else if (auto d = dtype_from_storage_class(cls.name)) {
      dtype = *d;
    } else {
      fail(ErrorCode::kUnsupported, "unknown storage class " + cls.module + "." + cls.name);
    }
    const Value& key = *pid->items[2];
    if (key.kind != Value::Kind::kString && key.kind != Value::Kind::kInt)
      fail(ErrorCode::kCorrupt, "storage key is not a string");
    std::string k = key.kind == Value::Kind::kString ? key.s : std::to_string(key.i);
    const Value& loc = *pid->items[3];
    int64_t numel = as_int(pid->items[4], "storage numel", *this);
    if (numel < 0) fail(ErrorCode::kCorrupt, "negative storage size");
    if (pid->items.size() > 5 && !pid->items[5]->is_none())
      fail(ErrorCode::kUnsupported, "legacy storage views (view_metadata) are not supported");
    auto nbytes = checked_mul(static_cast<uint64_t>(numel), storage_element_size(dtype));
    if (!nbytes) fail(ErrorCode::kCorrupt, "storage size overflows");

    size_t index;
    auto it = by_key_.find(k);
    if (it != by_key_.end()) {
      index = it->second;
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
      s.device = loc.kind == Value::Kind::kString ? loc.s : "cpu";
      index = out_.storages.size();
      out_.storages.push_back(std::move(s));
      by_key_.emplace(k, index);
    }
    auto marker = Value::object("ckpt", std::string(kStorageMarker));
    marker->i = static_cast<int64_t>(index);
    return marker;
  }

  size_t storage_of(const ValuePtr& v) const {
    if (!v || v->kind != Value::Kind::kObject || v->name != kStorageMarker)
      fail(ErrorCode::kCorrupt, "tensor rebuild without a storage");
    return static_cast<size_t>(v->i);
  }

  const TensorInfo& tensor_of(const ValuePtr& v) const {
    if (!v || v->kind != Value::Kind::kTensor)
      fail(ErrorCode::kCorrupt, "expected a tensor argument");
    return out_.tensors[static_cast<size_t>(v->i)];
  }

  ValuePtr add_tensor(TensorInfo t) {
    if (out_.tensors.size() >= opt_.limits.max_tensors)
      throw Error(ErrorCode::kLimitExceeded,
                  "more tensors than Limits::max_tensors (" +
                      std::to_string(opt_.limits.max_tensors) + ")",
                  opt_.source, opt_.record);
    if (t.strides.size() != t.shape.size())
      fail(ErrorCode::kCorrupt, "tensor size and stride have different lengths");
    out_.tensors.push_back(std::move(t));
    return Value::tensor(out_.tensors.size() - 1);
  }

  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata]) and
  // friends; `dtype` overrides the storage's (v3 and UntypedStorage).
  ValuePtr rebuild_tensor(const std::vector<ValuePtr>& a, std::optional<DType> dtype) {
    TensorInfo t;
    t.storage = storage_of(a[0]);
    StorageInfo& st = out_.storages[t.storage];
    t.dtype = dtype.value_or(st.dtype);
    if (dtype && st.dtype == DType::kUInt8 && *dtype != DType::kUInt8) st.dtype = *dtype;
    t.storage_offset = as_int(a[1], "storage offset", *this);
    if (t.storage_offset < 0) fail(ErrorCode::kCorrupt, "negative storage offset");
    t.shape = int_tuple(a[2], "size");
    t.strides = int_tuple(a[3], "stride");
    if (a.size() > 4) t.requires_grad = a[4]->kind == Value::Kind::kBool && a[4]->b;
    return add_tensor(std::move(t));
  }

  ValuePtr call(const Value& fn, const ValuePtr& args) {
    const std::string& m = fn.module;
    const std::string& n = fn.name;
    const auto& a = args->items;
    auto need = [&](size_t k) {
      if (a.size() < k)
        fail(ErrorCode::kCorrupt, m + "." + n + " called with " + std::to_string(a.size()) +
                                      " arguments, needs " + std::to_string(k));
    };
    if (m == "torch._utils") {
      if (n == "_rebuild_tensor_v2" || n == "_rebuild_tensor") {
        need(4);
        return rebuild_tensor(a, std::nullopt);
      }
      if (n == "_rebuild_tensor_v3") {
        need(7);
        if (a[6]->kind != Value::Kind::kGlobal || !dtype_from_name(a[6]->name))
          fail(ErrorCode::kCorrupt, "_rebuild_tensor_v3 without a dtype");
        return rebuild_tensor(a, dtype_from_name(a[6]->name));
      }
      if (n == "_rebuild_parameter" || n == "_rebuild_parameter_with_state") {
        need(2);
        tensor_of(a[0]);
        auto& t = out_.tensors[static_cast<size_t>(a[0]->i)];
        t.is_parameter = true;
        t.requires_grad = a[1]->kind == Value::Kind::kBool && a[1]->b;
        return Value::tensor(static_cast<size_t>(a[0]->i));
      }
      if (n == "_rebuild_qtensor") {
        need(6);
        auto v = rebuild_tensor({a[0], a[1], a[2], a[3]}, std::nullopt);
        auto& t = out_.tensors[static_cast<size_t>(v->i)];
        if (a.size() > 5) t.requires_grad = a[5]->kind == Value::Kind::kBool && a[5]->b;
        const Value& q = *a[4];
        if (q.kind != Value::Kind::kTuple || q.items.empty() ||
            q.items[0]->kind != Value::Kind::kGlobal)
          fail(ErrorCode::kCorrupt, "bad quantizer parameters");
        Quantization qz;
        qz.scheme = q.items[0]->name;
        if ((qz.scheme == "per_tensor_affine" || qz.scheme == "per_tensor_symmetric") &&
            q.items.size() >= 3) {
          qz.scale = q.items[1]->kind == Value::Kind::kFloat ? q.items[1]->f
                                                             : static_cast<double>(q.items[1]->i);
          qz.zero_point = as_int(q.items[2], "zero point", *this);
        } else if (q.items.size() >= 4 && q.items[1]->kind == Value::Kind::kTensor &&
                   q.items[2]->kind == Value::Kind::kTensor) {
          qz.scales_tensor = static_cast<size_t>(q.items[1]->i);
          qz.zero_points_tensor = static_cast<size_t>(q.items[2]->i);
          qz.axis = as_int(q.items[3], "axis", *this);
          out_.tensors[*qz.scales_tensor].type = "qparams";
          out_.tensors[*qz.zero_points_tensor].type = "qparams";
        } else {
          fail(ErrorCode::kUnsupported, "quantization scheme " + qz.scheme);
        }
        t.quantization = qz;
        return v;
      }
      if (n == "_rebuild_meta_tensor_no_storage") {
        need(3);
        if (a[0]->kind != Value::Kind::kGlobal || !dtype_from_name(a[0]->name))
          fail(ErrorCode::kCorrupt, "meta tensor without a dtype");
        StorageInfo s;
        s.key = "meta." + std::to_string(out_.storages.size());
        s.dtype = *dtype_from_name(a[0]->name);
        s.meta = true;
        s.device = "meta";
        TensorInfo t;
        t.dtype = s.dtype;
        t.shape = int_tuple(a[1], "size");
        t.strides = int_tuple(a[2], "stride");
        if (a.size() > 3) t.requires_grad = a[3]->kind == Value::Kind::kBool && a[3]->b;
        t.storage = out_.storages.size();
        uint64_t extent_elems = 0;
        for (size_t i = 0; i < t.shape.size(); ++i)
          if (t.shape[i] > 0) extent_elems += (t.shape[i] - 1) * t.strides[i];
        s.nbytes = t.numel() ? dtype_nbytes(s.dtype, extent_elems + 1).value_or(0) : 0;
        out_.storages.push_back(std::move(s));
        return add_tensor(std::move(t));
      }
      fail(ErrorCode::kUnsupported, "torch._utils." + n + " (sparse, nested and device-wrapped "
                                    "tensors) is not supported");
    }
    if ((m == "torch._tensor" || m == "torch.tensor") && n == "_rebuild_from_type_v2") {
      need(3);
      if (a[0]->kind != Value::Kind::kGlobal || a[2]->kind != Value::Kind::kTuple)
        fail(ErrorCode::kCorrupt, "bad _rebuild_from_type_v2 call");
      ValuePtr r = call(*a[0], a[2]);
      if (r && r->kind == Value::Kind::kTensor && a[1]->kind == Value::Kind::kGlobal &&
          a[1]->name == "Parameter")
        out_.tensors[static_cast<size_t>(r->i)].is_parameter = true;
      return r;
    }
    if (m == "torch" && n == "Size") {
      need(1);
      return Value::tuple(a[0]->items);
    }
    if (m == "torch.serialization" && n == "_get_layout") return Value::global("torch", "strided");
    if (m == "torch.jit._pickle") {
      // restore_type_tag(obj, type_str) and build_{int,double,bool,tensor}list(list): identity.
      need(1);
      return a[0];
    }
    return nullptr;  // VM built-ins (OrderedDict, set, bytes...) or a recorded object
  }

  const TorchUnpickleOptions& opt_;
  TorchPickle out_;
  std::unordered_map<std::string, size_t> by_key_;
};

// `seen`: shared containers already walked. A pickle can reference one subtree many times
// through the memo (level i = [level i-1, level i-1] is 2^64 paths in 64 levels, a few hundred
// bytes); every tensor under a subtree is named on its first visit, so later visits are skipped.
void walk(const ValuePtr& v, std::string& path, std::vector<TensorInfo>& tensors,
          std::vector<uint8_t>& named, uint32_t depth, uint32_t max_depth,
          std::unordered_set<const Value*>& seen) {
  if (!v) return;
  if (depth > max_depth)
    throw Error(ErrorCode::kLimitExceeded,
                "object tree deeper than Limits::max_pickle_depth (" + std::to_string(max_depth) +
                    ")");
  if (v.use_count() > 1 && (!v->items.empty() || !v->entries.empty() || v->state) &&
      !seen.insert(v.get()).second)
    return;
  auto child = [&](const std::string& comp, const ValuePtr& c) {
    size_t len = path.size();
    if (!path.empty()) path += '.';
    path += comp;
    walk(c, path, tensors, named, depth + 1, max_depth, seen);
    path.resize(len);
  };
  switch (v->kind) {
    case Value::Kind::kTensor: {
      size_t i = static_cast<size_t>(v->i);
      if (i < tensors.size() && !named[i]) {
        named[i] = 1;
        tensors[i].name = path;
      }
      return;
    }
    case Value::Kind::kDict:
      for (auto& [k, val] : v->entries) child(k ? path_component(*k) : "?", val);
      return;
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kSet:
      for (size_t i = 0; i < v->items.size(); ++i) child(std::to_string(i), v->items[i]);
      return;
    case Value::Kind::kObject:
      for (size_t i = 0; i < v->items.size(); ++i) child(std::to_string(i), v->items[i]);
      if (v->state) {
        // A module's attributes read as its own path (TorchScript: encoder.layer.weight).
        if (v->state->kind == Value::Kind::kDict) {
          for (auto& [k, val] : v->state->entries) child(k ? path_component(*k) : "?", val);
        } else {
          walk(v->state, path, tensors, named, depth + 1, max_depth, seen);
        }
      }
      return;
    default:
      return;
  }
}

}  // namespace

void name_tensors(const ValuePtr& root, std::vector<TensorInfo>& tensors, uint32_t max_depth) {
  std::vector<uint8_t> named(tensors.size(), 0);
  std::string path;
  std::unordered_set<const Value*> seen;
  walk(root, path, tensors, named, 0, max_depth, seen);
  for (size_t i = 0; i < tensors.size(); ++i)
    if (!named[i] && tensors[i].name.empty()) tensors[i].name = "<unnamed>." + std::to_string(i);
}

TorchPickle unpickle_torch(std::span<const std::byte> data, const TorchUnpickleOptions& options,
                           size_t* consumed) {
  Builder b(options);
  return b.run(data, consumed);
}

}  // namespace ckpt::internal
