#include "util/bytes.h"

#include "ckpt/error.h"

namespace ckpt::internal {

void Cursor::seek(size_t pos) {
  if (pos > data_.size())
    throw Error(ErrorCode::kTruncated,
                "seek to " + std::to_string(pos) + " past the end (" +
                    std::to_string(data_.size()) + " bytes)",
                source_, record_, base_ + pos_);
  pos_ = pos;
}

void Cursor::need(size_t n) const {
  if (n > data_.size() - pos_)
    throw Error(
        ErrorCode::kTruncated,
        "need " + std::to_string(n) + " bytes, " + std::to_string(data_.size() - pos_) + " remain",
        source_, record_, base_ + pos_);
}

void Cursor::fail(ErrorCode code, const std::string& message) const {
  throw Error(code, message, source_, record_, base_ + pos_);
}

}  // namespace ckpt::internal
