// The trace IR: SSA values, nodes with operands, subsymbols and source locations, and the trace
// that owns them. Nodes are made only through the Builder (builder.h).
//
// An eager trace keeps PyTorch's mutation semantics: a value names a tensor *handle* (a Python
// object) at one point in program order, and a node reads its operands' memory when it runs. An
// in-place op's output names the same handle as its first argument; a metadata mutation's output
// is that handle with its new sizes and strides.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/ir/constant.h"
#include "kiln/ir/op.h"
#include "kiln/ir/types.h"

namespace kiln {

struct Node;

class Value {
 public:
  Value(int id, std::string name, Type type)
      : id_(id), name_(std::move(name)), type_(std::move(type)) {}
  int id() const { return id_; }
  const std::string& name() const { return name_; }
  const Type& type() const { return type_; }
  bool is_tensor() const { return std::holds_alternative<TensorType>(type_); }
  const TensorType& tensor_type() const { return std::get<TensorType>(type_); }
  const ScalarType& scalar_type() const { return std::get<ScalarType>(type_); }
  Node* producer() const { return producer_; }  // nullptr for trace inputs
  // An integer input whose every element lies in [first, second] (inclusive) whatever the
  // caller passes: a backward program's saved index, which the forward program checked against
  // the same dim before it ran (differentiate.cpp). Printed as `# <name> in [lo, hi]` after the
  // input's type; analysis/integer_range.h reads it (index checks the forward made are not
  // made again). Nullopt: nothing known.
  const std::optional<std::pair<int64_t, int64_t>>& known_range() const { return known_range_; }
  void set_known_range(std::optional<std::pair<int64_t, int64_t>> range) { known_range_ = range; }

 private:
  friend class Builder;
  friend class Trace;
  int id_;
  std::string name_;
  Type type_;
  Node* producer_ = nullptr;
  std::optional<std::pair<int64_t, int64_t>> known_range_;
};

// One argument of a node: an SSA value, a constant, or a list of values (cat's tensors).
struct Operand {
  std::variant<Value*, Constant, std::vector<Value*>> data;

  Operand() : data(Constant(NoneValue{})) {}
  Operand(Value* v) : data(v) {}  // NOLINT: implicit on purpose, operands read like arguments
  Operand(Constant c) : data(std::move(c)) {}               // NOLINT
  Operand(std::vector<Value*> vs) : data(std::move(vs)) {}  // NOLINT
  Operand(int64_t i) : data(Constant(i)) {}                 // NOLINT
  Operand(int i) : data(Constant(int64_t{i})) {}            // NOLINT
  Operand(double d) : data(Constant(d)) {}                  // NOLINT
  Operand(bool b) : data(Constant(b)) {}                    // NOLINT

  bool is_value() const { return std::holds_alternative<Value*>(data); }
  bool is_constant() const { return std::holds_alternative<Constant>(data); }
  bool is_value_list() const { return std::holds_alternative<std::vector<Value*>>(data); }
  bool is_none() const { return is_constant() && kiln::is_none(constant()); }
  Value* value() const { return std::get<Value*>(data); }
  const Constant& constant() const { return std::get<Constant>(data); }
  const std::vector<Value*>& values() const { return std::get<std::vector<Value*>>(data); }

  // Typed accessors for constants; a mismatch is an internal error (the builder checked kinds).
  int64_t as_int() const;
  std::optional<int64_t> as_optional_int() const;
  const IntList& as_ints() const;
  std::optional<IntList> as_optional_ints() const;
  bool as_bool() const;
  std::optional<DType> as_optional_dtype() const;
  DType as_dtype() const;
  const std::string& as_string() const;
  Device as_device() const;
  const IndexKey& as_index() const;
};

// Where the user wrote an op: "seed.py:5" plus, when known, the source text of that line.
struct SourceLoc {
  std::string file;
  int line = 0;
  std::string text;
  bool empty() const { return file.empty(); }
  std::string str() const { return file.empty() ? "" : file + ":" + std::to_string(line); }
};

struct Node {
  const OpInfo* op = nullptr;
  std::vector<Operand> operands;  // one per signature parameter, defaults filled in
  std::vector<Value*> outputs;
  // The decomposition this op was lowered through (softmax -> amax, sub, exp, sum, div). Their
  // inputs are this node's operands; the last subsymbols define this node's outputs.
  std::vector<std::unique_ptr<Node>> subsymbols;
  SourceLoc loc;

  OpId id() const { return op->id; }
  const Operand& arg(std::string_view param_name) const;
  const Operand& arg(size_t i) const { return operands.at(i); }
  Value* input(size_t i) const { return operands.at(i).value(); }
  // Calls f on each value operand, those of value lists included, in order.
  template <class F>
  void for_each_value_operand(F&& f) const {
    for (const Operand& o : operands) {
      if (o.is_value()) f(o.value());
      if (o.is_value_list())
        for (Value* v : o.values())
          f(v);
    }
  }
};

// What the trace returns: for now a flat tuple of values (an entry may be an input).
class Trace {
 public:
  Trace() = default;
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;
  Trace(Trace&&) = default;
  Trace& operator=(Trace&&) = default;

  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<std::unique_ptr<Node>>& nodes() const { return nodes_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  void set_outputs(std::vector<Value*> outputs) { outputs_ = std::move(outputs); }

  // After functionalization: the final value of each input whose memory the program changes
  // (input -> value). A writeback is never dead.
  std::vector<std::pair<Value*, Value*>> writebacks;
  // Lines printed as comments before the return (what a pass wants a reader to know, e.g. how
  // outputs relate to the caller's tensors). The parser skips them.
  std::vector<std::string> notes;

  // The header line: "# Constructed by <constructed_by> (<ms> ms)".
  std::string constructed_by = "trace";
  double construction_ms = 0.0;
  std::string name = "computation";

  Value* find_value(std::string_view name) const;  // nullptr if absent

  // Rewriting (passes): every use of `from` — operands, outputs, writebacks — becomes `to`.
  void replace_all_uses(Value* from, Value* to);
  // Removes the top-level nodes `drop` says to drop (their values stay owned, unused).
  template <class Pred>
  void erase_nodes(Pred drop) {
    std::erase_if(nodes_, [&](const std::unique_ptr<Node>& n) { return drop(*n); });
  }
  // Moves the last `count` nodes (just made by a Builder, which appends) to just before
  // `position`, a top-level node: a pass's insertion point.
  void move_last_nodes_before(size_t count, const Node* position);
  size_t num_values() const { return values_.size(); }

 private:
  friend class Builder;
  std::vector<std::unique_ptr<Value>> values_;
  std::vector<Value*> inputs_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<Value*> outputs_;
};

}  // namespace kiln
