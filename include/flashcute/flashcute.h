/*
 * flashcute: exact attention (FlashAttention) forward and backward.
 *
 * Plain C interface. Every call returns a status; on failure a message naming the offending argument is
 * available from flashcute_last_error() (thread-local). The library never exits or aborts the process.
 *
 * Layout (FlashAttention's), strides in elements, last dimension contiguous:
 *   q   (batch, seqlen_q, nheads,    head_dim)
 *   k   (batch, seqlen_k, nheads_kv, head_dim)
 *   v   (batch, seqlen_k, nheads_kv, head_dim_v)
 *   out (batch, seqlen_q, nheads,    head_dim_v)
 *   lse (batch, nheads, seqlen_q), natural log; float32 (float64 for the host reference)
 * Strides of dimensions of size 1 are ignored (PyTorch gives them arbitrary values).
 * Empty problems are valid: batch 0 or seqlen_q 0 computes nothing; seqlen_k 0 gives rows that see no key
 * (out 0, lse -inf); a tensor with no elements may be NULL. Outputs must not share memory with each other or with
 * any input (refused); inputs may alias each other (q, k, v as views of one packed buffer, expanded views).
 * Variable length: with cu_seqlens_q/cu_seqlens_k (batch + 1 int32 offsets) the tokens of all sequences are
 * packed along the row dimension (total_q / total_k rows), batch strides are ignored, seqlen_q/seqlen_k are the
 * maximum lengths and lse is (nheads, total_q) with lse_head_stride. The kernels never trust the offsets: sequence
 * b is clamped to rows [clamp(cu[b], 0, total), clamp(cu[b+1], start, total)), at most seqlen_q / seqlen_k of
 * them, and seqused_k[b] / seqused_q[b] to [0, its rows], so no content of the offset arrays makes them access memory outside
 * the tensors. Consistent offsets are unchanged by this; varlen_status reports the others. Rows that belong to no
 * sequence (before cu[0], after cu[batch], past a sequence's seqused_q) are written too, so outputs need no
 * clearing: out 0 and lse -inf there, and in the backward dq 0 and, in key rows no sequence owns, dk and dv 0.
 * The host reference does the same, and refuses inconsistent offsets.
 * Without seqused_q / seqused_k, the Hopper kernels load a sequence's tiles by TMA and may read rows past its end
 * (the next sequence's, or rows after cu[batch]); they cannot change its results unless they hold Inf or NaN, so
 * rows after cu[batch] must be finite (zeros, stale data). With seqused_q or seqused_k the padding rows may hold
 * anything: such calls load with per-row predicates.
 * Visibility (bottom-right aligned): key j is visible to query i iff
 *   j >= i + (Sk - Sq) - window_left  and  j <= i + (Sk - Sq) + window_right,
 * a side set to FLASHCUTE_WINDOW_UNBOUNDED (the default) meaning no bound there; causal sets window_right = 0.
 * Any other value is an offset, negative ones too (FlashAttention-4's convention): window_right = -5 shows each
 * query only keys at least 5 before its diagonal, and rows left with no key give out 0, lse -inf.
 */
#ifndef FLASHCUTE_FLASHCUTE_H
#define FLASHCUTE_FLASHCUTE_H

#include <stddef.h>
#include <stdint.h>

/* A window side without bound (window_left / window_right). */
#define FLASHCUTE_WINDOW_UNBOUNDED INT64_MIN

#ifdef __cplusplus
extern "C" {
#endif

#define FLASHCUTE_VERSION_MAJOR 0
#define FLASHCUTE_VERSION_MINOR 1
#define FLASHCUTE_VERSION_PATCH 0

typedef enum flashcute_status {
  FLASHCUTE_SUCCESS = 0,
  FLASHCUTE_ERROR_INVALID_ARGUMENT = 1, /* a pointer, shape, stride, dtype or flag is wrong */
  FLASHCUTE_ERROR_UNSUPPORTED = 2,      /* valid input, but no kernel config serves it on this arch */
  FLASHCUTE_ERROR_NOT_BUILT = 3,        /* the config exists but this binary holds no code for it / this GPU */
  FLASHCUTE_ERROR_NO_DEVICE = 4,        /* no CUDA device, or the driver is missing */
  FLASHCUTE_ERROR_ARCH_REFUSED = 5,     /* FLASHCUTE_ARCH names a profile this device cannot run */
  FLASHCUTE_ERROR_WORKSPACE = 6,        /* workspace missing, too small or not 16-byte aligned */
  FLASHCUTE_ERROR_CUDA = 7              /* a CUDA runtime call failed */
} flashcute_status_t;

/* Bits written to varlen_status: which offsets disagreed with the declared sizes (the call clamped them). */
typedef enum flashcute_varlen_flag {
  FLASHCUTE_VARLEN_OK = 0,
  FLASHCUTE_VARLEN_BAD_CU_SEQLENS_Q = 1, /* an offset outside [0, total_q], or decreasing */
  FLASHCUTE_VARLEN_BAD_CU_SEQLENS_K = 2, /* an offset outside [0, total_k], or decreasing */
  FLASHCUTE_VARLEN_SEQLEN_Q = 4,         /* a sequence longer than seqlen_q */
  FLASHCUTE_VARLEN_SEQLEN_K = 8,         /* a sequence longer than seqlen_k */
  FLASHCUTE_VARLEN_SEQUSED_K = 16,       /* a seqused_k entry outside [0, the sequence's key rows] */
  FLASHCUTE_VARLEN_SEQUSED_Q = 32        /* a seqused_q entry outside [0, the sequence's query rows] */
} flashcute_varlen_flag_t;

typedef enum flashcute_dtype {
  FLASHCUTE_FLOAT16 = 0,
  FLASHCUTE_BFLOAT16 = 1,
  FLASHCUTE_FLOAT64 = 3 /* host reference only */
} flashcute_dtype_t;

typedef enum flashcute_direction { FLASHCUTE_FORWARD = 0, FLASHCUTE_BACKWARD = 1 } flashcute_direction_t;

typedef struct flashcute_fwd_params {
  /* Device pointers (host pointers for the reference). out and lse are written. */
  const void* q;
  const void* k;
  const void* v;
  void* out;
  void* lse; /* may be NULL in the forward if the caller does not need it */

  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t out_batch_stride, out_row_stride, out_head_stride;
  int64_t lse_batch_stride, lse_head_stride; /* row stride of lse is 1 */

  int64_t batch, seqlen_q, seqlen_k, nheads, nheads_kv, head_dim, head_dim_v;
  flashcute_dtype_t dtype;

  float softmax_scale;  /* scale applied to q.k */
  float softcap;        /* 0: off; c > 0: s = c * tanh(x / c) */
  int causal;           /* 1: window_right = 0 */
  int64_t window_left;  /* FLASHCUTE_WINDOW_UNBOUNDED, or an offset (negative too) */
  int64_t window_right; /* FLASHCUTE_WINDOW_UNBOUNDED, or an offset (negative too) */

  /* Optional variable-length mode (device int32 arrays); NULL for the fixed-length batch. */
  const int32_t* cu_seqlens_q; /* batch + 1 offsets into the packed rows of q/out */
  const int32_t* cu_seqlens_k; /* batch + 1 offsets into the packed rows of k/v */
  const int32_t* seqused_k;    /* batch entries: keys actually used per sequence (<= its length) */
  const int32_t* seqused_q;    /* batch entries: query rows actually used per sequence (<= its length); the mask
                                  aligns to them, and the rows past them are padding (not written) */
  int64_t total_q;             /* varlen: packed rows of q and out (required there; init sets -1, unset) */
  int64_t total_k;             /* varlen: packed rows of k and v (likewise) */
  /* Optional device int32 (varlen only): the call also writes there 0 when the offsets agree with total_q/k,
     seqlen_q/k and the sequences' lengths, else an OR of flashcute_varlen_flag bits; no host synchronisation. */
  int32_t* varlen_status;

  void* workspace; /* device memory of flashcute_fwd_workspace_size bytes, 16-byte aligned (as cudaMalloc's).
                      Varlen and split-KV calls need it (the clamped per-sequence table, the partials); the rest of
                      it, a counter for the Hopper forward's persistent tile scheduler, a call may go without (NULL or
                      fewer bytes: one CTA per tile) */
  size_t workspace_size;

  /* Optional learnable sink (GPT-OSS's attention sinks): nheads logits, one per query head, that join every row's
     softmax denominator: out_i = sum_j exp(s_ij - lse_i) v_j with lse_i = log(exp(sink_h) + sum_j exp(s_ij)), so a
     row that sees no key gives out 0 and lse = sink_h. Same element type as lse (float32 on the GPU, float64 for the
     reference). NULL: none. */
  const void* learnable_sink;

  /* Optional paged K/V, a KV cache in pages (the fixed-length batch; forward only). k and v then hold num_pages
     pages of page_size rows: row r of page g starts g * k_batch_stride + r * k_row_stride elements in (likewise
     v), and key j of sequence b is row j % page_size of page page_table[b * page_table_batch_stride + j /
     page_size] (int32). Sequence b's keys are its first seqused_k[b] (seqused_k is allowed here without varlen;
     NULL: seqlen_k each), so a row of page_table names ceil(seqlen_k / page_size) pages, of which only those
     holding used keys are read. NULL: k and v are (batch, seqlen_k, ...) as usual. The reference checks every
     entry it reads; the GPU kernels, which cannot, clamp each entry into [0, num_pages) and seqused_k[b] into
     [0, seqlen_k], so a bad table gives wrong pages, never a read outside k and v. */
  const int32_t* page_table;
  int64_t page_table_batch_stride;
  int64_t page_size;
  int64_t num_pages;

  /* Optional split-KV (the forward): each sequence's keys are cut into num_splits chunks of whole key tiles,
     computed side by side, their float32 partial outputs and log-sum-exps combined by a second kernel (with the
     learnable sink, which joins there). For decode-shaped calls: few query rows against long keys, where the
     query tiles alone cannot fill the GPU. 0 or 1: none; at most 256. Needs workspace
     (flashcute_fwd_workspace_size). The reference ignores it (the same attention). */
  int64_t num_splits;

  /* Optional packed GQA (the forward, fixed-length, for decode): 0 or 1: none. g > 1: q, out and lse hold the
     query heads that share a K/V head as the rows of one head, nheads == nheads_kv and seqlen_q = g x the query
     rows: row i * g + j of head h is query row i of query head h * g + j. One tile then reads each K/V tile once
     for all g heads. Masks see query row i (seqlen_q / g rows, bottom-right as usual); not with cu_seqlens_q,
     seqused_q or learnable_sink. */
  int64_t packed_gqa;
} flashcute_fwd_params;

typedef struct flashcute_bwd_params {
  /* Inputs of the forward (q, k, v, out, lse) with their shapes and flags; lse is required here. */
  flashcute_fwd_params fwd;

  const void* dout;
  int64_t dout_batch_stride, dout_row_stride, dout_head_stride;
  const void* dlse; /* gradient of lse, same layout as lse; NULL means zero */

  void* dq;
  void* dk;
  void* dv;
  int64_t dq_batch_stride, dq_row_stride, dq_head_stride;
  int64_t dk_batch_stride, dk_row_stride, dk_head_stride;
  int64_t dv_batch_stride, dv_row_stride, dv_head_stride;

  int deterministic; /* 1: bit-identical gradients across runs (its workspace grows with the device's SM count) */

  void* workspace; /* device memory of at least flashcute_bwd_workspace_size bytes, 16-byte aligned */
  size_t workspace_size;

  /* With fwd.learnable_sink: its gradient (nheads, lse's element type), written; NULL: not computed. */
  void* dsink;
} flashcute_bwd_params;

/* Fills defaults: zero pointers and shapes, scale 0 (set it), windows FLASHCUTE_WINDOW_UNBOUNDED, no softcap,
   total_q/k -1.
   A NULL params is ignored. */
void flashcute_fwd_params_init(flashcute_fwd_params* params);
void flashcute_bwd_params_init(flashcute_bwd_params* params);

/* Set strides from shapes for contiguous (B, S, H, D) tensors and a contiguous (B, H, Sq) lse (varlen: rows of
   total_q / total_k, lse (H, total_q)). A NULL params is ignored. */
void flashcute_fwd_params_set_contiguous_strides(flashcute_fwd_params* params);

flashcute_status_t flashcute_fwd_workspace_size(const flashcute_fwd_params* params, size_t* bytes);
flashcute_status_t flashcute_bwd_workspace_size(const flashcute_bwd_params* params, size_t* bytes);

/* Asynchronous on stream (a cudaStream_t, NULL for the legacy default stream) on the current device. */
flashcute_status_t flashcute_fwd(const flashcute_fwd_params* params, void* stream);
flashcute_status_t flashcute_bwd(const flashcute_bwd_params* params, void* stream);

/* The float64 host reference with the same semantics (dtype must be FLASHCUTE_FLOAT64, host pointers).
   Synchronous; uses no workspace. */
flashcute_status_t flashcute_reference_fwd(const flashcute_fwd_params* params);
flashcute_status_t flashcute_reference_bwd(const flashcute_bwd_params* params);

/* Describe what dispatch would choose for this problem, as one line of text, without launching anything.
   sm == 0: the current device (honouring FLASHCUTE_ARCH); otherwise that arch's profile (e.g. 120). */
flashcute_status_t flashcute_explain(flashcute_direction_t direction, const flashcute_fwd_params* params, int sm,
                                     char* buffer, size_t buffer_size);

/* The forward config dispatch would choose for this problem, as numbers: *ctas_per_sm, the CTAs per multiprocessor its
   tile is sized for (dispatch only picks it where that many fit), and *multiprocessors, the current device's count
   (0 for a requested sm). sm as for flashcute_explain. What a caller choosing num_splits needs to fill one wave. */
flashcute_status_t flashcute_fwd_occupancy(const flashcute_fwd_params* params, int sm, int* ctas_per_sm,
                                           int* multiprocessors);

/* One line per known arch profile, or the profile of sm (sm > 0). */
flashcute_status_t flashcute_arch_profiles(int sm, char* buffer, size_t buffer_size);

const char* flashcute_status_string(flashcute_status_t status);
const char* flashcute_last_error(void); /* message of the last failed call on this thread; "" if none */
const char* flashcute_version(void);
const char* flashcute_build_info(void); /* compiled CUDA targets and kernel subset */

#ifdef __cplusplus
}
#endif

#endif /* FLASHCUTE_FLASHCUTE_H */
