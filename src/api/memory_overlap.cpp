#include "api/memory_overlap.h"

#include <algorithm>

namespace tileattn {

namespace {

// One stride of the difference X = addr_a(i) - addr_b(j) - (base_a - base_b): the coefficient of
// `stride` runs over [lo, hi] (a's index adds, b's subtracts; equal strides of a and b merge).
struct Term {
  int64_t stride;
  int64_t lo, hi;
};

constexpr int kMaxTerms = 2 * MemoryView::kMaxDims;

// A search of thousands of steps means strides that neither nest nor repeat; 2^16 bounds the
// host time of a call at ~0.1 ms for such a view; nested ones take a few steps a term.
constexpr int64_t kSearchBudget = int64_t{1} << 16;

int64_t floor_div(int64_t n, int64_t d) {  // d > 0
  return n >= 0 ? n / d : -((-n + d - 1) / d);
}

void add_term(Term* terms, int& n, int64_t stride, int64_t lo, int64_t hi) {
  if (stride == 0 || lo == hi) return;
  for (int t = 0; t < n; ++t) {
    if (terms[t].stride == stride) {
      terms[t].lo += lo, terms[t].hi += hi;
      return;
    }
  }
  terms[n++] = {stride, lo, hi};
}

struct Search {
  const Term* terms = nullptr;
  int n = 0;
  int64_t rest_min[kMaxTerms + 1] = {}, rest_max[kMaxTerms + 1] = {};  // sum over terms t..n-1
  int64_t budget = kSearchBudget;

  // Is there a choice of coefficients for terms t.. whose sum lies in the open interval (low, high)?
  // Largest stride first: once a term is fixed, the terms after it reach only
  // [rest_min, rest_max], which leaves a few coefficients for it when the strides nest.
  bool reaches(int t, int64_t low, int64_t high) {
    if (t == n) return low < 0 && 0 < high;
    const Term& term = terms[t];
    const int64_t first = std::max(term.lo, floor_div(low - rest_max[t + 1], term.stride) + 1);
    const int64_t last = std::min(term.hi, floor_div(high - rest_min[t + 1] - 1, term.stride));
    for (int64_t c = first; c <= last; ++c) {
      if (--budget < 0) return true;
      if (reaches(t + 1, low - c * term.stride, high - c * term.stride)) return true;
    }
    return false;
  }
};

}  // namespace

bool views_share_bytes(const MemoryView& a, const MemoryView& b) {
  if (a.empty() || b.empty()) return false;
  const int64_t delta = static_cast<int64_t>(b.base - a.base);
  if (delta >= a.extent() || -delta >= b.extent()) return false;

  // Bytes meet when [a.base + i.s, + a.inner) and [b.base + j.t, + b.inner) intersect, that is
  // when X = i.s - j.t lies in (delta - a.inner, delta + b.inner).
  Term terms[kMaxTerms];
  int n = 0;
  for (int d = 0; d < a.num_dims; ++d) add_term(terms, n, a.dims[d].stride, 0, a.dims[d].size - 1);
  for (int d = 0; d < b.num_dims; ++d) add_term(terms, n, b.dims[d].stride, -(b.dims[d].size - 1), 0);
  // Largest stride first; an insertion sort of at most 8 terms (GCC 12 warns on std::sort's
  // 16-element threshold over an 8-element array).
  for (int t = 1; t < n; ++t) {
    for (int u = t; u > 0 && terms[u - 1].stride < terms[u].stride; --u) std::swap(terms[u - 1], terms[u]);
  }

  Search search;
  search.terms = terms;
  search.n = n;
  search.rest_min[n] = search.rest_max[n] = 0;
  for (int t = n - 1; t >= 0; --t) {
    search.rest_min[t] = search.rest_min[t + 1] + terms[t].lo * terms[t].stride;
    search.rest_max[t] = search.rest_max[t + 1] + terms[t].hi * terms[t].stride;
  }
  return search.reaches(0, delta - a.inner_bytes, delta + b.inner_bytes);
}

}  // namespace tileattn
