#pragma once
// GPUDirect Storage through NVIDIA's cuFile library, loaded at run time (dlopen) as the CUDA
// runtime is: nothing of it is needed to build ckpt. The CUDA engine's open_direct() uses it.
//
// Thread-safety: the library and its driver are opened once per process; a CuFile's read() may
// run on several threads at once.

#include <functional>
#include <memory>
#include <string>

#include "device/copy_engine.h"

namespace ckpt::internal {

// Why cuFile cannot be used ("" when its library loaded and its driver opened). Opens both on the
// first call: the library is CKPT_CUFILE when set (and only it), else libcufile.so.0,
// libcufile.so or /usr/local/cuda/lib64/libcufile.so.0.
std::string cufile_unavailable();
// Runs its argument with the engine's device current on the calling thread (and the caller's
// device restored after).
using OnDevice = std::function<void(const std::function<void()>&)>;
// Direct reads of `fd` into device memory, each within `on_device`. Null with `why` set when cuFile
// is unavailable or refuses the file (cuFileHandleRegister: a filesystem it does not support).
std::unique_ptr<DirectFile> open_cufile(int fd, OnDevice on_device, std::string& why);

}  // namespace ckpt::internal
