/* Bad input through the C API gets an error code and a message, never a crash (the test also runs under
 * --config=asan): null pointers and handles, wrong sizes, a destroyed handle (also once new handles were made
 * after it), a handle of another kind or used from another thread, an empty replay buffer or one of other
 * widths, samples that are not finite (refused, or skipped and counted), a buffer larger than memory, a
 * checkpoint of another architecture, a bad model description, weights that do not fit the model or are not a
 * safetensors file, a communicator this rank is not in, MPI started at too low a thread level, calls before MPI_Init and after MPI_Finalize. No message carries
 * the runtime's source locations or check text. Run as `bad_input` (2 ranks) or `bad_input single` (MPI_Init,
 * no thread support). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "capi/ddp_c.h"

/* Under AddressSanitizer an allocation larger than memory fails as it does without (the allocator returns
 * NULL, which the runtime reports as DDP_ERROR_OUT_OF_MEMORY) instead of ending the program. */
const char* __asan_default_options(void);
const char* __asan_default_options(void) { return "allocator_may_return_null=1"; }

static int failures = 0;
static int rank = 0;

/* `status` and `message` must be `expected` and contain `words`, without the runtime's internals (a source
 * location, the text of a failed check). */
static void check(const char* what, int status, const char* message, int expected, const char* words) {
  const int internal = strstr(message, ".cc:") != NULL || strstr(message, ".h:") != NULL ||
                       strstr(message, "check `") != NULL || strstr(message, "does not hold") != NULL;
  if (status != expected || strstr(message, words) == NULL || strlen(message) < 20 || internal) {
    fprintf(stderr, "rank %d: FAIL %s: got %s \"%s\", wanted %s with \"%s\"%s\n", rank, what,
            ddp_status_name(status), message, ddp_status_name(expected), words,
            internal ? " and no internal text" : "");
    ++failures;
  } else if (rank == 0) {
    printf("ok %s: %s\n", what, message);
  }
}

/* The call must return `expected` with a message that contains `words`. */
static void expect(const char* what, int status, int expected, const char* words) {
  check(what, status, ddp_last_error(), expected, words);
}

/* Calls from a thread other than the one that made the handles. */
struct foreign_call {
  ddp_session* session;
  ddp_optimizer* optimizer;
  int rank_status, lr_status;
  char rank_message[512], lr_message[512];
};

static void* call_from_another_thread(void* argument) {
  struct foreign_call* call = (struct foreign_call*)argument;
  int value = 0;
  call->rank_status = ddp_session_rank(call->session, &value);
  ddp_last_error_copy(call->rank_message, sizeof call->rank_message);
  call->lr_status = ddp_optimizer_set_lr(call->optimizer, 0.5);
  ddp_last_error_copy(call->lr_message, sizeof call->lr_message);
  return NULL;
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
  /* Batches that do not fit the model (3 inputs, 2 outputs), each other or the device: one step each. */
  static const struct {
    const char* what;
    int64_t x_rows, x_cols, y_rows, y_cols;
    int memory;
    const char* words;
  } bad_batches[] = {
      {"wrong input width", 4, 5, 4, 2, DDP_MEMORY_HOST, "the model takes 3 inputs"},
      {"wrong output width", 4, 3, 4, 1, DDP_MEMORY_HOST, "the model has 2 outputs"},
      {"rows that differ", 4, 3, 3, 2, DDP_MEMORY_HOST, "y_rows is 3 but x_rows is 4"},
      {"no rows", 0, 3, 0, 2, DDP_MEMORY_HOST, "x_rows is 0"},
      {"device memory on the CPU", 4, 3, 4, 2, DDP_MEMORY_DEVICE, "runs on the CPU"},
  };
  for (size_t i = 0; i < sizeof bad_batches / sizeof bad_batches[0]; ++i) {
    const int status = ddp_train_step(model, optimizer, x, bad_batches[i].x_rows, bad_batches[i].x_cols, y,
                                      bad_batches[i].y_rows, bad_batches[i].y_cols, bad_batches[i].memory, &loss);
    expect(bad_batches[i].what, status, DDP_ERROR_INVALID_ARGUMENT, bad_batches[i].words);
  }
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

  /* Samples that are not finite: refused by default, naming the first one's row and column; skipped and counted
   * on request, the model staying finite. */
  float bad_x[4 * 3] = {0}, bad_y[4 * 2] = {0};
  bad_x[2 * 3 + 1] = NAN;
  expect("a NaN input", ddp_train_step(model, optimizer, bad_x, 4, 3, bad_y, 4, 2, DDP_MEMORY_HOST, &loss),
         DDP_ERROR_INVALID_ARGUMENT, "x row 2, column 1 (counting from 0; in Fortran x(2, 3)) is NaN or infinite");
  bad_x[2 * 3 + 1] = 0;
  bad_y[3 * 2 + 1] = -INFINITY;
  expect("an infinite target", ddp_train_step(model, optimizer, bad_x, 4, 3, bad_y, 4, 2, DDP_MEMORY_HOST, &loss),
         DDP_ERROR_INVALID_ARGUMENT, "y row 3, column 1");
  if (size == 2) {
    /* A NaN in rank 1's batch only: the distributed model's step is refused on both ranks, naming rank 1's value. */
    bad_y[3 * 2 + 1] = 0;
    if (rank == 1) bad_x[1 * 3 + 2] = NAN;
    expect("a NaN on one rank", ddp_train_step(model, optimizer, bad_x, 4, 3, bad_y, 4, 2, DDP_MEMORY_HOST, &loss),
           DDP_ERROR_INVALID_ARGUMENT, "rank 1's batch (no rank took the step): a sample is not finite: x row 1, column 2");
    bad_x[1 * 3 + 2] = 0;
    bad_y[3 * 2 + 1] = -INFINITY;
  }
  expect("a bad non-finite policy", ddp_model_set_nonfinite(model, 7), DDP_ERROR_INVALID_ARGUMENT, "policy is 7");
  int64_t skipped = -1;
  expect("a null skipped count", ddp_model_nonfinite_skipped(model, NULL), DDP_ERROR_INVALID_ARGUMENT,
         "skipped is NULL");
  if (ddp_model_set_nonfinite(model, DDP_NONFINITE_SKIP) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  bad_x[0] = INFINITY;
  const int skip_some = ddp_train_step(model, optimizer, bad_x, 4, 3, bad_y, 4, 2, DDP_MEMORY_HOST, &loss);
  ddp_model_nonfinite_skipped(model, &skipped);
  if (skip_some != DDP_OK || skipped != 2 || !isfinite(loss)) {
    fprintf(stderr, "rank %d: FAIL a step skipping 2 samples: %s, skipped %lld, loss %g: %s\n", rank,
            ddp_status_name(skip_some), (long long)skipped, loss, ddp_last_error());
    ++failures;
  }
  for (int i = 0; i < 4; ++i) bad_x[i * 3] = NAN;
  const int skip_all = ddp_train_step(model, optimizer, bad_x, 4, 3, bad_y, 4, 2, DDP_MEMORY_HOST, &loss);
  ddp_model_nonfinite_skipped(model, &skipped);
  if (skip_all != DDP_OK || skipped != 6 || loss != 0) {
    fprintf(stderr, "rank %d: FAIL a step skipping every sample: %s, skipped %lld, loss %g: %s\n", rank,
            ddp_status_name(skip_all), (long long)skipped, loss, ddp_last_error());
    ++failures;
  }
  float prediction[4 * 2];
  if (ddp_predict(model, x, 4, 3, DDP_MEMORY_HOST, prediction, 4, 2) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  for (int i = 0; i < 8; ++i) {
    if (!isfinite(prediction[i])) {
      fprintf(stderr, "rank %d: FAIL the model is no longer finite after skipped samples\n", rank);
      ++failures;
      break;
    }
  }
  if (ddp_model_set_nonfinite(model, DDP_NONFINITE_REFUSE) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);

  /* Handles used from another thread: refused, naming the reason. */
  struct foreign_call call;
  memset(&call, 0, sizeof call);
  call.session = session;
  call.optimizer = optimizer;
  pthread_t thread;
  if (pthread_create(&thread, NULL, call_from_another_thread, &call) != 0) MPI_Abort(MPI_COMM_WORLD, 1);
  pthread_join(thread, NULL);
  check("a session from another thread", call.rank_status, call.rank_message, DDP_ERROR_INVALID_HANDLE,
        "belongs to the thread that created it");
  check("an optimizer from another thread", call.lr_status, call.lr_message, DDP_ERROR_INVALID_HANDLE,
        "belongs to the thread that created it");

  /* A checkpoint records the architecture: a model of the same tensor shapes but another activation, or of other
   * sizes, is refused before anything loads, and the message names both. */
  char dir[1024];
  const char* tmp = getenv("TEST_TMPDIR");
  snprintf(dir, sizeof dir, "%s/bad_input_checkpoints", tmp != NULL ? tmp : "/tmp");
  if (ddp_checkpoint_save(model, optimizer, dir, 1) != DDP_OK) {
    fprintf(stderr, "rank %d: FAIL a checkpoint save: %s\n", rank, ddp_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  int64_t step = -2;
  ddp_model* other = NULL;
  ddp_optimizer* other_optimizer = NULL;
  if (ddp_mlp_create(session, 3, sizes, "tanh", 0, &other) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  if (ddp_optimizer_create_adamw(other, 1e-3, 0.0, &other_optimizer) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  expect("a checkpoint of another activation", ddp_checkpoint_load(other, other_optimizer, dir, &step),
         DDP_ERROR_COLLECTIVE, "holds an MLP of sizes 3-8-2 with relu, but the model is an MLP of sizes 3-8-2 with tanh");
  ddp_optimizer_destroy(other_optimizer);
  ddp_model_destroy(other);
  const int64_t wider[] = {3, 16, 2};
  if (ddp_mlp_create(session, 3, wider, "relu", 0, &other) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  if (ddp_optimizer_create_adamw(other, 1e-3, 0.0, &other_optimizer) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  expect("a checkpoint of other sizes", ddp_checkpoint_load(other, other_optimizer, dir, &step), DDP_ERROR_COLLECTIVE,
         "holds an MLP of sizes 3-8-2 with relu, but the model is an MLP of sizes 3-16-2 with relu");
  ddp_optimizer_destroy(other_optimizer);
  ddp_model_destroy(other);
  if (ddp_checkpoint_load(model, optimizer, dir, &step) != DDP_OK || step != 1) {
    fprintf(stderr, "rank %d: FAIL the checkpoint into its own model: step %lld, %s\n", rank, (long long)step,
            ddp_last_error());
    ++failures;
  }

  /* Models from a description: each mistake named with the layer and the key. */
  ddp_model* described = NULL;
  expect("a null description", ddp_model_create_from_json(session, NULL, 0, &described), DDP_ERROR_INVALID_ARGUMENT,
         "json is NULL");
  expect("an unknown layer type",
         ddp_model_create_from_json(session, "{\"inputs\": 3, \"layers\": [{\"type\": \"swish\"}]}", 0, &described),
         DDP_ERROR_INVALID_ARGUMENT, "layers[0]: unknown type \"swish\": the types are linear, relu");
  expect("a missing key",
         ddp_model_create_from_json(session, "{\"inputs\": 3, \"layers\": [{\"type\": \"residual\", \"body\": "
                                             "[{\"type\": \"linear\"}]}]}", 0, &described),
         DDP_ERROR_INVALID_ARGUMENT, "layers[0].body[0] (linear): key \"out\" is missing");
  expect("a width that does not fit",
         ddp_model_create_from_json(session, "{\"inputs\": 3, \"layers\": [{\"type\": \"linear\", \"out\": 8}, "
                                             "{\"type\": \"linear\", \"in\": 3, \"out\": 2}]}", 0, &described),
         DDP_ERROR_INVALID_ARGUMENT, "layers[1] (linear): key \"in\" is 3, but the layers before give 8 columns");
  expect("malformed JSON", ddp_model_create_from_json(session, "{\"inputs\": 3, \"layers\": [", 0, &described),
         DDP_ERROR_INVALID_ARGUMENT, "not valid JSON");
  expect("a description without out", ddp_model_create_from_json(session, "{}", 0, NULL), DDP_ERROR_INVALID_ARGUMENT,
         "out is NULL");
  /* The MLP's tensors under the same names and shapes, but another architecture: its checkpoint is refused. */
  const char* same_shapes = "{\"inputs\": 3, \"layers\": [{\"type\": \"linear\", \"out\": 8}, {\"type\": \"gelu\"}, "
                            "{\"type\": \"linear\", \"out\": 2}]}";
  if (ddp_model_create_from_json(session, same_shapes, 0, &described) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  if (ddp_optimizer_create_adamw(described, 1e-3, 0.0, &other_optimizer) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  expect("a checkpoint of an MLP into a described model", ddp_checkpoint_load(described, other_optimizer, dir, &step),
         DDP_ERROR_COLLECTIVE, "holds an MLP of sizes 3-8-2 with relu, but the model is the model {\"inputs\":3");
  ddp_optimizer_destroy(other_optimizer);

  /* Weights files: the MLP's weights load into the described model of the same shapes; a model of other shapes,
   * more or fewer layers, or a file that is not safetensors is refused naming the key (collective on the
   * distributed model: every rank refuses alike). */
  char weights[1100], junk[1100];
  snprintf(weights, sizeof weights, "%s/weights.safetensors", dir);
  snprintf(junk, sizeof junk, "%s/not_weights.safetensors", dir);
  if (ddp_model_save_weights(model, weights) != DDP_OK) {
    fprintf(stderr, "rank %d: FAIL saving weights: %s\n", rank, ddp_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (ddp_model_load_weights(described, weights) != DDP_OK) {
    fprintf(stderr, "rank %d: FAIL loading weights of the same shapes: %s\n", rank, ddp_last_error());
    ++failures;
  }
  expect("weights without a path", ddp_model_load_weights(described, NULL), DDP_ERROR_INVALID_ARGUMENT, "path is NULL");
  expect("save without a path", ddp_model_save_weights(described, ""), DDP_ERROR_INVALID_ARGUMENT, "path is NULL or empty");
  ddp_model_destroy(described);
  if (ddp_model_create_from_json(session, "{\"inputs\": 3, \"layers\": [{\"type\": \"linear\", \"out\": 4}, "
                                          "{\"type\": \"linear\", \"out\": 2}]}", 0, &described) != DDP_OK) {
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  expect("weights of another shape", ddp_model_load_weights(described, weights), DDP_ERROR_INVALID_ARGUMENT,
         "0.weight has shape [8, 3] but the model's is [4, 3]");
  ddp_model_destroy(described);
  if (ddp_model_create_from_json(session, "{\"inputs\": 3, \"layers\": [{\"type\": \"linear\", \"out\": 8}, "
                                          "{\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 2}, "
                                          "{\"type\": \"linear\", \"out\": 2}]}", 0, &described) != DDP_OK) {
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  expect("weights missing a key", ddp_model_load_weights(described, weights), DDP_ERROR_INVALID_ARGUMENT,
         "the model's 3.weight [2, 2] is missing from the file");
  ddp_model_destroy(described);
  if (ddp_model_create_from_json(session, "{\"inputs\": 3, \"layers\": [{\"type\": \"linear\", \"out\": 8}]}", 0,
                                 &described) != DDP_OK) {
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  expect("weights with an extra key", ddp_model_load_weights(described, weights), DDP_ERROR_INVALID_ARGUMENT,
         "holds 2.weight, which the model does not have");
  if (rank == 0) {
    FILE* f = fopen(junk, "w");
    fputs("not a safetensors file, but long enough to have a header length", f);
    fclose(f);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect("a file that is not safetensors", ddp_model_load_weights(described, junk), DDP_ERROR_INVALID_ARGUMENT,
         "weights file ");
  expect("a file that does not exist", ddp_model_load_weights(described, "/nonexistent/w.safetensors"),
         DDP_ERROR_INVALID_ARGUMENT, "/nonexistent/w.safetensors");
  ddp_model_destroy(described);
  expect("another model's weights into the distributed model", ddp_model_load_weights(model, junk),
         DDP_ERROR_COLLECTIVE, "weights not loaded");

  /* Out of memory: a status of its own, and the program goes on. */
  ddp_replay_buffer* huge = NULL;
  expect("a buffer larger than memory",
         ddp_replay_buffer_create(session, (int64_t)1 << 34, 1 << 24, 1 << 24, 0, &huge), DDP_ERROR_OUT_OF_MEMORY,
         "out of memory");

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
  bad_x[0] = 0;
  expect("a NaN sample for the buffer", ddp_replay_buffer_add(replay, bad_x, 4, 3, bad_y, 4, 2, DDP_MEMORY_HOST),
         DDP_ERROR_INVALID_ARGUMENT, "x row 1, column 0");
  expect("a draw after a refused add", ddp_train_step_replay(model, optimizer, replay, 4, &loss),
         DDP_ERROR_INVALID_ARGUMENT, "the buffer is empty");
  expect("a bad buffer policy", ddp_replay_buffer_set_nonfinite(replay, -1), DDP_ERROR_INVALID_ARGUMENT,
         "policy is -1");
  if (ddp_replay_buffer_set_nonfinite(replay, DDP_NONFINITE_SKIP) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
  bad_x[1 * 3] = 0;  /* rows 0..2 finite now, row 3's target infinite */
  bad_x[2 * 3] = 0;
  bad_x[3 * 3] = 0;
  int64_t held_now = 0, added_now = 0;
  if (ddp_replay_buffer_add(replay, bad_x, 4, 3, bad_y, 4, 2, DDP_MEMORY_HOST) != DDP_OK ||
      ddp_replay_buffer_nonfinite_skipped(replay, &skipped) != DDP_OK ||
      ddp_replay_buffer_size(replay, &held_now, &added_now) != DDP_OK || skipped != 1 || held_now != 3 ||
      added_now != 3) {
    fprintf(stderr, "rank %d: FAIL a buffer skipping 1 sample: skipped %lld, held %lld, added %lld: %s\n", rank,
            (long long)skipped, (long long)held_now, (long long)added_now, ddp_last_error());
    ++failures;
  }
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
  /* New optimizers of the same size, which an allocator would place where the destroyed one was: the old handle
   * stays refused, and the new ones work. */
  ddp_optimizer* fresh[4];
  for (int i = 0; i < 4; ++i) {
    if (ddp_optimizer_create_adamw(model, 1e-3, 0.0, &fresh[i]) != DDP_OK) MPI_Abort(MPI_COMM_WORLD, 1);
    expect("a destroyed optimizer after a new one", ddp_optimizer_set_lr(optimizer, 0.1), DDP_ERROR_INVALID_HANDLE,
           "destroyed already");
    if (ddp_optimizer_set_lr(fresh[i], 0.1) != DDP_OK) {
      fprintf(stderr, "rank %d: FAIL a new optimizer: %s\n", rank, ddp_last_error());
      ++failures;
    }
    ddp_optimizer_destroy(fresh[i]);
  }
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
