#include "support/cuda_runner.h"

#include <map>

#include "kiln/ir/parser.h"
#include "kiln/ir/printer.h"
#include "kiln/passes/pipeline.h"
#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/executor.h"

namespace kiln::test {

namespace {
void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
}
}  // namespace

// Gives every call of a creation op that takes a device argument (ltorch.zeros(...), ...) an
// explicit device="cpu" where it relies on the default, so that the next step can retarget it.
std::string explicit_devices(const std::string& text) {
  std::string out;
  size_t at = 0;
  while (at < text.size()) {
    size_t call = text.find("ltorch.", at);
    if (call == std::string::npos) break;
    size_t open = text.find('(', call);
    std::string name = text.substr(call + 7, open - call - 7);
    out += text.substr(at, open + 1 - at);
    at = open + 1;
    if (name != "zeros" && name != "ones" && name != "full" && name != "arange") continue;
    int depth = 1;
    size_t close = at;
    for (; close < text.size() && depth > 0; ++close)
      depth += text[close] == '(' ? 1 : text[close] == ')' ? -1 : 0;
    std::string args = text.substr(at, close - 1 - at);
    if (args.find("device=") == std::string::npos) args += ", device=\"cpu\"";
    out += args + ")";
    at = close;
  }
  return out + text.substr(at);
}

Trace on_device(const Trace& trace, Device device) {
  // Through the printed form, which names every tensor's device: in type comments ("cpu f32[2]")
  // and in creation ops' device arguments.
  std::string text = explicit_devices(print_trace(trace));
  replace_all(text, "\"cpu ", "\"" + device.str() + " ");
  replace_all(text, "\"cpu\"", "\"" + device.str() + "\"");
  return parse_trace(text, "<on " + device.str() + ">");
}

fuzz::Runner cuda_runner(int index) {
  return [index](const Trace& trace, const AliasPattern& pattern,
                 const std::vector<RtValue>& inputs) {
    Device device = Device::cuda(index);
    Trace on_gpu = on_device(trace, device);
    std::map<const Storage*, std::shared_ptr<Storage>> storages;  // host -> device
    std::map<const RtTensor*, TensorHandle> objects;              // host -> device
    std::vector<RtValue> args;
    for (const RtValue& v : inputs) {
      const auto* t = std::get_if<TensorHandle>(&v);
      if (!t) {
        args.push_back(v);
        continue;
      }
      auto o = objects.find(t->get());
      if (o == objects.end()) {
        auto s = storages.find((*t)->storage.get());
        if (s == storages.end())
          s = storages.emplace((*t)->storage.get(), cuda::to_device(**t, device)->storage).first;
        auto d = std::make_shared<RtTensor>(**t);
        d->storage = s->second;
        o = objects.emplace(t->get(), d).first;
      }
      args.emplace_back(o->second);
    }
    std::vector<RtValue> outs = execute(compile(on_gpu, pattern), args);
    // Effects on the caller's tensors: storages' contents and objects' metadata.
    for (const auto& [host, dev] : storages) {
      TensorHandle whole = cuda::to_host(RtTensor{dev, {dev->numel()}, {1}, 0});
      const_cast<Storage*>(host)->bytes = whole->storage->bytes;
    }
    std::map<const RtTensor*, TensorHandle> host_object;  // device object -> host object
    for (const RtValue& v : inputs) {
      const auto* t = std::get_if<TensorHandle>(&v);
      if (!t) continue;
      const TensorHandle& d = objects.at(t->get());
      (*t)->sizes = d->sizes;
      (*t)->strides = d->strides;
      (*t)->offset = d->offset;
      host_object[d.get()] = *t;
    }
    std::map<const Storage*, std::shared_ptr<Storage>> host_storage;  // device -> host
    for (const auto& [host, dev] : storages)
      for (const RtValue& v : inputs)
        if (const auto* t = std::get_if<TensorHandle>(&v); t && (*t)->storage.get() == host)
          host_storage[dev.get()] = (*t)->storage;
    std::map<const Storage*, std::shared_ptr<Storage>> fresh;  // device -> host copies
    std::vector<RtValue> results;
    for (const RtValue& v : outs) {
      const auto* t = std::get_if<TensorHandle>(&v);
      if (!t) {
        results.push_back(v);
        continue;
      }
      if (auto o = host_object.find(t->get()); o != host_object.end()) {
        results.emplace_back(o->second);
        continue;
      }
      auto view = std::make_shared<RtTensor>(**t);
      if (auto h = host_storage.find((*t)->storage.get()); h != host_storage.end()) {
        view->storage = h->second;
      } else {
        auto f = fresh.find((*t)->storage.get());
        if (f == fresh.end())
          f = fresh.emplace((*t)->storage.get(), cuda::to_host(**t)->storage).first;
        view->storage = f->second;
      }
      results.emplace_back(view);
    }
    return results;
  };
}

}  // namespace kiln::test
