// Tests of the float64 reference, the oracle of every kernel test, and of the Mask policy it shares with the
// kernels. The naive code here reads the visibility rule of DESIGN.md directly and materialises whole score
// matrices, so that neither a wrong Mask nor a wrong reference loop can make both sides agree.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "common/kernel_params.h"
#include "common/mask.h"
#include "reference/reference.h"

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

constexpr long long U = FLASHCUTE_WINDOW_UNBOUNDED;

// DESIGN.md section 1, written out independently of Mask: a side is unbounded only when it is U; any other value,
// negative ones too, is an offset from the diagonal.
bool rule_visible(long long i, long long j, long long sq, long long sk, bool causal, long long left,
                  long long right) {
  if (j < 0 || j >= sk) return false;
  if (causal) right = 0;
  long long const diag = i + sk - sq;
  if (left != U && j < diag - left) return false;
  if (right != U && j > diag + right) return false;
  return true;
}

// A (batch, rows, heads, dim) tensor behind explicit strides. Padding holds NaN, so that a read of anything the
// strides do not describe shows up as NaN in the results, and a write there shows up as a non-NaN.
struct Strided {
  std::vector<double> mem;
  int64_t bs = 0, rs = 0, hs = 0;
  int nb = 0, rows = 0, heads = 0, dim = 0;
  double& at(int b, int64_t r, int h, int d) { return mem[b * bs + r * rs + h * hs + d]; }
  double at(int b, int64_t r, int h, int d) const { return mem[b * bs + r * rs + h * hs + d]; }
};

// head_major: memory ordered (batch, head, row, dim) with a padded row pitch, the layout of a transposed
// (B, H, S, D) tensor that the C API must accept through strides alone.
Strided make_strided(int nb, int rows, int heads, int dim, bool head_major) {
  Strided t;
  t.nb = nb, t.rows = rows, t.heads = heads, t.dim = dim;
  if (head_major) {
    t.rs = dim + 3;
    t.hs = rows * t.rs + 1;
    t.bs = heads * t.hs;
  } else {
    t.hs = dim;
    t.rs = heads * t.hs;
    t.bs = rows * t.rs;
  }
  t.mem.assign(static_cast<size_t>(nb * t.bs + 1), kNaN);
  return t;
}

struct Case {
  explicit Case(std::string n) : name(std::move(n)) {}
  std::string name;
  int B = 1, Sq = 17, Sk = 17, H = 2, Hkv = 2, D = 16, Dv = 16;
  bool causal = false;
  long long left = U, right = U;
  float softcap = 0;
  float scale = 0;  // 0: 1 / sqrt(D)
  bool head_major = false;
  std::vector<int> lens_q, lens_k, used_k;  // lens_q non-empty: varlen, one entry per sequence
  unsigned seed = 1;

  Case& batch(int b) { return B = b, *this; }
  Case& seq(int q, int k) { return Sq = q, Sk = k, *this; }
  Case& heads(int h, int hkv) { return H = h, Hkv = hkv, *this; }
  Case& dims(int d, int dv) { return D = d, Dv = dv, *this; }
  Case& with_causal() { return causal = true, *this; }
  Case& window(long long l, long long r) { return left = l, right = r, *this; }
  Case& cap(float c, float s) { return softcap = c, scale = s, *this; }
  Case& transposed() { return head_major = true, *this; }
  Case& varlen(std::vector<int> q, std::vector<int> k, std::vector<int> used = {}) {
    return lens_q = q, lens_k = k, used_k = used, *this;
  }
  Case& seeded(unsigned s) { return seed = s, *this; }
};

// Names the case in test output instead of a byte dump.
void PrintTo(Case const& c, std::ostream* os) { *os << c.name; }

// The buffers of one problem, filled with fresh random inputs and NaN-poisoned outputs, and the params that
// describe them.
struct Problem {
  Case c;
  bool varlen;
  int nseq;
  std::vector<int32_t> cu_q, cu_k, used;
  std::vector<int> sq, sk, sk_rows;
  Strided q, k, v, out, dout, dq, dk, dv;
  std::vector<double> lse, dlse;
  int64_t lse_bs = 0, lse_hs = 0;

  explicit Problem(Case const& cs) : c(cs), varlen(!cs.lens_q.empty()) {
    nseq = varlen ? static_cast<int>(c.lens_q.size()) : c.B;
    cu_q.assign(1, 0);
    cu_k.assign(1, 0);
    for (int b = 0; b < nseq; ++b) {
      sq.push_back(varlen ? c.lens_q[b] : c.Sq);
      sk_rows.push_back(varlen ? c.lens_k[b] : c.Sk);
      sk.push_back(varlen && !c.used_k.empty() ? c.used_k[b] : sk_rows.back());
      cu_q.push_back(cu_q.back() + sq.back());
      cu_k.push_back(cu_k.back() + sk_rows.back());
    }
    used.assign(c.used_k.begin(), c.used_k.end());
    int const nb = varlen ? 1 : c.B;
    int const rq = varlen ? cu_q.back() : c.Sq;
    int const rk = varlen ? cu_k.back() : c.Sk;
    q = make_strided(nb, rq, c.H, c.D, c.head_major);
    out = dout = make_strided(nb, rq, c.H, c.Dv, c.head_major);
    dq = make_strided(nb, rq, c.H, c.D, c.head_major);
    k = dk = make_strided(nb, rk, c.Hkv, c.D, c.head_major);
    v = dv = make_strided(nb, rk, c.Hkv, c.Dv, c.head_major);
    lse_hs = rq + (c.head_major ? 2 : 0);
    lse_bs = varlen ? 0 : c.H * lse_hs;
    lse.assign(static_cast<size_t>(nb * c.H * lse_hs), kNaN);
    dlse = lse;

    std::mt19937 rng(c.seed);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    for (int b = 0; b < nseq; ++b)
      for (int h = 0; h < c.H; ++h)
        for (int i = 0; i < sq[b]; ++i) {
          for (int e = 0; e < c.D; ++e) q.at(qb(b), qr(b, i), h, e) = u(rng);
          for (int e = 0; e < c.Dv; ++e) dout.at(qb(b), qr(b, i), h, e) = u(rng);
          dlse[lse_index(b, h, i)] = u(rng);
        }
    // Keys past seqused_k stay NaN: the reference must never read them.
    for (int b = 0; b < nseq; ++b)
      for (int h = 0; h < c.Hkv; ++h)
        for (int j = 0; j < sk[b]; ++j) {
          for (int e = 0; e < c.D; ++e) k.at(qb(b), kr(b, j), h, e) = u(rng);
          for (int e = 0; e < c.Dv; ++e) v.at(qb(b), kr(b, j), h, e) = u(rng);
        }
  }

  int qb(int b) const { return varlen ? 0 : b; }
  int64_t qr(int b, int i) const { return varlen ? cu_q[b] + i : i; }
  int64_t kr(int b, int j) const { return varlen ? cu_k[b] + j : j; }
  size_t lse_index(int b, int h, int i) const {
    return static_cast<size_t>(varlen ? h * lse_hs + cu_q[b] + i : b * lse_bs + h * lse_hs + i);
  }
  float scale() const { return c.scale != 0 ? c.scale : static_cast<float>(1.0 / std::sqrt(c.D)); }

  // Varlen ignores batch strides; 0 there turns a misuse into wrong rows (caught) instead of a wild read.
  void set(Strided const& t, int64_t& bs, int64_t& rs, int64_t& hs) const {
    bs = varlen ? 0 : t.bs, rs = t.rs, hs = t.hs;
  }

  flashcute_fwd_params fwd() {
    flashcute_fwd_params p{};
    p.q = q.mem.data(), p.k = k.mem.data(), p.v = v.mem.data(), p.out = out.mem.data(), p.lse = lse.data();
    set(q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
    set(k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
    set(v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
    set(out, p.out_batch_stride, p.out_row_stride, p.out_head_stride);
    p.lse_batch_stride = lse_bs, p.lse_head_stride = lse_hs;
    p.batch = nseq;
    p.seqlen_q = *std::max_element(sq.begin(), sq.end());
    p.seqlen_k = *std::max_element(sk_rows.begin(), sk_rows.end());
    p.nheads = c.H, p.nheads_kv = c.Hkv, p.head_dim = c.D, p.head_dim_v = c.Dv;
    p.dtype = FLASHCUTE_FLOAT64;
    p.softmax_scale = scale(), p.softcap = c.softcap;
    p.causal = c.causal, p.window_left = c.left, p.window_right = c.right;
    if (varlen) {
      p.cu_seqlens_q = cu_q.data(), p.cu_seqlens_k = cu_k.data();
      p.seqused_k = used.empty() ? nullptr : used.data();
    }
    return p;
  }

  flashcute_bwd_params bwd(bool with_dlse) {
    flashcute_bwd_params p{};
    p.fwd = fwd();
    p.dout = dout.mem.data(), p.dlse = with_dlse ? dlse.data() : nullptr;
    p.dq = dq.mem.data(), p.dk = dk.mem.data(), p.dv = dv.mem.data();
    set(dout, p.dout_batch_stride, p.dout_row_stride, p.dout_head_stride);
    set(dq, p.dq_batch_stride, p.dq_row_stride, p.dq_head_stride);
    set(dk, p.dk_batch_stride, p.dk_row_stride, p.dk_head_stride);
    set(dv, p.dv_batch_stride, p.dv_row_stride, p.dv_head_stride);
    return p;
  }

  // Calls every logical element (sequence, row within it, head) of a query-side or key-side tensor.
  template <class F>
  void for_rows(bool keys, bool used_only, F&& f) const {
    for (int b = 0; b < nseq; ++b) {
      int const rows = keys ? (used_only ? sk[b] : sk_rows[b]) : sq[b];
      for (int r = 0; r < rows; ++r)
        for (int h = 0; h < (keys ? c.Hkv : c.H); ++h) f(b, r, h);
    }
  }
};

size_t count_not_nan(std::vector<double> const& m) {
  return static_cast<size_t>(std::count_if(m.begin(), m.end(), [](double x) { return !std::isnan(x); }));
}

// The naive forward: the whole masked score matrix of a (sequence, head), then a textbook softmax per row.
void naive_forward(Problem const& P, Strided& out, std::vector<double>& lse) {
  Case const& c = P.c;
  out = P.out;
  lse = P.lse;
  double const scale = P.scale();
  for (int b = 0; b < P.nseq; ++b)
    for (int h = 0; h < c.H; ++h) {
      int const hk = h / (c.H / c.Hkv), n = P.sq[b], m = P.sk[b];
      std::vector<double> S(static_cast<size_t>(n) * m, -kInf);
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < m; ++j) {
          if (!rule_visible(i, j, n, m, c.causal, c.left, c.right)) continue;
          double x = 0;
          for (int e = 0; e < c.D; ++e) x += P.q.at(P.qb(b), P.qr(b, i), h, e) * P.k.at(P.qb(b), P.kr(b, j), hk, e);
          x *= scale;
          S[i * m + j] = c.softcap > 0 ? c.softcap * std::tanh(x / c.softcap) : x;
        }
      for (int i = 0; i < n; ++i) {
        double mx = -kInf;
        for (int j = 0; j < m; ++j) mx = std::max(mx, S[i * m + j]);
        std::vector<double> p(static_cast<size_t>(m), 0.0);
        double sum = 0;
        for (int j = 0; j < m; ++j) sum += p[j] = mx == -kInf ? 0.0 : std::exp(S[i * m + j] - mx);
        for (int e = 0; e < c.Dv; ++e) {
          double o = 0;
          for (int j = 0; j < m; ++j)
            if (sum > 0) o += p[j] / sum * P.v.at(P.qb(b), P.kr(b, j), hk, e);
          out.at(P.qb(b), P.qr(b, i), h, e) = o;
        }
        lse[P.lse_index(b, h, i)] = sum > 0 ? mx + std::log(sum) : -kInf;
      }
    }
}

void expect_forward_matches_naive(Problem& P) {
  flashcute::reference::forward(P.fwd());
  Strided out;
  std::vector<double> lse;
  naive_forward(P, out, lse);
  double max_err = 0;
  size_t compared = 0;
  P.for_rows(false, false, [&](int b, int i, int h) {
    for (int e = 0; e < P.c.Dv; ++e) {
      double const got = P.out.at(P.qb(b), P.qr(b, i), h, e), want = out.at(P.qb(b), P.qr(b, i), h, e);
      ASSERT_FALSE(std::isnan(got)) << "out b=" << b << " i=" << i << " h=" << h;
      max_err = std::max(max_err, std::abs(got - want) / (1 + std::abs(want)));
      ++compared;
    }
    double const got = P.lse[P.lse_index(b, h, i)], want = lse[P.lse_index(b, h, i)];
    if (want == -kInf) {
      EXPECT_EQ(got, -kInf) << "lse b=" << b << " i=" << i << " h=" << h;
    } else {
      ASSERT_TRUE(std::isfinite(got)) << "lse b=" << b << " i=" << i << " h=" << h;
      max_err = std::max(max_err, std::abs(got - want) / (1 + std::abs(want)));
    }
  });
  EXPECT_LT(max_err, 1e-12);
  EXPECT_EQ(compared, static_cast<size_t>(P.q.rows) * P.q.nb * P.c.H * P.c.Dv);
  // Nothing outside the described elements was written.
  EXPECT_EQ(count_not_nan(P.out.mem), compared);
  EXPECT_EQ(count_not_nan(P.lse), compared / P.c.Dv);
}

// ---------------------------------------------------------------------------------------------------------------
// (a) forward against the naive implementation

class ForwardVsNaive : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardVsNaive, Matches) {
  Problem P(GetParam());
  expect_forward_matches_naive(P);
}

std::vector<Case> forward_cases() {
  return {
      Case("plain_17"),
      Case("plain_batch3").batch(3).seeded(2),
      Case("seqlen_1").seq(1, 1),
      Case("seqlen_113").seq(113, 113).dims(32, 32),
      Case("causal_17").with_causal(),
      Case("causal_113").seq(113, 113).with_causal().seeded(3),
      Case("causal_q1_k17").seq(1, 17).with_causal(),
      Case("causal_q17_k1_masked_rows").seq(17, 1).with_causal(),
      Case("window_left_only").seq(33, 33).window(5, U),
      Case("window_right_only").seq(33, 33).window(U, 3),
      Case("window_both").seq(33, 33).window(4, 2),
      Case("window_zero_zero").seq(19, 23).window(0, 0),
      Case("window_left_causal").seq(33, 33).window(6, U).with_causal(),
      Case("window_huge").seq(17, 29).window(1000000, 1LL << 40),
      Case("window_negative_causal_empty").seq(17, 29).window(-7, U).with_causal(),
      Case("window_negative_right").seq(29, 29).window(9, -5),
      Case("window_negative_left").seq(17, 29).window(-3, 8),
      Case("window_negative_right_unbounded_left").seq(23, 19).window(U, -4),
      Case("window_sq_gt_sk").seq(40, 13).window(3, 2),
      Case("window_sq_lt_sk").seq(13, 40).window(3, 2),
      Case("softcap").cap(1.5f, 1.0f),
      Case("softcap_causal").cap(2.0f, 0.7f).with_causal().seq(29, 29),
      Case("gqa_4to1").heads(8, 2),
      Case("mqa").heads(4, 1).with_causal(),
      Case("dv_gt_d").dims(16, 24),
      Case("dv_lt_d").dims(32, 8),
      Case("sq_lt_sk").seq(17, 113),
      Case("sq_gt_sk").seq(113, 17),
      Case("sq_lt_sk_causal").seq(17, 113).with_causal(),
      Case("sq_gt_sk_causal").seq(113, 17).with_causal(),
      Case("transposed_strides").batch(2).transposed().heads(4, 2).dims(16, 8).with_causal(),
      Case("varlen").varlen({5, 17, 1}, {9, 13, 20}),
      Case("varlen_seqused_k").varlen({5, 17, 1, 8}, {9, 13, 20, 4}, {9, 7, 20, 0}).with_causal(),
      Case("varlen_window_gqa_transposed").varlen({11, 3, 19}, {7, 16, 19}, {6, 16, 12}).window(3, 1).heads(6, 2)
          .dims(8, 12).transposed(),
  };
}

INSTANTIATE_TEST_SUITE_P(Reference, ForwardVsNaive, ::testing::ValuesIn(forward_cases()),
                         [](::testing::TestParamInfo<Case> const& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------------------------
// (b) rows that see no key

TEST(Reference, FullyMaskedRowsAreZeroAndContributeNothing) {
  // Bottom-right aligned causal with Sq > Sk: rows i < Sq - Sk see no key.
  Problem P(Case("masked").seq(13, 5).heads(4, 2).with_causal().seeded(7));
  int const masked = 13 - 5;
  flashcute::reference::forward(P.fwd());
  P.for_rows(false, false, [&](int b, int i, int h) {
    double const lse = P.lse[P.lse_index(b, h, i)];
    if (i < masked) {
      EXPECT_EQ(lse, -kInf);
      for (int e = 0; e < P.c.Dv; ++e) EXPECT_EQ(P.out.at(b, i, h, e), 0.0);
    } else {
      EXPECT_TRUE(std::isfinite(lse));
    }
  });
  flashcute::reference::backward(P.bwd(true));
  Strided const dk = P.dk, dv = P.dv;
  P.for_rows(false, false, [&](int b, int i, int h) {
    for (int e = 0; e < P.c.D; ++e) {
      double const g = P.dq.at(b, i, h, e);
      EXPECT_TRUE(i < masked ? g == 0 : std::isfinite(g)) << "dq row " << i << " = " << g;
    }
  });
  // Changing dout and dlse of the masked rows, even to huge values, must not change dK or dV at all.
  std::mt19937 rng(11);
  std::uniform_real_distribution<double> u(-1e30, 1e30);
  for (int i = 0; i < masked; ++i)
    for (int h = 0; h < P.c.H; ++h) {
      for (int e = 0; e < P.c.Dv; ++e) P.dout.at(0, i, h, e) = u(rng);
      P.dlse[P.lse_index(0, h, i)] = u(rng);
    }
  std::fill(P.dk.mem.begin(), P.dk.mem.end(), kNaN);
  std::fill(P.dv.mem.begin(), P.dv.mem.end(), kNaN);
  flashcute::reference::backward(P.bwd(true));
  P.for_rows(true, false, [&](int b, int j, int h) {
    for (int e = 0; e < P.c.D; ++e) EXPECT_TRUE(std::isfinite(dk.at(b, j, h, e)));
    for (int e = 0; e < P.c.D; ++e) EXPECT_EQ(P.dk.at(b, j, h, e), dk.at(b, j, h, e));
    for (int e = 0; e < P.c.Dv; ++e) EXPECT_EQ(P.dv.at(b, j, h, e), dv.at(b, j, h, e));
  });
}

// ---------------------------------------------------------------------------------------------------------------
// (c) backward against central finite differences of L = sum(out * G) + sum(lse * g)

long double loss(Problem& P, bool with_dlse) {
  flashcute::reference::forward(P.fwd());
  long double L = 0;
  P.for_rows(false, false, [&](int b, int i, int h) {
    for (int e = 0; e < P.c.Dv; ++e)
      L += static_cast<long double>(P.out.at(P.qb(b), P.qr(b, i), h, e)) * P.dout.at(P.qb(b), P.qr(b, i), h, e);
    size_t const li = P.lse_index(b, h, i);
    if (with_dlse && P.lse[li] != -kInf) L += static_cast<long double>(P.lse[li]) * P.dlse[li];
  });
  return L;
}

// Compares the analytic gradient of one input tensor with central differences over all its used elements.
void check_gradient(Problem& P, bool with_dlse, Strided& x, Strided const& grad, bool keys, char const* what) {
  double const h = 1e-5;
  double max_diff = 0, max_grad = 0;
  P.for_rows(keys, true, [&](int b, int r, int hd) {
    int64_t const row = keys ? P.kr(b, r) : P.qr(b, r);
    for (int e = 0; e < x.dim; ++e) {
      double& xi = x.at(P.qb(b), row, hd, e);
      double const saved = xi;
      xi = saved + h;
      long double const up = loss(P, with_dlse);
      xi = saved - h;
      long double const down = loss(P, with_dlse);
      xi = saved;
      double const fd = static_cast<double>((up - down) / (2 * h));
      double const an = grad.at(P.qb(b), row, hd, e);
      max_diff = std::max(max_diff, std::abs(fd - an));
      max_grad = std::max(max_grad, std::abs(an));
    }
  });
  EXPECT_GT(max_grad, 1e-3) << what << ": gradient unexpectedly vanishes";
  EXPECT_LT(max_diff / max_grad, 1e-6) << what << " max |fd - analytic| = " << max_diff;
}

struct BwdCase {
  Case c;
  bool with_dlse;
};

void PrintTo(BwdCase const& c, std::ostream* os) { *os << c.c.name; }

class BackwardVsFiniteDifferences : public ::testing::TestWithParam<BwdCase> {};

TEST_P(BackwardVsFiniteDifferences, Matches) {
  Problem P(GetParam().c);
  bool const with_dlse = GetParam().with_dlse;
  flashcute::reference::forward(P.fwd());
  flashcute::reference::backward(P.bwd(with_dlse));
  Strided const dq = P.dq, dk = P.dk, dv = P.dv;
  // Gradients cover exactly the described elements; keys past seqused_k get exact zeros.
  size_t q_elems = 0, k_elems = 0, v_elems = 0;
  P.for_rows(false, false, [&](int, int, int) { q_elems += P.c.D; });
  P.for_rows(true, false, [&](int b, int j, int h) {
    k_elems += P.c.D, v_elems += P.c.Dv;
    for (int e = 0; e < P.c.D; ++e) {
      ASSERT_FALSE(std::isnan(dk.at(P.qb(b), P.kr(b, j), h, e)));
      if (j >= P.sk[b]) {
        EXPECT_EQ(dk.at(P.qb(b), P.kr(b, j), h, e), 0.0);
      }
    }
    for (int e = 0; e < P.c.Dv; ++e) {
      if (j >= P.sk[b]) {
        EXPECT_EQ(dv.at(P.qb(b), P.kr(b, j), h, e), 0.0);
      }
    }
  });
  EXPECT_EQ(count_not_nan(dq.mem), q_elems);
  EXPECT_EQ(count_not_nan(dk.mem), k_elems);
  EXPECT_EQ(count_not_nan(dv.mem), v_elems);
  check_gradient(P, with_dlse, P.q, dq, false, "dq");
  check_gradient(P, with_dlse, P.k, dk, true, "dk");
  check_gradient(P, with_dlse, P.v, dv, true, "dv");
}

std::vector<BwdCase> backward_cases() {
  auto small = [](std::string name) { return Case(std::move(name)).seq(9, 9).dims(6, 6); };
  return {
      {small("plain_dlse"), true},
      {small("plain_no_dlse").seeded(2), false},
      {small("causal_dlse").with_causal().seeded(3), true},
      {small("causal_sq_gt_sk_dlse").seq(11, 6).with_causal().seeded(4), true},
      {small("causal_sq_lt_sk_no_dlse").seq(5, 10).with_causal().seeded(5), false},
      {small("window_both_dlse").seq(10, 12).window(2, 1).seeded(6), true},
      {small("window_left_causal_no_dlse").window(3, U).with_causal().seeded(7), false},
      {small("window_negative_right_dlse").seq(12, 12).window(6, -2).seeded(12), true},
      {small("softcap_dlse").cap(1.5f, 1.0f).seeded(8), true},
      {small("softcap_causal_no_dlse").cap(1.0f, 0.8f).with_causal().seeded(9), false},
      {small("gqa_4to1_causal_dlse").heads(4, 1).with_causal().seeded(10), true},
      {small("gqa_dv_ne_d_window_dlse").heads(4, 2).dims(5, 7).window(1, 4).seeded(11), true},
      {small("varlen_seqused_transposed_dlse").varlen({4, 7, 3}, {6, 5, 8}, {6, 3, 0}).heads(2, 1).dims(4, 3)
           .with_causal().transposed().seeded(12), true},
  };
}

INSTANTIATE_TEST_SUITE_P(Reference, BackwardVsFiniteDifferences, ::testing::ValuesIn(backward_cases()),
                         [](::testing::TestParamInfo<BwdCase> const& info) { return info.param.c.name; });

// The shape of the kernel tests (seqlen 1013, head_dim 64) must stay cheap enough to use as an oracle, and its
// backward must agree with a directional finite difference along a random direction.
TEST(Reference, LongSequenceForwardAndDirectionalDerivative) {
  Problem P(Case("long").seq(1013, 1013).dims(64, 64).with_causal().window(700, U).seeded(21));
  auto const t0 = std::chrono::steady_clock::now();
  flashcute::reference::forward(P.fwd());
  flashcute::reference::backward(P.bwd(true));
  double const secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("fwd_bwd_seconds", std::to_string(secs));
  Strided const dq = P.dq, dk = P.dk, dv = P.dv;
  std::mt19937 rng(22);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  Strided dir_q = P.q, dir_k = P.k, dir_v = P.v;
  long double slope = 0;
  auto pick = [&](Strided& dir, Strided const& g, bool keys) {
    P.for_rows(keys, true, [&](int b, int r, int h) {
      for (int e = 0; e < dir.dim; ++e) {
        double& d = dir.at(b, r, h, e);
        d = u(rng);
        slope += static_cast<long double>(d) * g.at(b, r, h, e);
      }
    });
  };
  pick(dir_q, dq, false), pick(dir_k, dk, true), pick(dir_v, dv, true);
  Strided const q0 = P.q, k0 = P.k, v0 = P.v;
  auto move = [&](double t) {
    for (size_t n = 0; n < q0.mem.size(); ++n) P.q.mem[n] = q0.mem[n] + t * dir_q.mem[n];
    for (size_t n = 0; n < k0.mem.size(); ++n) P.k.mem[n] = k0.mem[n] + t * dir_k.mem[n];
    for (size_t n = 0; n < v0.mem.size(); ++n) P.v.mem[n] = v0.mem[n] + t * dir_v.mem[n];
  };
  double const h = 1e-5;
  move(h);
  long double const up = loss(P, true);
  move(-h);
  long double const down = loss(P, true);
  double const fd = static_cast<double>((up - down) / (2 * h));
  EXPECT_LT(std::abs(fd - static_cast<double>(slope)), 1e-6 * std::abs(static_cast<double>(slope)))
      << "fd " << fd << " analytic " << static_cast<double>(slope);
  move(0);
  expect_forward_matches_naive(P);
}

// ---------------------------------------------------------------------------------------------------------------
// (d) the Mask policy against brute force

struct MaskConfig {
  int sq, sk;
  bool causal;
  long long left, right;
};

// The bounds a Mask gives for a set of indices must be exact: [begin, end) == [lo, hi] when the set is non-empty,
// and an empty range (begin >= end) when it is empty. Looser bounds would still be correct but waste tiles.
::testing::AssertionResult exact_bounds(int begin, int end, int lo, int hi) {
  bool const ok = hi < 0 ? begin >= end : (begin == lo && end == hi + 1);
  if (ok) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "got [" << begin << ", " << end << "), brute force "
                                       << (hi < 0 ? std::string("empty")
                                                  : "[" + std::to_string(lo) + ", " + std::to_string(hi + 1) + ")");
}

void check_mask(MaskConfig const& cfg) {
  SCOPED_TRACE("sq=" + std::to_string(cfg.sq) + " sk=" + std::to_string(cfg.sk) + " causal=" +
               std::to_string(cfg.causal) + " left=" + std::to_string(cfg.left) + " right=" +
               std::to_string(cfg.right));
  flashcute::Mask const mask = flashcute::Mask::make(cfg.sq, cfg.sk, cfg.causal, cfg.left, cfg.right);
  auto vis = [&](int i, int j) { return rule_visible(i, j, cfg.sq, cfg.sk, cfg.causal, cfg.left, cfg.right); };
  for (int i = 0; i < cfg.sq; ++i) {
    int lo = cfg.sk, hi = -1;
    for (int j = 0; j < cfg.sk; ++j) {
      ASSERT_EQ(mask.visible(i, j), vis(i, j)) << "i=" << i << " j=" << j;
      if (vis(i, j)) lo = std::min(lo, j), hi = std::max(hi, j);
    }
    int const kb = mask.key_begin(i), ke = mask.key_end(i);
    ASSERT_TRUE(kb >= 0 && ke >= 0 && ke <= cfg.sk) << "row " << i << ": [" << kb << ", " << ke << ")";
    ASSERT_TRUE(exact_bounds(kb, ke, lo, hi)) << "row " << i;
    // The tile-level bounds below rely on both ends never decreasing with the row.
    ASSERT_TRUE(i == 0 || (kb >= mask.key_begin(i - 1) && ke >= mask.key_end(i - 1))) << "row " << i;
  }
  // Row blocks: the union of the rows' key sets.
  for (int m0 = 0; m0 < cfg.sq; ++m0)
    for (int m1 = m0 + 1; m1 <= cfg.sq; ++m1) {
      int lo = cfg.sk, hi = -1;
      for (int i = m0; i < m1; ++i)
        for (int j = 0; j < cfg.sk; ++j)
          if (vis(i, j)) lo = std::min(lo, j), hi = std::max(hi, j);
      ASSERT_TRUE(exact_bounds(mask.block_key_begin(m0), mask.block_key_end(m1), lo, hi))
          << "rows [" << m0 << ", " << m1 << ")";
    }
  // Key blocks: the rows that see any key of [n0, n1), the backward's trip count.
  for (int n0 = 0; n0 < cfg.sk; ++n0)
    for (int n1 = n0 + 1; n1 <= cfg.sk; ++n1) {
      int lo = cfg.sq, hi = -1;
      for (int i = 0; i < cfg.sq; ++i)
        for (int j = n0; j < n1; ++j)
          if (vis(i, j)) lo = std::min(lo, i), hi = std::max(hi, i);
      int const b = mask.query_begin(n0), e = mask.query_end(n1);
      ASSERT_TRUE(b >= 0 && e <= cfg.sq) << "keys [" << n0 << ", " << n1 << ")";
      ASSERT_TRUE(exact_bounds(b, e, lo, hi)) << "keys [" << n0 << ", " << n1 << ")";
    }
  // Tiles: fully visible exactly when every element is, and never for tiles reaching past either sequence.
  for (int m0 = 0; m0 < cfg.sq; ++m0)
    for (int m1 = m0 + 1; m1 <= cfg.sq; ++m1)
      for (int n0 = 0; n0 < cfg.sk; ++n0)
        for (int n1 = n0 + 1; n1 <= cfg.sk; ++n1) {
          bool all = true;
          for (int i = m0; i < m1 && all; ++i)
            for (int j = n0; j < n1 && all; ++j) all = vis(i, j);
          ASSERT_EQ(mask.tile_fully_visible(m0, m1, n0, n1), all)
              << "tile [" << m0 << ", " << m1 << ") x [" << n0 << ", " << n1 << ")";
        }
  // Tile ranges: among the tiles [first, last) a kernel visits, exactly those of each width that
  // tile_fully_visible accepts (tiles may reach past either sequence, as a kernel's last tile does); an empty range
  // comes back as lo = hi = first.
  auto check_range = [](int lo, int hi, int first, int last, auto full) {
    if (hi <= lo) return ::testing::AssertionResult(lo == first && hi == first) << "empty range not at first";
    if (lo < first || hi > last) return ::testing::AssertionFailure() << "[" << lo << ", " << hi << ") outside";
    for (int t = first; t < last; ++t)
      if ((t >= lo && t < hi) != full(t)) return ::testing::AssertionFailure() << "tile " << t;
    return ::testing::AssertionSuccess();
  };
  int const windows[][2] = {{0, 64}, {1, 3}, {2, 2}, {0, 1}};
  for (int w = 1; w <= 4; ++w)
    for (auto const& win : windows) {
      int const first = win[0], last = win[1];
      for (int m0 = 0; m0 < cfg.sq; ++m0)
        for (int m1 = m0 + 1; m1 <= cfg.sq + 1; ++m1) {
          int lo, hi;
          mask.full_key_tiles(m0, m1, w, first, last, lo, hi);
          ASSERT_TRUE(check_range(lo, hi, first, last,
                                  [&](int t) { return mask.tile_fully_visible(m0, m1, t * w, (t + 1) * w); }))
              << "rows [" << m0 << ", " << m1 << "), key tiles of width " << w << " in [" << first << ", " << last
              << ")";
        }
      for (int n0 = 0; n0 < cfg.sk; ++n0)
        for (int n1 = n0 + 1; n1 <= cfg.sk + 1; ++n1) {
          int lo, hi;
          mask.full_query_tiles(n0, n1, w, first, last, lo, hi);
          ASSERT_TRUE(check_range(lo, hi, first, last,
                                  [&](int t) { return mask.tile_fully_visible(t * w, (t + 1) * w, n0, n1); }))
              << "keys [" << n0 << ", " << n1 << "), query tiles of height " << w << " in [" << first << ", "
              << last << ")";
        }
    }
  for (int m0 = 0; m0 < cfg.sq; ++m0) {
    ASSERT_FALSE(mask.tile_fully_visible(m0, cfg.sq + 1, 0, std::max(cfg.sk, 1)));
    ASSERT_FALSE(mask.tile_fully_visible(m0, cfg.sq, 0, cfg.sk + 1));
  }
}

TEST(Mask, MatchesBruteForceOnRandomConfigs) {
  std::mt19937 rng(1234);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto side = [&]() -> long long {
    int const kind = pick(0, 9);
    if (kind < 2) return U;                     // unbounded
    if (kind == 3) return -pick(1, 12);         // an offset past the diagonal (negative), often hiding every key
    if (kind == 4) return -(1LL << pick(31, 50));  // more negative than any sequence is long
    if (kind == 2) return 1LL << pick(31, 50);  // wider than any sequence, beyond int range
    return pick(0, 22);                         // includes windows wider than both sequences
  };
  for (int n = 0; n < 1200; ++n) check_mask({pick(1, 9), pick(0, 9), pick(0, 2) == 0, side(), side()});
}

TEST(Mask, HandWorkedExamples) {
  using flashcute::Mask;
  Mask const causal = Mask::make(4, 4, true, U, U);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(causal.key_end(i), i + 1);
  EXPECT_TRUE(causal.is_local());
  // Bottom-right alignment: with 2 queries and 5 keys, the first query already sees keys 0..3.
  Mask const wide_k = Mask::make(2, 5, true, U, U);
  EXPECT_EQ(wide_k.key_end(0), 4);
  EXPECT_EQ(wide_k.key_end(1), 5);
  // With 5 queries and 2 keys, queries 0..2 see nothing.
  Mask const wide_q = Mask::make(5, 2, true, U, U);
  for (int i = 0; i < 3; ++i) EXPECT_GE(wide_q.key_begin(i), wide_q.key_end(i));
  EXPECT_EQ(wide_q.key_end(3), 1);
  EXPECT_EQ(wide_q.query_begin(1), 4);
  // A sliding window of left 2, right 1 on the diagonal.
  Mask const win = Mask::make(6, 6, false, 2, 1);
  EXPECT_EQ(win.key_begin(3), 1);
  EXPECT_EQ(win.key_end(3), 5);
  EXPECT_TRUE(win.tile_fully_visible(2, 4, 2, 4));
  EXPECT_FALSE(win.tile_fully_visible(0, 4, 0, 4));
  EXPECT_FALSE(Mask::make(3, 3, false, 1LL << 40, U).is_local());
  // Negative offsets (FlashAttention-4's convention): right -2 shows keys at least 2 before the diagonal.
  Mask const before = Mask::make(6, 6, false, U, -2);
  EXPECT_EQ(before.key_end(0), 0);  // query 0 sees nothing
  EXPECT_EQ(before.key_end(4), 3);
  EXPECT_TRUE(before.is_local());
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Paged K/V through the C API: the same keys in shuffled pages give the same bits as each sequence's contiguous
// rows (with its seqused_k keys), for page sizes from 1 up; bad tables and the backward are refused by name.

namespace {

struct PagedCase {
  int page_size;
  bool causal;
  long long left;
  float softcap;
  bool sink;
};

void run_paged(PagedCase const& c) {
  int const B = 3, SQ = 4, SK = 37, H = 4, HKV = 2, D = 8;
  std::vector<int32_t> used{37, 0, 20};
  std::mt19937 rng(c.page_size * 7 + (c.causal ? 1 : 0));
  std::normal_distribution<double> nd;
  auto randv = [&](size_t n) {
    std::vector<double> x(n);
    for (auto& e : x) e = nd(rng);
    return x;
  };
  std::vector<double> q = randv((size_t)B * SQ * H * D), k = randv((size_t)B * SK * HKV * D);
  std::vector<double> v = randv(k.size()), sink = randv(H);
  int const per = (SK + c.page_size - 1) / c.page_size, pages = B * per + 2;  // two spare pages
  std::vector<int32_t> perm(pages);
  for (int i = 0; i < pages; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table((size_t)B * (per + 1), -1);  // one unused column per row
  std::vector<double> kp((size_t)pages * c.page_size * HKV * D, kNaN), vp(kp.size(), kNaN);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < SK; ++j) {
      int const page = perm[b * per + j / c.page_size];
      table[(size_t)b * (per + 1) + j / c.page_size] = page;
      for (int e = 0; e < HKV * D; ++e) {
        size_t const dst = ((size_t)page * c.page_size + j % c.page_size) * HKV * D + e;
        kp[dst] = k[((size_t)b * SK + j) * HKV * D + e];
        vp[dst] = v[((size_t)b * SK + j) * HKV * D + e];
      }
    }
  std::vector<double> out(q.size(), kNaN), lse((size_t)B * H * SQ, kNaN);
  flashcute_fwd_params p;
  flashcute_fwd_params_init(&p);
  p.dtype = FLASHCUTE_FLOAT64, p.batch = B, p.seqlen_q = SQ, p.seqlen_k = SK, p.nheads = H, p.nheads_kv = HKV;
  p.head_dim = p.head_dim_v = D, p.softmax_scale = 0.35f, p.softcap = c.softcap, p.causal = c.causal;
  p.window_left = c.left;
  flashcute_fwd_params_set_contiguous_strides(&p);
  p.k_batch_stride = p.v_batch_stride = (int64_t)c.page_size * HKV * D;  // page stride
  p.q = q.data(), p.k = kp.data(), p.v = vp.data(), p.out = out.data(), p.lse = lse.data();
  p.page_table = table.data(), p.page_table_batch_stride = per + 1, p.page_size = c.page_size;
  p.num_pages = pages, p.seqused_k = used.data();
  if (c.sink) p.learnable_sink = sink.data();
  ASSERT_EQ(flashcute_reference_fwd(&p), FLASHCUTE_SUCCESS) << flashcute_last_error();

  for (int b = 0; b < B; ++b) {  // each sequence alone, its used keys contiguous
    std::vector<double> o1((size_t)SQ * H * D, kNaN), l1((size_t)H * SQ, kNaN);
    flashcute_fwd_params s = p;
    s.batch = 1, s.seqlen_k = used[b], s.page_table = nullptr, s.seqused_k = nullptr;
    flashcute_fwd_params_set_contiguous_strides(&s);
    s.q = q.data() + (size_t)b * SQ * H * D, s.k = k.data() + (size_t)b * SK * HKV * D;
    s.v = v.data() + (size_t)b * SK * HKV * D, s.out = o1.data(), s.lse = l1.data();
    ASSERT_EQ(flashcute_reference_fwd(&s), FLASHCUTE_SUCCESS) << flashcute_last_error();
    for (size_t i = 0; i < o1.size(); ++i) ASSERT_EQ(out[(size_t)b * SQ * H * D + i], o1[i]) << "out, b " << b;
    for (size_t i = 0; i < l1.size(); ++i) ASSERT_EQ(lse[(size_t)b * H * SQ + i], l1[i]) << "lse, b " << b;
  }

  // Refused by name: a page outside num_pages among the used ones, seqused_k past seqlen_k, the backward.
  flashcute_fwd_params e = p;
  std::vector<int32_t> bad_table = table;
  bad_table[0] = pages;
  e.page_table = bad_table.data();
  EXPECT_EQ(flashcute_reference_fwd(&e), FLASHCUTE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcute_last_error()).find("page_table[0, 0]"), std::string::npos)
      << flashcute_last_error();
  std::vector<int32_t> long_used{38, 0, 0};
  e = p, e.seqused_k = long_used.data();
  EXPECT_EQ(flashcute_reference_fwd(&e), FLASHCUTE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcute_last_error()).find("seqused_k"), std::string::npos) << flashcute_last_error();
  flashcute_bwd_params bp;
  flashcute_bwd_params_init(&bp);
  bp.fwd = p;
  EXPECT_EQ(flashcute_reference_bwd(&bp), FLASHCUTE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcute_last_error()).find("page_table"), std::string::npos) << flashcute_last_error();
}

}  // namespace

TEST(Reference, PagedKvMatchesContiguousBits) {
  for (PagedCase const& c : {PagedCase{1, false, U, 0.f, false}, PagedCase{5, true, U, 0.f, true},
                             PagedCase{16, false, 9, 3.f, false}, PagedCase{64, true, 3, 0.f, true}})
    run_paged(c);
}

TEST(Reference, PagedKvArgumentsAreChecked) {
  std::vector<double> x(64, 0.5), o(64), l(8);
  std::vector<int32_t> table{0, 1};
  flashcute_fwd_params p;
  flashcute_fwd_params_init(&p);
  p.dtype = FLASHCUTE_FLOAT64, p.batch = 2, p.seqlen_q = 1, p.seqlen_k = 4, p.nheads = p.nheads_kv = 1;
  p.head_dim = p.head_dim_v = 8, p.softmax_scale = 0.5f;
  flashcute_fwd_params_set_contiguous_strides(&p);
  p.q = x.data(), p.k = x.data(), p.v = x.data(), p.out = o.data(), p.lse = l.data();
  p.page_table = table.data(), p.page_table_batch_stride = 1, p.page_size = 4, p.num_pages = 2;
  p.k_batch_stride = p.v_batch_stride = 32;
  EXPECT_EQ(flashcute_reference_fwd(&p), FLASHCUTE_SUCCESS) << flashcute_last_error();
  struct {
    char const* name;
    void (*spoil)(flashcute_fwd_params&);
  } const cases[] = {
      {"page_size", [](flashcute_fwd_params& f) { f.page_size = 0; }},
      {"num_pages", [](flashcute_fwd_params& f) { f.num_pages = 0; }},
      {"page_table_batch_stride", [](flashcute_fwd_params& f) { f.page_size = 2; }},
      {"num_splits", [](flashcute_fwd_params& f) { f.num_splits = 257; }},
      {"packed_gqa", [](flashcute_fwd_params& f) { f.packed_gqa = -1; }},
      {"packed_gqa", [](flashcute_fwd_params& f) { f.packed_gqa = 2; }},  // seqlen_q = 1 is no multiple of 2
      {"fixed-length", [](flashcute_fwd_params& f) {
         static int32_t const cu[3] = {0, 1, 2};
         f.cu_seqlens_q = cu, f.cu_seqlens_k = cu, f.total_q = 2, f.total_k = 2;
       }},
  };
  for (auto const& c : cases) {
    flashcute_fwd_params e = p;
    c.spoil(e);
    EXPECT_EQ(flashcute_reference_fwd(&e), FLASHCUTE_ERROR_INVALID_ARGUMENT) << c.name;
    EXPECT_NE(std::string(flashcute_last_error()).find(c.name), std::string::npos) << flashcute_last_error();
  }
  // Split-KV is the forward's: the reference computes the same attention unsplit, the backward refuses it by name.
  flashcute_fwd_params s = p;
  s.page_table = nullptr, s.num_splits = 3;
  flashcute_fwd_params_set_contiguous_strides(&s);
  EXPECT_EQ(flashcute_reference_fwd(&s), FLASHCUTE_SUCCESS) << flashcute_last_error();
  flashcute_bwd_params bp;
  flashcute_bwd_params_init(&bp);
  bp.fwd = s;
  EXPECT_EQ(flashcute_reference_bwd(&bp), FLASHCUTE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcute_last_error()).find("num_splits"), std::string::npos) << flashcute_last_error();
  bp.fwd = p;
  bp.fwd.page_table = nullptr, bp.fwd.packed_gqa = 1;
  flashcute_fwd_params_set_contiguous_strides(&bp.fwd);
  bp.fwd.seqlen_q = 2, bp.fwd.packed_gqa = 2;
  EXPECT_EQ(flashcute_reference_bwd(&bp), FLASHCUTE_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(flashcute_last_error()).find("packed_gqa"), std::string::npos) << flashcute_last_error();
}

// The kernels divide page slots and tile indices with a multiply-high (common/kernel_params.h, IntDivisor): the
// same quotients as division, for divisors from 1 to 2^31 - 1 and dividends up to 2^31 - 1, multiples of the
// divisor and their neighbours included.
TEST(IntDivisor, MatchesDivision) {
  std::mt19937 rng(5);
  std::vector<int> sizes{1, 2, 3, 5, 7, 16, 17, 22, 64, 96, 100, 192, 255, 256, 1000, 4096, 65535, 65536, 65537,
                         1000003, 1 << 20, (1 << 30) + 1, (1 << 30) + 7, 2147483647};
  for (int i = 0; i < 200; ++i) sizes.push_back(1 + (int)(rng() % 100000));
  for (int d : sizes) {
    flashcute::IntDivisor const v = flashcute::IntDivisor::make(d);
    std::vector<uint32_t> rows{0, 1, (uint32_t)d - 1, (uint32_t)d, (uint32_t)d + 1, 2147483647u};
    for (uint64_t q : {2, 3, 1000})
      for (uint64_t j = q * d - 1; j <= q * d + 1; ++j)
        if (j < 2147483648u) rows.push_back((uint32_t)j);
    for (int k = 0; k < 300; ++k) rows.push_back(rng() % 2147483648u);
    for (uint32_t j : rows) ASSERT_EQ((uint32_t)v.div((int)j), j / (uint32_t)d) << "divisor " << d << ", j " << j;
  }
}
