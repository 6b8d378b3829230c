/* The training step's two forms through the C API: ddp_train_step (the loss read each step) and
 * ddp_train_step_async (nothing read, one wait at the end) give the same model bit for bit, across a batch of
 * another size in the middle (run kernel by kernel from the same state) and on a distributed model. Prints the
 * predictions as exact hexadecimal floats, so that a run with DDP_CUDA_GRAPH=0 (kernel by kernel) can be
 * compared with the default (the step replayed as a CUDA graph on a GPU) by the script around it.
 *
 *   mpirun -np 2 async_step [cpu|cuda] [STEPS]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "ddp_c.h"

#define CHECK(call)                                                                          \
  do {                                                                                       \
    const int status_ = (call);                                                              \
    if (status_ != DDP_OK) {                                                                 \
      fprintf(stderr, "async_step: %s: %s: %s\n", #call, ddp_status_name(status_), ddp_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                          \
    }                                                                                        \
  } while (0)

enum { kInputs = 5, kBatch = 256, kShortBatch = 100, kShortStep = 7 };

/* Batch `step` of this rank: the same on every run, different on every rank. */
static void fill_batch(int step, int rank, int rows, float* x, float* y) {
  for (int i = 0; i < rows; ++i) {
    float sum = 0;
    for (int j = 0; j < kInputs; ++j) {
      const float v = sinf(0.37f * (float)(step * 131 + rank * 17 + i * kInputs + j));
      x[i * kInputs + j] = v;
      sum += v * (float)(j + 1);
    }
    y[i] = tanhf(0.3f * sum);
  }
}

static ddp_model* make_model(ddp_session* session, int distributed) {
  const int64_t sizes[] = {kInputs, 64, 64, 1};
  ddp_model* model = NULL;
  CHECK(ddp_mlp_create(session, 4, sizes, "tanh", 7, &model));
  if (distributed) CHECK(ddp_model_distribute(model));
  return model;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  const char* device = argc > 1 ? argv[1] : "cpu";
  const int steps = argc > 2 ? atoi(argv[2]) : 20;
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  ddp_session* session = NULL;
  CHECK(ddp_session_create(MPI_COMM_WORLD, device, &session));
  const int distributed = size > 1;
  ddp_model* synchronous = make_model(session, distributed);
  ddp_model* asynchronous = make_model(session, distributed);
  ddp_optimizer *sync_opt = NULL, *async_opt = NULL;
  CHECK(ddp_optimizer_create_adamw(synchronous, 1e-2, 0.01, &sync_opt));
  CHECK(ddp_optimizer_create_adamw(asynchronous, 1e-2, 0.01, &async_opt));

  float* x = malloc(sizeof(float) * kBatch * kInputs);
  float* y = malloc(sizeof(float) * kBatch);
  double loss = 0;
  for (int step = 0; step < steps; ++step) {
    const int rows = step == kShortStep ? kShortBatch : kBatch;
    fill_batch(step, rank, rows, x, y);
    CHECK(ddp_train_step(synchronous, sync_opt, x, rows, kInputs, y, rows, 1, DDP_MEMORY_HOST, &loss));
    if (!isfinite(loss)) {
      fprintf(stderr, "async_step: the loss of step %d is %g\n", step, loss);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* The host arrays may be overwritten as soon as the call returns: scribble on them to prove it. */
    CHECK(ddp_train_step_async(asynchronous, async_opt, x, rows, kInputs, y, rows, 1, DDP_MEMORY_HOST));
    memset(x, 0xff, sizeof(float) * (size_t)rows * kInputs);
  }
  CHECK(ddp_session_synchronize(session));
  const int on_cpu = strcmp(device, "cpu") == 0;
  if (on_cpu) {
    const int status = ddp_session_record_event(session, x);
    if (status != DDP_ERROR_INVALID_ARGUMENT || strstr(ddp_last_error(), "CPU") == NULL) {
      fprintf(stderr, "async_step: ddp_session_record_event on the CPU: %s: %s\n", ddp_status_name(status),
              ddp_last_error());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }

  float a[kBatch], b[kBatch];
  fill_batch(1000, 0, kBatch, x, y);
  CHECK(ddp_predict(synchronous, x, kBatch, kInputs, DDP_MEMORY_HOST, a, kBatch, 1));
  CHECK(ddp_predict(asynchronous, x, kBatch, kInputs, DDP_MEMORY_HOST, b, kBatch, 1));
  const int same = memcmp(a, b, sizeof a) == 0;
  if (rank == 0) {
    for (int i = 0; i < 8; ++i) printf("prediction %d %a\n", i, (double)a[i]);
    printf("last loss %a\n", loss);
    printf(same ? "async_step: OK\n" : "async_step: the asynchronous steps gave another model\n");
  }
  CHECK(ddp_optimizer_destroy(sync_opt));
  CHECK(ddp_optimizer_destroy(async_opt));
  CHECK(ddp_model_destroy(synchronous));
  CHECK(ddp_model_destroy(asynchronous));
  CHECK(ddp_session_destroy(session));
  free(x);
  free(y);
  MPI_Finalize();
  return same ? 0 : 1;
}
