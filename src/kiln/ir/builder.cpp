#include "kiln/ir/builder.h"

#include <algorithm>

#include "kiln/support/error.h"

namespace kiln {

Builder::Builder(Trace& trace) : trace_(trace), sink_(&trace.nodes_) {
  for (const auto& v : trace.values_)
    used_names_.insert(v->name());
}

Value* Builder::new_value(std::string name, Type type) {
  KILN_CHECK(!used_names_.contains(name))
      << "the name '" << name << "' is defined twice; give every value its own name.";
  used_names_.insert(name);
  auto v = std::make_unique<Value>(static_cast<int>(trace_.values_.size()), std::move(name),
                                   std::move(type));
  Value* raw = v.get();
  trace_.values_.push_back(std::move(v));
  return raw;
}

std::string Builder::fresh_name() {
  if (!pending_names_.empty()) {
    std::string name = std::move(pending_names_.front());
    pending_names_.pop_front();
    return name;
  }
  std::string name;
  do {
    name = "t" + std::to_string(next_temp_++);
  } while (used_names_.contains(name) || reserved_names_.contains(name));
  return name;
}

Value* Builder::add_input(std::string name, Type type) {
  bool ok = !name.empty() && !(name[0] >= '0' && name[0] <= '9');
  for (char c : name)
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
  KILN_CHECK(ok) << "input name '" << name
                 << "' is not a Python identifier; use letters, digits and '_'.";
  Value* v = new_value(std::move(name), std::move(type));
  trace_.inputs_.push_back(v);
  return v;
}

namespace {

std::string kind_name(ParamKind kind) {
  switch (kind) {
    case ParamKind::kTensor:
      return "a tensor";
    case ParamKind::kTensorOrScalar:
      return "a tensor or a number";
    case ParamKind::kScalar:
      return "a number";
    case ParamKind::kInt:
      return "an int";
    case ParamKind::kInts:
      return "a list of ints";
    case ParamKind::kIntOrInts:
      return "an int or a list of ints";
    case ParamKind::kBool:
      return "a bool";
    case ParamKind::kDType:
      return "a dtype";
    case ParamKind::kString:
      return "a string";
    case ParamKind::kDevice:
      return "a device";
    case ParamKind::kIndex:
      return "an index (ints, slices, None, ...)";
    case ParamKind::kTensorList:
      return "a list of tensors";
  }
  return "?";
}

std::string describe(const Operand& arg) {
  if (arg.is_value())
    return "'" + arg.value()->name() + "' (" + type_str(arg.value()->type()) + ")";
  if (arg.is_value_list()) return "a list of values";
  return constant_str(arg.constant());
}

// Checks one argument against its parameter and normalizes it (an int where a list is expected
// becomes a one-element list; a device string becomes a Device). Returns false on a mismatch.
bool conform(const Param& p, Operand& arg) {
  if (arg.is_none()) return p.optional;
  auto holds = [&](auto tag) {
    return arg.is_constant() && std::holds_alternative<decltype(tag)>(arg.constant());
  };
  auto is_number_constant = [&] { return arg.is_constant() && is_number(arg.constant()); };
  switch (p.kind) {
    case ParamKind::kTensor:
      return arg.is_value() && arg.value()->is_tensor();
    case ParamKind::kTensorOrScalar:
      return arg.is_value() || is_number_constant();
    case ParamKind::kScalar:
      return (arg.is_value() && !arg.value()->is_tensor()) || is_number_constant();
    case ParamKind::kInt:
      return holds(int64_t{});
    case ParamKind::kInts:
      if (holds(int64_t{})) arg = Operand(Constant(IntList{std::get<int64_t>(arg.constant())}));
      return holds(IntList{});
    case ParamKind::kIntOrInts:
      return holds(int64_t{}) || holds(IntList{});
    case ParamKind::kBool:
      return holds(bool{});
    case ParamKind::kDType:
      return holds(DType{});
    case ParamKind::kString:
      return holds(std::string{});
    case ParamKind::kDevice:
      if (holds(std::string{})) {
        auto d = Device::parse(std::get<std::string>(arg.constant()));
        if (!d) return false;
        arg = Operand(Constant(*d));
      }
      return holds(Device{});
    case ParamKind::kIndex:
      return holds(IndexKey{});
    case ParamKind::kTensorList: {
      // `[]` reads as an empty list of ints: an empty list of tensors (an eager_call of
      // torch.tensor([[1, 2]]) has no tensor inputs).
      if (holds(IntList{}) && std::get<IntList>(arg.constant()).empty())
        arg = Operand(std::vector<Value*>{});
      if (!arg.is_value_list()) return false;
      return std::all_of(arg.values().begin(), arg.values().end(),
                         [](Value* v) { return v && v->is_tensor(); });
    }
  }
  return false;
}

}  // namespace

std::vector<Operand> Builder::bind(const OpInfo& op, std::vector<Operand> args,
                                   KeywordArgs kwargs) {
  const auto& params = op.params;
  std::vector<Operand> bound(params.size());
  std::vector<bool> set(params.size(), false);
  size_t positional = 0;
  for (const Param& p : params)
    positional += !p.keyword_only;
  KILN_CHECK(args.size() <= positional)
      << op.name << " takes at most " << positional << " positional arguments but " << args.size()
      << " were given; pass the others by keyword.";
  for (size_t i = 0; i < args.size(); ++i) {
    bound[i] = std::move(args[i]);
    set[i] = true;
  }
  for (auto& [name, value] : kwargs) {
    int i = op.param_index(name);
    KILN_CHECK(i >= 0) << op.name << " got an unexpected keyword argument '" << name
                       << "'; remove it or use one of the op's parameters.";
    KILN_CHECK(!set[static_cast<size_t>(i)])
        << op.name << " got multiple values for argument '" << name << "'; pass it once.";
    bound[static_cast<size_t>(i)] = std::move(value);
    set[static_cast<size_t>(i)] = true;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (!set[i]) {
      KILN_CHECK(params[i].has_default)
          << op.name << " is missing the required argument '" << params[i].name << "'; pass it.";
      bound[i] = Operand(params[i].default_value);
    }
    std::string before = describe(bound[i]);
    KILN_CHECK(conform(params[i], bound[i]))
        << "argument '" << params[i].name << "' of " << op.name << " must be "
        << kind_name(params[i].kind) << (params[i].optional ? " or None" : "") << ", but got "
        << before << "; pass " << kind_name(params[i].kind) << ".";
  }
  return bound;
}

std::vector<TensorType> infer_types(const OpInfo& op, std::span<const Operand> operands) {
  return op.type_rule(op, operands);
}

std::vector<Value*> Builder::call(OpId op, std::vector<Operand> args, KeywordArgs kwargs,
                                  SourceLoc loc) {
  const OpInfo& info = op_info(op);
  ScopedErrorContext context(info.name, loc.str());
  return emit(info, bind(info, std::move(args), std::move(kwargs)), std::move(loc), nullptr);
}

std::vector<Value*> Builder::call_bound(OpId op, std::vector<Operand> operands, SourceLoc loc,
                                        const std::vector<std::string>* output_names) {
  const OpInfo& info = op_info(op);
  ScopedErrorContext context(info.name, loc.str());
  KILN_ASSERT(operands.size() == info.params.size())
      << info.name << " takes " << info.params.size() << " operands, got " << operands.size();
  for (size_t i = 0; i < operands.size(); ++i) {
    KILN_ASSERT(conform(info.params[i], operands[i]))
        << "operand '" << info.params[i].name << "' of " << info.name << " does not fit";
  }
  rename_results_ = output_names != nullptr;
  std::vector<Value*> outs;
  try {
    outs = emit(info, std::move(operands), std::move(loc), output_names);
  } catch (...) {
    rename_results_ = false;
    throw;
  }
  rename_results_ = false;
  return outs;
}

Value* Builder::call1(OpId op, std::vector<Operand> args, KeywordArgs kwargs, SourceLoc loc) {
  auto outs = call(op, std::move(args), std::move(kwargs), std::move(loc));
  KILN_ASSERT(outs.size() == 1) << op_info(op).name << " has " << outs.size() << " outputs";
  return outs[0];
}

std::vector<Value*> Builder::call_named(OpId op, std::vector<Operand> args, KeywordArgs kwargs,
                                        SourceLoc loc, const std::vector<std::string>& output_names,
                                        std::vector<std::string> subsymbol_names) {
  const OpInfo& info = op_info(op);
  ScopedErrorContext context(info.name, loc.str());
  pending_names_.assign(subsymbol_names.begin(), subsymbol_names.end());
  // Without written subsymbols, the decomposition's results take the statement's names.
  rename_results_ = subsymbol_names.empty();
  std::vector<Value*> outs;
  try {
    outs =
        emit(info, bind(info, std::move(args), std::move(kwargs)), std::move(loc), &output_names);
  } catch (...) {
    rename_results_ = false;
    pending_names_.clear();
    throw;
  }
  rename_results_ = false;
  KILN_CHECK(pending_names_.empty())
      << "the subsymbols written under " << info.name
      << " define more values than its decomposition makes; print the trace again with kiln.";
  return outs;
}

std::vector<Value*> Builder::emit(const OpInfo& op, std::vector<Operand> operands, SourceLoc loc,
                                  const std::vector<std::string>* output_names) {
  std::vector<TensorType> types = infer_types(op, operands);
  KILN_ASSERT(op.num_outputs < 0 || types.size() == static_cast<size_t>(op.num_outputs))
      << op.name << "'s type rule gave " << types.size() << " outputs";
  if (output_names) {
    KILN_CHECK(output_names->size() == types.size())
        << op.name << " defines " << types.size() << " values here but the statement names "
        << output_names->size() << "; name each output once.";
  }

  auto node = std::make_unique<Node>();
  node->op = &op;
  node->operands = std::move(operands);
  node->loc = std::move(loc);

  if (Decomposition decompose = find_decomposition(op.id)) {
    auto* saved = sink_;
    sink_ = &node->subsymbols;
    std::vector<Value*> results;
    try {
      results = decompose(*this, *node);
    } catch (...) {
      sink_ = saved;
      throw;
    }
    sink_ = saved;
    KILN_ASSERT(results.size() == types.size()) << op.name << " decomposition output count";
    for (size_t i = 0; i < results.size(); ++i) {
      Value* r = results[i];
      KILN_ASSERT(r->is_tensor() && r->tensor_type() == types[i])
          << op.name << "'s decomposition makes " << type_str(r->type())
          << " but its type rule says " << types[i].str();
      bool from_subsymbol =
          std::any_of(node->subsymbols.begin(), node->subsymbols.end(), [&](const auto& s) {
            return s->outputs.size() &&
                   std::find(s->outputs.begin(), s->outputs.end(), r) != s->outputs.end();
          });
      KILN_ASSERT(from_subsymbol) << op.name << "'s decomposition must end in a new value";
      if (output_names && rename_results_ && r->name() != (*output_names)[i]) {
        KILN_CHECK(!used_names_.contains((*output_names)[i]))
            << "the name '" << (*output_names)[i]
            << "' is defined twice; give every value its own name.";
        used_names_.erase(r->name());
        r->name_ = (*output_names)[i];
        used_names_.insert(r->name_);
      }
      if (output_names) {
        KILN_CHECK(r->name() == (*output_names)[i])
            << "the subsymbols under " << op.name << " end in '" << r->name()
            << "' but the statement defines '" << (*output_names)[i]
            << "'; print the trace again with kiln.";
      }
      r->producer_ = node.get();
      node->outputs.push_back(r);
    }
  } else {
    for (size_t i = 0; i < types.size(); ++i) {
      std::string name = output_names ? (*output_names)[i] : fresh_name();
      Value* v = new_value(std::move(name), types[i]);
      v->producer_ = node.get();
      node->outputs.push_back(v);
    }
  }
  std::vector<Value*> outs = node->outputs;
  sink_->push_back(std::move(node));
  return outs;
}

}  // namespace kiln
