// A restricted pickle VM (the protocol is documented in CPython's Lib/pickletools.py).
//
// Opcode set, by what it does:
//   framing     PROTO (0..5), FRAME (length bounds-checked, otherwise ignored), STOP
//   stack       MARK, POP, POP_MARK, DUP
//   atoms       NONE, NEWTRUE, NEWFALSE, INT ("01"/"00" are bools), BININT, BININT1, BININT2,
//               LONG, LONG1, LONG4 (beyond int64: decimal text in Value::s), FLOAT, BINFLOAT
//   text        UNICODE, BINUNICODE, SHORT_BINUNICODE, BINUNICODE8 -> kString (UTF-8 checked);
//               STRING, BINSTRING, SHORT_BINSTRING (Python 2 str) -> kString, as UTF-8 when the
//               bytes are valid UTF-8 (torch.load's encoding='utf-8'), else read as latin-1
//   bytes       BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8 -> kBytes
//   containers  EMPTY_LIST, APPEND, APPENDS, LIST, EMPTY_TUPLE, TUPLE, TUPLE1/2/3, EMPTY_DICT,
//               DICT, SETITEM, SETITEMS, EMPTY_SET, ADDITEMS, FROZENSET
//   memo        GET, BINGET, LONG_BINGET, PUT, BINPUT, LONG_BINPUT, MEMOIZE
//   objects     GLOBAL, STACK_GLOBAL, INST, OBJ (class names checked against hooks.allow_global);
//               REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ (hooks.call, built-ins, else kObject);
//               BUILD (hooks.build, else Value::state); PERSID, BINPERSID (hooks.persistent_load)
//   refused     EXT1/2/4, NEXT_BUFFER, READONLY_BUFFER -> kUnsupported; other bytes -> kCorrupt
//
// The VM is a loop over a value stack and a mark stack (positions into the value stack, as in
// CPython's C unpickler), so nesting never recurses. Objects are nodes of a PickleHeap (heap.h):
// the stacks and the memo hold 32-bit Refs, nothing is freed one by one, and the Value tree is
// made at STOP for what the result reaches.
//
// This file: the opcode loop (Vm::loop) and unpickle(). Class Vm, its state and the helpers the
// opcodes call, is in unpickler_vm.h (included here only).

#include "pickle/unpickler.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "ckpt/error.h"
#include "pickle/opcodes.h"
#include "pickle/pickle_text.h"
#include "pickle/unpickler_vm.h"
#include "util/text.h"

namespace ckpt::internal {
namespace {

// Each opcode's code ends with its own jump to the next opcode's code (CKPT_NEXT_OP, GNU C's
// labels as values) instead of all of them returning to the one indirect jump of the switch: the
// processor then predicts each jump from the opcode it follows (a BINPUT after a BINUNICODE, a
// REDUCE after a TUPLE...), which the single shared jump mispredicted. The switch remains the
// way in, and the code of each case is what it was. A case that has a local with a destructor
// in scope ends with `break` instead (back through the switch): an indirect goto must not leave
// such a scope (clang refuses it; GCC would not run the destructor).
#define CKPT_NEXT_OP()             \
  do {                             \
    if (pos_ >= end_) [[unlikely]] \
      goto out_of_input;           \
    op_pos_ = pos_;                \
    code_ = p_[pos_++];            \
    goto* dispatch[code_];         \
  } while (0)

Ref Vm::loop() {
  void* dispatch[256];
  for (void*& d : dispatch) d = &&L_default;
  dispatch[op::kProto] = &&L_kProto;
  dispatch[op::kFrame] = &&L_kFrame;
  dispatch[op::kStop] = &&L_kStop;
  dispatch[op::kMark] = &&L_kMark;
  dispatch[op::kPop] = &&L_kPop;
  dispatch[op::kPopMark] = &&L_kPopMark;
  dispatch[op::kDup] = &&L_kDup;
  dispatch[op::kNone] = &&L_kNone;
  dispatch[op::kNewTrue] = &&L_kNewTrue;
  dispatch[op::kNewFalse] = &&L_kNewFalse;
  dispatch[op::kInt] = &&L_kInt;
  dispatch[op::kBinInt] = &&L_kBinInt;
  dispatch[op::kBinInt1] = &&L_kBinInt1;
  dispatch[op::kBinInt2] = &&L_kBinInt2;
  dispatch[op::kLong] = &&L_kLong;
  dispatch[op::kLong1] = &&L_kLong1;
  dispatch[op::kLong4] = &&L_kLong4;
  dispatch[op::kFloat] = &&L_kFloat;
  dispatch[op::kBinFloat] = &&L_kBinFloat;
  dispatch[op::kString] = &&L_kString;
  dispatch[op::kBinString] = &&L_kBinString;
  dispatch[op::kShortBinString] = &&L_kShortBinString;
  dispatch[op::kUnicode] = &&L_kUnicode;
  dispatch[op::kShortBinUnicode] = &&L_kShortBinUnicode;
  dispatch[op::kBinUnicode] = &&L_kBinUnicode;
  dispatch[op::kBinUnicode8] = &&L_kBinUnicode8;
  dispatch[op::kShortBinBytes] = &&L_kShortBinBytes;
  dispatch[op::kBinBytes] = &&L_kBinBytes;
  dispatch[op::kBinBytes8] = &&L_kBinBytes8;
  dispatch[op::kByteArray8] = &&L_kByteArray8;
  dispatch[op::kEmptyList] = &&L_kEmptyList;
  dispatch[op::kEmptyTuple] = &&L_kEmptyTuple;
  dispatch[op::kEmptyDict] = &&L_kEmptyDict;
  dispatch[op::kEmptySet] = &&L_kEmptySet;
  dispatch[op::kList] = &&L_kList;
  dispatch[op::kTuple] = &&L_kTuple;
  dispatch[op::kTuple1] = &&L_kTuple1;
  dispatch[op::kTuple2] = &&L_kTuple2;
  dispatch[op::kTuple3] = &&L_kTuple3;
  dispatch[op::kFrozenSet] = &&L_kFrozenSet;
  dispatch[op::kDict] = &&L_kDict;
  dispatch[op::kAppend] = &&L_kAppend;
  dispatch[op::kAppends] = &&L_kAppends;
  dispatch[op::kAddItems] = &&L_kAddItems;
  dispatch[op::kSetItem] = &&L_kSetItem;
  dispatch[op::kSetItems] = &&L_kSetItems;
  dispatch[op::kGet] = &&L_kGet;
  dispatch[op::kBinGet] = &&L_kBinGet;
  dispatch[op::kLongBinGet] = &&L_kLongBinGet;
  dispatch[op::kPut] = &&L_kPut;
  dispatch[op::kBinPut] = &&L_kBinPut;
  dispatch[op::kLongBinPut] = &&L_kLongBinPut;
  dispatch[op::kMemoize] = &&L_kMemoize;
  dispatch[op::kGlobal] = &&L_kGlobal;
  dispatch[op::kStackGlobal] = &&L_kStackGlobal;
  dispatch[op::kInst] = &&L_kInst;
  dispatch[op::kObj] = &&L_kObj;
  dispatch[op::kReduce] = &&L_kReduce;
  dispatch[op::kNewObj] = &&L_kNewObj;
  dispatch[op::kNewObjEx] = &&L_kNewObjEx;
  dispatch[op::kBuild] = &&L_kBuild;
  dispatch[op::kPersId] = &&L_kPersId;
  dispatch[op::kBinPersId] = &&L_kBinPersId;
  dispatch[op::kExt1] = &&L_kExt1;
  dispatch[op::kExt2] = &&L_kExt2;
  dispatch[op::kExt4] = &&L_kExt4;
  dispatch[op::kNextBuffer] = &&L_kNextBuffer;
  dispatch[op::kReadonlyBuffer] = &&L_kReadonlyBuffer;
  while (pos_ < end_) {
    op_pos_ = pos_;
    code_ = p_[pos_++];
    switch (code_) {
      case op::kProto:
      L_kProto : {
        protocol_ = le<uint8_t>();
        if (protocol_ > 5) fail(ErrorCode::kUnsupported, "protocol " + std::to_string(protocol_));
        CKPT_NEXT_OP();
      }
      case op::kFrame:
      L_kFrame:
        need(le<uint64_t>());
        CKPT_NEXT_OP();
      case op::kStop:
      L_kStop:
        return pop();
      case op::kMark:
      L_kMark:
        check_depth();
        marks_.push_back(stack_.size());
        CKPT_NEXT_OP();
      case op::kPop:
      L_kPop:
        // CPython pops a MARK that sits on top of the stack (pickle.py keeps both in one stack).
        if (!marks_.empty() && marks_.back() == stack_.size()) {
          marks_.pop_back();
        } else {
          pop();
        }
        CKPT_NEXT_OP();
      case op::kPopMark:
      L_kPopMark:
        stack_.resize(pop_mark());
        CKPT_NEXT_OP();
      case op::kDup:
      L_kDup:
        push(top());
        CKPT_NEXT_OP();
      case op::kNone:
      L_kNone:
        push(heap_.none());
        CKPT_NEXT_OP();
      case op::kNewTrue:
      L_kNewTrue:
        push(heap_.boolean(true));
        CKPT_NEXT_OP();
      case op::kNewFalse:
      L_kNewFalse:
        push(heap_.boolean(false));
        CKPT_NEXT_OP();
      case op::kInt:
      L_kInt : {
        std::string_view t = line();
        if (t == "01" || t == "00") {
          push(heap_.boolean(t == "01"));
        } else {
          push(make_int_text(t, false));
        }
        CKPT_NEXT_OP();
      }
      case op::kBinInt:
      L_kBinInt:
        push(integer(le<int32_t>()));
        CKPT_NEXT_OP();
      case op::kBinInt1:
      L_kBinInt1:
        push(integer(le<uint8_t>()));
        CKPT_NEXT_OP();
      case op::kBinInt2:
      L_kBinInt2:
        push(integer(le<uint16_t>()));
        CKPT_NEXT_OP();
      case op::kLong:
      L_kLong:
        push(make_int_text(line(), true));
        CKPT_NEXT_OP();
      case op::kLong1:
      L_kLong1:
        push(make_long(take(le<uint8_t>())));
        CKPT_NEXT_OP();
      case op::kLong4:
      L_kLong4 : {
        int32_t n = le<int32_t>();
        if (n < 0) fail(ErrorCode::kCorrupt, "negative byte count");
        push(make_long(take(static_cast<uint32_t>(n))));
        CKPT_NEXT_OP();
      }
      case op::kFloat:
      L_kFloat:
        push(make_float_text(line()));
        CKPT_NEXT_OP();
      case op::kBinFloat:
      L_kBinFloat : {
        uint64_t bits = __builtin_bswap64(le<uint64_t>());  // the only big-endian field in pickle
        push(heap_.real(std::bit_cast<double>(bits)));
        CKPT_NEXT_OP();
      }
      case op::kString:
      L_kString : {
        std::string raw;
        if (!pickle_text::decode_string_literal(line(), raw))
          fail(ErrorCode::kCorrupt, "argument is not a quoted string literal");
        push(heap_.string(pickle_text::py2_str_to_utf8(raw)));
        break;  // not CKPT_NEXT_OP: a local with a destructor is in scope
      }
      case op::kBinString:
      L_kBinString : {
        int32_t n = le<int32_t>();
        if (n < 0) fail(ErrorCode::kCorrupt, "negative length");
        push(make_py2_string(take(static_cast<uint32_t>(n))));
        CKPT_NEXT_OP();
      }
      case op::kShortBinString:
      L_kShortBinString:
        push(make_py2_string(take(le<uint8_t>())));
        CKPT_NEXT_OP();
      case op::kUnicode:
      L_kUnicode : {
        std::string s;
        if (!pickle_text::decode_raw_unicode_escape(line(), s))
          fail(ErrorCode::kCorrupt, "bad \\u escape");
        push(heap_.string(s));
        break;  // not CKPT_NEXT_OP: a local with a destructor is in scope
      }
      case op::kShortBinUnicode:
      L_kShortBinUnicode:
        push(make_string(take(le<uint8_t>())));
        CKPT_NEXT_OP();
      case op::kBinUnicode:
      L_kBinUnicode:
        push(make_string(take(le<uint32_t>())));
        CKPT_NEXT_OP();
      case op::kBinUnicode8:
      L_kBinUnicode8:
        push(make_string(take(le<uint64_t>())));
        CKPT_NEXT_OP();
      case op::kShortBinBytes:
      L_kShortBinBytes:
        push(make_bytes(take(le<uint8_t>()), false));
        CKPT_NEXT_OP();
      case op::kBinBytes:
      L_kBinBytes:
        push(make_bytes(take(le<uint32_t>()), false));
        CKPT_NEXT_OP();
      case op::kBinBytes8:
      L_kBinBytes8:
        push(make_bytes(take(le<uint64_t>()), false));
        CKPT_NEXT_OP();
      case op::kByteArray8:
      L_kByteArray8:
        push(make_bytes(take(le<uint64_t>()), true));
        CKPT_NEXT_OP();
      case op::kEmptyList:
      L_kEmptyList:
        push(heap_.list());
        CKPT_NEXT_OP();
      case op::kEmptyTuple:
      L_kEmptyTuple:
        push(heap_.empty_tuple());
        CKPT_NEXT_OP();
      case op::kEmptyDict:
      L_kEmptyDict:
        push(heap_.dict());
        CKPT_NEXT_OP();
      case op::kEmptySet:
      L_kEmptySet:
        push(heap_.set());
        CKPT_NEXT_OP();
      case op::kList:
      L_kList : {
        size_t k = pop_mark();
        Ref l = heap_.list(above(k));
        stack_.resize(k);
        push(l);
        CKPT_NEXT_OP();
      }
      case op::kTuple:
      L_kTuple:
        push(tuple_from(pop_mark()));
        CKPT_NEXT_OP();
      case op::kTuple1:
      L_kTuple1:
        push(tuple_of_top(1));
        CKPT_NEXT_OP();
      case op::kTuple2:
      L_kTuple2:
        push(tuple_of_top(2));
        CKPT_NEXT_OP();
      case op::kTuple3:
      L_kTuple3:
        push(tuple_of_top(3));
        CKPT_NEXT_OP();
      case op::kFrozenSet:
      L_kFrozenSet : {
        size_t k = pop_mark();
        Ref s = heap_.set(above(k), /*frozen=*/true);
        stack_.resize(k);
        push(s);
        CKPT_NEXT_OP();
      }
      case op::kDict:
      L_kDict : {
        size_t k = pop_mark();
        Ref d = heap_.dict();
        set_items(d, k);
        push(d);
        CKPT_NEXT_OP();
      }
      case op::kAppend:
      L_kAppend : {
        Ref v = pop();
        Ref l = top();
        if (heap_.kind(l) != Kind::kObject) expect(l, Kind::kList);
        if (heap_.is_container(v)) note_mutated(l);
        if (heap_.kind(l) == Kind::kObject) {
          heap_.object_append(l, std::span<const Ref>(&v, 1));  // obj.append(v): recorded
        } else {
          heap_.append(l, std::span<const Ref>(&v, 1));
        }
        CKPT_NEXT_OP();
      }
      case op::kAppends:
      L_kAppends:
      case op::kAddItems:
      L_kAddItems : {
        size_t k;
        Ref c = container_below_mark(k, code_ == op::kAppends ? Kind::kList : Kind::kSet);
        note_if_receives_container(k - 1, k);
        if (heap_.kind(c) == Kind::kObject) {
          heap_.object_append(c, above(k));
        } else {
          heap_.append(c, above(k));
        }
        stack_.resize(k);
        CKPT_NEXT_OP();
      }
      case op::kSetItem:
      L_kSetItem : {
        need_items(3);
        Ref d = stack_[stack_.size() - 3];
        if (heap_.kind(d) != Kind::kObject) expect(d, Kind::kDict);
        note_if_receives_container(stack_.size() - 3, stack_.size() - 2);
        set_items(d, stack_.size() - 2);
        CKPT_NEXT_OP();
      }
      case op::kSetItems:
      L_kSetItems : {
        size_t k;
        Ref d = container_below_mark(k, Kind::kDict);
        note_if_receives_container(k - 1, k);
        set_items(d, k);
        CKPT_NEXT_OP();
      }
      case op::kGet:
      L_kGet : {
        uint64_t id;
        if (!pickle_text::parse_index(line(), id)) fail(ErrorCode::kCorrupt, "bad memo index");
        push(memo_get(id));
        CKPT_NEXT_OP();
      }
      case op::kBinGet:
      L_kBinGet:
        push(memo_get(le<uint8_t>()));
        CKPT_NEXT_OP();
      case op::kLongBinGet:
      L_kLongBinGet:
        push(memo_get(le<uint32_t>()));
        CKPT_NEXT_OP();
      case op::kPut:
      L_kPut : {
        uint64_t id;
        if (!pickle_text::parse_index(line(), id)) fail(ErrorCode::kCorrupt, "bad memo index");
        memo_put(id, top());
        CKPT_NEXT_OP();
      }
      case op::kBinPut:
      L_kBinPut : {
        uint8_t id = le<uint8_t>();
        memo_put(id, top());
        CKPT_NEXT_OP();
      }
      case op::kLongBinPut:
      L_kLongBinPut : {
        uint32_t id = le<uint32_t>();
        memo_put(id, top());
        CKPT_NEXT_OP();
      }
      case op::kMemoize:
      L_kMemoize:
        memo_put(memo_count_, top());
        CKPT_NEXT_OP();
      case op::kGlobal:
      L_kGlobal : {
        std::string module(line());
        std::string name(line());
        push(resolve_global(std::move(module), std::move(name)));
        break;  // not CKPT_NEXT_OP: a local with a destructor is in scope
      }
      case op::kStackGlobal:
      L_kStackGlobal : {
        Ref name = pop(), module = pop();
        if (heap_.kind(module) != Kind::kString || heap_.kind(name) != Kind::kString)
          fail(ErrorCode::kCorrupt, "module and name must be strings");
        push(resolve_global(std::string(heap_.text(module)), std::string(heap_.text(name))));
        CKPT_NEXT_OP();
      }
      case op::kInst:
      L_kInst : {
        std::string module(line());
        std::string name(line());
        Ref cls = resolve_global(std::move(module), std::move(name));
        Ref args = tuple_from(pop_mark());
        push(call(cls, args, heap_.items(args).empty()));
        break;  // not CKPT_NEXT_OP: a local with a destructor is in scope
      }
      case op::kObj:
      L_kObj : {
        size_t k = pop_mark();
        if (stack_.size() == k) fail(ErrorCode::kCorrupt, "stack underflow");
        Ref cls = stack_[k];
        Ref args = tuple_from(k + 1);
        stack_.pop_back();  // cls
        push(call(cls, args, heap_.items(args).empty()));
        CKPT_NEXT_OP();
      }
      case op::kReduce:
      L_kReduce:
      case op::kNewObj:
      L_kNewObj : {
        Ref args = pop();
        Ref callable = pop();
        push(call(callable, args, code_ == op::kNewObj));
        CKPT_NEXT_OP();
      }
      case op::kNewObjEx:
      L_kNewObjEx : {
        Ref kwargs = pop(), args = pop(), cls = pop();
        if (heap_.kind(kwargs) != Kind::kDict)
          fail(ErrorCode::kCorrupt, "keyword arguments are not a dict");
        if (!heap_.items(kwargs).empty()) {
          // cls.__new__(cls, *args, **kwargs): recorded (never called) as the protocol-2 form
          // CPython's pickler writes for it, copyreg.__newobj_ex__(cls, args, kwargs), so that a
          // writer reproduces an object that unpickles the same.
          if (heap_.kind(cls) != Kind::kGlobal)
            fail(ErrorCode::kCorrupt,
                 std::string("NEWOBJ_EX of a ") + kind_name(heap_.kind(cls)) + ", not a class");
          if (heap_.kind(args) != Kind::kTuple)
            fail(ErrorCode::kCorrupt, "NEWOBJ_EX arguments are not a tuple");
          if (!hooks_.admit_foreign || !hooks_.admit_foreign("copyreg", "__newobj_ex__"))
            fail(ErrorCode::kUnsupported, "keyword arguments are not supported");
          const Ref parts[3] = {cls, args, kwargs};
          Ref fn = heap_.global("copyreg", "__newobj_ex__", true);
          push(heap_.object(fn, heap_.tuple(std::span<const Ref>(parts, 3))));
          CKPT_NEXT_OP();
        }
        push(call(cls, args, true));
        CKPT_NEXT_OP();
      }
      case op::kBuild:
      L_kBuild:
        build();
        CKPT_NEXT_OP();
      case op::kPersId:
      L_kPersId : {
        std::string_view t = line();
        for (char c : t)
          if (static_cast<uint8_t>(c) > 0x7F) fail(ErrorCode::kCorrupt, "id is not ASCII");
        persistent(heap_.input_text(Kind::kString, offset_of(t), t.size()));
        CKPT_NEXT_OP();
      }
      case op::kBinPersId:
      L_kBinPersId:
        persistent(pop());
        CKPT_NEXT_OP();
      case op::kExt1:
      L_kExt1:
      case op::kExt2:
      L_kExt2:
      case op::kExt4:
      L_kExt4:
        fail(ErrorCode::kUnsupported, "the extension registry is not supported");
      case op::kNextBuffer:
      L_kNextBuffer:
      case op::kReadonlyBuffer:
      L_kReadonlyBuffer:
        fail(ErrorCode::kUnsupported, "out-of-band buffers are not supported");
      default:
      L_default : {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", code_);
        throw Error(ErrorCode::kCorrupt, std::string("unknown opcode ") + hex, opt_.source,
                    opt_.record, abs(op_pos_));
      }
    }
  }
out_of_input:
  op_pos_ = pos_;
  if (end_ < size_)
    throw Error(ErrorCode::kLimitExceeded, "pickle is larger than limits.max_metadata_bytes",
                opt_.source, opt_.record, abs(pos_));
  throw Error(ErrorCode::kTruncated, "pickle ends without STOP", opt_.source, opt_.record,
              abs(pos_));
}
#undef CKPT_NEXT_OP

}  // namespace

void check_pickle_start(std::span<const std::byte> head, const std::string& source,
                        std::string_view record) {
  if (head.empty()) return;
  const uint8_t c = static_cast<uint8_t>(head[0]);
  if (!op::name(c))
    throw Error(ErrorCode::kCorrupt,
                "not a pickle: the first byte 0x" + to_hex(head.first(1)) + " is no opcode", source,
                std::string(record), 0);
  if (c == op::kProto && head.size() > 1 && static_cast<uint8_t>(head[1]) > 5)
    throw Error(ErrorCode::kCorrupt,
                "not a pickle: PROTO " + std::to_string(static_cast<uint8_t>(head[1])) +
                    " (protocols are 0 to 5)",
                source, std::string(record), 0);
}

ValuePtr unpickle(std::span<const std::byte> data, const UnpicklerHooks& hooks,
                  const UnpickleOptions& options, size_t* consumed) {
  Vm vm(data, hooks, options);
  return vm.run(consumed);
}

void unpickle_heap(std::span<const std::byte> data, const UnpicklerHooks& hooks,
                   const UnpickleOptions& options,
                   const std::function<void(const PickleHeap&, Ref)>& read) {
  Vm vm(data, hooks, options);
  const Ref root = vm.run_checked();
  read(vm.heap(), root);
}

}  // namespace ckpt::internal
