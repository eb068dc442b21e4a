// The float64 reference. It is deliberately the plainest correct algorithm: a row at a time, the full softmax
// of that row (no online rescaling, no tiles). The only thing it shares with the
// kernels is the Mask policy, so that "visible" means the same everywhere; everything else is independent, which
// is what makes it useful as an oracle.
#include "reference/reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/mask.h"

namespace flashcute::reference {
namespace {

// Per-row sums (softmax denominator, D_i) use 80-bit long double on x86, where they cost nothing. The per-pair
// work (score dot products, dQ/dK/dV/O updates) stays in double: with 80-bit it took 3.0 s instead of 0.7 s for
// B=1, S=1013, H=2, D=64 forward + backward, and its rounding (~1e-15 relative) is far below anything a kernel
// test can resolve.
using Acc = long double;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Where one sequence lives. Varlen packs all sequences along the row dimension and ignores batch strides, so the
// batch index is 0 there and the sequence is found by its first row instead.
struct Sequence {
  int64_t batch = 0;   // multiplies the batch strides
  int64_t q_row0 = 0;  // first row of the sequence in q/out/dout/dq
  int64_t k_row0 = 0;  // first row of the sequence in k/v/dk/dv
  int sq = 0;          // query rows (seqused_q when given; the rows past it are left alone)
  int sk = 0;          // keys that take part (seqused_k when given)
  int sk_rows = 0;     // key rows the sequence owns; rows in [sk, sk_rows) get zero gradients
  int64_t lse0 = 0;    // offset of element (head 0, row 0) in lse/dlse
};

Sequence sequence(flashcute_fwd_params const& p, int64_t b) {
  Sequence s;
  if (p.cu_seqlens_q == nullptr) {
    s.batch = b;
    s.sq = static_cast<int>(p.seqlen_q);
    s.sk = s.sk_rows = static_cast<int>(p.seqlen_k);
    if (p.seqused_k != nullptr) s.sk = p.seqused_k[b];  // paged K/V: the cache's used rows
    s.lse0 = b * p.lse_batch_stride;
    return s;
  }
  s.q_row0 = p.cu_seqlens_q[b];
  s.k_row0 = p.cu_seqlens_k[b];
  s.sq = p.seqused_q != nullptr ? p.seqused_q[b] : p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
  s.sk_rows = p.cu_seqlens_k[b + 1] - p.cu_seqlens_k[b];
  s.sk = p.seqused_k != nullptr ? p.seqused_k[b] : s.sk_rows;
  // lse is (nheads, total_q) in varlen mode: the packed row index is the column.
  s.lse0 = s.q_row0;
  return s;
}

// A (batch, row, head, dim) tensor seen through its strides; the dim stride is 1.
template <class T>
struct View {
  T* base;
  int64_t batch_stride, row_stride, head_stride;
  T* row(Sequence const& s, int64_t row0, int64_t r, int64_t h) const {
    return base + s.batch * batch_stride + (row0 + r) * row_stride + h * head_stride;
  }
};

// K or V rows of the forward: a View, or with page_table the rows of a paged cache (key j of sequence b is row
// j % page_size of page page_table[b][j / page_size]).
struct KeyRows {
  View<double const> view;
  int32_t const* page_table = nullptr;
  int64_t table_stride = 0, page_size = 1;
  double const* row(Sequence const& s, int64_t j, int64_t h) const {
    if (!page_table) return view.row(s, s.k_row0, j, h);
    int64_t const page = page_table[s.batch * table_stride + j / page_size];
    return view.base + page * view.batch_stride + (j % page_size) * view.row_stride + h * view.head_stride;
  }
};

Acc dot_precise(double const* a, double const* b, int64_t n) {
  Acc sum = 0;
  for (int64_t d = 0; d < n; ++d) sum += static_cast<Acc>(a[d]) * b[d];
  return sum;
}

// The per-pair dot products: four partial sums break the add latency chain, which is what bounds this loop.
double dot(double const* a, double const* b, int64_t n) {
  double part[4] = {0, 0, 0, 0};
  int64_t d = 0;
  for (; d + 4 <= n; d += 4)
    for (int l = 0; l < 4; ++l) part[l] += a[d + l] * b[d + l];
  for (; d < n; ++d) part[0] += a[d] * b[d];
  return (part[0] + part[1]) + (part[2] + part[3]);
}

// The score of one (query, key) pair, with x = scale * q.k and s = c * tanh(x / c) under softcap c. Also returns
// ds/dx = 1 - (s/c)^2 for the backward, computed from tanh itself so that no division by c rounds it.
struct Score {
  double s;
  double ds_dx;
};

Score score(double const* qi, double const* kj, int64_t d, double scale, double cap) {
  double const x = scale * dot(qi, kj, d);
  if (cap > 0) {
    double const t = std::tanh(x / cap);
    return {cap * t, 1.0 - t * t};
  }
  return {x, 1.0};
}

// The rows of a packed GQA call (packed_gqa > 1) are query row i / packed_gqa each: the mask sees those rows.
int packed_rows(flashcute_fwd_params const& p) { return p.packed_gqa > 1 ? static_cast<int>(p.packed_gqa) : 1; }

Mask mask_of(flashcute_fwd_params const& p, Sequence const& s) {
  return Mask::make(s.sq / packed_rows(p), s.sk, p.causal != 0, p.window_left, p.window_right);
}

// Zeroes rows [row0, row0 + rows) of one output, so that keys past seqused_k, queries that see nothing and (varlen)
// rows no sequence owns end with exactly 0 whatever the caller's memory held.
void zero_rows(View<double> const& t, Sequence const& s, int64_t row0, int rows, int64_t heads, int64_t dim) {
  for (int r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      double* x = t.row(s, row0, r, h);
      for (int64_t d = 0; d < dim; ++d) x[d] = 0.0;
    }
}

// Varlen: the packed rows of one side, total_q / total_k (which direct callers of the reference may leave unset:
// then the rows the sequences cover).
int varlen_rows(int64_t total, int32_t const* cu, int64_t batch) {
  return static_cast<int>(std::max<int64_t>(total, cu[batch]));
}

}  // namespace

void forward(flashcute_fwd_params const& p) {
  View<double const> const q{static_cast<double const*>(p.q), p.q_batch_stride, p.q_row_stride, p.q_head_stride};
  KeyRows const k{{static_cast<double const*>(p.k), p.k_batch_stride, p.k_row_stride, p.k_head_stride},
                  p.page_table, p.page_table_batch_stride, p.page_size};
  KeyRows const v{{static_cast<double const*>(p.v), p.v_batch_stride, p.v_row_stride, p.v_head_stride},
                  p.page_table, p.page_table_batch_stride, p.page_size};
  View<double> const out{static_cast<double*>(p.out), p.out_batch_stride, p.out_row_stride, p.out_head_stride};
  double* const lse = static_cast<double*>(p.lse);
  double const* const sink = static_cast<double const*>(p.learnable_sink);
  double const scale = p.softmax_scale;
  double const cap = p.softcap;
  int64_t const group = p.nheads / p.nheads_kv;
  int64_t const d = p.head_dim;
  int64_t const dv = p.head_dim_v;

  // Varlen: rows no sequence owns (past cu_seqlens_q[batch], past a sequence's seqused_q) read out 0, lse -inf.
  if (p.cu_seqlens_q != nullptr) {
    int const rows = varlen_rows(p.total_q, p.cu_seqlens_q, p.batch);
    zero_rows(out, Sequence{}, 0, rows, p.nheads, dv);
    if (lse != nullptr)
      for (int64_t h = 0; h < p.nheads; ++h)
        for (int64_t i = 0; i < rows; ++i) lse[h * p.lse_head_stride + i] = kNegInf;
  }
  std::vector<double> s;
  std::vector<int> keys;
  std::vector<double> o(static_cast<size_t>(dv));
  for (int64_t b = 0; b < p.batch; ++b) {
    Sequence const seq = sequence(p, b);
    Mask const mask = mask_of(p, seq);
    int const rows_per_query = packed_rows(p);
    for (int64_t h = 0; h < p.nheads; ++h) {
      int64_t const hk = h / group;
      for (int i = 0; i < seq.sq; ++i) {
        double const* qi = q.row(seq, seq.q_row0, i, h);
        keys.clear();
        s.clear();
        double m = kNegInf;
        for (int j = 0; j < seq.sk; ++j) {
          if (!mask.visible(i / rows_per_query, j)) continue;
          keys.push_back(j);
          s.push_back(score(qi, k.row(seq, j, hk), d, scale, cap).s);
          if (s.back() > m) m = s.back();
        }
        // The sink joins the denominator as one more logit, with no value row.
        double const sink_h = sink ? sink[h] : kNegInf;
        if (sink_h > m) m = sink_h;
        bool const empty = m == kNegInf;  // no key and no (finite) sink
        // Subtracting the row max before exp keeps every weight in (0, 1]; an empty row never reaches the exp at
        // all, which is how it avoids (-inf) - (-inf).
        Acc l = empty ? 0.0 : std::exp(sink_h - m);
        for (auto& x : o) x = 0;
        for (size_t n = 0; n < keys.size(); ++n) {
          double const w = std::exp(s[n] - m);
          l += w;
          double const* vj = v.row(seq, keys[n], hk);
          for (int64_t e = 0; e < dv; ++e) o[e] += w * vj[e];
        }
        double* oi = out.row(seq, seq.q_row0, i, h);
        for (int64_t e = 0; e < dv; ++e) oi[e] = empty ? 0.0 : static_cast<double>(o[e] / l);
        if (lse != nullptr)
          lse[seq.lse0 + h * p.lse_head_stride + i] = empty ? kNegInf : static_cast<double>(m + std::log(l));
      }
    }
  }
}

void backward(flashcute_bwd_params const& bp) {
  flashcute_fwd_params const& p = bp.fwd;
  View<double const> const q{static_cast<double const*>(p.q), p.q_batch_stride, p.q_row_stride, p.q_head_stride};
  View<double const> const k{static_cast<double const*>(p.k), p.k_batch_stride, p.k_row_stride, p.k_head_stride};
  View<double const> const v{static_cast<double const*>(p.v), p.v_batch_stride, p.v_row_stride, p.v_head_stride};
  View<double const> const out{static_cast<double const*>(p.out), p.out_batch_stride, p.out_row_stride,
                               p.out_head_stride};
  View<double const> const dout{static_cast<double const*>(bp.dout), bp.dout_batch_stride, bp.dout_row_stride,
                                bp.dout_head_stride};
  View<double> const dq{static_cast<double*>(bp.dq), bp.dq_batch_stride, bp.dq_row_stride, bp.dq_head_stride};
  View<double> const dk{static_cast<double*>(bp.dk), bp.dk_batch_stride, bp.dk_row_stride, bp.dk_head_stride};
  View<double> const dv{static_cast<double*>(bp.dv), bp.dv_batch_stride, bp.dv_row_stride, bp.dv_head_stride};
  double const* const lse = static_cast<double const*>(p.lse);
  double const* const dlse = static_cast<double const*>(bp.dlse);
  double const* const sink = static_cast<double const*>(p.learnable_sink);
  // d lse_i / d sink_h = exp(sink_h - lse_i) and d out_i / d sink_h = -exp(sink_h - lse_i) out_i, so the sink's
  // gradient is -sum_i exp(sink_h - lse_i) (dout_i . out_i - dlse_i) over the rows of head h.
  std::vector<Acc> dsink(static_cast<size_t>(p.nheads), 0.0);
  double const scale = p.softmax_scale;
  double const cap = p.softcap;
  int64_t const group = p.nheads / p.nheads_kv;
  int64_t const d = p.head_dim;
  int64_t const d_v = p.head_dim_v;

  if (p.cu_seqlens_q != nullptr) {  // varlen: every row, those no sequence owns included, starts at 0
    int const rows_k = varlen_rows(p.total_k, p.cu_seqlens_k, p.batch);
    zero_rows(dq, Sequence{}, 0, varlen_rows(p.total_q, p.cu_seqlens_q, p.batch), p.nheads, d);
    zero_rows(dk, Sequence{}, 0, rows_k, p.nheads_kv, d);
    zero_rows(dv, Sequence{}, 0, rows_k, p.nheads_kv, d_v);
  }
  for (int64_t b = 0; b < p.batch && p.cu_seqlens_q == nullptr; ++b) {
    Sequence const seq = sequence(p, b);
    zero_rows(dq, seq, seq.q_row0, seq.sq, p.nheads, d);
    zero_rows(dk, seq, seq.k_row0, seq.sk_rows, p.nheads_kv, d);
    zero_rows(dv, seq, seq.k_row0, seq.sk_rows, p.nheads_kv, d_v);
  }

  std::vector<double> dq_acc(static_cast<size_t>(d));
  for (int64_t b = 0; b < p.batch; ++b) {
    Sequence const seq = sequence(p, b);
    Mask const mask = mask_of(p, seq);
    for (int64_t hk = 0; hk < p.nheads_kv; ++hk) {
      // dK and dV of a kv head collect the contributions of every query head in its group before being written.
      std::vector<double> dk_acc(static_cast<size_t>(seq.sk * d), 0);
      std::vector<double> dv_acc(static_cast<size_t>(seq.sk * d_v), 0);
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        for (int i = 0; i < seq.sq; ++i) {
          int64_t const li = seq.lse0 + h * p.lse_head_stride + i;
          double const lse_i = lse[li];
          // P = 0 on a row that saw no key: skipping it is the guard against exp((-inf) - (-inf)).
          if (std::isinf(lse_i) && lse_i < 0) continue;
          double const* qi = q.row(seq, seq.q_row0, i, h);
          double const* doi = dout.row(seq, seq.q_row0, i, h);
          double const di = static_cast<double>(dot_precise(doi, out.row(seq, seq.q_row0, i, h), d_v) -
                                                (dlse != nullptr ? dlse[li] : 0.0));
          if (sink) dsink[h] -= std::exp(sink[h] - lse_i) * di;
          for (auto& x : dq_acc) x = 0;
          for (int j = 0; j < seq.sk; ++j) {
            if (!mask.visible(i, j)) continue;
            double const* kj = k.row(seq, seq.k_row0, j, hk);
            double const* vj = v.row(seq, seq.k_row0, j, hk);
            Score const sc = score(qi, kj, d, scale, cap);
            double const pij = std::exp(sc.s - lse_i);
            double const dx = pij * (dot(doi, vj, d_v) - di) * sc.ds_dx;
            for (int64_t e = 0; e < d; ++e) {
              dq_acc[e] += dx * kj[e];
              dk_acc[j * d + e] += dx * qi[e];
            }
            for (int64_t e = 0; e < d_v; ++e) dv_acc[j * d_v + e] += pij * doi[e];
          }
          double* dqi = dq.row(seq, seq.q_row0, i, h);
          for (int64_t e = 0; e < d; ++e) dqi[e] = scale * dq_acc[e];
        }
      }
      for (int j = 0; j < seq.sk; ++j) {
        double* dkj = dk.row(seq, seq.k_row0, j, hk);
        double* dvj = dv.row(seq, seq.k_row0, j, hk);
        for (int64_t e = 0; e < d; ++e) dkj[e] = scale * dk_acc[j * d + e];
        for (int64_t e = 0; e < d_v; ++e) dvj[e] = dv_acc[j * d_v + e];
      }
    }
  }
  if (sink && bp.dsink)
    for (int64_t h = 0; h < p.nheads; ++h) static_cast<double*>(bp.dsink)[h] = static_cast<double>(dsink[h]);
}

}  // namespace flashcute::reference
