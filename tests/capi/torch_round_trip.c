/* A model trained offline in PyTorch, fine-tuned here: on the first TRAINERS ranks of the world (a communicator
 * split from MPI_COMM_WORLD; the other ranks wait), builds the model of the JSON description DESCRIPTION, loads
 * DIR/offline.safetensors (PyTorch's state_dict), checks that ddp_predict gives PyTorch's outputs on
 * DIR/inputs.bin (DIR/torch_offline.bin) to 1e-5, fine-tunes it data-parallel for a few steps, saves its weights
 * to DIR/finetuned-TRAINERS.safetensors and its outputs on the same inputs to DIR/c_finetuned-TRAINERS.bin, for
 * PyTorch to load and compare (tests/capi/torch_round_trip_test.sh).
 *
 *   mpirun -np 3 torch_round_trip DESCRIPTION DIR TRAINERS */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "capi/ddp_c.h"

static int rank = 0;

#define CHECK(call)                                                                               \
  do {                                                                                            \
    if ((call) != DDP_OK) {                                                                       \
      fprintf(stderr, "rank %d: %s failed: %s\n", rank, #call, ddp_last_error());                 \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                               \
    }                                                                                             \
  } while (0)

/* The whole file at `path` (NUL-terminated), and its size in bytes. */
static char* read_all(const char* path, long* size) {
  FILE* f = fopen(path, "rb");
  if (f == NULL) {
    fprintf(stderr, "rank %d: cannot open %s\n", rank, path);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  fseek(f, 0, SEEK_END);
  *size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char* data = malloc((size_t)*size + 1);
  if (fread(data, 1, (size_t)*size, f) != (size_t)*size) MPI_Abort(MPI_COMM_WORLD, 1);
  data[*size] = '\0';
  fclose(f);
  return data;
}

static void write_all(const char* path, const float* values, int64_t count) {
  FILE* f = fopen(path, "wb");
  if (f == NULL || fwrite(values, sizeof(float), (size_t)count, f) != (size_t)count) MPI_Abort(MPI_COMM_WORLD, 1);
  fclose(f);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: torch_round_trip DESCRIPTION DIR TRAINERS\n");
    return 2;
  }
  const char* dir = argv[2];
  const int trainers = atoi(argv[3]);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm comm;
  MPI_Comm_split(MPI_COMM_WORLD, rank < trainers ? 0 : MPI_UNDEFINED, rank, &comm);
  int failures = 0;
  char path[4096];
  if (comm != MPI_COMM_NULL) {
    long size = 0;
    char* description = read_all(argv[1], &size);
    ddp_session* session = NULL;
    ddp_model* model = NULL;
    ddp_optimizer* optimizer = NULL;
    int64_t in = 0, out = 0;
    CHECK(ddp_session_create(comm, "cpu", &session));
    CHECK(ddp_model_create_from_json(session, description, 0, &model));
    CHECK(ddp_model_input_size(model, &in));
    CHECK(ddp_model_output_size(model, &out));
    snprintf(path, sizeof path, "%s/offline.safetensors", dir);
    CHECK(ddp_model_load_weights(model, path));

    /* PyTorch's outputs before fine-tuning. */
    snprintf(path, sizeof path, "%s/inputs.bin", dir);
    float* inputs = (float*)read_all(path, &size);
    const int64_t rows = size / (int64_t)sizeof(float) / in;
    snprintf(path, sizeof path, "%s/torch_offline.bin", dir);
    float* expected = (float*)read_all(path, &size);
    float* predicted = malloc(sizeof(float) * (size_t)(rows * out));
    CHECK(ddp_predict(model, inputs, rows, in, DDP_MEMORY_HOST, predicted, rows, out));
    double error = 0;
    for (int64_t i = 0; i < rows * out; ++i) error = fmax(error, fabs((double)predicted[i] - expected[i]));
    if (size != (long)(sizeof(float) * rows * out) || !(error <= 1e-5)) {
      fprintf(stderr, "rank %d: FAIL ddp_predict against PyTorch before fine-tuning: max |difference| %g\n", rank,
              error);
      ++failures;
    } else if (rank == 0) {
      printf("ok ddp_predict against PyTorch before fine-tuning: max |difference| %.3g\n", error);
    }

    /* Fine-tuning, each rank on samples of its own. */
    CHECK(ddp_model_distribute(model));
    CHECK(ddp_optimizer_create_adamw(model, 1e-3, 0.0, &optimizer));
    enum { kBatch = 32, kSteps = 20 };
    float* x = malloc(sizeof(float) * (size_t)(kBatch * in));
    float* y = malloc(sizeof(float) * (size_t)(kBatch * out));
    double loss = 0;
    unsigned state = 12345u + 977u * (unsigned)rank;
    for (int step = 0; step < kSteps; ++step) {
      for (int r = 0; r < kBatch; ++r) {
        double sum = 0;
        for (int64_t c = 0; c < in; ++c) {
          state = state * 1664525u + 1013904223u;
          x[r * in + c] = (float)((state >> 8) / 16777216.0 * 2.0 - 1.0);
          sum += x[r * in + c];
        }
        for (int64_t c = 0; c < out; ++c) y[r * out + c] = (float)sin(sum);
      }
      CHECK(ddp_train_step(model, optimizer, x, kBatch, in, y, kBatch, out, DDP_MEMORY_HOST, &loss));
    }
    double mean = 0;
    CHECK(ddp_session_mean(session, loss, &mean));
    snprintf(path, sizeof path, "%s/finetuned-%d.safetensors", dir, trainers);
    CHECK(ddp_model_save_weights(model, path));

    /* Every rank's model is the same (data-parallel): rank 0's outputs are the ones PyTorch checks. */
    CHECK(ddp_predict(model, inputs, rows, in, DDP_MEMORY_HOST, predicted, rows, out));
    float* first = malloc(sizeof(float) * (size_t)(rows * out));
    memcpy(first, predicted, sizeof(float) * (size_t)(rows * out));
    MPI_Bcast(first, (int)(rows * out), MPI_FLOAT, 0, comm);
    if (memcmp(first, predicted, sizeof(float) * (size_t)(rows * out)) != 0) {
      fprintf(stderr, "rank %d: FAIL the fine-tuned model differs from rank 0's\n", rank);
      ++failures;
    }
    if (rank == 0) {
      snprintf(path, sizeof path, "%s/c_finetuned-%d.bin", dir, trainers);
      write_all(path, predicted, rows * out);
      printf("torch_round_trip: trainers=%d steps=%d mean loss %.4g\n", trainers, kSteps, mean);
    }
    CHECK(ddp_optimizer_destroy(optimizer));
    CHECK(ddp_model_destroy(model));
    CHECK(ddp_session_destroy(session));
    MPI_Comm_free(&comm);
    free(first);
    free(x);
    free(y);
    free(predicted);
    free(expected);
    free(inputs);
    free(description);
  }
  MPI_Allreduce(MPI_IN_PLACE, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("torch_round_trip: %s\n", failures ? "FAILED" : "OK");
  MPI_Finalize();
  return failures ? 1 : 0;
}
