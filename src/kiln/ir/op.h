// The op registry built from ops.def: one OpInfo per op (in-place elementwise forms included),
// with its signature, kind, alias facts and type rule. Passes ask these facts; none switches over
// all ops.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/ir/constant.h"
#include "kiln/ir/types.h"

namespace kiln {

// KILN_IF_true(x) is `x,`, KILN_IF_false(x) is nothing: the in-place column of ops.def decides
// whether an elementwise op gets an `Id_` enum value.
#define KILN_IF_true(x) x,
#define KILN_IF_false(x)

enum class OpId : uint16_t {
#define KILN_UNARY(Id, name, rule, inplace, f, i) k##Id, KILN_IF_##inplace(k##Id##_)
#define KILN_BINARY(Id, name, sig, rule, inplace, f, i) k##Id, KILN_IF_##inplace(k##Id##_)
#define KILN_TERNARY(Id, name, sig, rule, inplace, f, i) k##Id, KILN_IF_##inplace(k##Id##_)
#define KILN_OP(Id, name, kind, sig, rule, outputs, alias) k##Id,
#include "kiln/ir/ops.def"
  kNumOps
};

enum class OpKind : uint8_t {
  kElementwise,
  kReduction,
  kView,
  kScatter,
  kMutation,
  kCreation,
  kJoin,
  kOpaque,
  kComposite,
  kIndex,  // index_select, index_copy, index_add: positions along a dim from an index tensor
};
std::string_view op_kind_name(OpKind kind);
// A view whose elements are its input's in the same row-major order, only the shape differing:
// reshape, view, flatten, unflatten, squeeze, unsqueeze.
bool keeps_row_major_order(OpId id);

// How an op's output relates to its first argument.
enum class AliasKind : uint8_t {
  kNone,          // a fresh tensor
  kViewOf0,       // shares storage with argument 0
  kMaybeViewOf0,  // a view when the strides allow, else a copy (reshape, flatten)
  kMutates0,      // writes argument 0's memory and returns it
  kMetadata0,     // changes argument 0's sizes/strides in place (transpose_, ...) and returns it
};

// How a composite op's result is laid out (ops.def, KILN_COMPOSITE): as its subsymbols compute it
// (every other op's result is laid out by its own type and storage rules), or as ATen's kernel
// allocates it.
enum class ResultLayout : uint8_t {
  kAsComputed,
  kContiguous,       // row-major, whatever the input's layout
  kSuggestedFormat,  // the first input's suggest_memory_format() (channels-last or row-major)
};

// How an elementwise op decides its result dtype from the promoted dtype of its operands.
enum class DTypeRule : uint8_t {
  kNotElementwise,
  kUnarySame,        // keeps the dtype; bool is rejected
  kUnarySameOrBool,  // keeps the dtype, bool included
  kUnaryFloat,       // integers and bool become the default float
  kUnaryFloatOnly,   // floating inputs only
  kUnaryToBool,      // result is bool
  kUnaryIntegral,    // integers and bool only
  kArith,            // promoted dtype
  kArithNoBool,      // promoted dtype; bool rejected (sub)
  kDiv,              // true division: float; with a rounding mode: promoted
  kBinaryFloat,      // promoted, integers become the default float
  kCompare,          // bool result
  kLogical,          // bool result
  kBitwise,          // integers and bool only
  kWhere,            // promote the two values; the condition must be bool
  kClamp,            // promoted over self, min and max
  kFloatOnly,        // promoted; floating only
  kCast,             // the dtype argument
};

enum class ParamKind : uint8_t {
  kTensor,          // T
  kTensorOrScalar,  // TS: a tensor, a scalar input or a number literal
  kScalar,          // S: a scalar input or a number literal
  kInt,
  kInts,
  kIntOrInts,
  kBool,
  kDType,
  kString,
  kDevice,
  kIndex,
  kTensorList,  // Ts
};

struct Param {
  std::string name;
  ParamKind kind = ParamKind::kTensor;
  bool optional = false;  // accepts None
  bool keyword_only = false;
  bool has_default = false;
  Constant default_value;
};

struct Node;
struct Operand;
struct OpInfo;

// Infers the output types from the operands (already checked against the signature). Throws a
// UserError for shapes, dtypes or arguments PyTorch would reject.
using TypeRule = std::vector<TensorType> (*)(const OpInfo& op, std::span<const Operand> args);

struct OpInfo {
  OpId id;
  std::string name;  // "add", "add_"
  OpKind kind;
  std::vector<Param> params;
  TypeRule type_rule;
  int num_outputs;  // -1: decided by the type rule (split, chunk, unbind)
  AliasKind alias;
  DTypeRule dtype_rule = DTypeRule::kNotElementwise;
  int arity = 0;         // number of elementwise operands (elementwise ops only)
  OpId functional_form;  // for an in-place elementwise op, the op it applies; else its own id
  bool has_inplace_form = false;
  ResultLayout result_layout = ResultLayout::kAsComputed;

  bool is_inplace_elementwise() const { return functional_form != id; }
  bool mutates_arg0() const { return alias == AliasKind::kMutates0; }
  bool is_metadata_mutation() const { return alias == AliasKind::kMetadata0; }
  bool is_mutation() const { return mutates_arg0() || is_metadata_mutation(); }
  int param_index(std::string_view param_name) const;  // -1 if absent
};

const OpInfo& op_info(OpId id);
const OpInfo* find_op(std::string_view name);  // nullptr if unknown
std::span<const OpInfo> all_ops();
// The in-place form of an elementwise op (kAdd -> kAdd_); asserts that it has one.
OpId inplace_form(OpId id);

}  // namespace kiln
