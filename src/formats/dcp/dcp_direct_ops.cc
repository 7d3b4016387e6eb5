// The direct `.metadata` reader's opcode loop (dcp_direct_vm.h): the opcodes torch's and ckpt's
// DCP writers use, each as the generic VM (pickle/unpickler.cc) runs it; any other gives up.

#include "formats/dcp/dcp_direct_vm.h"

namespace ckpt::internal::dcp_direct {

V Direct::loop() {
  while (pos_ < end_) {
    const size_t at = pos_;
    const uint8_t code = p_[pos_++];
    if (code == op::kStop) {
      const V v = pop();
      if (!stack_.empty() || !marks_.empty()) give_up();
      return v;
    }
    // The commonest opcodes (for 1,000 keys: 157 of every 490 are LONG_BINPUT, 65 BINUNICODE,
    // 57 memo gets) run here, without the two calls and switches below.
    switch (code) {
      case op::kLongBinPut:
        memo_put(le<uint32_t>());
        continue;
      case op::kBinUnicode:
        string(at, le<uint32_t>());
        continue;
      case op::kBinGet:
        memo_get(le<uint8_t>());
        continue;
      case op::kLongBinGet:
        memo_get(le<uint32_t>());
        continue;
      default:
        break;
    }
    // An opcode neither reads: the generic reader's.
    if (!value_op(code, at) && !structure_op(code, at)) give_up();
  }
  give_up();  // no STOP
}

// Framing and the opcodes that push one value.
bool Direct::value_op(uint8_t code, size_t at) {
  switch (code) {
    case op::kProto:
      if (le<uint8_t>() > 5) give_up();
      break;
    case op::kFrame:
      need(le<uint64_t>());
      break;
    case op::kNone:
      push(V::make(K::kNone, 0));
      break;
    case op::kNewTrue:
    case op::kNewFalse:
      push(V::make(K::kBool, p_[at] == op::kNewTrue));
      break;
    case op::kBinInt1:
      node();
      push(V::make(K::kInt, le<uint8_t>()));
      break;
    case op::kBinInt2:
      node();
      push(V::make(K::kInt, le<uint16_t>()));
      break;
    case op::kBinInt: {
      node();
      const int64_t v = le<int32_t>();
      push(V::make(K::kInt, static_cast<uint64_t>(v)));
      break;
    }
    case op::kLong1: {
      const uint8_t n = le<uint8_t>();
      need(n);
      if (n > 7) give_up();
      uint64_t v = 0;
      for (int b = n - 1; b >= 0; --b) v = v << 8 | p_[pos_ + b];
      if (n && (p_[pos_ + n - 1] & 0x80)) v |= ~uint64_t{0} << (8 * n);  // negative
      pos_ += n;
      const int64_t s = static_cast<int64_t>(v);
      if (s >= kIntBound || s < -kIntBound) give_up();
      node();
      push(V::make(K::kInt, v));
      break;
    }
    case op::kBinFloat:
      need(8);
      pos_ += 8;
      node();
      push(V::make(K::kOpaque, 0));
      break;
    case op::kShortBinUnicode:
      string(at, le<uint8_t>());
      break;
    case op::kBinUnicode:
      string(at, le<uint32_t>());
      break;
    case op::kBinUnicode8:
      string(at, le<uint64_t>());
      break;
    default:
      return false;
  }
  return true;
}

// Marks, containers, the memo, globals, calls and BUILD.
bool Direct::structure_op(uint8_t code, size_t at) {
  switch (code) {
    case op::kMark:
      if (stack_.size() + marks_.size() + 1 >= limits_.max_pickle_stack) give_up();
      marks_.push_back(stack_.size());
      break;
    case op::kEmptyTuple:
      push(V::make(K::kTuple, 0));
      break;
    case op::kTuple:
      tuple(pop_mark());
      break;
    case op::kTuple1:
    case op::kTuple2:
    case op::kTuple3: {
      const size_t n = p_[at] - op::kTuple1 + 1;
      if (stack_.size() < fence() + n) give_up();
      tuple(stack_.size() - n);
      break;
    }
    case op::kEmptyList:
      push(V::make(K::kList, new_container()));
      break;
    case op::kEmptyDict:
      push(V::make(K::kDict, new_container()));
      break;
    case op::kList:
    case op::kDict: {
      const size_t k = pop_mark();
      const bool dict = p_[at] == op::kDict;
      if (dict && (stack_.size() - k) % 2) give_up();
      const uint32_t c = new_container();
      fill(c, k);
      push(V::make(dict ? K::kDict : K::kList, c));
      break;
    }
    case op::kAppend:
      if (stack_.size() < fence() + 2) give_up();
      fill(container_below(stack_.size() - 1, K::kList).u(), stack_.size() - 1);
      break;
    case op::kAppends: {
      const size_t k = pop_mark();
      fill(container_below(k, K::kList).u(), k);
      break;
    }
    case op::kSetItem:
      if (stack_.size() < fence() + 3) give_up();
      fill(container_below(stack_.size() - 2, K::kDict).u(), stack_.size() - 2);
      break;
    case op::kSetItems: {
      const size_t k = pop_mark();
      const uint32_t c = container_below(k, K::kDict).u();
      if ((stack_.size() - k) % 2) give_up();
      fill(c, k);
      break;
    }
    case op::kBinGet:
      memo_get(le<uint8_t>());
      break;
    case op::kLongBinGet:
      memo_get(le<uint32_t>());
      break;
    case op::kBinPut:
      memo_put(le<uint8_t>());
      break;
    case op::kLongBinPut:
      memo_put(le<uint32_t>());
      break;
    case op::kMemoize:
      memo_put(memo_.size());
      break;
    case op::kGlobal: {
      const std::string_view m = line(), n = line();
      global(m, n);
      break;
    }
    case op::kStackGlobal: {
      const V n = pop(), m = pop();
      if (m.k() != K::kStr || n.k() != K::kStr) give_up();
      global(str(m), str(n));
      break;
    }
    case op::kReduce:
    case op::kNewObj:
      call(p_[at] == op::kNewObj);
      break;
    case op::kBuild:
      build();
      break;
    default:
      return false;
  }
  return true;
}

}  // namespace ckpt::internal::dcp_direct
