/* The in-situ surrogate's training step as an application makes it: ddp_train_step on the application's own
 * arrays (host memory, or with --device cuda memory the application allocated on the GPU), timed over many
 * steps after a warm-up, then the same with ddp_train_step_async and one wait at the end. Prints a JSON line for
 * each; bench/surrogate_step.sh runs PyTorch's step beside it.
 *
 *   surrogate_step [cpu|cuda] BATCH STEPS      (MPI started here at MPI_THREAD_MULTIPLE, one rank) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "capi/ddp_c.h"

#ifdef DDP_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int check(int status, const char* what) {
  if (status != DDP_OK) {
    fprintf(stderr, "surrogate_step: %s: %s\n", what, ddp_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return status;
}

int main(int argc, char** argv) {
  const char* device = argc > 1 ? argv[1] : "cpu";
  const int64_t batch = argc > 2 ? atoll(argv[2]) : 256;
  const int steps = argc > 3 ? atoi(argv[3]) : 2000;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  /* The in-situ example's surrogate: 5 stencil values to the cell's update, two hidden layers of 64, tanh. */
  const int64_t sizes[] = {5, 64, 64, 1};
  float* x = malloc(sizeof(float) * (size_t)(batch * 5));
  float* y = malloc(sizeof(float) * (size_t)batch);
  for (int64_t i = 0; i < batch * 5; ++i) x[i] = (float)((i * 7919) % 2000) / 1000.0f - 1.0f;
  for (int64_t i = 0; i < batch; ++i) y[i] = 0.1f * x[5 * i] - 0.05f * x[5 * i + 2];
  int memory = DDP_MEMORY_HOST;
  const float *bx = x, *by = y;
#ifdef DDP_BENCH_CUDA
  float *dx = NULL, *dy = NULL;
  if (strcmp(device, "cuda") == 0) {
    cudaMalloc((void**)&dx, sizeof(float) * (size_t)(batch * 5));
    cudaMalloc((void**)&dy, sizeof(float) * (size_t)batch);
    cudaMemcpy(dx, x, sizeof(float) * (size_t)(batch * 5), cudaMemcpyHostToDevice);
    cudaMemcpy(dy, y, sizeof(float) * (size_t)batch, cudaMemcpyHostToDevice);
    memory = DDP_MEMORY_DEVICE;
    bx = dx;
    by = dy;
  }
#endif
  ddp_session* session = NULL;
  ddp_model* model = NULL;
  ddp_optimizer* optimizer = NULL;
  check(ddp_session_create(MPI_COMM_WORLD, device, &session), "session");
  check(ddp_mlp_create(session, 4, sizes, "tanh", 3, &model), "model");
  check(ddp_model_distribute(model), "distribute");
  check(ddp_optimizer_create_adamw(model, 1e-3, 0.0, &optimizer), "optimizer");
  double loss = 0;
  for (int i = 0; i < 50; ++i) check(ddp_train_step(model, optimizer, bx, batch, 5, by, batch, 1, memory, NULL), "warm-up");
  const double start = now_s();
  for (int i = 0; i < steps; ++i) check(ddp_train_step(model, optimizer, bx, batch, 5, by, batch, 1, memory, NULL), "step");
  const double seconds = now_s() - start;
  check(ddp_train_step(model, optimizer, bx, batch, 5, by, batch, 1, memory, &loss), "last step");
  printf("{\"program\": \"ddp C API\", \"device\": \"%s\", \"batch\": %lld, \"step_us\": %.2f, \"loss\": %.6g}\n", device,
         (long long)batch, 1e6 * seconds / steps, loss);
  // The same steps queued without waiting (ddp_train_step_async), one wait at the end: the step's own cost
  // when the application does not wait for it.
  const double async_start = now_s();
  for (int i = 0; i < steps; ++i) check(ddp_train_step_async(model, optimizer, bx, batch, 5, by, batch, 1, memory), "async step");
  check(ddp_session_synchronize(session), "synchronize");
  const double async_seconds = now_s() - async_start;
  printf("{\"program\": \"ddp C API async\", \"device\": \"%s\", \"batch\": %lld, \"step_us\": %.2f}\n", device,
         (long long)batch, 1e6 * async_seconds / steps);
  ddp_optimizer_destroy(optimizer);
  ddp_model_destroy(model);
  ddp_session_destroy(session);
  free(x);
  free(y);
  MPI_Finalize();
  return 0;
}
