// prepared_program: see prepared_program.h.
#include "kiln/runtime/prepared_program.h"

#include <algorithm>
#include <atomic>
#include <functional>

#include "kiln/analysis/integer_range.h"
#include "kiln/ir/type_rules.h"
#include "kiln/runtime/cuda/cublas.h"
#include "kiln/runtime/library_step.h"

namespace kiln {

namespace {

// The index checks of a step PyTorch runs that its inputs decide (PreparedKernels::
// runner_index_checks): each index op's index is known in range by how the program computes it
// (integer_range: a positions arange) or drawn from the program's inputs (drawn_from).
std::optional<std::vector<codegen::IndexCheck>> runner_index_checks(const Step& step) {
  const Trace& body = step.body;
  auto outer = [&](const Value* v) -> const Value* {
    for (size_t i = 0; i < body.inputs().size(); ++i)
      if (body.inputs()[i] == v) return step.inputs.at(i);
    return nullptr;
  };
  std::vector<codegen::IndexCheck> checks;
  for (const auto& n : body.nodes()) {
    if (n->op->kind != OpKind::kIndex || n->id() == OpId::kWrapIndex) continue;
    const TensorType& self = n->input(0)->tensor_type();
    codegen::IndexCheck c;
    c.size = self.rank() == 0
                 ? 1
                 : self.shape[static_cast<size_t>(wrap_dim(n->arg(1).as_int(), self.rank()))];
    const Value* index = n->input(2);
    if (const Node* p = index->producer();  // through a wrap_index by the size indexed
        p && p->id() == OpId::kWrapIndex && p->arg(1).as_int() == c.size) {
      c.negative = true;
      index = p->input(0);
    }
    const int64_t lowest = c.negative ? -c.size : 0;
    std::optional<IntegerRange> known = integer_range(index, outer);
    if (known && known->lo >= lowest && known->hi < c.size) continue;
    c.drawn_from = drawn_from(
        index, [&](int64_t v) { return v >= lowest && v < c.size; }, outer);
    if (c.drawn_from.empty()) return std::nullopt;
    checks.push_back(std::move(c));
  }
  return checks;
}

// PreparedKernels::padded_rows. A 16-bit kernel result of at least 64-element rows that are not
// a multiple of 16 bytes, not a result of the program nor written anywhere, that only CUDA
// kernels (which take any strides), cuBLAS's products and view steps of such readers read, at
// least one product among them: its rows padded with zeros to 16 bytes, a product whose reduced
// or result dim it is reads it in place at tensor-core speed. A language model's loss gradient
// [tokens, vocabulary], read by the LM head's two products: at GPT-2's 50,257 words and 8,192
// tokens, two 1.6 GB copies a training step otherwise.
std::map<const Value*, int64_t> padded_rows(const CompiledProgram& program,
                                            const PreparedKernels& p,
                                            const std::set<const Value*>& layout_read,
                                            const std::function<bool(const Step&)>& is_product) {
  const std::vector<Step>& steps = program.plan.steps;
  const Trace& trace = program.execution;
  std::set<const Value*> excluded(trace.outputs().begin(), trace.outputs().end());
  excluded.insert(layout_read.begin(), layout_read.end());
  for (const auto& wb : trace.writebacks)
    excluded.insert(wb.second);
  for (const Step& step : steps)
    for (const Step::Writeback& wb : step.writebacks)
      excluded.insert(wb.value);
  std::map<const Value*, std::vector<size_t>> readers;
  for (size_t s = 0; s < steps.size(); ++s)
    for (const Value* v : steps[s].inputs)
      readers[v].push_back(s);
  auto has_kernel = [&](size_t s) { return s < p.cuda.steps.size() && p.cuda.steps[s]; };
  // Whether every reader of `v` reads it by its strides; `product` when a product reads it.
  std::function<bool(const Value*, bool&)> read_by_strides = [&](const Value* v, bool& product) {
    if (excluded.contains(v)) return false;
    auto it = readers.find(v);
    if (it == readers.end()) return true;
    for (size_t s : it->second) {
      const Step& step = steps[s];
      if (is_product(step)) {
        product = true;
      } else if (has_kernel(s)) {
        continue;
      } else if (only_views(step.body)) {
        for (const Value* out : step.outputs)
          if (!read_by_strides(out, product)) return false;
      } else {
        return false;
      }
    }
    return true;
  };
  std::map<const Value*, int64_t> padded;
  for (size_t s = 0; s < steps.size(); ++s) {
    if (!has_kernel(s)) continue;
    for (const Value* v : steps[s].outputs) {
      const TensorType& t = v->tensor_type();
      if (t.dtype != DType::kBFloat16 && t.dtype != DType::kFloat16) continue;
      constexpr int64_t kUnit = 16 / 2;  // 16-bit elements in 16 bytes
      if (t.rank() < 2 || t.shape.back() < 64 || t.shape.back() % kUnit == 0) continue;
      bool product = false;
      if (read_by_strides(v, product) && product)
        padded[v] = (t.shape.back() + kUnit - 1) / kUnit * kUnit;
    }
  }
  return padded;
}

}  // namespace

std::shared_ptr<const PreparedKernels> prepared_kernels(const CompiledProgram& program,
                                                        Device device) {
  bool cpu_kernels = device.kind == Device::Kind::kCpu && cpu::cpu_kernels_enabled();
  auto cached =
      std::static_pointer_cast<const PreparedKernels>(std::atomic_load(&program.executor_cache));
  if (cached && cached->device == device && cached->cpu_kernels == cpu_kernels) return cached;
  auto p = std::make_shared<PreparedKernels>();
  p->device = device;
  p->cpu_kernels = cpu_kernels;
  if (device.kind == Device::Kind::kCuda)
    p->cuda = cuda::prepare_cuda_kernels(program.plan, device.index);
  else if (cpu_kernels)
    p->cpu = cpu::prepare_cpu_kernels(program.plan);
  const Trace& trace = program.execution;
  p->inputs_kept.insert(trace.outputs().begin(), trace.outputs().end());
  for (const auto& wb : trace.writebacks)
    p->inputs_kept.insert(wb.second);
  p->read_later.insert(trace.outputs().begin(), trace.outputs().end());
  for (const Step& step : program.plan.steps) {
    p->read_later.insert(step.inputs.begin(), step.inputs.end());
    if (step.kind == Step::Kind::kCopy)
      for (const Step::Writeback& wb : step.writebacks)
        p->read_later.insert(wb.value);
  }
  const std::vector<Step>& steps = program.plan.steps;
  const std::set<const Value*> outputs(trace.outputs().begin(), trace.outputs().end());
  for (size_t s = 0; s < steps.size(); ++s) {
    if (steps[s].kind != Step::Kind::kFusion) continue;
    for (const Step::Writeback& wb : steps[s].writebacks) {
      if (outputs.contains(wb.value)) continue;
      bool written_later = false;
      for (size_t later = s + 1; later < steps.size() && !written_later; ++later)
        for (const Step::Writeback& other : steps[later].writebacks)
          written_later = written_later || other.target == wb.target;
      if (!written_later) p->stays_in_caller.insert(wb.value);
    }
  }
  // Values some step reads through their storage (as_strided, a bitcast): they keep eager's
  // contiguous layout. (Steps PyTorch runs get eager's layouts by a copy: with_eager_layouts.)
  std::set<const Value*> layout_read;
  for (const Step& step : steps)
    if (reads_through_storage(step)) layout_read.insert(step.inputs.begin(), step.inputs.end());
  // Only matrix products through cuBLAS (CUDA): an eager step's result is PyTorch's tensor, whose
  // layout (a view of an input, even host memory) is eager's business and is never copied.
  auto is_product = [](const Step& step) {
    return step.kind == Step::Kind::kOpaque && step.outputs.size() == 1 &&
           is_library_body(step.body) &&
           std::any_of(step.body.nodes().begin(), step.body.nodes().end(),
                       [](const auto& n) { return cuda::is_matrix_product(n->id()); });
  };
  if (device.kind == Device::Kind::kCuda)
    for (const Step& step : steps)
      if (is_product(step) && !layout_read.contains(step.outputs[0]))
        p->any_layout.insert(step.outputs[0]);
  if (device.kind == Device::Kind::kCuda)
    p->padded_rows = padded_rows(program, *p, layout_read, is_product);
  for (const Step& step : steps)
    for (size_t j = 0; j < step.output_orders.size(); ++j)
      if (!step.output_orders[j].empty()) p->laid_out.insert(step.outputs[j]);
  p->runner_index_checks.resize(steps.size());
  for (size_t s = 0; s < steps.size(); ++s) {
    const bool kernel = device.kind == Device::Kind::kCuda
                            ? s < p->cuda.steps.size() && p->cuda.steps[s]
                            : s < p->cpu.steps.size() && p->cpu.steps[s];
    if (steps[s].kind == Step::Kind::kFusion && !kernel)
      p->runner_index_checks[s] = runner_index_checks(steps[s]);
  }
  const AliasPattern& pattern = program.pattern;
  p->group_first_arg.assign(pattern.groups.size(), pattern.inputs.size());
  for (size_t j = pattern.inputs.size(); j-- > 0;)
    if (int g = pattern.inputs[j].group; g >= 0) p->group_first_arg[static_cast<size_t>(g)] = j;
  p->group_written.assign(pattern.groups.size(), false);
  p->group_of_value.assign(trace.num_values(), -1);
  for (size_t g = 0; g < pattern.groups.size(); ++g)
    p->group_of_value[static_cast<size_t>(trace.inputs()[g]->id())] = static_cast<int>(g);
  for (const auto& wb : trace.writebacks)
    if (int g = p->group_of_value[static_cast<size_t>(wb.first->id())]; g >= 0)
      p->group_written[static_cast<size_t>(g)] = true;
  for (size_t i = 0; i < trace.inputs().size(); ++i)
    if (p->inputs_kept.contains(trace.inputs()[i])) p->kept_inputs.push_back(i);
  std::shared_ptr<const void> erased = p;
  std::atomic_store(&program.executor_cache, erased);
  return p;
}

}  // namespace kiln
