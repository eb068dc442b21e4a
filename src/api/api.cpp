// The C entry points: validate, resolve the arch profile, pick a config from the table, launch.
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>

#include "api/device.h"
#include "api/guarded.h"
#include "api/status.h"
#include "api/validate.h"
#include "api/varlen_prepare.h"
#include "api/workspace.h"
#include "arch/dispatch.h"
#include "common/kernel_params.h"
#include "common/tile_scheduler.cuh"
#include "flashcute/flashcute.h"
#include "reference/reference.h"

using namespace flashcute;

namespace {

static_assert(Mask::kUnbounded == FLASHCUTE_WINDOW_UNBOUNDED, "the C API's unbounded window side is Mask's");

FwdKernelParams kernel_params(flashcute_fwd_params const& p) {
  FwdKernelParams k{};
  k.q = p.q;
  k.k = p.k;
  k.v = p.v;
  k.out = p.out;
  k.lse = static_cast<float*>(p.lse);
  k.learnable_sink = static_cast<float const*>(p.learnable_sink);
  k.q_batch_stride = p.q_batch_stride, k.q_row_stride = p.q_row_stride, k.q_head_stride = p.q_head_stride;
  k.k_batch_stride = p.k_batch_stride, k.k_row_stride = p.k_row_stride, k.k_head_stride = p.k_head_stride;
  k.v_batch_stride = p.v_batch_stride, k.v_row_stride = p.v_row_stride, k.v_head_stride = p.v_head_stride;
  k.out_batch_stride = p.out_batch_stride, k.out_row_stride = p.out_row_stride;
  k.out_head_stride = p.out_head_stride;
  k.lse_batch_stride = p.lse_batch_stride, k.lse_head_stride = p.lse_head_stride;
  k.batch = (int)p.batch, k.seqlen_q = (int)p.seqlen_q, k.seqlen_k = (int)p.seqlen_k;
  k.nheads = (int)p.nheads, k.nheads_kv = (int)p.nheads_kv;
  k.head_dim = (int)p.head_dim, k.head_dim_v = (int)p.head_dim_v;
  k.kv_group = (int)(p.nheads / p.nheads_kv);
  k.softmax_scale = p.softmax_scale;
  if (p.softcap > 0.f) {
    k.softcap_prescale = p.softmax_scale / p.softcap;
    k.scale_log2 = p.softcap * kLog2e;
  } else {
    k.softcap_prescale = 0.f;
    k.scale_log2 = p.softmax_scale * kLog2e;
  }
  k.causal = p.causal != 0;
  k.window_left = p.window_left;
  k.window_right = p.window_right;
  k.seq_spans = nullptr;  // varlen: set to the prepare pass's table
  k.page_table = p.page_table;
  if (p.page_table) {
    k.page_table_batch_stride = p.page_table_batch_stride;
    k.page_size = (int)p.page_size, k.num_pages = (int)p.num_pages;
    k.page_slots = IntDivisor::make(k.page_size);
    k.seqused_k = p.seqused_k;
  }
  k.packed_gqa = p.packed_gqa > 1 ? (int)p.packed_gqa : 1;
  return k;
}

// Rows per section of the forward's tile order (common/tile_scheduler.cuh), K/V in 16-bit elements (the GPU path's
// dtypes). FLASHCUTE_FWD_ORDER (A/B timing, tests) overrides it: "heads" for one row after the other, a number n for
// sections of n rows.
int section_heads(FwdKernelParams const& k) {
  if (char const* order = std::getenv("FLASHCUTE_FWD_ORDER")) {
    if (std::string(order) == "heads") return 1;
    if (int const n = std::atoi(order); n > 0) return n;
  }
  return fwd_section_heads(k, current_l2_bytes(), 2);
}

struct NamedPointer {
  void const* ptr;
  char const* name;
};

// Every non-null pointer must be device memory of the current device.
flashcute_status_t check_device_pointers(std::initializer_list<NamedPointer> ptrs) {
  for (auto const& x : ptrs)
    if (x.ptr)
      if (auto s = check_device_pointer(x.ptr, x.name)) return s;
  return FLASHCUTE_SUCCESS;
}

// The profile in force on the current device and the config dispatch picks under it.
// smem_request (optional): the mainloop's dynamic shared memory, padded under FLASHCUTE_ARCH so the device holds
// as many of its CTAs per SM as the emulated profile would.
flashcute_status_t choose_config(flashcute_direction_t dir, flashcute_fwd_params const& p, KernelConfig const** cfg,
                                 int* device_sm, int* smem_request = nullptr) {
  arch::Profile const* profile = nullptr;
  if (auto s = current_profile(&profile, device_sm)) return s;
  std::string why;
  *cfg = select_config(problem_of(dir, p), *profile, &why, std::getenv("FLASHCUTE_CONFIG"), config_built);
  if (!*cfg) return fail(FLASHCUTE_ERROR_UNSUPPORTED, why + " (profile " + profile->name + ")");
  if (smem_request) {
    arch::Profile const* device = arch::find_profile(*device_sm);
    *smem_request = device && device != profile
                        ? arch::emulated_smem_request(*profile, *device, (*cfg)->smem_bytes, (*cfg)->warps * 32)
                        : (*cfg)->smem_bytes;
  }
  return FLASHCUTE_SUCCESS;
}

flashcute_status_t not_built(KernelConfig const& cfg) {
  return fail(FLASHCUTE_ERROR_NOT_BUILT, std::string("kernel ") + cfg.name +
                                             " was not compiled into this build (FLASHCUTE_KERNELS=" +
                                             kernel_subset() + "): rebuild with -DFLASHCUTE_KERNELS=all");
}

// The varlen prepare pass's table, at the start of either direction's workspace.
size_t span_bytes(flashcute_fwd_params const& p) { return p.cu_seqlens_q ? seq_spans_bytes(p.batch) : 0; }

// The forward's workspace: the varlen table, then split-KV's float32 partials (O, then lse; kernel_params.h), which
// a call needs (`required` bytes), then the persistent grid's tile counter, which it may go without (`total`
// bytes; only the Hopper forward's plain instantiation uses it, tile_scheduler.cuh).
struct FwdWorkspace {
  int64_t partial_rows;
  size_t o_offset, lse_offset, counter_offset, required, total;
};

FwdWorkspace fwd_workspace(flashcute_fwd_params const& p) {
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  FwdWorkspace w{};
  w.total = span_bytes(p);
  if (p.num_splits > 1) {
    w.partial_rows = p.cu_seqlens_q ? p.total_q : p.batch * p.seqlen_q;
    size_t const slots = (size_t)p.num_splits * (size_t)p.nheads * (size_t)w.partial_rows;
    w.o_offset = align(w.total);
    w.lse_offset = align(w.o_offset + slots * (size_t)p.head_dim_v * sizeof(float));
    w.total = w.lse_offset + slots * sizeof(float);
  }
  w.required = w.total;
  w.counter_offset = align(w.total);
  w.total = w.counter_offset + sizeof(int);
  return w;
}

BwdWorkspace bwd_workspace(flashcute_bwd_params const& params, KernelConfig const& cfg) {
  auto const& p = params.fwd;
  bool const deterministic = params.deterministic != 0;
  using Dq = BwdWorkspace::Dq;
  Dq const dq = !deterministic ? Dq::kShared : orders_dq_by_turns(cfg) ? Dq::kTurns : Dq::kSlots;
  // Grid columns of the main kernel: (batch, query head), or (batch, K/V head) for deterministic GQA.
  int64_t const columns = p.batch * (deterministic && p.nheads != p.nheads_kv ? p.nheads_kv : p.nheads);
  return BwdWorkspace::make(p.batch, p.seqlen_q, p.seqlen_k, p.nheads, p.nheads_kv, cfg.head_dim, cfg.block_m,
                            cfg.block_n, dq, (int)(columns < (1 << 30) ? columns : (1 << 30)),
                            dq == Dq::kSlots ? current_sm_count() : 1, span_bytes(p));
}

// The device-side pointers a varlen call reads or writes besides the tensors.
flashcute_status_t check_varlen_pointers(flashcute_fwd_params const& p) {
  return check_device_pointers({{p.cu_seqlens_q, "cu_seqlens_q"},
                                {p.cu_seqlens_k, "cu_seqlens_k"},
                                {p.seqused_k, "seqused_k"},
                                {p.seqused_q, "seqused_q"},
                                {p.varlen_status, "varlen_status"}});
}

flashcute_status_t check_workspace(void const* workspace, size_t given, size_t needed) {
  if (needed && (!workspace || given < needed))
    return fail(FLASHCUTE_ERROR_WORKSPACE, "workspace must be at least " + std::to_string(needed) +
                                               " bytes (see the workspace_size functions), got " +
                                               std::to_string(workspace ? given : 0));
  if (workspace && reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
    return fail(FLASHCUTE_ERROR_WORKSPACE, "workspace must be 16-byte aligned (as cudaMalloc returns it)");
  return FLASHCUTE_SUCCESS;
}

// Varlen: the clamped sequence table the kernels read (and varlen_status, when asked for), built on the stream
// from the caller's offsets; every varlen call runs it, also one with nothing else to compute.
flashcute_status_t prepare_varlen(flashcute_fwd_params const& p, VarlenFill const& fill, void* workspace,
                                  FwdKernelParams& k, void* stream) {
  if (!p.cu_seqlens_q) return FLASHCUTE_SUCCESS;
  VarlenOffsets const v{p.cu_seqlens_q, p.cu_seqlens_k, p.seqused_q, p.seqused_k, (int)p.batch, (int)p.total_q,
                        (int)p.total_k, (int)p.seqlen_q, (int)p.seqlen_k};
  auto* spans = static_cast<SeqSpan*>(workspace);
  k.seq_spans = spans;
  if (!p.seqused_q && !p.seqused_k) k.packed_rows_q = (int)p.total_q, k.packed_rows_k = (int)p.total_k;
  return launch_status(launch_varlen_prepare(v, fill, spans, p.varlen_status, stream), "varlen_prepare", 0);
}

// One output of 16-bit elements for VarlenFill: rows of `heads` heads of `width` elements.
VarlenFill::Tensor fill_tensor(void* base, int64_t row_stride, int64_t head_stride, int64_t heads, int64_t width,
                               bool key_rows) {
  return {static_cast<char*>(base), row_stride * 2, head_stride * 2, (int)heads, (int)(width * 2), key_rows};
}

}  // namespace

extern "C" {

void flashcute_fwd_params_init(flashcute_fwd_params* p) {
  if (!p) return;
  std::memset(p, 0, sizeof(*p));
  p->dtype = FLASHCUTE_BFLOAT16;
  p->window_left = FLASHCUTE_WINDOW_UNBOUNDED;
  p->window_right = FLASHCUTE_WINDOW_UNBOUNDED;
  p->total_q = -1;
  p->total_k = -1;
}

void flashcute_bwd_params_init(flashcute_bwd_params* p) {
  if (!p) return;
  std::memset(p, 0, sizeof(*p));
  flashcute_fwd_params_init(&p->fwd);
}

void flashcute_fwd_params_set_contiguous_strides(flashcute_fwd_params* p) {
  if (!p) return;
  p->q_head_stride = p->head_dim, p->q_row_stride = p->nheads * p->head_dim;
  p->q_batch_stride = p->seqlen_q * p->q_row_stride;
  p->k_head_stride = p->head_dim, p->k_row_stride = p->nheads_kv * p->head_dim;
  p->k_batch_stride = p->seqlen_k * p->k_row_stride;
  p->v_head_stride = p->head_dim_v, p->v_row_stride = p->nheads_kv * p->head_dim_v;
  p->v_batch_stride = p->seqlen_k * p->v_row_stride;
  p->out_head_stride = p->head_dim_v, p->out_row_stride = p->nheads * p->head_dim_v;
  p->out_batch_stride = p->seqlen_q * p->out_row_stride;
  p->lse_head_stride = p->seqlen_q, p->lse_batch_stride = p->nheads * p->seqlen_q;
  if (p->cu_seqlens_q && p->total_q >= 0) p->lse_head_stride = p->total_q, p->lse_batch_stride = 0;
}

flashcute_status_t flashcute_fwd_workspace_size(flashcute_fwd_params const* params, size_t* bytes) {
  return guarded([&] {
    if (!bytes) return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "bytes is NULL");
    *bytes = 0;
    if (!params) return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "params is NULL");
    auto const p = normalized(*params);
    if (auto s = validate_fwd(&p, Target::kDevice)) return s;
    *bytes = fwd_workspace(p).total;
    return FLASHCUTE_SUCCESS;
  });
}

flashcute_status_t flashcute_bwd_workspace_size(flashcute_bwd_params const* params, size_t* bytes) {
  return guarded([&] {
    if (!bytes) return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "bytes is NULL");
    *bytes = 0;
    if (!params) return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "params is NULL");
    auto const bp = normalized(*params);
    if (auto s = validate_bwd(&bp, Target::kDevice)) return s;
    *bytes = span_bytes(bp.fwd);
    if (!bwd_has_work(bp.fwd)) return FLASHCUTE_SUCCESS;
    KernelConfig const* cfg = nullptr;
    int device_sm = 0;
    if (auto s = choose_config(FLASHCUTE_BACKWARD, bp.fwd, &cfg, &device_sm)) return s;
    *bytes = bwd_workspace(bp, *cfg).total;
    return FLASHCUTE_SUCCESS;
  });
}

flashcute_status_t flashcute_fwd(flashcute_fwd_params const* params, void* stream) {
  return guarded([&] {
    if (!params) return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "params is NULL");
    auto const p = normalized(*params);
    if (auto s = validate_fwd(&p, Target::kDevice)) return s;
    if (!fwd_has_work(p) && !p.cu_seqlens_q) return FLASHCUTE_SUCCESS;  // varlen: its rows are written anyway
    KernelConfig const* cfg = nullptr;
    int device_sm = 0, smem_request = 0;
    if (auto s = choose_config(FLASHCUTE_FORWARD, p, &cfg, &device_sm, &smem_request)) return s;
    if (auto s = check_device_pointers({{p.q, "q"}, {p.k, "k"}, {p.v, "v"}, {p.out, "out"}, {p.lse, "lse"},
                                        {p.learnable_sink, "learnable_sink"}, {p.workspace, "workspace"},
                                        {p.page_table, "page_table"}}))
      return s;
    if (auto s = check_varlen_pointers(p)) return s;
    FwdWorkspace const ws = fwd_workspace(p);
    if (auto s = check_workspace(p.workspace, p.workspace_size, ws.required)) return s;
    FwdLaunchFn launch = find_fwd_launcher(cfg->name);
    if (!launch && fwd_has_work(p)) return not_built(*cfg);
    FwdKernelParams k = kernel_params(p);
    k.smem_request = smem_request;
    if (p.workspace && p.workspace_size >= ws.total)
      k.tile_counter = reinterpret_cast<int*>(static_cast<char*>(p.workspace) + ws.counter_offset);
    if (p.num_splits > 1) {
      k.num_splits = (int)p.num_splits;
      k.o_partial = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + ws.o_offset);
      k.lse_partial = reinterpret_cast<float*>(static_cast<char*>(p.workspace) + ws.lse_offset);
      k.partial_rows = ws.partial_rows;
    }
    k.section_heads = section_heads(k);
    VarlenFill fill{};  // out 0 and lse -inf where no sequence owns the row
    fill.tensors[fill.count++] =
        fill_tensor(p.out, p.out_row_stride, p.out_head_stride, p.nheads, p.head_dim_v, false);
    fill.lse = static_cast<float*>(p.lse), fill.lse_head_stride = p.lse_head_stride, fill.lse_heads = (int)p.nheads;
    if (auto s = prepare_varlen(p, fill, p.workspace, k, stream)) return s;
    if (!fwd_has_work(p)) return FLASHCUTE_SUCCESS;
    return launch_status(launch(k, stream), cfg->name, device_sm);
  });
}

flashcute_status_t flashcute_bwd(flashcute_bwd_params const* params, void* stream) {
  return guarded([&] {
    if (!params) return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "params is NULL");
    auto const bp = normalized(*params);
    if (auto s = validate_bwd(&bp, Target::kDevice)) return s;
    auto const& p = bp.fwd;
    // No rows at all: the sink's gradient is 0, and no kernel would write it.
    if (!bwd_has_work(p) && !p.cu_seqlens_q) return zero_device_floats(bp.dsink, p.nheads, stream, "dsink");
    KernelConfig const* cfg = nullptr;
    int device_sm = 0, smem_request = 0;
    if (auto s = choose_config(FLASHCUTE_BACKWARD, p, &cfg, &device_sm, &smem_request)) return s;
    if (auto s = check_device_pointers({{p.q, "q"}, {p.k, "k"}, {p.v, "v"}, {p.out, "out"}, {p.lse, "lse"},
                                        {p.learnable_sink, "learnable_sink"}, {bp.dout, "dout"},
                                        {bp.dlse, "dlse"}, {bp.dq, "dq"}, {bp.dk, "dk"}, {bp.dv, "dv"},
                                        {bp.dsink, "dsink"}, {bp.workspace, "workspace"}}))
      return s;
    if (auto s = check_varlen_pointers(p)) return s;
    BwdLaunchFn launch = find_bwd_launcher(cfg->name);
    if (!launch && bwd_has_work(p)) return not_built(*cfg);
    BwdWorkspace const ws = bwd_workspace(bp, *cfg);
    if (auto s = check_workspace(bp.workspace, bp.workspace_size, ws.total)) return s;
    char* base = static_cast<char*>(bp.workspace);
    BwdKernelParams k{};
    static_cast<FwdKernelParams&>(k) = kernel_params(p);
    k.smem_request = smem_request;
    VarlenFill fill{};  // zero gradients where no sequence owns the row
    fill.tensors[fill.count++] = fill_tensor(bp.dq, bp.dq_row_stride, bp.dq_head_stride, p.nheads, p.head_dim, false);
    fill.tensors[fill.count++] =
        fill_tensor(bp.dk, bp.dk_row_stride, bp.dk_head_stride, p.nheads_kv, p.head_dim, true);
    fill.tensors[fill.count++] =
        fill_tensor(bp.dv, bp.dv_row_stride, bp.dv_head_stride, p.nheads_kv, p.head_dim_v, true);
    if (auto s = prepare_varlen(p, fill, base + ws.seq_spans, k, stream)) return s;
    if (!bwd_has_work(p)) return zero_device_floats(bp.dsink, p.nheads, stream, "dsink");
    k.dout = bp.dout;
    k.dout_batch_stride = bp.dout_batch_stride, k.dout_row_stride = bp.dout_row_stride;
    k.dout_head_stride = bp.dout_head_stride;
    k.dlse = static_cast<float const*>(bp.dlse);
    k.dsink = static_cast<float*>(bp.dsink);
    k.dq = bp.dq, k.dk = bp.dk, k.dv = bp.dv;
    k.dq_batch_stride = bp.dq_batch_stride, k.dq_row_stride = bp.dq_row_stride;
    k.dq_head_stride = bp.dq_head_stride;
    k.dk_batch_stride = bp.dk_batch_stride, k.dk_row_stride = bp.dk_row_stride;
    k.dk_head_stride = bp.dk_head_stride;
    k.dv_batch_stride = bp.dv_batch_stride, k.dv_row_stride = bp.dv_row_stride;
    k.dv_head_stride = bp.dv_head_stride;
    k.dq_accum = reinterpret_cast<float*>(base + ws.dq_accum);
    k.dsoftmax_sum = reinterpret_cast<float*>(base + ws.dsoftmax_sum);
    k.lse_log2 = reinterpret_cast<float*>(base + ws.lse_log2);
    bool const gqa = p.nheads != p.nheads_kv;
    k.dk_accum = gqa ? reinterpret_cast<float*>(base + ws.dk_accum) : nullptr;
    k.dv_accum = gqa ? reinterpret_cast<float*>(base + ws.dv_accum) : nullptr;
    k.seqlen_q_rounded = (int)ws.seqlen_q_rounded;
    k.seqlen_k_rounded = (int)ws.seqlen_k_rounded;
    k.head_dim_rounded = (int)ws.head_dim_rounded;
    k.dq_slots = ws.dq_slots;
    k.dq_slot_elems = ws.dq_slot_elems;
    k.deterministic = bp.deterministic != 0;
    if (ws.dq == BwdWorkspace::Dq::kTurns) {
      k.dq_turns = reinterpret_cast<int*>(base + ws.dq_turns);
      k.dq_descending = p.causal || p.window_right != FLASHCUTE_WINDOW_UNBOUNDED;
    }
    return launch_status(launch(k, stream), cfg->name, device_sm);
  });
}

flashcute_status_t flashcute_reference_fwd(flashcute_fwd_params const* params) {
  return guarded([&] {
    if (!params) return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "params is NULL");
    auto const p = normalized(*params);
    if (auto s = validate_fwd(&p, Target::kHostReference)) return s;
    reference::forward(p);
    return FLASHCUTE_SUCCESS;
  });
}

flashcute_status_t flashcute_reference_bwd(flashcute_bwd_params const* params) {
  return guarded([&] {
    if (!params) return fail(FLASHCUTE_ERROR_INVALID_ARGUMENT, "params is NULL");
    auto const p = normalized(*params);
    if (auto s = validate_bwd(&p, Target::kHostReference)) return s;
    reference::backward(p);
    return FLASHCUTE_SUCCESS;
  });
}

char const* flashcute_version(void) {
#define FLASHCUTE_STR2(x) #x
#define FLASHCUTE_STR(x) FLASHCUTE_STR2(x)
  return FLASHCUTE_STR(FLASHCUTE_VERSION_MAJOR) "." FLASHCUTE_STR(FLASHCUTE_VERSION_MINOR) "." FLASHCUTE_STR(
      FLASHCUTE_VERSION_PATCH);
}

}  // extern "C"
