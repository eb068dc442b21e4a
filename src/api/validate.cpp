#include "api/validate.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "api/status.h"

namespace flashcute {

namespace {

constexpr int64_t kMaxInt = 2147483647;

flashcute_status_t bad(std::string const& msg) { return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, msg); }

// Kernels move 16-byte vectors: base pointers and every stride must keep each row 16-byte aligned.
bool aligned16(void const* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }

struct TensorCheck {
  char const* name;
  void const* ptr;
  int64_t batch_stride, row_stride, head_stride;
};

flashcute_status_t check_tensor(TensorCheck const& t, Target target, bool varlen, int elem_size) {
  std::string const n = t.name;
  if (!t.ptr) return bad(n + " is NULL");
  if (t.row_stride < 0 || t.head_stride < 0 || (!varlen && t.batch_stride < 0))
    return bad(n + " strides must be non-negative (got batch " + std::to_string(t.batch_stride) + ", row " +
               std::to_string(t.row_stride) + ", head " + std::to_string(t.head_stride) + ")");
  if (target == Target::kDevice) {
    if (!aligned16(t.ptr)) return bad(n + " must be 16-byte aligned");
    int64_t const vec = 16 / elem_size;
    if (t.row_stride % vec || t.head_stride % vec || (!varlen && t.batch_stride % vec))
      return bad(n + " strides must be multiples of " + std::to_string(vec) +
                 " elements (16 bytes) so rows stay aligned; the last dimension must be contiguous");
  }
  return FLASHCUTE_SUCCESS;
}

flashcute_status_t check_shapes(flashcute_fwd_params const& p, Target target) {
  if (target == Target::kDevice) {
    if (p.dtype != FLASHCUTE_FLOAT16 && p.dtype != FLASHCUTE_BFLOAT16)
      return bad("dtype must be FLASHCUTE_FLOAT16 or FLASHCUTE_BFLOAT16 on the GPU (got " +
                 std::to_string((int)p.dtype) + ")");
  } else if (p.dtype != FLASHCUTE_FLOAT64) {
    return bad("dtype must be FLASHCUTE_FLOAT64 for the host reference");
  }
  struct {
    char const* name;
    int64_t value;
  } const sizes[] = {{"batch", p.batch},     {"seqlen_q", p.seqlen_q}, {"seqlen_k", p.seqlen_k},
                     {"nheads", p.nheads},   {"nheads_kv", p.nheads_kv}, {"head_dim", p.head_dim},
                     {"head_dim_v", p.head_dim_v}};
  for (auto const& s : sizes) {
    if (s.value < 1) return bad(std::string(s.name) + " must be >= 1 (got " + std::to_string(s.value) + ")");
    if (s.value > kMaxInt) return bad(std::string(s.name) + " must fit in int32");
  }
  // The mask's bounds arithmetic (common/mask.h) stays in int range below this.
  if (p.seqlen_q + p.seqlen_k >= (int64_t(1) << 30))
    return bad("seqlen_q + seqlen_k must be below 2^30 (got " + std::to_string(p.seqlen_q + p.seqlen_k) + ")");
  if (p.nheads % p.nheads_kv)
    return bad("nheads (" + std::to_string(p.nheads) + ") must be a multiple of nheads_kv (" +
               std::to_string(p.nheads_kv) + ")");
  if (target == Target::kDevice) {
    for (auto const& s : {sizes[5], sizes[6]}) {
      if (s.value % 8 || s.value > 256)
        return bad(std::string(s.name) + " must be a multiple of 8 and at most 256 on the GPU (got " +
                   std::to_string(s.value) + ")");
    }
  }
  // Kernels track the running max of raw scores, which is only the max of scaled scores for a positive scale.
  if (!std::isfinite(p.softmax_scale) || !(p.softmax_scale > 0.f))
    return bad("softmax_scale must be finite and > 0");
  if (!(p.softcap >= 0.f) || !std::isfinite(p.softcap)) return bad("softcap must be finite and >= 0");
  if (p.causal != 0 && p.causal != 1) return bad("causal must be 0 or 1");
  if ((p.cu_seqlens_q == nullptr) != (p.cu_seqlens_k == nullptr))
    return bad("cu_seqlens_q and cu_seqlens_k must be given together");
  if (p.seqused_k && !p.cu_seqlens_q) return bad("seqused_k needs cu_seqlens_q/cu_seqlens_k (varlen mode)");
  return FLASHCUTE_SUCCESS;
}

int elem_size(flashcute_dtype_t d) { return d == FLASHCUTE_FLOAT64 ? 8 : 2; }

}  // namespace

flashcute_status_t validate_fwd(flashcute_fwd_params const* p, Target target) {
  clear_error();
  if (!p) return bad("params is NULL");
  if (auto s = check_shapes(*p, target)) return s;
  bool const varlen = p->cu_seqlens_q != nullptr;
  int const es = elem_size(p->dtype);
  TensorCheck const tensors[] = {
      {"q", p->q, p->q_batch_stride, p->q_row_stride, p->q_head_stride},
      {"k", p->k, p->k_batch_stride, p->k_row_stride, p->k_head_stride},
      {"v", p->v, p->v_batch_stride, p->v_row_stride, p->v_head_stride},
      {"out", p->out, p->out_batch_stride, p->out_row_stride, p->out_head_stride},
  };
  for (auto const& t : tensors)
    if (auto s = check_tensor(t, target, varlen, es)) return s;
  if (p->lse && (p->lse_head_stride < 0 || (!varlen && p->lse_batch_stride < 0)))
    return bad("lse strides must be non-negative");
  if (target == Target::kDevice && p->lse && (reinterpret_cast<uintptr_t>(p->lse) & 3u))
    return bad("lse must be 4-byte aligned");
  return FLASHCUTE_SUCCESS;
}

flashcute_status_t validate_bwd(flashcute_bwd_params const* p, Target target) {
  clear_error();
  if (!p) return bad("params is NULL");
  if (auto s = validate_fwd(&p->fwd, target)) return s;
  if (!p->fwd.lse) return bad("lse is NULL: the backward needs the forward's lse");
  bool const varlen = p->fwd.cu_seqlens_q != nullptr;
  int const es = elem_size(p->fwd.dtype);
  TensorCheck const tensors[] = {
      {"dout", p->dout, p->dout_batch_stride, p->dout_row_stride, p->dout_head_stride},
      {"dq", p->dq, p->dq_batch_stride, p->dq_row_stride, p->dq_head_stride},
      {"dk", p->dk, p->dk_batch_stride, p->dk_row_stride, p->dk_head_stride},
      {"dv", p->dv, p->dv_batch_stride, p->dv_row_stride, p->dv_head_stride},
  };
  for (auto const& t : tensors)
    if (auto s = check_tensor(t, target, varlen, es)) return s;
  if (p->deterministic != 0 && p->deterministic != 1) return bad("deterministic must be 0 or 1");
  return FLASHCUTE_SUCCESS;
}

}  // namespace flashcute
