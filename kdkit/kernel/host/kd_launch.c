/* kdkit's per-layer launch on the host: a plan's kernels queued by one call from Python.
 *
 * run() is paid once per layer wherever no CUDA graph covers the batch. Through cuda-bindings each
 * cuLaunchKernel is a Python call that converts eleven arguments; here ctypes makes one call with
 * two (the plan's launch table and the stream) and the driver calls follow in C. The driver's
 * cuLaunchKernel and cuLaunchCooperativeKernel come in as function pointers (kdkit/kernel/native.py reads it from libcuda), so
 * this file needs no CUDA header or library to build: any C compiler builds it, with or without a
 * GPU, and the tests drive it through a recording stand-in for the driver.
 */
#include <stddef.h>
#include <stdint.h>

/* CUresult cuLaunchKernel(CUfunction, gridDim x y z, blockDim x y z, sharedMemBytes, CUstream,
 * void **kernelParams, void **extra): handles as void *, CUresult as int (a C enum);
 * cuLaunchCooperativeKernel takes the same but `extra` */
typedef int (*kd_cu_launch_fn)(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned smem, void *stream, void **params, void **extra);
typedef int (*kd_cu_launch_coop_fn)(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                    unsigned bz, unsigned smem, void *stream, void **params);

/* one kernel of a plan; the field order is kdkit/kernel/native.py's KdCall */
typedef struct {
  void *fn;          /* CUfunction */
  void **params;     /* kernelParams: one pointer per kernel argument */
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t smem;     /* dynamic shared memory, bytes */
  uint32_t coop;     /* 1: a cooperative launch (every block resident at once: the fused merge waits) */
} kd_call;

/* Queue calls[0..n) on `stream` in order. Returns 0, or, for the first launch the driver refused,
 * (its index + 1) << 32 | its CUresult: the later ones are not queued (they read what it writes). */
int64_t kd_launch(kd_cu_launch_fn launch, kd_cu_launch_coop_fn launch_coop, const kd_call *calls, int32_t n,
                  void *stream) {
  for (int32_t i = 0; i < n; ++i) {
    const kd_call *c = calls + i;
    const int err = c->coop ? launch_coop(c->fn, c->grid[0], c->grid[1], c->grid[2], c->block[0], c->block[1],
                                          c->block[2], c->smem, stream, c->params)
                            : launch(c->fn, c->grid[0], c->grid[1], c->grid[2], c->block[0], c->block[1],
                                     c->block[2], c->smem, stream, c->params, NULL);
    if (err != 0) return ((int64_t)(i + 1) << 32) | (uint32_t)err;
  }
  return 0;
}

/* the layout Python checks its mirror against before the first call */
int32_t kd_call_size(void) { return (int32_t)sizeof(kd_call); }
int32_t kd_call_offset_grid(void) { return (int32_t)offsetof(kd_call, grid); }
int32_t kd_call_offset_smem(void) { return (int32_t)offsetof(kd_call, smem); }
int32_t kd_call_offset_coop(void) { return (int32_t)offsetof(kd_call, coop); }
