#include "kiln/ir/trace.h"

#include <algorithm>

#include "kiln/support/error.h"

namespace kiln {

namespace {
template <class T>
const T& get_constant(const Operand& op, const char* what) {
  KILN_ASSERT(op.is_constant() && std::holds_alternative<T>(op.constant()))
      << "operand is not " << what;
  return std::get<T>(op.constant());
}
}  // namespace

int64_t Operand::as_int() const {
  return get_constant<int64_t>(*this, "an int");
}
std::optional<int64_t> Operand::as_optional_int() const {
  if (is_none()) return std::nullopt;
  return as_int();
}
const IntList& Operand::as_ints() const {
  return get_constant<IntList>(*this, "an int list");
}
std::optional<IntList> Operand::as_optional_ints() const {
  if (is_none()) return std::nullopt;
  if (is_constant() && std::holds_alternative<int64_t>(constant())) return IntList{as_int()};
  return as_ints();
}
bool Operand::as_bool() const {
  return get_constant<bool>(*this, "a bool");
}
std::optional<DType> Operand::as_optional_dtype() const {
  if (is_none()) return std::nullopt;
  return as_dtype();
}
DType Operand::as_dtype() const {
  return get_constant<DType>(*this, "a dtype");
}
const std::string& Operand::as_string() const {
  return get_constant<std::string>(*this, "a string");
}
Device Operand::as_device() const {
  return get_constant<Device>(*this, "a device");
}
const IndexKey& Operand::as_index() const {
  return get_constant<IndexKey>(*this, "an index");
}

const Operand& Node::arg(std::string_view param_name) const {
  int i = op->param_index(param_name);
  KILN_ASSERT(i >= 0) << op->name << " has no parameter " << param_name;
  return operands.at(static_cast<size_t>(i));
}

Value* Trace::find_value(std::string_view name) const {
  for (const auto& v : values_) {
    if (v->name() == name) return v.get();
  }
  return nullptr;
}

void Trace::replace_all_uses(Value* from, Value* to) {
  for (auto& node : nodes_) {
    for (Operand& op : node->operands) {
      if (op.is_value() && op.value() == from) op = Operand(to);
      if (op.is_value_list()) {
        std::vector<Value*> vs = op.values();
        for (Value*& v : vs)
          if (v == from) v = to;
        op = Operand(vs);
      }
    }
  }
  for (Value*& v : outputs_)
    if (v == from) v = to;
  for (auto& wb : writebacks)
    if (wb.second == from) wb.second = to;
}

void Trace::move_last_nodes_before(size_t count, const Node* position) {
  KILN_ASSERT(count <= nodes_.size()) << "move_last_nodes_before: fewer nodes than asked";
  auto at = std::find_if(nodes_.begin(), nodes_.end() - static_cast<std::ptrdiff_t>(count),
                         [&](const std::unique_ptr<Node>& n) { return n.get() == position; });
  KILN_ASSERT(at != nodes_.end() - static_cast<std::ptrdiff_t>(count))
      << "move_last_nodes_before: the position is not a node before the moved ones";
  std::rotate(at, nodes_.end() - static_cast<std::ptrdiff_t>(count), nodes_.end());
}

}  // namespace kiln
