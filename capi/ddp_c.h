/* The runtime's C API, for C programs and (through the Fortran module ddp.f90, which binds these calls) Fortran
 * programs that embed training in an MPI application: a session on the application's communicator, an MLP,
 * an optimizer, data-parallel gradients, a training step on the application's own arrays, prediction, and
 * checkpoints. No C++ exception crosses it: every call returns a ddp_status (DDP_OK or an error code) and,
 * on error, ddp_last_error() says what was wrong and what to do.
 *
 *   MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);   // the application owns MPI
 *   ddp_session* s;  ddp_model* m;  ddp_optimizer* o;
 *   int64_t sizes[] = {2, 64, 64, 1};
 *   if (ddp_session_create(comm, "auto", &s) != DDP_OK) fprintf(stderr, "%s\n", ddp_last_error());
 *   ddp_mlp_create(s, 4, sizes, "tanh", 0, &m);
 *   ddp_model_distribute(m);                        // DDP: rank 0's weights everywhere, gradients averaged
 *   ddp_optimizer_create_adamw(m, 1e-3, 0.0, &o);
 *   for (...) ddp_train_step(m, o, x, batch, 2, y, batch, 1, DDP_MEMORY_HOST, &loss);
 *   ddp_predict(m, x, batch, 2, DDP_MEMORY_HOST, prediction, batch, 1);
 *   ddp_optimizer_destroy(o); ddp_model_destroy(m); ddp_session_destroy(s);
 *   MPI_Finalize();
 *
 * Rules (docs/embedding.md has them in full):
 *   - MPI: initialised by the application at MPI_THREAD_MULTIPLE before ddp_session_create, finalised after
 *     the last ddp_session_destroy. A lower level is refused with a message naming the call to make. The
 *     session duplicates the communicator it is given: the application may go on using its own communicators,
 *     from any thread, between and during the calls here; calls of this API that communicate (marked
 *     "collective") are made by every rank of the session's communicator in the same order.
 *   - Arrays: float32, row-major: x holds `batch` rows of the model's input width (in Fortran, x(in, batch)).
 *     DDP_MEMORY_HOST: host memory; DDP_MEMORY_DEVICE: memory of the session's GPU. On the CPU, and for device
 *     arrays on the GPU, the step reads the caller's memory in place (no copy); the caller keeps ownership and
 *     may reuse the arrays once the call returns (the call completes its reads before returning).
 *   - Handles: a model and a replay buffer belong to their session, an optimizer to its model; destroying one
 *     that still has children is refused (destroy the children first). A handle used after it was destroyed is
 *     refused with DDP_ERROR_INVALID_HANDLE, for good: no later handle ever has its value (a destroyed handle
 *     keeps a few bytes for this). Handles are for the thread that made them: a call from another thread is
 *     refused with DDP_ERROR_INVALID_HANDLE, saying so.
 *   - Samples (rows of x and y) holding a NaN or an infinity are refused by ddp_train_step and
 *     ddp_replay_buffer_add with DDP_ERROR_INVALID_ARGUMENT, naming the first one's row and column; nothing is
 *     trained on or added then. ddp_model_set_nonfinite / ddp_replay_buffer_set_nonfinite with
 *     DDP_NONFINITE_SKIP have them left out instead, and counted (ddp_model_nonfinite_skipped,
 *     ddp_replay_buffer_nonfinite_skipped). A refusing train step checks the batch as it copies it in, on the
 *     session's device, without waiting for the result; skipping, and ddp_replay_buffer_add, read the check
 *     back before going on.
 */
#ifndef DDP_C_H_
#define DDP_C_H_

#include <mpi.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ddp_status {
  DDP_OK = 0,
  DDP_ERROR_INVALID_ARGUMENT = 1, /* a null pointer, a wrong size, a bad name: the message says which */
  DDP_ERROR_INVALID_HANDLE = 2,   /* a handle that is null, destroyed, or of another kind */
  DDP_ERROR_MPI = 3,              /* MPI not running (not initialised, or finalised), or an MPI call failed */
  DDP_ERROR_COLLECTIVE = 4,       /* a failure every rank of the session agreed on (the message names ranks) */
  DDP_ERROR_OUT_OF_MEMORY = 5,   /* host or GPU memory ran out: ask for less (a smaller buffer, batch or model) */
  DDP_ERROR_RUNTIME = 6,          /* any other failure of the runtime (CUDA, a file, a checkpoint) */
  DDP_ERROR_INTERNAL = 7          /* a bug in the runtime: please report it with the message */
} ddp_status;

typedef enum ddp_memory {
  DDP_MEMORY_HOST = 0,
  DDP_MEMORY_DEVICE = 1 /* memory of the session's GPU (cudaMalloc'd by the application) */
} ddp_memory;

/* What a train step or a replay buffer does with samples holding a NaN or an infinity. */
typedef enum ddp_nonfinite {
  DDP_NONFINITE_REFUSE = 0, /* the default: DDP_ERROR_INVALID_ARGUMENT naming the first one's row and column */
  DDP_NONFINITE_SKIP = 1    /* left out, and counted */
} ddp_nonfinite;

typedef struct ddp_session ddp_session;
typedef struct ddp_model ddp_model;
typedef struct ddp_optimizer ddp_optimizer;
typedef struct ddp_replay_buffer ddp_replay_buffer;

/* The message of this thread's last failed call ("" if none failed yet); valid until its next call. */
const char* ddp_last_error(void);
/* Copies that message into `buffer` (at most size - 1 bytes and a NUL); for Fortran. */
void ddp_last_error_copy(char* buffer, int64_t size);
/* "DDP_OK", "DDP_ERROR_INVALID_ARGUMENT", ... */
const char* ddp_status_name(int status);

/* ---- Session ---- */
/* Collective over `comm` (every rank of it, and only those): a session on the application's communicator.
 * device: "auto" (GPUs when every rank has one), "cpu" or "cuda"; NULL means "auto". */
int ddp_session_create(MPI_Comm comm, const char* device, ddp_session** out);
/* The same from a Fortran communicator handle (MPI_Comm_c2f; in Fortran, the integer communicator). */
int ddp_session_create_f(MPI_Fint comm, const char* device, ddp_session** out);
/* For an application on the GPU: `cuda_device` (its cudaSetDevice ordinal, or -1 for local rank % GPUs) and
 * `cuda_stream` (its cudaStream_t, borrowed: kept alive by the application until the session is destroyed;
 * NULL: the session makes its own, which ddp_session_cuda_stream hands over). Collective. */
int ddp_session_create_cuda(MPI_Comm comm, int cuda_device, void* cuda_stream, ddp_session** out);
int ddp_session_rank(const ddp_session* session, int* rank);
int ddp_session_size(const ddp_session* session, int* size);
/* 1 when the session runs on a GPU, 0 on the CPU. */
int ddp_session_on_gpu(const ddp_session* session, int* on_gpu);
/* The session's cudaStream_t (NULL on the CPU): order the application's work on the arrays it passes with it. */
int ddp_session_cuda_stream(const ddp_session* session, void** stream);
/* Collective: the mean of every rank's `value` (a loss), on every rank. */
int ddp_session_mean(const ddp_session* session, double value, double* mean);
/* Waits until the session's queued work is done (the steps of ddp_train_step_async); returns
 * DDP_ERROR_INVALID_ARGUMENT when some of those steps' batches were refused as not finite (none of them updated
 * the model). */
int ddp_session_synchronize(const ddp_session* session);
/* On a GPU: records `cuda_event` (a cudaEvent_t of the application's) after the session's queued work, so the
 * application's stream can wait for it (cudaStreamWaitEvent) instead of the host. Refused on the CPU. */
int ddp_session_record_event(const ddp_session* session, void* cuda_event);
/* Refused while models of the session exist. Must come before MPI_Finalize. */
int ddp_session_destroy(ddp_session* session);

/* ---- Model: a multi-layer perceptron ---- */
/* sizes[0] inputs, sizes[count-1] outputs, count >= 2; activation "relu", "tanh", "gelu", "sigmoid" or "silu"
 * between layers (NULL: "relu"); the same seed on every rank gives the same initial weights. */
int ddp_mlp_create(ddp_session* session, int count, const int64_t* sizes, const char* activation, uint64_t seed,
                   ddp_model** out);
/* ---- Model: from a description of its layers ---- */
/* A model from a JSON document listing its layers, e.g. the MLP above:
 *   {"inputs": 2, "layers": [{"type": "linear", "out": 64}, {"type": "tanh"}, {"type": "linear", "out": 64},
 *                            {"type": "tanh"}, {"type": "linear", "out": 1}]}
 * Types: linear ("out"; "in", "bias" optional), relu, gelu, tanh, sigmoid, silu, layer_norm ("eps" optional),
 * residual ("body": a list of layers; "projection": an optional list), frequency_encoding ("frequencies";
 * "include_input" optional), dropout ("p" optional); docs/embedding.md has them in full. Its weights have the
 * state_dict names of the same torch.nn.Sequential (a residual's lists as nn.Sequential attributes "body" and
 * "projection"). The same seed on every rank gives the same initial weights. A mistake in the description is
 * DDP_ERROR_INVALID_ARGUMENT naming the layer ("layers[1].body[0] (linear)") and the key. */
int ddp_model_create_from_json(ddp_session* session, const char* json, uint64_t seed, ddp_model** out);

int ddp_model_input_size(const ddp_model* model, int64_t* size);
int ddp_model_output_size(const ddp_model* model, int64_t* size);
/* Collective: data-parallel training (DistributedDataParallel): rank 0's weights are broadcast, and every
 * train step averages the gradients across the session's ranks, overlapped with backward. Call once, before
 * the first train step. */
int ddp_model_distribute(ddp_model* model);
/* Refused while optimizers of the model exist. */
int ddp_model_destroy(ddp_model* model);

/* ---- Optimizer ---- */
int ddp_optimizer_create_adamw(ddp_model* model, double lr, double weight_decay, ddp_optimizer** out);
int ddp_optimizer_create_sgd(ddp_model* model, double lr, double momentum, ddp_optimizer** out);
int ddp_optimizer_set_lr(ddp_optimizer* optimizer, double lr);
int ddp_optimizer_destroy(ddp_optimizer* optimizer);

/* ---- Training on the application's arrays ---- */
/* One step of mean-squared-error regression on x (x_rows x x_cols: a batch of x_rows samples of the model's
 * input_size features) against y (y_rows x y_cols: the same rows, output_size targets each), float32 row-major
 * in `memory`. The sizes are checked against the model and each other. Collective when the model is
 * distributed (every rank steps; batches may differ in size). loss: this rank's loss of the step, read back to
 * the host; NULL skips the read (the step still completes before the call returns). A loss that is not finite
 * is refused (DDP_ERROR_RUNTIME, or DDP_ERROR_COLLECTIVE on a distributed model) after the update.
 * On a GPU over NCCL the first steps run kernel by kernel; from the fourth on, steps of the first step's batch
 * size replay one CUDA graph of the whole step (the arrays copied into its buffers on the device, by the graph
 * itself on a model that is not distributed: one launch a step); a batch of
 * another size runs kernel by kernel from the same state, with the same result. */
int ddp_train_step(ddp_model* model, ddp_optimizer* optimizer, const float* x, int64_t x_rows, int64_t x_cols,
                   const float* y, int64_t y_rows, int64_t y_cols, int memory, double* loss);
/* ddp_train_step without waiting for the step: the arrays are copied into the step's buffers on the session's
 * stream and the step is queued after the copy; the call returns at once. Host arrays may be reused when it
 * returns; device arrays once the session's stream has passed the copy (ddp_session_synchronize, or
 * ddp_session_record_event and a wait on the application's stream). The same bits as ddp_train_step. The samples
 * are checked for NaN and infinities on the device as they are copied (the ranks of a distributed model agree
 * there), so the call does not wait for the check either: a refused batch makes no update, and the refusal
 * (DDP_ERROR_INVALID_ARGUMENT naming the first refused batch's row and column) is returned by the next call that
 * waits for the steps (ddp_session_synchronize, ddp_train_step). */
int ddp_train_step_async(ddp_model* model, ddp_optimizer* optimizer, const float* x, int64_t x_rows, int64_t x_cols,
                         const float* y, int64_t y_rows, int64_t y_cols, int memory);
/* What ddp_train_step does with samples holding a NaN or an infinity (ddp_nonfinite). Refused (the default),
 * the step makes no update and returns DDP_ERROR_INVALID_ARGUMENT; on a distributed model a batch refused on one
 * rank is the step refused on every rank, each returning DDP_ERROR_INVALID_ARGUMENT that names the rank, row and
 * column. Skipped, the step trains on the other samples; when none is left it takes no step and *loss is 0 (on a
 * distributed model the rank still steps with the others, adding a gradient of zero to their average). */
int ddp_model_set_nonfinite(ddp_model* model, int policy);
/* Samples ddp_train_step left out as not finite, since the model was made. */
int ddp_model_nonfinite_skipped(const ddp_model* model, int64_t* skipped);
/* The model's outputs for x (x_rows x input_size) into y (y_rows = x_rows, y_cols = output_size), both in
 * `memory`; no gradients, no communication. Complete when the call returns. */
int ddp_predict(ddp_model* model, const float* x, int64_t x_rows, int64_t x_cols, int memory, float* y,
                int64_t y_rows, int64_t y_cols);

/* ---- Samples streamed in: a replay buffer ---- */
/* A buffer of up to `capacity` samples of `inputs` and `targets` float32 values each, held on the session's
 * device: a fixed bound of capacity x (inputs + targets) floats, allocated once; when full, each new sample
 * overwrites the oldest. Each rank keeps its own (the samples it adds: its shard). Batches are drawn by
 * (seed, rank, number of the draw): the same adds give the same batches on every run, and ranks draw apart. */
int ddp_replay_buffer_create(ddp_session* session, int64_t capacity, int64_t inputs, int64_t targets, uint64_t seed,
                             ddp_replay_buffer** out);
/* Copies x (x_rows x inputs) and y (the same rows x targets), float32 row-major in `memory`, into the buffer
 * (device to device for arrays on the session's GPU). Complete when the call returns: the arrays may be reused. */
int ddp_replay_buffer_add(ddp_replay_buffer* buffer, const float* x, int64_t x_rows, int64_t x_cols, const float* y,
                          int64_t y_rows, int64_t y_cols, int memory);
/* What ddp_replay_buffer_add does with samples holding a NaN or an infinity (ddp_nonfinite): refused (the
 * default), nothing of the call is added; skipped, the others are. */
int ddp_replay_buffer_set_nonfinite(ddp_replay_buffer* buffer, int policy);
/* Samples ddp_replay_buffer_add left out as not finite (not counted in `added`). */
int ddp_replay_buffer_nonfinite_skipped(const ddp_replay_buffer* buffer, int64_t* skipped);
/* Samples held (at most the capacity) and ever added; either pointer may be NULL. */
int ddp_replay_buffer_size(const ddp_replay_buffer* buffer, int64_t* size, int64_t* added);
int ddp_replay_buffer_destroy(ddp_replay_buffer* buffer);
/* One step as ddp_train_step on `batch` samples drawn from the buffer at random (with replacement), gathered on
 * the session's device. The buffer's widths must be the model's, and it must hold samples. Collective when the
 * model is distributed. */
int ddp_train_step_replay(ddp_model* model, ddp_optimizer* optimizer, ddp_replay_buffer* buffer, int64_t batch,
                          double* loss);

/* ---- Weights to and from PyTorch ---- */
/* Loads the model's weights from a safetensors file holding a PyTorch state_dict, as
 * safetensors.torch.save_file(model.state_dict(), path) writes it for the torch.nn model the description
 * describes: every key of the model, float32, of its shape, and no other key; the first that is missing, of
 * another shape or dtype, or extra is named, with DDP_ERROR_INVALID_ARGUMENT, and nothing is loaded. Every rank
 * reads the file itself: every rank that calls passes the same file, visible to each. On a distributed model
 * the call is collective, and a failure on any rank is DDP_ERROR_COLLECTIVE on every rank with nothing loaded
 * anywhere; before ddp_model_distribute it concerns this rank alone (load on every rank, or on rank 0 only and
 * let ddp_model_distribute broadcast). */
int ddp_model_load_weights(ddp_model* model, const char* path);
/* Writes the model's weights to `path` as a safetensors state_dict that PyTorch loads
 * (model.load_state_dict(safetensors.torch.load_file(path))), atomically: a reader sees the old file or the
 * whole new one. On a distributed model collective: rank 0 writes, and a failure is DDP_ERROR_COLLECTIVE on
 * every rank; otherwise this rank writes its own model. */
int ddp_model_save_weights(ddp_model* model, const char* path);

/* ---- Checkpoints ---- */
/* Collective: rank 0 writes DIR/ckpt-<step>.safetensors atomically (model and optimizer state, PyTorch's
 * state_dict names, and the model's architecture: its sizes and activation), keeping the 3 newest. */
int ddp_checkpoint_save(ddp_model* model, ddp_optimizer* optimizer, const char* dir, int64_t step);
/* Collective: loads the newest checkpoint of DIR into the model and optimizer; *step is its step, or -1 when
 * DIR holds none (nothing is loaded then). A checkpoint of another architecture (other sizes, or another
 * activation) is refused before anything loads, with DDP_ERROR_COLLECTIVE and a message naming both. */
int ddp_checkpoint_load(ddp_model* model, ddp_optimizer* optimizer, const char* dir, int64_t* step);

#ifdef __cplusplus
}
#endif

#endif /* DDP_C_H_ */
