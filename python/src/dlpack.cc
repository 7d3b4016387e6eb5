// torch tensors over a load's memory through DLPack (torch._C._from_dlpack), for the common
// case of a tensor that is the whole of its storage.
//
// torch.frombuffer parses its arguments, takes a Py_buffer from the Span and frees the tensor
// under the GIL; _from_dlpack takes one capsule (METH_O) and calls our deleter, which touches
// no Python object, when torch frees the storage. The memory's owner (the eager load's arena or
// the private file mapping) is held by the capsule's context as a shared_ptr, as the Span holds
// it. Only for dtypes torch has had DLPack codes for since 1.x and writable memory; anything
// else returns "not applicable" and goes through frombuffer as before.

#include <dlpack/dlpack.h>

#include "binding.h"

namespace ckpt::py {
namespace {

constexpr int kMaxDims = 8;

struct Context {
  DLManagedTensor managed{};
  std::shared_ptr<const void> owner;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};
};

void delete_context(DLManagedTensor* m) { delete static_cast<Context*>(m->manager_ctx); }

// A capsule torch never consumed (its name is still "dltensor") frees its tensor here.
void drop_capsule(PyObject* cap) {
  if (!PyCapsule_IsValid(cap, "dltensor")) return;
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
  if (m && m->deleter) m->deleter(m);
}

bool dl_type(DType d, DLDataType* out) {
  const DTypeInfo& i = dtype_info(d);
  uint8_t code;
  switch (d) {
    case DType::kFloat16: case DType::kFloat32: case DType::kFloat64:
      code = kDLFloat;
      break;
    case DType::kBFloat16:
      code = kDLBfloat;
      break;
    case DType::kComplex64: case DType::kComplex128:
      code = kDLComplex;
      break;
    case DType::kInt8: case DType::kInt16: case DType::kInt32: case DType::kInt64:
      code = kDLInt;
      break;
    case DType::kUInt8:
      code = kDLUInt;
      break;
    default:
      return false;  // bool, uint16+, float8, quantized...: torch 1.13 has no DLPack code
  }
  *out = DLDataType{code, static_cast<uint8_t>(i.bits), 1};
  return true;
}

}  // namespace

PyObject* dlpack_tensor(const std::byte* data, size_t n, const std::shared_ptr<const void>& owner,
                        const TensorInfo& t, PyObject* from_dlpack) {
  DLDataType type;
  if (!data || !owner || !dl_type(t.dtype, &type) || t.shape.size() > kMaxDims ||
      t.storage_offset != 0 || !t.is_contiguous())
    return nullptr;
  uint64_t numel = 1;
  for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
  if (numel == 0 || numel * (type.bits / 8) != n) return nullptr;  // not the whole storage
  auto* c = new Context;
  c->owner = owner;
  const int nd = static_cast<int>(t.shape.size());
  for (int k = 0; k < nd; ++k) {
    c->shape[k] = t.shape[k];
    c->strides[k] = t.strides[k];
  }
  DLTensor& d = c->managed.dl_tensor;
  d.data = const_cast<std::byte*>(data);
  d.device = DLDevice{kDLCPU, 0};
  d.ndim = nd;
  d.dtype = type;
  d.shape = c->shape;
  d.strides = c->strides;
  d.byte_offset = 0;
  c->managed.manager_ctx = c;
  c->managed.deleter = delete_context;
  PyObject* cap = PyCapsule_New(&c->managed, "dltensor", drop_capsule);
  if (!cap) {
    delete c;
    throw pyb::error_already_set();
  }
  PyObject* tensor = PyObject_CallOneArg(from_dlpack, cap);
  Py_DECREF(cap);  // consumed by torch (renamed "used_dltensor"), or freed by drop_capsule
  if (!tensor) PyErr_Clear();  // the caller makes it through frombuffer and reports any error
  return tensor;
}

PyObject* dlpack_tensor(PyObject* span, const TensorInfo& t, PyObject* from_dlpack) {
  size_t n = 0;
  const std::byte* data = span_data(span, &n);
  const std::shared_ptr<const void>* owner = span_owner(span);
  if (!data || !owner || !span_writable(span)) return nullptr;
  return dlpack_tensor(data, n, *owner, t, from_dlpack);
}

}  // namespace ckpt::py
