// The only way to make nodes. `call` binds arguments to the op's signature (positional, then
// keywords, then defaults), checks each argument's kind, infers output types with the op's type
// rule (a UserError names the op and the source line), names the outputs and, for ops with a
// decomposition, records the subsymbols.
#pragma once

#include <deque>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kiln/ir/trace.h"

namespace kiln {

using KeywordArgs = std::vector<std::pair<std::string, Operand>>;

class Builder {
 public:
  explicit Builder(Trace& trace);

  Value* add_input(std::string name, Type type);
  std::vector<Value*> call(OpId op, std::vector<Operand> args, KeywordArgs kwargs = {},
                           SourceLoc loc = {});
  // With operands already bound: one per signature parameter, in order (passes copying a node).
  // `output_names`, if given, names the outputs (a pass cloning a node keeps its names).
  std::vector<Value*> call_bound(OpId op, std::vector<Operand> operands, SourceLoc loc = {},
                                 const std::vector<std::string>* output_names = nullptr);
  // For ops with exactly one output.
  Value* call1(OpId op, std::vector<Operand> args, KeywordArgs kwargs = {}, SourceLoc loc = {});
  // Like call, with output names chosen by the caller (the parser keeps the file's names).
  // `subsymbol_names` names the values the op's decomposition defines, in order.
  std::vector<Value*> call_named(OpId op, std::vector<Operand> args, KeywordArgs kwargs,
                                 SourceLoc loc, const std::vector<std::string>& output_names,
                                 std::vector<std::string> subsymbol_names = {});
  void set_outputs(std::vector<Value*> outputs) { trace_.set_outputs(std::move(outputs)); }
  // Names fresh values must not take (the parser reserves every name its file defines).
  void reserve_name(std::string name) { reserved_names_.insert(std::move(name)); }

  // Binds args to the signature and checks kinds; the result has one operand per parameter.
  static std::vector<Operand> bind(const OpInfo& op, std::vector<Operand> args, KeywordArgs kwargs);

  Trace& trace() { return trace_; }

 private:
  std::vector<Value*> emit(const OpInfo& op, std::vector<Operand> operands, SourceLoc loc,
                           const std::vector<std::string>* output_names);
  Value* new_value(std::string name, Type type);
  std::string fresh_name();

  Trace& trace_;
  std::vector<std::unique_ptr<Node>>* sink_;  // the trace's nodes, or a node's subsymbols
  std::set<std::string> used_names_;
  std::set<std::string> reserved_names_;
  std::deque<std::string> pending_names_;  // names for the next fresh values (parser)
  bool rename_results_ = false;  // name a decomposition's results after the statement's outputs
  int next_temp_ = 0;
};

// Decompositions (decompositions.cpp): emit the primitives an op lowers to, return its outputs.
using Decomposition = std::vector<Value*> (*)(Builder& b, const Node& node);
Decomposition find_decomposition(OpId id);  // nullptr if the op is primitive

// Re-runs the type rule of a node's op on its operands (the verifier uses it).
std::vector<TensorType> infer_types(const OpInfo& op, std::span<const Operand> operands);

}  // namespace kiln
