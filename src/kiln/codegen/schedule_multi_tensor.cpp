// Multi-tensor kernels: one step's elementwise computation run over every member of a
// MultiTensorGroup (plan.h) in one call, as a multi-tensor apply does (kernel.h,
// MultiTensorKernel). Part of the kernel emitter (kernel_emitter.h).
//
// The step is flattened first: every tensor 1-D of one placeholder length, so the body the
// emitter makes reads each input and stores each output at the iteration's own element, through
// lane pointers (CPU) or lane registers (CUDA) indexed by `l`, and never names a size. The
// member's sizes and addresses come from the arguments: one compiled kernel serves every group
// of that computation, whatever its members' sizes.
//
// Schedules:
// - CPU: the members' elements, all of them in one row, cut into equal shares among the cores
//   (one share below kParallelIterations); a share runs each member's part as one vector loop.
// - CUDA: a block per `block_elements` elements of a member (256 threads, `kUnroll` vectors of
//   up to 16 bytes each); a whole span of a member whose tensors are all aligned to a vector
//   loads all its vectors, computes them, then stores them; the rest (a member's last span, an
//   unaligned member) goes a vector's elements at a time.
#include "kiln/codegen/kernel_emitter.h"
#include "kiln/ir/builder.h"

namespace kiln::codegen {

namespace {

// The length every tensor of the flattened step has (it appears in no kernel source).
constexpr int64_t kPlaceholderLength = 1000003;
// CUDA: vectors a thread takes in a block's span.
constexpr int64_t kUnroll = 4;
// CUDA: the argument block's bound, in 8-byte words (4 KB: every device and driver takes it).
constexpr int64_t kArgumentWords = 512;
// The CPU's shares: at most this many, each at least kShareElements elements, and one below
// kParallelIterations in all.
constexpr int64_t kMostShares = 64;
constexpr int64_t kShareElements = 4096;
static_assert(
    kCpuMultiTensorElements == detail::kParallelIterations,
    "the CPU groups exactly where the group's kernel shares its elements among the cores");

// `body` with every tensor 1-D of kPlaceholderLength elements, but for its 0-d ones (its ops
// elementwise over one shape: group_multi_tensor.h).
void flatten_into(const Trace& body, Trace& flat) {
  Builder b(flat);
  std::map<const Value*, Value*> to;
  auto flat_type = [](const Value* v) -> Type {
    if (!v->is_tensor() || v->tensor_type().rank() == 0) return v->type();
    TensorType t = v->tensor_type();
    t.shape = {kPlaceholderLength};
    t.layout.reset();
    return t;
  };
  for (const Value* in : body.inputs())
    to[in] = b.add_input(in->name(), flat_type(in));
  for (const auto& node : body.nodes()) {
    std::vector<Operand> operands;
    for (const Operand& o : node->operands) {
      if (o.is_value()) {
        operands.emplace_back(to.at(o.value()));
      } else if (o.is_value_list()) {
        std::vector<Value*> list;
        for (Value* v : o.values())
          list.push_back(to.at(v));
        operands.emplace_back(std::move(list));
      } else {
        operands.push_back(o);
      }
    }
    std::vector<std::string> names;
    for (const Value* out : node->outputs)
      names.push_back(out->name());
    std::vector<Value*> outs = b.call_bound(node->id(), std::move(operands), node->loc, &names);
    for (size_t i = 0; i < outs.size(); ++i)
      to[node->outputs[i]] = outs[i];
  }
  std::vector<Value*> outputs;
  for (const Value* out : body.outputs())
    outputs.push_back(to.at(out));
  b.set_outputs(std::move(outputs));
}

}  // namespace

MultiTensorArgsLayout multi_tensor_args_layout(const MultiTensorKernel& kernel) {
  const auto members = kernel.members_per_launch;
  const auto ni = static_cast<int64_t>(kernel.input_is_tensor.size());
  const auto no = static_cast<int64_t>(kernel.output_dtypes.size());
  const bool numbers =
      std::count(kernel.input_is_tensor.begin(), kernel.input_is_tensor.end(), false) > 0;
  MultiTensorArgsLayout l;
  l.ins = 0;
  l.outs = l.ins + std::max<int64_t>(members * ni, 1);
  l.sd = l.outs + std::max<int64_t>(members * no, 1);
  l.si = l.sd + (numbers ? members * ni : 1);
  l.numel = l.si + (numbers ? members * ni : 1);
  l.first_block = l.numel + members;
  l.members = l.first_block + members + 1;
  l.words = l.members + 1;
  return l;
}

MultiTensorLowering lower_multi_tensor(const Step& member, Target target) {
  Step flat;
  flat.kind = Step::Kind::kFusion;
  flat.name = member.name;
  try {
    flatten_into(member.body, flat.body);
  } catch (const std::exception& e) {
    return MultiTensorLowering{std::nullopt,
                               std::string("not elementwise over one shape: ") + e.what()};
  }
  return detail::KernelEmitter(flat, target).run_multi_tensor();
}

namespace detail {

MultiTensorLowering KernelEmitter::run_multi_tensor() {
  try {
    return MultiTensorLowering{multi_tensor(), ""};
  } catch (const NotLowered& e) {
    return MultiTensorLowering{std::nullopt, e.why};
  }
}

MultiTensorKernel KernelEmitter::multi_tensor() {
  Kernel k;
  declare_arguments(k);
  const Shape shape = {kPlaceholderLength};
  // Every tensor is read at the iteration's own element only (else it is not elementwise).
  emit_body(shape, k, /*is_last=*/true, NestMode::kFlat);
  const std::string identity = index_key(loop_index(shape));
  Lanes lanes;
  lanes.results_0d_once = true;
  MultiTensorKernel mt;
  mt.target = target_;
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    const Value* in = body_.inputs()[i];
    const bool scalar = in->is_tensor() && in->tensor_type().rank() == 0;
    mt.input_is_tensor.push_back(k.inputs[i].is_tensor);
    mt.input_is_scalar.push_back(scalar);
    mt.input_dtypes.push_back(in->is_tensor() ? in->tensor_type().dtype : DType::kInt64);
    if (!k.inputs[i].is_tensor) continue;
    if (raw_loads_[i] || !windows_[i].empty() || whole_storage_[i] ||
        std::any_of(loads_[i].begin(), loads_[i].end(),
                    [&](const std::string& key) { return !scalar && key != identity; }))
      not_lowered("input " + std::to_string(i) + " is read at another element than its own");
    if (!scalar) lanes.inputs.insert(i);
  }
  if (!index_checks_.empty()) not_lowered("the step checks indices");
  for (const KernelOutput& o : k.outputs) {
    mt.output_dtypes.push_back(o.dtype);
    mt.output_is_scalar.push_back(o.shape.empty());
  }
  NestBody lane = emit_body(shape, k, /*is_last=*/true, NestMode::kFlat, &lanes);
  mt.source = target_ == Target::kCpu ? cpu_multi_tensor_source(k, lane, mt)
                                      : cuda_multi_tensor_source(k, lane, mt);
  KILN_ASSERT(mt.source.find(std::to_string(kPlaceholderLength)) == std::string::npos)
      << "a multi-tensor kernel's source names the placeholder length";
  return mt;
}

std::string KernelEmitter::cpu_multi_tensor_source(const Kernel& k, const NestBody& lane,
                                                   const MultiTensorKernel& mt) {
  const std::string ni = std::to_string(k.inputs.size()), no = std::to_string(k.outputs.size());
  std::string src = cpu_entry("sd_all", "si_all");
  src += "  (void)out_meta; (void)sd_all; (void)si_all;\n";
  src += "  // multi-tensor " + describe_step() + "\n";
  src += "  // schedule: multi-tensor, the members' elements in shares of at least " +
         std::to_string(kShareElements) + " among the cores from " +
         std::to_string(kParallelIterations) + ", a vector loop over each member's part\n";
  src += "  const int64_t members = in_meta[0];\n  const int64_t* const numel = in_meta + 1;\n";
  src += "  int64_t total = 0;\n  for (int64_t m = 0; m < members; ++m) total += numel[m];\n";
  src += "  int64_t shares = total >= " + std::to_string(kParallelIterations) + "LL ? total / " +
         std::to_string(kShareElements) + "LL : 1;\n";
  src += "  if (shares > " + std::to_string(kMostShares) +
         "LL) shares = " + std::to_string(kMostShares) + "LL;\n";
  src += "#pragma omp parallel for schedule(static) if (shares > 1)\n";
  src += "  for (int64_t share = 0; share < shares; ++share) {\n";
  src += "    const int64_t begin = total / shares * share + (total % shares) * share / shares;\n";
  src +=
      "    const int64_t end = share + 1 == shares ? total : total / shares * (share + 1) + "
      "(total % shares) * (share + 1) / shares;\n";
  src += "    int64_t first = 0;  // member m's first element in the row of all members\n";
  src += "    for (int64_t m = 0; m < members && first < end; first += numel[m], ++m) {\n";
  src += "      const int64_t lo = (begin > first ? begin : first) - first;\n";
  src += "      const int64_t hi = (end < first + numel[m] ? end : first + numel[m]) - first;\n";
  src += "      if (lo >= hi) continue;\n";
  src += "      [[maybe_unused]] const double* const sd = sd_all + m * " + ni + ";\n";
  src += "      [[maybe_unused]] const int64_t* const si = si_all + m * " + ni + ";\n";
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    const std::string n = std::to_string(i), at = "ins[m * " + ni + " + " + n + "]";
    if (mt.input_is_scalar[i])
      src += "      const void* const in" + n + " = " + at + ";\n      const int64_t o" + n +
             " = 0;\n";
    else if (k.inputs[i].is_tensor)
      src += "      const char* const lane_in" + n + " = static_cast<const char*>(" + at + ");\n";
  }
  for (size_t j = 0; j < k.outputs.size(); ++j)
    src += "      " +
           std::string(mt.output_is_scalar[j] ? "void* const out" : "char* const lane_out") +
           std::to_string(j) + " = static_cast<char*>(outs[m * " + no + " + " + std::to_string(j) +
           "]);\n";
  // The member's 0-d values once, not at every element (AdamW's bias corrections: pow).
  src += indented(lane.outside_loop(), 3);
  if (!lane.stores_once.empty())
    src += "      if (lo == 0) {\n" + indented(lane.stores_once, 4) + "      }\n";
  src += "#pragma omp simd\n      for (int64_t l = lo; l < hi; ++l) {\n";
  src += "        [[maybe_unused]] const int64_t i0 = l;\n";
  src += indented(lane.inside_loop(), 4) + indented(lane.stores, 4) + "      }\n    }\n  }\n}\n";
  return src;
}

std::string KernelEmitter::cuda_multi_tensor_source(const Kernel& k, const NestBody& lane,
                                                    MultiTensorKernel& mt) {
  const auto ni = static_cast<int64_t>(k.inputs.size());
  const auto no = static_cast<int64_t>(k.outputs.size());
  const bool numbers = std::count(mt.input_is_tensor.begin(), mt.input_is_tensor.end(), false) > 0;
  // Members a launch: the argument block within kArgumentWords (multi_tensor_args_layout).
  const int64_t per_member = ni + no + (numbers ? 2 * ni : 0) + 2;
  const int64_t fixed = (numbers ? 0 : 2) + 2 + (ni == 0 ? 1 : 0) + (no == 0 ? 1 : 0);
  mt.members_per_launch = std::min<int64_t>(128, (kArgumentWords - fixed) / per_member);
  KILN_ASSERT(mt.members_per_launch >= 1) << "a multi-tensor kernel with too many arguments";
  int64_t widest = 1;
  for (size_t i = 0; i < k.inputs.size(); ++i)
    if (k.inputs[i].is_tensor) widest = std::max<int64_t>(widest, dtype_size(mt.input_dtypes[i]));
  for (DType d : mt.output_dtypes)
    widest = std::max<int64_t>(widest, dtype_size(d));
  const int64_t width = std::min<int64_t>(8, 16 / widest);
  mt.block_elements = kCudaBlock * width * kUnroll;
  const MultiTensorArgsLayout layout = multi_tensor_args_layout(mt);
  const std::string w = std::to_string(width), K = std::to_string(mt.members_per_launch);
  const std::string NI = std::to_string(ni), NO = std::to_string(no);

  std::string src =
      "namespace KILN_KERNEL_NAME {\nusing namespace kiln;\nusing namespace kiln::kernel;\n";
  src += "// multi-tensor " + describe_step() + "\n";
  src += "// schedule: multi-tensor, a block per " + std::to_string(mt.block_elements) +
         " elements of a member, " + std::to_string(kUnroll) + " vectors of " + w +
         " a thread, up to " + K + " members a launch\n";
  auto words = [&](int64_t from, int64_t to) { return std::to_string(to - from); };
  src += "struct Args {\n  void* ins[" + words(layout.ins, layout.outs) + "];\n  void* outs[" +
         words(layout.outs, layout.sd) + "];\n  double sd[" + words(layout.sd, layout.si) +
         "];\n  int64_t si[" + words(layout.si, layout.numel) + "];\n  int64_t numel[" + K +
         "];\n  int64_t first_block[" + K + " + 1];\n  int64_t members;\n};\n";
  src += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(kCudaBlock) +
         ") KILN_CAT(KILN_KERNEL_NAME, _mt)(const Args a) {\n";
  src += "  // The block's member: the last whose first block is at or before it.\n";
  src += "  const int64_t b = blockIdx.x;\n  int64_t low = 0, high = a.members - 1;\n";
  src += "  while (low < high) {\n    const int64_t mid = (low + high + 1) / 2;\n";
  src += "    if (a.first_block[mid] <= b) low = mid; else high = mid - 1;\n  }\n";
  src += "  const int64_t m = low, n = a.numel[m];\n";
  src += "  [[maybe_unused]] const double* const sd = a.sd + " +
         (numbers ? "m * " + NI : std::string("0")) + ";\n";
  src += "  [[maybe_unused]] const int64_t* const si = a.si + " +
         (numbers ? "m * " + NI : std::string("0")) + ";\n";
  std::string aligned = "true";
  auto vector_bytes = [&](DType d) { return std::to_string(dtype_size(d) * width); };
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    if (!k.inputs[i].is_tensor) continue;
    const std::string n = std::to_string(i);
    if (mt.input_is_scalar[i]) {  // read by every element where the body loads it
      src += "  const void* const in" + n + " = a.ins[m * " + NI + " + " + n +
             "];\n  const int64_t o" + n + " = 0;\n";
      continue;
    }
    src += "  const char* const p_in" + n + " = static_cast<const char*>(a.ins[m * " + NI + " + " +
           n + "]);\n";
    aligned += " && reinterpret_cast<unsigned long long>(p_in" + n + ") % " +
               vector_bytes(mt.input_dtypes[i]) + " == 0";
  }
  for (size_t j = 0; j < k.outputs.size(); ++j) {
    const std::string n = std::to_string(j);
    if (mt.output_is_scalar[j]) {  // stored once, by the member's first element
      src += "  void* const out" + n + " = a.outs[m * " + NO + " + " + n + "];\n";
      continue;
    }
    src +=
        "  char* const p_out" + n + " = static_cast<char*>(a.outs[m * " + NO + " + " + n + "]);\n";
    aligned += " && reinterpret_cast<unsigned long long>(p_out" + n + ") % " +
               vector_bytes(mt.output_dtypes[j]) + " == 0";
  }
  src += "  const bool aligned = " + aligned + ";\n";
  src += "  const int64_t start = (b - a.first_block[m]) * " + std::to_string(mt.block_elements) +
         "LL;\n";
  // A whole aligned span: every vector loaded first, then computed, then stored. In place an
  // output is an input's memory, so the compiler may not move a later vector's loads above an
  // earlier one's stores; one vector at a time, a thread had one load in flight and the group
  // ran at 1.4x its steps' own kernels (H200, 2026-12-05).
  const std::string U = std::to_string(kUnroll), B = std::to_string(kCudaBlock);
  std::string span_loads, span_stores, element_loads, element_stores;
  auto at = [&](const std::string& p, DType d, const std::string& base) {
    return p + " + (" + base + ") * " + std::to_string(dtype_size(d));
  };
  const std::string span_base =
      "start + (static_cast<int64_t>(u) * " + B + " + threadIdx.x) * " + w;
  std::string lanes;  // the lane arrays' declarations, [kUnroll][width]
  std::string bind;   // lane_in<n> / lane_out<n>: the u-th vector's row of them
  std::string own;    // lane_in<n> / lane_out<n> of their own (the rest's; a row of the span's,
                      // indexed by a u the compiler does not unroll, would put them in memory)
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    if (!k.inputs[i].is_tensor || mt.input_is_scalar[i]) continue;
    const std::string n = std::to_string(i), type = storage_type(mt.input_dtypes[i]);
    lanes += "  alignas(16) " + type + " span_in" + n + "[" + U + "][" + w + "];\n";
    bind += "      " + type + " (&lane_in" + n + ")[" + w + "] = span_in" + n + "[u];\n";
    own += "    " + type + " lane_in" + n + "[" + w + "];\n";
    span_loads += "      vector_load<" + vector_bytes(mt.input_dtypes[i]) + ">(span_in" + n +
                  "[u], " + at("p_in" + n, mt.input_dtypes[i], span_base) + ");\n";
    element_loads += "        lane_in" + n + "[l] = l < valid ? reinterpret_cast<const " + type +
                     "*>(p_in" + n + ")[base + l] : " + type + "{};\n";
  }
  for (size_t j = 0; j < k.outputs.size(); ++j) {
    if (mt.output_is_scalar[j]) continue;
    const std::string n = std::to_string(j), type = storage_type(mt.output_dtypes[j]);
    lanes += "  alignas(16) " + type + " span_out" + n + "[" + U + "][" + w + "];\n";
    bind += "      " + type + " (&lane_out" + n + ")[" + w + "] = span_out" + n + "[u];\n";
    own += "    " + type + " lane_out" + n + "[" + w + "];\n";
    span_stores += "      vector_store<" + vector_bytes(mt.output_dtypes[j]) + ">(" +
                   at("p_out" + n, mt.output_dtypes[j], span_base) + ", span_out" + n + "[u]);\n";
    element_stores += "        reinterpret_cast<" + type + "*>(p_out" + n +
                      ")[base + l] = lane_out" + n + "[l];\n";
  }
  auto body = [&](const std::string& base) {
    return "        using I [[maybe_unused]] = int64_t;\n"
           "        [[maybe_unused]] const int64_t i0 = " +
           base + " + l;\n" + indented(lane.inside_loop(), 4) + indented(lane.stores, 4);
  };
  auto each_vector = [&](const std::string& inner) {
    return "#pragma unroll\n    for (int u = 0; u < " + U + "; ++u) {\n" + inner + "    }\n";
  };
  // The member's 0-d values once a thread, not at every element (AdamW's bias corrections).
  src += "  using I [[maybe_unused]] = int64_t;\n" + indented(lane.outside_loop(), 1) + lanes;
  if (!lane.stores_once.empty())
    src += "  if (start == 0 && threadIdx.x == 0) {\n" + indented(lane.stores_once, 2) + "  }\n";
  src += "  if (aligned && start + " + std::to_string(mt.block_elements) + " <= n) {\n";
  src += each_vector(span_loads);
  src += each_vector("      [[maybe_unused]] const int64_t base = " + span_base + ";\n" + bind +
                     "#pragma unroll\n      for (int l = 0; l < " + w + "; ++l) {\n" +
                     body("base") + "      }\n");
  src += each_vector(span_stores);
  src += "    return;\n  }\n";
  // The rest (a member's last span, or one not aligned): a vector's elements at a time.
  src += "#pragma unroll 1\n  for (int u = 0; u < " + U + "; ++u) {\n";
  src += "    const int64_t base = " + span_base + ";\n";
  src += "    if (base >= n) break;\n" + own;
  src += "    const int valid = n - base < " + w + " ? static_cast<int>(n - base) : " + w + ";\n";
  src += "    for (int l = 0; l < " + w + "; ++l) {\n" + element_loads + "    }\n";
  src += "    for (int l = 0; l < valid; ++l) {\n" + body("base") + "    }\n";
  src += "    for (int l = 0; l < valid; ++l) {\n" + element_stores + "    }\n  }\n}\n";
  src += "}  // namespace KILN_KERNEL_NAME\n";
  return src;
}

}  // namespace detail

}  // namespace kiln::codegen
