#include "ckpt/tensor.h"

#include <cstring>

#include "ckpt/error.h"

namespace ckpt {

uint64_t TensorInfo::numel() const noexcept {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

uint64_t TensorInfo::nbytes() const noexcept { return dtype_nbytes(dtype, numel()).value_or(0); }

bool TensorInfo::is_contiguous() const noexcept {
  if (numel() <= 1) return true;
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

uint64_t TensorInfo::byte_offset() const noexcept {
  return dtype_nbytes(dtype, static_cast<uint64_t>(storage_offset)).value_or(0);
}

uint64_t TensorInfo::byte_extent() const noexcept {
  if (numel() == 0) return 0;
  uint64_t last = 0;
  for (size_t i = 0; i < shape.size(); ++i)
    last += static_cast<uint64_t>(shape[i] - 1) * static_cast<uint64_t>(strides[i]);
  auto n = dtype_nbytes(dtype, last + 1);
  return n.value_or(0);
}

std::vector<int64_t> contiguous_strides(std::span<const int64_t> shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i] > 0 ? shape[i] : 1;
  }
  return strides;
}

Tensor Tensor::from_bytes(std::string name, DType dtype, std::vector<int64_t> shape,
                          std::span<const std::byte> bytes, std::shared_ptr<const void> owner) {
  TensorInfo info;
  info.name = std::move(name);
  info.dtype = dtype;
  info.strides = contiguous_strides(shape);
  info.shape = std::move(shape);
  for (int64_t d : info.shape)
    if (d < 0) throw Error(ErrorCode::kInvalidArgument, "negative dimension", {}, info.name);
  auto need = dtype_nbytes(dtype, info.numel());
  if (!need || *need != bytes.size())
    throw Error(ErrorCode::kInvalidArgument,
                "tensor needs " + (need ? std::to_string(*need) : std::string("?")) +
                    " bytes, got " + std::to_string(bytes.size()),
                {}, info.name);
  auto st = std::make_shared<Storage>();
  st->info.key = info.name;
  st->info.dtype = dtype;
  st->info.nbytes = bytes.size();
  st->data = bytes.data();
  st->owner = std::move(owner);
  return Tensor(std::move(info), std::move(st));
}

Tensor Tensor::copy_of(std::string name, DType dtype, std::vector<int64_t> shape,
                       std::span<const std::byte> bytes) {
  auto buf = std::make_shared<std::vector<std::byte>>(bytes.begin(), bytes.end());
  std::span<const std::byte> view(buf->data(), buf->size());
  Tensor t = from_bytes(std::move(name), dtype, std::move(shape), view, buf);
  t.storage()->writable = true;
  return t;
}

std::span<std::byte> Storage::mutable_bytes() {
  if (!writable)
    throw Error(ErrorCode::kInvalidArgument,
                "storage is a read-only view (of a mapped file or caller memory); load with "
                "LoadOptions::copy to change it",
                {}, info.key);
  return {const_cast<std::byte*>(data), info.nbytes};
}

const std::byte* Tensor::data() const noexcept {
  return storage_ && storage_->data ? storage_->data + info_.byte_offset() : nullptr;
}

namespace {
void require_host(const StoragePtr& st, const std::string& name) {
  if (st && !st->on_host())
    throw Error(
        ErrorCode::kInvalidArgument,
        "tensor is in " + st->device.str() + " memory: its bytes cannot be read on the host", {},
        name);
}
}  // namespace

std::span<const std::byte> Tensor::bytes() const {
  require_host(storage_, info_.name);
  if (!info_.is_contiguous())
    throw Error(ErrorCode::kInvalidArgument, "tensor is not contiguous", {}, info_.name);
  return {data(), info_.nbytes()};
}

std::vector<std::byte> Tensor::contiguous_bytes() const {
  require_host(storage_, info_.name);
  std::vector<std::byte> out(info_.nbytes());
  if (out.empty()) return out;
  if (info_.is_contiguous()) {
    std::memcpy(out.data(), data(), out.size());
    return out;
  }
  const size_t es = dtype_size(info_.dtype);
  const size_t nd = info_.shape.size();
  std::vector<int64_t> idx(nd, 0);
  const std::byte* base = data();
  for (uint64_t n = 0, total = info_.numel(); n < total; ++n) {
    int64_t off = 0;
    for (size_t d = 0; d < nd; ++d) off += idx[d] * info_.strides[d];
    std::memcpy(out.data() + n * es, base + off * es, es);
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < info_.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

}  // namespace ckpt
