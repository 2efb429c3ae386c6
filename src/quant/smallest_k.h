// A row's k smallest values in order (smallest_first's ranking: the smaller first, equal values by
// index, NaN as +inf), as the CUDA top-k kernel (cuda/smallest_k.cu) takes them: each of `lanes` lanes
// keeps a sorted list of the best `width` of the columns lane, lane + lanes, ...; then k rounds each take
// the first-ranked head among the lanes. Here so that a CPU test holds the kernel's arithmetic to
// smallest_first; no torch or CUDA headers. Internal to src/quant.
#pragma once

#include <math.h>

#include <cstdint>
#include <type_traits>

#include "host_device.h"

namespace lockstep::quant::smallest_k {

constexpr int kMaxK = 32;  // the kernel's lists hold at most this many; larger k keep the sort

// Calls f(std::integral_constant<int, W>) with the list width W a kernel instance keeps for k: the next
// of 1, 4, 8, 16, 32 (a wider list holds a superset of the k best, and its first k are theirs).
template <class F>
void with_list_width(int k, F&& f) {
  if (k <= 1) return f(std::integral_constant<int, 1>{});
  if (k <= 4) return f(std::integral_constant<int, 4>{});
  if (k <= 8) return f(std::integral_constant<int, 8>{});
  if (k <= 16) return f(std::integral_constant<int, 16>{});
  return f(std::integral_constant<int, 32>{});
}

struct Ranked {
  float value;    // NaN already replaced by +inf (ranked())
  int32_t index;  // the column; INT32_MAX for an empty slot, after every column
};

LOCKSTEP_HOST_DEVICE inline Ranked ranked(float value, int32_t index) {
  return {isnan(value) ? INFINITY : value, index};
}
LOCKSTEP_HOST_DEVICE inline Ranked empty_slot() { return {INFINITY, INT32_MAX}; }

LOCKSTEP_HOST_DEVICE inline bool before(const Ranked& a, const Ranked& b) {
  return a.value < b.value || (a.value == b.value && a.index < b.index);
}

// Puts c into list (sorted, W slots) where it ranks, dropping the last; a c after the last changes
// nothing. A fixed sequence of compare-and-swaps, so that a kernel keeps the list in registers.
template <int W>
LOCKSTEP_HOST_DEVICE inline void insert(Ranked (&list)[W], Ranked c) {
  if (!before(c, list[W - 1])) return;
  LOCKSTEP_UNROLL
  for (int i = 0; i < W; ++i) {
    if (before(c, list[i])) {
      const Ranked t = list[i];
      list[i] = c;
      c = t;
    }
  }
}

// Drops a list's head (taken by the merge), an empty slot coming in last.
template <int W>
LOCKSTEP_HOST_DEVICE inline void pop_front(Ranked (&list)[W]) {
  LOCKSTEP_UNROLL
  for (int i = 0; i + 1 < W; ++i) list[i] = list[i + 1];
  list[W - 1] = empty_slot();
}

// The merge's order of two lanes' heads: as before(), then by lane, so that every lane of a warp picks
// the same winner even among empty slots.
LOCKSTEP_HOST_DEVICE inline bool head_before(const Ranked& a, int lane_a, const Ranked& b, int lane_b) {
  return before(a, b) || (!before(b, a) && lane_a < lane_b);
}

// The kernel's algorithm on one row of m values, lane by lane in turn: out[0..k) the k smallest
// columns (k <= m, k <= W, lanes <= 32). For the CPU tests; the kernel runs the lanes at once and finds
// each round's first head by shuffles.
template <int W>
void by_lanes(const float* row, int64_t m, int k, int lanes, int64_t* out) {
  Ranked lists[32][W];
  for (int lane = 0; lane < lanes; ++lane) {
    for (Ranked& slot : lists[lane]) slot = empty_slot();
    for (int64_t j = lane; j < m; j += lanes) insert(lists[lane], ranked(row[j], static_cast<int32_t>(j)));
  }
  for (int r = 0; r < k; ++r) {
    int best = 0;
    for (int lane = 1; lane < lanes; ++lane) {
      if (head_before(lists[lane][0], lane, lists[best][0], best)) best = lane;
    }
    out[r] = lists[best][0].index;
    pop_front(lists[best]);
  }
}

}  // namespace lockstep::quant::smallest_k
