// The random program generator's inputs (random_generator.h): dtypes, shapes, buffers, the
// CASES.md alias pairs and random views of a buffer.
#include "support/random_generator.h"

namespace kiln::fuzz::generator {

DType Generator::random_dtype() {
  static const std::vector<DType> dtypes = {DType::kFloat32, DType::kFloat64, DType::kInt64,
                                            DType::kBool, DType::kBFloat16};
  return dtypes[rng_.weighted({70, 8, 10, 5, 7})];
}

Shape Generator::random_shape(int64_t max_rank, int64_t min_size, int64_t max_size) {
  Shape s;
  int64_t rank = rng_.uniform(0, max_rank);
  for (int64_t d = 0; d < rank; ++d)
    s.push_back(rng_.chance(0.2) ? 1 : rng_.uniform(min_size, max_size));
  if (rng_.chance(0.01) && !s.empty()) s[rng_.index(s.size())] = 0;
  return s;
}

size_t Generator::new_buffer(DType dtype, const Shape& shape) {
  BufferRecipe b;
  b.dtype = dtype;
  for (int64_t i = 0; i < shape_numel(shape); ++i)
    b.values.push_back(rng_.value(dtype));
  r_.buffers.push_back(std::move(b));
  buffer_info_.push_back(BufferInfo{shape, {}});
  return r_.buffers.size() - 1;
}

Geometry Generator::random_view(const Shape& shape, std::string* how,
                                std::optional<SliceInfo>* first, bool slice_first) {
  Geometry g = contiguous_geometry(shape);
  int steps = static_cast<int>(rng_.uniform(1, 2));
  for (int k = 0; k < steps; ++k) {
    size_t rank = g.sizes.size();
    size_t choice = rng_.weighted({5, 2, 2, 1, 1, 0.4, 1});
    if (k == 0 && slice_first) choice = 0;
    if (rank == 0) choice = 4;
    switch (choice) {
      case 0: {  // slice with a step
        size_t d = rng_.index(rank);
        int64_t size = g.sizes[d];
        if (size == 0) break;
        // Mostly slices of two or more elements, so that partners can partially overlap.
        bool long_slice = size >= 3 && rng_.chance(0.7);
        int64_t start = rng_.uniform(0, long_slice ? size - 2 : size - 1);
        int64_t end = rng_.uniform(start + (long_slice ? 2 : 1), size);
        int64_t step = rng_.pick(std::vector<int64_t>{1, 1, 2, 3});
        if (k == 0 && first) *first = SliceInfo{d, start, end, step};
        g = slice_of(g, d, start, end, step);
        *how += slice_str(SliceInfo{d, start, end, step}, rank);
        break;
      }
      case 1: {  // select
        if (rank < 2) break;
        size_t d = rng_.index(rank);
        if (g.sizes[d] == 0) break;
        int64_t i = rng_.uniform(0, g.sizes[d] - 1);
        g.offset += i * g.strides[d];
        g.sizes.erase(g.sizes.begin() + static_cast<ptrdiff_t>(d));
        g.strides.erase(g.strides.begin() + static_cast<ptrdiff_t>(d));
        *how += ".select(" + std::to_string(d) + ", " + std::to_string(i) + ")";
        break;
      }
      case 2: {  // transpose
        if (rank < 2) break;
        size_t d0 = rng_.index(rank), d1 = rng_.index(rank);
        if (d0 == d1) d1 = (d0 + 1) % rank;
        std::swap(g.sizes[d0], g.sizes[d1]);
        std::swap(g.strides[d0], g.strides[d1]);
        *how += ".transpose(" + std::to_string(d0) + ", " + std::to_string(d1) + ")";
        break;
      }
      case 3: {  // diagonal of the first two dims
        if (rank < 2) break;
        int64_t len = std::min(g.sizes[0], g.sizes[1]);
        int64_t stride = g.strides[0] + g.strides[1];
        g.sizes.erase(g.sizes.begin(), g.sizes.begin() + 2);
        g.strides.erase(g.strides.begin(), g.strides.begin() + 2);
        g.sizes.push_back(len);
        g.strides.push_back(stride);
        *how += ".diagonal()";
        break;
      }
      case 4: {  // unsqueeze
        size_t d = rng_.index(rank + 1);
        int64_t stride = d < rank ? g.sizes[d] * g.strides[d] : 1;
        g.sizes.insert(g.sizes.begin() + static_cast<ptrdiff_t>(d), 1);
        g.strides.insert(g.strides.begin() + static_cast<ptrdiff_t>(d), stride);
        *how += ".unsqueeze(" + std::to_string(d) + ")";
        break;
      }
      case 5: {  // expand a new leading dim: internal overlap, writes raise
        g.sizes.insert(g.sizes.begin(), 2);
        g.strides.insert(g.strides.begin(), 0);
        *how += ".expand(2, ...)";
        break;
      }
      default:
        *how += "";  // the whole tensor
        break;
    }
  }
  return g;
}

std::optional<Geometry> Generator::random_window(int64_t n, std::string* how) {
  for (int tries = 0; tries < 10; ++tries) {
    Geometry g;
    int64_t rank = rng_.uniform(1, 2);
    int64_t reach = 0;
    for (int64_t d = 0; d < rank; ++d) {
      g.sizes.push_back(rng_.uniform(1, 4));
      g.strides.push_back(rng_.uniform(1, 6));
      reach += (g.sizes.back() - 1) * g.strides.back();
    }
    if (reach >= n) continue;
    g.offset = rng_.uniform(0, n - 1 - reach);
    *how = ".as_strided(" + shape_str(g.sizes) + ", " + shape_str(g.strides) + ", " +
           std::to_string(g.offset) + ")";
    return g;
  }
  return std::nullopt;
}

void Generator::add_input(InputRecipe in, Meta meta) {
  in.handle = static_cast<int>(r_.inputs.size());
  meta.is_input = !in.is_number;
  meta.on_input = !in.is_number;
  meta.is_number = in.is_number;
  meta_[in.handle] = meta;
  if (!in.is_number)
    buffer_info_[static_cast<size_t>(in.buffer)].members.push_back(r_.inputs.size());
  r_.inputs.push_back(std::move(in));
}

void Generator::make_pair() {
  DType dtype = random_dtype();
  Shape shape;
  int64_t rank = rng_.uniform(1, 3);
  for (int64_t d = 0; d < rank; ++d)
    shape.push_back(rng_.uniform(d == 0 ? 3 : 2, 5));
  int buffer = static_cast<int>(new_buffer(dtype, shape));
  std::string buf = "buf" + std::to_string(buffer);
  Geometry whole = contiguous_geometry(shape);
  InputRecipe a, b;
  a.buffer = b.buffer = buffer;
  std::optional<SliceInfo> sa, sb;
  Meta ma, mb;
  auto slice_pair = [&](SliceInfo x, SliceInfo y) {
    a.geometry = slice_of(whole, x.dim, x.start, x.end, x.step);
    b.geometry = slice_of(whole, y.dim, y.start, y.end, y.step);
    a.how = buf + slice_str(x, shape.size());
    b.how = buf + slice_str(y, shape.size());
    sa = x;
    sb = y;
  };
  size_t d = rng_.index(shape.size());
  int64_t size = shape[d];
  switch (rng_.weighted({2, 1, 2, 2, 2, 1, 1, 2, 2, 2})) {
    case 0:  // A1: the same object twice
      a.geometry = b.geometry = whole;
      a.how = buf;
      b.how = buf;
      b.same_object_as = 0;
      ma.fixed = mb.fixed = true;
      break;
    case 1:  // an equal view that is another object
      a.geometry = b.geometry = whole;
      a.how = buf;
      b.how = buf + " again (another object)";
      break;
    case 2: {  // a view with its base, in either order
      std::string how;
      std::optional<SliceInfo> first;
      a.geometry = whole;
      a.how = buf;
      b.geometry = random_view(shape, &how, &first);
      b.how = buf + how;
      sb = first;
      if (rng_.chance(0.5)) {
        std::swap(a, b);
        std::swap(sa, sb);
      }
      break;
    }
    case 3: {  // A2: disjoint slices
      int64_t k = rng_.uniform(1, size - 1);
      slice_pair({d, 0, k, 1}, {d, k, size, 1});
      break;
    }
    case 4:  // interleaved step slices: x[0::2] and x[1::2]
      slice_pair({d, 0, size, 2}, {d, 1, size, 2});
      break;
    case 5:    // two rows
    case 6: {  // two columns
      size_t dim = rng_.chance(0.5) || shape.size() < 2 ? 0 : 1;
      int64_t i = rng_.uniform(0, shape[dim] - 1);
      int64_t j = (i + rng_.uniform(1, shape[dim] - 1)) % shape[dim];
      auto select = [&](int64_t idx) {
        Geometry g = whole;
        g.offset += idx * g.strides[dim];
        g.sizes.erase(g.sizes.begin() + static_cast<ptrdiff_t>(dim));
        g.strides.erase(g.strides.begin() + static_cast<ptrdiff_t>(dim));
        return g;
      };
      a.geometry = select(i);
      b.geometry = select(j);
      a.how = buf + ".select(" + std::to_string(dim) + ", " + std::to_string(i) + ")";
      b.how = buf + ".select(" + std::to_string(dim) + ", " + std::to_string(j) + ")";
      break;
    }
    case 7: {  // overlapping slices: x[s:e] and x[s+1:e+1]
      int64_t s = rng_.uniform(0, size - 3 >= 0 ? size - 3 : 0);
      int64_t e = std::min(size - 1, s + rng_.uniform(2, 3));
      slice_pair({d, s, e, 1}, {d, s + 1, e + 1, 1});
      break;
    }
    case 8: {  // A4: a and its transpose
      a.geometry = b.geometry = whole;
      size_t r = shape.size();
      if (r >= 2) {
        std::swap(b.geometry.sizes[r - 1], b.geometry.sizes[r - 2]);
        std::swap(b.geometry.strides[r - 1], b.geometry.strides[r - 2]);
      }
      a.how = buf;
      b.how = buf + ".mT";
      break;
    }
    default: {  // A3: overlapping as_strided windows
      int64_t n = shape_numel(shape);
      int64_t cols = rng_.uniform(1, 3), rows = rng_.uniform(1, 3);
      int64_t row_stride = rng_.uniform(cols, cols + 3);
      int64_t reach = (rows - 1) * row_stride + cols;
      if (reach >= n) {
        rows = 1;
        cols = std::min<int64_t>(cols, n - 1);
        reach = cols;
      }
      for (InputRecipe* in : {&a, &b}) {
        in->geometry = Geometry{{rows, cols}, {row_stride, 1}, rng_.uniform(0, n - reach)};
        in->how = buf + ".as_strided(" + shape_str(in->geometry.sizes) + ", " +
                  shape_str(in->geometry.strides) + ", " + std::to_string(in->geometry.offset) +
                  ")";
      }
      break;
    }
  }
  add_input(std::move(a), ma);
  slices_.push_back(sa);
  add_input(std::move(b), mb);
  slices_.push_back(sb);
}

void Generator::make_inputs() {
  int64_t n = static_cast<int64_t>(rng_.weighted({25, 40, 20, 15})) + 1;
  bool have_number = false;
  std::vector<std::optional<SliceInfo>>& slices = slices_;
  int64_t i = 0;
  if (n >= 2 && rng_.chance(0.55)) {
    make_pair();
    i = 2;
  }
  for (; i < n; ++i) {
    std::vector<size_t> tensors;
    for (size_t k = 0; k < r_.inputs.size(); ++k)
      if (!r_.inputs[k].is_number) tensors.push_back(k);
    InputRecipe in;
    std::optional<SliceInfo> slice;
    if (i > 0 && !have_number && rng_.chance(0.08)) {
      in.is_number = true;
      in.number = static_cast<double>(rng_.uniform(-20, 20)) / 8.0;
      in.how = "a Python float";
      have_number = true;
      add_input(std::move(in), {});
      slices.push_back(std::nullopt);
      continue;
    }
    if (!tensors.empty() && rng_.chance(0.5)) {
      // Alias an earlier input: the same object, an equal view, the whole buffer, the disjoint
      // or the shifted (overlapping) partner of a slice, a transposed alias, a random view or
      // an as_strided window of its buffer.
      size_t kind = rng_.weighted({15, 8, 14, 14, 12, 8, 20, 8});
      std::vector<size_t> sliced;
      for (size_t k : tensors)
        if (slices[k]) sliced.push_back(k);
      if ((kind == 3 || kind == 4) && sliced.empty()) kind = 6;
      size_t j = (kind == 3 || kind == 4) ? rng_.pick(sliced) : rng_.pick(tensors);
      const InputRecipe& other = r_.inputs[j];
      in.buffer = other.buffer;
      const Shape& base_shape = buffer_info_[static_cast<size_t>(other.buffer)].shape;
      int64_t buffer_numel =
          static_cast<int64_t>(r_.buffers[static_cast<size_t>(other.buffer)].values.size());
      Meta meta;
      switch (kind) {
        case 0:  // the very same object
          in.geometry = other.geometry;
          in.same_object_as = other.handle;
          in.how = other.how;
          meta.fixed = true;
          meta_[other.handle].fixed = true;
          break;
        case 1:  // an equal view that is another object
          in.geometry = other.geometry;
          in.how = other.how + " again (another object)";
          break;
        case 2:  // the whole buffer: a base of the other input
          in.geometry = contiguous_geometry(base_shape);
          in.how = "buf" + std::to_string(other.buffer) + " (the whole buffer)";
          break;
        case 3:
        case 4: {  // disjoint (3) or shifted, overlapping (4) partner of a slice
          const std::optional<SliceInfo>& s = slices[j];
          Geometry whole = contiguous_geometry(base_shape);
          int64_t size = base_shape[s->dim];
          SliceInfo p = *s;
          if (kind == 3) {
            if (s->step > 1 && s->start + 1 < s->end) {
              p.start = s->start + 1;  // interleaved: x[0::2] and x[1::2]
            } else if (s->end < size) {
              p.start = s->end;  // the rows after
              p.end = size;
            } else if (s->start > 0) {
              p.start = 0;
              p.end = s->start;
            }
          } else {
            // Shifted by one step of the slice: they share all but one element (when the slice
            // has two or more).
            if (s->end + s->step <= size) {
              p.start = s->start + s->step;
              p.end = s->end + s->step;
            } else if (s->start >= s->step) {
              p.start = s->start - s->step;
              p.end = s->end - s->step;
            } else {
              p.start = std::min(s->start + s->step, size - 1);
            }
          }
          in.geometry = slice_of(whole, p.dim, p.start, p.end, p.step);
          in.how = "buf" + std::to_string(other.buffer) + slice_str(p, base_shape.size());
          slice = p;
          break;
        }
        case 5: {  // a transposed alias of the other input
          in.geometry = other.geometry;
          size_t rank = in.geometry.sizes.size();
          if (rank >= 2) {
            std::swap(in.geometry.sizes[rank - 1], in.geometry.sizes[rank - 2]);
            std::swap(in.geometry.strides[rank - 1], in.geometry.strides[rank - 2]);
          }
          in.how = other.how + ".mT";
          break;
        }
        case 6: {  // a random view of the same buffer
          std::string how;
          in.geometry = random_view(base_shape, &how, &slice);
          in.how = "buf" + std::to_string(other.buffer) + how;
          break;
        }
        default: {  // an as_strided window of the same buffer
          std::string how;
          auto g = random_window(buffer_numel, &how);
          if (g) {
            in.geometry = *g;
          } else {
            in.geometry = contiguous_geometry(base_shape);
          }
          in.how = "buf" + std::to_string(other.buffer) + how;
          break;
        }
      }
      for (size_t d = 0; d < in.geometry.sizes.size(); ++d)
        meta.overlapping =
            meta.overlapping || (in.geometry.sizes[d] > 1 && in.geometry.strides[d] == 0);
      add_input(std::move(in), meta);
      slices.push_back(slice);
      continue;
    }
    // A new buffer.
    DType dtype = random_dtype();
    Meta meta;
    if (rng_.chance(0.55)) {
      Shape shape = random_shape(3, 1, 4);
      in.buffer = static_cast<int>(new_buffer(dtype, shape));
      in.geometry = contiguous_geometry(shape);
      in.how = "buf" + std::to_string(in.buffer) + " (a fresh tensor)";
    } else {
      Shape shape = random_shape(3, 2, 5);
      if (shape.empty()) shape = {static_cast<int64_t>(rng_.uniform(2, 6))};
      in.buffer = static_cast<int>(new_buffer(dtype, shape));
      std::string how;
      if (rng_.chance(0.15)) {
        auto g = random_window(shape_numel(shape), &how);
        in.geometry = g ? *g : contiguous_geometry(shape);
      } else {
        in.geometry = random_view(shape, &how, &slice, rng_.chance(0.6));
      }
      in.how = "buf" + std::to_string(in.buffer) + how;
    }
    for (size_t d = 0; d < in.geometry.sizes.size(); ++d)
      meta.overlapping =
          meta.overlapping || (in.geometry.sizes[d] > 1 && in.geometry.strides[d] == 0);
    add_input(std::move(in), meta);
    slices.push_back(slice);
  }
  next_id_ = static_cast<int>(r_.inputs.size());
  for (const InputRecipe& in : r_.inputs)
    rep_.add_input(in.handle, letter_name(static_cast<size_t>(in.handle)), input_type(in, r_));
}

}  // namespace kiln::fuzz::generator
