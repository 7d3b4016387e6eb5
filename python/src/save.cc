// _ckpt.save_torch / save_safetensors / save_tensorizer: Python objects -> the object tree
// (tree.cc, PyToValue) -> the library's writers, the bytes written with the GIL released.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <string>
#include <vector>

#include "binding.h"

namespace ckpt::py {
namespace {

// items: [(name, tensor)], each tensor described by ckpt._tree.describe_tensor.
std::vector<Tensor> named_tensors(PyToValue& conv, const pyb::list& items) {
  std::vector<Tensor> out;
  for (auto it : items) {
    auto pair = it.cast<pyb::tuple>();
    ValuePtr v = conv.convert(pair[1]);
    if (v->kind() != Value::Kind::kTensor)
      throw Error(ErrorCode::kInvalidArgument, "not a tensor: " + pair[0].cast<std::string>());
    Tensor t = conv.tensors[v->tensor_index()];
    t.info().name = pair[0].cast<std::string>();
    out.push_back(std::move(t));
  }
  return out;
}

void save_torch_py(const std::string& path, pyb::handle obj, const pyb::module_& helpers,
                   uint32_t alignment, const std::string& archive_name) {
  PyToValue conv(helpers, false);
  ValuePtr root = conv.convert(obj);
  SaveOptions o;
  if (alignment) o.alignment = alignment;
  o.archive_name = archive_name;
  pyb::gil_scoped_release nogil;
  save_torch(path, root, conv.tensors, o);
}

void save_safetensors_py(const std::string& path, const pyb::list& items,
                         const std::map<std::string, std::string>& metadata,
                         const pyb::module_& helpers, uint64_t alignment) {
  PyToValue conv(helpers, true);
  std::vector<Tensor> tensors = named_tensors(conv, items);
  SafetensorsSaveOptions o;
  if (alignment) o.alignment = alignment;
  pyb::gil_scoped_release nogil;
  save_safetensors(path, tensors, metadata, o);
}

pyb::bytes save_tensorizer_py(const std::string& path, const pyb::list& items,
                              const pyb::module_& helpers, const std::string& key,
                              const std::string& password) {
  PyToValue conv(helpers, true);
  std::vector<Tensor> tensors = named_tensors(conv, items);
  TensorizerSaveOptions o;
  if (!key.empty()) {
    o.encryption = TensorizerEncryption::kKey;
    o.key = key;
  } else if (!password.empty()) {
    o.encryption = TensorizerEncryption::kPassword;
    o.password = password;
  }
  std::string raw_key;
  {
    pyb::gil_scoped_release nogil;
    raw_key = save_tensorizer(path, tensors, o);
  }
  return pyb::bytes(raw_key);
}

}  // namespace

void bind_save(pyb::module_& m) {
  m.def("save_torch", &save_torch_py);
  m.def("save_safetensors", &save_safetensors_py);
  m.def("save_tensorizer", &save_tensorizer_py);
}

}  // namespace ckpt::py
