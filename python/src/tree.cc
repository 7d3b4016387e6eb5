// The object tree <-> Python objects. Containers and scalars become the Python builtins they
// were pickled from; what is not a builtin goes through ckpt._tree (python/ckpt/_tree.py), which
// makes torch/numpy objects it knows (torch.Size, dtypes, devices, numpy scalars) and
// ckpt.Opaque / ckpt.Global for everything else: no class named by a file is ever called.

#include <pybind11/pybind11.h>

#include <algorithm>
#include <string>

#include "binding.h"

namespace ckpt::py {
namespace {

using Kind = Value::Kind;

class ToPython {
 public:
  ToPython(const pyb::list& tensors, const pyb::module_& helpers, uint32_t max_depth)
      : tensors_(tensors), h_(helpers), max_depth_(max_depth) {}

  pyb::object build(const Value& v, uint32_t depth) {
    if (depth > max_depth_)
      throw Error(ErrorCode::kLimitExceeded, "object tree nested deeper than " +
                                                 std::to_string(max_depth_) +
                                                 " levels (Limits::max_pickle_depth)");
    // Scalars carry no identity worth keeping; containers and objects do (a list reached twice
    // is one list, as pickle's memo makes it).
    switch (v.kind()) {
      case Kind::kNone:
        return pyb::none();
      case Kind::kBool:
        return with_origin(v, pyb::bool_(v.as_bool()), depth);
      case Kind::kInt:
        if (v.is_big_int())
          return pyb::reinterpret_steal<pyb::object>(
              PyLong_FromString(v.str().c_str(), nullptr, 10));
        return with_origin(v, pyb::int_(v.as_int()), depth);
      case Kind::kFloat:
        return with_origin(v, pyb::float_(v.as_float()), depth);
      case Kind::kComplex: {
        auto c = v.as_complex();
        return with_origin(
            v, pyb::reinterpret_steal<pyb::object>(PyComplex_FromDoubles(c.real(), c.imag())),
            depth);
      }
      case Kind::kString: {
        // pickle's own decoding (surrogatepass): text that is not UTF-8 is a corrupt file.
        PyObject* s = PyUnicode_DecodeUTF8(v.str().data(), static_cast<Py_ssize_t>(v.str().size()),
                                           "surrogatepass");
        if (!s) {
          PyErr_Clear();
          throw Error(ErrorCode::kCorrupt, "a string that is not UTF-8: " + v.repr(40));
        }
        return pyb::reinterpret_steal<pyb::object>(s);
      }
      case Kind::kBytes:
        if (v.is_bytearray())
          return pyb::reinterpret_steal<pyb::object>(PyByteArray_FromStringAndSize(
              v.str().data(), static_cast<Py_ssize_t>(v.str().size())));
        return pyb::bytes(v.str());
      default:
        break;
    }
    if (v.kind() == Kind::kTensor && !v.origin()) {
      // The list entry itself (one object per tensor already): no memo entry, which on a
      // 20,000-tensor state dict was a hash-map insert per tensor.
      size_t i = v.tensor_index();
      if (i >= tensors_.size()) throw Error(ErrorCode::kCorrupt, "tensor reference out of range");
      return pyb::reinterpret_borrow<pyb::object>(PyList_GET_ITEM(tensors_.ptr(), i));
    }
    if (auto it = memo_.find(&v); it != memo_.end()) return it->second;
    pyb::object out;
    switch (v.kind()) {
      case Kind::kList: {
        pyb::list l;
        memo_[&v] = l;  // before the children: a list may contain itself
        for (auto& x : v.items()) l.append(build(*x, depth + 1));
        out = l;
        break;
      }
      case Kind::kTuple: {
        pyb::tuple t(v.items().size());
        for (size_t i = 0; i < v.items().size(); ++i) t[i] = build(*v.items()[i], depth + 1);
        out = t;
        break;
      }
      case Kind::kSet: {
        pyb::list items;
        for (auto& x : v.items()) items.append(build(*x, depth + 1));
        out = h_.attr("make_set")(items, v.is_frozenset());
        break;
      }
      case Kind::kDict: {
        pyb::list args;
        for (auto& x : v.items()) args.append(build(*x, depth + 1));
        pyb::object d = v.module().empty()
                            ? pyb::dict()
                            : h_.attr("make_dict")(text(v.module()), text(v.name()), args);
        memo_[&v] = d;
        for (auto& [k, x] : v.entries()) {
          pyb::object key = build(*k, depth + 1);
          pyb::object val = build(*x, depth + 1);
          if (PyObject_SetItem(d.ptr(), key.ptr(), val.ptr()) != 0) {
            PyErr_Clear();
            throw Error(ErrorCode::kCorrupt, "a dict key that Python cannot hash: " + k->repr());
          }
        }
        if (v.state()) h_.attr("set_state")(d, build(*v.state(), depth + 1));
        out = d;
        break;
      }
      case Kind::kTensor: {
        size_t i = v.tensor_index();
        if (i >= tensors_.size()) throw Error(ErrorCode::kCorrupt, "tensor reference out of range");
        out = tensors_[i];
        if (v.origin()) out = h_.attr("tensor_with_origin")(out, build(*v.origin(), depth + 1));
        break;
      }
      case Kind::kGlobal:
        out = h_.attr("make_global")(text(v.module()), text(v.name()), v.foreign());
        break;
      case Kind::kObject: {
        pyb::tuple args(v.items().size());
        for (size_t i = 0; i < v.items().size(); ++i) args[i] = build(*v.items()[i], depth + 1);
        pyb::object state = v.state() ? build(*v.state(), depth + 1) : pyb::none();
        pyb::list appended;
        for (auto& x : v.appended()) appended.append(build(*x, depth + 1));
        pyb::list entries;
        for (auto& [k, x] : v.entries())
          entries.append(pyb::make_tuple(build(*k, depth + 1), build(*x, depth + 1)));
        out = h_.attr("make_object")(
            text(v.module()), text(v.name()), args, state, appended, entries,
            v.call() == Value::Call::kNewObj ? "newobj" : "reduce", v.foreign());
        break;
      }
      default:
        throw Error(ErrorCode::kUnsupported, "a value of an unknown kind");
    }
    memo_[&v] = out;
    return out;
  }

 private:
  // A number read from a numpy scalar call: ckpt._tree makes the numpy scalar again.
  pyb::object with_origin(const Value& v, pyb::object value, uint32_t depth) {
    if (!v.origin()) return value;
    return h_.attr("scalar_with_origin")(value, build(*v.origin(), depth + 1));
  }

  const pyb::list& tensors_;
  const pyb::module_& h_;
  uint32_t max_depth_;
  std::unordered_map<const Value*, pyb::object> memo_;
};

std::vector<int64_t> int_list(pyb::handle seq) {
  std::vector<int64_t> out;
  for (auto x : seq) out.push_back(x.cast<int64_t>());
  return out;
}

}  // namespace

pyb::object tree_to_python(const Value& root, const pyb::list& tensors, const pyb::module_& helpers,
                           uint32_t max_depth) {
  // build() takes a stack frame per level: whatever the caller asks, no deeper than the default
  // limit (the depth Python itself recurses to by default).
  ToPython t(tensors, helpers, std::min(max_depth, Limits{}.max_pickle_depth));
  return t.build(root, 0);
}

// --- Python -> Value (ckpt.save) ------------------------------------------------------------

ValuePtr PyToValue::tensor(pyb::handle obj, const pyb::tuple& d) {
  // (key, address, nbytes, dtype, shape, strides, offset, requires_grad, is_parameter, keep,
  //  quantization or None, meta)
  if (auto it = tensor_of_.find(obj.ptr()); it != tensor_of_.end())
    return Value::tensor(it->second);
  keep.append(d);
  auto key = d[0].cast<uintptr_t>();
  auto address = d[1].cast<uintptr_t>();
  auto nbytes = d[2].cast<uint64_t>();
  auto dtype = dtype_from_name(d[3].cast<std::string>());
  if (!dtype) throw Error(ErrorCode::kUnsupported, "dtype " + d[3].cast<std::string>());
  StoragePtr& st = storages_[key];
  if (!st) {
    st = std::make_shared<Storage>();
    st->info.key = std::to_string(storages_.size() - 1);
    st->info.dtype = *dtype;
    st->info.nbytes = nbytes;
    st->data = reinterpret_cast<const std::byte*>(address);
    if (d.size() > 11 && d[11].cast<bool>()) {  // a meta tensor: no bytes
      st->info.meta = true;
      st->info.device = "meta";
    }
  }
  TensorInfo info;
  info.name = std::to_string(tensors.size());
  info.dtype = *dtype;
  info.shape = int_list(d[4]);
  info.strides = int_list(d[5]);
  info.storage_offset = d[6].cast<int64_t>();
  info.requires_grad = d[7].cast<bool>();
  info.is_parameter = d[8].cast<bool>();
  if (d.size() > 10 && !d[10].is_none()) {
    // (scheme, scale, zero_point, axis, scales tensor or None, zero points tensor or None)
    auto q = d[10].cast<pyb::tuple>();
    Quantization z;
    z.scheme = q[0].cast<std::string>();
    z.scale = q[1].cast<double>();
    z.zero_point = q[2].cast<int64_t>();
    z.axis = q[3].cast<int64_t>();
    for (int k : {4, 5}) {
      if (q[k].is_none()) continue;
      ValuePtr v = convert(q[k]);
      if (v->kind() != Value::Kind::kTensor)
        throw Error(ErrorCode::kInvalidArgument, "quantization parameters are not tensors");
      (k == 4 ? z.scales_tensor : z.zero_points_tensor) = v->tensor_index();
    }
    info.quantization = z;
  }
  size_t index = tensors.size();
  tensors.emplace_back(std::move(info), st);
  tensor_of_[obj.ptr()] = index;
  keep.append(obj);
  return Value::tensor(index);
}

void PyToValue::convert_items(pyb::handle seq, std::vector<ValuePtr>& out, uint32_t depth) {
  size_t i = 0;
  try {
    for (auto x : seq) {
      out.push_back(convert(x, depth + 1));
      ++i;
    }
  } catch (...) {
    where_.push_back("[" + std::to_string(i) + "]");
    throw;
  }
}

void PyToValue::convert_entries(pyb::handle pairs, std::vector<std::pair<ValuePtr, ValuePtr>>& out,
                                uint32_t depth) {
  pyb::handle at;
  try {
    for (auto x : pairs) {
      auto kv = x.cast<pyb::tuple>();
      at = kv[0];
      out.emplace_back(convert(kv[0], depth + 1), convert(kv[1], depth + 1));
    }
  } catch (...) {
    where_.push_back(key_segment(at));
    throw;
  }
}

std::string PyToValue::key_segment(pyb::handle key) {
  if (!key) return "[?]";
  if (PyUnicode_Check(key.ptr())) {
    Py_ssize_t n = 0;
    const char* s = PyUnicode_AsUTF8AndSize(key.ptr(), &n);
    if (s) return "." + std::string(s, static_cast<size_t>(n));
    PyErr_Clear();
  }
  PyObject* r = PyObject_Repr(key.ptr());
  if (!r) {
    PyErr_Clear();
    return "[?]";
  }
  std::string out = "[" + pyb::reinterpret_steal<pyb::str>(r).cast<std::string>() + "]";
  return out;
}

std::string PyToValue::path() const {
  std::string out;
  for (auto it = where_.rbegin(); it != where_.rend(); ++it) out += *it;
  if (!out.empty() && out[0] == '.') out.erase(0, 1);
  return out;
}

namespace {

// A reference cycle is refused: the library reads none (a checkpoint never holds one), so a file
// holding one could not be read back by ckpt, and safetensors and DCP cannot store one.
constexpr const char* kCycle =
    "the object contains itself (a reference cycle): ckpt does not write cycles, as it does not "
    "read them";

// Marks `p` as being converted while it lives.
struct OpenGuard {
  std::unordered_set<PyObject*>& open;
  PyObject* p;
  OpenGuard(std::unordered_set<PyObject*>& o, PyObject* obj) : open(o), p(obj) { open.insert(p); }
  ~OpenGuard() { open.erase(p); }
};

}  // namespace

ValuePtr PyToValue::convert(pyb::handle obj, uint32_t depth) {
  if (depth > Limits{}.max_pickle_depth)
    throw Error(
        ErrorCode::kLimitExceeded,
        "object nested deeper than " + std::to_string(Limits{}.max_pickle_depth) + " levels");
  PyObject* p = obj.ptr();
  if (obj.is_none()) return Value::none();
  if (PyBool_Check(p)) return Value::boolean(p == Py_True);
  if (PyLong_CheckExact(p)) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(p, &overflow);
    if (overflow) return Value::big_integer(pyb::str(obj).cast<std::string>());
    return Value::integer(x);
  }
  if (PyFloat_CheckExact(p)) return Value::real(PyFloat_AsDouble(p));
  if (PyComplex_CheckExact(p))
    return Value::complex({PyComplex_RealAsDouble(p), PyComplex_ImagAsDouble(p)});
  if (PyUnicode_CheckExact(p)) {
    Py_ssize_t n = 0;
    PyObject* b = PyUnicode_AsEncodedString(p, "utf-8", "surrogatepass");
    if (!b) throw pyb::error_already_set();
    auto bytes = pyb::reinterpret_steal<pyb::bytes>(b);
    (void)n;
    return Value::string(bytes.cast<std::string>());
  }
  if (PyBytes_CheckExact(p)) return Value::bytes(pyb::reinterpret_borrow<pyb::bytes>(obj));
  if (PyByteArray_CheckExact(p))
    return Value::bytes(std::string(PyByteArray_AsString(p), PyByteArray_Size(p)), true);
  if (open_.count(p)) throw Error(ErrorCode::kInvalidArgument, kCycle);
  if (auto it = memo_.find(p); it != memo_.end()) return it->second;
  OpenGuard guard(open_, p);
  ValuePtr out;
  if (PyList_CheckExact(p)) {
    out = Value::list();
    memo_[p] = out;
    convert_items(obj, out->items(), depth);
  } else if (PyTuple_CheckExact(p)) {
    std::vector<ValuePtr> items;
    convert_items(obj, items, depth);
    out = Value::tuple(std::move(items));
  } else if (PyDict_CheckExact(p)) {
    out = Value::dict();
    memo_[p] = out;
    pyb::handle at;
    try {
      for (auto [k, x] : pyb::reinterpret_borrow<pyb::dict>(obj)) {
        at = k;
        out->entries().emplace_back(convert(k, depth + 1), convert(x, depth + 1));
      }
    } catch (...) {
      where_.push_back(key_segment(at));
      throw;
    }
  } else if (PySet_CheckExact(p) || PyFrozenSet_CheckExact(p)) {
    std::vector<ValuePtr> items;
    convert_items(obj, items, depth);
    out = PySet_CheckExact(p) ? Value::set(std::move(items)) : Value::frozenset(std::move(items));
  } else {
    // Everything else is described by ckpt._tree.describe: ("tensor", tuple),
    // ("dict", module, name, items, state, args), ("global", module, name, foreign),
    // ("object", module, name, args, state, appended, entries, call, foreign).
    pyb::tuple d = helpers.attr("describe")(obj, flat);
    std::string what = d[0].cast<std::string>();
    if (what == "tensor") return tensor(obj, d[1]);
    if (what == "dict") {
      out = Value::dict_of(d[1].cast<std::string>(), d[2].cast<std::string>());
      memo_[p] = out;
      convert_entries(d[3], out->entries(), depth);
      if (!d[4].is_none()) out->set_state(convert(d[4], depth + 1));
      if (d.size() > 5) convert_items(d[5], out->items(), depth);
    } else if (what == "global") {
      out = Value::global(d[1].cast<std::string>(), d[2].cast<std::string>());
      out->set_foreign(d[3].cast<bool>());
    } else if (what == "object") {
      std::vector<ValuePtr> args;
      convert_items(d[3], args, depth);
      out = Value::object(d[1].cast<std::string>(), d[2].cast<std::string>(), std::move(args));
      memo_[p] = out;
      if (!d[4].is_none()) out->set_state(convert(d[4], depth + 1));
      convert_items(d[5], out->appended(), depth);
      convert_entries(d[6], out->entries(), depth);
      out->set_call(d[7].cast<std::string>() == "newobj" ? Value::Call::kNewObj
                                                         : Value::Call::kReduce);
      out->set_foreign(d[8].cast<bool>());
    } else {
      throw Error(ErrorCode::kInvalidArgument,
                  "cannot save an object of type " +
                      pyb::str(pyb::type::handle_of(obj).attr("__qualname__")).cast<std::string>());
    }
  }
  memo_[p] = out;
  keep.append(obj);  // memo keys are addresses: keep the objects alive while converting
  return out;
}

}  // namespace ckpt::py
