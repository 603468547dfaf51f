// CUDA flat nests: a grid-stride loop, scalar and 16-byte vector variants.
// Part of the kernel emitter (kernel_emitter.h).
#include "kiln/codegen/kernel_emitter.h"

#include <numeric>

namespace kiln::codegen::detail {

// The kernel entries of nest `index`'s `variant` ('s' scalar, 'v' vector), in 32- and 64-bit
// indexing (_n<index>_<variant>32, ...64), each calling the device function `body<I>`.
std::string KernelEmitter::cuda_entries(size_t index, char variant, int block_threads,
                                        const std::string& body) {
  std::string out;
  for (int bits : {32, 64}) {
    std::string entry = "_n" + std::to_string(index) + "_" + variant + std::to_string(bits);
    out += "extern \"C\" __global__ void __launch_bounds__(" + std::to_string(block_threads) +
           ") KILN_CAT(KILN_KERNEL_NAME, " + entry + ")(const Args a) {\n  " + body + "<" +
           (bits == 32 ? "int32_t" : "int64_t") + ">(a);\n}\n";
  }
  return out;
}

const std::vector<int>* KernelEmitter::stored_order(const Shape& shape, const Kernel& k) const {
  for (size_t j = 0; j < k.outputs.size() && j < step_.output_orders.size(); ++j)
    if (!step_.output_orders[j].empty() && k.outputs[j].shape == shape &&
        step_.output_orders[j].size() == shape.size())
      return &step_.output_orders[j];
  return nullptr;
}

// The nest's broadcast tables (broadcast_tables.h) in shared memory, each filled by the block's
// threads before the nest's loop: a value the nest broadcasts (a batch norm's per-channel scale
// rsqrt(var + eps) * weight, with an exact square root and division) is computed once a block
// instead of once an element, and each element loads its entry:
//   __shared__ float tbl0[64];
//   for (I lin = threadIdx.x; lin < 64; lin += blockDim.x) { i1 = lin; ...; tbl0[(i1) * 1LL] = v3;
//   }
//   __syncthreads();
// A table may read an earlier one (they come in the body's order): a barrier follows each.
// Tables the nest broadcasts fewer than kTableBroadcast times, or past kCudaTableBytes, stay
// inline. Sets table_name_ (cleared when the nest is emitted) and the entries' count.
std::string KernelEmitter::cuda_tables(const Shape& shape, Kernel& k, int64_t& entries) {
  std::string src;
  int64_t bytes = 0;
  for (const Value* v : broadcast_tables(body_)) {
    const TensorType& type = v->tensor_type();
    const int64_t size = type.numel() * (reg(type.dtype) == "float" ? 4 : 8);
    if (shape_numel(shape) < kTableBroadcast * type.numel() || bytes + size > kCudaTableBytes)
      continue;
    const std::string name = "tbl" + std::to_string(table_name_.size());
    const std::string count = std::to_string(type.numel());
    begin_body(type.shape, k, NestMode::kFlat, nullptr);
    const Index at = loop_index(type.shape);
    const Val r = eval(v, at);
    NestBody levels;
    levels.levels = levels_;
    const std::string body =
        levels.flat() + name + "[" + table_position(v, at) + "] = " + r.expr + ";\n";
    src += "  __shared__ alignas(16) " + reg(type.dtype) + " " + name + "[" + count + "];  // " +
           shape_str(type.shape) + "\n";
    src += "  for (I lin = static_cast<I>(threadIdx.x); lin < static_cast<I>(" + count +
           "LL); lin += static_cast<I>(blockDim.x)) {\n" + decompose(type.shape, "    ") +
           indented(body, 2) + "  }\n  __syncthreads();\n";
    table_name_[v] = name;  // filled: from here on its uses load it
    bytes += size;
    entries += type.numel();
  }
  return src;
}

// The entries of the lane tables (lane_tables_) the lanes of one iteration read: consecutive,
// from the lanes' first index along their dim (Lanes::inner_dim), whose size is a multiple of the
// width; 16-byte loads from shared memory into lane_<table>[width].
std::string KernelEmitter::lane_table_loads(const Shape& shape, const Lanes& lanes) const {
  std::string src;
  const std::string v = std::to_string(lanes.width);
  for (const std::string& table : lane_tables_) {
    const std::string start = table + " + base % static_cast<I>(" +
                              std::to_string(shape[static_cast<size_t>(lanes.inner_dim)]) + "LL)";
    DType d = DType::kFloat32;
    for (const auto& [value, name] : table_name_)
      if (name == table) d = value->tensor_type().dtype;
    const int64_t bytes = (reg(d) == "float" ? 4 : 8) * lanes.width;
    src += "      alignas(16) " + reg(d) + " lane_" + table + "[" + v + "];\n";
    for (int64_t at = 0; at < bytes; at += 16)
      src += "      vector_load<" + std::to_string(std::min<int64_t>(16, bytes - at)) +
             ">(reinterpret_cast<char*>(lane_" + table + ") + " + std::to_string(at) +
             ", reinterpret_cast<const char*>(" + start + ") + " + std::to_string(at) + ");\n";
  }
  return src;
}

// The nest's 16-byte vector variant (empty: none): the inputs read only at the iteration's own
// element are loaded as vectors, the outputs stored as vectors, `width` lanes an iteration; the
// elements past the last whole vector run as the scalar body does. `prologue`: the function's
// declarations and tables.
std::string KernelEmitter::cuda_vector_variant(const std::string& name, const Shape& shape,
                                               Kernel& k, bool is_last,
                                               const std::vector<int>* order,
                                               const std::string& prologue, const NestBody& scalar,
                                               KernelNest& nest) {
  auto walk = [&](const std::string& indent) {
    return order ? decompose_in_order(shape, *order, indent) : decompose(shape, indent);
  };
  std::string identity = index_key(loop_index(shape));
  Lanes lanes;
  int64_t widest = 0;
  for (size_t i = 0; i < k.inputs.size(); ++i) {
    if (!k.inputs[i].is_tensor || raw_loads_[i] || loads_[i].empty()) continue;
    if (loads_[i].size() != 1 || *loads_[i].begin() != identity) continue;
    if (body_.inputs()[i]->tensor_type().shape != shape) continue;
    lanes.inputs.insert(i);
    widest = std::max<int64_t>(widest, dtype_size(body_.inputs()[i]->tensor_type().dtype));
  }
  std::vector<size_t> outs;
  for (size_t j = 0; j < k.outputs.size(); ++j)
    if (nest_stores(k.outputs[j].shape, shape)) {
      outs.push_back(j);
      widest = std::max<int64_t>(widest, dtype_size(k.outputs[j].dtype));
    }
  int width = static_cast<int>(std::min<int64_t>(8, 16 / std::max<int64_t>(widest, 1)));
  if (width <= 1 || nest.numel < width) return "";
  std::vector<std::vector<StorageWindow>> windows = windows_;
  std::vector<bool> whole = whole_storage_;
  // The lanes' dim: the walk's innermost of more than one element.
  std::vector<int> walked(shape.size());
  std::iota(walked.begin(), walked.end(), 0);
  if (order) walked = *order;
  for (size_t w = walked.size(); w-- > 0;)
    if (const auto d = static_cast<size_t>(walked[w]); shape[d] != 1) {
      if (shape[d] % width == 0) lanes.inner_dim = static_cast<int>(d);
      break;
    }
  lanes.width = width;
  lane_tables_.clear();
  NestBody lane = emit_body(shape, k, is_last, NestMode::kFlat, &lanes);
  windows_ = windows;
  whole_storage_ = whole;
  nest.vector_width = width;
  for (size_t i : lanes.inputs)
    nest.vector_inputs.push_back(static_cast<int>(i));
  for (size_t j : outs)
    nest.vector_outputs.push_back(static_cast<int>(j));
  std::string v = std::to_string(width);
  std::string src = "template <class I>\n__device__ __forceinline__ void " + name +
                    "_vector(const Args& a) {\n" + prologue;
  src += "  const I n = static_cast<I>(" + rows_times(nest.numel) + ");\n";
  src += "  const I step = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x) * " + v + ";\n";
  src +=
      "  for (I base = (static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + "
      "static_cast<I>(threadIdx.x)) * " +
      v + "; base < n; base += step) {\n";
  src += "    if (base + " + v + " <= n) {\n";
  for (size_t i : lanes.inputs) {
    DType d = body_.inputs()[i]->tensor_type().dtype;
    std::string n = std::to_string(i), size = std::to_string(dtype_size(d));
    src += "      alignas(16) " + std::string(storage_type(d)) + " lane_in" + n + "[" + v + "];\n";
    src += "      vector_load<" + std::to_string(dtype_size(d) * width) + ">(lane_in" + n +
           ", static_cast<const char*>(in" + n + ") + static_cast<int64_t>(o" + n + " + base) * " +
           size + ");\n";
  }
  for (size_t j : outs) {
    std::string n = std::to_string(j);
    src += "      alignas(16) " + std::string(storage_type(k.outputs[j].dtype)) + " lane_out" + n +
           "[" + v + "];\n";
  }
  src += lane_table_loads(shape, lanes);
  src += "#pragma unroll\n      for (int l = 0; l < " + v + "; ++l) {\n";
  src += "        const I lin = base + l;\n" + walk("        ");
  src +=
      "        {\n" + indented(lane.flat(), 5) + indented(lane.stores, 5) + "        }\n      }\n";
  for (size_t j : outs) {
    DType d = k.outputs[j].dtype;
    std::string n = std::to_string(j), size = std::to_string(dtype_size(d));
    src += "      vector_store<" + std::to_string(dtype_size(d) * width) +
           ">(static_cast<char*>(out" + n + ") + static_cast<int64_t>(oo" + n + " + base) * " +
           size + ", lane_out" + n + ");\n";
  }
  src += "    } else {\n      for (I lin = base; lin < n; ++lin) {\n" + walk("        ") +
         "        {\n" + indented(scalar.flat(), 5) + indented(scalar.stores, 5) +
         "        }\n      }\n    }\n  }\n}\n";
  return src;
}

// The nest's device functions and their entries (appended to `entries`).
std::string KernelEmitter::cuda_nest(size_t index, const Shape& shape, Kernel& k, bool is_last,
                                     std::string* entries) {
  KernelNest nest;
  nest.shape = shape;
  nest.numel = shape_numel(shape);
  std::string name = "nest" + std::to_string(index);
  // (What the first body recorded of the inputs' windows, kept for a body emitted again.)
  const std::vector<std::vector<StorageWindow>> windows_before = windows_;
  const std::vector<bool> whole_before = whole_storage_;
  NestBody scalar = emit_body(shape, k, is_last, NestMode::kFlat);
  if (row_reductions_ > 0) return cuda_rows_nest(index, shape, k, is_last, nest, entries);
  // An output laid out in another dim order (place_layouts.h: channels-last): the nest walks
  // its elements in that order, so its stores and the loads of inputs laid out alike coalesce
  // (its vector variant where they are all dense in that order); no tiles.
  const std::vector<int>* order = reductions_ == 0 ? stored_order(shape, k) : nullptr;
  auto walk = [&](const std::string& indent) {
    return order ? decompose_in_order(shape, *order, indent) : decompose(shape, indent);
  };
  if (order) nest.order = *order;
  if (reductions_ == 0 && !order)
    if (std::vector<size_t> transposed = transposed_inputs(shape); !transposed.empty())
      return cuda_tiles_nest(index, shape, k, is_last, nest, transposed, entries);
  element_.numel = nest.numel;
  element_.widest = widest_dtype_bytes(k);
  const ReductionSchedule schedule = choose_reduction_schedule(element_, kCudaBlock);
  if (schedule.kind == ReductionSchedule::Kind::kRowPerElement) {
    Shape rows = shape;
    rows.push_back(1);
    return cuda_rows_nest(index, rows, k, is_last, nest, entries, /*unit_row=*/true);
  }
  if (schedule.kind == ReductionSchedule::Kind::kColumns)
    return cuda_columns_nest(index, shape, k, is_last, nest, schedule, entries);
  std::string tables;
  if (reductions_ == 0) {
    windows_ = windows_before;
    whole_storage_ = whole_before;
    tables = cuda_tables(shape, k, nest.table_entries);
    scalar = emit_body(shape, k, is_last, NestMode::kFlat);  // loading the tables' entries
  }
  if (is_last) record_last_nest_loads(shape, k);
  std::string schedule_line;
  if (order) {
    schedule_line = " in dim order (";
    for (size_t d = 0; d < order->size(); ++d)
      schedule_line += (d ? ", " : "") + std::to_string((*order)[d]);
    schedule_line += ")";
  }
  // (Shapes, not value names: regions alike share one kernel's source.)
  std::vector<std::string> table_of(table_name_.size());  // in the order they are filled
  for (const auto& [v, table] : table_name_)
    table_of[std::stoul(table.substr(3))] = shape_str(v->tensor_type().shape);
  for (size_t t = 0; t < table_of.size(); ++t)
    schedule_line += ", table tbl" + std::to_string(t) + " " + table_of[t];
  // (Declared after the bodies: a pass's length read at run time is an extent of theirs.)
  const std::string decls = cuda_decls(k);
  std::string src = schedule_line.empty() ? "" : "// schedule: pointwise" + schedule_line + "\n";
  src += "template <class I>\n__device__ __forceinline__ void " + name +
         "_scalar(const Args& a) {\n" + decls + tables;
  src += "  const I n = static_cast<I>(" + rows_times(nest.numel) + ");\n";
  src += "  const I step = static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x);\n";
  src +=
      "  for (I lin = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + "
      "static_cast<I>(threadIdx.x); lin < n; lin += step) {\n";
  src += walk("    ") + indented(scalar.flat(), 2) + indented(scalar.stores, 2) + "  }\n}\n";

  std::string variants = "s";
  if (std::string vector =
          cuda_vector_variant(name, shape, k, is_last, order, decls + tables, scalar, nest);
      !vector.empty()) {
    src += vector;
    variants += "v";
  }
  table_name_.clear();  // the tables are this nest's functions'
  for (char variant : variants) {
    *entries +=
        cuda_entries(index, variant, kCudaBlock, name + (variant == 's' ? "_scalar" : "_vector"));
  }
  k.nests.push_back(std::move(nest));
  return src;
}

}  // namespace kiln::codegen::detail
