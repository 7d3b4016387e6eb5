#include "formats/torch/weights_only.h"

#include <algorithm>
#include <array>

namespace ckpt::internal {
namespace {

template <size_t N>
bool in(const std::array<std::string_view, N>& list, std::string_view s) {
  return std::find(list.begin(), list.end(), s) != list.end();
}

// Classes and functions named one by one (module.name).
constexpr std::array<std::string_view, 26> kExact = {
    "collections.OrderedDict",
    "collections.Counter",
    "torch.nn.parameter.Parameter",
    "torch.serialization._get_layout",
    "torch.Size",
    "torch.Tensor",
    "torch.device",
    "_codecs.encode",
    "builtins.bytearray",
    "builtins.set",
    "builtins.complex",
    "torch.storage.TypedStorage",
    "torch.storage.UntypedStorage",
    "torch._tensor._rebuild_from_type_v2",
    "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_tensor_v2",
    "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_parameter",
    "torch._utils._rebuild_parameter_with_state",
    "torch._utils._rebuild_qtensor",
    "torch._utils._rebuild_sparse_tensor",
    "torch._utils._rebuild_nested_tensor",
    "torch._utils._rebuild_meta_tensor_no_storage",
    "torch._utils._rebuild_wrapper_subclass",
    "torch._utils._rebuild_device_tensor_from_numpy",
    "torch._utils._rebuild_device_tensor_from_cpu_tensor",
};

// clang-format off
// torch.<dtype>: every dtype torch 2.x spells by name, the placeholder sub-byte ones included.
constexpr std::array<std::string_view, 47> kDTypes = {
    "float16", "float32", "float64", "bfloat16", "bool", "complex32", "complex64", "complex128",
    "bcomplex32",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
    "float4_e2m1fn_x2", "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
    "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2",
    "int1", "int2", "int3", "int4", "int5", "int6", "int7",
    "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7",
};

constexpr std::array<std::string_view, 5> kQSchemes = {
    "per_tensor_affine", "per_tensor_symmetric", "per_channel_affine", "per_channel_symmetric",
    "per_channel_affine_float_qparams",
};

// Element kinds of the legacy storage and tensor classes (torch.FloatStorage, torch.FloatTensor).
constexpr std::array<std::string_view, 12> kStorageKinds = {
    "BFloat16", "Bool", "Byte", "Char", "ComplexDouble", "ComplexFloat", "Double",
    "Float", "Half", "Int", "Long", "Short",
};
constexpr std::array<std::string_view, 5> kQuantizedStorageKinds = {
    "QInt32", "QInt8", "QUInt2x4", "QUInt4x2", "QUInt8",
};
constexpr std::array<std::string_view, 10> kTensorKinds = {
    "BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short",
};

// clang-format on

// `name` is <kind><suffix> with kind in `kinds`.
template <size_t N>
bool kind_with_suffix(const std::array<std::string_view, N>& kinds, std::string_view name,
                      std::string_view suffix) {
  if (name.size() <= suffix.size() || !name.ends_with(suffix)) return false;
  std::string_view kind = name.substr(0, name.size() - suffix.size());
  return !kind.empty() && in(kinds, kind);
}

}  // namespace

bool torch_weights_only_global(std::string_view module, std::string_view name) noexcept {
  for (std::string_view e : kExact) {
    if (e.size() == module.size() + 1 + name.size() && e.starts_with(module) &&
        e[module.size()] == '.' && e.ends_with(name))
      return true;
  }
  if (module == "torch") {
    return in(kDTypes, name) || in(kQSchemes, name) ||
           kind_with_suffix(kStorageKinds, name, "Storage") ||
           kind_with_suffix(kQuantizedStorageKinds, name, "Storage") ||
           kind_with_suffix(kTensorKinds, name, "Tensor");
  }
  if (module == "torch.cuda")
    return kind_with_suffix(kStorageKinds, name, "Storage") ||
           kind_with_suffix(kTensorKinds, name, "Tensor");
  if (module == "torch.sparse" || module == "torch.cuda.sparse")
    return name != "BoolTensor" && kind_with_suffix(kTensorKinds, name, "Tensor");
  return false;
}

}  // namespace ckpt::internal
