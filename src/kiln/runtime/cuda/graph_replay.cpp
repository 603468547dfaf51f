#include "kiln/runtime/cuda/graph_replay.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>

#include "kiln/codegen/kernel.h"
#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/cuda/driver.h"
#include "kiln/runtime/cuda/graph_rebinding.h"
#include "kiln/runtime/index_checks.h"
#include "kiln/runtime/interpreter/eager_calls.h"
#include "kiln/support/error.h"

namespace kiln::cuda {

namespace {

// The bytes a replay may copy (moving arguments in, fresh results it does not rebind out) per
// launch it saves. 2 MiB read and written take about 1.5 us at an H100's or H200's copy
// bandwidth; a launch costs several us of host time, and the device a gap of 1-2 us even when
// the host keeps ahead. Measured on an H100 (2026-12-06), GPT-2 at batch 32 and Llama at 16 ran
// 8% and 10% faster as graphs that copied 1.2 and 0.85 MB per launch.
constexpr size_t kCopyBytesPerLaunch = size_t{2} << 20;

bool graphs_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_CUDA_GRAPHS");
    return !v || std::string(v) != "0";
  }();
  return on;
}

const RtTensor* tensor_of(const RtValue& v) {
  const auto* t = std::get_if<TensorHandle>(&v);
  return t ? t->get() : nullptr;
}

// The bytes of the storage a tensor views.
size_t storage_bytes(const RtTensor& t) {
  return static_cast<size_t>(t.storage->numel() * dtype_size(t.dtype()));
}

// Where an argument's storage starts (0 for a number): what a stable argument keeps.
uint64_t address_of(const RtValue& v) {
  const RtTensor* t = tensor_of(v);
  return t ? t->storage->device_data : 0;
}

bool on_cuda(const std::vector<RtValue>& args) {
  for (const RtValue& a : args)
    if (const RtTensor* t = tensor_of(a)) return t->device().kind == Device::Kind::kCuda;
  return false;
}

// The arguments whose memory the program writes (their group is a writeback target).
std::vector<bool> written_arguments(const CompiledProgram& program) {
  const Trace& trace = program.execution;
  std::set<const Value*> targets;
  for (const auto& wb : trace.writebacks)
    targets.insert(wb.first);
  for (const Step& step : program.plan.steps)
    for (const Step::Writeback& wb : step.writebacks)
      targets.insert(wb.target);
  std::vector<bool> written(program.pattern.inputs.size(), false);
  for (size_t j = 0; j < written.size(); ++j) {
    int g = program.pattern.inputs[j].group;
    written[j] = g >= 0 && targets.contains(trace.inputs()[static_cast<size_t>(g)]);
  }
  return written;
}

// Why a run through execute() could not be a graph's (empty: it could).
std::string ineligible(const CompiledProgram& program, const ExecutionStats& s,
                       const ExecuteOptions& options) {
  if (s.eager_steps && !options.eager_capture)
    return "a step PyTorch runs (eager_call), outside kiln's Python front end";
  if (s.torch_steps || s.interpreted_steps || s.host_copies) return "a step without a kernel";
  if (!program.interface.metadata.empty()) return "a metadata mutation of an argument";
  // (A multi-tensor launch counts its steps: a replay also saves the host's work per member,
  // which outweighs the one launch it saves.)
  if (s.kernel_steps + s.library_steps + s.eager_steps + s.multi_tensor_steps < 2)
    return "fewer than two launches";
  return "";
}

// The first and last storage element a tensor covers (its strides are not negative).
std::pair<int64_t, int64_t> span_of(const RtTensor& t) {
  int64_t last = t.offset;
  for (size_t d = 0; d < t.sizes.size(); ++d)
    last += (t.sizes[d] - 1) * t.strides[d];
  return {t.offset, last};
}

// Device memory of one captured graph: every block the capture allocates stays the graph's for
// its life (each replay reads and writes it). A block freed during the capture goes to a later
// allocation of the same capture: a capture is one stream, so the graph runs its nodes in
// capture order and the block's earlier user is done by then.
class CapturePool : public Allocator {
 public:
  CapturePool(Allocator* inner, int device) : state_(std::make_shared<State>()) {
    state_->inner = inner;
    state_->device = device;
  }
  // After the capture: the inner allocator is the capture call's and goes with it.
  void seal() {
    state_->inner = nullptr;
    state_->sealed = true;
  }

  Block allocate(Device device, size_t bytes) override {
    KILN_ASSERT(state_->sealed == false && device.index == state_->device)
        << "a captured graph's memory was asked for after its capture";
    bytes = std::max<size_t>((bytes + 255) / 256 * 256, 256);
    auto it = state_->free.lower_bound(bytes);
    Held held;
    if (it != state_->free.end() && it->first <= 2 * bytes) {
      held = it->second;
      state_->free.erase(it);
      state_->blocks[held.address].second += 1;
    } else {
      held.bytes = bytes;
      if (state_->inner) {
        Block b = state_->inner->allocate(device, bytes);
        held.address = b.device;
        held.owner = b.owner;
      } else {
        std::shared_ptr<DeviceMemory> m = allocate_for_graph(device.index, bytes);
        held.address = m->ptr;
        held.owner = m;
      }
      state_->blocks[held.address] = {held.bytes, 1};
    }
    std::shared_ptr<State> state = state_;
    // Freed back into the pool, never to PyTorch or the driver while the graph lives.
    std::shared_ptr<void> owner(state.get(),
                                [state, held](void*) { state->free.emplace(held.bytes, held); });
    return Block{nullptr, held.address, owner};
  }

  // The bytes of the block at `address` when the capture handed it out once (to one tensor
  // alone, for the whole capture); nullopt when it handed it out again, or never.
  std::optional<size_t> sole_block(uint64_t address) const {
    auto it = state_->blocks.find(address);
    if (it == state_->blocks.end() || it->second.second != 1) return std::nullopt;
    return it->second.first;
  }

 private:
  struct Held {
    size_t bytes = 0;
    uint64_t address = 0;
    std::shared_ptr<void> owner;  // the memory itself
  };
  struct State {
    Allocator* inner = nullptr;
    int device = 0;
    bool sealed = false;
    std::multimap<size_t, Held> free;
    std::map<uint64_t, std::pair<size_t, int>> blocks;  // address -> bytes, times handed out
  };
  std::shared_ptr<State> state_;
};

}  // namespace

struct GraphReplay::Captured {
  ~Captured() {
    try {
      if (launched) done->synchronize();  // the memory goes back only after the last replay
    } catch (...) {  // the driver is shutting down (at exit): nothing runs any more
    }
    destroy_graph(graph);
  }
  // PyTorch's memory of the eager steps (their results and workspaces): first, so that it is
  // released last, after the graph and every block of kiln's that came from PyTorch.
  std::unique_ptr<EagerCapturePool> eager_pool;
  int device = 0;
  CapturedGraph graph;
  std::shared_ptr<CapturePool> pool;
  // Per argument: the storage address a stable one must have (0: a number or a moving one).
  std::vector<uint64_t> addresses;
  // Moving arguments of one storage share a buffer of the graph holding their elements
  // [first, first + count) of the caller's storage, copied in before each replay.
  struct Moving {
    int arg = 0;  // one of them
    int64_t first = 0;
    size_t bytes = 0;
    TensorHandle buffer;
  };
  std::vector<Moving> moving;
  std::vector<int> moving_of;  // per argument: its entry in `moving`, or -1
  // An index check made before each replay, on the caller's argument `arg` viewed so.
  struct Check {
    codegen::IndexCheck check;
    int arg = 0;
    Shape sizes;
    std::vector<int64_t> strides;
    int64_t offset = 0;  // in the caller's storage
    // A check of a caller's tensor the index is drawn from (IndexCheck::drawn_from): its
    // failure proves nothing, so the call runs without the graph, where the exact check decides.
    bool sufficient = false;
  };
  std::vector<Check> checks;
  // Each result: the argument itself, a view of an argument's storage (the caller's), or a view
  // of a fresh storage, copied out of the graph's memory after each replay.
  struct Result {
    enum class Kind { kArgument, kArgumentView, kFresh } kind = Kind::kFresh;
    int index = 0;  // the argument, or the entry in `fresh`
    Shape sizes;
    std::vector<int64_t> strides;
    int64_t offset = 0;
  };
  std::vector<Result> results;
  std::vector<TensorHandle> fresh;  // graph memory
  // The fresh storages a replay gives new memory of the caller's allocator, pointing the launches
  // that use them there instead of copying them out of the graph's memory (graph_rebinding.h).
  Rebinding rebinding;
  // Storages the capture's library calls and eager steps read or write, [first, end): their
  // kernels may hold an address where kiln cannot see it (in memory, or encoded in a TMA
  // descriptor), so those storages are never rebound.
  std::vector<std::pair<uint64_t, uint64_t>> foreign_spans;
  ExecutionStats stats;  // of the captured run
  std::unique_ptr<StreamEvent> done;
  Stream last_stream = nullptr;
  bool launched = false;

  // Offset in the caller's storage of an offset in the capture's argument `j`.
  int64_t caller_offset(int j, int64_t offset) const {
    int m = moving_of.at(static_cast<size_t>(j));
    return m < 0 ? offset : offset + moving.at(static_cast<size_t>(m)).first;
  }
};

namespace {

// Records what the executor hands a capture.
class Recorder : public ExecutionCapture {
 public:
  // `argument_of`: the caller's argument that is each trace input, where one is (not for a
  // synthetic base of aliased arguments).
  Recorder(GraphReplay::Captured& c, const std::vector<RtValue>& capture_args,
           const std::vector<bool>& written, std::map<const Value*, int> argument_of)
      : c_(c), args_(capture_args), written_(written), argument_of_(std::move(argument_of)) {}
  void defer_index_check(const codegen::IndexCheck& check, const TensorHandle& index) override {
    for (size_t j = 0; j < args_.size(); ++j) {
      const RtTensor* a = tensor_of(args_[j]);
      if (!a || a->storage != index->storage) continue;
      if (written_[j]) refuse("an index in memory the program writes");
      add(GraphReplay::Captured::Check{check, static_cast<int>(j), index->sizes, index->strides,
                                       c_.caller_offset(static_cast<int>(j), index->offset)});
      return;
    }
    if (check.drawn_from.empty()) refuse("an index the program computes");
    // Computed from caller's tensors: all of their elements are checked instead.
    for (const DrawnInput& source : check.drawn_from) {
      auto it = argument_of_.find(source.input);
      if (it == argument_of_.end()) refuse("an index the program computes from aliased arguments");
      const auto j = static_cast<size_t>(it->second);
      if (written_[j]) refuse("an index drawn from memory the program writes");
      const RtTensor& a = *tensor_of(args_[j]);
      codegen::IndexCheck whole = check;
      whole.view.reset();
      whole.drawn_from.clear();
      whole.never_selected = source.never_selected;
      add(GraphReplay::Captured::Check{std::move(whole), it->second, a.sizes, a.strides,
                                       c_.caller_offset(it->second, a.offset), true});
    }
  }
  // PyTorch's device work is captured with kiln's when its function says it may be (no random
  // numbers, no host reads) and it works on device memory only.
  void admit_eager_step(const Trace& body, const std::vector<RtValue>& inputs) override {
    if (!c_.eager_pool) refuse("a step PyTorch runs (eager_call), outside kiln's Python front end");
    for (const auto& n : body.nodes()) {
      if (n->id() != OpId::kEagerCall) continue;
      std::string why = eager_function_capture_refusal(static_cast<int>(n->arg(0).as_int()));
      if (!why.empty()) refuse("a step PyTorch runs (eager_call): " + why);
    }
    for (const RtValue& v : inputs)
      if (const RtTensor* t = tensor_of(v); !t || !t->storage->on_device())
        refuse("a step PyTorch runs (eager_call) on a number or a tensor in host memory");
  }
  void note_foreign_step(const std::vector<RtValue>& inputs,
                         const std::vector<RtValue>& outputs) override {
    for (const auto* values : {&inputs, &outputs})
      for (const RtValue& v : *values) {
        const RtTensor* t = tensor_of(v);
        if (!t || !t->storage->on_device()) continue;
        const uint64_t first = t->storage->device_data;
        c_.foreign_spans.emplace_back(first, first + storage_bytes(*t));
      }
  }
  [[noreturn]] void refuse(const std::string& why) override { throw CaptureRefused(why); }

 private:
  // One check of each index for all the kernels that check it alike (a KV cache's position,
  // checked by every layer's write): the first in program order names the op, as it would raise
  // first without the graph.
  void add(GraphReplay::Captured::Check k) {
    for (const GraphReplay::Captured::Check& seen : c_.checks)
      if (seen.arg == k.arg && seen.sizes == k.sizes && seen.strides == k.strides &&
          seen.offset == k.offset && seen.check.size == k.check.size &&
          seen.check.negative == k.check.negative && seen.check.view == k.check.view &&
          seen.check.never_selected == k.check.never_selected && seen.sufficient == k.sufficient)
        return;
    c_.checks.push_back(std::move(k));
  }

  GraphReplay::Captured& c_;
  const std::vector<RtValue>& args_;
  const std::vector<bool>& written_;
  const std::map<const Value*, int> argument_of_;
};

// Each trace input that is one caller's argument (not a synthetic base of aliased ones): that
// argument's number.
std::map<const Value*, int> arguments_by_input(const CompiledProgram& program) {
  std::map<const Value*, int> by_input;
  const AliasPattern& pattern = program.pattern;
  for (size_t j = 0; j < pattern.inputs.size(); ++j) {
    int g = pattern.inputs[j].group;
    if (g < 0 || pattern.groups[static_cast<size_t>(g)].synthetic) continue;
    by_input.emplace(program.execution.inputs()[static_cast<size_t>(g)], static_cast<int>(j));
  }
  return by_input;
}

}  // namespace

GraphReplay::GraphReplay() = default;
GraphReplay::~GraphReplay() = default;

std::vector<RtValue> GraphReplay::run(const CompiledProgram& program,
                                      const std::vector<RtValue>& args,
                                      const ExecuteOptions& options) {
  if (!graphs_enabled() || options.capture || !on_cuda(args))
    return execute(program, args, options);
  if (graph_) {
    if (std::optional<std::vector<RtValue>> out = replay(*graph_, args, options)) return *out;
    graph_.reset();  // a stable argument moved (learn again), or refused_ says why not
    eligible_runs_ = 0;
  }
  if (!refused_.empty() || eligible_runs_ < 2) return execute_and_learn(program, args, options);
  try {
    graph_ = capture(program, args, options);
  } catch (const std::exception& e) {
    // Refused, or an error the capture met: the run below meets it again and reports it.
    refused_ = e.what();
    return execute(program, args, options);
  }
  std::optional<std::vector<RtValue>> out = replay(*graph_, args, options);
  if (!out && !refused_.empty()) {  // an index drawn from values out of range
    graph_.reset();
    return execute(program, args, options);
  }
  KILN_ASSERT(out) << "a graph did not replay for the call it was captured from";
  if (options.stats) options.stats->graph_captures = 1;
  return *out;
}

std::vector<RtValue> GraphReplay::execute_and_learn(const CompiledProgram& program,
                                                    const std::vector<RtValue>& args,
                                                    const ExecuteOptions& options) {
  ExecutionStats local;
  ExecuteOptions o = options;
  if (!o.stats) o.stats = &local;
  std::vector<RtValue> results = execute(program, args, o);
  if (refused_.empty()) {
    refused_ = ineligible(program, *o.stats, options);
    last_addresses_.clear();
    for (const RtValue& a : args)
      last_addresses_.push_back(address_of(a));
    ++eligible_runs_;
  }
  return results;
}

std::unique_ptr<GraphReplay::Captured> GraphReplay::capture(const CompiledProgram& program,
                                                            const std::vector<RtValue>& args,
                                                            const ExecuteOptions& options) {
  auto c = std::make_unique<Captured>();
  const std::vector<bool> written = written_arguments(program);
  for (const RtValue& a : args)
    if (const RtTensor* t = tensor_of(a)) c->device = t->device().index;
  c->pool = std::make_shared<CapturePool>(options.allocator, c->device);
  c->done = std::make_unique<StreamEvent>(c->device);
  Stream stream = capture_stream(c->device);

  // Stable arguments are used where they are; moving ones through a buffer of the graph.
  std::vector<RtValue> capture_args = args;
  c->addresses.assign(args.size(), 0);
  c->moving_of.assign(args.size(), -1);
  std::map<const Storage*, int> moving_storage;
  for (size_t j = 0; j < args.size(); ++j) {
    const RtTensor* t = tensor_of(args[j]);
    if (!t) continue;
    if (address_of(args[j]) == last_addresses_.at(j)) {
      c->addresses[j] = address_of(args[j]);
      continue;
    }
    if (written[j]) throw CaptureRefused("an argument the program writes moves between calls");
    auto [it, added] = moving_storage.emplace(t->storage.get(), static_cast<int>(c->moving.size()));
    if (added) c->moving.push_back(Captured::Moving{static_cast<int>(j), 0, 0, nullptr});
    c->moving_of[j] = it->second;
  }
  for (size_t m = 0; m < c->moving.size(); ++m) {
    int64_t first = INT64_MAX, last = -1;
    const RtTensor* rep = tensor_of(args[static_cast<size_t>(c->moving[m].arg)]);
    for (size_t j = 0; j < args.size(); ++j) {
      const RtTensor* t = tensor_of(args[j]);
      if (c->moving_of[j] != static_cast<int>(m) || t->numel() == 0) continue;
      auto [lo, hi] = span_of(*t);
      first = std::min(first, lo);
      last = std::max(last, hi);
    }
    if (last < 0) first = last = 0;  // only empty tensors: a one-element buffer
    int64_t count = last - first + 1;
    Captured::Moving& mv = c->moving[m];
    mv.first = first;
    mv.bytes = static_cast<size_t>(count * dtype_size(rep->dtype()));
    mv.buffer = cuda_strided(rep->dtype(), {count}, {1}, 0, count, rep->device(), false,
                             c->pool.get(), stream);
  }
  for (size_t j = 0; j < args.size(); ++j) {
    int m = c->moving_of[j];
    if (m < 0) continue;
    const RtTensor& t = *tensor_of(args[j]);
    const Captured::Moving& mv = c->moving[static_cast<size_t>(m)];
    int64_t offset = t.numel() == 0 ? 0 : t.offset - mv.first;
    capture_args[j] = make_view(mv.buffer, t.sizes, t.strides, offset);
  }

  // PyTorch's allocations and stream join the capture before it begins (as torch.cuda.graph
  // routes its allocator first), and leave it after it ends, failed or not.
  if (options.eager_capture) c->eager_pool = (*options.eager_capture)(stream, c->device);
  Recorder recorder(*c, capture_args, written, arguments_by_input(program));
  ExecutionStats stats;
  ExecuteOptions o = options;
  o.allocator = c->pool.get();
  o.stream = stream;
  o.stats = &stats;
  o.capture = &recorder;
  std::vector<RtValue> results;
  try {
    CaptureScope scope(stream, c->device);
    results = execute(program, capture_args, o);
    c->graph = scope.finish();
  } catch (...) {
    if (c->eager_pool) c->eager_pool->end_capture();
    throw;
  }
  if (c->eager_pool) c->eager_pool->end_capture();
  c->pool->seal();
  c->stats = stats;

  std::map<const Storage*, int> fresh_index;
  for (const RtValue& v : results) {
    const RtTensor* t = tensor_of(v);
    if (!t) throw CaptureRefused("a number among the results");
    // Results are told apart by their storage object, which a view_dtype result does not share
    // with the memory it reads.
    if (t->storage->reinterprets)
      throw CaptureRefused("a result that reads memory as another dtype (view_dtype)");
    Captured::Result r{Captured::Result::Kind::kFresh, 0, t->sizes, t->strides, t->offset};
    for (size_t j = 0; j < capture_args.size() && r.kind == Captured::Result::Kind::kFresh; ++j) {
      const RtTensor* a = tensor_of(capture_args[j]);
      if (a == t) {
        r.kind = Captured::Result::Kind::kArgument;
        r.index = static_cast<int>(j);
      } else if (a && a->storage == t->storage) {
        r.kind = Captured::Result::Kind::kArgumentView;
        r.index = static_cast<int>(j);
        r.offset = c->caller_offset(static_cast<int>(j), t->offset);
      }
    }
    if (r.kind == Captured::Result::Kind::kFresh) {
      auto [it, added] = fresh_index.emplace(t->storage.get(), static_cast<int>(c->fresh.size()));
      if (added) c->fresh.push_back(std::get<TensorHandle>(v));
      r.index = it->second;
    }
    c->results.push_back(std::move(r));
  }
  std::vector<FreshBlock> blocks;
  for (const TensorHandle& f : c->fresh)
    blocks.push_back({f->storage->device_data, c->pool->sole_block(f->storage->device_data)});
  c->rebinding = choose_rebound_results(c->graph.contents, blocks, c->foreign_spans);
  const std::vector<bool>& rebound = c->rebinding.rebound;
  // A replay copies the moving arguments in and the fresh results it does not rebind out; a
  // graph pays only where those copies cost little against the host time of the launches it
  // saves (a few microseconds each): a bandwidth-bound program with large moving tensors runs
  // faster as it is.
  size_t copied = 0;
  for (const Captured::Moving& m : c->moving)
    copied += m.bytes;
  for (size_t f = 0; f < c->fresh.size(); ++f)
    if (!rebound[f]) copied += storage_bytes(*c->fresh[f]);
  const auto launches =
      static_cast<size_t>(stats.kernel_steps + stats.library_steps + stats.eager_steps);
  if (copied > launches * kCopyBytesPerLaunch)
    throw CaptureRefused("a replay would copy " + std::to_string(copied) +
                         " bytes of arguments and results for " + std::to_string(launches) +
                         " launches (" + std::to_string(std::ranges::count(rebound, true)) +
                         " of " + std::to_string(c->fresh.size()) +
                         " fresh results written in new memory; the first " +
                         "of the others is copied as " + c->rebinding.why_copied + ")");
  return c;
}

std::optional<std::vector<RtValue>> GraphReplay::replay(Captured& c,
                                                        const std::vector<RtValue>& args,
                                                        const ExecuteOptions& options) {
  for (size_t j = 0; j < args.size(); ++j)
    if (c.addresses[j] && address_of(args[j]) != c.addresses[j]) return std::nullopt;
  Stream stream = options.stream;
  // Before anything is queued: an index out of range raises with every tensor untouched.
  for (const Captured::Check& k : c.checks) {
    TensorHandle view = make_view(std::get<TensorHandle>(args.at(static_cast<size_t>(k.arg))),
                                  k.sizes, k.strides, k.offset);
    if (k.sufficient) {
      // (Not captured again: the tensor's other values stay out of range in the next calls.)
      if (first_index_out_of_range(k.check, *view)) {
        refused_ =
            "an index drawn from an argument that holds values out of range for " + k.check.op;
        return std::nullopt;
      }
    } else {
      check_index_values(k.check, *view);
    }
  }
  // The graph's buffers were last used by the previous replay, perhaps on another stream.
  if (c.launched && stream != c.last_stream) c.done->make_wait(stream);
  for (const Captured::Moving& m : c.moving) {
    const RtTensor& from = *std::get<TensorHandle>(args.at(static_cast<size_t>(m.arg)));
    uint64_t source =
        from.storage->device_data + static_cast<uint64_t>(m.first * dtype_size(from.dtype()));
    copy_on_device(m.buffer->storage->device_data, source, m.bytes, c.device, stream);
  }
  // Each fresh result in new memory: written there by the graph (rebound) or copied there.
  std::vector<TensorHandle> copies;
  for (const TensorHandle& f : c.fresh) {
    int64_t n = f->storage->numel();
    copies.push_back(
        cuda_strided(f->dtype(), {n}, {1}, 0, n, f->device(), false, options.allocator, stream));
  }
  for (const auto& [node, words_of_results] : c.rebinding.node_words) {
    const GraphKernelNode& k = c.graph.contents.kernels[node];
    std::vector<uint64_t> words = k.words;
    for (auto [w, f] : words_of_results) {
      const auto at = static_cast<size_t>(f);
      words[static_cast<size_t>(w)] +=
          copies[at]->storage->device_data - c.fresh[at]->storage->device_data;
    }
    set_kernel_node_words(c.graph.exec, k, words);
  }
  launch_graph(c.graph.exec, c.device, stream);
  for (size_t f = 0; f < c.fresh.size(); ++f) {
    if (c.rebinding.rebound[f]) continue;
    copy_on_device(copies[f]->storage->device_data, c.fresh[f]->storage->device_data,
                   storage_bytes(*c.fresh[f]), c.device, stream);
  }
  c.done->record(stream);
  c.last_stream = stream;
  c.launched = true;
  std::vector<RtValue> results;
  for (const Captured::Result& r : c.results) {
    switch (r.kind) {
      case Captured::Result::Kind::kArgument:
        results.push_back(args.at(static_cast<size_t>(r.index)));
        break;
      case Captured::Result::Kind::kArgumentView:
        results.emplace_back(
            make_view(std::get<TensorHandle>(args.at(static_cast<size_t>(r.index))), r.sizes,
                      r.strides, r.offset));
        break;
      case Captured::Result::Kind::kFresh:
        results.emplace_back(
            make_view(copies.at(static_cast<size_t>(r.index)), r.sizes, r.strides, r.offset));
        break;
    }
  }
  if (options.stats) {
    *options.stats = c.stats;
    options.stats->graph_replays = 1;
    const auto rebound = static_cast<int>(std::ranges::count(c.rebinding.rebound, true));
    options.stats->graph_results_rebound = rebound;
    options.stats->graph_results_copied = static_cast<int>(c.fresh.size()) - rebound;
  }
  return results;
}

}  // namespace kiln::cuda
