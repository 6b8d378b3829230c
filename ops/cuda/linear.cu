// Linear forward and backward on cuBLASLt, with the bias, ReLU and bias-gradient work fused into the GEMM
// epilogues where cuBLASLt can do it exactly, and our own kernels (activations.cu) where it cannot.
//
// Layout mapping. cuBLASLt is column-major; a row-major [r, c] buffer is the column-major [c, r] matrix, i.e.
// its transpose. So every row-major product is computed as its transpose:
//   forward  y[b,o] = x[b,i]·w[o,i]ᵀ      ⇔  yᵀ[o,b]  = op_T(w as cm [i,o]) · (x as cm [i,b])        m=o n=b k=i
//   dx       dx[b,i] = dz[b,o]·w[o,i]     ⇔  dxᵀ[i,b] = (w as cm [i,o]) · (dz as cm [o,b])           m=i n=b k=o
//   dw       dw[o,i] = dz[b,o]ᵀ·x[b,i]    ⇔  dwᵀ[i,o] = (x as cm [i,b]) · op_T(dz as cm [o,b])       m=i n=o k=b
// The forward bias runs along D's rows (m = out): CUBLASLT_EPILOGUE_BIAS. In the dw GEMM the bias gradient is
// Σ_b dz[b,o], a reduction of B over k with one value per column of D: CUBLASLT_EPILOGUE_BGRADB.
//
// What is fused and what is not, and why:
//   * forward kNone/kRelu: BIAS / RELU_BIAS (or RELU) epilogue, one kernel.
//   * forward kGelu: cuBLASLt's GELU epilogues use the tanh approximation, the contract is exact erf GELU; so the
//     GEMM writes pre_activation with the BIAS epilogue and activations.cu applies the exact GELU.
//   * backward: DRELU/DGELU epilogues apply the derivative to the *output of a GEMM*, but here dy is an input and
//     dz = dy ⊙ act' must exist before either GEMM; DRELU also needs a bit-mask aux the contract does not carry.
//     So one kernel computes dz and, in the same pass, the bias gradient (fixed summation order, accumulates).
//     With kNone and no accumulation, the bias gradient comes from the dw GEMM's BGRADB epilogue instead.
//   * Bias epilogues are used only when the bias (or dbias) is 16-byte aligned, since cuBLASLt's alignment
//     preferences do not cover the bias vector. Any epilogue the heuristics reject for a shape falls back to a
//     plain GEMM plus our kernel; only a plain GEMM without an algorithm is an error.
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "ops/cuda/activation_kernels.h"
#include "ops/cuda/blas_handle.h"
#include "ops/kernels.h"
#include "runtime/core/check.h"

namespace ddp::kernels::cuda {
namespace {

// Largest power of two (≤ 256) dividing the address: the alignment cuBLASLt may assume for a buffer.
std::uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t a = 256;
  while (a > 1 && (address & (a - 1)) != 0) a >>= 1;
  return a;
}

// Everything that decides which algorithm cuBLASLt may run: the cache key of a plan.
struct GemmKey {
  int device = 0;
  cudaDataType_t type = CUDA_R_32F;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasOperation_t transa = CUBLAS_OP_N;
  cublasOperation_t transb = CUBLAS_OP_N;
  std::int64_t m = 0, n = 0, k = 0;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  std::uint32_t align_a = 0, align_b = 0, align_c = 0, align_bias = 0;

  bool operator==(const GemmKey& o) const {
    return device == o.device && type == o.type && compute == o.compute && transa == o.transa &&
           transb == o.transb && m == o.m && n == o.n && k == o.k && lda == o.lda && ldb == o.ldb &&
           ldc == o.ldc && epilogue == o.epilogue && align_a == o.align_a && align_b == o.align_b &&
           align_c == o.align_c && align_bias == o.align_bias;
  }
};

struct GemmKeyHash {
  std::size_t operator()(const GemmKey& k) const {
    std::size_t h = 1469598103934665603ull;
    auto mix = [&h](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(static_cast<std::uint64_t>(k.device));
    mix(static_cast<std::uint64_t>(k.type));
    mix(static_cast<std::uint64_t>(k.compute));
    mix(static_cast<std::uint64_t>(k.transa) * 2 + static_cast<std::uint64_t>(k.transb));
    mix(static_cast<std::uint64_t>(k.m));
    mix(static_cast<std::uint64_t>(k.n));
    mix(static_cast<std::uint64_t>(k.k));
    mix(static_cast<std::uint64_t>(k.lda));
    mix(static_cast<std::uint64_t>(k.ldb));
    mix(static_cast<std::uint64_t>(k.ldc));
    mix(static_cast<std::uint64_t>(k.epilogue));
    mix((static_cast<std::uint64_t>(k.align_a) << 48) ^ (static_cast<std::uint64_t>(k.align_b) << 32) ^
        (static_cast<std::uint64_t>(k.align_c) << 16) ^ k.align_bias);
    return h;
  }
};

// Descriptors and the chosen algorithm for one GemmKey. Built once (host-only calls), then reused: per call only
// the bias pointer attribute changes. Plans are per thread, so that attribute write never races.
class GemmPlan {
 public:
  GemmPlan() = default;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;
  ~GemmPlan() {
    // Host-side frees; their status is irrelevant at teardown.
    if (layout_a_ != nullptr) cublasLtMatrixLayoutDestroy(layout_a_);
    if (layout_b_ != nullptr) cublasLtMatrixLayoutDestroy(layout_b_);
    if (layout_c_ != nullptr) cublasLtMatrixLayoutDestroy(layout_c_);
    if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
  }

  void build(const GemmKey& key, const void* bias, cublasLtHandle_t handle, std::size_t workspace_bytes) {
    DDP_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, key.compute, CUDA_R_32F));
    DDP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &key.transa,
                                                    sizeof(key.transa)));
    DDP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &key.transb,
                                                    sizeof(key.transb)));
    DDP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE, &key.epilogue,
                                                    sizeof(key.epilogue)));
    if (uses_bias(key.epilogue)) {
      // Bias (and bias gradient) elements have D's type: float for float32, bf16 for bf16 (cublasLt.h).
      const std::int32_t bias_type = static_cast<std::int32_t>(key.type);
      DDP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                      sizeof(bias_type)));
      // The heuristics read the pointer's value to learn its alignment.
      set_bias(bias);
    }
    const bool ta = key.transa != CUBLAS_OP_N;
    const bool tb = key.transb != CUBLAS_OP_N;
    DDP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_a_, key.type, ta ? key.k : key.m, ta ? key.m : key.k,
                                                key.lda));
    DDP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_b_, key.type, tb ? key.n : key.k, tb ? key.k : key.n,
                                                key.ldb));
    DDP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_c_, key.type, key.m, key.n, key.ldc));

    cublasLtMatmulPreference_t pref = nullptr;
    DDP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const std::uint64_t max_ws = workspace_bytes;
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    int returned = 0;
    cublasLtMatmulHeuristicResult_t result;
    std::memset(&result, 0, sizeof(result));
    try {
      DDP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_ws,
                                                            sizeof(max_ws)));
      DDP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                            &key.align_a, sizeof(key.align_a)));
      DDP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                            &key.align_b, sizeof(key.align_b)));
      DDP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                            &key.align_c, sizeof(key.align_c)));
      DDP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                            &key.align_c, sizeof(key.align_c)));
      status = cublasLtMatmulAlgoGetHeuristic(handle, desc_, layout_a_, layout_b_, layout_c_, layout_c_, pref, 1,
                                              &result, &returned);
    } catch (...) {
      cublasLtMatmulPreferenceDestroy(pref);
      throw;
    }
    DDP_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    // NOT_SUPPORTED (or zero results) means "no algorithm for this configuration": the caller falls back.
    if (status != CUBLAS_STATUS_NOT_SUPPORTED) DDP_CUBLAS_CHECK(status);
    has_algo_ = status == CUBLAS_STATUS_SUCCESS && returned > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (has_algo_) {
      algo_ = result.algo;
      workspace_needed_ = result.workspaceSize;
    }
  }

  bool has_algo() const { return has_algo_; }

  void run(cublasLtHandle_t handle, void* workspace, std::size_t workspace_bytes, float alpha, const void* a,
           const void* b, float beta, const void* c, void* d, const void* bias, cublasLtEpilogue_t epilogue,
           cudaStream_t stream) {
    if (uses_bias(epilogue)) set_bias(bias);
    DDP_CHECK(workspace_needed_ <= workspace_bytes, "cuBLASLt algorithm needs more workspace than was allocated");
    DDP_CUBLAS_CHECK(cublasLtMatmul(handle, desc_, &alpha, a, layout_a_, b, layout_b_, &beta, c, layout_c_, d,
                                    layout_c_, &algo_, workspace, workspace_bytes, stream));
  }

 private:
  static bool uses_bias(cublasLtEpilogue_t e) {
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_RELU_BIAS || e == CUBLASLT_EPILOGUE_BGRADA ||
           e == CUBLASLT_EPILOGUE_BGRADB;
  }
  void set_bias(const void* bias) {
    DDP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }

  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t layout_a_ = nullptr;
  cublasLtMatrixLayout_t layout_b_ = nullptr;
  cublasLtMatrixLayout_t layout_c_ = nullptr;
  cublasLtMatmulAlgo_t algo_{};
  bool has_algo_ = false;
  std::size_t workspace_needed_ = 0;
};

const char* epilogue_name(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS:
      return "BIAS";
    case CUBLASLT_EPILOGUE_RELU:
      return "RELU";
    case CUBLASLT_EPILOGUE_RELU_BIAS:
      return "RELU_BIAS";
    case CUBLASLT_EPILOGUE_BGRADB:
      return "BGRADB";
    default:
      return "other";
  }
}

// One GEMM D = alpha·op(A)·op(B) + beta·C (C == D) with `epilogue`. Returns false when cuBLASLt has no algorithm
// for a fused epilogue (the caller then does the epilogue itself); a plain GEMM without one throws.
bool gemm(ScalarType dtype, MathMode math, cublasOperation_t transa, cublasOperation_t transb, std::int64_t m,
          std::int64_t n, std::int64_t k, const void* a, std::int64_t lda, const void* b, std::int64_t ldb,
          float beta, void* d, std::int64_t ldd, cublasLtEpilogue_t epilogue, const void* bias,
          cudaStream_t stream) {
  const BlasContext ctx = blas_context(stream);
  GemmKey key;
  DDP_CUDA_CHECK(cudaGetDevice(&key.device));
  key.type = dtype == ScalarType::kFloat32 ? CUDA_R_32F : CUDA_R_16BF;
  key.compute = (dtype == ScalarType::kFloat32 && math == MathMode::kTF32) ? CUBLAS_COMPUTE_32F_FAST_TF32
                                                                           : CUBLAS_COMPUTE_32F;
  key.transa = transa;
  key.transb = transb;
  key.m = m;
  key.n = n;
  key.k = k;
  key.lda = lda;
  key.ldb = ldb;
  key.ldc = ldd;
  key.epilogue = epilogue;
  key.align_a = alignment_of(a);
  key.align_b = alignment_of(b);
  key.align_c = alignment_of(d);
  key.align_bias = bias != nullptr ? alignment_of(bias) : 0;

  thread_local std::unordered_map<GemmKey, std::unique_ptr<GemmPlan>, GemmKeyHash> plans;
  auto it = plans.find(key);
  if (it == plans.end()) {
    auto plan = std::make_unique<GemmPlan>();
    plan->build(key, bias, ctx.handle, ctx.workspace_bytes);
    it = plans.emplace(key, std::move(plan)).first;
  }
  GemmPlan& plan = *it->second;
  if (!plan.has_algo()) {
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) return false;
    throw Error("cuBLASLt found no matmul algorithm for m=" + std::to_string(m) + " n=" + std::to_string(n) +
                    " k=" + std::to_string(k) + " (" + (dtype == ScalarType::kFloat32 ? "float32" : "bfloat16") +
                    ", epilogue " + epilogue_name(epilogue) + ", alignment A/B/D " + std::to_string(key.align_a) +
                    "/" + std::to_string(key.align_b) + "/" + std::to_string(key.align_c) +
                    " bytes); check the shapes and that the buffers are at least element-aligned",
                __FILE__, __LINE__);
  }
  plan.run(ctx.handle, ctx.workspace, ctx.workspace_bytes, 1.0f, a, b, beta, d, d, bias, epilogue, stream);
  return true;
}

std::size_t element_size(ScalarType dtype) { return dtype == ScalarType::kFloat32 ? 4 : 2; }

void check_linear_dtype(ScalarType dtype, const char* what) {
  DDP_CHECK(dtype == ScalarType::kFloat32 || dtype == ScalarType::kBFloat16,
            std::string(what) + ": dtype must be float32 or bfloat16");
}

void zero(void* p, std::int64_t elements, ScalarType dtype, cudaStream_t stream) {
  if (p == nullptr || elements <= 0) return;
  DDP_CUDA_CHECK(cudaMemsetAsync(p, 0, static_cast<std::size_t>(elements) * element_size(dtype), stream));
}

}  // namespace

void linear_forward(ScalarType dtype, MathMode math, const LinearShape& shape, const void* x, const void* w,
                    const void* bias, Activation act, void* y, void* pre_activation, StreamHandle stream) {
  check_linear_dtype(dtype, "linear_forward");
  DDP_CHECK(shape.batch >= 0 && shape.in >= 0 && shape.out >= 0, "linear_forward: negative shape");
  const std::int64_t batch = shape.batch, in = shape.in, out = shape.out;
  if (batch == 0 || out == 0) return;
  // With kGelu the GEMM result goes to pre_activation (when given), and y = gelu(pre_activation) afterwards.
  void* z = (act == Activation::kGelu && pre_activation != nullptr) ? pre_activation : y;
  if (in == 0) {  // an empty sum: z = 0, then bias and activation
    zero(z, batch * out, dtype, stream);
    detail::bias_activation(dtype, act, z, bias, act == Activation::kGelu ? pre_activation : nullptr, y, batch,
                            out, stream);
    return;
  }
  // Bias epilogues only with a 16-byte aligned bias: the MIN_ALIGNMENT preferences cover A, B, C and D but not the
  // bias vector, and a bias that is a view into a flat parameter buffer need not be aligned.
  const bool bias_fusable = bias == nullptr || alignment_of(bias) >= 16;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  if (bias_fusable) {
    if (act == Activation::kRelu) {
      epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    } else if (bias != nullptr) {
      epilogue = CUBLASLT_EPILOGUE_BIAS;
    }
  }
  // yᵀ[out, batch] = op_T(w)·x  (see the mapping at the top of this file)
  bool applied = false;  // bias (and ReLU) applied by the GEMM's epilogue
  if (epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
    applied = gemm(dtype, math, CUBLAS_OP_T, CUBLAS_OP_N, out, batch, in, w, in, x, in, 0.0f, z, out, epilogue,
                   bias, stream);
  }
  if (!applied) {
    gemm(dtype, math, CUBLAS_OP_T, CUBLAS_OP_N, out, batch, in, w, in, x, in, 0.0f, z, out,
         CUBLASLT_EPILOGUE_DEFAULT, nullptr, stream);
  }
  if (act == Activation::kGelu) {
    // z is pre_activation (or y). If the bias is still missing, add it and store the final pre_activation.
    const bool add_bias = !applied && bias != nullptr;
    detail::bias_activation(dtype, act, z, add_bias ? bias : nullptr, add_bias ? pre_activation : nullptr, y, batch,
                            out, stream);
  } else if (!applied && (bias != nullptr || act == Activation::kRelu)) {
    detail::bias_activation(dtype, act, z, bias, nullptr, y, batch, out, stream);
  }
}

void linear_backward(ScalarType dtype, MathMode math, const LinearShape& shape, const void* dy, const void* x,
                     const void* w, const void* y, const void* pre_activation, Activation act, void* dx, void* dw,
                     void* dbias, bool accumulate, void* scratch_dz, StreamHandle stream) {
  check_linear_dtype(dtype, "linear_backward");
  DDP_CHECK(shape.batch >= 0 && shape.in >= 0 && shape.out >= 0, "linear_backward: negative shape");
  const std::int64_t batch = shape.batch, in = shape.in, out = shape.out;
  if (batch == 0 || out == 0) {
    // No rows (or no outputs): the weight and bias gradients are empty sums, dx is 0.
    if (!accumulate) {
      zero(dw, out * in, dtype, stream);
      zero(dbias, out, dtype, stream);
    }
    zero(dx, batch * in, dtype, stream);
    return;
  }

  const void* dz = dy;
  bool dbias_done = false;
  if (act != Activation::kNone) {
    const void* saved = act == Activation::kRelu ? y : pre_activation;
    // dz and the bias gradient in one pass over dy.
    detail::activation_grad_bias(dtype, act, dy, saved, scratch_dz, dbias, accumulate, batch, out, stream);
    dz = scratch_dz;
    dbias_done = true;
  } else if (dbias == nullptr) {
    dbias_done = true;
  }

  if (dw != nullptr && in > 0) {
    // dwᵀ[in, out] (+)= x_cm[in, batch] · op_T(dz_cm[out, batch]); with kNone and overwrite, BGRADB reduces dz
    // over the batch into dbias in the same kernel.
    bool fused_bias = false;
    if (!dbias_done && !accumulate && alignment_of(dbias) >= 16) {
      fused_bias = gemm(dtype, math, CUBLAS_OP_N, CUBLAS_OP_T, in, out, batch, x, in, dz, out, 0.0f, dw, in,
                        CUBLASLT_EPILOGUE_BGRADB, dbias, stream);
      dbias_done = fused_bias;
    }
    if (!fused_bias) {
      gemm(dtype, math, CUBLAS_OP_N, CUBLAS_OP_T, in, out, batch, x, in, dz, out, accumulate ? 1.0f : 0.0f, dw,
           in, CUBLASLT_EPILOGUE_DEFAULT, nullptr, stream);
    }
  }
  if (!dbias_done) {
    detail::activation_grad_bias(dtype, Activation::kNone, dz, nullptr, nullptr, dbias, accumulate, batch, out,
                                 stream);
  }
  if (dx != nullptr && in > 0) {
    // dxᵀ[in, batch] = w_cm[in, out] · dz_cm[out, batch]
    gemm(dtype, math, CUBLAS_OP_N, CUBLAS_OP_N, in, batch, out, w, in, dz, out, 0.0f, dx, in,
         CUBLASLT_EPILOGUE_DEFAULT, nullptr, stream);
  }
}

}  // namespace ddp::kernels::cuda
