// The FP8 block-scaled linear's host side: the cuBLASLt call, the weight conversion and the fallback
// (layouts and padding: fp8_linear.h).
//
// cuBLASLt is opened at run time (cublaslt_api.h): a missing or old one only costs the tensor-core
// path (the fallback runs, and last_detail() says why).
#include "backends/cuda/fp8_linear.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "backends/cuda/cublaslt_api.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/step_graph.h"
#include "core/check.h"
#include "core/dtype.h"

namespace sparrow::cuda {
namespace {

// The cuBLAS docs recommend 32 MiB of workspace on Hopper.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// VEC128_32F and BLK128x128_32F arrived in cuBLAS 12.9 (CUDALibrarySamples issue 310; docs §3.1.4).
constexpr size_t kMinCublasLtVersion = 120900;

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The tensor-core path also needs a cuBLASLt new enough for these scale modes.
std::string lt_refusal() {
  const CublasLtApi& api = cublaslt_api();
  if (!api.error.empty()) return api.error;
  if (api.version < kMinCublasLtVersion)
    return api.library + " is cuBLASLt " + std::to_string(api.version) +
           "; block-scaled FP8 needs 120900 (12.9) or later";
  return {};
}

std::string dims(int64_t m, int64_t n, int64_t k) {
  return "m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k);
}

}  // namespace

struct Fp8Linear::Plan {
  bool ok = false;
  std::string why;  // when !ok
  cublasLtMatmulAlgo_t algo{};
  size_t workspace = 0;
};

Fp8Linear::Fp8Linear() = default;

Fp8Linear::~Fp8Linear() {
  if (handle_) cublaslt_api().destroy(static_cast<cublasLtHandle_t>(handle_));
}

std::string Fp8Linear::tensor_core_refusal(const WeightMatrix& w) const {
  if (std::string why = lt_refusal(); !why.empty()) return why;
  if (w.format != WeightFormat::kFp8Block || !w.scale.data) return "the weight is not FP8 (format " + std::to_string(static_cast<int>(w.format)) + ")";
  if (w.block_out != 128 || w.block_in != 128)
    return "the weight's scale blocks are " + std::to_string(w.block_out) + "x" + std::to_string(w.block_in) + ", not 128x128";
  if (dtype_size(w.data.dtype) != 1) return "the weight's codes are not bytes";
  if (w.scale.dtype != DType::kF8E8M0 && w.scale.dtype != DType::kF32) return "the weight's scales are neither E8M0 nor F32";
  return {};
}

Fp8WeightLayout fp8_weight_layout(const WeightMatrix& w) {
  const int64_t N = w.out, K = w.in;
  Fp8WeightLayout l;
  l.n_pad = round_up(N, 16);
  l.k_pad = round_up(K, kFp8ActBlock);
  const int64_t nb = (N + 127) / 128, L = l.k_pad / kFp8ActBlock;
  l.l4 = round_up(L, 4);
  SPARROW_CHECK(w.format == WeightFormat::kFp8Block && w.block_out == 128 && w.block_in == 128);
  SPARROW_CHECK(w.scale.dtype == DType::kF8E8M0 || w.scale.dtype == DType::kF32);
  SPARROW_CHECK(w.scale.shape.size() == 2 && w.scale.dim(0) == nb && w.scale.dim(1) == L);
  SPARROW_CHECK_EQ(w.data.numel(), N * K);
  // Rows of the stored [N, K] bytes.
  l.codes.assign(static_cast<size_t>(l.n_pad * l.k_pad), 0);
  const auto* src = static_cast<const uint8_t*>(w.data.data);
  for (int64_t n = 0; n < N; ++n) std::memcpy(l.codes.data() + n * l.k_pad, src + n * K, static_cast<size_t>(K));
  // The stored [nb, L] scales, each row padded to l4.
  l.scales.assign(static_cast<size_t>(nb * l.l4), 0.0f);
  for (int64_t r = 0; r < nb; ++r)
    for (int64_t c = 0; c < L; ++c) {
      float s;
      if (w.scale.dtype == DType::kF8E8M0) s = e8m0_to_f32(static_cast<const uint8_t*>(w.scale.data)[r * L + c]);
      else std::memcpy(&s, static_cast<const uint8_t*>(w.scale.data) + 4 * (r * L + c), 4);
      l.scales[r * l.l4 + c] = s;
    }
  return l;
}

Fp8Linear::PaddedWeight Fp8Linear::upload(const Fp8WeightLayout& l) {
  PaddedWeight pw;
  const LongLived weight;
  pw.codes = DeviceBuffer(l.codes.size());
  pw.scales = DeviceBuffer(l.scales.size() * sizeof(float));
  host_to_device(pw.codes.get(), l.codes.data(), l.codes.size());
  host_to_device(pw.scales.get(), l.scales.data(), l.scales.size() * sizeof(float));
  pw.n_pad = l.n_pad;
  pw.k_pad = l.k_pad;
  pw.l4 = l.l4;
  return pw;
}

const Fp8Linear::PaddedWeight& Fp8Linear::padded_weight(const WeightMatrix& w) {
  const int64_t n_pad = round_up(w.out, 16), k_pad = round_up(w.in, kFp8ActBlock);
  // Keyed by the codes' view (cuda_state.h WeightCache); the fingerprint covers the scales too.
  const uint64_t fp = view_fingerprint(w.data) * 31 + view_fingerprint(w.scale);
  if (const PaddedWeight* hit = weights_.find(w.data, fp); hit && hit->n_pad == n_pad && hit->k_pad == k_pad)
    return *hit;
  return weights_.put(w.data, fp, upload(fp8_weight_layout(w)));
}

const Fp8Linear::PaddedWeight& Fp8Linear::stacked_weight(std::span<const WeightMatrix* const> ws) {
  const uint64_t fp = stack_fingerprint(ws);
  if (const PaddedWeight* hit = stacked_.find(ws[0]->data, fp)) return *hit;
  // Each weight's padded layout (its N a multiple of 128: no padded rows, whole scale blocks), one
  // after the other: the codes' rows and the scales' block rows.
  Fp8WeightLayout st;
  for (const WeightMatrix* w : ws) {
    const Fp8WeightLayout l = fp8_weight_layout(*w);
    st.codes.insert(st.codes.end(), l.codes.begin(), l.codes.end());
    st.scales.insert(st.scales.end(), l.scales.begin(), l.scales.end());
    st.n_pad += l.n_pad;
    st.k_pad = l.k_pad;
    st.l4 = l.l4;
  }
  return stacked_.put(ws[0]->data, fp, upload(st));
}

bool Fp8Linear::ensure_handle() {
  if (desc_) return true;
  const CublasLtApi& lt = cublaslt_api();
  cublasStatus_t s;
  if (!handle_) {
    cublasLtHandle_t h = nullptr;
    if ((s = lt.create(&h)) != CUBLAS_STATUS_SUCCESS) {
      last_detail_ = "cublasLtCreate failed: " + cublaslt_status_text(s);
      return false;
    }
    handle_ = h;
    const LongLived kept;
    workspace_ = DeviceBuffer(kWorkspaceBytes);
  }
  auto o = std::make_unique<LtObjects>();
  if ((s = lt.desc_create(&o->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)) != CUBLAS_STATUS_SUCCESS) {
    last_detail_ = "cublasLtMatmulDescCreate failed: " + cublaslt_status_text(s);
    return false;
  }
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  const int32_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const int8_t fast_accum = 0;  // keep the periodic promotion to fp32 (the default, stated)
  const std::pair<cublasLtMatmulDescAttributes_t, std::pair<const void*, size_t>> attrs[] = {
      {CUBLASLT_MATMUL_DESC_TRANSA, {&op_t, sizeof(op_t)}},
      {CUBLASLT_MATMUL_DESC_TRANSB, {&op_n, sizeof(op_n)}},
      {CUBLASLT_MATMUL_DESC_A_SCALE_MODE, {&a_mode, sizeof(a_mode)}},
      {CUBLASLT_MATMUL_DESC_B_SCALE_MODE, {&b_mode, sizeof(b_mode)}},
      {CUBLASLT_MATMUL_DESC_FAST_ACCUM, {&fast_accum, sizeof(fast_accum)}},
  };
  for (const auto& [attr, value] : attrs)
    if ((s = lt.desc_set(o->desc, attr, value.first, value.second)) != CUBLAS_STATUS_SUCCESS) {
      last_detail_ = "cublasLtMatmulDescSetAttribute(" + std::to_string(static_cast<int>(attr)) +
                     ") failed: " + cublaslt_status_text(s);
      return false;
    }
  desc_ = std::move(o);
  return true;
}

const LtObjects* Fp8Linear::layouts(int64_t m_pad, int64_t n_pad, int64_t k_pad) {
  std::unique_ptr<LtObjects>& l = layouts_[{m_pad, n_pad, k_pad}];
  if (l) {
    if (!l->a) last_detail_ = "cublasLtMatrixLayoutCreate failed for " + dims(n_pad, m_pad, k_pad);
    return l->a ? l.get() : nullptr;
  }
  l = std::make_unique<LtObjects>();
  const CublasLtApi& lt = cublaslt_api();
  cublasStatus_t s;
  if ((s = lt.layout_create(&l->a, CUDA_R_8F_E4M3, k_pad, n_pad, k_pad)) != CUBLAS_STATUS_SUCCESS ||
      (s = lt.layout_create(&l->b, CUDA_R_8F_E4M3, k_pad, m_pad, k_pad)) != CUBLAS_STATUS_SUCCESS ||
      (s = lt.layout_create(&l->d, CUDA_R_32F, n_pad, m_pad, n_pad)) != CUBLAS_STATUS_SUCCESS) {
    last_detail_ = "cublasLtMatrixLayoutCreate failed for " + dims(n_pad, m_pad, k_pad) + ": " + cublaslt_status_text(s);
    l = std::make_unique<LtObjects>();  // remembered as refused (a stays null)
    return nullptr;
  }
  return l.get();
}

bool Fp8Linear::run_cublaslt(float* d, const uint8_t* codes, const float* scales, const PaddedWeight& pw, int64_t m_pad) {
  const CublasLtApi& lt = cublaslt_api();
  const int64_t n_pad = pw.n_pad, k_pad = pw.k_pad;
  // cuBLASLt's m, n, k: rows of D (weight rows), columns of D (tokens), the reduction.
  if (!ensure_handle()) return false;
  const LtObjects* o = layouts(m_pad, n_pad, k_pad);
  if (!o) return false;
  cublasStatus_t s;
  const void* a_scale = pw.scales.get();
  const void* b_scale = scales;
  if ((s = lt.desc_set(desc_->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale))) !=
          CUBLAS_STATUS_SUCCESS ||
      (s = lt.desc_set(desc_->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale))) !=
          CUBLAS_STATUS_SUCCESS) {
    last_detail_ = "cublasLtMatmulDescSetAttribute(scale pointers) failed: " + cublaslt_status_text(s);
    return false;
  }

  // Batch-invariant mode: one algorithm per weight shape, chosen for kInvariantM tokens and used
  // for every M, with no split-K reduction, so that a token's row never depends on how many rows
  // share the GEMM (the rows of a tile are independent and the K loop is the same).
  std::unique_ptr<Plan>& plan = plans_[{batch_invariant_ ? 0 : m_pad, n_pad, k_pad}];
  if (!plan) {
    plan = std::make_unique<Plan>();
    const uint64_t ws = kWorkspaceBytes;
    const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    LtObjects pref;
    const LtObjects* ref = batch_invariant_ ? layouts(kInvariantM, n_pad, k_pad) : o;  // the layouts it is chosen for
    if (!ref) {
      plan->why = last_detail_;
    } else if ((s = lt.pref_create(&pref.pref)) != CUBLAS_STATUS_SUCCESS ||
        (s = lt.pref_set(pref.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws))) != CUBLAS_STATUS_SUCCESS ||
        (batch_invariant_ && (s = lt.pref_set(pref.pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &no_reduction,
                                              sizeof(no_reduction))) != CUBLAS_STATUS_SUCCESS)) {
      plan->why = "cublasLtMatmulPreference failed: " + cublaslt_status_text(s);
    } else if ((s = lt.heuristic(static_cast<cublasLtHandle_t>(handle_), desc_->desc, ref->a, ref->b, ref->d, ref->d,
                                 pref.pref, 1, &result, &returned)) != CUBLAS_STATUS_SUCCESS) {
      plan->why = "cublasLtMatmulAlgoGetHeuristic failed: " + cublaslt_status_text(s);
    } else if (returned == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
      plan->why = "cublasLtMatmulAlgoGetHeuristic returned no algorithm";
    } else {
      plan->ok = true;
      plan->algo = result.algo;
      plan->workspace = result.workspaceSize;
    }
  }
  if (!plan->ok) {
    last_detail_ = plan->why + " for " + dims(n_pad, m_pad, k_pad);
    return false;
  }
  const float alpha = 1.0f, beta = 0.0f;
  s = lt.matmul(static_cast<cublasLtHandle_t>(handle_), desc_->desc, &alpha, pw.codes.get(), o->a, codes, o->b, &beta, d,
                o->d, d, o->d, &plan->algo, workspace_.get(), kWorkspaceBytes, launch_stream());
  if (s != CUBLAS_STATUS_SUCCESS) {
    last_detail_ = "cublasLtMatmul failed for " + dims(n_pad, m_pad, k_pad) + ": " + cublaslt_status_text(s);
    return false;
  }
  last_m_ = m_pad, last_n_ = n_pad, last_k_ = k_pad;
  last_workspace_ = plan->workspace;
  return true;
}

std::string Fp8Linear::last_detail() const {
  if (last_path_ != Fp8GemmPath::kTensorCores) return last_detail_;
  if (last_wgmma_) return "wgmma kernel (launch_fp8_wgmma_linear), " + dims(last_n_, last_m_, last_k_);
  const CublasLtApi& lt = cublaslt_api();
  return "cuBLASLt " + std::to_string(lt.version) + " (" + lt.library + "), " + dims(last_n_, last_m_, last_k_) +
         ", workspace " + std::to_string(last_workspace_) + " B";
}

void Fp8Linear::set_batch_invariant(bool on) {
  if (on != batch_invariant_) plans_.clear();
  batch_invariant_ = on;
}

int64_t Fp8Linear::quantise(const Tensor& in, int64_t K) {
  const int64_t T = in.dim(0);
  // in is [T, K]; codes [m_pad, k_pad], scales [k_pad / 128, m_pad] (kernels.h ActQuantFp8Args).
  const int64_t m_pad = round_up(T, 16), k_pad = round_up(K, kFp8ActBlock);
  if (keep_ && kept_in_ == in.f32() && kept_T_ == T && kept_K_ == K) return kept_m_pad_;  // (keep_quantised)
  // act_quant writes every padded code and scale, so the kept buffers need no clearing.
  act_codes_.ensure(static_cast<size_t>(m_pad * k_pad));
  act_scales_.ensure(static_cast<size_t>(k_pad / kFp8ActBlock * m_pad) * sizeof(float));
  launch_act_quant_fp8({.codes = static_cast<uint8_t*>(act_codes_.get()), .scales = act_scales_.f32(), .in = in.f32(),
                        .in_dtype = DType::kF32, .rows = T, .K = K, .in_stride = K, .rows_pad = m_pad, .k_pad = k_pad});
  launch_check("linear_fp8_block activation quantisation");
  ++quantisations_;
  if (keep_) kept_in_ = in.f32(), kept_T_ = T, kept_K_ = K, kept_m_pad_ = m_pad;
  return m_pad;
}

PartsView Fp8Linear::run_wgmma(float* d, const Tensor& in, int64_t K, int64_t n, const PaddedWeight& pw, bool round_bf16,
                               bool leave_parts) {
  const int64_t T = in.dim(0);
  GroupedW4A8Args g{};
  g.out = d;
  g.round_bf16 = round_bf16;
  g.k_pad = pw.k_pad;
  g.N = n;
  g.K = pw.k_pad;
  g.rows_total = T;
  g.w_codes = static_cast<const uint8_t*>(pw.codes.get());
  g.w_scales = static_cast<const float*>(pw.scales.get());
  g.w_scale_ld = pw.l4;
  if (fp8_wgmma_linear_wants_partial(T, n)) {  // K's quarters may run in separate blocks
    partial_.ensure(static_cast<size_t>(4 * T * n) * sizeof(float));
    g.partial = partial_.f32();
  }
  g.leave_parts = leave_parts;
  // The kernel's 8-row form quantises the rows itself where it can (`fp8_quant_in`); else act_quant
  // first (or the codes kept from the previous run of this input, keep_quantised).
  g.x_f32 = in.f32(), g.x_ld = K, g.x_k = K;
  if (!quant_in_ || (keep_ && kept_in_ == in.f32()) || !fp8_wgmma_quant_in_takes(g)) {
    g.x_f32 = nullptr;
    g.rows_pad = quantise(in, K);
    g.codes = static_cast<const uint8_t*>(act_codes_.get());
    g.scales = act_scales_.f32();
  }
  const PartsView view = launch_fp8_wgmma_linear(g);
  launch_check("linear_fp8_block wgmma");
  last_path_ = Fp8GemmPath::kTensorCores;
  last_wgmma_ = true;
  last_m_ = round_up(T, 16), last_n_ = pw.n_pad, last_k_ = pw.k_pad;
  return view;
}

const float* Fp8Linear::run_stacked(const Tensor& in, std::span<const WeightMatrix* const> ws, PartsView* parts) {
  if (force_fallback_ || ws.empty()) return nullptr;
  const int64_t K = ws[0]->in, T = in.dim(0);
  int64_t N = 0;
  for (const WeightMatrix* w : ws) {
    if (w->in != K || w->out % 128 != 0 || !tensor_core_refusal(*w).empty()) return nullptr;
    N += w->out;
  }
  SPARROW_CHECK(K > 0 && in.type() == ElemType::kF32);
  SPARROW_CHECK_EQ(in.numel(), T * K);
  if (T == 0) return nullptr;
  const PaddedWeight& pw = stacked_weight(ws);
  out_scratch_.ensure(static_cast<size_t>(round_up(T, 16) * N) * sizeof(float));
  if (wgmma_path()) {
    const PartsView view = run_wgmma(out_scratch_.f32(), in, K, N, pw, false, parts != nullptr);
    if (parts) *parts = view;
    return out_scratch_.f32();
  }
  const int64_t m_pad = quantise(in, K);
  if (!run_cublaslt(out_scratch_.f32(), static_cast<const uint8_t*>(act_codes_.get()), act_scales_.f32(), pw, m_pad))
    return nullptr;
  launch_check("linear_fp8_block cuBLASLt (stacked)");
  last_path_ = Fp8GemmPath::kTensorCores;
  last_wgmma_ = false;
  if (parts) *parts = PartsView(out_scratch_.f32());
  return out_scratch_.f32();
}

void Fp8Linear::run(const LinearFp8BlockParams& p, const std::function<DevWeight()>& original, bool round_bf16,
                    PartsView* parts) {
  if (parts) *parts = PartsView(p.out.f32());  // (unless the quarters are left below)
  const WeightMatrix& w = *p.weight;
  const int64_t T = p.in.dim(0), K = w.in, N = w.out;
  SPARROW_CHECK(K > 0 && p.in.type() == ElemType::kF32 && p.out.type() == ElemType::kF32);
  SPARROW_CHECK_EQ(p.in.numel(), T * K);
  SPARROW_CHECK_EQ(p.out.numel(), T * N);
  if (T == 0 || N == 0) {
    last_path_ = Fp8GemmPath::kNone;
    last_detail_ = "empty";
    return;
  }
  std::string why = force_fallback_ ? std::string("forced (set_force_fallback)") : tensor_core_refusal(w);
  if (why.empty() && wgmma_path()) {
    const PaddedWeight& pw = padded_weight(w);
    const PartsView view = run_wgmma(p.out.f32(), p.in, K, N, pw, round_bf16, parts != nullptr);
    if (parts) *parts = view;
    return;
  }
  const auto round_after = [&] {
    if (!round_bf16) return;
    launch_bf16_round(p.out.f32(), T * N);
    launch_check("linear_fp8_block bf16 rounding");
  };
  const int64_t m_pad = quantise(p.in, K), k_pad = round_up(K, kFp8ActBlock);
  const auto* codes = static_cast<const uint8_t*>(act_codes_.get());
  const float* scales = act_scales_.f32();

  if (why.empty()) {
    const PaddedWeight& pw = padded_weight(w);
    // D is [m_pad, n_pad] row-major: the output itself when nothing is padded.
    const bool direct = pw.n_pad == N && m_pad == T;
    float* d = p.out.f32();
    if (!direct) {  // cuBLASLt writes all of D
      out_scratch_.ensure(static_cast<size_t>(m_pad * pw.n_pad) * sizeof(float));
      d = out_scratch_.f32();
    }
    if (run_cublaslt(d, codes, scales, pw, m_pad)) {
      if (!direct)
        SPARROW_CUDA_CHECK(cudaMemcpy2DAsync(p.out.f32(), N * sizeof(float), d, pw.n_pad * sizeof(float),
                                             N * sizeof(float), T, cudaMemcpyDeviceToDevice, launch_stream()));
      launch_check("linear_fp8_block cuBLASLt");
      last_path_ = Fp8GemmPath::kTensorCores;
      last_wgmma_ = false;
      round_after();
      return;
    }
    why = last_detail_;
  }
  // Fallback: the quantised input dequantised exactly, then the fp32 linear kernel over the weight as
  // stored (decoded element by element, fp32 FMA).
  DeviceBuffer x(static_cast<size_t>(T * K) * sizeof(float));
  launch_act_dequant_fp8({.out = x.f32(), .codes = codes, .scales = scales,
                          .rows = T, .K = K, .rows_pad = m_pad, .k_pad = k_pad});
  launch_check("linear_fp8_block dequantisation");
  launch_linear({.out = p.out.f32(), .in = x.f32(), .in_rows = nullptr, .w = original(), .T = T, .in_stride = K,
                 .rows_per_group = N});
  launch_check("linear_fp8_block fallback");
  last_path_ = Fp8GemmPath::kFallback;
  last_detail_ = why;
  round_after();
}

}  // namespace sparrow::cuda
