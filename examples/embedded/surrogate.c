/* A C application that trains a surrogate on a split of its communicator, through the C API alone (ddp_c.h):
 * the program a user of an MPI code writes. Ranks 0..T-1 train (T = all ranks at 1 or 2, all but the last at 3
 * or more); the others are left out of the split and check that a session on MPI_COMM_NULL is refused. Between
 * training steps every rank keeps using its own communicators: an allreduce on MPI_COMM_WORLD, and a message
 * ring on the very communicator the session was made on, whose receives (any source, any tag) are posted
 * before the steps and must receive the application's messages only. The surrogate learns
 *   f(a, b) = sin(2a) cos(b)   on [-1, 1]^2,
 * each trainer drawing its own samples as a simulation would produce them: each step trains on the new samples,
 * which then enter a replay buffer (a fixed bound, the oldest overwritten), and trains once more on a batch the
 * buffer draws from the recent ones. It prints the held-out mean squared error before and after, saves a
 * checkpoint, loads it into a second model and checks both predict the same. Exit status 0 when all holds.
 *
 *   mpirun -np 3 surrogate [CHECKPOINT_DIR] [STEPS] [DEVICE]      (DEVICE: cpu, the default, cuda or auto)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "ddp_c.h"

#define BATCH 64
#define EVAL 256
#define REPLAY 2048

static int failures = 0;

#define CHECK(call)                                                                                       \
  do {                                                                                                    \
    int status_ = (call);                                                                                 \
    if (status_ != DDP_OK) {                                                                              \
      fprintf(stderr, "surrogate: %s failed: %s: %s\n", #call, ddp_status_name(status_), ddp_last_error()); \
      MPI_Abort(MPI_COMM_WORLD, 1);                                                                       \
    }                                                                                                     \
  } while (0)

static float target(float a, float b) { return sinf(2.0f * a) * cosf(b); }

/* A deterministic generator of the rank's own samples. */
static float uniform(unsigned long long* state) {
  *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (float)((*state >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

static void draw(unsigned long long* state, float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) {
    x[2 * i] = uniform(state);
    x[2 * i + 1] = uniform(state);
    y[i] = target(x[2 * i], x[2 * i + 1]);
  }
}

static double mse(ddp_model* model, const float* x, const float* y, int n) {
  float prediction[EVAL];
  CHECK(ddp_predict(model, x, n, 2, DDP_MEMORY_HOST, prediction, n, 1));
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += (prediction[i] - y[i]) * (double)(prediction[i] - y[i]);
  return sum / n;
}

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const char* dir = argc > 1 ? argv[1] : "surrogate_checkpoints";
  const int steps = argc > 2 ? atoi(argv[2]) : 300;
  const char* device = argc > 3 ? argv[3] : "cpu";
  const int trainers = size >= 3 ? size - 1 : size;
  const int trains = rank < trainers;

  MPI_Comm train = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, trains ? 0 : MPI_UNDEFINED, rank, &train);
  if (!trains) {
    /* Left out of the split: a session on MPI_COMM_NULL is refused with a code and a message, not a crash. */
    ddp_session* none = NULL;
    const int status = ddp_session_create(train, "cpu", &none);
    if (status != DDP_ERROR_INVALID_ARGUMENT || strstr(ddp_last_error(), "MPI_COMM_NULL") == NULL) {
      fprintf(stderr, "rank %d: a session on MPI_COMM_NULL gave %s: %s\n", rank, ddp_status_name(status),
              ddp_last_error());
      ++failures;
    }
  }

  ddp_session* session = NULL;
  ddp_model* model = NULL;
  ddp_optimizer* optimizer = NULL;
  ddp_replay_buffer* replay = NULL;
  int trank = -1, tsize = 0;
  double before = 0, after = 0;
  unsigned long long state = 12345ULL + 977ULL * (unsigned long long)rank;
  float x[2 * BATCH], y[BATCH], ex[2 * EVAL], ey[EVAL];
  draw(&state, ex, ey, EVAL);
  if (trains) {
    CHECK(ddp_session_create(train, device, &session));
    CHECK(ddp_session_rank(session, &trank));
    CHECK(ddp_session_size(session, &tsize));
    const int64_t sizes[] = {2, 32, 32, 1};
    CHECK(ddp_mlp_create(session, 4, sizes, "tanh", 7, &model));
    CHECK(ddp_model_distribute(model));
    CHECK(ddp_optimizer_create_adamw(model, 1e-2, 0.0, &optimizer));
    CHECK(ddp_replay_buffer_create(session, REPLAY, 2, 1, 5, &replay));
    before = mse(model, ex, ey, EVAL);
  }

  /* The application's own traffic on the training communicator: a ring whose receives match anything. */
  int ring_errors = 0;
  for (int step = 0; step < steps; ++step) {
    int incoming = -1;
    MPI_Request request = MPI_REQUEST_NULL;
    if (trains) {
      MPI_Irecv(&incoming, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, train, &request);
      draw(&state, x, y, BATCH);
      double loss = 0;
      CHECK(ddp_train_step(model, optimizer, x, BATCH, 2, y, BATCH, 1, DDP_MEMORY_HOST, &loss));
      CHECK(ddp_replay_buffer_add(replay, x, BATCH, 2, y, BATCH, 1, DDP_MEMORY_HOST));
      CHECK(ddp_train_step_replay(model, optimizer, replay, BATCH, &loss));
      /* Now the message the receive waits for: its value says who sent it and when. */
      const int next = (trank + 1) % tsize, previous = (trank + tsize - 1) % tsize;
      const int mine = 1000 * step + trank;
      MPI_Send(&mine, 1, MPI_INT, next, 17, train);
      MPI_Status status;
      MPI_Wait(&request, &status);
      if (incoming != 1000 * step + previous || status.MPI_TAG != 17) ++ring_errors;
    }
    /* And the world's: every rank, trainers or not, between the steps. */
    if (step % 50 == 0) {
      int one = 1, all = 0;
      MPI_Allreduce(&one, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
      if (all != size) ++failures;
    }
  }
  if (ring_errors) {
    fprintf(stderr, "rank %d: %d of the application's messages were wrong\n", rank, ring_errors);
    ++failures;
  }

  if (trains) {
    int64_t held = 0, added = 0;
    CHECK(ddp_replay_buffer_size(replay, &held, &added));
    if (added != (int64_t)steps * BATCH || held != (added < REPLAY ? added : REPLAY)) {
      fprintf(stderr, "rank %d: the replay buffer holds %lld of %lld samples added\n", rank, (long long)held,
              (long long)added);
      ++failures;
    }
    CHECK(ddp_replay_buffer_destroy(replay));
    after = mse(model, ex, ey, EVAL);
    double mean_before = 0, mean_after = 0;
    CHECK(ddp_session_mean(session, before, &mean_before));
    CHECK(ddp_session_mean(session, after, &mean_after));
    CHECK(ddp_checkpoint_save(model, optimizer, dir, steps));
    /* A second model from another seed takes the checkpoint's weights and predicts as the first. */
    ddp_model* restored = NULL;
    ddp_optimizer* restored_optimizer = NULL;
    const int64_t sizes[] = {2, 32, 32, 1};
    CHECK(ddp_mlp_create(session, 4, sizes, "tanh", 99, &restored));
    CHECK(ddp_optimizer_create_adamw(restored, 1e-2, 0.0, &restored_optimizer));
    int64_t step = -1;
    CHECK(ddp_checkpoint_load(restored, restored_optimizer, dir, &step));
    const double restored_mse = mse(restored, ex, ey, EVAL);
    if (step != steps || restored_mse != after) {
      fprintf(stderr, "rank %d: the checkpoint gave step %lld and mse %g, not %d and %g\n", rank, (long long)step,
              restored_mse, steps, after);
      ++failures;
    }
    if (!(mean_after < 0.1 * mean_before) || !(mean_after < 0.01)) {
      fprintf(stderr, "rank %d: the surrogate did not learn: mse %g -> %g\n", rank, mean_before, mean_after);
      ++failures;
    }
    if (trank == 0) {
      printf("surrogate: ranks=%d trainers=%d steps=%d mse %.5f -> %.5f checkpoint step %lld\n", size, tsize, steps,
             mean_before, mean_after, (long long)step);
    }
    CHECK(ddp_optimizer_destroy(restored_optimizer));
    CHECK(ddp_model_destroy(restored));
    CHECK(ddp_optimizer_destroy(optimizer));
    CHECK(ddp_model_destroy(model));
    CHECK(ddp_session_destroy(session));
    MPI_Comm_free(&train);
  }
  int worst = 0;
  MPI_Allreduce(&failures, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) printf("surrogate: %s\n", worst == 0 ? "OK" : "FAILED");
  MPI_Finalize();
  return worst == 0 ? 0 : 1;
}
