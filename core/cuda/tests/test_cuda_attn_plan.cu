/*
** The host side of the tensor-core attention's launch (cuda_attn_mma.cuh), run on
** the CPU: which K/V tensors the default loop copies whole as bytes into shared
** memory, that the room it asks for holds every tile's copy wherever the tile's
** first byte falls, which launches take the wide blocks of 8 warps, and that the exact
** mode (tsr_tile_args.f32) plans the f32 tile kernel where the tensor-core one would run.
** tests/gpu/gpu_op_parity runs the kernels on a GPU.
*/
#include <string.h>

extern "C" {
#include "harness.h"
}
#include "tessera/cuda_attn_tile.cuh"

enum { TK = 64, D = 128, CELLS = 1000, HEADS = 8 };

alignas(16) static char k_buf[CELLS * HEADS * 136 + 64], v_buf[CELLS * HEADS * 256 + 64];

static struct tsr_tile_args args(int32_t kt, int32_t vt) {
  struct tsr_tile_args a;
  memset(&a, 0, sizeof a);
  a.D = a.Dv = D;
  a.k = k_buf, a.v = v_buf;
  a.k_type = kt, a.v_type = vt;
  a.k_nb1 = kt == T_F16 ? 2 * D : D / 32 * cu_block_bytes(kt);
  a.v_nb1 = vt == T_F16 ? 2 * D : D / 32 * cu_block_bytes(vt);
  a.k_nb2 = a.k_nb1 * CELLS, a.v_nb2 = a.v_nb1 * CELLS;
  return a;
}

static void quantized_rows_end_to_end_are_copied_raw(void) {
  struct tsr_tile_args a = args(T_Q8_0, T_Q4_0);
  const size_t bytes = tsr_mma_raw_bytes(&a, TK);
  CHECK(a.raw_kv == 3);
  CHECK(bytes == tsr_mma_raw_span(TK, 136) + tsr_mma_raw_span(TK, 72));
  CHECK(bytes % 16 == 0);
}

static void other_tensors_are_staged_as_before(void) {
  struct tsr_tile_args a = args(T_F16, T_Q8_0); /* f16 has its own cp.async */
  CHECK(tsr_mma_raw_bytes(&a, TK) == tsr_mma_raw_span(TK, 136) && a.raw_kv == 2);
  a = args(T_Q8_0, T_Q8_0);
  a.k_nb1 += 8; /* padded rows: a tile is not one span */
  CHECK(tsr_mma_raw_bytes(&a, TK) == tsr_mma_raw_span(TK, 136) && a.raw_kv == 2);
  a = args(T_Q4_0, T_Q4_0);
  a.k = k_buf + 2, a.v = v_buf + 16; /* K's buffer off a 16-byte boundary */
  CHECK(tsr_mma_raw_bytes(&a, TK) == tsr_mma_raw_span(TK, 72) && a.raw_kv == 2);
  a = args(T_Q6_0, T_F32);
  CHECK(tsr_mma_raw_bytes(&a, TK) == 0 && a.raw_kv == 0);
}

/* tsr_mma_copy_raw starts at the 16-byte boundary below a tile's first byte: the copy
** of every tile of every head, from there, fits its span */
static void every_tiles_copy_fits_its_span(void) {
  for (int32_t t : {T_Q8_0, T_Q4_0}) {
    struct tsr_tile_args a = args(t, t);
    CHECK(tsr_mma_raw_bytes(&a, TK) > 0);
    const size_t span = tsr_mma_raw_span(TK, a.k_nb1);
    for (int h = 0; h < HEADS; h++)
      for (int64_t j0 = 0; j0 < CELLS; j0 += TK) {
        const uintptr_t first = (uintptr_t)(a.k + h * a.k_nb2 + j0 * a.k_nb1);
        CHECK_MSG(first % 16 + (size_t)TK * a.k_nb1 <= span, "type %d head %d tile %lld", t,
                  h, (long long)j0);
      }
  }
}

/* 64 rows a block past head dim 256, where a quantized tile is copied whole (default loop) */
static void wide_blocks_take_the_quantized_head_dims_past_256(void) {
  struct tsr_tile_args a = args(T_Q8_0, T_Q4_0);
  a.Nq = 2048, a.group = 8; /* a prefill ubatch of the 1M profile */
  CHECK(!tsr_mma_wide(&a)); /* D 128: blocks of 4 warps keep the raw copies */
  a.D = a.Dv = 512;
  a.k_nb1 = 512 / 32 * cu_block_bytes(T_Q8_0), a.v_nb1 = 512 / 32 * cu_block_bytes(T_Q4_0);
  CHECK(tsr_mma_wide(&a) && a.raw_kv == 0); /* asks on a copy: the launch sets raw_kv */
  a.Nq = 4; /* 32 rows: a decode step's fit one block of 4 warps */
  CHECK(!tsr_mma_wide(&a));
  a.Nq = 5;
  CHECK(tsr_mma_wide(&a));
  a.pipelined = 1;
  CHECK(!tsr_mma_wide(&a));
  a = args(T_F16, T_F16);
  a.Nq = 2048, a.group = 8;
  a.D = a.Dv = 512, a.k_nb1 = a.v_nb1 = 1024;
  CHECK(!tsr_mma_wide(&a)); /* f16 tiles arrive by cp.async already */
  a.v_type = T_Q4_0, a.v_nb1 = 512 / 32 * cu_block_bytes(T_Q4_0);
  CHECK(tsr_mma_wide(&a));
}

static void the_exact_mode_plans_no_tensor_cores(void) {
  for (int32_t t = 0; t < 2; t++) {
    struct tsr_tile_args a = args(t ? T_Q8_0 : T_F16, t ? T_Q8_0 : T_F16);
    a.Nq = 512, a.Hq = 8, a.group = 4, a.Nkv = 4096;
    struct tsr_tile_args exact = a;
    exact.f32 = 1;
    tsr_tile_attn_plan(&a, 132);
    tsr_tile_attn_plan(&exact, 132);
    CHECK(a.mma == 1 && exact.mma == 0);
  }
}

int main(void) {
  TSR_RUN(quantized_rows_end_to_end_are_copied_raw);
  TSR_RUN(other_tensors_are_staged_as_before);
  TSR_RUN(every_tiles_copy_fits_its_span);
  TSR_RUN(wide_blocks_take_the_quantized_head_dims_past_256);
  TSR_RUN(the_exact_mode_plans_no_tensor_cores);
  return TSR_TEST_EXIT();
}
