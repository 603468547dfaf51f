// Merged addresses: a CPU pass's or a CUDA row's position over reduced dims, divided into the
// dims' indices, joined back into one linear position where the tensor is contiguous over them,
// under stride conditions the nest specializes on (merge flags). Part of the kernel emitter
// (kernel_emitter.h); strided_address and as_strided (emit_values.cpp) ask for them.
#include "kiln/codegen/kernel_emitter.h"

namespace kiln::codegen::detail {

// The address of a tensor at `at` where a pass's position p over adjacent reduced dims was
// divided into their indices (reduction: q = p / size, r = p % size): where the tensor is
// contiguous over those dims, q * s_d + r * s_(d+1) is p * s_(d+1), one linear position, where
// the divisions made every load of the pass a gather (x.mean((2, 3)) 11x eager's time). `flags`
// gets the names of the stride conditions it holds under (merge_conditions_: the nest takes the
// merged form where they hold, as constants, and folds the other away):
//   mean over (2, 3) of [N, C, 28, 28]: (mg0 ? o0 + i0*s0_0 + i1*s0_1 + rl1*s0_3 : ... rd4*s0_2 +
//   rd2*s0_3), mg0 the condition s0_2 == 28LL * s0_3
std::optional<std::string> KernelEmitter::merged_address(const std::string& base,
                                                         const std::string& strides,
                                                         const Shape& shape, const Index& at,
                                                         std::vector<std::string>& flags) {
  std::optional<std::vector<AddressTerm>> terms = merged_terms(strides, shape, at, flags);
  if (!terms) return std::nullopt;
  IndexExpr address = IndexExpr::var(base);
  for (const AddressTerm& term : *terms)
    address = address + mul(term.index, strides + std::to_string(term.dim));
  return address.text;
}

// merged_address's terms: each an index and the dim whose stride it is multiplied by (the
// remainder's: the last of the dims it indexes, or the first where a pass divided its position
// over them in memory order, the quotient the later dim: memory_order_of_reduced); none where no
// pair of dims merges. Either way q * s_q + r * s_r is p * s_r where s_q == size_r * s_r.
std::optional<std::vector<KernelEmitter::AddressTerm>> KernelEmitter::merged_terms(
    const std::string& strides, const Shape& shape, const Index& at,
    std::vector<std::string>& flags, const Strides* constant) {
  auto stride = [&](size_t d) {
    return constant ? int_literal((*constant)[d]) : strides + std::to_string(d);
  };
  struct Term {
    IndexExpr index;
    size_t first, last;  // the dims it indexes
    size_t at_stride;    // the dim whose stride it is multiplied by
  };
  std::vector<Term> terms;  // (a dim of 1 at index 0 parts no others)
  for (size_t d = 0; d < at.size(); ++d)
    if (shape[d] != 1 || !at[d].is_zero()) terms.push_back({at[d], d, d, d});
  auto positions = [&](const Term& t) {
    int64_t n = 1;
    for (size_t d = t.first; d <= t.last; ++d)
      n *= shape[d];
    return n;
  };
  bool merged = false;
  for (size_t j = 0; j + 1 < terms.size();) {
    // (quotient, remainder): the earlier dim's index the quotient, or the later's
    const Term* q = &terms[j];
    const Term* r = &terms[j + 1];
    auto it = divmods_.find({q->index.text, r->index.text});
    if (it == divmods_.end() || it->second.divisor != positions(*r)) {
      std::swap(q, r);
      it = divmods_.find({q->index.text, r->index.text});
    }
    if (it == divmods_.end() || it->second.divisor != positions(*r)) {
      ++j;
      continue;
    }
    if (constant && (*constant)[q->at_stride] != positions(*r) * (*constant)[r->at_stride]) {
      ++j;
      continue;
    }
    const std::string condition =
        stride(q->at_stride) + " == " + int_literal(positions(*r)) + " * " + stride(r->at_stride);
    // (Between constants it holds, yet it takes a flag: the nest's copy for other strides runs a
    // pass's divided form, where the merged position is not the pass's.)
    if (constant) constant_merge_conditions_.insert(condition);
    auto flag = std::find(merge_conditions_.begin(), merge_conditions_.end(), condition);
    if (flag == merge_conditions_.end()) flag = merge_conditions_.insert(flag, condition);
    flags.push_back("mg" + std::to_string(flag - merge_conditions_.begin()));
    merge_flags_by_dividend_[it->second.dividend].insert(flags.back());
    terms[j] = {IndexExpr::var(it->second.dividend), terms[j].first, terms[j + 1].last,
                r->at_stride};
    terms.erase(terms.begin() + static_cast<std::ptrdiff_t>(j) + 1);
    merged = true;
    if (j > 0) --j;  // the merged position may be the remainder of the dims before
  }
  if (!merged) return std::nullopt;
  std::vector<AddressTerm> out;
  for (const Term& term : terms)
    out.push_back({term.index, term.at_stride});
  return out;
}

// The conditions of merged addresses (merge_conditions_) as a nest specializes on them: all of
// them joined, and the flags' declarations where they hold and where they do not.
//   cond "(s0_2 == 28LL * s0_3)", on "    constexpr bool mg0 = true;\n", off "... = false;\n"
KernelEmitter::MergeFlags KernelEmitter::merge_flags(const std::vector<std::string>& merges) {
  MergeFlags flags;
  std::string on, off;
  for (size_t m = 0; m < merges.size(); ++m) {
    const std::string flag = "mg" + std::to_string(m), sep = m ? ", " : "";
    flags.cond += (m ? " && " : "") + std::string("(") + merges[m] + ")";
    on += sep + flag + " = true";
    off += sep + flag + " = false";
  }
  if (!merges.empty()) {
    flags.on = "    constexpr bool " + on + ";\n";
    flags.off = "    constexpr bool " + off + ";\n";
  }
  return flags;
}

// `alias` is declared as `of`: a divided position's quotient under the reduced dim's name.
void KernelEmitter::note_divmod_alias(const std::string& alias, const std::string& of) {
  std::vector<std::pair<std::pair<std::string, std::string>, Divmod>> aliases;
  for (const auto& [pair, divmod] : divmods_)
    if (pair.first == of) aliases.push_back({{alias, pair.second}, divmod});
  for (auto& [pair, divmod] : aliases)
    divmods_[pair] = divmod;
}

}  // namespace kiln::codegen::detail
