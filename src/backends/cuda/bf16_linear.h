// The fast profiles' bf16-valued products on the tensor cores: the grouped projection (V4's wo_a,
// spec §3.3), and (one group) the BF16 float weights whose inputs are bf16 values (the compressors,
// the indexer's head weights, the router's gate and the head: LinearParams::input_bf16). bf16
// operands, fp32 accumulation and output: on the project's wgmma kernels (kernels.h
// launch_bf16_wgmma_linear; `bf16_wgmma`) where K is a multiple of 64 and a group's rows are whole
// 128-row tiles, else through cuBLASLt's strided-batched GEMM, one batch entry per group. Which of
// the two runs depends on the shape alone; each is batch invariant on its own.
//
//   out[t, g*R + r] = sum_k bf16(W[g*R + r, k]) * bf16(in[t, g*K + k])   (fp32 sums)
//
// This is the reference's own arithmetic for wo_a (dequantised to BF16, a BF16 grouped einsum; spec
// §7 row 10): an FP8-block weight is exactly representable in bf16 and the fast profiles' inputs are
// bf16 values, so only the order of the fp32 sums differs from the CPU twin. An FP8 weight is
// decoded to bf16 on the device once and cached (twice the bytes of FP8: 64 MB for V4-Flash's wo_a);
// a BF16 one is used as uploaded. (The reference runs the compressors, the gate and the head in
// fp32 with the weights upcast: with bf16 inputs, the same products.)
//
// cuBLASLt's column-major view (group g of G):
//   A = W_g, [K, R] column-major, lda = K, op T, batch stride R*K
//   B = in_g, [K, T] column-major, ldb = G*K, op N, batch stride K
//   D = out_g, [R, T] column-major fp32, ldd = G*R, batch stride R
// Batch invariance: one algorithm per weight shape, chosen for kInvariantM rows without a split-K
// reduction and used for every T, so a token's row never depends on the other rows. Whether the
// GEMM can run depends only on the shapes and the library, never on T: a given weight always takes
// the same path.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <tuple>

#include "backends/cuda/cuda_state.h"
#include "backends/cuda/kernels.h"
#include "ops/backend.h"

namespace sparrow::cuda {

struct LtObjects;

class Bf16GroupedLinear {
 public:
  Bf16GroupedLinear();
  ~Bf16GroupedLinear();
  Bf16GroupedLinear(const Bf16GroupedLinear&) = delete;
  Bf16GroupedLinear& operator=(const Bf16GroupedLinear&) = delete;

  // out [T, N] from in [T, G*K] (fp32 storage, bf16 values) and w [N, K] (N = G*R): true when the
  // tensor cores ran it; false (nothing run) when the weight or the shapes do not suit them: w
  // neither FP8-block nor BF16, K or R not multiples of 8, no cuBLASLt or no algorithm. `device_weight` uploads w as stored (decoded to bf16 once).
  // `round_bf16`: the outputs rounded to bf16 (in the parts' sum where one runs, else a pass after).
  // With `parts`, the wgmma decode form's parts may be left for the caller's reader (kernels.h
  // PartsView): *parts says where the output is (out itself, or the parts in kept scratch, valid
  // until the next call; out then not written).
  bool run(float* out, const float* in, int64_t T, int64_t G, const WeightMatrix& w,
           const std::function<DevWeight()>& device_weight, bool round_bf16 = false, PartsView* parts = nullptr);
  static constexpr int64_t kInvariantM = 4096;
  // The project's wgmma kernels instead of cuBLASLt where the shapes suit them (test support; on
  // unless SPARROW_CUDA_DISABLE=bf16_wgmma), and whether the last GEMM ran on them.
  void set_wgmma(bool on) { wgmma_ = on; }
  bool last_wgmma() const { return last_wgmma_; }
  // Whether the last GEMM's kernel read the fp32 inputs itself (the decode form, `bf16_f32_in`), with
  // no conversion pass before it.
  bool last_f32_in() const { return last_f32_in_; }
  // Whether it read an FP8 weight's codes and scales as stored (`bf16_fp8_w`), not its bf16 copy.
  bool last_fp8_weights() const { return last_fp8_weights_; }
  // out [T, N1 + N2 + ...] from in [T, K] and the weights stacked row-wise (each one run() takes
  // with G = 1, one K), as one GEMM over the stack (decoded to bf16 once and cached): true when it
  // ran, false (nothing run) otherwise. `device_weight` uploads a weight as stored. `parts` as in run().
  bool run_stacked(float* out, const float* in, int64_t T, std::span<const WeightMatrix* const> ws,
                   const std::function<DevWeight(const WeightMatrix&)>& device_weight, PartsView* parts = nullptr);

 private:
  static bool takes(const WeightMatrix& w);  // FP8-block or BF16: exact bf16 values
  // Whether the project's wgmma kernels (launch_bf16_wgmma_linear) run this shape instead of
  // cuBLASLt (`bf16_wgmma`): a function of the shape alone, so a weight always takes one path.
  bool own_kernels(int64_t N, int64_t K, int64_t R) const;
  // The grouped GEMM of a bf16 weight already on the device (the plan of (R, K, G) must be ok).
  // `fresh_weight`: a_bf16 was written by the launch just before (its first use). `w8`: instead of
  // a_bf16, the FP8 weight as stored (the wgmma decode form only).
  void gemm(float* out, const float* in, int64_t T, int64_t G, int64_t R, int64_t K, const void* a_bf16,
            bool round_bf16 = false, bool fresh_weight = false, const DevWeight* w8 = nullptr,
            PartsView* parts = nullptr);
  struct Plan;  // a cached cuBLASLt algorithm for one (R, K, G), or none
  const Plan& plan(int64_t R, int64_t K, int64_t G);

  void* handle_ = nullptr;  // cublasLtHandle_t, created on first use
  WeightCache<DeviceBuffer> weights_;  // bf16 [N, K]
  WeightCache<DeviceBuffer> stacked_;  // bf16 stacks, keyed by the first weight
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<Plan>> plans_;
  static constexpr size_t kMaxDescribed = 1024;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, std::unique_ptr<LtObjects>> described_;  // (R, K, G, T)
  DeviceBuffer xb_;  // the bf16 input, kept between calls
  bool wgmma_ = cuda_feature_on("bf16_wgmma");
  bool last_wgmma_ = false;
  bool last_f32_in_ = false;
  bool last_fp8_weights_ = false;
  DeviceBuffer partial_;  // the wgmma kernels' part sums (bf16_wgmma_partial_floats), kept between calls
};

}  // namespace sparrow::cuda
