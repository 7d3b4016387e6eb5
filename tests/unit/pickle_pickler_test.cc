// The pickler against CPython 3.11's own protocol-2 output (pickle_cpython_data.h): each test
// rebuilds the Python object graph as Values, with the same sharing, and compares bytes.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "ckpt/error.h"
#include "pickle/pickler.h"
#include "pickle/unpickler.h"
#include "pickle/value_release.h"
#include "pickle_cpython_data.h"
#include "pickle_test_util.h"
#include "test_util.h"
#include "util/bytes.h"

namespace ckpt::test {
namespace {

using internal::pickle;
using namespace std::string_literals;
using internal::PicklerHooks;

std::string pickled(const ValuePtr& v, const PicklerHooks& hooks = {}) {
  std::string out;
  pickle(v, out, hooks);
  return out;
}

// Compares in hex so that a failure shows where the bytes part.
void expect_bytes(const std::string& got, std::string_view expected_hex) {
  EXPECT_EQ(to_hex(got), std::string(expected_hex));
}

TEST(Pickler, AtomsMatchCPython) {
  auto bytearray = [](std::string s) { return Value::bytes(std::move(s), true); };
  auto root = Value::list({
      Value::none(),
      Value::boolean(true),
      Value::boolean(false),
      I(0),
      I(1),
      I(255),
      I(256),
      I(65535),
      I(65536),
      I(-1),
      I(-256),
      I(INT32_MAX),
      I(INT32_MIN),
      I(int64_t{1} << 31),
      I(int64_t{INT32_MIN} - 1),
      I(INT64_MAX),
      I(INT64_MIN),
      big_int("9223372036854775808"),
      big_int("-9223372036854775809"),
      big_int("18446744073709551616"),
      big_int("1000000000000000000000000000000"),
      big_int("-1000000000000000000000000000000"),
      Value::real(1.5),
      Value::real(-0.0),
      Value::real(std::numeric_limits<double>::infinity()),
      Value::real(1e300),
      S("abc"),
      S("h\u00e9llo \u20ac\U0001f600"),
      S(""),
      Value::bytes(""),
      Value::bytes(std::string("\x00\xff"
                               "ab",
                               4)),
      bytearray("xy"),
      bytearray(""),
      Value::complex({1.5, -2}),
      set_of({I(8), I(7)}),  // {7, 8} iterates in hash-table order: 8 lands in slot 0
  });
  expect_bytes(pickled(root), cpython::kAtoms);
}

TEST(Pickler, NestedContainersAndSharedListMatchCPython) {
  auto shared = Value::list({I(1), I(2)});
  auto root = dict_of({
      {S("k1"), shared},
      {S("k2"), Value::tuple({shared, S("x")})},
      {S("k3"), dict_of({{S("k4"), Value::list({shared, Value::tuple()})}})},
      {S("k5"), Value::tuple({I(1), I(2), I(3), I(4)})},
      {S("k6"), Value::tuple({I(5)})},
      {S("k7"), Value::tuple({I(6), I(7)})},
      {S("k8"), Value::tuple({I(8), I(9), I(10)})},
      {S("k9"), Value::list()},
      {S("k10"), Value::dict()},
  });
  expect_bytes(pickled(root), cpython::kNested);
}

TEST(Pickler, OrderedDictWithAttributeBuildsStateLikeCPython) {
  auto od =
      dict_of({{S("w"), Value::real(1.0)}, {S("b"), Value::list({I(3)})}}, Value::ordered_dict());
  auto meta = dict_of({{S("meta"), dict_of({{S("version"), I(1)}})}}, Value::ordered_dict());
  od->set_state(dict_of({{S("_metadata"), meta}}));
  expect_bytes(pickled(od), cpython::kOrdered);
}

TEST(Pickler, BatchesOf1000LikeCPython) {
  auto nones = [](size_t n) {
    std::vector<ValuePtr> items(n, Value::none());
    return Value::list(std::move(items));
  };
  auto int_keys = [](size_t n, ValuePtr base) {
    for (size_t i = 0; i < n; ++i) base->entries().emplace_back(I(i), Value::none());
    return base;
  };
  auto root =
      Value::list({nones(1001), nones(1000), nones(2), nones(1), int_keys(1000, Value::dict()),
                   int_keys(1001, Value::dict()), int_keys(1000, Value::ordered_dict()),
                   int_keys(1001, Value::ordered_dict())});
  expect_bytes(pickled(root), cpython::kBatch);
}

TEST(Pickler, LongBinPutAndLongBinGetBeyond256MemoEntries) {
  auto strings = Value::list();
  for (int i = 0; i < 300; ++i) strings->items().push_back(S("s" + std::to_string(i)));
  auto root = Value::list({strings, strings->items()[299], strings->items()[5]});
  expect_bytes(pickled(root), cpython::kMemo);
}

TEST(Pickler, SelfReferentialListIsABinGet) {
  auto rec = Value::list();
  rec->items().push_back(rec);
  expect_bytes(pickled(rec), cpython::kRecursive);
  rec->items().clear();  // break the cycle
}

TEST(Pickler, ObjectsReduceWithArgsThenBuildState) {
  auto k = S("k");  // CPython shares the interned key between the two state dicts
  auto root = Value::list({
      Value::object("__main__", "Thing", {I(1), S("first")}, dict_of({{k, I(2)}})),
      Value::object("__main__", "Thing", {I(1), S("second")}, dict_of({{k, I(2)}})),
  });
  expect_bytes(pickled(root), cpython::kObject);
}

// torch.save's shape: an OrderedDict of rebuild reduces whose storages are persistent ids.
TEST(Pickler, PersistentIdsLikeTorchSave) {
  auto storage_tag = S("storage");  // string constants in persistent_id: one object each
  auto cpu = S("cpu");
  PicklerHooks hooks;
  hooks.persistent_id = [&](const Value& v) -> ValuePtr {
    if (v.kind() != Value::Kind::kObject || v.name() != "Storage") return nullptr;
    return Value::tuple({storage_tag, Value::global("__main__", "FloatStorage"),
                         S(std::to_string(v.items()[0]->as_int())), cpu, I(4)});
  };
  auto tensor = [](int key) {
    return Value::object(
        "__main__", "rebuild",
        {Value::object("__main__", "Storage", {I(key)}), I(0), Value::tuple({I(2), I(2)}),
         Value::tuple({I(2), I(1)}), Value::boolean(false), Value::ordered_dict()});
  };
  auto t0 = tensor(0);
  auto sd = dict_of({{S("a.weight"), t0}, {S("a.bias"), tensor(1)}, {S("tied"), t0}},
                    Value::ordered_dict());
  expect_bytes(pickled(sd, hooks), cpython::kPersistent);
}

TEST(Pickler, TensorReferenceIsInvalidArgument) {
  EXPECT_CKPT_ERROR(pickled(Value::list({Value::tensor(0)})), ErrorCode::kInvalidArgument);
}

TEST(Pickler, InvalidUtf8StringIsInvalidArgument) {
  EXPECT_CKPT_ERROR(pickled(S("\xff")), ErrorCode::kInvalidArgument);
}

TEST(Pickler, NonDecimalBigIntIsInvalidArgument) {
  EXPECT_CKPT_ERROR(pickled(big_int("12x")), ErrorCode::kInvalidArgument);
}

TEST(Pickler, NonAsciiGlobalIsInvalidArgument) {
  EXPECT_CKPT_ERROR(pickled(Value::global("m\u00e9", "x")), ErrorCode::kInvalidArgument);
  EXPECT_CKPT_ERROR(pickled(Value::global("a\nb", "x")), ErrorCode::kInvalidArgument);
}

TEST(Pickler, PlainDictWithStateIsInvalidArgument) {
  auto d = Value::dict();
  d->set_state(Value::dict());
  EXPECT_CKPT_ERROR(pickled(d), ErrorCode::kInvalidArgument);
}

TEST(Pickler, NestingBeyondDepthLimitIsLimitExceededAndLeavesOutputUntouched) {
  auto root = Value::list();
  auto cur = root;
  for (int i = 0; i < 5000; ++i) {
    auto next = Value::list();
    cur->items().push_back(next);
    cur = next;
  }
  std::string out = "prefix";
  EXPECT_CKPT_ERROR(pickle(root, out), ErrorCode::kLimitExceeded);
  EXPECT_EQ(out, "prefix");
  internal::release_value(std::move(root));
}

TEST(Pickler, GlobalsAreRenamedToPython2AndMemoizedByName) {
  auto root = Value::list({Value::global("builtins", "range"), Value::global("builtins", "range"),
                           Value::global("copyreg", "_reconstructor")});
  EXPECT_EQ(pickled(root),
            "\x80\x02]q\x00(c__builtin__\nxrange\nq\x01h\x01"
            "ccopy_reg\n_reconstructor\nq\x02"
            "e."s);
}

TEST(Pickler, AppendsToExistingOutput) {
  std::string out = "xy";
  pickle(Value::none(), out);
  EXPECT_EQ(out, "xy\x80\x02N."s);
}

// Whatever the pickler writes, the unpickler reads back as the same tree.
TEST(Pickler, RoundTripsThroughTheUnpickler) {
  auto shared = Value::list({I(1)});
  auto od = dict_of({{S("x"), Value::real(-2.5)}}, Value::ordered_dict());
  od->set_state(dict_of({{S("_metadata"), Value::ordered_dict()}}));
  auto root = dict_of({
      {S("a"), shared},
      {S("b"),
       Value::tuple({shared, shared, I(-70000), big_int("-123456789012345678901234567890")})},
      {S("c"), od},
      {S("d"), Value::bytes(std::string("\x00\x01\xfe", 3))},
      {S("e"), set_of({S("s")})},
      {S("f"), Value::complex({0.5, 1})},
      {S("g"), Value::object("m", "C", {I(1)}, dict_of({{S("k"), Value::none()}}))},
      {I(7), Value::boolean(true)},
  });
  std::string bytes = pickled(root);
  internal::UnpicklerHooks hooks;
  hooks.allow_global = [](const std::string& m, const std::string& n) { return true; };
  auto back = internal::unpickle(internal::as_bytes(bytes), hooks, {});
  EXPECT_EQ(dump(back), dump(root));
  auto b = back->get("b");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->items()[0], b->items()[1]);
  EXPECT_EQ(b->items()[0], back->get("a"));
  // And pickling what was read gives the same bytes again.
  EXPECT_EQ(to_hex(pickled(back)), to_hex(bytes));
}

}  // namespace
}  // namespace ckpt::test

// Opaque (foreign) objects (issue 13, point 4): what the unpickler records of a class it does not
// know — the global, the call kind, the arguments, appended and set items, the BUILD state — is
// enough for the pickler to write the same opcodes back, so torch.load of a rewrite sees the same
// object. Nothing is called: the global is never looked up.
namespace ckpt::test {
namespace {
namespace opaque {

using namespace std::string_literals;

internal::UnpicklerHooks admitting() {
  internal::UnpicklerHooks hooks;
  hooks.allow_global = [](const std::string& m, const std::string& n) {
    return m == "collections" && n == "OrderedDict";
  };
  hooks.admit_foreign = [](const std::string&, const std::string&) { return true; };
  return hooks;
}

ValuePtr unpickled(const std::string& bytes, const internal::UnpicklerHooks& hooks = admitting()) {
  return internal::unpickle(internal::as_bytes(bytes), hooks, {});
}

// Protocol 2 exactly as CPython 3.11 writes it (checked with pickle.dumps; memo puts included):
// the pickler's output of what was read
// equals the input byte for byte.
void expect_round_trip(const std::string& pkl) {
  ValuePtr v = unpickled(pkl);
  EXPECT_EQ(to_hex(pickled(v)), to_hex(pkl));
}

TEST(PicklerOpaque, ReduceWithArgsAndDictStateComesBackTheSame) {
  // argparse.Namespace(lr=0.5) as CPython 3.11 pickles it: NEWOBJ of the class with () then
  // BUILD {'lr': 0.5}.
  const std::string pkl =
      "\x80\x02"
      "cargparse\nNamespace\nq\x00)\x81q\x01}q\x02X\x02\x00\x00\x00lrq\x03G?\xe0\x00\x00\x00\x00\x00\x00sb."s;
  ValuePtr v = unpickled(pkl);
  ASSERT_EQ(v->kind(), Value::Kind::kObject);
  EXPECT_EQ(v->module(), "argparse");
  EXPECT_EQ(v->name(), "Namespace");
  EXPECT_EQ(v->call(), Value::Call::kNewObj);
  ASSERT_TRUE(v->state());
  EXPECT_EQ(v->state()->kind(), Value::Kind::kDict);
  expect_round_trip(pkl);
}

TEST(PicklerOpaque, ReduceCallKeepsItsKindAndArguments) {
  // mymod.Point(1, 2) by REDUCE (a class with __reduce__ returning (cls, (1, 2))).
  const std::string pkl =
      "\x80\x02"
      "cmymod\nPoint\nq\x00K\x01K\x02\x86q\x01Rq\x02."s;
  ValuePtr v = unpickled(pkl);
  ASSERT_EQ(v->kind(), Value::Kind::kObject);
  EXPECT_EQ(v->call(), Value::Call::kReduce);
  ASSERT_EQ(v->items().size(), 2u);
  EXPECT_EQ(v->items()[0]->as_int(), 1);
  EXPECT_EQ(v->items()[1]->as_int(), 2);
  expect_round_trip(pkl);
}

TEST(PicklerOpaque, AppendedAndSetItemsOntoAnObjectAreKept) {
  // A list subclass with two items (NEWOBJ, then APPENDS), and a dict subclass with one item
  // (NEWOBJ, then SETITEMS).
  const std::string list_pkl =
      "\x80\x02"
      "cmymod\nMyList\nq\x00)\x81q\x01(K\x01K\x02"
      "e."s;  // ("\x02e" would be one escape)
  ValuePtr l = unpickled(list_pkl);
  ASSERT_EQ(l->kind(), Value::Kind::kObject);
  ASSERT_EQ(l->appended().size(), 2u);
  EXPECT_EQ(l->appended()[1]->as_int(), 2);
  expect_round_trip(list_pkl);
  const std::string dict_pkl =
      "\x80\x02"
      "cmymod\nMyDict\nq\x00)\x81q\x01X\x01\x00\x00\x00"
      "aq\x02K\x07s."s;
  ValuePtr d = unpickled(dict_pkl);
  ASSERT_EQ(d->kind(), Value::Kind::kObject);
  ASSERT_EQ(d->entries().size(), 1u);
  expect_round_trip(dict_pkl);
}

TEST(PicklerOpaque, WithoutAdmissionTheGlobalIsRefusedByName) {
  internal::UnpicklerHooks strict;
  strict.allow_global = [](const std::string&, const std::string&) { return false; };
  Error e = capture_error([&] {
    unpickled(
        "\x80\x02"
        "cos\nsystem\nq\x00."s,
        strict);
  });
  EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  EXPECT_NE(std::string(e.what()).find("os.system"), std::string::npos) << e.what();
}

}  // namespace opaque
}  // namespace
}  // namespace ckpt::test
