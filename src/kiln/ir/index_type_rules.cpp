// The type rules of the index ops (ops.def, "index reads and writes"): shapes and dtypes as
// PyTorch's index_select, index_copy and index_add compute them, and PyTorch's checks of the
// arguments as user errors. The index values themselves are checked where they exist, before a
// kernel runs (executor.cpp).
#include <span>
#include <vector>

#include "kiln/ir/trace.h"
#include "kiln/support/error.h"

namespace kiln {

namespace {

const TensorType& tensor_arg(std::span<const Operand> args, size_t i) {
  return args[i].value()->tensor_type();
}

// The dim an index op addresses (a 0-dim self has one position, as in PyTorch), and the index's
// checks: integers, at most one dim, on self's device.
int64_t index_dim(const OpInfo& op, const TensorType& self, int64_t dim, const TensorType& index) {
  KILN_CHECK(index.dtype == DType::kInt64 || index.dtype == DType::kInt32)
      << op.name << " expects an int64 or int32 index tensor, got " << dtype_name(index.dtype)
      << "; convert the index with .long().";
  KILN_CHECK(index.rank() <= 1) << op.name << " expects an index of at most one dim, got "
                                << index.rank() << " dims; flatten it with .reshape(-1).";
  KILN_CHECK(index.device == self.device)
      << op.name << " expects its index on " << self.device.str() << ", got " << index.device.str()
      << ".";
  return wrap_dim(dim, std::max<int64_t>(self.rank(), 1));
}

}  // namespace

// wrap_index(index, size): the index's type; an integer index and a positive size.
std::vector<TensorType> infer_wrap_index(const OpInfo& op, std::span<const Operand> args) {
  const TensorType& index = tensor_arg(args, 0);
  KILN_CHECK(index.dtype == DType::kInt64 || index.dtype == DType::kInt32)
      << op.name << " expects an int64 or int32 index tensor, got " << dtype_name(index.dtype)
      << ".";
  KILN_CHECK(args[1].as_int() >= 0) << op.name << " expects a size of at least 0.";
  return {index};
}

// index_select(self, dim, index): self's shape with dim replaced by the index's length.
std::vector<TensorType> infer_index_select(const OpInfo& op, std::span<const Operand> args) {
  const TensorType& self = tensor_arg(args, 0);
  const TensorType& index = tensor_arg(args, 2);
  int64_t d = index_dim(op, self, args[1].as_int(), index);
  Shape shape = self.shape;
  if (!shape.empty()) shape[static_cast<size_t>(d)] = index.numel();
  return {TensorType{self.dtype, shape, self.device, std::nullopt}};
}

// gather(self, dim, index): the index's shape, self's dtype; the index has self's rank, and no
// more positions than self along the other dims (PyTorch's checks).
std::vector<TensorType> infer_gather(const OpInfo& op, std::span<const Operand> args) {
  const TensorType& self = tensor_arg(args, 0);
  const TensorType& index = tensor_arg(args, 2);
  KILN_CHECK(index.dtype == DType::kInt64)
      << op.name << " expects an int64 index, got " << dtype_name(index.dtype)
      << "; convert the index with .long().";
  KILN_CHECK(index.rank() == self.rank() || (self.rank() <= 1 && index.rank() <= 1))
      << op.name << ": the index must have self's number of dims (" << self.rank() << "), got "
      << index.rank() << ".";
  KILN_CHECK(index.device == self.device)
      << op.name << " expects its index on " << self.device.str() << ".";
  int64_t d = wrap_dim(args[1].as_int(), std::max<int64_t>(self.rank(), 1));
  for (int64_t k = 0; k < index.rank() && k < self.rank(); ++k)
    KILN_CHECK(k == d || index.shape[static_cast<size_t>(k)] <= self.shape[static_cast<size_t>(k)])
        << op.name << ": the index has " << index.shape[static_cast<size_t>(k)]
        << " positions along dim " << k << ", more than self's "
        << self.shape[static_cast<size_t>(k)] << ".";
  return {TensorType{self.dtype, index.shape, self.device, std::nullopt}};
}

// index_copy / index_add(self, dim, index, source): self's type; source has self's shape with
// dim of the index's length (a 0-dim self takes a 0-dim or one-element source).
std::vector<TensorType> infer_index_write(const OpInfo& op, std::span<const Operand> args) {
  const TensorType& self = tensor_arg(args, 0);
  const TensorType& index = tensor_arg(args, 2);
  const TensorType& source = tensor_arg(args, 3);
  int64_t d = index_dim(op, self, args[1].as_int(), index);
  KILN_CHECK(source.dtype == self.dtype)
      << op.name << " expects source of self's dtype " << dtype_name(self.dtype) << ", got "
      << dtype_name(source.dtype) << "; convert it with .to(self.dtype).";
  Shape expected = self.shape;
  if (!expected.empty()) expected[static_cast<size_t>(d)] = index.numel();
  bool scalar_like = self.rank() == 0 && source.numel() == index.numel() && source.rank() <= 1;
  KILN_CHECK(source.shape == expected || scalar_like)
      << op.name << " expects source of shape " << shape_str(expected) << " (self's shape with dim "
      << d << " of the index's length " << index.numel() << "), got " << shape_str(source.shape)
      << ".";
  return {TensorType{self.dtype, self.shape, self.device, std::nullopt}};
}

// scatter(self, dim, index, src, reduce=, include_self=): self's type; index int64 with self's
// rank, src of self's dtype and rank; the index has no more positions than src along any dim,
// nor than self along the dims other than dim (PyTorch's checks).
std::vector<TensorType> infer_scatter(const OpInfo& op, std::span<const Operand> args) {
  const TensorType& self = tensor_arg(args, 0);
  const TensorType& index = tensor_arg(args, 2);
  const TensorType& src = tensor_arg(args, 3);
  KILN_CHECK(index.dtype == DType::kInt64)
      << op.name << " expects an int64 index, got " << dtype_name(index.dtype)
      << "; convert the index with .long().";
  KILN_CHECK(src.dtype == self.dtype)
      << op.name << " expects src of self's dtype " << dtype_name(self.dtype) << ", got "
      << dtype_name(src.dtype) << "; convert it with .to(self.dtype).";
  KILN_CHECK(index.device == self.device && src.device == self.device)
      << op.name << " expects its index and src on " << self.device.str() << ".";
  bool scalar_like = self.rank() <= 1 && index.rank() <= 1 && src.rank() <= 1;
  KILN_CHECK(scalar_like || (index.rank() == self.rank() && src.rank() == self.rank()))
      << op.name << ": index and src must have self's number of dims (" << self.rank() << "), got "
      << index.rank() << " and " << src.rank() << ".";
  int64_t d = wrap_dim(args[1].as_int(), std::max<int64_t>(self.rank(), 1));
  for (int64_t k = 0; k < index.rank(); ++k) {
    auto at = static_cast<size_t>(k);
    int64_t n = index.shape[at];
    KILN_CHECK(src.rank() == 0 || n <= src.shape[at])
        << op.name << ": the index has " << n << " positions along dim " << k
        << ", more than src's " << src.shape[at] << ".";
    KILN_CHECK(k == d || self.rank() == 0 || n <= self.shape[at])
        << op.name << ": the index has " << n << " positions along dim " << k
        << ", more than self's " << self.shape[at] << ".";
  }
  const Operand& reduce = args[static_cast<size_t>(op.param_index("reduce"))];
  if (!reduce.is_none()) {
    const std::string& r = reduce.as_string();
    KILN_CHECK(r == "sum" || r == "prod" || r == "mean" || r == "amax" || r == "amin")
        << op.name << ": reduce must be one of 'sum', 'prod', 'mean', 'amax', 'amin', got '" << r
        << "'.";
  }
  return {TensorType{self.dtype, self.shape, self.device, std::nullopt}};
}

}  // namespace kiln
