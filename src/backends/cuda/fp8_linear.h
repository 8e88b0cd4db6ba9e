// The CUDA backend's FP8 block-scaled linear (LinearFp8BlockParams), host side.
//
// Tensor-core path: the input is quantised on the device (launch_act_quant_fp8: e4m3 with one fp32
// power-of-two scale per token and 128 inputs) and multiplied with the FP8 weight by cuBLASLt
// (CUDA_R_8F_E4M3 operands, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F for the activations,
// BLK128x128_32F for the weight, fp32 accumulation and output; sm_90, cuBLAS >= 12.9). cuBLASLt is
// loaded at run time (dlopen), so binaries do not depend on it; without it, for weights that are not
// FP8 with 128x128 blocks, or when cuBLASLt has no algorithm for a shape, the fallback runs: the
// quantised input dequantised exactly, then the simple fp32 linear kernel (kernels_linear.cu).
// `last_path()` says which ran and why.
//
// cuBLASLt's column-major view of the row-major tensors (TN, as FP8 requires on Hopper):
//   A = weight,  [K_pad, N_pad] column-major, lda = K_pad, op T   (the row-major [N_pad, K_pad] copy)
//   B = input,   [K_pad, M_pad] column-major, ldb = K_pad, op N   (the row-major codes [M_pad, K_pad])
//   D = output,  [N_pad, M_pad] column-major, ldd = N_pad         (row-major [M_pad, N_pad], fp32)
// Padding: K_pad = K rounded up to 128 (so no K-block is partial), N_pad and M_pad to 16 (cuBLASLt
// wants 16-byte aligned dimensions for FP8 and M, N multiples of 4 for block scales). Padded inputs
// and weights are zero. Scale layouts (cuBLAS docs §3.1.4.5.1): A's BLK128x128 scales are K-major,
// [ceil(N/128)] columns of L4 = round_up(K_pad / 128, 4) values (the checkpoint's row-major
// [ceil(N/128), ceil(K/128)] with its rows padded to L4); B's VEC128 scales are [K_pad/128] columns
// of M_pad values (kernels.h ActQuantFp8Args).
//
// Not thread-safe (one per CudaBackend). Weights are converted once and cached like the backend's
// other uploads (by TensorView::id, or by host address checked against a fingerprint).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "backends/cuda/cuda_state.h"
#include "backends/cuda/kernels.h"
#include "ops/backend.h"

namespace sparrow::cuda {

enum class Fp8GemmPath : uint8_t { kNone, kTensorCores, kFallback };
struct LtObjects;

// The weight as the tensor-core path uploads it (host bytes): codes [n_pad, k_pad] e4m3, row-major,
// zero outside [N, K]; BLK128x128 scales [ceil(N / 128), l4] fp32 (e8m0 decoded exactly), zero in
// the padding columns. REQUIRES an FP8 weight with 128x128 blocks and E8M0 or F32 scales.
struct Fp8WeightLayout {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  int64_t n_pad = 0, k_pad = 0, l4 = 0;
};
Fp8WeightLayout fp8_weight_layout(const WeightMatrix& w);

class Fp8Linear {
 public:
  Fp8Linear();
  ~Fp8Linear();
  Fp8Linear(const Fp8Linear&) = delete;
  Fp8Linear& operator=(const Fp8Linear&) = delete;

  // out [T, N] = dequant(q(in [T, K])) · dequant(w [N, K])^T, rounded to bf16 when `round_bf16`
  // (in the wgmma kernels' quarter sum where one runs, else a pass after). `original` uploads w byte
  // for byte (the fallback's weight); it is called only when the fallback runs. With `parts`, the
  // 8-row wgmma form's quarters may be left for the caller's reader (kernels.h PartsView): *parts
  // says where the output is (p.out itself, or the quarters in kept scratch, valid until the next
  // call; p.out then not written).
  void run(const LinearFp8BlockParams& p, const std::function<DevWeight()>& original, bool round_bf16 = false,
           PartsView* parts = nullptr);

  // in [T, K] times several weights stacked row-wise ([N1 + N2 + ..., K], each FP8 with 128x128
  // blocks, each N a multiple of 128, one K) as one tensor-core GEMM: a pointer to the product
  // [M_pad, N1 + N2 + ...] row-major (kept scratch, valid until the next call; rows past T are
  // padding), or null when the stack cannot run that way (any weight refused, shapes, the
  // fallback forced, or cuBLASLt failing: run the linears one by one then). The stacked copy is
  // made on first use and cached like a single weight. With `parts` (where it ran), *parts is the
  // product's view: the returned pointer's rows, or the quarters left as run() leaves them.
  const float* run_stacked(const Tensor& in, std::span<const WeightMatrix* const> ws, PartsView* parts = nullptr);
  // While on (CudaBackend::linears of one input, not stacked): the first run's act_quant of an input
  // is kept and a later run of the same input tensor and K reuses its codes and scales (the same
  // values) instead of launching another. The caller guarantees the input is not written meanwhile
  // and turns it off after its runs.
  void keep_quantised(bool on) {
    keep_ = on;
    kept_in_ = nullptr;
  }
  // act_quant launches made by this object so far (test support).
  int64_t quantisations() const { return quantisations_; }
  // Test support: always take the fallback (false: choose as described above).
  void set_force_fallback(bool force) { force_fallback_ = force; }
  // One cuBLASLt algorithm per weight shape for every M (chosen for kInvariantM rows, no split-K
  // reduction), so that each row's result is independent of the other rows: what the model's fast
  // linears need (batch invariance, chunking invariance). Off: an algorithm per (M, N, K).
  void set_batch_invariant(bool on);
  // The batch-invariant linears on the project's wgmma kernel (kernels.h launch_fp8_wgmma_linear:
  // the W4A8 kernels' arithmetic with e4m3 weights) instead of cuBLASLt; `fp8_wgmma` (test support).
  void set_wgmma(bool on) { wgmma_ = on; }
  // The wgmma kernel's 8-row form quantising the rows itself (GroupedW4A8Args::x_f32) where it can,
  // instead of an act_quant launch first: `fp8_quant_in` (test support). The same bits either way.
  void set_quant_in(bool on) { quant_in_ = on; }
  static constexpr int64_t kInvariantM = 4096;
  Fp8GemmPath last_path() const { return last_path_; }
  // What ran, or why the fallback did (built on demand: the hot path keeps no strings).
  std::string last_detail() const;

 private:
  struct PaddedWeight {
    DeviceBuffer codes;   // [n_pad, k_pad] e4m3
    DeviceBuffer scales;  // [ceil(N/128), l4] fp32
    int64_t n_pad = 0, k_pad = 0, l4 = 0;
  };
  struct Plan;  // a cached cuBLASLt algorithm for one (M_pad, N_pad, K_pad), or why there is none

  // Empty string when the tensor-core path can take w; otherwise the reason it cannot.
  std::string tensor_core_refusal(const WeightMatrix& w) const;
  const PaddedWeight& padded_weight(const WeightMatrix& w);
  const PaddedWeight& stacked_weight(std::span<const WeightMatrix* const> ws);
  static PaddedWeight upload(const Fp8WeightLayout& l);  // to the device, kept (LongLived)
  // act_quant of in [T, K] into the kept codes and scales (the inputs in their order, for cuBLASLt
  // and the wgmma kernels alike); returns M_pad.
  int64_t quantise(const Tensor& in, int64_t K);
  // Whether the project's wgmma kernel (launch_fp8_wgmma_linear) runs the batch-invariant linears
  // instead of cuBLASLt (`fp8_wgmma`).
  bool wgmma_path() const { return batch_invariant_ && wgmma_ && !force_fallback_; }
  // d [T, n] (row stride n) = the linear of in [T, K] quantised (by the kernel itself where its
  // 8-row form can, `fp8_quant_in`: GroupedW4A8Args::x_f32; else by quantise) and pw's first n rows.
  // `leave_parts`: GroupedW4A8Args::leave_parts; returns the output's view.
  PartsView run_wgmma(float* d, const Tensor& in, int64_t K, int64_t n, const PaddedWeight& pw, bool round_bf16 = false,
                      bool leave_parts = false);
  // Runs the cuBLASLt GEMM into d [m_pad, n_pad]; false (with last_detail_ set) when it cannot.
  bool run_cublaslt(float* d, const uint8_t* codes, const float* scales, const PaddedWeight& pw, int64_t m_pad);
  // The handle, workspace and matmul descriptor (its fixed attributes set), made on first use.
  bool ensure_handle();
  // The A, B, D layouts of one (m_pad, n_pad, k_pad), made once (null when cuBLASLt refuses them).
  const LtObjects* layouts(int64_t m_pad, int64_t n_pad, int64_t k_pad);

  bool force_fallback_ = false;
  bool batch_invariant_ = false;
  bool wgmma_ = cuda_feature_on("fp8_wgmma");
  bool quant_in_ = cuda_feature_on("fp8_quant_in");
  bool last_wgmma_ = false;  // the last tensor-core run was the wgmma kernel
  DeviceBuffer partial_;     // its split forms' quarter sums (fp8_wgmma_linear_wants_partial)
  Fp8GemmPath last_path_ = Fp8GemmPath::kNone;
  std::string last_detail_;  // when last_path_ != kTensorCores
  int64_t last_m_ = 0, last_n_ = 0, last_k_ = 0;  // the last tensor-core GEMM's shape
  size_t last_workspace_ = 0;
  void* handle_ = nullptr;  // cublasLtHandle_t, created on first use
  DeviceBuffer workspace_;
  std::unique_ptr<LtObjects> desc_;  // the matmul descriptor; the scale pointers are set per call
  // Per-call scratch kept between calls (a step's linears would otherwise allocate and zero-fill
  // three buffers each): the quantised input's codes and scales, and the padded output.
  DeviceBuffer act_codes_, act_scales_, out_scratch_;
  bool keep_ = false;               // keep_quantised
  const float* kept_in_ = nullptr;  // the kept quantisation's input, rows, K and M_pad
  int64_t kept_T_ = 0, kept_K_ = 0, kept_m_pad_ = 0;
  int64_t quantisations_ = 0;
  WeightCache<PaddedWeight> weights_;
  WeightCache<PaddedWeight> stacked_;  // keyed by the first weight, fingerprinted by all
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<Plan>> plans_;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<LtObjects>> layouts_;
};

}  // namespace sparrow::cuda
