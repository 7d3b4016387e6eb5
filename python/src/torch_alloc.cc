// Device memory of Python loads from torch's caching allocator (torch.cuda.caching_allocator_alloc
// and _delete): one allocation per storage (LoadOptions::allocator), so the tensors of a device
// load free one by one as torch's own do, and torch.cuda.memory_allocated() counts them.
//
// A load asks for its storages in plan order in a few batches (allocate_all, on the loading
// thread, while its readers read the first storages): the GIL is taken and the device's current
// stream looked up once per batch, torch's functions once per process. Frees come one by one,
// each with the GIL.
// CKPT_DEVICE_ARENA=1 in the environment makes Python device loads use the library's one
// allocation per load instead (the tensors then free together; for benchmarks: bench/device.py).

#include <Python.h>

#include <cstdlib>
#include <cstring>

#include "binding.h"

namespace ckpt::py {
namespace {

// torch.cuda.<name>, a reference kept for the process's life (never released: the interpreter
// may be gone when the last tensor dies). Needs the GIL.
PyObject* torch_cuda(const char* name) {
  pyb::object f = pyb::module_::import("torch.cuda").attr(name);
  return f.release().ptr();
}

class TorchAllocator : public DeviceAllocator {
 public:
  void* allocate(uint64_t bytes, const Device& device) override {
    void* out = nullptr;
    allocate_all(std::span<const uint64_t>(&bytes, 1), device, std::span<void*>(&out, 1));
    return out;
  }
  void allocate_all(std::span<const uint64_t> sizes, const Device& device,
                    std::span<void*> out) override {
    pyb::gil_scoped_acquire gil;
    static PyObject* alloc = torch_cuda("caching_allocator_alloc");
    static PyObject* current_stream = torch_cuda("current_stream");
    pyb::handle fn(alloc);
    pyb::object stream = pyb::reinterpret_borrow<pyb::object>(current_stream)(device.index);
    for (size_t i = 0; i < sizes.size(); ++i)
      out[i] = reinterpret_cast<void*>(fn(sizes[i], device.index, stream).cast<uintptr_t>());
  }
  void free(void* p, uint64_t, const Device&) noexcept override {
    if (!Py_IsInitialized()) return;  // the process is ending: the runtime frees everything
    pyb::gil_scoped_acquire gil;
    try {
      static PyObject* release = torch_cuda("caching_allocator_delete");
      pyb::handle fn(release);
      fn(reinterpret_cast<uintptr_t>(p));
    } catch (pyb::error_already_set& e) {
      e.discard_as_unraisable("ckpt: freeing device memory");
    }
  }
};

}  // namespace

std::shared_ptr<DeviceAllocator> torch_device_allocator(const Device& device) {
  if (!device.is_cuda()) return nullptr;
  if (const char* e = std::getenv("CKPT_DEVICE_ARENA"); e && std::strcmp(e, "1") == 0)
    return nullptr;
  pyb::gil_scoped_acquire gil;
  // Only where torch is already imported with its caching allocator (a device load in Python
  // makes torch tensors, so it is); otherwise the load's own arena.
  PyObject* mods = PySys_GetObject("modules");
  if (!mods || !PyDict_GetItemString(mods, "torch.cuda")) return nullptr;
  static auto allocator = std::make_shared<TorchAllocator>();
  return allocator;
}

}  // namespace ckpt::py
