// Launches of a multi-tensor kernel (codegen::MultiTensorKernel, CUDA): the members' addresses,
// numbers and sizes in argument blocks of at most members_per_launch members each.
#include <algorithm>
#include <cstring>

#include "kiln/runtime/cuda/cuda_kernels.h"
#include "kiln/runtime/interpreter/env.h"
#include "kiln/support/call_profile.h"
#include "kiln/support/error.h"

namespace kiln::cuda {

namespace {

constexpr unsigned kBlock = 256;  // the emitter's __launch_bounds__ (kCudaBlock)

uint64_t first_element(const RtTensor& t) {
  KILN_ASSERT(t.storage->on_device()) << "a CUDA multi-tensor kernel's tensor is not on the device";
  return t.storage->device_data + static_cast<uint64_t>(t.offset * dtype_size(t.dtype()));
}

}  // namespace

int run_cuda_multi_tensor(const CudaMultiTensorKernel& k,
                          const std::vector<MultiTensorMember>& members, Stream stream) {
  call_profile::Scope timed(call_profile::Phase::kKernel);
  const codegen::MultiTensorKernel& kernel = k.kernel;
  const codegen::MultiTensorArgsLayout layout = codegen::multi_tensor_args_layout(kernel);
  const auto ni = static_cast<int64_t>(kernel.input_is_tensor.size());
  const auto no = static_cast<int64_t>(kernel.output_dtypes.size());
  const bool numbers =
      std::count(kernel.input_is_tensor.begin(), kernel.input_is_tensor.end(), false) > 0;
  use_device(k.device);
  std::vector<uint64_t> words(static_cast<size_t>(layout.words));
  auto word = [&](int64_t at) -> uint64_t& { return words[static_cast<size_t>(at)]; };
  int launches = 0;
  for (size_t from = 0; from < members.size();
       from += static_cast<size_t>(kernel.members_per_launch)) {
    const size_t count =
        std::min(members.size() - from, static_cast<size_t>(kernel.members_per_launch));
    std::fill(words.begin(), words.end(), 0);
    int64_t blocks = 0;
    for (size_t c = 0; c < count; ++c) {
      const auto m = static_cast<int64_t>(c);
      const std::span<const RtValue> inputs = members[from + c].inputs;
      const std::span<const TensorHandle> outputs = members[from + c].outputs;
      KILN_ASSERT(static_cast<int64_t>(inputs.size()) == ni &&
                  static_cast<int64_t>(outputs.size()) == no && !outputs.empty())
          << "a multi-tensor member with " << inputs.size() << " inputs and " << outputs.size()
          << " outputs";
      const int64_t numel = codegen::multi_tensor_member_numel(kernel, outputs);
      for (int64_t i = 0; i < ni; ++i) {
        const RtValue& in = inputs[static_cast<size_t>(i)];
        if (kernel.input_is_tensor[static_cast<size_t>(i)]) {
          const RtTensor& t = *std::get<TensorHandle>(in);
          const int64_t elements = kernel.input_is_scalar[static_cast<size_t>(i)] ? 1 : numel;
          KILN_ASSERT(dense(t) && t.numel() == elements &&
                      t.dtype() == kernel.input_dtypes[static_cast<size_t>(i)])
              << "a multi-tensor member's input is not dense or not of its size";
          word(layout.ins + m * ni + i) = first_element(t);
        } else if (numbers) {
          const RtScalar& s = std::get<RtScalar>(in);
          const double d = scalar_to_double(s);
          std::memcpy(&word(layout.sd + m * ni + i), &d, 8);
          word(layout.si + m * ni + i) = static_cast<uint64_t>(scalar_to_int(s));
        }
      }
      for (int64_t j = 0; j < no; ++j) {
        const RtTensor& t = *outputs[static_cast<size_t>(j)];
        const int64_t elements = kernel.output_is_scalar[static_cast<size_t>(j)] ? 1 : numel;
        KILN_ASSERT(dense(t) && t.numel() == elements &&
                    t.dtype() == kernel.output_dtypes[static_cast<size_t>(j)])
            << "a multi-tensor member's output buffer is not dense or not of its size";
        word(layout.outs + m * no + j) = first_element(t);
      }
      word(layout.numel + m) = static_cast<uint64_t>(numel);
      word(layout.first_block + m) = static_cast<uint64_t>(blocks);
      blocks += (numel + kernel.block_elements - 1) / kernel.block_elements;
    }
    word(layout.first_block + static_cast<int64_t>(count)) = static_cast<uint64_t>(blocks);
    word(layout.members) = count;
    KILN_ASSERT(blocks < (int64_t{1} << 31)) << "a multi-tensor launch of too many blocks";
    if (blocks == 0) continue;
    launch(k.entry, static_cast<unsigned>(blocks), kBlock, words.data(), words.size() * 8, stream);
    ++launches;
  }
  return launches;
}

}  // namespace kiln::cuda
