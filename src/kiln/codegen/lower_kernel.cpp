// The driver: a nest per output shape, the kernel's declarations and layout.
// Part of the kernel emitter (kernel_emitter.h).
#include "kiln/codegen/kernel_emitter.h"

#include <numeric>
#include <set>

namespace kiln::codegen::detail {

KernelLowering KernelEmitter::run() {
  // Lowered again with one choice taken back: every other choice taken back so far stays.
  auto again = [this](const std::function<void(KernelEmitter&)>& change) {
    KernelEmitter emitter(step_, target_);
    emitter.cpu_column_pass_stores_ = cpu_column_pass_stores_;
    emitter.cpu_keep_column_values_ = cpu_keep_column_values_;
    emitter.exact_sums_ = exact_sums_;
    change(emitter);
    return emitter.run();
  };
  try {
    return KernelLowering{lower(), ""};
  } catch (const NotLowered& e) {
    return KernelLowering{std::nullopt, e.why};
  } catch (const PassOutsideColumnBlock&) {
    return again([](KernelEmitter& e) { e.cpu_column_pass_stores_ = false; });
  } catch (const SumComputedTwice& e) {
    return again([&e](KernelEmitter& emitter) { emitter.exact_sums_.insert(e.sum); });
  } catch (const ColumnValueKeptUnderItsRows&) {
    return again([](KernelEmitter& e) { e.cpu_keep_column_values_ = false; });
  }
}

Kernel KernelEmitter::lower() {
  if (step_.kind != Step::Kind::kFusion) not_lowered("not a fusion region");
  Kernel k;
  declare_arguments(k);
  runtime_extents_ = true;
  if (std::none_of(body_.nodes().begin(), body_.nodes().end(),
                   [](const auto& n) { return n->op->kind != OpKind::kView; })) {
    not_lowered("the region only views its inputs (no kernel needed)");
  }

  // One nest per output shape (a row's [R, 1] and [R] one nest on CUDA: nest_stores, the nest's
  // shape the one ending in 1); the nest with the writebacks last.
  std::vector<Shape> shapes;
  for (const KernelOutput& o : k.outputs) {
    auto same = std::find_if(shapes.begin(), shapes.end(), [&](const Shape& s) {
      return nest_stores(o.shape, s) || nest_stores(s, o.shape);
    });
    if (same == shapes.end())
      shapes.push_back(o.shape);
    else if (o.shape.size() > same->size())
      *same = o.shape;
  }
  std::map<Shape, int> writebacks_per_shape;
  for (const Step::Writeback& wb : step_.writebacks)
    if (wb.value->is_tensor())
      for (const Shape& s : shapes)
        if (nest_stores(wb.value->tensor_type().shape, s)) ++writebacks_per_shape[s];
  size_t last = shapes.size() - 1;
  int most = 0;
  for (size_t s = 0; s < shapes.size(); ++s) {
    int n = writebacks_per_shape[shapes[s]];
    if (n > most) most = n, last = s;
  }
  std::rotate(shapes.begin() + static_cast<int64_t>(last),
              shapes.begin() + static_cast<int64_t>(last) + 1, shapes.end());
  // Outputs over a reduction's domain stored by its pass: no nest of their own. On the CPU a
  // pass across rows stores only in a column block (cpu_column_block), whose vector loops store
  // a block's part of each row: down a column alone it would store one element a cache line
  // (bench.py's column sum at 2^22 on 2 cores: 37 ms, against 11.8 with a nest of their own);
  // a pass that cannot run in the block lowers the region again without pass stores. On the
  // H200 the column schedule's 32-byte row segments, loaded and stored, took 0.460 ms for the
  // column sum at 2^26 against 0.366 with a nest of their own (2026-12-03; with the lanes that
  // fill the device, 0.519 against 0.237, 2026-12-04). There the outputs' nest runs last, after
  // the reduction's read D (a same-index store all the same).
  pass_stores_ = pass_stores(body_);
  if (pass_stores_ && !pass_stores_->along_last_dim &&
      (target_ == Target::kCpu ? !cpu_column_pass_stores_
                               : outer_reduction_in_columns(shape_numel(
                                     pass_stores_->reduction->outputs[0]->tensor_type().shape))))
    pass_stores_.reset();
  if (pass_stores_) std::erase(shapes, pass_stores_->domain);
  scatter_ = scatter_store();

  k.source = target_ == Target::kCpu ? cpu_source(shapes, k) : cuda_source(shapes, k);
  for (const IndexCheck& c : index_checks_) {
    bool seen = std::any_of(k.index_checks.begin(), k.index_checks.end(), [&](const IndexCheck& o) {
      return o.input == c.input && o.size == c.size;
    });
    if (!seen) k.index_checks.push_back(c);
  }
  // What the executor checks before the kernel runs, for the reader of the source.
  std::string checks;
  for (const IndexCheck& c : k.index_checks)
    checks += "// index check: input " + std::to_string(c.input) + " in [" +
              (c.negative ? "-" : "0, ") + (c.negative ? std::to_string(c.size) + ", " : "") +
              std::to_string(c.size) + ") for " + c.op + "\n";
  k.source = checks + k.source;
  k.out_meta_size += static_cast<int64_t>(k.extents.size());
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    k.inputs[i].windows = windows_[i];
    k.inputs[i].whole_storage = whole_storage_[i];
  }
  return k;
}

// The kernel's inputs and outputs: where each tensor's offset and strides sit in in_meta and
// out_meta.
void KernelEmitter::declare_arguments(Kernel& k) {
  kernel_ = &k;  // (its nests and passes register their extents in it as they are emitted)
  k.target = target_;
  // Inputs: where each tensor's layout sits in in_meta.
  for (size_t i = 0; i < body_.inputs().size(); ++i) {
    const Value* in = body_.inputs()[i];
    input_index_[in] = i;
    KernelInput ki;
    ki.is_tensor = in->is_tensor();
    if (ki.is_tensor) {
      check_device(in);
      ki.meta = static_cast<int>(k.in_meta_size);
      k.in_meta_size += 1 + in->tensor_type().rank();
    }
    k.inputs.push_back(ki);
  }
  windows_.resize(k.inputs.size());
  whole_storage_.assign(k.inputs.size(), false);
  const std::vector<Value*>& outs = body_.outputs();
  if (outs.empty()) not_lowered("the region has no outputs");
  for (const Value* o : outs) {
    if (!o->is_tensor()) not_lowered("an output of the region is a number");
    check_device(o);
    KernelOutput ko;
    ko.dtype = o->tensor_type().dtype;
    ko.shape = o->tensor_type().shape;
    ko.meta = static_cast<int>(k.out_meta_size);
    k.out_meta_size += 1 + static_cast<int64_t>(ko.shape.size());
    k.outputs.push_back(ko);
  }
  k.extents_meta = k.out_meta_size;  // the extents follow (lower adds their count)
}

std::string KernelEmitter::cpu_source(const std::vector<Shape>& shapes, Kernel& k) {
  std::string nests = cpu_tables(k);
  for (size_t s = 0; s < shapes.size(); ++s) {
    bool is_last = s + 1 == shapes.size();
    nests += scatter_ ? cpu_scatter_nest(*scatter_, k) : emit_nest(shapes[s], k, is_last);
  }
  std::string src = cpu_entry("sd", "si");
  src += "  (void)ins; (void)in_meta; (void)sd; (void)si;\n";
  src += "  // " + describe_step() + "\n";
  src += layout_decls(k, "", "int64_t");
  src += nests + "}\n";
  return src;
}

// The opening of a CPU kernel function (CpuKernelFn), its number arrays named `sd` and `si`.
std::string KernelEmitter::cpu_entry(const std::string& sd, const std::string& si) {
  return "extern \"C\" void KILN_KERNEL_NAME(void* const* ins, const int64_t* in_meta, "
         "const double* " +
         sd + ", const int64_t* " + si +
         ", void* const* outs, const int64_t* out_meta) {\n"
         "  using namespace kiln;\n  using namespace kiln::kernel;\n";
}

// The region's ops (not its name or value names: equal regions of different programs should
// have equal sources, and share one compiled kernel).
std::string KernelEmitter::describe_step() const {
  std::string s = "ops:";
  for (const auto& n : body_.nodes())
    s += " " + n->op->name;
  return s;
}

void KernelEmitter::check_device(const Value* v) const {
  Device::Kind want = target_ == Target::kCpu ? Device::Kind::kCpu : Device::Kind::kCuda;
  if (v->tensor_type().device.kind != want)
    not_lowered("a tensor of the region is on " + v->tensor_type().device.str());
}

// ---- loop nests --------------------------------------------------------------------------

// The body of the nest over `shape`, at the index loop_index(shape). With `lanes`, the body of
// one lane of a vectorized CUDA nest: loads of lanes->inputs and every store use registers.
// With `unit_row`, `shape` ends in a dim of 1 that the outputs do not have: a row nest with one
// row per output element (ReductionSchedule::kRowPerElement), whose reductions are at row level.
NestBody KernelEmitter::emit_body(const Shape& shape, Kernel& k, bool is_last, NestMode mode,
                                  const Lanes* lanes, bool unit_row) {
  begin_body(shape, k, mode, lanes);
  const Shape out_shape(shape.begin(), shape.end() - (unit_row ? 1 : 0));
  Index at = loop_index(out_shape);
  KILN_ASSERT(kernel_ == &k) << "a nest's body outside the kernel its arguments were declared for";
  nest_is_last_ = is_last;
  const bool lane_stores =
      mode == NestMode::kRows && !shape.empty() && shape.back() > 1 && row_lanes(shape.back()) > 1;
  // Each output at its own index: the nest's, with a trailing 0 more or less (nest_stores).
  std::vector<std::pair<size_t, Val>> values;
  std::vector<Index> output_at(k.outputs.size());
  // A multi-tensor kernel's 0-d result (its lanes' nest is 1-D): stored once a member, outside
  // its loop (NestBody::stores_once; schedule_multi_tensor.cpp).
  auto stored_once = [&](const Shape& shape_j) {
    return lanes && lanes->results_0d_once && shape_j.empty() && !out_shape.empty();
  };
  // (CPU: every output's reductions before any output's code at the element, reductions_first:
  // the tuple (softmax(x, 0), softmax(2 * x, 0)) ran the second's column passes at each row.)
  for (size_t j = 0; j < k.outputs.size() && target_ == Target::kCpu; ++j) {
    const Node* node = defining_node(body_.outputs()[j]);
    if (node && k.outputs[j].shape == out_shape && holds_reduction(body_.outputs()[j]))
      reductions_first(*node, at);
  }
  for (size_t j = 0; j < k.outputs.size(); ++j) {
    const Shape& shape_j = k.outputs[j].shape;
    if (stored_once(shape_j)) {
      k.outputs[j].in_last_nest = is_last;
      values.emplace_back(j, eval(body_.outputs()[j], Index{}));
      continue;
    }
    if (!nest_stores(shape_j, out_shape)) continue;
    KILN_ASSERT(shape_j == out_shape || !lane_stores)
        << "a row nest's lanes store only outputs of its own shape";
    output_at[j] = at;
    if (shape_j.size() > out_shape.size()) output_at[j].push_back(IndexExpr::number(0));
    if (shape_j.size() < out_shape.size()) output_at[j].pop_back();
    k.outputs[j].in_last_nest = is_last;
    values.emplace_back(j, eval(body_.outputs()[j], output_at[j]));
  }
  // Every value of the iteration is computed above; only now does it store.
  std::string stores, stores_once;
  for (const auto& [j, v] : values) {
    std::string n = std::to_string(j);
    if (stored_once(k.outputs[j].shape)) {
      stores_once += "st_" + suffix(k.outputs[j].dtype) + "(out" + n + ", 0, " + v.expr + ");\n";
      continue;
    }
    const IndexExpr address = output_address(j, output_at[j]);
    std::string where = lanes ? "lane_out" + n + ", l"
                        : lane_stores
                            ? "row_out" + n + ", i" + std::to_string(shape.size() - 1) + "_lane"
                            : "out" + n + ", " + address.text;
    stores += "st_" + suffix(k.outputs[j].dtype) + "(" + where + ", " + v.expr + ");\n";
  }
  lanes_ = nullptr;
  place_kept_row_values();
  levels_[0] = row_fills_ + levels_[0];  // each row's cached elements, loaded first
  NestBody body{levels_, stores, stores_once, column_block_text(false), column_block_text(true)};
  check_kept_column_values(shape, body);
  return body;
}

// Where output j's element at `at` lies: its offset plus each index times its stride (oo<j>,
// os<j>_<d>).
IndexExpr KernelEmitter::output_address(size_t j, const Index& at) {
  const std::string n = std::to_string(j);
  IndexExpr address = IndexExpr::var("oo" + n);
  for (size_t d = 0; d < at.size(); ++d)
    address = address + mul(at[d], "os" + n + "_" + std::to_string(d));
  return address;
}

// Whether output j is stored into the caller's memory (a writeback's value: a value of the
// functional trace, the step's output j, not the body's output j the nests compute).
bool KernelEmitter::written_back(size_t j) const {
  return std::any_of(step_.writebacks.begin(), step_.writebacks.end(),
                     [&](const Step::Writeback& wb) { return wb.value == step_.outputs[j]; });
}

bool KernelEmitter::nest_stores(const Shape& output, const Shape& nest) const {
  if (output == nest) return true;
  if (target_ != Target::kCuda) return false;
  auto with_unit = [](const Shape& longer, const Shape& shorter) {
    return longer.size() == shorter.size() + 1 && longer.back() == 1 &&
           std::equal(shorter.begin(), shorter.end(), longer.begin());
  };
  return with_unit(output, nest) || with_unit(nest, output);
}

// The emitter's state for a new nest over `shape`.
void KernelEmitter::begin_body(const Shape& shape, const Kernel& k, NestMode mode,
                               const Lanes* lanes) {
  memo_.clear();
  sums_.clear();
  loads_.assign(k.inputs.size(), {});
  unguarded_loads_.assign(k.inputs.size(), {});
  guarded_loads_.assign(k.inputs.size(), false);
  loads_outside_row_passes_.assign(k.inputs.size(), {});
  row_pass_depth_ = 0;
  pass_store_keys_.clear();
  column_passes_.clear();
  column_block_accumulators_.clear();
  row_buffer_bytes_ = 0;
  kept_row_values_.clear();
  if (mode != NestMode::kTiles) tile_keys_.clear();
  cuts_.clear();
  raw_loads_.assign(k.inputs.size(), false);
  windows_.resize(k.inputs.size());
  levels_.assign(shape.size() + 1, "");
  level_of_.clear();
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1) level_of_["i" + std::to_string(d)] = static_cast<int>(d) + 1;
  nest_rank_ = static_cast<int>(shape.size());
  mode_ = mode;
  row_reductions_ = 0;
  row_reduce_count_ = 0;
  if (mode != NestMode::kRows) split_rows_ = false;  // (cuda_rows_nest sets it before its body)
  if (mode != NestMode::kColumns) split_columns_ = false;  // (cuda_columns_nest sets it)
  grid_combines_ = 0;
  row_serial_reductions_ = 0;
  reductions_ = 0;
  pass_works_.clear();
  divmods_.clear();
  merge_flags_by_dividend_.clear();
  merge_conditions_.clear();
  constant_merge_conditions_.clear();
  element_cost_ = 1;
  nest_shape_ = shape;
  element_ = ElementReductions{};
  lanes_ = lanes;
  // A flat loop's position `l` (and a split one's inner position `within`) is the innermost
  // loop's variable: what uses it stays inside the inner loop of a split flat loop
  // (cpu_flat_loop).
  if (lanes) level_of_["l"] = level_of_["within"] = static_cast<int>(shape.size());
  row_positions_.clear();
  row_caches_.clear();
  merged_row_reads_.clear();
  row_fills_.clear();
  trip_fills_.clear();
  trip_variables_.clear();
  row_cache_words_ = 0;
  if (mode == NestMode::kRows && !shape.empty() && shape.back() > 1) {
    std::string last = "i" + std::to_string(shape.size() - 1);  // the row loop's (block_loop)
    row_positions_[last] =
        RowPosition{cache_slot(last, row_lanes(shape.back())), shape.back(), last, ""};
    level_of_[last + "_trip"] = level_of_[last + "_lane"] = static_cast<int>(shape.size());
  }
}

// Which inputs the last nest reads at other elements than the one it stores (for in-kernel
// writebacks, DESIGN.md 4).
void KernelEmitter::record_last_nest_loads(const Shape& shape, Kernel& k) {
  const Index loop = loop_index(shape);
  std::string identity = index_key(loop);
  // "i0, i1, " of a nest over [A, B, C]: the row indices a row-local load starts with.
  std::string row = index_key(Index(loop.begin(), loop.end() - (loop.empty() ? 0 : 1)));
  row += row.empty() ? "" : ", ";
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    if (loads_[i].empty() && !raw_loads_[i]) continue;
    const Shape& in_shape = body_.inputs()[i]->tensor_type().shape;
    // An input over the domain of a pass that stores (store_in_pass): its own element is the
    // one the pass loads and stores (in a pass split by residue, each copy's own).
    const bool in_pass = !pass_store_keys_.empty() && in_shape == pass_stores_->domain;
    const std::set<std::string> own = in_pass ? pass_store_keys_ : std::set<std::string>{identity};
    auto all_own = [&](const std::set<std::string>& keys) {
      return std::all_of(keys.begin(), keys.end(),
                         [&](const std::string& key) { return own.contains(key); });
    };
    bool same_shape = in_pass || in_shape == shape;
    bool same = !raw_loads_[i] && !loads_[i].empty() && all_own(loads_[i]) && same_shape;
    const std::set<std::string>& unguarded = unguarded_loads_[i];
    bool guarded = !raw_loads_[i] && guarded_loads_[i] && same_shape && all_own(unguarded);
    // Row-local: at the iteration's own index, or in one of its row's passes at an index of
    // that row (the index starts with the row's indices; its last coordinate is free).
    bool row_local = !in_pass && !raw_loads_[i] && !guarded_loads_[i] && !shape.empty() &&
                     in_shape.size() == shape.size();
    for (const std::string& key : loads_[i]) {
      bool own = key == identity;
      bool in_row = !loads_outside_row_passes_[i].contains(key) && key.starts_with(row) &&
                    key.find(", ", row.size()) == std::string::npos;
      row_local = row_local && (own || in_row);
    }
    k.inputs[i].last_nest_loads = same        ? KernelInput::Loads::kIdentity
                                  : guarded   ? KernelInput::Loads::kIdentityOrGuarded
                                  : row_local ? KernelInput::Loads::kRowLocal
                                              : KernelInput::Loads::kOther;
  }
}

// ---- CUDA ----------------------------------------------------------------------------------

std::string KernelEmitter::cuda_source(const std::vector<Shape>& shapes, Kernel& k) {
  auto words = [](int64_t n) { return std::to_string(std::max<int64_t>(n, 1)); };
  std::string nests, entries;
  stored_by_earlier_nest_.clear();
  for (size_t s = 0; s < shapes.size(); ++s) {
    bool is_last = s + 1 == shapes.size();
    if (scatter_) {
      nests += cuda_scatter_nest(*scatter_, k, &entries);
    } else {
      begin_nest_extents(shapes[s], k);
      nests += cuda_nest(s, shapes[s], k, is_last, &entries);
      nest_extents_.clear();
    }
    for (size_t j = 0; j < k.outputs.size(); ++j) {
      const Value* v = body_.outputs()[j];
      if (v->tensor_type().shape == shapes[s] && !written_back(j))  // not read back
        stored_by_earlier_nest_.emplace(v, j);
    }
  }
  // The argument block, its out_meta with the extents the nests registered.
  std::string src = "namespace KILN_KERNEL_NAME {\n";
  src += "using namespace kiln;\nusing namespace kiln::kernel;\n";
  src += "// " + describe_step() + "\n";
  src += "struct Args {\n  void* ins[" + words(static_cast<int64_t>(k.inputs.size())) +
         "];\n  void* outs[" + words(static_cast<int64_t>(k.outputs.size())) +
         "];\n  int64_t in_meta[" + words(k.in_meta_size) + "];\n  int64_t out_meta[" +
         words(k.out_meta_size + static_cast<int64_t>(k.extents.size())) + "];\n  double sd[" +
         words(static_cast<int64_t>(k.inputs.size())) + "];\n  int64_t si[" +
         words(static_cast<int64_t>(k.inputs.size())) + "];\n  void* ws;\n};\n";
  src += nests + entries;
  src += "}  // namespace KILN_KERNEL_NAME\n";
  return src;
}

// The argument declarations of a nest function, in the index type I.
std::string KernelEmitter::cuda_decls(const Kernel& k) const {
  std::string src;
  src += "  [[maybe_unused]] const double* const sd = a.sd;\n";
  src += "  [[maybe_unused]] const int64_t* const si = a.si;\n";
  return src + layout_decls(k, "a.", "I");
}

// Each tensor's base pointer (in<k>, out<k>) and its offset and strides (o<k>, s<k>_<d>;
// oo<k>, os<k>_<d>) as `index` values, from the arrays ins, in_meta, outs, out_meta (named
// with `from` before them).
std::string KernelEmitter::layout_decls(const Kernel& k, const std::string& from,
                                        const std::string& index) const {
  std::string src;
  auto declare_layout = [&](const std::string& pointer, const std::string& array,
                            const std::string& offset, const std::string& stride, int meta,
                            size_t rank) {
    auto element = [&](int at) {
      return "static_cast<" + index + ">(" + from + array + "[" + std::to_string(at) + "])";
    };
    src += "  [[maybe_unused]] " + pointer + ";\n";
    src += "  [[maybe_unused]] const " + index + " " + offset + " = " + element(meta);
    for (size_t d = 0; d < rank; ++d)
      src += ", " + stride + std::to_string(d) + " = " + element(meta + 1 + static_cast<int>(d));
    src += ";\n";
  };
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    if (!k.inputs[i].is_tensor) continue;
    std::string n = std::to_string(i);
    declare_layout("const void* const in" + n + " = " + from + "ins[" + n + "]", "in_meta", "o" + n,
                   "s" + n + "_", k.inputs[i].meta,
                   static_cast<size_t>(body_.inputs()[i]->tensor_type().rank()));
  }
  for (size_t j = 0; j < k.outputs.size(); ++j) {
    std::string n = std::to_string(j);
    declare_layout("void* const out" + n + " = " + from + "outs[" + n + "]", "out_meta", "oo" + n,
                   "os" + n + "_", k.outputs[j].meta, k.outputs[j].shape.size());
  }
  for (size_t e = 0; e < k.extents.size(); ++e)
    src += "  [[maybe_unused]] const " + index + " e" + std::to_string(e) + " = static_cast<" +
           index + ">(" + from + "out_meta[" +
           std::to_string(k.extents_meta + static_cast<int64_t>(e)) + "]);\n";
  return src;
}

// A nest's extents become values the kernel reads (Kernel::extents): that of its first dim of
// more than one element (sizes of 0 and 1 are size classes of their own: no loop runs, or
// loop_index has 0 there), so the tokens of a batch of one, [1, T, 768], are its rows as a batch's
// are; on the CPU also each later dim's but the last (the heads' [1, H, T, D] at every T; the
// last dim's length shapes the vector loops, so it stays a literal). Their uses are bounds and
// counts of the nest itself; anything else the schedules derive from an extent (a choice of
// parallel loops, a table's size) stays text, so a size that changes it changes the source and
// compiles its own kernel, never runs another's. Why that is safe: a kernel is shared only by
// lowerings that wrote the same text, each correct at its own extents' values, which it passes.
void KernelEmitter::begin_nest_extents(const Shape& shape, Kernel& k) {
  nest_extents_.clear();
  const auto first = std::find_if(shape.begin(), shape.end(), [](int64_t n) { return n != 1; });
  if (first == shape.end() || shape_numel(shape) == 0) return;
  const auto outer = static_cast<size_t>(first - shape.begin());
  const size_t end = target_ == Target::kCpu ? std::max(shape.size() - 1, outer + 1) : outer + 1;
  for (size_t d = outer; d < end; ++d) {
    if (shape[d] == 1) continue;
    nest_extents_.push_back(NestExtent{"e" + std::to_string(k.extents.size()), shape[d], d});
    k.extents.push_back(shape[d]);
  }
}

// The extent of dim d of `shape` as loop-bound text: the nest's runtime extent where it is that.
const KernelEmitter::NestExtent* KernelEmitter::nest_extent(const Shape& shape, size_t d) const {
  for (const NestExtent& e : nest_extents_)
    if (d == e.dim && shape[d] == e.value) return &e;
  return nullptr;
}

std::string KernelEmitter::extent_text(const Shape& shape, size_t d) const {
  const NestExtent* e = nest_extent(shape, d);
  return e ? e->name : std::to_string(shape[d]);
}

// `count` as kernel text: over the nest's runtime extents that divide it, in order
//   12288 in a nest over [48, 256]:        e0 * 256LL
//   4096 in a nest over [1, 4, 64, 16]:    e0 * e1 * 16LL
// else the literal.
std::string KernelEmitter::rows_times(int64_t count) const {
  std::string text;
  for (const NestExtent& e : nest_extents_) {
    if (count % e.value != 0) continue;
    count /= e.value;
    text += (text.empty() ? "" : " * ") + e.name;
  }
  if (text.empty()) return int_literal(count);
  return count == 1 ? text : text + " * " + int_literal(count);
}

// The product of `shape`'s dims from `from` on, as kernel text over the nest's extents (a
// contiguous stride, the elements of a row's inner dims): "e1 * 16LL", "496LL".
std::string KernelEmitter::dims_product_text(const Shape& shape, size_t from) const {
  std::string text;
  int64_t literal = 1;
  for (size_t d = from; d < shape.size(); ++d) {
    if (const NestExtent* e = nest_extent(shape, d))
      text += (text.empty() ? "" : " * ") + e->name;
    else
      literal *= shape[d];
  }
  if (text.empty()) return int_literal(literal);
  return literal == 1 ? text : text + " * " + int_literal(literal);
}

// A size the kernel reads at run time (a reduction pass's length, a join's bound), registered
// once per value (two passes over 4096 rows read the same e<k>). For the CPU's passes and joins
// and CUDA's column lanes, whose nests declare the kernel's extents after their bodies are
// emitted.
std::string KernelEmitter::runtime_size(int64_t count) {
  if (!runtime_extents_ || count <= 1) return int_literal(count);
  auto it = runtime_sizes_.find(count);
  if (it != runtime_sizes_.end()) return it->second;
  const std::string name = "e" + std::to_string(kernel_->extents.size());
  kernel_->extents.push_back(count);
  return runtime_sizes_.emplace(count, name).first->second;
}

// "[e0, 256]": the nest's shape in its comment, with no size the source does not depend on.
std::string KernelEmitter::nest_shape_text(const Shape& shape) const {
  std::string s = "[";
  for (size_t d = 0; d < shape.size(); ++d)
    s += (d ? ", " : "") + extent_text(shape, d);
  return s + "]";
}

// i0, i1, ... of the linear position `lin` (row-major over `shape`; dims of size 1 are 0, and a
// shape with a size-0 dim never runs its body).
std::string KernelEmitter::decompose(const Shape& shape, const std::string& indent) {
  std::vector<int> row_major(shape.size());
  std::iota(row_major.begin(), row_major.end(), 0);
  return decompose_in_order(shape, row_major, indent);
}

// The same for a walk whose innermost dim is order.back():
//   order (0, 2, 3, 1) over [2, 8, 6, 6]: i1 = rest % 8; rest /= 8; i3 = rest % 6; ... i0 = rest
std::string KernelEmitter::decompose_in_order(const Shape& shape, const std::vector<int>& order,
                                              const std::string& indent) {
  std::string src = indent + "[[maybe_unused]] I rest = lin;\n";
  if (shape_numel(shape) == 0) {  // the body never runs; its indices only need to exist
    for (size_t d = 0; d < shape.size(); ++d)
      if (shape[d] != 1) src += indent + "const I i" + std::to_string(d) + " = 0;\n";
    return src;
  }
  size_t first = order.size();
  for (size_t k = 0; k < order.size(); ++k)
    if (shape[static_cast<size_t>(order[k])] != 1) {
      first = k;
      break;
    }
  for (size_t k = order.size(); k-- > 0;) {
    const auto d = static_cast<size_t>(order[k]);
    if (shape[d] == 1) continue;  // loop_index has 0 there
    const std::string i = "i" + std::to_string(d), size = std::to_string(shape[d]);
    if (k == first) {
      src += indent + "const I " + i + " = rest;\n";
    } else {
      src += indent + "const I " + i + " = rest % " + size + ";\n";
      src += indent + "rest /= " + size + ";\n";
    }
  }
  return src;
}

const char* KernelEmitter::storage_type(DType d) {
  switch (d) {
    case DType::kBool:
      return "uint8_t";
    case DType::kInt32:
      return "int32_t";
    case DType::kInt64:
      return "int64_t";
    case DType::kFloat16:
    case DType::kBFloat16:
      return "uint16_t";
    case DType::kFloat32:
      return "float";
    case DType::kFloat64:
      return "double";
  }
  return "uint8_t";
}

}  // namespace kiln::codegen::detail

namespace kiln::codegen {
KernelLowering lower_kernel(const Step& step, Target target) {
  return detail::KernelEmitter(step, target).run();
}

CudaArgsLayout cuda_args_layout(const Kernel& kernel) {
  auto words = [](int64_t n) { return std::max<int64_t>(n, 1); };
  auto ni = static_cast<int64_t>(kernel.inputs.size());
  auto no = static_cast<int64_t>(kernel.outputs.size());
  CudaArgsLayout l;
  l.ins = 0;
  l.outs = l.ins + words(ni);
  l.in_meta = l.outs + words(no);
  l.out_meta = l.in_meta + words(kernel.in_meta_size);
  l.sd = l.out_meta + words(kernel.out_meta_size);
  l.si = l.sd + words(ni);
  l.ws = l.si + words(ni);
  l.words = l.ws + 1;
  return l;
}

std::string module_source(Target target,
                          const std::vector<std::pair<std::string, const std::string*>>& kernels) {
  std::string src = target == Target::kCpu ? cpu_kernel_prelude() : cuda_kernel_prelude();
  for (const auto& [symbol, source] : kernels) {
    src += "\n#define KILN_KERNEL_NAME " + symbol + "\n";
    src += *source;
    src += "#undef KILN_KERNEL_NAME\n";
  }
  return src;
}

}  // namespace kiln::codegen
