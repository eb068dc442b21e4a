#include "api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "api/status.h"
#include "common/kernel_params.h"

namespace flashcute {

namespace {

constexpr int64_t kMaxInt = 2147483647;
constexpr int64_t kMaxGridYZ = 65535;  // CUDA's limit on gridDim.y and gridDim.z (heads and batch)

flashcute_status_t bad(std::string const& msg) { return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, msg); }

std::string str(int64_t x) { return std::to_string(x); }

int elem_size(flashcute_dtype_t d) { return d == FLASHCUTE_FLOAT64 ? 8 : 2; }

bool varlen_of(flashcute_fwd_params const& p) { return p.cu_seqlens_q != nullptr; }

// Rows of the tensors on each side: the packed totals in varlen mode, the (maximum) sequence lengths otherwise.
int64_t rows_q(flashcute_fwd_params const& p) { return varlen_of(p) ? p.total_q : p.seqlen_q; }
int64_t rows_k(flashcute_fwd_params const& p) { return varlen_of(p) ? p.total_k : p.seqlen_k; }
int64_t batch_dim(flashcute_fwd_params const& p) { return varlen_of(p) ? 1 : p.batch; }
// The (batch, row) dims of k and v: those of the batch, or with page_table num_pages pages of page_size rows.
int64_t kv_blocks(flashcute_fwd_params const& p) { return p.page_table ? p.num_pages : batch_dim(p); }
int64_t kv_rows(flashcute_fwd_params const& p) { return p.page_table ? p.page_size : rows_k(p); }

// A tensor as the kernels address it: up to four (size, stride) dimensions in elements, the last one the
// contiguous head dim (stride 1) for the (batch, row, head, dim) tensors; lse is (batch, head, row).
struct Layout {
  char const* name;
  void const* ptr;
  int64_t elem;
  int64_t size[4];
  int64_t stride[4];

  bool empty() const { return size[0] == 0 || size[1] == 0 || size[2] == 0 || size[3] == 0; }
  // Bytes [lo, hi) that some element occupies (strides are checked non-negative first).
  uintptr_t lo() const { return reinterpret_cast<uintptr_t>(ptr); }
  uintptr_t hi() const {
    int64_t last = 0;
    for (int i = 0; i < 4; ++i) last += (size[i] - 1) * stride[i];
    return lo() + static_cast<uintptr_t>((last + 1) * elem);
  }
};

Layout bshd(char const* name, void const* ptr, int64_t elem, int64_t batch, int64_t rows, int64_t heads, int64_t dim,
            int64_t bs, int64_t rs, int64_t hs) {
  return Layout{name, ptr, elem, {batch, rows, heads, dim}, {bs, rs, hs, 1}};
}

Layout lse_layout(char const* name, void const* ptr, flashcute_fwd_params const& p, int64_t elem) {
  return Layout{name, ptr, elem, {batch_dim(p), p.nheads, rows_q(p), 1}, {p.lse_batch_stride, p.lse_head_stride, 1, 1}};
}

// True when no two elements of t share memory: with its dims sorted by stride, each stride clears everything the
// smaller ones span. Outputs must pass it (a zero or short stride would make CTAs overwrite each other's rows).
bool self_disjoint(Layout const& t) {
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, size) of the dims that have more than one element
  for (int i = 0; i < 4; ++i)
    if (t.size[i] > 1) dims.emplace_back(t.stride[i], t.size[i]);
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // largest offset reached by the dims so far
  for (auto const& [stride, size] : dims) {
    if (stride <= span) return false;
    span += (size - 1) * stride;
  }
  return true;
}

// Disjointness proved modulo a period of `period` bytes: every dim at least that wide steps by whole periods, and
// the narrower ones keep each tensor inside one band of the period. This is what lets q, k and v (or dq, dk, dv)
// be interleaved views of one packed (batch, seqlen, 3, heads, dim) buffer.
bool disjoint_mod(Layout const& a, Layout const& b, int64_t period) {
  int64_t foot[2];
  Layout const* ts[2] = {&a, &b};
  for (int j = 0; j < 2; ++j) {
    Layout const& t = *ts[j];
    foot[j] = t.elem;
    for (int i = 0; i < 4; ++i) {
      if (t.size[i] <= 1) continue;
      int64_t const step = t.stride[i] * t.elem;
      if (step >= period) {
        if (step % period) return false;
      } else {
        foot[j] += (t.size[i] - 1) * step;
      }
    }
    if (foot[j] > period) return false;
  }
  int64_t const ra = static_cast<int64_t>(a.lo() % static_cast<uintptr_t>(period));
  int64_t const rb = static_cast<int64_t>(b.lo() % static_cast<uintptr_t>(period));
  int64_t const ab = ((rb - ra) % period + period) % period;  // where b's band starts, seen from a's
  int64_t const ba = ((ra - rb) % period + period) % period;
  return ab >= foot[0] && ba >= foot[1];
}

bool may_overlap(Layout const& a, Layout const& b) {
  if (a.empty() || b.empty()) return false;
  if (a.hi() <= b.lo() || b.hi() <= a.lo()) return false;
  for (Layout const* t : {&a, &b})
    for (int i = 0; i < 4; ++i) {
      int64_t const period = t->stride[i] * t->elem;
      if (t->size[i] > 1 && period > 0 && disjoint_mod(a, b, period)) return false;
    }
  return true;
}

// Outputs must not share memory with each other or with any input: kernels read inputs while other CTAs write.
flashcute_status_t check_aliasing(std::vector<Layout> const& outputs, std::vector<Layout> const& inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    Layout const& o = outputs[i];
    if (o.empty()) continue;
    if (!self_disjoint(o))
      return bad(std::string(o.name) + " strides make two elements share memory (a zero or too short stride): an "
                 "output needs one address per element");
    for (size_t j = 0; j < i; ++j)
      if (may_overlap(o, outputs[j]))
        return bad(std::string(o.name) + " overlaps " + outputs[j].name + " in memory: outputs must not alias");
    for (auto const& in : inputs)
      if (may_overlap(o, in))
        return bad(std::string(o.name) + " overlaps the input " + in.name +
                   " in memory: outputs must not alias inputs (no in-place attention)");
  }
  return FLASHCUTE_SUCCESS;
}

flashcute_status_t check_tensor(Layout const& t, Target target) {
  std::string const n = t.name;
  if (!t.ptr) return t.empty() ? FLASHCUTE_SUCCESS : bad(n + " is NULL");
  for (int i = 0; i < 3; ++i)
    if (t.stride[i] < 0)
      return bad(n + " strides must be non-negative (got batch " + str(t.stride[0]) + ", row " + str(t.stride[1]) +
                 ", head " + str(t.stride[2]) + ")");
  if (target == Target::kDevice) {
    if (reinterpret_cast<uintptr_t>(t.ptr) & 15u) return bad(n + " must be 16-byte aligned");
    int64_t const vec = 16 / t.elem;
    for (int i = 0; i < 3; ++i)
      if (t.stride[i] % vec)
        return bad(n + " strides must be multiples of " + str(vec) +
                   " elements (16 bytes) so rows stay aligned; the last dimension must be contiguous");
  }
  return FLASHCUTE_SUCCESS;
}

flashcute_status_t check_lse(Layout const& t, Target target) {
  if (!t.ptr) return FLASHCUTE_SUCCESS;  // the caller decides whether lse may be absent
  if (t.stride[0] < 0 || t.stride[1] < 0) return bad(std::string(t.name) + " strides must be non-negative");
  if (target == Target::kDevice && (reinterpret_cast<uintptr_t>(t.ptr) & 3u))
    return bad(std::string(t.name) + " must be 4-byte aligned");
  return FLASHCUTE_SUCCESS;
}

std::vector<Layout> fwd_inputs(flashcute_fwd_params const& p) {
  int64_t const es = elem_size(p.dtype);
  int64_t const b = batch_dim(p), kb = kv_blocks(p), kr = kv_rows(p);
  return {bshd("q", p.q, es, b, rows_q(p), p.nheads, p.head_dim, p.q_batch_stride, p.q_row_stride, p.q_head_stride),
          bshd("k", p.k, es, kb, kr, p.nheads_kv, p.head_dim, p.k_batch_stride, p.k_row_stride, p.k_head_stride),
          bshd("v", p.v, es, kb, kr, p.nheads_kv, p.head_dim_v, p.v_batch_stride, p.v_row_stride,
               p.v_head_stride)};
}

Layout out_layout(flashcute_fwd_params const& p) {
  return bshd("out", p.out, elem_size(p.dtype), batch_dim(p), rows_q(p), p.nheads, p.head_dim_v, p.out_batch_stride,
              p.out_row_stride, p.out_head_stride);
}

int64_t lse_elem(flashcute_fwd_params const& p) { return p.dtype == FLASHCUTE_FLOAT64 ? 8 : 4; }

// Offsets the host can read (the reference): they must describe sequences inside the tensors.
flashcute_status_t check_host_offsets(flashcute_fwd_params const& p) {
  struct Side {
    char const* name;
    int32_t const* cu;
    int64_t total, max_len;
    char const *total_name, *max_name;
  } const sides[] = {{"cu_seqlens_q", p.cu_seqlens_q, p.total_q, p.seqlen_q, "total_q", "seqlen_q"},
                     {"cu_seqlens_k", p.cu_seqlens_k, p.total_k, p.seqlen_k, "total_k", "seqlen_k"}};
  for (auto const& s : sides) {
    for (int64_t b = 0; b <= p.batch; ++b) {
      int64_t const x = s.cu[b];
      if (x < 0 || x > s.total)
        return bad(std::string(s.name) + "[" + str(b) + "] = " + str(x) + " lies outside the " + str(s.total) +
                   " packed rows (" + s.total_name + ")");
      if (b > 0 && x < s.cu[b - 1])
        return bad(std::string(s.name) + " must never decrease (entry " + str(b) + " is " + str(x) + " after " +
                   str(s.cu[b - 1]) + ")");
      if (b > 0 && x - s.cu[b - 1] > s.max_len)
        return bad(std::string(s.name) + ": sequence " + str(b - 1) + " has " + str(x - s.cu[b - 1]) +
                   " rows, more than " + s.max_name + " = " + str(s.max_len));
    }
  }
  for (auto const& [name, used, cu] : {std::tuple{"seqused_k", p.seqused_k, p.cu_seqlens_k},
                                        std::tuple{"seqused_q", p.seqused_q, p.cu_seqlens_q}}) {
    if (!used) continue;
    for (int64_t b = 0; b < p.batch; ++b) {
      int64_t const len = int64_t(cu[b + 1]) - cu[b];
      if (used[b] < 0 || used[b] > len)
        return bad(std::string(name) + "[" + str(b) + "] = " + str(used[b]) + " must lie in [0, " + str(len) +
                   "], the sequence's rows");
    }
  }
  return FLASHCUTE_SUCCESS;
}

// Paged K/V the host can read (the reference): every page a sequence's used keys live in exists.
flashcute_status_t check_host_pages(flashcute_fwd_params const& p) {
  for (int64_t b = 0; b < p.batch; ++b) {
    int64_t const used = p.seqused_k ? p.seqused_k[b] : p.seqlen_k;
    if (used < 0 || used > p.seqlen_k)
      return bad("seqused_k[" + str(b) + "] = " + str(used) + " must lie in [0, seqlen_k = " + str(p.seqlen_k) + "]");
    for (int64_t i = 0; i * p.page_size < used; ++i) {
      int64_t const page = p.page_table[b * p.page_table_batch_stride + i];
      if (page < 0 || page >= p.num_pages)
        return bad("page_table[" + str(b) + ", " + str(i) + "] = " + str(page) + " is not a page of the " +
                   str(p.num_pages) + " (num_pages)");
    }
  }
  return FLASHCUTE_SUCCESS;
}

// A dimension of one element (or none) addresses nothing with its stride.
void ignore(int64_t size, int64_t& stride) {
  if (size <= 1) stride = 0;
}

}  // namespace

flashcute_status_t validate_problem(flashcute_fwd_params const& p, Target target) {
  if (target == Target::kDevice) {
    if (p.dtype != FLASHCUTE_FLOAT16 && p.dtype != FLASHCUTE_BFLOAT16)
      return bad("dtype must be FLASHCUTE_FLOAT16 or FLASHCUTE_BFLOAT16 on the GPU (got " + str((int)p.dtype) + ")");
  } else if (p.dtype != FLASHCUTE_FLOAT64) {
    return bad("dtype must be FLASHCUTE_FLOAT64 for the host reference (got " + str((int)p.dtype) + ")");
  }
  // Empty batches and sequences are valid (nothing to compute, or rows that see no key); heads and head dims are not.
  struct {
    char const* name;
    int64_t value, min;
  } const sizes[] = {{"batch", p.batch, 0},         {"seqlen_q", p.seqlen_q, 0},   {"seqlen_k", p.seqlen_k, 0},
                     {"nheads", p.nheads, 1},       {"nheads_kv", p.nheads_kv, 1}, {"head_dim", p.head_dim, 1},
                     {"head_dim_v", p.head_dim_v, 1}};
  for (auto const& s : sizes) {
    if (s.value < s.min) return bad(std::string(s.name) + " must be >= " + str(s.min) + " (got " + str(s.value) + ")");
    if (s.value > kMaxInt) return bad(std::string(s.name) + " must fit in int32 (got " + str(s.value) + ")");
  }
  // The mask's bounds arithmetic (common/mask.h) stays in int range below this.
  if (p.seqlen_q + p.seqlen_k >= (int64_t(1) << 30))
    return bad("seqlen_q + seqlen_k must be below 2^30 (got " + str(p.seqlen_q + p.seqlen_k) + ")");
  if (p.nheads % p.nheads_kv)
    return bad("nheads (" + str(p.nheads) + ") must be a multiple of nheads_kv (" + str(p.nheads_kv) + ")");
  if (target == Target::kDevice) {
    for (auto const& s : {sizes[5], sizes[6]})
      if (s.value % 8 || s.value > 256)
        return bad(std::string(s.name) + " must be a multiple of 8 and at most 256 on the GPU (got " + str(s.value) +
                   ")");
    if (p.batch > kMaxGridYZ)
      return bad("batch must be at most 65535 on the GPU, the CUDA grid's limit (got " + str(p.batch) +
                 "): split the call");
    if (p.nheads > kMaxGridYZ)
      return bad("nheads must be at most 65535 on the GPU, the CUDA grid's limit (got " + str(p.nheads) + ")");
  }
  // Kernels track the running max of raw scores, which is only the max of scaled scores for a positive scale.
  if (!std::isfinite(p.softmax_scale) || !(p.softmax_scale > 0.f)) return bad("softmax_scale must be finite and > 0");
  if (!(p.softcap >= 0.f) || !std::isfinite(p.softcap)) return bad("softcap must be finite and >= 0");
  if (p.causal != 0 && p.causal != 1) return bad("causal must be 0 or 1 (got " + str(p.causal) + ")");
  if ((p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr))
    return bad("cu_seqlens_q and cu_seqlens_k must be given together");
  if (p.num_splits < 0 || p.num_splits > kMaxSplits)
    return bad("num_splits must be in [0, " + str(kMaxSplits) + "] (got " + str(p.num_splits) + ")");
  if (p.num_splits > 1 && p.batch * p.num_splits > 65535)
    return bad("num_splits x batch must be at most 65535 (got " + str(p.num_splits) + " x " + str(p.batch) + ")");
  if (p.seqused_k && !p.cu_seqlens_q && !p.page_table)
    return bad("seqused_k needs cu_seqlens_q/cu_seqlens_k (varlen mode) or page_table");
  if (p.page_table) {
    if (varlen_of(p)) return bad("page_table takes the fixed-length batch: cu_seqlens_q/cu_seqlens_k must be NULL");
    if (p.page_size < 1 || p.page_size > kMaxInt)
      return bad("page_size must be in [1, 2^31) with page_table (got " + str(p.page_size) + ")");
    int64_t const pages = (p.seqlen_k + p.page_size - 1) / p.page_size;
    if (p.num_pages < (pages > 0 ? 1 : 0) || p.num_pages > kMaxInt)
      return bad("num_pages must be in [1, 2^31) with page_table and keys (got " + str(p.num_pages) + ")");
    if (p.batch > 1 && p.page_table_batch_stride < pages)
      return bad("page_table_batch_stride (" + str(p.page_table_batch_stride) + ") must hold the " + str(pages) +
                 " pages of seqlen_k = " + str(p.seqlen_k) + " keys");
  }
  if (p.seqused_q && !p.cu_seqlens_q) return bad("seqused_q needs cu_seqlens_q/cu_seqlens_k (varlen mode)");
  if (p.packed_gqa < 0 || p.packed_gqa > kMaxInt)
    return bad("packed_gqa must be 0, 1 (none) or the query heads per K/V head (got " + str(p.packed_gqa) + ")");
  if (p.packed_gqa > 1) {
    if (varlen_of(p)) return bad("packed_gqa takes the fixed-length batch: cu_seqlens_q/cu_seqlens_k must be NULL");
    if (p.nheads != p.nheads_kv)
      return bad("packed_gqa: q holds the packed heads, so nheads (" + str(p.nheads) + ") must equal nheads_kv (" +
                 str(p.nheads_kv) + ")");
    if (p.seqlen_q % p.packed_gqa != 0)
      return bad("packed_gqa: seqlen_q (" + str(p.seqlen_q) + ") must be a multiple of packed_gqa (" +
                 str(p.packed_gqa) + ")");
    if (p.learnable_sink) return bad("packed_gqa: not with learnable_sink (one logit per query head)");
  }
  if (p.varlen_status && !p.cu_seqlens_q) return bad("varlen_status needs cu_seqlens_q/cu_seqlens_k (varlen mode)");
  if (varlen_of(p)) {
    for (auto const& [name, total] : {std::pair<char const*, int64_t>{"total_q", p.total_q}, {"total_k", p.total_k}}) {
      if (total < 0)
        return bad(std::string(name) + " must be set in varlen mode: the packed rows of " +
                   (name[6] == 'q' ? "q and out" : "k and v") + " (got " + str(total) + ")");
      if (total > kMaxInt) return bad(std::string(name) + " must fit in int32 (got " + str(total) + ")");
    }
  }
  return FLASHCUTE_SUCCESS;
}

flashcute_fwd_params normalized(flashcute_fwd_params const& in) {
  flashcute_fwd_params p = in;
  int64_t const b = batch_dim(p), rq = rows_q(p), kb = kv_blocks(p), rk = kv_rows(p);
  for (int64_t* s : {&p.q_batch_stride, &p.out_batch_stride, &p.lse_batch_stride}) ignore(b, *s);
  ignore(kb, p.k_batch_stride), ignore(kb, p.v_batch_stride);
  ignore(rq, p.q_row_stride), ignore(rq, p.out_row_stride);
  ignore(rk, p.k_row_stride), ignore(rk, p.v_row_stride);
  ignore(p.nheads, p.q_head_stride), ignore(p.nheads, p.out_head_stride), ignore(p.nheads, p.lse_head_stride);
  ignore(p.nheads_kv, p.k_head_stride), ignore(p.nheads_kv, p.v_head_stride);
  return p;
}

flashcute_bwd_params normalized(flashcute_bwd_params const& in) {
  flashcute_bwd_params p = in;
  p.fwd = normalized(in.fwd);
  auto const& f = p.fwd;
  int64_t const b = batch_dim(f), rq = rows_q(f), rk = rows_k(f);
  for (int64_t* s : {&p.dout_batch_stride, &p.dq_batch_stride, &p.dk_batch_stride, &p.dv_batch_stride}) ignore(b, *s);
  ignore(rq, p.dout_row_stride), ignore(rq, p.dq_row_stride);
  ignore(rk, p.dk_row_stride), ignore(rk, p.dv_row_stride);
  ignore(f.nheads, p.dout_head_stride), ignore(f.nheads, p.dq_head_stride);
  ignore(f.nheads_kv, p.dk_head_stride), ignore(f.nheads_kv, p.dv_head_stride);
  return p;
}

bool fwd_has_work(flashcute_fwd_params const& p) { return p.batch > 0 && p.seqlen_q > 0 && rows_q(p) > 0; }

bool bwd_has_work(flashcute_fwd_params const& p) {
  return fwd_has_work(p) || (p.batch > 0 && p.seqlen_k > 0 && rows_k(p) > 0);
}

flashcute_status_t validate_fwd(flashcute_fwd_params const* p, Target target) {
  clear_error();
  if (!p) return bad("params is NULL");
  if (auto s = validate_problem(*p, target)) return s;
  std::vector<Layout> const inputs = fwd_inputs(*p);
  Layout const out = out_layout(*p);
  Layout const lse = lse_layout("lse", p->lse, *p, lse_elem(*p));
  for (auto const& t : inputs)
    if (auto s = check_tensor(t, target)) return s;
  if (auto s = check_tensor(out, target)) return s;
  if (auto s = check_lse(lse, target)) return s;
  std::vector<Layout> outputs{out};
  if (p->lse) outputs.push_back(lse);
  if (auto s = check_aliasing(outputs, inputs)) return s;
  if (target == Target::kHostReference && varlen_of(*p))
    if (auto s = check_host_offsets(*p)) return s;
  // The GPU kernels clamp each table entry to a page instead (the host cannot read device memory).
  if (p->page_table && target == Target::kHostReference)
    if (auto s = check_host_pages(*p)) return s;
  return FLASHCUTE_SUCCESS;
}

flashcute_status_t validate_bwd(flashcute_bwd_params const* p, Target target) {
  clear_error();
  if (!p) return bad("params is NULL");
  auto const& f = p->fwd;
  if (f.page_table) return bad("page_table: the backward takes contiguous K/V (paged caches serve inference)");
  if (f.num_splits > 1) return bad("num_splits: the backward does not split the keys (set it to 0)");
  if (f.packed_gqa > 1) return bad("packed_gqa: the backward takes the query heads unpacked (set it to 0)");
  if (auto s = validate_fwd(&f, target)) return s;
  if (!f.lse && fwd_has_work(f)) return bad("lse is NULL: the backward needs the forward's lse");
  int64_t const es = elem_size(f.dtype);
  int64_t const b = batch_dim(f);
  std::vector<Layout> const grads = {
      bshd("dq", p->dq, es, b, rows_q(f), f.nheads, f.head_dim, p->dq_batch_stride, p->dq_row_stride,
           p->dq_head_stride),
      bshd("dk", p->dk, es, b, rows_k(f), f.nheads_kv, f.head_dim, p->dk_batch_stride, p->dk_row_stride,
           p->dk_head_stride),
      bshd("dv", p->dv, es, b, rows_k(f), f.nheads_kv, f.head_dim_v, p->dv_batch_stride, p->dv_row_stride,
           p->dv_head_stride)};
  Layout const dout = bshd("dout", p->dout, es, b, rows_q(f), f.nheads, f.head_dim_v, p->dout_batch_stride,
                           p->dout_row_stride, p->dout_head_stride);
  if (auto s = check_tensor(dout, target)) return s;
  for (auto const& t : grads)
    if (auto s = check_tensor(t, target)) return s;
  Layout const dlse = lse_layout("dlse", p->dlse, f, lse_elem(f));  // dlse shares lse's strides
  if (auto s = check_lse(dlse, target)) return s;
  if (p->deterministic != 0 && p->deterministic != 1)
    return bad("deterministic must be 0 or 1 (got " + str(p->deterministic) + ")");
  std::vector<Layout> inputs = fwd_inputs(f);
  inputs.push_back(out_layout(f));
  if (f.lse) inputs.push_back(lse_layout("lse", f.lse, f, lse_elem(f)));
  inputs.push_back(dout);
  if (p->dlse) inputs.push_back(dlse);
  if (p->dsink && !f.learnable_sink) return bad("dsink is set but fwd.learnable_sink is NULL");
  if (p->dsink && p->dsink == f.learnable_sink) return bad("dsink aliases fwd.learnable_sink");
  return check_aliasing(grads, inputs);
}

}  // namespace flashcute
