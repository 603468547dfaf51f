// A value at an index: code placement by loop level, loads and views, numbers, elementwise and
// creation ops. Part of the kernel emitter (kernel_emitter.h).
#include "kiln/codegen/kernel_emitter.h"

namespace kiln::codegen::detail {

// `code` with every line indented by `depth` two-space steps.
std::string KernelEmitter::indented(const std::string& code, int depth) {
  std::string out, pad(static_cast<size_t>(2 * depth), ' ');
  size_t at = 0;
  while (at < code.size()) {
    size_t end = code.find('\n', at);
    if (end == std::string::npos) end = code.size();
    out += pad + code.substr(at, end - at) + "\n";
    at = end + 1;
  }
  return out;
}

IndexExpr KernelEmitter::mul(const IndexExpr& index, const std::string& stride) {
  if (index.is_zero()) return IndexExpr::number(0);
  std::string t = index.text;
  if (t.find_first_of(" */%+-") != std::string::npos) t = "(" + t + ")";
  return IndexExpr::var(t + "*" + stride);
}

// ---- code placement ----------------------------------------------------------------------

// The variable names in a piece of C++ text (number literals such as 0x1p+0 or 1LL hold none).
std::vector<std::string_view> KernelEmitter::variables_in(std::string_view text) {
  std::vector<std::string_view> names;
  size_t at = 0;
  while (at < text.size()) {
    char c = text[at];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t end = at;
      while (end < text.size() &&
             (std::isalnum(static_cast<unsigned char>(text[end])) || text[end] == '_'))
        ++end;
      names.push_back(text.substr(at, end - at));
      at = end;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      while (at < text.size() && (std::isalnum(static_cast<unsigned char>(text[at])) ||
                                  text[at] == '.' || text[at] == '_'))
        ++at;
    } else {
      ++at;
    }
  }
  return names;
}

// The dims d < `below` whose nest index i<d> a piece of code reads (a loop's code that may move
// out of the loops it does not read).
std::set<size_t> KernelEmitter::nest_indices_read(std::string_view text, size_t below) {
  std::set<size_t> read;
  for (std::string_view name : variables_in(text)) {
    for (size_t d = 0; d < below; ++d)
      if (name.size() > 1 && name[0] == 'i' && name.substr(1) == std::to_string(d)) read.insert(d);
  }
  return read;
}

// The level a piece of code belongs at: the innermost level of the variables it uses.
int KernelEmitter::depth_of(std::string_view text) const {
  int depth = 0;
  for (std::string_view name : variables_in(text)) {
    auto it = level_of_.find(std::string(name));
    if (it != level_of_.end()) depth = std::max(depth, it->second);
  }
  return depth;
}

int KernelEmitter::depth_of(const Index& index) const {
  int depth = 0;
  for (const IndexExpr& e : index)
    depth = std::max(depth, depth_of(e.text));
  return depth;
}

// Appends a line at `level`; `defines` (if any) is the variable it declares. A region whose
// code outgrows kMaxKernelSource (inlined views and scatters evaluated at many different
// indices multiply: a chain of as_strided_scatters made 16 MB of C++ that took the compiler
// minutes) is not lowered, and runs as a step without a kernel instead.
void KernelEmitter::emit(int level, const std::string& line, const std::string& defines) {
  emitted_ += line.size() + 1;
  if (emitted_ > kMaxKernelSource)
    not_lowered("the kernel's source would exceed " + std::to_string(kMaxKernelSource >> 10) +
                " KiB (values inlined at many indices)");
  levels_.at(static_cast<size_t>(level)) += line + "\n";
  if (!defines.empty()) level_of_[defines] = level;
}

// Ends the innermost level (a loop's body, opened with levels_.emplace_back()): returns its
// code and forgets the values defined in it, which exist only inside the loop.
std::string KernelEmitter::close_level(int level) {
  std::string body = levels_.back();
  levels_.pop_back();
  for (auto it = memo_.begin(); it != memo_.end();) {
    auto l = level_of_.find(it->second.expr);
    it = l != level_of_.end() && l->second >= level ? memo_.erase(it) : std::next(it);
  }
  for (auto it = level_of_.begin(); it != level_of_.end();)
    it = it->second >= level ? level_of_.erase(it) : std::next(it);
  return body;
}

// Declares `name` = `expr` at the level `expr` needs.
void KernelEmitter::declare(const std::string& type, const std::string& name,
                            const std::string& expr) {
  emit(depth_of(expr), "[[maybe_unused]] const " + type + " " + name + " = " + expr + ";", name);
}

// Declares a new variable of v's register type.
Val KernelEmitter::define(DType dtype, const std::string& expr) {
  Val v{fresh("v"), dtype};
  declare(reg(dtype), v.expr, expr);
  return v;
}

// The register type of a dtype's values (cpu_prelude.h, cuda_prelude.cuh): float64 in double,
// the other floating dtypes in float (every value held is exactly one of the dtype's), at twice
// the vector width of double (bf16 x.abs() was 4x eager's time). What an op computes in is
// compute_reg's choice.
std::string KernelEmitter::reg(DType d) const {
  if (!is_floating(d)) return "int64_t";
  if (d == DType::kFloat64) return "double";
  return "float";
}

// The type an op computes a value of dtype d in, where its result is rounded to d once: on the
// CPU float32 in double (libm's double functions are nearer eager's than the float ones, and
// `a + alpha * b` rounds once, as the interpreter does), except the ops that give the same float
// either way (same_in_float_op), at twice the vector width: a bf16 batch norm upcast to float32
// ran at half eager's speed.
std::string KernelEmitter::compute_reg(DType d) const {
  return target_ == Target::kCpu && d == DType::kFloat32 ? "double" : reg(d);
}

// The ops whose float32 result is the same computed in float as in double: one correctly rounded
// float operation (a float quotient rounded from double is the float quotient: 53 >= 2 * 24 + 2,
// so a reciprocal too), or exp, tanh, sigmoid, silu, erf and gelu, which scalar_math.h computes in
// float from the float operand in both (exp_f32, tanh_f32, erf_f32).
bool KernelEmitter::same_in_float_op(const Node& node, int rounding) {
  auto unit_alpha = [&] {
    const Operand& a = node.arg("alpha");
    if (!a.is_constant()) return false;
    if (const auto* i = std::get_if<int64_t>(&a.constant())) return *i == 1;
    if (const auto* d = std::get_if<double>(&a.constant())) return *d == 1.0;
    return false;
  };
  switch (node.id()) {
    case OpId::kAdd:
    case OpId::kSub:
      return unit_alpha();
    case OpId::kDiv:
      return rounding == 0;
    case OpId::kReciprocal:  // (1 / a: one division, as kDiv)
    case OpId::kMul:
    case OpId::kNeg:
    case OpId::kAbs:
    case OpId::kRelu:
    case OpId::kSqrt:
    case OpId::kMaximum:
    case OpId::kMinimum:
    case OpId::kClamp:
    case OpId::kWhere:
    case OpId::kEq:
    case OpId::kNe:
    case OpId::kLt:
    case OpId::kLe:
    case OpId::kGt:
    case OpId::kGe:
    case OpId::kCopy:
    case OpId::kTo:
    case OpId::kExp:
    case OpId::kTanh:
    case OpId::kSigmoid:
    case OpId::kSilu:
    case OpId::kErf:
    case OpId::kGelu:
      return true;
    default:
      return false;
  }
}

// ---- values ------------------------------------------------------------------------------

// The node that computes `v`: its producer, or for a decomposed op the subsymbol that does.
const Node* KernelEmitter::defining_node(const Value* v) {
  const Node* p = v->producer();
  while (p && !p->subsymbols.empty()) {
    const Node* found = nullptr;
    for (const auto& s : p->subsymbols)
      if (std::find(s->outputs.begin(), s->outputs.end(), v) != s->outputs.end()) found = s.get();
    if (!found) not_lowered(p->op->name + ": a decomposition that does not define its output");
    p = found;
  }
  return p;
}

Val KernelEmitter::eval(const Value* v, const Index& at) {
  // A value used only under a scatter's condition is kept apart from the same value used
  // unconditionally, so that every unconditional load is seen as one (record_last_nest_loads).
  std::string key =
      std::to_string(v->id()) + "@" + index_key(at) + (guard_depth_ > 0 ? "|guarded" : "");
  auto it = memo_.find(key);
  if (it != memo_.end()) return it->second;
  if (std::optional<Val> kept = read_kept_row_value(key)) return memo_[key] = *kept;
  Val r = compute(v, at);
  memo_[key] = r;
  return r;
}

// Whether the lanes of a vector variant read consecutive entries of v's table at `at`: the table
// varies along one dim alone (row-major: its entries are that dim's), indexed by the lanes' dim.
bool KernelEmitter::lanes_along_table(const Value* v, const Index& at) const {
  if (!lanes_ || lanes_->inner_dim < 0) return false;
  const Shape& shape = v->tensor_type().shape;
  int varying = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    if (varying >= 0) return false;
    varying = static_cast<int>(d);
  }
  return varying >= 0 &&
         at[static_cast<size_t>(varying)].text == "i" + std::to_string(lanes_->inner_dim);
}

Val KernelEmitter::compute(const Value* v, const Index& at) {
  if (!v->is_tensor()) not_lowered("a number used as a tensor");
  if (auto table = table_name_.find(v); table != table_name_.end()) {
    if (lanes_along_table(v, at)) {
      lane_tables_.insert(table->second);
      return define(v->tensor_type().dtype, "lane_" + table->second + "[l]");
    }
    return define(v->tensor_type().dtype, table->second + "[" + table_position(v, at) + "]");
  }
  auto in = input_index_.find(v);
  if (in != input_index_.end()) return load(in->second, at);
  if (auto stored = stored_by_earlier_nest_.find(v); stored != stored_by_earlier_nest_.end()) {
    std::string n = std::to_string(stored->second);
    IndexExpr address = IndexExpr::var("oo" + n);
    for (size_t d = 0; d < at.size(); ++d)
      address = address + mul(at[d], "os" + n + "_" + std::to_string(d));
    DType dtype = v->tensor_type().dtype;
    return define(dtype, "ld_" + suffix(dtype) + "(out" + n + ", " + address.text + ")");
  }
  const Node* node = defining_node(v);
  KILN_ASSERT(node) << "'" << v->name() << "' has no producer and is not a region input";
  const OpInfo& op = *node->op;
  size_t output = 0;
  while (node->outputs[output] != v)
    ++output;
  switch (op.kind) {
    case OpKind::kView: {
      if (node->id() == OpId::kAsStrided) return as_strided(*node, at);
      std::optional<Index> from = view_source_index(*node, output, at);
      if (!from) not_lowered(op.name + ": this view is not lowered yet");
      return eval(node->input(0), *from);
    }
    case OpKind::kElementwise:
      return elementwise(*node, at);
    case OpKind::kCreation:
      return creation(*node, at);
    case OpKind::kScatter:
      return scatter(*node, at);
    case OpKind::kIndex:
      return indexed(*node, at);
    case OpKind::kReduction:
      return reduction(*node, at);
    case OpKind::kJoin:
      return join(*node, at);
    case OpKind::kOpaque:
      not_lowered(op.name + ": an opaque op runs on its own");
    default:
      not_lowered(op.name + ": " + std::string(op_kind_name(op.kind)) + " ops are not lowered");
  }
}

// The element of input k at `at`: o<k> + at[0]*s<k>_0 + ..., or, in a CPU nest or a CUDA row nest
// where a pass over adjacent reduced dims reads them, that or the merged form (merged_address).
std::string KernelEmitter::load_address(size_t k, const Index& at) {
  const std::string n = std::to_string(k);
  return strided_address("o" + n, "s" + n + "_", body_.inputs()[k]->tensor_type().shape, at);
}

// base + at[0] * <strides>0 + ... of a tensor of `shape`, in its merged form where it has one.
std::string KernelEmitter::strided_address(const std::string& base, const std::string& strides,
                                           const Shape& shape, const Index& at) {
  IndexExpr address = IndexExpr::var(base);
  for (size_t d = 0; d < at.size(); ++d)
    address = address + mul(at[d], strides + std::to_string(d));
  if (!merge_reduced_dims_ || divmods_.empty()) return address.text;
  std::vector<std::string> flags;
  std::optional<std::string> merged = merged_address(base, strides, shape, at, flags);
  if (!merged) return address.text;
  std::string all;
  for (const std::string& f : flags)
    all += (all.empty() ? "" : " && ") + f;
  return "(" + all + " ? " + *merged + " : " + address.text + ")";
}

Val KernelEmitter::load(size_t k, const Index& at) {
  const TensorType& t = body_.inputs()[k]->tensor_type();
  std::string n = std::to_string(k);
  std::string key = index_key(at);
  loads_[k].insert(key);
  if (row_pass_depth_ == 0) loads_outside_row_passes_[k].insert(key);
  if (guard_depth_ > 0)
    guarded_loads_[k] = true;
  else
    unguarded_loads_[k].insert(key);
  if (lanes_ && lanes_->inputs.contains(k)) {
    KILN_ASSERT(key == index_key(loop_index(body_.inputs()[k]->tensor_type().shape)))
        << "a vector input loaded away from its element";
    return define(t.dtype, "ld_" + suffix(t.dtype) + "(lane_in" + n + ", l)");
  }
  if (lanes_ && lanes_->suffix_inputs.contains(k))  // (suffix_lanes checked the index)
    return define(t.dtype, "ld_" + suffix(t.dtype) + "(lane_in" + n + ", within)");
  if (std::optional<Val> cached = row_cached_load(k, at)) return *cached;
  if (std::optional<Val> tiled = tile_load(k, at)) return *tiled;
  return define(t.dtype, "ld_" + suffix(t.dtype) + "(in" + n + ", " + load_address(k, at) + ")");
}

// as_strided reads its input's storage: storage_offset + sum(index * stride). Of a region input
// the kernel reads that storage itself (the executor checks the window is inside it); of a
// computed 1-D value that is a whole storage of its own, the value at that position.
Val KernelEmitter::as_strided(const Node& node, const Index& at) {
  const Value* src = node.input(0);
  const IntList& sizes = node.arg("size").as_ints();
  const IntList& strides = node.arg("stride").as_ints();
  std::optional<int64_t> offset = node.arg("storage_offset").as_optional_int();
  auto in = input_index_.find(src);
  if (in == input_index_.end()) {
    if (src->tensor_type().rank() != 1)
      not_lowered("as_strided: of a computed value that is not 1-D");
    require_whole_storage(src);
    Geometry window{Shape(sizes.begin(), sizes.end()), Strides(strides.begin(), strides.end()),
                    offset.value_or(0)};
    if (!inside(window, src->tensor_type().numel()))
      not_lowered("as_strided: a window outside its storage (the interpreter raises)");
    IndexExpr position = IndexExpr::number(window.offset);
    for (size_t d = 0; d < at.size(); ++d)
      position = position + at[d] * strides[d];
    return eval(src, {position});
  }
  size_t k = in->second;
  windows_[k].push_back(StorageWindow{Shape(sizes.begin(), sizes.end()),
                                      Strides(strides.begin(), strides.end()), offset});
  raw_loads_[k] = true;
  std::string n = std::to_string(k);
  const IndexExpr base = offset ? IndexExpr::number(*offset) : IndexExpr::var("o" + n);
  IndexExpr address = base;
  for (size_t d = 0; d < at.size(); ++d)
    address = address + at[d] * strides[d];
  DType dtype = src->tensor_type().dtype;
  std::string text = address.text;
  // A CPU pass over reduced dims it is contiguous over reads one position (merged_terms), in the
  // order of its strides (an h, w-transposed x.mean((2, 3)) reads its 784 floats in a row).
  // (Not yet in a CUDA row nest: not measured there.)
  std::vector<std::string> flags;
  if (target_ == Target::kCpu && merge_reduced_dims_ && !divmods_.empty())
    if (const Strides constant(strides.begin(), strides.end());
        std::optional<std::vector<AddressTerm>> terms =
            merged_terms("", Shape(sizes.begin(), sizes.end()), at, flags, &constant)) {
      IndexExpr merged = base;
      for (const AddressTerm& term : *terms)
        merged = merged + term.index * strides[term.dim];
      std::string all;
      for (const std::string& f : flags)
        all += (all.empty() ? "" : " && ") + f;
      text = "(" + all + " ? " + merged.text + " : " + address.text + ")";
    }
  return define(dtype, "ld_" + suffix(dtype) + "(in" + n + ", " + text + ")");
}

bool KernelEmitter::inside(const Geometry& window, int64_t storage_numel) {
  if (window.offset < 0) return false;
  for (int64_t st : window.strides)
    if (st < 0) return false;
  return required_storage_numel(window) <= storage_numel;
}

// `v` (1-D) is indexed as a storage by as_strided(_scatter): position p must be element p,
// which holds when the interpreter would have made `v` as a whole storage of its own, dense
// from offset 0. Elementwise results and creations are fresh dense tensors (but `to` the same
// dtype returns its input), a scatter keeps its input's storage, and for a region input the
// executor checks it at run time.
void KernelEmitter::require_whole_storage(const Value* v) {
  auto in = input_index_.find(v);
  if (in != input_index_.end()) {
    whole_storage_[in->second] = true;
    return;
  }
  const Node* node = defining_node(v);
  KILN_ASSERT(node) << "'" << v->name() << "' has no producer";
  switch (node->op->kind) {
    case OpKind::kElementwise:
      if (node->op->functional_form == OpId::kTo &&
          node->input(0)->tensor_type().dtype == v->tensor_type().dtype)
        return require_whole_storage(node->input(0));
      return;
    case OpKind::kCreation:
      return;
    case OpKind::kScatter:
      return require_whole_storage(node->input(0));
    default:
      not_lowered("as_strided: of a " + node->op->name + " result, which may be a view");
  }
}

// A number operand (constant or number input).
Number KernelEmitter::number(const Operand& o) {
  Number n;
  if (o.is_value()) {
    const Value* v = o.value();
    auto in = input_index_.find(v);
    if (v->is_tensor() || in == input_index_.end()) not_lowered("a number that is not an input");
    std::string k = std::to_string(in->second);
    n.as_double = "sd[" + k + "]";
    n.as_int = "si[" + k + "]";
    n.is_float = v->scalar_type().kind == ScalarKind::kFloat;
    return n;
  }
  const Constant& c = o.constant();
  if (const bool* b = std::get_if<bool>(&c)) {
    n.as_double = *b ? "1.0" : "0.0";
    n.as_int = *b ? "1LL" : "0LL";
  } else if (const int64_t* i = std::get_if<int64_t>(&c)) {
    n.as_double = double_literal(static_cast<double>(*i));
    n.as_int = int_literal(*i);
  } else if (const double* d = std::get_if<double>(&c)) {
    n.as_double = double_literal(*d);
    n.as_int = int_literal(float_to_int<int64_t>(*d));
    n.is_float = true;
  } else {
    not_lowered("a constant that is not a number: " + constant_str(c));
  }
  return n;
}

// The scalar kind of a number operand, as the interpreter sees it (RtScalar's alternative).
bool KernelEmitter::number_is_bool(const Operand& o) {
  if (o.is_value()) return o.value()->scalar_type().kind == ScalarKind::kBool;
  return std::holds_alternative<bool>(o.constant());
}

// store_scalar: a Python float is stored as a double, anything else as an int64.
std::string KernelEmitter::store_number(const Number& n, DType out) {
  return n.is_float ? "f_" + suffix(out) + "(" + n.as_double + ")"
                    : "i_" + suffix(out) + "(" + n.as_int + ")";
}

// A held value converted as copy_element converts into `out` (bytes kept for equal dtypes).
std::string KernelEmitter::copy_convert(const Val& v, DType out) {
  if (v.dtype == out) return v.expr;
  return v.floating() ? "f_" + suffix(out) + "(" + v.expr + ")"
                      : "i_" + suffix(out) + "(" + v.expr + ")";
}

// pow with these constant exponents as PyTorch's pow_tensor_scalar computes them (a product,
// sqrt, a reciprocal), not through powf: rms norm's x.pow(2) spent most of its kernel in powf.
std::optional<std::string> KernelEmitter::pow_by_constant(const Operand& exponent) {
  if (exponent.is_value() || exponent.is_none()) return std::nullopt;
  double e = 0;
  if (const double* d = std::get_if<double>(&exponent.constant()))
    e = *d;
  else if (const int64_t* i = std::get_if<int64_t>(&exponent.constant()))
    e = static_cast<double>(*i);
  else
    return std::nullopt;
  if (e == 2) return "a * a";
  if (e == 3) return "a * a * a";
  if (e == 0.5) return "std::sqrt(a)";
  if (e == -0.5) return "K(1) / std::sqrt(a)";
  if (e == -1) return "K(1) / a";
  if (e == -2) return "K(1) / (a * a)";
  return std::nullopt;
}

// The elementwise ops that compute a libm-class function (a polynomial after an argument
// reduction, tens of operations an element): they weigh kCostlyOpWeight in a CPU nest's work.
static bool costly_op(OpId fid) {
  switch (fid) {
    case OpId::kExp:
    case OpId::kExp2:
    case OpId::kExpm1:
    case OpId::kLog:
    case OpId::kLog1p:
    case OpId::kLog2:
    case OpId::kSin:
    case OpId::kCos:
    case OpId::kTan:
    case OpId::kTanh:
    case OpId::kAsin:
    case OpId::kAcos:
    case OpId::kAtan:
    case OpId::kSinh:
    case OpId::kCosh:
    case OpId::kSigmoid:
    case OpId::kGelu:
    case OpId::kSilu:
    case OpId::kErf:
    case OpId::kPow:
    case OpId::kAtan2:
      return true;
    default:
      return false;
  }
}

bool KernelEmitter::parallel_worth(int64_t iterations) const {
  return iterations * element_cost_ >= kParallelIterations;
}

//   " num_threads(team_of(e0 * 4352LL))" for 256 x 17 of work a row: a thread for each half of
// kParallelIterations of it, at most the threads OpenMP has (cpu_prelude.h). The work is text
// over the kernel's runtime extents: it is not a size class of its own.
std::string KernelEmitter::team_clause(const TeamWork& work) const {
  if (work.units.empty())
    return " num_threads(team_of(" + rows_times(work.iterations * element_cost_) + "))";
  return " num_threads(team_of(" + work.units + " * " + int_literal(work.per_unit * element_cost_) +
         "))";
}

// The reductions an elementwise node's operands hold, computed before the operands themselves:
// a broadcast operand that holds one (a row's statistic) whole, so that its pass runs before the
// other operands are computed at the element and a row pass can keep what they share
// (keep_row_value, keep_in_row_registers: softmax's exp(x - max) divided by its sum). On the CPU,
// the reductions of an operand of the node's own shape too, through its elementwise ops: a column
// block's pass that reads the element's code so far repeats it in the block (column_block_fits),
// and code there that reads the element's row put the block inside the loop over the rows, its
// passes run again at each row: (x + 1) * softmax(x, 0) of 1024 x 64 floats took 58.6 ms against
// eager's 0.09 (softmax(x, 0) * (x + 1): 0.06).
void KernelEmitter::reductions_first(const Node& node, const Index& at) {
  if (node.op->kind != OpKind::kElementwise) return;
  for (bool broadcast : {true, false}) {  // (the broadcast ones first)
    for (int i = 0; i < node.op->arity; ++i) {
      const Operand& o = node.arg(static_cast<size_t>(i));
      if (!o.is_value() || !o.value()->is_tensor() || !holds_reduction(o.value()) ||
          broadcast != (o.value()->tensor_type().numel() < node.outputs[0]->tensor_type().numel()))
        continue;
      const Index index = broadcast_index(at, o.value()->tensor_type().shape);
      const Node* defining = defining_node(o.value());
      if (broadcast)
        eval(o.value(), index);
      else if (target_ == Target::kCpu && defining && defining->op->kind == OpKind::kReduction)
        eval(o.value(), index);
      else if (target_ == Target::kCpu && defining)
        reductions_first(*defining, index);
    }
  }
}

Val KernelEmitter::elementwise(const Node& node, const Index& at) {
  const OpInfo& op = *node.op;
  if (op.is_inplace_elementwise()) not_lowered(op.name + ": an in-place op in a region");
  const OpId fid = op.functional_form;
  ElementwiseTyping typing = elementwise_typing(op, node.operands);
  const bool fl = is_floating(typing.compute);
  if (!fl &&
      (fid == OpId::kDiv || fid == OpId::kRemainder || fid == OpId::kFmod || fid == OpId::kPow)) {
    not_lowered(op.name + ": integer " + op_info(fid).name +
                " can raise (division by zero, negative powers); the interpreter runs it");
  }
  std::string expr = fl ? expr_text(fid).f : expr_text(fid).i;
  const std::optional<std::string> by_constant =
      fid == OpId::kPow && fl ? pow_by_constant(node.arg(1)) : std::nullopt;
  if (by_constant) expr = *by_constant;
  if (fl && costly_op(fid) && !by_constant) element_cost_ += kCostlyOpWeight;
  if (expr.starts_with("KILN_NO_"))
    not_lowered(op.name + ": no " + (fl ? "floating" : "integer") + " math for its dtypes");

  // ElementwiseParams as the interpreter's make_params fills it, with its argument checks
  // decided here: a region the interpreter would reject is left to the interpreter.
  std::string alpha = "1.0", alpha_i = "1LL", value = "1.0", value_i = "1LL";
  int rounding = 0;
  bool approximate_tanh = false;
  if (int i = op.param_index("alpha"); i >= 0) {
    const Operand& a = node.arg(static_cast<size_t>(i));
    Number n = number(a);
    if (number_is_bool(a) && typing.compute != DType::kBool)
      not_lowered(op.name + ": a bool alpha raises for non-bool results");
    if (!fl && n.is_float) not_lowered(op.name + ": a float alpha raises for integer inputs");
    // in the dtype eager's kernel takes a number of the op in (number_operand_dtype): float
    // for float32, bf16 for a CPU bf16 add
    alpha = fl && typing.compute != DType::kFloat64
                ? "f_" +
                      suffix(number_operand_dtype(fid, typing.compute, target_ == Target::kCuda)) +
                      "(" + n.as_double + ")"
                : n.as_double;
    alpha_i = n.as_int;
  }
  if (int i = op.param_index("value"); i >= 0 && op.arity == 3) {
    Number n = number(node.arg(static_cast<size_t>(i)));
    value = fl && typing.compute != DType::kFloat64 ? "f_f32(" + n.as_double + ")" : n.as_double;
    value_i = n.as_int;
  }
  if (int i = op.param_index("rounding_mode"); i >= 0) {
    const Operand& mode = node.arg(static_cast<size_t>(i));
    rounding = mode.is_none() ? 0 : mode.as_string() == "trunc" ? 1 : 2;
  }
  if (int i = op.param_index("approximate"); i >= 0) {
    const std::string& a = node.arg(static_cast<size_t>(i)).as_string();
    if (a != "none" && a != "tanh") not_lowered(op.name + ": approximate='" + a + "' raises");
    approximate_tanh = a == "tanh";
  }
  bool has_b = true, has_c = true;
  if (op.dtype_rule == DTypeRule::kClamp) {
    has_b = !node.arg(1).is_none();
    has_c = !node.arg(2).is_none();
  }
  auto flag = [](bool b) { return std::string(b ? "true" : "false"); };
  const std::string K = !fl                                ? reg(DType::kFloat64)
                        : same_in_float_op(node, rounding) ? reg(typing.compute)
                                                           : compute_reg(typing.compute);
  std::string params =
      "const ElementwiseParamsOf<K> p{.alpha = K(" + alpha + "), .alpha_i = " + alpha_i +
      ", .value = K(" + value + "), .value_i = " + value_i +
      ", .rounding = " + std::to_string(rounding) +
      ", .approximate_tanh = " + flag(approximate_tanh) + ", .has_b = " + flag(has_b) +
      ", .has_c = " + flag(has_c) + ", .bool_compute = " + flag(typing.compute == DType::kBool) +
      ", .single_precision = " + flag(fl && typing.compute != DType::kFloat64) + "};";

  // The operands, converted to the compute dtype (where's condition is not); Python numbers to
  // the dtype eager's kernel takes them in (number_operand_dtype: float in a bf16 product).
  const std::string c = suffix(typing.compute);
  const std::string number_suffix =
      suffix(number_operand_dtype(fid, typing.compute, target_ == Target::kCuda));
  const bool reciprocal = target_ == Target::kCuda && fl &&
                          cuda_divides_by_reciprocal(fid, rounding) && op.arity >= 2 &&
                          !(node.arg(1).is_value() && node.arg(1).value()->is_tensor());
  std::vector<std::string> operands;
  std::string integer_condition;  // where's condition, when it is held apart (below)
  // The operands' reductions first (reductions_first). Values are memoized: the loop below
  // finds them.
  reductions_first(node, at);
  for (int i = 0; i < op.arity; ++i) {
    const Operand& o = node.arg(static_cast<size_t>(i));
    bool convert = !(op.dtype_rule == DTypeRule::kWhere && i == 0);
    if (o.is_none()) {
      operands.push_back(fl ? "0.0" : "0LL");  // an absent clamp bound, never read
    } else if (o.is_value() && o.value()->is_tensor()) {
      Val v = eval(o.value(), broadcast_index(at, o.value()->tensor_type().shape));
      if (!convert && fl && !is_floating(v.dtype)) {
        // where's bool condition stays an integer: through a floating conversion a float32
        // where inside an H200 reduction loop lost elements, and the integer test is what
        // the expression means anyway.
        integer_condition = "as_i(" + v.expr + ")";
        operands.emplace_back();
        continue;
      }
      std::string held = fl ? "as_f(" + v.expr + ")" : "as_i(" + v.expr + ")";
      if (convert && v.dtype == typing.compute) {
        // Already exact in the compute dtype, in its register type: rounding it again would
        // change nothing and costs a conversion per operand (bf16: the F2F unit's 16 per
        // clock, which bounded S1 at 2^26 more than memory did).
        operands.push_back(v.expr);
      } else {
        operands.push_back(convert ? (fl ? "f_" : "i_") + c + "(" + held + ")" : held);
      }
    } else if (fl && i == 1 && reciprocal) {
      // eager's CUDA division by a number: a * (1 / s), the reciprocal in the math type
      Number n = number(o);
      operands.push_back(typing.compute == DType::kFloat64 ? "(1.0 / (" + n.as_double + "))"
                                                           : "f_f32(1.0 / (" + n.as_double + "))");
    } else {
      Number n = number(o);
      operands.push_back(fl ? "f_" + number_suffix + "(" + n.as_double + ")"
                            : "i_" + c + "(" + n.as_int + ")");
    }
  }
  if (reciprocal) expr = "a * b";
  // eager's CUDA add and sub compute a + alpha * b as one fused multiply-add (nvcc contracts
  // it); kiln's kernels do not contract (kNvrtcMathOption), so it is written out.
  if (target_ == Target::kCuda && fl && (fid == OpId::kAdd || fid == OpId::kSub))
    expr = fid == OpId::kAdd ? "fma(p.alpha, b, a)" : "fma(-p.alpha, b, a)";
  static const char* names[] = {"a", "b", "c"};
  std::string decl = std::string("[[maybe_unused]] ") + (fl ? "K" : "int64_t") + " ";
  size_t first = 0;
  if (!integer_condition.empty()) {
    decl = "[[maybe_unused]] const int64_t a = " + integer_condition + ";\n  " + decl;
    first = 1;
  }
  for (size_t i = first; i < operands.size(); ++i)
    decl += (i > first ? ", " : "") + std::string(names[i]) + " = " + operands[i];
  decl += ";";

  Val r{fresh("v"), typing.out};
  std::string result = fl ? "f_" + suffix(typing.out) + "(static_cast<K>(" + expr + "))"
                          : "i_" + suffix(typing.out) + "(static_cast<int64_t>(" + expr + "))";
  int level = std::max(depth_of(decl), depth_of(params));
  emit(level, reg(typing.out) + " " + r.expr + ";", r.expr);
  emit(level, "{  // " + op.name);
  emit(level, "  using K [[maybe_unused]] = " + K + ";");
  emit(level, "  [[maybe_unused]] " + params);
  emit(level, "  " + decl);
  emit(level, "  " + r.expr + " = " + result + ";");
  emit(level, "}");
  return r;
}

Val KernelEmitter::creation(const Node& node, const Index& at) {
  DType out = node.outputs[0]->tensor_type().dtype;
  switch (node.id()) {
    case OpId::kFull:
    case OpId::kFullLike:
      return define(out, store_number(number(node.arg("fill_value")), out));
    case OpId::kZeros:
    case OpId::kZerosLike:
    case OpId::kEmptyLike:  // the interpreter's empty_like is zeros, for reproducible runs
      return define(out, "i_" + suffix(out) + "(0LL)");
    case OpId::kOnes:
    case OpId::kOnesLike:
      return define(out, "i_" + suffix(out) + "(1LL)");
    case OpId::kFill: {
      const Operand& value = node.arg("value");
      if (value.is_value() && value.value()->is_tensor()) {
        // Tensor.item(): a float for floating dtypes, else a bool or an int.
        const Value* t = value.value();
        Val v = eval(t, Index(static_cast<size_t>(t->tensor_type().rank()), IndexExpr::number(0)));
        return define(out, copy_convert_item(v, out));
      }
      return define(out, store_number(number(value), out));
    }
    case OpId::kArange: {
      Number start = number(node.arg("start")), step = number(node.arg("step"));
      const std::string& i = at.at(0).text;
      if (is_floating(out))
        return define(out, "f_" + suffix(out) + "(" + start.as_double + " + " + step.as_double +
                               " * static_cast<double>(" + i + "))");
      return define(
          out, "i_" + suffix(out) + "(" + start.as_int + " + " + step.as_int + " * (" + i + "))");
    }
    default:
      not_lowered(node.op->name + ": this creation op is not lowered yet");
  }
}

}  // namespace kiln::codegen::detail
