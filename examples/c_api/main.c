/* Causal attention through flashcute's C API: the float64 host reference on a small problem, then the GPU entry
   point asked to explain and to run the same problem (on a machine without a GPU it says so with a status). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <flashcute/flashcute.h>

enum { B = 1, SQ = 4, SK = 6, H = 2, HKV = 1, D = 8 };

int main(void) {
  static double q[B * SQ * H * D], k[B * SK * HKV * D], v[B * SK * HKV * D], out[B * SQ * H * D], lse[B * H * SQ];
  for (int i = 0; i < B * SQ * H * D; ++i) q[i] = sin(0.1 * i);
  for (int i = 0; i < B * SK * HKV * D; ++i) k[i] = cos(0.2 * i), v[i] = 0.01 * i;

  flashcute_fwd_params p;
  flashcute_fwd_params_init(&p);
  p.batch = B, p.seqlen_q = SQ, p.seqlen_k = SK, p.nheads = H, p.nheads_kv = HKV, p.head_dim = p.head_dim_v = D;
  p.softmax_scale = 1.0f / sqrtf((float)D);
  p.causal = 1;
  flashcute_fwd_params_set_contiguous_strides(&p);
  p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;

  printf("%s\n", flashcute_build_info());
  p.dtype = FLASHCUTE_FLOAT64;
  flashcute_status_t status = flashcute_reference_fwd(&p);
  if (status != FLASHCUTE_SUCCESS) {
    fprintf(stderr, "reference: %s: %s\n", flashcute_status_string(status), flashcute_last_error());
    return 1;
  }
  printf("reference: out[0] = %.6f, lse[0] = %.6f\n", out[0], lse[0]);

  char line[512];
  p.dtype = FLASHCUTE_BFLOAT16;
  flashcute_fwd_params wide = p; /* explain looks at sizes and flags only */
  wide.head_dim = wide.head_dim_v = 128;
  if (flashcute_explain(FLASHCUTE_FORWARD, &wide, 90, line, sizeof line) == FLASHCUTE_SUCCESS)
    printf("sm_90, head_dim 128: %s\n", line);
  /* Host pointers on the GPU path: a status naming the argument, or "no CUDA device", never a crash. */
  status = flashcute_fwd(&p, NULL);
  printf("GPU path with host pointers: %s (%s)\n", flashcute_status_string(status), flashcute_last_error());
  return status == FLASHCUTE_SUCCESS ? 1 : 0;
}
