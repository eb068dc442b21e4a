// The visibility rule of flashcute, shared by the float64 reference and every kernel.
// Bottom-right aligned: key j is visible to query i iff
//   i + (Sk - Sq) - left <= j <= i + (Sk - Sq) + right, and 0 <= j < Sk,
// with a side equal to kUnbounded (the C API's FLASHCUTE_WINDOW_UNBOUNDED) meaning no bound; any other side is an
// offset, negative ones too (right = -5: keys at least 5 before the diagonal). Causal is right = 0.
#pragma once

#include "common/hostdevice.h"

namespace flashcute {

// Unbounded sides are stored as Sq + Sk, wider than any distance, and sides below -(Sq + Sk) (which hide every key)
// as -(Sq + Sk), so every bound below is branch-free min/max arithmetic (a branch per row in the kernels' masking
// cost registers and spills). Callers keep Sq + Sk < 2^30, which keeps every sum in int range.
struct Mask {
  int seqlen_q = 0;
  int seqlen_k = 0;
  int left = 0;
  int right = 0;

  FLASHCUTE_HD static int imax(int a, int b) { return a > b ? a : b; }
  FLASHCUTE_HD static int imin(int a, int b) { return a < b ? a : b; }

  static constexpr long long kUnbounded = -9223372036854775807LL - 1;  // INT64_MIN

  FLASHCUTE_HD static int side(long long s, long long wide) {
    return (int)((s == kUnbounded || s >= wide) ? wide : (s <= -wide ? -wide : s));
  }

  FLASHCUTE_HD static Mask make(int seqlen_q, int seqlen_k, bool causal, long long left, long long right) {
    Mask m;
    m.seqlen_q = seqlen_q;
    m.seqlen_k = seqlen_k;
    long long const wide = (long long)seqlen_q + (long long)seqlen_k;
    if (causal) right = 0;
    m.left = side(left, wide);
    m.right = side(right, wide);
    // A window narrower than one key (left + right < 0) hides every key from every row: stored as both sides at
    // -(Sq + Sk), so that block ranges come out empty too, not just each row's.
    if (m.left + m.right < 0) m.left = m.right = (int)-wide;
    return m;
  }

  FLASHCUTE_HD bool is_local() const { return imin(left, right) < seqlen_q + seqlen_k; }
  FLASHCUTE_HD int diagonal(int i) const { return i + seqlen_k - seqlen_q; }

  // Visible keys of query row i are [key_begin(i), key_end(i)); empty when key_begin >= key_end.
  FLASHCUTE_HD int key_begin(int i) const { return imax(diagonal(i) - left, 0); }
  FLASHCUTE_HD int key_end(int i) const { return imin(imax(diagonal(i) + right + 1, 0), seqlen_k); }
  FLASHCUTE_HD bool visible(int i, int j) const { return j >= key_begin(i) && j < key_end(i); }

  // Key range that any query in rows [m0, m1) may see (rows clipped to the sequence by the caller).
  FLASHCUTE_HD int block_key_begin(int m0) const { return key_begin(m0); }
  FLASHCUTE_HD int block_key_end(int m1) const { return key_end(m1 - 1); }

  // Query range [query_begin(n0), query_end(n1)) that may see any key in [n0, n1): the backward's trip count.
  FLASHCUTE_HD int query_begin(int n0) const { return imax(n0 - right - (seqlen_k - seqlen_q), 0); }
  FLASHCUTE_HD int query_end(int n1) const { return imin(imax(n1 + left - (seqlen_k - seqlen_q), 0), seqlen_q); }

  // Key tiles [lo, hi) of width w (tile t = keys [t*w, (t+1)*w)) among tiles [first, last) that every row of
  // [m0, m1) sees in full, i.e. where tile_fully_visible holds; an empty range comes back as lo = hi = first.
  // The kernels skip all masking work there.
  FLASHCUTE_HD void full_key_tiles(int m0, int m1, int w, int first, int last, int& lo, int& hi) const {
    lo = imax((key_begin(m1 - 1) + w - 1) / w, first);
    hi = m1 <= seqlen_q ? imin(key_end(m0) / w, last) : lo;
    if (hi <= lo) lo = hi = first;
  }
  // Query tiles [lo, hi) of height h among [first, last) whose every row sees all keys of [n0, n1), likewise: rows
  // from query_begin(n1 - 1) see the last key, rows before query_end(n0 + 1) the first.
  FLASHCUTE_HD void full_query_tiles(int n0, int n1, int h, int first, int last, int& lo, int& hi) const {
    lo = imax((query_begin(n1 - 1) + h - 1) / h, first);
    hi = n1 <= seqlen_k ? imin(query_end(n0 + 1) / h, last) : lo;
    if (hi <= lo) lo = hi = first;
  }

  // True when every (i, j) of the tile rows [m0, m1) x keys [n0, n1) is visible, so no per-element test is needed.
  FLASHCUTE_HD bool tile_fully_visible(int m0, int m1, int n0, int n1) const {
    if (n1 > seqlen_k || m1 > seqlen_q) return false;
    // key_begin and key_end never decrease with i, so the last row bounds the start and the first row the end.
    return n0 >= key_begin(m1 - 1) && n1 <= key_end(m0);
  }
};

}  // namespace flashcute
