#pragma once
// TensorInfo (what a checkpoint says about a tensor), Storage (bytes shared by views) and Tensor.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ckpt/device.h"
#include "ckpt/dtype.h"

namespace ckpt {

inline constexpr uint64_t kNoOffset = UINT64_MAX;

// A storage as the checkpoint describes it: a run of bytes that tensors view.
// StorageInfo, Quantization and TensorInfo are plain values: copies are independent.
struct StorageInfo {
  std::string key;  // torch record key ("0"), or the tensor name for one-storage-per-tensor formats
  DType dtype = DType::kUInt8;  // element type of the storage (uint8 for torch.UntypedStorage)
  uint64_t nbytes = 0;
  uint64_t offset = kNoOffset;  // absolute byte offset in the source; kNoOffset when not stored raw
  std::string record;           // container record name ("archive/data/0"), if any
  std::optional<uint32_t> crc32;  // expected CRC32 of the storage bytes, if the format stores one
  std::string device = "cpu";     // where it was saved from
  bool byteswap = false;          // stored in the other byte order; loads swap elements of `dtype`
  bool meta = false;              // no bytes in the file (meta tensors); loads as zeros
};

// Quantization parameters of a quantized tensor.
struct Quantization {
  std::string scheme;  // "per_tensor_affine", "per_channel_affine", ...
  double scale = 0;
  int64_t zero_point = 0;
  int64_t axis = 0;
  // Per-channel: indices of the scales and zero points tensors in the checkpoint's tensor table.
  std::optional<size_t> scales_tensor, zero_points_tensor;
};

struct TensorInfo {
  std::string name;  // dotted path in the object tree ("state.0.exp_avg", "model.layers.0.weight")
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;  // in elements
  int64_t storage_offset = 0;    // in elements
  size_t storage = 0;            // index into Checkpoint::storages()
  bool requires_grad = false;
  bool is_parameter = false;
  std::optional<Quantization> quantization;
  std::string type;  // format-specific kind (tensorizer: "param", "buffer", "state_dict")

  // Element count (0 for empty tensors, 1 for 0-d). Overflow was checked when the file was read.
  uint64_t numel() const noexcept;
  // Bytes the elements occupy when contiguous: numel * element size.
  uint64_t nbytes() const noexcept;
  bool is_contiguous() const noexcept;
  // Byte offset of the first element within the storage.
  uint64_t byte_offset() const noexcept;
  // Bytes of storage the view reaches, from byte_offset(): 0 if empty, else
  // (1 + sum((shape[i]-1)*strides[i])) * element size. Requires non-negative strides.
  uint64_t byte_extent() const noexcept;
};

// Contiguous row-major strides for `shape`.
std::vector<int64_t> contiguous_strides(std::span<const int64_t> shape);

// Bytes that tensors view. Views of one storage share one Storage object. A Storage is not
// synchronized: threads may read it at once; whoever writes through mutable_bytes() must make
// sure nobody reads meanwhile.
struct Storage {
  StorageInfo info;
  const std::byte* data = nullptr;  // nbytes bytes, valid while `owner` lives
  std::shared_ptr<const void> owner;
  // Where `data` is: host memory, or a device's (LoadOptions::device). A device address is never
  // dereferenced on the host: bytes() is for host storages only, and Tensor::bytes() and
  // contiguous_bytes() throw Error{kInvalidArgument} for a device one (a device storage is
  // never writable, so mutable_bytes() refuses it too).
  Device device;
  // True when `data` is memory allocated for this storage (an eager load, a copy, a stream's
  // ring slot during the callback) or a view of a writable copy-on-write mapping
  // (ByteSource::memory_writable); false for other views into a mapped file or caller memory.
  bool writable = false;

  std::span<const std::byte> bytes() const noexcept { return {data, info.nbytes}; }
  bool on_host() const noexcept { return device.is_cpu(); }
  // The bytes, for changing in place. Throws Error{kInvalidArgument} when !writable (load with
  // LoadOptions::copy, or copy the bytes, to change a mapped file's tensor).
  std::span<std::byte> mutable_bytes();
};
using StoragePtr = std::shared_ptr<Storage>;

// A Tensor is a value holding a shared Storage: copying it shares the bytes (a view), and the
// bytes stay valid while any copy lives. Concurrent reads are safe; see Storage for writes.
class Tensor {
 public:
  Tensor() = default;
  Tensor(TensorInfo info, StoragePtr storage)
      : info_(std::move(info)), storage_(std::move(storage)) {}

  // A contiguous tensor over caller memory (no copy). The bytes must stay valid while `owner`
  // (may be null: then the caller keeps them alive as long as the tensor is used).
  // Throws Error{kInvalidArgument} when bytes.size() != numel * element size.
  static Tensor from_bytes(std::string name, DType dtype, std::vector<int64_t> shape,
                           std::span<const std::byte> bytes,
                           std::shared_ptr<const void> owner = {});
  // Same, with a copy of the bytes that the tensor owns.
  static Tensor copy_of(std::string name, DType dtype, std::vector<int64_t> shape,
                        std::span<const std::byte> bytes);

  const TensorInfo& info() const noexcept { return info_; }
  TensorInfo& info() noexcept { return info_; }
  const std::string& name() const noexcept { return info_.name; }
  DType dtype() const noexcept { return info_.dtype; }
  const std::vector<int64_t>& shape() const noexcept { return info_.shape; }
  const StoragePtr& storage() const noexcept { return storage_; }
  // Address of the first element (storage data + byte_offset()).
  const std::byte* data() const noexcept;
  // The elements' bytes when the tensor is contiguous. Throws Error{kInvalidArgument} otherwise.
  std::span<const std::byte> bytes() const;
  // A contiguous copy of the elements (row-major), whatever the strides.
  std::vector<std::byte> contiguous_bytes() const;

 private:
  TensorInfo info_;
  StoragePtr storage_;
};

}  // namespace ckpt
