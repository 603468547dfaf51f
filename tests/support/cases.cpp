#include "support/cases.h"

#include "kiln/kiln.h"
#include "support/case_inputs.h"

namespace kiln::test {

namespace {
std::vector<TensorSpec> specs_of(const std::vector<RtValue>& inputs) {
  std::vector<TensorSpec> specs;
  for (const RtValue& v : inputs)
    specs.push_back(spec_of(std::get<TensorHandle>(v)));
  return specs;
}
}  // namespace

void for_each_case(const CaseFn& fn) {
  {  // S1
    std::vector<RtValue> in = {ar({5, 5})};
    fn("S1",
       trace(
           [](Tensor a) {
             a.tanh_();
             return a * a * a * a;
           },
           specs_of(in)),
       in);
  }
  {  // S2
    std::vector<RtValue> in = {ar({2, 3})};
    fn("S2",
       trace(
           [](Tensor x) {
             x.exp_();
             x.sin_();
             return x.cos();
           },
           specs_of(in)),
       in);
  }
  {  // I1
    std::vector<RtValue> in = {ar({4})};
    fn("I1",
       trace(
           [](Tensor x) {
             x.add_(1).sin_().mul_(5);
             return x;
           },
           specs_of(in)),
       in);
  }
  {  // I2
    std::vector<RtValue> in = {ar({4})};
    fn("I2",
       trace(
           [](Tensor x) {
             x.add_(1).sin().mul_(5);
             return x;
           },
           specs_of(in)),
       in);
  }
  {  // I3
    std::vector<RtValue> in = {make_tensor(f32, {3}, {1, 2, 3}), make_tensor(f32, {3}, {4, 5, 6})};
    fn("I3",
       trace(
           [](Tensor a, Tensor b) {
             Tensor c = a + b;
             b.mul_(c);
             return b;
           },
           specs_of(in)),
       in);
  }
  {  // I4
    std::vector<RtValue> in = {make_tensor(f32, {3}, {1, 2, 3})};
    fn("I4", trace([](Tensor a) { a += 1; }, specs_of(in)), in);
  }
  {  // I5
    std::vector<RtValue> in = {make_tensor(bf16, {3}, {1.0, 256.0, -2.0}),
                               make_tensor(f32, {3}, {0.005859375, 1.5, 0.0078125})};
    fn("I5", trace([](Tensor x, Tensor y) { x.add_(y); }, specs_of(in)), in);
  }
  {  // I6
    std::vector<RtValue> in = {make_tensor(f32, {4}, {1, -2, 3, -4}),
                               make_tensor(f32, {4}, {0.5, 1, -4, 5})};
    fn("I6",
       trace(
           [](Tensor h, Tensor r) {
             h.add_(r);
             h.relu_();
             return h * 0.5;
           },
           specs_of(in)),
       in);
  }
  {  // M1
    std::vector<RtValue> in = {make_tensor(f32, {2}, {1, 2}), make_tensor(f32, {2}, {10, 20})};
    fn("M1",
       trace(
           [](Tensor a, Tensor b) {
             Tensor c = a + b;
             c.add_(1);
             return c;
           },
           specs_of(in)),
       in);
  }
  {  // M2
    std::vector<RtValue> in = {make_tensor(f32, {2}, {1, 1}), make_tensor(f32, {2}, {1, 1})};
    fn("M2",
       trace(
           [](Tensor a, Tensor b) {
             Tensor c = a + b;
             c.add_(1);
             Tensor d = c + c;
             d.add_(1);
             c.add_(d);
             return std::make_tuple(c, d);
           },
           specs_of(in)),
       in);
  }
  {  // V1
    std::vector<RtValue> in = {ar({8})};
    fn("V1",
       trace(
           [](Tensor x) {
             Tensor y = x.view({4, 2});
             y.add_(ones({4, 2}));
             Tensor z = x * x;
             return std::make_tuple(y, z);
           },
           specs_of(in)),
       in);
  }
  {  // V2
    std::vector<RtValue> in = {ar({4, 2})};
    fn("V2",
       trace(
           [](Tensor x) {
             Tensor y = x.view({8});
             x.add_(1);
             return y;
           },
           specs_of(in)),
       in);
  }
  {  // V3: a stride-2 view of ones(4)
    TensorHandle base = make_tensor(f32, {4}, {1, 1, 1, 1});
    std::vector<RtValue> in = {make_view(base, {2}, {2}, 0)};
    fn("V3", trace([](Tensor a) { a.add_(1); }, specs_of(in)), in);
  }
  {  // V4
    std::vector<RtValue> in = {ar({4, 2})};
    fn("V4",
       trace(
           [](Tensor x) {
             x.transpose_(1, 0);
             x[0].add_(1);
             return x;
           },
           specs_of(in)),
       in);
  }
  {  // V5
    std::vector<RtValue> in = {make_tensor(f32, {6}, {5, 6, 7, 8, 9, 10})};
    fn("V5",
       trace(
           [](Tensor x) {
             Tensor y = x.view({3, 2});
             y[0].index_put_({0}, 0);
             return x;
           },
           specs_of(in)),
       in);
  }
  // A1: f(x, x), then the same function on two distinct tensors.
  auto a1 = [](Tensor a, Tensor b) {
    Tensor e = a.exp_();
    Tensor h = b.tanh_();
    return std::make_tuple(e + h, a);
  };
  {
    TensorHandle x = make_tensor(f32, {3}, {-0.5, 0, 0.5});
    std::vector<RtValue> in = {x, x};
    fn("A1", trace(a1, specs_of(in)), in);
    std::vector<RtValue> distinct = {make_tensor(f32, {3}, {-0.5, 0, 0.5}),
                                     make_tensor(f32, {3}, {-0.5, 0, 0.5})};
    fn("A1 distinct", trace(a1, specs_of(distinct)), distinct);
  }
  {  // A2: x[0:2] and x[2:4] of ar(4, 4)
    TensorHandle x = ar({4, 4});
    std::vector<RtValue> in = {make_view(x, {2, 4}, {4, 1}, 0), make_view(x, {2, 4}, {4, 1}, 8)};
    fn("A2",
       trace(
           [](Tensor a, Tensor b) {
             a.mul_(3);
             b.mul_(2);
             return a + b;
           },
           specs_of(in)),
       in);
  }
  {  // A3: overlapping as_strided views of ones(64)
    TensorHandle base = make_tensor(f32, {64}, std::vector<double>(64, 1.0));
    std::vector<RtValue> in = {make_view(base, {4, 4}, {9, 1}, 0),
                               make_view(base, {4, 4}, {9, 1}, 24)};
    fn("A3",
       trace(
           [](Tensor a, Tensor b) {
             a.mul_(3);
             b.mul_(2);
             return a.clone().view({-1}) + b.clone().view({-1});
           },
           specs_of(in)),
       in);
  }
  {  // A4: f(a, a.t())
    TensorHandle a = make_tensor(f32, {2, 2}, {1, 2, 3, 4});
    std::vector<RtValue> in = {a, make_view(a, {2, 2}, {1, 2}, 0)};
    fn("A4",
       trace(
           [](Tensor x, Tensor y) {
             Tensor first = x + 1;
             return std::make_tuple(first, y.mul_(2));
           },
           specs_of(in)),
       in);
  }
  {  // H1
    std::vector<RtValue> in = {ar({1, 16})};
    fn("H1",
       trace(
           [](Tensor a) {
             a.index_put_({Slice(), Slice(2, 7)}, a.index({Slice(), Slice(1, 6)}) + 2);
           },
           specs_of(in)),
       in);
  }
  {  // H2
    std::vector<RtValue> in = {ar({2, 3}), ar({2, 1})};
    fn("H2",
       trace(
           [](Tensor w, Tensor x) {
             Tensor out = w + x;
             x.mul_(10);
             return out;
           },
           specs_of(in)),
       in);
  }
  {  // H3: eager raises, so must kiln
    std::vector<RtValue> in = {make_tensor(f32, {4}, {0, 0, 0, 0})};
    fn("H3", trace([](Tensor x) { x.expand({2, 4}).add_(1); }, specs_of(in)), in);
  }
}

}  // namespace kiln::test
