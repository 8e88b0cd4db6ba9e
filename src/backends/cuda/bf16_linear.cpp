// The bf16 grouped projection on the tensor cores (layouts and numerics: bf16_linear.h).
#include "backends/cuda/bf16_linear.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <utility>

#include "backends/cuda/cublaslt_api.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/step_graph.h"
#include "core/check.h"
#include "core/dtype.h"

namespace sparrow::cuda {

struct Bf16GroupedLinear::Plan {
  bool ok = false;  // false: no cuBLASLt, or no algorithm for the shape (the caller's kernels run)
  cublasLtMatmulAlgo_t algo{};
};

Bf16GroupedLinear::Bf16GroupedLinear() = default;

Bf16GroupedLinear::~Bf16GroupedLinear() {
  if (handle_) cublaslt_api().destroy(static_cast<cublasLtHandle_t>(handle_));
}

namespace {

// The matmul descriptor and the A, B, D layouts of one grouped GEMM of T rows.
cublasStatus_t describe(LtObjects& o, int64_t R, int64_t K, int64_t G, int64_t T) {
  const CublasLtApi& lt = cublaslt_api();
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  const int32_t groups = static_cast<int32_t>(G);
  const int64_t stride_a = R * K, stride_b = K, stride_d = R;
  cublasStatus_t s;
  if ((s = lt.desc_create(&o.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) != CUBLAS_STATUS_SUCCESS ||
      (s = lt.desc_set(o.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t))) != CUBLAS_STATUS_SUCCESS ||
      (s = lt.desc_set(o.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n))) != CUBLAS_STATUS_SUCCESS ||
      (s = lt.layout_create(&o.a, CUDA_R_16BF, K, R, K)) != CUBLAS_STATUS_SUCCESS ||
      (s = lt.layout_create(&o.b, CUDA_R_16BF, K, T, G * K)) != CUBLAS_STATUS_SUCCESS ||
      (s = lt.layout_create(&o.d, CUDA_R_32F, R, T, G * R)) != CUBLAS_STATUS_SUCCESS)
    return s;
  const std::pair<cublasLtMatrixLayout_t, int64_t> strided[] = {{o.a, stride_a}, {o.b, stride_b}, {o.d, stride_d}};
  for (const auto& [layout, stride] : strided)
    if ((s = lt.layout_set(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &groups, sizeof(groups))) != CUBLAS_STATUS_SUCCESS ||
        (s = lt.layout_set(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride))) !=
            CUBLAS_STATUS_SUCCESS)
      return s;
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

const Bf16GroupedLinear::Plan& Bf16GroupedLinear::plan(int64_t R, int64_t K, int64_t G) {
  std::unique_ptr<Plan>& p = plans_[{R, K, G}];
  if (p) return *p;
  p = std::make_unique<Plan>();
  const CublasLtApi& lt = cublaslt_api();
  if (!lt.error.empty()) return *p;
  if (!handle_) {
    cublasLtHandle_t h = nullptr;
    if (lt.create(&h) != CUBLAS_STATUS_SUCCESS) return *p;
    handle_ = h;
  }
  LtObjects o;
  const uint64_t no_workspace = 0;
  const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  p->ok = describe(o, R, K, G, kInvariantM) == CUBLAS_STATUS_SUCCESS &&
          lt.pref_create(&o.pref) == CUBLAS_STATUS_SUCCESS &&
          lt.pref_set(o.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &no_workspace, sizeof(no_workspace)) ==
              CUBLAS_STATUS_SUCCESS &&
          lt.pref_set(o.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_reduction, sizeof(no_reduction)) ==
              CUBLAS_STATUS_SUCCESS &&
          lt.heuristic(static_cast<cublasLtHandle_t>(handle_), o.desc, o.a, o.b, o.d, o.d, o.pref, 1, &result,
                       &returned) == CUBLAS_STATUS_SUCCESS &&
          returned > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (p->ok) p->algo = result.algo;
  return *p;
}

bool Bf16GroupedLinear::takes(const WeightMatrix& w) {
  return (w.format == WeightFormat::kFp8Block && dtype_size(w.data.dtype) == 1) ||
         (w.format == WeightFormat::kFloat && w.data.dtype == DType::kBF16);
}

bool Bf16GroupedLinear::run_stacked(float* out, const float* in, int64_t T, std::span<const WeightMatrix* const> ws,
                                    const std::function<DevWeight(const WeightMatrix&)>& device_weight,
                                    PartsView* parts) {
  if (ws.empty()) return false;
  const int64_t K = ws[0]->in;
  int64_t N = 0;
  for (const WeightMatrix* w : ws) {
    // Each part's rows start 16-byte aligned in the stack (N a multiple of 8).
    if (!takes(*w) || w->in != K || w->out % 8 != 0) return false;
    N += w->out;
  }
  if (K % 8 != 0 || !(own_kernels(N, K, N) || plan(N, K, 1).ok)) return false;
  if (T == 0) return true;
  const uint64_t fp = stack_fingerprint(ws);
  const DeviceBuffer* st = stacked_.find(ws[0]->data, fp);
  bool fresh = false;
  if (!st) {
    const LongLived weight;
    DeviceBuffer b(static_cast<size_t>(N * K) * sizeof(uint16_t));
    int64_t row = 0;
    for (const WeightMatrix* w : ws) {
      uint16_t* dst = static_cast<uint16_t*>(b.get()) + row * K;
      const size_t bytes = static_cast<size_t>(w->out * K) * sizeof(uint16_t);
      if (w->format == WeightFormat::kFloat && w->data.nbytes == bytes) {
        // BF16 as stored: straight from the host, so no device copy of the weight alone is kept
        // beside the stack (device_weight caches what it uploads).
        host_to_device(dst, w->data.data, bytes);
      } else {
        launch_weight_to_bf16(device_weight(*w), dst);
        SPARROW_CUDA_CHECK(cudaGetLastError());
      }
      row += w->out;
    }
    st = &stacked_.put(ws[0]->data, fp, std::move(b));
    fresh = true;
  }
  gemm(out, in, T, 1, N, K, st->get(), false, fresh, nullptr, parts);
  return true;
}

bool Bf16GroupedLinear::run(float* out, const float* in, int64_t T, int64_t G, const WeightMatrix& w,
                            const std::function<DevWeight()>& device_weight, bool round_bf16, PartsView* parts) {
  SPARROW_CHECK(G > 0 && w.out % G == 0);
  const int64_t N = w.out, K = w.in, R = N / G;
  // 16-byte aligned leading dimensions and batch strides for every operand.
  if (!takes(w) || K % 8 != 0 || R % 8 != 0) return false;
  if (!own_kernels(N, K, R) && !plan(R, K, G).ok) return false;
  if (T == 0 || N == 0) return true;
  // An FP8 weight is read as stored by the decode form (`bf16_fp8_w`), where the block scales
  // cover whole 64-row, 64-input steps: its bf16 copy is not made for decoding.
  static const bool fp8_w = cuda_feature_on("bf16_fp8_w");
  if (fp8_w && w.format == WeightFormat::kFp8Block && own_kernels(N, K, R) && bf16_wgmma_reads_f32(T) &&
      w.block_out % 64 == 0 && w.block_in % 64 == 0) {
    const DevWeight dw = device_weight();
    if (reinterpret_cast<uintptr_t>(dw.data) % 16 == 0) {
      gemm(out, in, T, G, R, K, nullptr, round_bf16, false, &dw, parts);
      return true;
    }
  }
  // A BF16 weight is used as uploaded; an FP8 one is decoded to bf16 once.
  const void* a_bf16 = nullptr;
  bool fresh = false;
  if (w.format == WeightFormat::kFloat) {
    a_bf16 = device_weight().data;
  } else {
    const uint64_t fp = view_fingerprint(w.data) * 31 + view_fingerprint(w.scale);
    const DeviceBuffer* wb = weights_.find(w.data, fp);
    if (!wb) {
      const LongLived weight;
      DeviceBuffer b(static_cast<size_t>(N * K) * sizeof(uint16_t));
      launch_weight_to_bf16(device_weight(), static_cast<uint16_t*>(b.get()));
      SPARROW_CUDA_CHECK(cudaGetLastError());
      wb = &weights_.put(w.data, fp, std::move(b));
      fresh = true;
    }
    a_bf16 = wb->get();
  }
  gemm(out, in, T, G, R, K, a_bf16, round_bf16, fresh, nullptr, parts);
  return true;
}

bool Bf16GroupedLinear::own_kernels(int64_t N, int64_t K, int64_t R) const {
  return wgmma_ && bf16_wgmma_linear_takes(N, K, R);
}

void Bf16GroupedLinear::gemm(float* out, const float* in, int64_t T, int64_t G, int64_t R, int64_t K, const void* a_bf16,
                             bool round_bf16, bool fresh_weight, const DevWeight* w8, PartsView* parts) {
  if (parts) *parts = PartsView(out);  // (unless the parts are left below)
  static const bool f32_in = cuda_feature_on("bf16_f32_in");
  const bool own = own_kernels(G * R, K, R), decode_form = own && bf16_wgmma_reads_f32(T);
  SPARROW_CHECK((w8 == nullptr || decode_form) && "e4m3 weights only in the wgmma decode form");
  // The decode form reads the fp32 inputs itself, unless the weight's bf16 copy was written just now
  // (by the launch right before: the kernel reads its first weight steps before its wait, which
  // sees only what launches two back or earlier wrote).
  const bool reads_f32 = decode_form && f32_in && !fresh_weight && reinterpret_cast<uintptr_t>(in) % 16 == 0;
  if (!reads_f32) {
    xb_.ensure(static_cast<size_t>(T * G * K) * sizeof(uint16_t));
    launch_f32_to_bf16(in, static_cast<uint16_t*>(xb_.get()), T * G * K);
    SPARROW_CUDA_CHECK(cudaGetLastError());
  }
  last_f32_in_ = reads_f32;
  last_fp8_weights_ = w8 != nullptr;
  if (own) {
    const int64_t N = G * R;
    partial_.ensure(static_cast<size_t>(bf16_wgmma_partial_floats(T, N)) * sizeof(float));
    const PartsView view = launch_bf16_wgmma_linear({.out = out, .partial = partial_.f32(),
                              .x = reads_f32 ? nullptr : static_cast<const uint16_t*>(xb_.get()),
                              .x_f32 = reads_f32 ? in : nullptr,
                              .w = static_cast<const uint16_t*>(a_bf16), .w8 = w8 != nullptr ? *w8 : DevWeight{},
                              .rows = T, .x_ld = G * K,
                              .N = static_cast<int>(N), .K = static_cast<int>(K), .R = static_cast<int>(R),
                              .round_bf16 = round_bf16, .leave_parts = parts != nullptr});
    if (parts) *parts = view;
    launch_check("bf16 linear (wgmma)");
    last_wgmma_ = true;
    return;
  }
  last_wgmma_ = false;
  const Plan& pl = plan(R, K, G);
  // The layouts of this T, described once (a serving run sees a bounded set of batch sizes; the
  // cache is emptied should it ever hold more than kMaxDescribed).
  if (described_.size() > kMaxDescribed) described_.clear();
  std::unique_ptr<LtObjects>& o = described_[{R, K, G, T}];
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  if (!o) {
    o = std::make_unique<LtObjects>();
    if ((s = describe(*o, R, K, G, T)) != CUBLAS_STATUS_SUCCESS) o.reset();
  }
  const CublasLtApi& lt = cublaslt_api();
  const float alpha = 1.0f, beta = 0.0f;
  if (o)
    s = lt.matmul(static_cast<cublasLtHandle_t>(handle_), o->desc, &alpha, a_bf16, o->a, xb_.get(), o->b, &beta, out,
                  o->d, out, o->d, &pl.algo, nullptr, 0, launch_stream());
  // The plan was accepted for this shape: a failure here is a bug or a broken library, not a path choice.
  SPARROW_CHECK(s == CUBLAS_STATUS_SUCCESS && "cuBLASLt bf16 grouped GEMM failed");
  if (round_bf16) launch_bf16_round(out, T * G * R);
}

}  // namespace sparrow::cuda
