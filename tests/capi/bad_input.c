/* Bad input through the C API gets an error code and a message, never a crash (the test also runs under
 * --config=asan): null pointers and handles, wrong sizes, a destroyed handle, a handle of another kind, an empty
 * replay buffer or one of other widths, a communicator this rank is not in, MPI started at too low a thread
 * level, calls before MPI_Init and after MPI_Finalize. Run as `bad_input` (2 ranks) or `bad_input single`
 * (MPI_Init, no thread support). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "capi/ddp_c.h"

static int failures = 0;
static int rank = 0;

/* The call must return `expected` with a message that contains `words`. */
static void expect(const char* what, int status, int expected, const char* words) {
  const char* message = ddp_last_error();
  if (status != expected || strstr(message, words) == NULL || strlen(message) < 20) {
    fprintf(stderr, "rank %d: FAIL %s: got %s \"%s\", wanted %s with \"%s\"\n", rank, what, ddp_status_name(status),
            message, ddp_status_name(expected), words);
    ++failures;
  } else if (rank == 0) {
    printf("ok %s: %s\n", what, message);
  }
}

int main(int argc, char** argv) {
  ddp_session* session = NULL;
  /* Before MPI exists. */
  expect("session before MPI_Init", ddp_session_create(MPI_COMM_WORLD, "cpu", &session), DDP_ERROR_MPI,
         "MPI_Init_thread");

  if (argc > 1 && strcmp(argv[1], "single") == 0) {
    MPI_Init(&argc, &argv);
    int provided = 0;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE) {
      expect("session at a low thread level", ddp_session_create(MPI_COMM_WORLD, "cpu", &session),
             DDP_ERROR_INVALID_ARGUMENT, "MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided)");
    }
    MPI_Finalize();
    if (rank == 0) printf("bad_input single: %s\n", failures ? "FAILED" : "OK");
    return failures ? 1 : 0;
  }

  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  /* A communicator this rank is not part of. */
  expect("MPI_COMM_NULL", ddp_session_create(MPI_COMM_NULL, "cpu", &session), DDP_ERROR_INVALID_ARGUMENT,
         "MPI_COMM_NULL");
  expect("a bad Fortran handle", ddp_session_create_f(-7, "cpu", &session), DDP_ERROR_INVALID_ARGUMENT,
         "not a valid handle");
  expect("a bad device", ddp_session_create(MPI_COMM_WORLD, "tpu", &session), DDP_ERROR_INVALID_ARGUMENT, "tpu");
  expect("a null out", ddp_session_create(MPI_COMM_WORLD, "cpu", NULL), DDP_ERROR_INVALID_ARGUMENT, "out is NULL");
  /* An intercommunicator between the two halves of the world. */
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size == 2) {
    MPI_Comm self_half = MPI_COMM_NULL, inter = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, rank, 0, &self_half);
    MPI_Intercomm_create(self_half, 0, MPI_COMM_WORLD, 1 - rank, 5, &inter);
    expect("an intercommunicator", ddp_session_create(inter, "cpu", &session), DDP_ERROR_INVALID_ARGUMENT,
           "intercommunicator");
    MPI_Comm_free(&inter);
    MPI_Comm_free(&self_half);
  }

  if (ddp_session_create(MPI_COMM_WORLD, "cpu", &session) != DDP_OK) {
    fprintf(stderr, "rank %d: FAIL a good session: %s\n", rank, ddp_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int value = 0;
  expect("a null session", ddp_session_rank(NULL, &value), DDP_ERROR_INVALID_HANDLE, "session is NULL");
  expect("a null rank", ddp_session_rank(session, NULL), DDP_ERROR_INVALID_ARGUMENT, "rank is NULL");

  ddp_model* model = NULL;
  const int64_t sizes[] = {3, 8, 2};
  const int64_t bad_sizes[] = {3, -8, 2};
  expect("one size", ddp_mlp_create(session, 1, sizes, "relu", 0, &model), DDP_ERROR_INVALID_ARGUMENT,
         "at least 2 sizes");
  expect("null sizes", ddp_mlp_create(session, 3, NULL, "relu", 0, &model), DDP_ERROR_INVALID_ARGUMENT,
         "sizes is NULL");
  expect("a negative width", ddp_mlp_create(session, 3, bad_sizes, "relu", 0, &model), DDP_ERROR_INVALID_ARGUMENT,
         "sizes[1] is -8");
  expect("a bad activation", ddp_mlp_create(session, 3, sizes, "swish", 0, &model), DDP_ERROR_INVALID_ARGUMENT,
         "swish");
  expect("a session as a model", ddp_model_distribute((ddp_model*)session), DDP_ERROR_INVALID_HANDLE,
         "is a ddp_session, not a ddp_model");
  if (ddp_mlp_create(session, 3, sizes, "relu", 0, &model) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  if (ddp_model_distribute(model) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  expect("distribute twice", ddp_model_distribute(model), DDP_ERROR_INVALID_ARGUMENT, "once");
  ddp_optimizer* optimizer = NULL;
  expect("a negative lr", ddp_optimizer_create_adamw(model, -1.0, 0.0, &optimizer), DDP_ERROR_INVALID_ARGUMENT, "lr");
  if (ddp_optimizer_create_adamw(model, 1e-3, 0.0, &optimizer) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);

  float x[4 * 3] = {0}, y[4 * 2] = {0};
  double loss = 0;
  expect("null x", ddp_train_step(model, optimizer, NULL, 4, 3, y, 4, 2, DDP_MEMORY_HOST, &loss),
         DDP_ERROR_INVALID_ARGUMENT, "x is NULL");
  expect("wrong input width", ddp_train_step(model, optimizer, x, 4, 5, y, 4, 2, DDP_MEMORY_HOST, &loss),
         DDP_ERROR_INVALID_ARGUMENT, "the model takes 3 inputs");
  expect("wrong output width", ddp_train_step(model, optimizer, x, 4, 3, y, 4, 1, DDP_MEMORY_HOST, &loss),
         DDP_ERROR_INVALID_ARGUMENT, "the model has 2 outputs");
  expect("rows that differ", ddp_train_step(model, optimizer, x, 4, 3, y, 3, 2, DDP_MEMORY_HOST, &loss),
         DDP_ERROR_INVALID_ARGUMENT, "y_rows is 3 but x_rows is 4");
  expect("no rows", ddp_train_step(model, optimizer, x, 0, 3, y, 0, 2, DDP_MEMORY_HOST, &loss),
         DDP_ERROR_INVALID_ARGUMENT, "x_rows is 0");
  expect("device memory on the CPU", ddp_train_step(model, optimizer, x, 4, 3, y, 4, 2, DDP_MEMORY_DEVICE, &loss),
         DDP_ERROR_INVALID_ARGUMENT, "runs on the CPU");
  expect("a bad memory kind", ddp_predict(model, x, 4, 3, 9, y, 4, 2), DDP_ERROR_INVALID_ARGUMENT, "memory is 9");
  expect("a null optimizer", ddp_train_step(model, NULL, x, 4, 3, y, 4, 2, DDP_MEMORY_HOST, &loss),
         DDP_ERROR_INVALID_HANDLE, "optimizer is NULL");
  expect("an empty checkpoint dir", ddp_checkpoint_save(model, optimizer, "", 1), DDP_ERROR_INVALID_ARGUMENT,
         "dir is NULL or empty");
  /* A good step still works after all that. */
  if (ddp_train_step(model, optimizer, x, 4, 3, y, 4, 2, DDP_MEMORY_HOST, &loss) != DDP_OK) {
    fprintf(stderr, "rank %d: FAIL a good step: %s\n", rank, ddp_last_error());
    ++failures;
  }

  /* The replay buffer: bad sizes and arrays, a draw from an empty buffer, widths that are not the model's. */
  ddp_replay_buffer* replay = NULL;
  expect("a buffer of capacity 0", ddp_replay_buffer_create(session, 0, 3, 2, 0, &replay), DDP_ERROR_INVALID_ARGUMENT,
         "capacity is 0");
  expect("a buffer of no inputs", ddp_replay_buffer_create(session, 16, 0, 2, 0, &replay), DDP_ERROR_INVALID_ARGUMENT,
         "inputs 0");
  expect("a buffer without out", ddp_replay_buffer_create(session, 16, 3, 2, 0, NULL), DDP_ERROR_INVALID_ARGUMENT,
         "out is NULL");
  expect("a buffer of a model", ddp_replay_buffer_create((ddp_session*)model, 16, 3, 2, 0, &replay),
         DDP_ERROR_INVALID_HANDLE, "is a ddp_model, not a ddp_session");
  if (ddp_replay_buffer_create(session, 16, 3, 2, 0, &replay) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  expect("a draw from an empty buffer", ddp_train_step_replay(model, optimizer, replay, 4, &loss),
         DDP_ERROR_INVALID_ARGUMENT, "the buffer is empty");
  expect("null samples", ddp_replay_buffer_add(replay, NULL, 4, 3, y, 4, 2, DDP_MEMORY_HOST),
         DDP_ERROR_INVALID_ARGUMENT, "x is NULL");
  expect("samples of another width", ddp_replay_buffer_add(replay, x, 4, 2, y, 4, 2, DDP_MEMORY_HOST),
         DDP_ERROR_INVALID_ARGUMENT, "the buffer takes 3 inputs");
  expect("device samples on the CPU", ddp_replay_buffer_add(replay, x, 4, 3, y, 4, 2, DDP_MEMORY_DEVICE),
         DDP_ERROR_INVALID_ARGUMENT, "runs on the CPU");
  if (ddp_replay_buffer_add(replay, x, 4, 3, y, 4, 2, DDP_MEMORY_HOST) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  expect("a batch of 0", ddp_train_step_replay(model, optimizer, replay, 0, &loss), DDP_ERROR_INVALID_ARGUMENT,
         "batch is 0");
  expect("a model as a buffer", ddp_train_step_replay(model, optimizer, (ddp_replay_buffer*)model, 4, &loss),
         DDP_ERROR_INVALID_HANDLE, "is a ddp_model, not a ddp_replay_buffer");
  ddp_replay_buffer* narrow = NULL;
  if (ddp_replay_buffer_create(session, 16, 3, 1, 0, &narrow) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  if (ddp_replay_buffer_add(narrow, x, 4, 3, y, 4, 1, DDP_MEMORY_HOST) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  expect("a buffer of other widths", ddp_train_step_replay(model, optimizer, narrow, 4, &loss),
         DDP_ERROR_INVALID_ARGUMENT, "make the buffer with the model's widths");
  ddp_replay_buffer_destroy(narrow);
  if (ddp_train_step_replay(model, optimizer, replay, 8, &loss) != DDP_OK) {
    fprintf(stderr, "rank %d: FAIL a good replay step: %s\n", rank, ddp_last_error());
    ++failures;
  }
  expect("a session with a buffer", ddp_session_destroy(session), DDP_ERROR_INVALID_ARGUMENT, "replay buffer(s)");
  ddp_replay_buffer_destroy(replay);
  int64_t held = 0;
  expect("a destroyed buffer", ddp_replay_buffer_size(replay, &held, NULL), DDP_ERROR_INVALID_HANDLE,
         "destroyed already");

  expect("a session with models", ddp_session_destroy(session), DDP_ERROR_INVALID_ARGUMENT, "destroy them first");
  expect("a model with optimizers", ddp_model_destroy(model), DDP_ERROR_INVALID_ARGUMENT, "destroy them first");
  ddp_optimizer_destroy(optimizer);
  expect("a destroyed optimizer", ddp_optimizer_set_lr(optimizer, 0.1), DDP_ERROR_INVALID_HANDLE,
         "destroyed already");
  ddp_model_destroy(model);
  expect("a destroyed model", ddp_model_distribute(model), DDP_ERROR_INVALID_HANDLE, "destroyed already");

  /* After MPI_Finalize: refused, and the session stays allocated rather than freeing communicators. */
  int worst = 0;
  MPI_Allreduce(&failures, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  ddp_session* leftover = session;
  MPI_Finalize();
  expect("destroy after MPI_Finalize", ddp_session_destroy(leftover), DDP_ERROR_MPI, "after MPI_Finalize");
  expect("a session after MPI_Finalize", ddp_session_create(MPI_COMM_WORLD, "cpu", &session), DDP_ERROR_MPI,
         "after MPI_Finalize");
  if (rank == 0) printf("bad_input: %s\n", failures || worst ? "FAILED" : "OK");
  return failures || worst ? 1 : 0;
}
