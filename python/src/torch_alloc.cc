// Device memory of Python loads from torch's caching allocator (torch.cuda.caching_allocator_alloc
// and _delete): one allocation per storage (LoadOptions::allocator), so the tensors of a device
// load free one by one as torch's own do, and torch.cuda.memory_allocated() counts them.

#include <Python.h>

#include "binding.h"

namespace ckpt::py {
namespace {

class TorchAllocator : public DeviceAllocator {
 public:
  void* allocate(uint64_t bytes, const Device& device) override {
    pyb::gil_scoped_acquire gil;
    pyb::object p =
        pyb::module_::import("torch.cuda").attr("caching_allocator_alloc")(bytes, device.index);
    return reinterpret_cast<void*>(p.cast<uintptr_t>());
  }
  void free(void* p, uint64_t, const Device&) noexcept override {
    if (!Py_IsInitialized()) return;  // the process is ending: the runtime frees everything
    pyb::gil_scoped_acquire gil;
    try {
      pyb::module_::import("torch.cuda")
          .attr("caching_allocator_delete")(reinterpret_cast<uintptr_t>(p));
    } catch (pyb::error_already_set& e) {
      e.discard_as_unraisable("ckpt: freeing device memory");
    }
  }
};

}  // namespace

std::shared_ptr<DeviceAllocator> torch_device_allocator(const Device& device) {
  if (!device.is_cuda()) return nullptr;
  pyb::gil_scoped_acquire gil;
  // Only where torch is already imported with its caching allocator (a device load in Python
  // makes torch tensors, so it is); otherwise the load's own arena.
  PyObject* mods = PySys_GetObject("modules");
  if (!mods || !PyDict_GetItemString(mods, "torch.cuda")) return nullptr;
  static auto allocator = std::make_shared<TorchAllocator>();
  return allocator;
}

}  // namespace ckpt::py
