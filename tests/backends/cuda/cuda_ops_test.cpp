// Every CUDA op against the CPU reference op on seeded random inputs with odd sizes, including the
// sparse and MoE edge cases (index -1, fewer visible entries than top-k, a query with nothing but
// the sink, an expert no token picks, the SwiGLU clamp active) and both routed-scale placements.
// Each test skips cleanly when no GPU is present.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <bit>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <stdexcept>
#include <string>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>

#include "backends/cpu/cpu_state.h"
#include "backends/cuda/attn_layout.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/fp4_layout.h"
#include "backends/cuda/tile_raster.h"
#include "backends/cuda/kernels.h"
#include "core/kv_record.h"
#include "core/quant_sim.h"
#include "cuda_test_util.h"
#include "runtime/session.h"

namespace sparrow {
namespace {

// One bf16 ulp (the bf16-rounded ops: the fp32 sums they round may differ in the last bits).
constexpr Tolerance kBf16Tol{.atol = 1e-6, .rtol = 1.0 / 128, .max_cosine_distance = 1e-5};

using namespace cuda_test;

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override { SPARROW_REQUIRE_GPU(gpu); }

  // The same host values on both backends.
  std::pair<Tensor, Tensor> both_f32(const std::vector<float>& v, const std::vector<int64_t>& shape) {
    return {cpu->upload_f32(v, shape), gpu->upload_f32(v, shape)};
  }
  std::pair<Tensor, Tensor> both_i32(const std::vector<int32_t>& v, const std::vector<int64_t>& shape) {
    return {cpu->upload_i32(v, shape), gpu->upload_i32(v, shape)};
  }
  std::pair<Tensor, Tensor> both_alloc(ElemType type, const std::vector<int64_t>& shape) {
    return {cpu->alloc(type, shape), gpu->alloc(type, shape)};
  }
  // indexer_topk with bf16 operands on both backends, from the same q and head weights (batches bc
  // and bg the same positions): indices [T, k] and scores [T, C]. Defined with the indexer tests.
  struct IndexerBoth indexer_both_bf16(const std::pair<Tensor, Tensor>& q, const std::pair<Tensor, Tensor>& w,
                                       const BatchInfo& bc, const BatchInfo& bg, int64_t m, int64_t k, int64_t C);
  // Defined with the W4A8 MoE tests below.
  struct W4A8Inputs w4a8_inputs(Rng& rng, const std::vector<int32_t>& experts, int64_t T, int64_t K, int64_t F = 96,
                                int64_t D = 256);
  // Defined with the attention tests below.
  void check_attention_bf16_weights(AttentionParams w, const Tensor& exact, AttentionParams fp32_path,
                                    AttentionParams on_cpu, const std::string& what);
  void check_attention_block_shapes(const AttentionParams& p, const std::vector<float>& want, const std::string& what);
  void check_attention_every_kind(int64_t window, int64_t k, int64_t masked_from,
                                  std::initializer_list<std::pair<int64_t, int64_t>> batches, uint64_t seed,
                                  int64_t H = 3);

  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> gpu;
};

BatchInfo simple_batch(const std::vector<int32_t>& ids, int64_t first_pos = 0) {
  BatchInfo b;
  b.token_ids = ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    b.positions.push_back(first_pos + static_cast<int64_t>(i));
    b.seq_of_token.push_back(0);
  }
  b.seqs = {nullptr};
  b.seq_begin = {0};
  b.seq_end = {static_cast<int64_t>(ids.size())};
  return b;
}

// ---- decoding of every stored format (exact: embed copies dequantised rows) ----------------------

TEST_F(CudaOps, EmbedDecodesEveryFormatExactly) {
  Rng rng(11);
  const std::vector<int32_t> ids = {3, 0, 6, 3, 1, 5};
  const BatchInfo batch = simple_batch(ids);
  const int64_t T = static_cast<int64_t>(ids.size()), S = 3;
  std::vector<std::pair<std::string, StoredMatrix>> tables;
  tables.emplace_back("f32", float_matrix(DType::kF32, 7, 45, rng.normal(7 * 45)));
  tables.emplace_back("bf16", float_matrix(DType::kBF16, 7, 45, rng.normal(7 * 45)));
  tables.emplace_back("f16", f16_matrix(rng, 7, 45));
  {
    // Every e4m3 code (NaN codes replaced by 0) and every finite e8m0 scale, 0 (2^-127) included.
    StoredMatrix m = fp8_matrix(rng, 15, 259, 1, 16, DType::kF8E8M0);
    auto& codes = *m.data.bytes;
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = (i % 256 == 0x7f || i % 256 == 0xff) ? 0 : i % 256;
    auto& scales = *m.scale.bytes;
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(i % 255);
    tables.emplace_back("fp8_e8m0_all_codes", m);
  }
  tables.emplace_back("fp8_f32_scales", fp8_matrix(rng, 7, 300, 4, 128, DType::kF32));
  {
    StoredMatrix m = fp4_matrix(rng, 9, 64);
    auto& scales = *m.scale.bytes;
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(i * 15 % 255);
    tables.emplace_back("fp4", m);
  }
  for (auto& [name, m] : tables) {
    const int64_t D = m.w.in;
    auto [c, g] = both_alloc(ElemType::kF32, {T, S, D});
    cpu->embed({.out = c, .table = &m.w}, batch);
    gpu->embed({.out = g, .table = &m.w}, batch);
    expect_close(*gpu, g, *cpu, c, kExact, "embed " + name);
  }
}

// The same bits in every element (NaN matches any NaN: the device's NaN arithmetic gives the
// canonical NaN, the host's keeps the payload), and the shared comparator at zero tolerance.
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const CompareResult c = compare_f32(got, want, kExact);
  EXPECT_TRUE(c.ok) << what << ": " << c.message;
  int64_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) && std::isnan(want[i])) continue;
    if (f32_to_bits(got[i]) == f32_to_bits(want[i])) continue;
    if (++mismatches <= 5)
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " (0x" << std::hex << f32_to_bits(got[i])
                    << ") want " << want[i] << " (0x" << f32_to_bits(want[i]) << std::dec << ")";
  }
  EXPECT_EQ(mismatches, 0) << what;
}

// ---- mHC ----------------------------------------------------------------------------------------

TEST_F(CudaOps, HcPreMatchesCpu) {
  Rng rng(21);
  // V4-Flash's width (4 streams x 4096): 24 mix rows of 16384 per token; from 2048 tokens the mix
  // tiles (2050: registers, the rows not whole chunks of the shared-memory ring; 2049: the ring,
  // a partial tile of one token at the end).
  for (auto [S, D, T, iters] :
       {std::tuple{3, 37, 5, 20}, std::tuple{4, 29, 3, 1}, std::tuple{2, 64, 1, 20}, std::tuple{4, 4096, 3, 20},
        std::tuple{4, 64, 2050, 20}, std::tuple{4, 1024, 2049, 20}}) {
    const int64_t mix = (2 + S) * S;
    Stored fn = stored_floats(DType::kF32, {mix, S * D}, rng.normal(mix * S * D, 0.1));
    Stored base = stored_floats(DType::kF32, {mix}, rng.normal(mix));
    Stored scale = stored_floats(DType::kF32, {3}, rng.uniform(3, 0.5, 1.5));
    HcWeights w{.fn = fn.view, .base = base.view, .scale = scale.view};
    auto [xc, xg] = both_f32(rng.normal(T * S * D), {T, S, D});
    auto [uc, ug] = both_alloc(ElemType::kF32, {T, D});
    auto [pc, pg] = both_alloc(ElemType::kF32, {T, S});
    auto [cc, cg] = both_alloc(ElemType::kF32, {T, S, S});
    cpu->hc_pre({.out_input = uc, .out_post = pc, .out_comb = cc, .streams = xc, .weights = &w, .sinkhorn_iters = iters,
                 .hc_eps = 1e-6, .norm_eps = 1e-6});
    gpu->hc_pre({.out_input = ug, .out_post = pg, .out_comb = cg, .streams = xg, .weights = &w, .sinkhorn_iters = iters,
                 .hc_eps = 1e-6, .norm_eps = 1e-6});
    const std::string tag = " S=" + std::to_string(S) + " iters=" + std::to_string(iters);
    expect_close(*gpu, ug, *cpu, uc, kOpTol, "hc_pre input" + tag);
    expect_close(*gpu, pg, *cpu, pc, kOpTol, "hc_pre post" + tag);
    expect_close(*gpu, cg, *cpu, cc, kOpTol, "hc_pre comb" + tag);
  }
}

// The mix dot products run one mix a block for a few tokens, 4 tokens x 8 mixes a block from 16
// tokens on, 8 x 8 from 2048 (through a shared-memory ring where the rows are whole chunks of 512:
// D = 256 and 4096 with S = 4; in registers for D = 96), and the rest of hc_pre a block a token or,
// for S = 4, 1 to 8 tokens a block by T: each (token, mix) sum is the same either way, so a token's
// outputs are the same bits in calls of 4100 tokens (partial tiles of 4 at the end), 21 (a partial
// tile of 1) and 3; S = 4 (24 mixes) and S = 2 (8).
TEST_F(CudaOps, HcPreIsBatchInvariant) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(24);
  for (auto [S, D] : {std::pair<int64_t, int64_t>{4, 256}, std::pair<int64_t, int64_t>{2, 96},
                      std::pair<int64_t, int64_t>{4, 4096}}) {
    const int64_t mix = (2 + S) * S, sizes[3] = {4100, 21, 3};
    const int64_t T = sizes[0];
    Stored fn = stored_floats(DType::kF32, {mix, S * D}, rng.normal(mix * S * D, 0.1));
    Stored base = stored_floats(DType::kF32, {mix}, rng.normal(mix));
    Stored scale = stored_floats(DType::kF32, {3}, rng.uniform(3, 0.5, 1.5));
    HcWeights w{.fn = fn.view, .base = base.view, .scale = scale.view};
    const std::vector<float> x = rng.normal(T * S * D);
    std::vector<float> outs[3][3];
    for (int r = 0; r < 3; ++r) {
      const int64_t n = sizes[r];
      const Tensor xg = gpu->upload_f32(std::vector<float>(x.begin(), x.begin() + n * S * D), {n, S, D});
      const Tensor ug = gpu->alloc(ElemType::kF32, {n, D}), pg = gpu->alloc(ElemType::kF32, {n, S}),
                   cg = gpu->alloc(ElemType::kF32, {n, S, S});
      gpu->hc_pre({.out_input = ug, .out_post = pg, .out_comb = cg, .streams = xg, .weights = &w, .sinkhorn_iters = 20,
                   .hc_eps = 1e-6, .norm_eps = 1e-6});
      outs[r][0] = gpu->download_f32(ug);
      outs[r][1] = gpu->download_f32(pg);
      outs[r][2] = gpu->download_f32(cg);
    }
    const std::string tag = " S=" + std::to_string(S);
    const int64_t per[3] = {D, S, S * S};
    for (int o = 0; o < 3; ++o)
      for (auto [big, small] : {std::pair{0, 1}, std::pair{0, 2}, std::pair{1, 2}})
        expect_same_bits(std::vector<float>(outs[big][o].begin(), outs[big][o].begin() + sizes[small] * per[o]),
                         outs[small][o],
                         "hc_pre output " + std::to_string(o) + " " + std::to_string(sizes[big]) + " vs " +
                             std::to_string(sizes[small]) + " tokens" + tag);
  }
}

TEST_F(CudaOps, HcPostMatchesCpu) {
  Rng rng(22);
  const int64_t T = 6, S = 3, D = 41;
  auto [xc, xg] = both_f32(rng.normal(T * S * D), {T, S, D});
  auto [yc, yg] = both_f32(rng.normal(T * D), {T, D});
  auto [pc, pg] = both_f32(rng.uniform(T * S, 0, 2), {T, S});
  auto [cc, cg] = both_f32(rng.uniform(T * S * S, 0, 1), {T, S, S});
  cpu->hc_post({.streams = xc, .sublayer = yc, .post = pc, .comb = cc});
  gpu->hc_post({.streams = xg, .sublayer = yg, .post = pg, .comb = cg});
  expect_close(*gpu, xg, *cpu, xc, kOpTol, "hc_post");
}

// Backend::hc_boundary (the sub-layer before's hc_post, hc_pre, the input's rms_norm) in one kernel
// at decode sizes (opt-in: the test turns it on): streams, u, post and comb the same bits as the
// three ops' kernels (the default body, called here by name) and close to the CPU's. D = 4096
// (V4-Flash: a block's norm order) and 512 (a warp's norm order); 1 to 16 tokens; with and without
// the hc_post before, bf16 roundings on and off, weighted and unweighted norms, mix scales other
// than 1 (at 1, as in the synthetic checkpoints, `mix * scale + base` is exact whether or not it
// is one fma, which hid a difference there); and calls the kernel does not take (17 tokens,
// D = 2304, bf16 mix weights), which must give the same. The fused call runs twice: the kernel's
// arrival counters must be back at zero after each call.
TEST_F(CudaOps, HcBoundaryIsItsThreeOpsBitForBit) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  const bool was = cuda::hc_fused(*gpu);
  cuda::set_hc_fused(*gpu, true);
  Rng rng(25);
  constexpr int64_t S = 4, mix = (2 + S) * S;
  struct Case {
    int64_t D, T;
    bool post, round, bf16_fn, weighted;
  };
  const Case cases[] = {{4096, 1, true, false, false, true}, {4096, 3, false, false, false, true},
                        {4096, 16, true, true, false, true}, {4096, 2, true, true, false, false},
                        {512, 1, true, false, false, true},  {512, 16, false, true, false, true},
                        {512, 5, true, false, true, true},   {2304, 3, true, false, false, true},
                        {4096, 17, true, false, false, true}};
  for (const Case& k : cases) {
    const int64_t D = k.D, T = k.T;
    const std::string tag = " D=" + std::to_string(D) + " T=" + std::to_string(T) + (k.post ? " post" : "") +
                            (k.round ? " round" : "") + (k.bf16_fn ? " bf16-fn" : "") + (k.weighted ? "" : " unweighted");
    const bool fits = T <= cuda::kHcBoundaryMaxTokens && D != 2304 && !k.bf16_fn;
    EXPECT_EQ(cuda::hc_boundary_fits(T, S, D, !k.bf16_fn, DType::kBF16), fits) << tag;
    Stored fn = stored_floats(k.bf16_fn ? DType::kBF16 : DType::kF32, {mix, S * D}, rng.normal(mix * S * D, 0.05));
    Stored base = stored_floats(DType::kF32, {mix}, rng.normal(mix));
    Stored scale = stored_floats(DType::kF32, {3}, rng.uniform(3, 0.5, 1.5));
    Stored nw = stored_floats(DType::kBF16, {D}, rng.normal(D, 1.0, 0.3));
    const HcWeights w{.fn = fn.view, .base = base.view, .scale = scale.view};
    const std::vector<float> x = rng.normal(T * S * D), y = rng.normal(T * D), post = rng.uniform(T * S, 0, 2),
                             comb = rng.uniform(T * S * S, 0, 1);
    // One backend's run from fresh copies of the inputs: streams, u, post, comb.
    const auto run = [&](Backend& b, bool fused) {
      const Tensor xs = b.upload_f32(x, {T, S, D}), ys = b.upload_f32(y, {T, D}), ps = b.upload_f32(post, {T, S}),
                   cs = b.upload_f32(comb, {T, S, S});
      const Tensor u = b.alloc(ElemType::kF32, {T, D}), po = b.alloc(ElemType::kF32, {T, S}),
                   co = b.alloc(ElemType::kF32, {T, S, S});
      const HcBoundaryParams hp{
          .post = {.streams = xs, .sublayer = k.post ? ys : Tensor(), .post = ps, .comb = cs, .round_bf16 = k.round},
          .pre = {.out_input = u, .out_post = po, .out_comb = co, .streams = xs, .weights = &w, .sinkhorn_iters = 20,
                  .hc_eps = 1e-6, .norm_eps = 1e-6, .round_bf16 = k.round},
          .norm_weight = k.weighted ? nw.view : TensorView{},
          .norm_eps = 1e-6,
          .norm_round_bf16 = k.round};
      if (fused) {
        b.hc_boundary(hp);
        EXPECT_EQ(cuda::last_hc_boundary_fused(b), fits) << tag;
      } else {
        b.Backend::hc_boundary(hp);
      }
      return std::array<std::vector<float>, 4>{b.download_f32(xs), b.download_f32(u), b.download_f32(po),
                                               b.download_f32(co)};
    };
    const auto want = run(*gpu, false);
    const char* names[4] = {"streams", "u", "post", "comb"};
    for (int r = 0; r < 2; ++r) {
      const auto got = run(*gpu, true);
      for (int o = 0; o < 4; ++o)
        expect_same_bits(got[o], want[o], std::string("hc_boundary ") + names[o] + " call " + std::to_string(r) + tag);
    }
    const auto ref = run(*cpu, false);
    // Unrounded: fp32 sums in another order, about 1e-7 of the streams' size (a few units). Rounded,
    // one flipped bf16 rounding of a stream value (an ulp: 2^-8 of up to about 4) moves u by pre_j
    // times that, which is large next to a u near 0: hence the absolute term; elsewhere u and the
    // norm's output each rounded, two bf16 ulps apart at most.
    const Tolerance tol = k.round ? Tolerance{.atol = 2e-2, .rtol = 2.0 / 128, .max_cosine_distance = 1e-5}
                                  : Tolerance{.atol = 1e-5, .rtol = 1e-4, .max_cosine_distance = 1e-9};
    for (int o = 0; o < 4; ++o) {
      const CompareResult c = compare_f32(want[o], ref[o], tol);
      EXPECT_TRUE(c.ok) << "hc_boundary " << names[o] << " vs the CPU" << tag << ": " << c.message;
    }
  }
  cuda::set_hc_fused(*gpu, was);
}

TEST_F(CudaOps, HcHeadMatchesCpu) {
  Rng rng(23);
  const int64_t T = 3, S = 4, D = 29;
  Stored fn = stored_floats(DType::kF32, {S, S * D}, rng.normal(S * S * D, 0.1));
  Stored base = stored_floats(DType::kF32, {S}, rng.normal(S));
  Stored scale = stored_floats(DType::kF32, {1}, {0.7f});
  HcWeights w{.fn = fn.view, .base = base.view, .scale = scale.view};
  auto [xc, xg] = both_f32(rng.normal(T * S * D), {T, S, D});
  auto [oc, og] = both_alloc(ElemType::kF32, {T, D});
  cpu->hc_head({.out = oc, .streams = xc, .weights = &w, .hc_eps = 1e-6, .norm_eps = 1e-6});
  gpu->hc_head({.out = og, .streams = xg, .weights = &w, .hc_eps = 1e-6, .norm_eps = 1e-6});
  expect_close(*gpu, og, *cpu, oc, kOpTol, "hc_head");
}

// ---- norms, linear layers, RoPE -----------------------------------------------------------------

TEST_F(CudaOps, RmsNormWeightedUnweightedAndOutOfPlace) {
  Rng rng(31);
  const int64_t T = 7;
  Stored w = stored_floats(DType::kBF16, {53}, rng.normal(53, 0.5, 1.0));
  {
    auto [xc, xg] = both_f32(rng.normal(T * 53, 3.0), {T, 53});
    cpu->rms_norm({.out = xc, .in = xc, .weight = w.view, .group = 53, .eps = 1e-6});
    gpu->rms_norm({.out = xg, .in = xg, .weight = w.view, .group = 53, .eps = 1e-6});
    expect_close(*gpu, xg, *cpu, xc, kOpTol, "rms_norm weighted in place");
  }
  {
    auto [xc, xg] = both_f32(rng.normal(T * 51), {T, 3, 17});
    auto [oc, og] = both_alloc(ElemType::kF32, {T, 3, 17});
    cpu->rms_norm({.out = oc, .in = xc, .weight = {}, .group = 17, .eps = 1e-6});
    gpu->rms_norm({.out = og, .in = xg, .weight = {}, .group = 17, .eps = 1e-6});
    expect_close(*gpu, og, *cpu, oc, kOpTol, "rms_norm unweighted groups");
    expect_close(*gpu, xg, *cpu, xc, kExact, "rms_norm input untouched");
  }
}

// Every row kernel rms_norm picks by the group (a warp a row in registers up to 512 and 1024, with
// loops up to 2048; a block a row in registers up to 4096, with loops beyond) and by the call's
// size (loops past 2^23 values: 2100 rows of 4096), weighted and rounded to bf16, at one row and at
// several, against the CPU.
TEST_F(CudaOps, RmsNormEveryRowKernel) {
  Rng rng(32);
  for (int64_t group : {53, 700, 1500, 3000, 4096, 5000}) {
    Stored w = stored_floats(DType::kBF16, {group}, rng.normal(group, 0.5, 1.0));
    for (int64_t rows : {int64_t{1}, int64_t{9}, group == 4096 ? int64_t{2100} : int64_t{2}}) {
      for (bool round : {false, true}) {
        auto [xc, xg] = both_f32(rng.normal(rows * group, 2.0), {rows, group});
        auto [oc, og] = both_alloc(ElemType::kF32, {rows, group});
        cpu->rms_norm({.out = oc, .in = xc, .weight = w.view, .group = group, .eps = 1e-6, .round_bf16 = round});
        gpu->rms_norm({.out = og, .in = xg, .weight = w.view, .group = group, .eps = 1e-6, .round_bf16 = round});
        expect_close(*gpu, og, *cpu, oc, round ? kBf16Tol : kOpTol,
                     "rms_norm group " + std::to_string(group) + " rows " + std::to_string(rows) +
                         (round ? " bf16" : ""));
      }
    }
  }
}

TEST_F(CudaOps, LinearEveryWeightFormat) {
  Rng rng(41);
  std::vector<std::pair<std::string, StoredMatrix>> ws;
  ws.emplace_back("f32", float_matrix(DType::kF32, 33, 67, rng.normal(33 * 67, 1.0 / std::sqrt(67.0))));
  ws.emplace_back("bf16", float_matrix(DType::kBF16, 29, 45, rng.normal(29 * 45, 1.0 / std::sqrt(45.0))));
  ws.emplace_back("f16", f16_matrix(rng, 13, 31));
  ws.emplace_back("fp8_e8m0_128", fp8_matrix(rng, 131, 259, 128, 128, DType::kF8E8M0));
  ws.emplace_back("fp8_f32_partial_tiles", fp8_matrix(rng, 37, 150, 16, 64, DType::kF32));
  ws.emplace_back("fp4", fp4_matrix(rng, 37, 96));
  ws.emplace_back("fp4 tiled rows", fp4_matrix(rng, 128, 384));  // fp4_layout.h: fp4_tiles(128, 192)
  for (auto& [name, m] : ws) {
    for (int64_t T : {1, 5, 19}) {
      const int64_t K = m.w.in, N = m.w.out;
      auto [xc, xg] = both_f32(rng.normal(T * K), {T, K});
      auto [oc, og] = both_alloc(ElemType::kF32, {T, N});
      cpu->linear({.out = oc, .in = xc, .weight = &m.w});
      gpu->linear({.out = og, .in = xg, .weight = &m.w});
      expect_close(*gpu, og, *cpu, oc, kOpTol, "linear " + name + " T=" + std::to_string(T));
    }
  }
}

// The fast profiles' vectorized kernel (LinearArgs::vectorized; linear with act_quant_fp8): FP8
// block and packed FP4 weights whose K suits 16-byte chunks, against the CPU (same quantised input,
// fp64 sums) at the op bar; and batch invariance: each token's row of a 19-token call is the same
// bits as that token alone. K = 200 (not a multiple of 16) must take the element-wise kernel.
// With SPARROW_CUDA_DISABLE=vec_linear every case takes the element-wise kernel; with
// fp8_gemm on (the default) the FP8 cases run on cuBLASLt, whose sums round differently
// (CudaFp8Linear.* hold that path to the CPU twin and to batch invariance), so they are left out.
TEST_F(CudaOps, LinearVectorizedMatchesCpuAndIsBatchInvariant) {
  const bool real = std::string(gpu->name()) == "cuda";
  const bool vec_on = cuda::cuda_feature_on("vec_linear"), fp8_gemm = cuda::cuda_feature_on("fp8_gemm");
  Rng rng(43);
  struct Case {
    std::string name;
    StoredMatrix m;
    bool vectorizable;
  };
  std::vector<Case> cases;
  cases.push_back({"fp8 131x4096", fp8_matrix(rng, 131, 4096, 128, 128, DType::kF8E8M0), true});
  cases.push_back({"fp8 37x272 (partial scale block)", fp8_matrix(rng, 37, 272, 128, 128, DType::kF32), true});
  cases.push_back({"fp8 33x200", fp8_matrix(rng, 33, 200, 128, 128, DType::kF8E8M0), false});
  cases.push_back({"fp4 37x96", fp4_matrix(rng, 37, 96), true});
  cases.push_back({"fp4 29x4096", fp4_matrix(rng, 29, 4096), true});
  cases.push_back({"fp4 128x1536 (tiled rows)", fp4_matrix(rng, 128, 1536), true});
  for (auto& c : cases) {
    if (fp8_gemm && c.name.starts_with("fp8")) continue;
    const int64_t K = c.m.w.in, N = c.m.w.out, T = 19;
    const std::vector<float> x = rng.normal(T * K);
    auto [xc, xg] = both_f32(x, {T, K});
    auto [oc, og] = both_alloc(ElemType::kF32, {T, N});
    cpu->linear({.out = oc, .in = xc, .weight = &c.m.w, .act_quant_fp8 = true});
    gpu->linear({.out = og, .in = xg, .weight = &c.m.w, .act_quant_fp8 = true});
    if (real) {
      EXPECT_EQ(cuda::last_linear_vectorized(*gpu), c.vectorizable && vec_on) << c.name;
    }
    expect_close(*gpu, og, *cpu, oc, kOpTol, "vectorized linear " + c.name);
    const std::vector<float> all = gpu->download_f32(og);
    for (int64_t t : {int64_t{0}, int64_t{7}, T - 1}) {
      const Tensor one = gpu->upload_f32(std::vector<float>(x.begin() + t * K, x.begin() + (t + 1) * K), {1, K});
      const Tensor o1 = gpu->alloc(ElemType::kF32, {1, N});
      gpu->linear({.out = o1, .in = one, .weight = &c.m.w, .act_quant_fp8 = true});
      const std::vector<float> alone = gpu->download_f32(o1);
      for (int64_t n = 0; n < N; ++n)
        ASSERT_EQ(alone[n], all[t * N + n]) << c.name << ": token " << t << " output " << n
                                            << " differs alone and in a batch of " << T;
    }
  }
}

// Each value rounded to bf16 (the fast profiles' activations).
std::vector<float> host_bf16(std::vector<float> v) {
  for (auto& x : v) x = bf16_round(x);
  return v;
}

// The element-wise kernel (the fp32 profile's, and float weights' without bf16 inputs) over many
// tokens: a token's row of a 70-token call (nine tiles of 8 tokens) is that token alone, bit for
// bit, for BF16, F32 and FP8 weights, N = 37 and K = 300; and within the op bar of the CPU.
TEST_F(CudaOps, LinearManyTokensGivesTheOneTokenBits) {
  Rng rng(45);
  const int64_t T = 70, N = 37, K = 300;
  std::vector<std::pair<std::string, StoredMatrix>> ws;
  ws.emplace_back("bf16", float_matrix(DType::kBF16, N, K, rng.normal(N * K, 0.1)));
  ws.emplace_back("f32", float_matrix(DType::kF32, N, K, rng.normal(N * K, 0.1)));
  ws.emplace_back("fp8", fp8_matrix(rng, N, K, 16, 16, DType::kF8E8M0));
  for (auto& [name, m] : ws) {
    const std::vector<float> x = rng.normal(T * K);
    auto [xc, xg] = both_f32(x, {T, K});
    auto [oc, og] = both_alloc(ElemType::kF32, {T, N});
    cpu->linear({.out = oc, .in = xc, .weight = &m.w});
    gpu->linear({.out = og, .in = xg, .weight = &m.w});
    expect_close(*gpu, og, *cpu, oc, kOpTol, "linear 70 tokens " + name);
    const std::vector<float> all = gpu->download_f32(og);
    for (int64_t t : {int64_t{0}, int64_t{33}, T - 1}) {
      const Tensor one = gpu->upload_f32(std::vector<float>(x.begin() + t * K, x.begin() + (t + 1) * K), {1, K});
      const Tensor o1 = gpu->alloc(ElemType::kF32, {1, N});
      gpu->linear({.out = o1, .in = one, .weight = &m.w});
      const std::vector<float> alone = gpu->download_f32(o1);
      for (int64_t n = 0; n < N; ++n)
        ASSERT_EQ(f32_to_bits(alone[n]), f32_to_bits(all[t * N + n]))
            << name << ": token " << t << " output " << n << " differs alone and among 70";
    }
  }
}

// A BF16 weight with bf16-valued inputs (LinearParams::input_bf16: the compressors, the gate, the
// head under the fast profiles) runs as a bf16 GEMM on the tensor cores when N and K are multiples
// of 8 (bf16_gemm), else on the element-wise kernel: within the op bar of the CPU's fp32 products
// either way (the products are exact; only the order of the sums differs), and batch invariant.
TEST_F(CudaOps, LinearWithBf16InputsUnderBf16Gemm) {
  const bool real = std::string(gpu->name()) == "cuda";
  Rng rng(46);
  const int64_t T = 37, K = 264;
  for (const auto& [N, tensor_cores] : {std::pair<int64_t, bool>{40, true}, std::pair<int64_t, bool>{37, false}}) {
    const std::string tag = "N=" + std::to_string(N);
    const StoredMatrix m = float_matrix(DType::kBF16, N, K, rng.normal(N * K, 0.1));
    const std::vector<float> x = host_bf16(rng.normal(T * K));
    auto [xc, xg] = both_f32(x, {T, K});
    auto [oc, og] = both_alloc(ElemType::kF32, {T, N});
    cpu->linear({.out = oc, .in = xc, .weight = &m.w, .input_bf16 = true});
    gpu->linear({.out = og, .in = xg, .weight = &m.w, .input_bf16 = true});
    if (real) {
      EXPECT_EQ(cuda::last_linear_tensor_cores(*gpu), tensor_cores && cuda::cuda_feature_on("bf16_gemm")) << tag;
    }
    expect_close(*gpu, og, *cpu, oc, kOpTol, "linear bf16 inputs " + tag);
    const std::vector<float> all = gpu->download_f32(og);
    for (int64_t t : {int64_t{0}, int64_t{17}, T - 1}) {
      const Tensor one = gpu->upload_f32(std::vector<float>(x.begin() + t * K, x.begin() + (t + 1) * K), {1, K});
      const Tensor o1 = gpu->alloc(ElemType::kF32, {1, N});
      gpu->linear({.out = o1, .in = one, .weight = &m.w, .input_bf16 = true});
      const std::vector<float> alone = gpu->download_f32(o1);
      for (int64_t n = 0; n < N; ++n)
        ASSERT_EQ(f32_to_bits(alone[n]), f32_to_bits(all[t * N + n])) << tag << ": token " << t << " output " << n;
    }
  }
}

TEST_F(CudaOps, GroupedLinearMatchesCpu) {
  Rng rng(42);
  const int64_t T = 11, G = 3, R = 7, Kg = 19;
  std::vector<std::pair<std::string, StoredMatrix>> ws;
  ws.emplace_back("bf16", float_matrix(DType::kBF16, G * R, Kg, rng.normal(G * R * Kg, 0.3)));
  ws.emplace_back("fp8", fp8_matrix(rng, G * R, Kg, 8, 8, DType::kF8E8M0));
  for (auto& [name, m] : ws) {
    auto [xc, xg] = both_f32(rng.normal(T * G * Kg), {T, G * Kg});
    auto [oc, og] = both_alloc(ElemType::kF32, {T, G * R});
    cpu->grouped_linear({.out = oc, .in = xc, .weight = &m.w, .groups = G});
    gpu->grouped_linear({.out = og, .in = xg, .weight = &m.w, .groups = G});
    expect_close(*gpu, og, *cpu, oc, kOpTol, "grouped_linear " + name);
  }
}

// Under the reduced-precision profiles (round_bf16: bf16-valued inputs) a grouped FP8 projection
// shaped like V4's wo_a (128x128 blocks) runs as a bf16 GEMM on the tensor cores when its group
// rows R and inputs K are multiples of 8 (bf16_gemm), else on the vectorized kernel: within a bf16
// ulp of the CPU either way, and batch invariant (a token alone gives its row of a batch of 37 bit
// for bit). fp32 keeps the element-wise kernel.
TEST_F(CudaOps, GroupedLinearUnderBf16Profiles) {
  const bool real = std::string(gpu->name()) == "cuda";
  Rng rng(44);
  const int64_t T = 37;
  struct Case {
    int64_t G, R, Kg;
    bool tensor_cores;  // with bf16_gemm on
  };
  for (const Case c : {Case{2, 136, 256, true}, Case{8, 40, 384, true}, Case{2, 132, 256, false}}) {
    const int64_t G = c.G, R = c.R, Kg = c.Kg;
    const std::string tag = "G=" + std::to_string(G) + " R=" + std::to_string(R) + " K=" + std::to_string(Kg);
    const StoredMatrix m = fp8_matrix(rng, G * R, Kg, 128, 128, DType::kF8E8M0);
    const std::vector<float> x = host_bf16(rng.normal(T * G * Kg));
    auto [xc, xg] = both_f32(x, {T, G * Kg});
    auto [oc, og] = both_alloc(ElemType::kF32, {T, G * R});
    cpu->grouped_linear({.out = oc, .in = xc, .weight = &m.w, .groups = G, .round_bf16 = true});
    gpu->grouped_linear({.out = og, .in = xg, .weight = &m.w, .groups = G, .round_bf16 = true});
    if (real) {
      const bool tc = c.tensor_cores && cuda::cuda_feature_on("bf16_gemm");
      EXPECT_EQ(cuda::last_linear_tensor_cores(*gpu), tc) << tag;
      EXPECT_EQ(cuda::last_linear_vectorized(*gpu), !tc && cuda::cuda_feature_on("vec_linear")) << tag;
    }
    expect_close(*gpu, og, *cpu, oc, kBf16Tol, "grouped_linear fp8 bf16 " + tag);
    const std::vector<float> all = gpu->download_f32(og);
    for (int64_t t : {int64_t{0}, int64_t{6}, T - 1}) {
      const Tensor one = gpu->upload_f32(std::vector<float>(x.begin() + t * G * Kg, x.begin() + (t + 1) * G * Kg), {1, G * Kg});
      const Tensor o1 = gpu->alloc(ElemType::kF32, {1, G * R});
      gpu->grouped_linear({.out = o1, .in = one, .weight = &m.w, .groups = G, .round_bf16 = true});
      const std::vector<float> alone = gpu->download_f32(o1);
      for (int64_t n = 0; n < G * R; ++n)
        ASSERT_EQ(alone[n], all[t * G * R + n]) << tag << ": token " << t << " output " << n << " differs alone and in a batch";
    }
    // fp32 keeps the element-wise kernel.
    gpu->grouped_linear({.out = og, .in = xg, .weight = &m.w, .groups = G});
    if (real) {
      EXPECT_FALSE(cuda::last_linear_vectorized(*gpu)) << tag;
      EXPECT_FALSE(cuda::last_linear_tensor_cores(*gpu)) << tag;
    }
  }
}

// The bf16 GEMMs (bf16_gemm) on the project's wgmma kernels (bf16_wgmma) and on cuBLASLt: every
// row the same bits alone and in batches of 37 (the wgmma decode form: 8-row items, K's 16 parts in
// separate blocks), 300 and 4100 (the TMA form's 128 x 128 tiles, its parts split where the tiles
// number fewer than the SMs, whole otherwise), for a grouped FP8 weight shaped like wo_a (rows of a
// group in whole 128-row tiles) and BF16 weights with bf16 inputs, N not a multiple of 64, K of
// fewer steps than parts (empty parts) and N past 8192 (4 parts, not 16) among them; within the op bar of the CPU's fp32 sums of the same products.
// (With SPARROW_CUDA_DISABLE=bf16_tma, the decode form in 64-row chunks: the same bits.)
TEST_F(CudaOps, Bf16GemmsAreBatchInvariantOnWgmmaAndCuBlasLt) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  if (!cuda::cuda_feature_on("bf16_gemm")) GTEST_SKIP() << "bf16_gemm is off";
  Rng rng(47);
  struct Case {
    int64_t G, R, K;
    bool fp8;  // a grouped FP8 weight (grouped_linear, round_bf16), else a BF16 one (linear, input_bf16)
  };
  for (const bool wgmma : {true, false}) {
    cuda::set_bf16_wgmma(*gpu, wgmma);
    for (const Case c : {Case{2, 128, 1152, true}, Case{8, 128, 256, true}, Case{1, 72, 192, false},
                         Case{1, 1000, 4096, false}, Case{1, 8200, 1088, false}}) {
      const int64_t G = c.G, R = c.R, K = c.K, N = G * R, W = G * K;  // W: a row's inputs
      const std::string tag = std::string(wgmma ? "wgmma" : "cuBLASLt") + " G=" + std::to_string(G) +
                              " R=" + std::to_string(R) + " K=" + std::to_string(K);
      const StoredMatrix m = c.fp8 ? fp8_matrix(rng, N, K, 128, 128, DType::kF8E8M0)
                                   : float_matrix(DType::kBF16, N, K, rng.normal(N * K, 0.05));
      const int64_t T = 300;
      const std::vector<float> x = host_bf16(rng.normal(T * W));
      auto run = [&](Backend& b, const std::vector<float>& in, int64_t rows) {
        const Tensor xt = b.upload_f32(in, {rows, W});
        const Tensor o = b.alloc(ElemType::kF32, {rows, N});
        if (c.fp8) b.grouped_linear({.out = o, .in = xt, .weight = &m.w, .groups = G, .round_bf16 = true});
        else b.linear({.out = o, .in = xt, .weight = &m.w, .input_bf16 = true});
        return b.download_f32(o);
      };
      auto rows_of = [&](int64_t t0, int64_t n) {
        return std::vector<float>(x.begin() + t0 * W, x.begin() + (t0 + n) * W);
      };
      const std::vector<float> all = run(*gpu, x, T);
      EXPECT_TRUE(cuda::last_linear_tensor_cores(*gpu)) << tag;
      EXPECT_EQ(cuda::bf16_linear_last_wgmma(*gpu), wgmma) << tag;
      // The CPU's fp32 sums of the same (exact) products, on the first 37 rows.
      {
        const Tensor xc = cpu->upload_f32(rows_of(0, 37), {37, W});
        const Tensor oc = cpu->alloc(ElemType::kF32, {37, N});
        if (c.fp8) cpu->grouped_linear({.out = oc, .in = xc, .weight = &m.w, .groups = G, .round_bf16 = true});
        else cpu->linear({.out = oc, .in = xc, .weight = &m.w, .input_bf16 = true});
        const Tensor og = gpu->upload_f32(std::vector<float>(all.begin(), all.begin() + 37 * N), {37, N});
        // (round_bf16 rounds the grouped projection's outputs to bf16: one bf16 ulp; the BF16 linears' stay fp32.)
        expect_close(*gpu, og, *cpu, oc, c.fp8 ? kBf16Tol : kOpTol, "bf16 gemm " + tag);
      }
      const std::vector<float> first37 = run(*gpu, rows_of(0, 37), 37);
      for (int64_t i = 0; i < 37 * N; ++i)
        ASSERT_EQ(f32_to_bits(first37[i]), f32_to_bits(all[i])) << tag << ": row " << i / N << " differs in 37 and 300";
      for (int64_t t : {int64_t{0}, int64_t{20}, int64_t{299}}) {
        const std::vector<float> alone = run(*gpu, rows_of(t, 1), 1);
        for (int64_t n = 0; n < N; ++n)
          ASSERT_EQ(f32_to_bits(alone[n]), f32_to_bits(all[t * N + n])) << tag << ": row " << t << " alone, output " << n;
      }
      std::vector<float> big(static_cast<size_t>(4100 * W));
      for (int64_t r = 0; r < 4100; ++r) std::copy(x.begin() + (r % T) * W, x.begin() + (r % T + 1) * W, big.begin() + r * W);
      const std::vector<float> o = run(*gpu, big, 4100);
      for (int64_t i = 0; i < T * N; ++i)
        ASSERT_EQ(f32_to_bits(o[i]), f32_to_bits(all[i])) << tag << ": row " << i / N << " differs in 4100 and 300";
      for (int64_t r = T; r < 4100; r += 997)
        for (int64_t n = 0; n < N; ++n)
          ASSERT_EQ(f32_to_bits(o[r * N + n]), f32_to_bits(all[(r % T) * N + n])) << tag << ": row " << r << " of 4100";
      // The TMA form's raster (cuda::set_tma_raster_group: a weight tile's token tiles in a row, and
      // weight tiles in groups of 3, the last one narrower where their count is no multiple of 3) is
      // not part of the arithmetic: each gives the bits of the order chosen by size.
      if (wgmma)
        for (int group : {1, 3}) {
          cuda::set_tma_raster_group(group);
          const std::vector<float> og = run(*gpu, big, 4100);
          cuda::set_tma_raster_group(0);
          for (int64_t i = 0; i < 4100 * N; ++i)
            ASSERT_EQ(f32_to_bits(og[i]), f32_to_bits(o[i])) << tag << ", raster group " << group << ": row " << i / N << " of 4100";
        }
    }
  }
  cuda::set_bf16_wgmma(*gpu, cuda::cuda_feature_on("bf16_wgmma"));
}

// The bf16 GEMMs' decode form reads fp32 inputs and rounds them to bf16 itself (`bf16_f32_in`: no
// conversion pass before it), and FP8 weights as stored, made bf16 in registers (`bf16_fp8_w`: no
// bf16 copy read): up to 64 rows its outputs must be the bits of the same rows through the
// conversion pass, the bf16 weight copy and the TMA form (a batch of 300), and of the inputs
// rounded to bf16 on the host first. Inputs that are not bf16 values, with round-to-even ties
// (1 + 2^-8 and its neighbours' halves, both signs), bf16 subnormals, -0 and values that round up
// to a new power of two; grouped FP8 weights (wo_a's shape, x_ld = G K) with e8m0 and with fp32
// scales (whose products round), an FP8 weight whose 96-input scale blocks the decode form cannot
// take (its bf16 copy then), BF16 weights with N not a multiple of 64 and N past 8192 (4 parts).
TEST_F(CudaOps, Bf16DecodeFormRoundsItsFp32InputsAsTheConversionPass) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  if (!cuda::cuda_feature_on("bf16_gemm") || !cuda::cuda_feature_on("bf16_wgmma")) GTEST_SKIP() << "bf16 wgmma is off";
  const bool f32_in = cuda::cuda_feature_on("bf16_f32_in"), fp8_w = cuda::cuda_feature_on("bf16_fp8_w");
  cuda::set_bf16_wgmma(*gpu, true);
  Rng rng(53);
  struct Case {
    int64_t G, R, K;
    bool fp8;
    DType scale = DType::kF8E8M0;
    int64_t block_in = 128;
  };
  for (const Case c : {Case{8, 128, 256, true}, Case{2, 128, 1152, true, DType::kF32}, Case{1, 256, 192, true, DType::kF32, 96},
                       Case{1, 1000, 4096, false}, Case{1, 8200, 1088, false}}) {
    const int64_t G = c.G, R = c.R, K = c.K, N = G * R, W = G * K;
    const std::string tag = "G=" + std::to_string(G) + " R=" + std::to_string(R) + " K=" + std::to_string(K) +
                            (c.fp8 ? " fp8 block_in " + std::to_string(c.block_in) : " bf16");
    const StoredMatrix m = c.fp8 ? fp8_matrix(rng, N, K, 128, c.block_in, c.scale)
                                 : float_matrix(DType::kBF16, N, K, rng.normal(N * K, 0.05));
    const int64_t T = 300;
    std::vector<float> x = rng.normal(T * W);
    const float ties[] = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -(1.0f + 0x1p-8f), 0x1.ff8p0f, -0x1.ff8p-3f, 0x1p-130f,
                          -0x1.8p-133f, -0.0f, 3.0f + 0x1p-7f};
    for (int64_t i = 0; i < T * W; i += 7) x[i] = ties[(i / 7) % 9] * (i % 3 == 0 ? 1.0f : 0.5f);
    auto run = [&](const std::vector<float>& in, int64_t rows) {
      const Tensor xt = gpu->upload_f32(in, {rows, W});
      const Tensor o = gpu->alloc(ElemType::kF32, {rows, N});
      // (grouped_linear is a bf16 GEMM under round_bf16 only: the fast profiles' wo_a.)
      if (c.fp8) gpu->grouped_linear({.out = o, .in = xt, .weight = &m.w, .groups = G, .round_bf16 = true});
      else gpu->linear({.out = o, .in = xt, .weight = &m.w, .input_bf16 = true});
      return gpu->download_f32(o);
    };
    const std::vector<float> all = run(x, T);  // (also the weight's first use: its bf16 copy is made)
    EXPECT_FALSE(cuda::bf16_linear_last_f32_in(*gpu)) << tag << ": 300 rows read fp32 inputs";
    const std::vector<float> xr = host_bf16(x);
    for (const auto& [t0, n] : {std::pair<int64_t, int64_t>{0, 1}, std::pair<int64_t, int64_t>{3, 5},
                               std::pair<int64_t, int64_t>{0, 64}, std::pair<int64_t, int64_t>{250, 37}}) {
      const std::vector<float> rows(x.begin() + t0 * W, x.begin() + (t0 + n) * W);
      const std::vector<float> got = run(rows, n);
      EXPECT_EQ(cuda::bf16_linear_last_f32_in(*gpu), f32_in) << tag << ": " << n << " rows";
      EXPECT_EQ(cuda::bf16_linear_last_fp8_weights(*gpu), fp8_w && c.fp8 && c.block_in % 64 == 0) << tag << ": " << n << " rows";
      const std::vector<float> pre = run(std::vector<float>(xr.begin() + t0 * W, xr.begin() + (t0 + n) * W), n);
      for (int64_t i = 0; i < n * N; ++i) {
        ASSERT_EQ(f32_to_bits(got[i]), f32_to_bits(all[t0 * N + i]))
            << tag << ": row " << t0 + i / N << " output " << i % N << " in " << n << " rows against the batch of 300";
        ASSERT_EQ(f32_to_bits(got[i]), f32_to_bits(pre[i]))
            << tag << ": row " << t0 + i / N << " output " << i % N << " against the inputs rounded on the host";
      }
    }
  }
  cuda::set_bf16_wgmma(*gpu, cuda::cuda_feature_on("bf16_wgmma"));
}

TEST_F(CudaOps, RopeForwardAndInverseAtLargePositions) {
  Rng rng(51);
  RopeTable table{.inv_freq = {1.0, 0.31, 0.0123, 3.7e-4, 5.68e-7}};
  const int64_t n = 3, width = 21;
  BatchInfo b = simple_batch({0, 0, 0, 0, 0, 0});
  b.positions = {0, 1, 17, 4095, 131071, 1000003};
  const int64_t T = b.num_tokens();
  auto [xc, xg] = both_f32(rng.normal(T * n * width), {T, n, width});
  for (RopeDirection dir : {RopeDirection::kForward, RopeDirection::kInverse}) {
    cpu->rope({.x = xc, .table = &table, .direction = dir}, b);
    gpu->rope({.x = xg, .table = &table, .direction = dir}, b);
    expect_close(*gpu, xg, *cpu, xc, {.atol = 1e-6, .rtol = 1e-6}, "rope");
  }
}

// A decode batch's rope spreads a token's heads over blocks of 8 (`rope_spread`, below 32 tokens);
// a larger batch keeps a block a token: the same rotation of every (token, head, pair), so two
// tokens alone give the bits they have as the first two of 40 (64 heads of 64 RoPE dims in rows of
// 512, V4's q).
TEST_F(CudaOps, RopeOfAFewTokensIsTheirRopeInALargeBatch) {
  Rng rng(52);
  RopeTable table;
  for (int i = 0; i < 32; ++i) table.inv_freq.push_back(std::pow(10000.0, -i / 32.0));
  const int64_t n = 64, width = 512, T = 40;
  std::vector<int32_t> zeros(T, 0);
  BatchInfo big = simple_batch(zeros);
  for (int64_t t = 0; t < T; ++t) big.positions[t] = 4093 + 7 * t;
  BatchInfo two = simple_batch({0, 0});
  two.positions = {big.positions[0], big.positions[1]};
  const std::vector<float> x = rng.normal(T * n * width);
  for (RopeDirection dir : {RopeDirection::kForward, RopeDirection::kInverse}) {
    const Tensor all = gpu->upload_f32(x, {T, n, width});
    const Tensor first = gpu->upload_f32(std::vector<float>(x.begin(), x.begin() + 2 * n * width), {2, n, width});
    gpu->rope({.x = all, .table = &table, .direction = dir, .round_bf16 = true}, big);
    gpu->rope({.x = first, .table = &table, .direction = dir, .round_bf16 = true}, two);
    const std::vector<float> a = gpu->download_f32(all);
    expect_same_bits(gpu->download_f32(first), std::vector<float>(a.begin(), a.begin() + 2 * n * width),
                     std::string("rope ") + (dir == RopeDirection::kForward ? "forward" : "inverse"));
    EXPECT_NE(a, x);  // (it rotated)
  }
}

// ---- compressors, indexer, attention ------------------------------------------------------------

// One layer of the given kind; sizes small and odd where the formats allow.
ModelConfig attn_config(AttentionKind kind, int64_t window) {
  ModelConfig c;
  c.num_layers = 1;
  c.sliding_window = window;
  c.head_dim = 20;
  c.index_head_dim = 12;
  c.attention = {kind};
  c.compress_ratio = {kind == AttentionKind::kCsa ? 4 : kind == AttentionKind::kHca ? 5 : 0};
  c.moe = {MoeKind::kScored};
  return c;
}

// Two sequences on both backends, fed chunk by chunk in shared batches.
struct TwoSequences {
  std::unique_ptr<SequenceState> cpu[2], gpu[2];
  std::vector<int32_t> ids = std::vector<int32_t>(64, 0);

  TwoSequences(Backend& c, Backend& g, const ModelConfig& cfg) {
    for (int s = 0; s < 2; ++s) {
      cpu[s] = c.create_sequence_state(cfg);
      gpu[s] = g.create_sequence_state(cfg);
    }
  }
  // Batches of n0 tokens of sequence 0 and n1 of sequence 1 (either may be 0), on each backend.
  std::pair<BatchInfo, BatchInfo> batches(int64_t n0, int64_t n1) {
    auto make = [&](std::unique_ptr<SequenceState>* st) {
      std::vector<SequenceChunk> chunks;
      if (n0 > 0) chunks.push_back({st[0].get(), std::span<const int32_t>(ids).subspan(0, n0)});
      if (n1 > 0) chunks.push_back({st[1].get(), std::span<const int32_t>(ids).subspan(0, n1)});
      return batch_build(chunks);
    };
    return {make(cpu), make(gpu)};
  }
  void advance(int64_t n0, int64_t n1) {
    cpu[0]->advance(n0), gpu[0]->advance(n0), cpu[1]->advance(n1), gpu[1]->advance(n1);
  }
};

std::vector<float> cpu_entries(SequenceState& s, CompressorSlot slot) {
  auto& l = static_cast<cpu::CpuSequenceState&>(s).layer(0);
  return slot == CompressorSlot::kMain ? l.main.entries : l.indexer.entries;
}

// Compressor weights of one slot: ape [ratio, width] F32, norm [dim] BF16.
struct CompressorCase {
  Stored ape, norm;
  int64_t dim, width, ratio;
  bool overlap;
  CompressorCase(Rng& rng, int64_t dim_, int64_t ratio_, bool overlap_)
      : dim(dim_), width(overlap_ ? 2 * dim_ : dim_), ratio(ratio_), overlap(overlap_) {
    ape = stored_floats(DType::kF32, {ratio, width}, rng.normal(ratio * width, 0.5));
    norm = stored_floats(DType::kBF16, {dim}, rng.normal(dim, 0.2, 1.0));
  }
  CompressorParams params(const Tensor& kv, const Tensor& gate, const BatchInfo& b, const RopeTable& rope,
                          CompressorSlot slot) const {
    return {.kv = kv, .gate = gate, .ape = ape.view, .norm_weight = norm.view, .batch = &b, .rope = &rope, .layer = 0,
            .slot = slot, .ratio = ratio, .dim = dim, .overlap = overlap, .norm_eps = 1e-6};
  }
};

const RopeTable kRope{.inv_freq = {1.0, 0.2, 0.01, 1e-4}};  // rope_dim 8

// Feeds both compressors of a layer chunk by chunk (two sequences per batch) and compares the
// entries after every batch: pending rows and the CSA previous halves carry across batches.
TEST_F(CudaOps, CompressorsMatchCpuAcrossChunks) {
  for (AttentionKind kind : {AttentionKind::kCsa, AttentionKind::kHca}) {
    Rng rng(61);
    const ModelConfig cfg = attn_config(kind, 6);
    const bool csa = kind == AttentionKind::kCsa;
    const CompressorCase main_case(rng, cfg.head_dim, cfg.compress_ratio[0], csa);
    const CompressorCase index_case(rng, cfg.index_head_dim, cfg.compress_ratio[0], true);
    TwoSequences seqs(*cpu, *gpu, cfg);
    for (auto [n0, n1] : {std::pair{3, 5}, std::pair{6, 0}, std::pair{1, 12}, std::pair{9, 2}, std::pair{0, 1},
                          std::pair{13, 7}}) {
      auto [bc, bg] = seqs.batches(n0, n1);
      const int64_t T = n0 + n1;
      for (const CompressorCase* cc : {&main_case, &index_case}) {
        if (cc == &index_case && !csa) continue;
        const CompressorSlot slot = cc == &main_case ? CompressorSlot::kMain : CompressorSlot::kIndexer;
        auto [kc, kg] = both_f32(rng.normal(T * cc->width), {T, cc->width});
        auto [gc, gg] = both_f32(rng.normal(T * cc->width, 2.0), {T, cc->width});
        cpu->compressor(cc->params(kc, gc, bc, kRope, slot));
        gpu->compressor(cc->params(kg, gg, bg, kRope, slot));
        for (int s = 0; s < 2; ++s) {
          const std::vector<float> want = cpu_entries(*seqs.cpu[s], slot);
          const std::vector<float> got = std::string(gpu->name()) == "cpu" ? cpu_entries(*seqs.gpu[s], slot)
                                                                            : cuda::state_entries(*seqs.gpu[s], 0, slot);
          const CompareResult r = compare_f32(got, want, kOpTol);
          EXPECT_TRUE(r.ok) << (csa ? "CSA" : "HCA") << (slot == CompressorSlot::kMain ? " main" : " indexer")
                            << " seq " << s << " after batch (" << n0 << ", " << n1 << "): " << r.message;
        }
      }
      seqs.advance(n0, n1);
    }
    EXPECT_GT(cpu_entries(*seqs.cpu[1], CompressorSlot::kMain).size(), 0u);
  }
}

// Selections may differ only by a near-tie (scores within 1e-5 relative); -1 slots must match.
void expect_same_selection(const std::vector<int32_t>& got, const std::vector<int32_t>& want,
                           const std::vector<float>& scores, int64_t T, int64_t k, int64_t C, const std::string& what) {
  int64_t swaps = 0;
  for (int64_t t = 0; t < T; ++t) {
    float mx = 0;
    for (int64_t c = 0; c < C; ++c)
      if (std::isfinite(scores[t * C + c])) mx = std::max(mx, std::fabs(scores[t * C + c]));
    for (int64_t i = 0; i < k; ++i) {
      const int32_t g = got[t * k + i], w = want[t * k + i];
      if (g == w) continue;
      ASSERT_TRUE(g >= 0 && w >= 0) << what << ": token " << t << " slot " << i << " got " << g << " want " << w;
      EXPECT_LE(std::fabs(scores[t * C + g] - scores[t * C + w]), 1e-5 * mx)
          << what << ": token " << t << " slot " << i << " got " << g << " want " << w;
      ++swaps;
    }
  }
  if (swaps) std::printf("[indexer] %s: %lld near-tie swaps\n", what.c_str(), static_cast<long long>(swaps));
}

// The most entries any token of `b` sees at compression ratio m.
int64_t max_visible(const BatchInfo& b, int64_t m) {
  int64_t C = 0;
  for (int64_t p : b.positions) C = std::max(C, (p + 1) / m);
  return C;
}

// indexer_topk on both backends for one batch (q [T, Hi, di] and head weights [T, Hi] on each,
// the batches' sequences holding the same keys): scores within kOpTol over `cols` >= every visible
// count, and the same selections up to near-ties. Returns the GPU's selections [T, k].
std::vector<int32_t> indexer_on_both(Backend& cpu, Backend& gpu, const std::pair<Tensor, Tensor>& q,
                                     const std::pair<Tensor, Tensor>& w, const BatchInfo& bc, const BatchInfo& bg,
                                     int64_t m, int64_t k, int64_t cols, const std::string& what) {
  const int64_t T = bc.num_tokens();
  const Tensor ic = cpu.alloc(ElemType::kI32, {T, k}), ig = gpu.alloc(ElemType::kI32, {T, k});
  const Tensor sc = cpu.alloc(ElemType::kF32, {T, cols}), sg = gpu.alloc(ElemType::kF32, {T, cols});
  cpu.indexer_topk({.out_indices = ic, .q = q.first, .head_weights = w.first, .batch = &bc, .layer = 0, .ratio = m,
                    .k = k, .out_scores = sc});
  gpu.indexer_topk({.out_indices = ig, .q = q.second, .head_weights = w.second, .batch = &bg, .layer = 0, .ratio = m,
                    .k = k, .out_scores = sg});
  expect_close(gpu, sg, cpu, sc, kOpTol, what + " scores");
  const std::vector<int32_t> want = cpu.download_i32(ic), got = gpu.download_i32(ig);
  expect_same_selection(got, want, cpu.download_f32(sc), T, k, cols, what);
  return got;
}

TEST_F(CudaOps, IndexerTopkMatchesCpuWithFewVisibleAndTies) {
  Rng rng(71);
  const ModelConfig cfg = attn_config(AttentionKind::kCsa, 6);
  const int64_t Hi = 3, di = cfg.index_head_dim, m = cfg.compress_ratio[0];
  const CompressorCase index_case(rng, di, m, true);
  TwoSequences seqs(*cpu, *gpu, cfg);
  for (auto [n0, n1] : {std::pair{2, 7}, std::pair{11, 1}, std::pair{9, 30}, std::pair{1, 1}}) {
    auto [bc, bg] = seqs.batches(n0, n1);
    const int64_t T = n0 + n1;
    auto [kc, kg] = both_f32(rng.normal(T * 2 * di), {T, 2 * di});
    auto [gc, gg] = both_f32(rng.normal(T * 2 * di), {T, 2 * di});
    cpu->compressor(index_case.params(kc, gc, bc, kRope, CompressorSlot::kIndexer));
    gpu->compressor(index_case.params(kg, gg, bg, kRope, CompressorSlot::kIndexer));
    std::vector<float> hw = rng.normal(T * Hi);
    for (int64_t h = 0; h < Hi; ++h) hw[(T - 1) * Hi + h] = 0.0f;  // last token: every score 0, a full tie
    const auto q = both_f32(rng.normal(T * Hi * di), {T, Hi, di});
    const auto w = both_f32(hw, {T, Hi});
    const int64_t C = max_visible(bc, m);
    for (int64_t k : {int64_t{3}, int64_t{8}}) {  // 8 exceeds the visible entries of most tokens
      const std::string what = "indexer batch (" + std::to_string(n0) + ", " + std::to_string(n1) + ") k=" + std::to_string(k);
      const std::vector<int32_t> got = indexer_on_both(*cpu, *gpu, q, w, bc, bg, m, k, C + 2, what);
      // The all-zero token keeps the lowest indices in order.
      for (int64_t i = 0; i < k; ++i) {
        const int64_t visible = (bc.positions[T - 1] + 1) / m;
        EXPECT_EQ(got[(T - 1) * k + i], i < visible ? i : -1) << what << " tie slot " << i;
      }
    }
    seqs.advance(n0, n1);
  }
}

// The indexer's fast paths (indexer_score_smem_kernel, indexer_radix_select_kernel) at sizes the
// fixtures never reach: 2200 and 600 visible entries, V4's 64 index heads of 128 dims, k = 512 and
// 1000 (the radix passes; bitonic sorts over 512 and 1024 slots; k above the visible count), and a
// token whose scores all tie at 0 (the equal-bin compaction must keep the lowest indices, in order).
TEST_F(CudaOps, IndexerTopkManyEntriesMatchesCpu) {
  Rng rng(72);
  ModelConfig cfg = attn_config(AttentionKind::kCsa, 6);
  cfg.index_head_dim = 128;
  const int64_t Hi = 64, di = cfg.index_head_dim, m = cfg.compress_ratio[0];
  const CompressorCase index_case(rng, di, m, true);
  TwoSequences seqs(*cpu, *gpu, cfg);
  seqs.ids.assign(4400, 0);
  for (int rep = 0; rep < 2; ++rep) {  // 8800 and 2400 tokens: 2200 and 600 indexer keys
    const int64_t n0 = 4400, n1 = 1200, T = n0 + n1;
    auto [bc, bg] = seqs.batches(n0, n1);
    auto [kc, kg] = both_f32(rng.normal(T * 2 * di), {T, 2 * di});
    auto [gc, gg] = both_f32(rng.normal(T * 2 * di), {T, 2 * di});
    cpu->compressor(index_case.params(kc, gc, bc, kRope, CompressorSlot::kIndexer));
    gpu->compressor(index_case.params(kg, gg, bg, kRope, CompressorSlot::kIndexer));
    seqs.advance(n0, n1);
  }
  auto [bc, bg] = seqs.batches(2, 1);  // decode: two tokens of sequence 0, one of sequence 1
  const int64_t T = 3;
  std::vector<float> hw = rng.normal(T * Hi);
  for (int64_t h = 0; h < Hi; ++h) hw[2 * Hi + h] = 0.0f;  // sequence 1's token: every score 0
  const auto q = both_f32(rng.normal(T * Hi * di), {T, Hi, di});
  const auto w = both_f32(hw, {T, Hi});
  const int64_t C = max_visible(bc, m);
  ASSERT_EQ(C, 2200);
  for (int64_t k : {int64_t{512}, int64_t{1000}}) {
    const std::string what = "indexer 2200/600 entries k=" + std::to_string(k);
    const std::vector<int32_t> got = indexer_on_both(*cpu, *gpu, q, w, bc, bg, m, k, C, what);
    for (int64_t i = 0; i < k; ++i) EXPECT_EQ(got[2 * k + i], i < 600 ? i : -1) << what << " tie slot " << i;
  }
}

// The selection kernel alone against the rank rule on the host, at the sizes the decode cells
// reach (32K entries at 128K context) and on score patterns built to take each of its paths (by
// construction: the kernel does not report the path it took): the sampled guess (kept; and
// dropped when too few or too many entries clear it: scores made to differ between the sampled
// positions and the rest), the radix passes over global memory, then in shared memory down to the
// index bits (scores in a narrow range; few distinct values), the ordered compaction when more
// than its shared-memory candidates tie at the k-th score (all zeros; two values), fewer visible
// entries than k or than that capacity, -inf and signed zeros (which tie). C = 40000 (16-byte
// aligned rows: vector loads) and 9001 (rows at every alignment); k from 7 to 4000 (sorts of 8 to
// 4096 keys), and 5000 (past the kernel's 4096 keys: the rank-by-counting kernel). Every slot is
// checked (the helper fills them with garbage first). Exact equality.
// kSelectRows rows of C scores in the patterns below (each row's own), visible counts C but for rows
// 6 to 9.
constexpr int kSelectRows = 12;
std::vector<float> selection_rows(Rng& rng, int64_t C) {
  std::vector<float> scores(kSelectRows * C);
  for (int r = 0; r < kSelectRows; ++r) {
    float* row = scores.data() + r * C;
    const std::vector<float> z = rng.normal(C);
    for (int64_t w = 0; w < C; ++w) {
      switch (r) {
        case 0: row[w] = z[w]; break;                                      // spread out
        case 1: row[w] = 1.0f + 1e-4f * z[w]; break;                       // every pass on the score bits
        case 2: row[w] = std::floor(4.0f * z[w]); break;                   // ~30 values: ties into the index bits
        case 3: row[w] = 0.0f; break;                                      // one tie, more than the shared memory
        case 4: row[w] = z[w] > 0.5f ? 2.0f : -1.0f; break;                // two values
        case 5:  // -inf, and zeros of both signs among a few values
          row[w] = w % 3 == 0 ? -INFINITY : std::floor(z[w]) == 0.0f ? (w % 2 ? -0.0f : 0.0f) : std::floor(z[w]);
          break;
        case 10: row[w] = z[w] + (w % 1024 < 128 ? 10.0f : 0.0f); break;  // the sample misleads: too few clear
        case 11: row[w] = z[w] + (w % 1024 < 128 ? 0.0f : 10.0f); break;  // too many clear
        default: row[w] = 100.0f * z[w]; break;
      }
    }
  }
  return scores;
}

// Every slot of `got` ([rows, k]) against the rank rule on the host: a stable sort by score,
// descending (-0 ties +0), cut at min(visible, k), -1 after.
void expect_rank_rule(const std::vector<int32_t>& got, const std::vector<float>& scores,
                      const std::vector<int64_t>& visible, int64_t C, int64_t k, const std::string& what) {
  for (size_t r = 0; r < visible.size(); ++r) {
    const float* row = scores.data() + r * C;
    std::vector<int32_t> order(visible[r]);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t x, int32_t y) { return row[x] > row[y]; });
    order.resize(std::min<int64_t>(visible[r], k));
    order.resize(k, -1);
    const std::vector<int32_t> mine(got.begin() + r * k, got.begin() + (r + 1) * k);
    const auto diff = std::mismatch(mine.begin(), mine.end(), order.begin());
    EXPECT_TRUE(diff.first == mine.end()) << what << " C " << C << " row " << r << " k " << k << ": slot "
                                          << (diff.first - mine.begin()) << " got " << *diff.first << " want "
                                          << *diff.second;
  }
}

TEST_F(CudaOps, IndexerSelectionMatchesRankRule) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(73);
  for (int64_t C : {int64_t{40000}, int64_t{9001}}) {
    const std::vector<float> scores = selection_rows(rng, C);
    std::vector<int64_t> visible(kSelectRows, C);
    visible[6] = 300;   // fewer than most k
    visible[7] = 3000;  // fewer than the shared-memory candidates
    visible[8] = 0;
    visible[9] = C - 1;
    for (int64_t k : {int64_t{7}, int64_t{512}, int64_t{1000}, int64_t{4000}, int64_t{5000}})
      expect_rank_rule(cuda::indexer_select_rows(scores, visible, k), scores, visible, C, k, "auto");
  }
}

// The rank-counting kernel (cuda::IndexerSelectKernel::kRank, chosen for small calls: one decode
// token at up to 4096 entries) against the rank rule and against the radix and counting kernels,
// slot for slot, on the score patterns above: C from 1 to 8192 (its bound; 1000 and 777: rows at
// every alignment, partial last blocks of 32), k from 1 to past C, one token and several (the
// token's block 0 writes the -1 slots; a block past the visible count writes nothing else).
TEST_F(CudaOps, IndexerRankSelectionIsTheOtherKernelsSelection) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(74);
  using cuda::IndexerSelectKernel;
  EXPECT_TRUE(cuda::indexer_rank_select_fits(1, 1024));
  EXPECT_TRUE(cuda::indexer_rank_select_fits(1, 4096));
  EXPECT_FALSE(cuda::indexer_rank_select_fits(2, 4096));
  EXPECT_FALSE(cuda::indexer_rank_select_fits(256, 1024));
  EXPECT_FALSE(cuda::indexer_rank_select_fits(1, 16384));
  for (int64_t C : {int64_t{1}, int64_t{33}, int64_t{777}, int64_t{1000}, int64_t{1024}, int64_t{8192}}) {
    const std::vector<float> scores = selection_rows(rng, C);
    std::vector<int64_t> visible(kSelectRows, C);
    visible[6] = C / 3;
    visible[7] = C > 1 ? C - 31 : 1;
    visible[8] = 0;
    visible[9] = C - 1;
    for (auto& v : visible) v = std::max<int64_t>(v, 0);
    for (int64_t k : {int64_t{1}, int64_t{7}, int64_t{512}, int64_t{600}, C + 5}) {
      const std::string tag = "C " + std::to_string(C) + " k " + std::to_string(k);
      const std::vector<int32_t> rank = cuda::indexer_select_rows(scores, visible, k, IndexerSelectKernel::kRank);
      expect_rank_rule(rank, scores, visible, C, k, "rank kernel");
      EXPECT_EQ(rank, cuda::indexer_select_rows(scores, visible, k, IndexerSelectKernel::kCount)) << tag;
      if (k <= 4096) {
        EXPECT_EQ(rank, cuda::indexer_select_rows(scores, visible, k, IndexerSelectKernel::kRadix)) << tag;
      }
      // One token alone (row 0, then row 5's signed zeros and -inf).
      for (int r : {0, 5}) {
        const std::vector<float> one(scores.begin() + r * C, scores.begin() + (r + 1) * C);
        const std::vector<int32_t> got = cuda::indexer_select_rows(one, {C}, k, IndexerSelectKernel::kRank);
        EXPECT_EQ(got, std::vector<int32_t>(rank.begin() + r * k, rank.begin() + (r + 1) * k)) << tag << " row " << r;
      }
    }
  }
}

// ---- indexer key precision (`--index-keys`) -----------------------------------------------------

constexpr KeyPrecision kKeyPrecisions[] = {KeyPrecision::kF32, KeyPrecision::kBf16, KeyPrecision::kFp8,
                                           KeyPrecision::kFp4};

// Rows of `dim` values rounded by the backend under test's key precision kernel (the host
// simulation itself when the harness runs with a CPU backend in place of the GPU).
std::vector<float> backend_key_sim(Backend& gpu, std::vector<float> rows, int64_t dim, KeyPrecision p) {
  if (std::string(gpu.name()) != "cpu") return cuda::key_sim_rows(rows, dim, p);
  for (size_t r = 0; r < rows.size(); r += dim) simulate_key_precision(rows.data() + r, dim, p);
  return rows;
}


// The device rounding of stored keys is core/quant_sim.cpp's, bit for bit: rows built to sit on
// every rounding edge (e4m3 and e2m1 midpoints with exact scales, subnormals, saturation at 448,
// scale exponents at a power-of-two boundary, all-zero rows and blocks, signed zeros, NaN) and
// random rows of odd width (a partial FP4 block) spanning twelve orders of magnitude.
TEST_F(CudaOps, KeyPrecisionSimulationIsTheCpuOneBitForBit) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t dim = 45;  // one full FP4 block of 32 and a partial one of 13
  std::vector<std::vector<float>> edge;
  // amax 448: the fp8 scale is exactly 1, so these are e4m3's own midpoints: 1.0625 and 1.1875
  // (mantissa ties to even), 2^-10, 3*2^-10 and 5*2^-10 (subnormal ties), 432 and 232 (ties
  // near the top), 440 and 447.99 (round up to 448), 0.015 (just below the smallest normal).
  edge.push_back({448.0f, -448.0f, 1.0625f, 1.1875f, -1.0625f, 0x1p-10f, 3 * 0x1p-10f, -5 * 0x1p-10f, 0x1p-6f, 0.015f,
                  440.0f, 447.99f, 432.0f, -232.0f, 240.0f, 1e-30f, -0.0f, 0.0f, nan, 7.0f});
  // amax 6 in the first FP4 block: a scale of 1, so every e2m1 midpoint (0.25, 0.75, ..., 5), just
  // beyond them, and saturation; the second block is all zeros (the floored scale).
  edge.push_back({6.0f, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, -0.25f, -0.75f, -1.25f, -1.75f, -2.5f, -3.5f,
                  -5.0f, 0.2500001f, 0.7499999f, 5.0000005f, 5.5f, -6.0f, -0.0f, nan, 1e-20f});
  // Block amax 12 (amax/6 = 2: exponent exactly 1) and just above it (exponent 2); bf16 ties
  // (1 + 2^-8 to 1, 1 + 3*2^-8 up to 1 + 2^-6) and fp32 subnormals.
  {
    std::vector<float> r(dim, 0.0f);
    r[0] = 12.0f, r[1] = 1.0f + 0x1p-8f, r[2] = 1.0f + 3 * 0x1p-8f, r[3] = 1e-40f, r[4] = -3.0f, r[5] = 9.0f;
    r[32] = std::nextafter(12.0f, 100.0f), r[33] = 0.5f, r[34] = -7.0f, r[35] = 2e-39f;
    edge.push_back(r);
  }
  edge.push_back(std::vector<float>(dim, 0.0f));                          // amax 0: fp8 leaves the row alone
  edge.push_back(std::vector<float>(dim, -0.0f));
  edge.push_back(std::vector<float>(dim, 3e-39f));                        // subnormal amax
  edge.push_back({3.4e38f, -3.3e38f, 1.0f, 1e-38f});                      // bf16 rounds past the top to inf
  std::vector<float> rows;
  for (auto& r : edge) {
    r.resize(dim, 0.0f);
    rows.insert(rows.end(), r.begin(), r.end());
  }
  Rng rng(97);
  for (double scale : {1e-6, 1e-3, 0.1, 1.0, 30.0, 1e4, 1e6})
    for (int i = 0; i < 3; ++i) {
      const std::vector<float> v = rng.normal(dim, scale);
      rows.insert(rows.end(), v.begin(), v.end());
    }
  for (KeyPrecision p : kKeyPrecisions) {
    std::vector<float> want = rows;
    for (size_t r = 0; r < want.size(); r += dim) simulate_key_precision(want.data() + r, dim, p);
    expect_same_bits(backend_key_sim(*gpu, rows, dim, p), want, std::string("key precision ") + key_precision_name(p));
  }
  // The width DeepSeek-V4 stores (di = 128, four FP4 blocks), random rows only.
  const std::vector<float> wide = rng.normal(128 * 9, 2.0);
  for (KeyPrecision p : kKeyPrecisions) {
    std::vector<float> want = wide;
    for (size_t r = 0; r < want.size(); r += 128) simulate_key_precision(want.data() + r, 128, p);
    expect_same_bits(backend_key_sim(*gpu, wide, 128, p), want,
                     std::string("key precision ") + key_precision_name(p) + " di 128");
  }
}

// Through the compressor op on random inputs: every entry the indexer compressor emits (two
// sequences, chunks that straddle windows) is the fp32 entry of the same GPU run rounded by the host
// simulation, exactly; the precision changes nothing but the stored keys.
TEST_F(CudaOps, CompressorRoundsEachNewIndexerKeyAsTheCpuDoes) {
  const ModelConfig cfg = attn_config(AttentionKind::kCsa, 6);
  const int64_t di = 45, m = cfg.compress_ratio[0];
  ModelConfig wide = cfg;
  wide.index_head_dim = di;
  for (KeyPrecision p : kKeyPrecisions) {
    Rng rng(73);
    const CompressorCase index_case(rng, di, m, true);
    TwoSequences seqs(*gpu, *gpu, wide);  // both on the device: `cpu` states fp32 keys, `gpu` states rounded
    for (auto [n0, n1] : {std::pair{3, 9}, std::pair{6, 0}, std::pair{1, 12}, std::pair{13, 2}}) {
      auto [b32, bp] = seqs.batches(n0, n1);
      const int64_t T = n0 + n1;
      const std::vector<float> kv = rng.normal(T * 2 * di, 3.0), gate = rng.normal(T * 2 * di, 2.0);
      CompressorParams params = index_case.params(gpu->upload_f32(kv, {T, 2 * di}), gpu->upload_f32(gate, {T, 2 * di}),
                                                  b32, kRope, CompressorSlot::kIndexer);
      gpu->compressor(params);
      params.batch = &bp;
      params.key_precision = p;
      gpu->compressor(params);
      seqs.advance(n0, n1);
    }
    for (int s = 0; s < 2; ++s) {
      auto entries = [&](SequenceState& st) {
        return std::string(gpu->name()) == "cpu" ? cpu_entries(st, CompressorSlot::kIndexer)
                                                 : cuda::state_entries(st, 0, CompressorSlot::kIndexer);
      };
      std::vector<float> want = entries(*seqs.cpu[s]);
      const std::vector<float> got = entries(*seqs.gpu[s]);
      ASSERT_GT(want.size(), 0u);
      for (size_t r = 0; r < want.size(); r += di) simulate_key_precision(want.data() + r, di, p);
      expect_same_bits(got, want, std::string("compressor keys ") + key_precision_name(p) + " seq " + std::to_string(s));
      if (p != KeyPrecision::kF32) {
        EXPECT_NE(got, entries(*seqs.cpu[s])) << "the rounding changed nothing";
      }
    }
  }
}

// n0 tokens of sequence 0 and n1 of sequence 1 through the indexer compressor on both backends
// (random kv and gate rows; keys stored at kp), then the sequences advanced.
struct IndexerBoth {
  Tensor ic, ig, sc, sg;  // indices and scores, CPU and GPU
};

IndexerBoth CudaOps::indexer_both_bf16(const std::pair<Tensor, Tensor>& q, const std::pair<Tensor, Tensor>& w,
                                       const BatchInfo& bc, const BatchInfo& bg, int64_t m, int64_t k, int64_t C) {
  const int64_t T = bc.num_tokens();
  IndexerBoth r{.ic = cpu->alloc(ElemType::kI32, {T, k}), .ig = gpu->alloc(ElemType::kI32, {T, k}),
                .sc = cpu->alloc(ElemType::kF32, {T, C}), .sg = gpu->alloc(ElemType::kF32, {T, C})};
  cpu->indexer_topk({.out_indices = r.ic, .q = q.first, .head_weights = w.first, .batch = &bc, .layer = 0, .ratio = m,
                     .k = k, .out_scores = r.sc, .bf16_operands = true});
  gpu->indexer_topk({.out_indices = r.ig, .q = q.second, .head_weights = w.second, .batch = &bg, .layer = 0, .ratio = m,
                     .k = k, .out_scores = r.sg, .bf16_operands = true});
  return r;
}

void compress_indexer_batch(Backend& cpu, Backend& gpu, TwoSequences& seqs, const CompressorCase& cc, Rng& rng,
                            int64_t n0, int64_t n1, KeyPrecision kp) {
  auto [bc, bg] = seqs.batches(n0, n1);
  const int64_t T = n0 + n1, width = cc.width;
  const std::vector<float> kv = rng.normal(T * width), gate = rng.normal(T * width);
  for (auto [be, b] : {std::pair<Backend*, const BatchInfo*>{&cpu, &bc}, std::pair<Backend*, const BatchInfo*>{&gpu, &bg}}) {
    CompressorParams cp = cc.params(be->upload_f32(kv, {T, width}), be->upload_f32(gate, {T, width}), *b, kRope,
                                    CompressorSlot::kIndexer);
    cp.key_precision = kp;
    be->compressor(cp);
  }
  seqs.advance(n0, n1);
}

// The fast profile's tensor-core scorer (IndexerTopkParams::bf16_operands with keys stored at
// --index-keys bf16, whose bf16 copies the compressor keeps): q and keys bf16 values, so every
// product is exact and only the order of the fp32 sums differs from the CPU's. Scores at the op
// bar, the same selections up to near-ties, at V4's shape (64 heads x 128) and smaller ones (32 x
// 64, 48 x 32: the scorer is compiled per shape); a token's scores are the same bits alone as in a
// batch; keys stored fp32 (no bf16 copy) or the flag off take the fp32 kernels.
TEST_F(CudaOps, IndexerTopkOnTensorCoresMatchesCpu) {
  const bool real = std::string(gpu->name()) == "cuda";
  for (auto [Hi, di] : {std::pair<int64_t, int64_t>{64, 128}, std::pair<int64_t, int64_t>{32, 64},
                         std::pair<int64_t, int64_t>{48, 32}}) {
    for (KeyPrecision kp : {KeyPrecision::kBf16, KeyPrecision::kF32}) {
      Rng rng(80 + di + static_cast<int>(kp));
      ModelConfig cfg = attn_config(AttentionKind::kCsa, 6);
      cfg.index_head_dim = di;
      const int64_t m = cfg.compress_ratio[0];
      const CompressorCase index_case(rng, di, m, true);
      TwoSequences seqs(*cpu, *gpu, cfg);
      seqs.ids.assign(1100, 0);
      for (auto [n0, n1] : {std::pair<int64_t, int64_t>{1100, 301}, std::pair<int64_t, int64_t>{1, 1}})
        compress_indexer_batch(*cpu, *gpu, seqs, index_case, rng, n0, n1, kp);
      // 275 and 75 entries: two full tiles of 128 and a partial one of 19; a tile with a partial warp.
      auto [bc, bg] = seqs.batches(2, 1);
      const int64_t T = 3, C = max_visible(bc, m);
      const std::vector<float> qv = host_bf16(rng.normal(T * Hi * di));
      const auto q = both_f32(qv, {T, Hi, di});
      const std::vector<float> wv = rng.normal(T * Hi);
      const auto w = both_f32(wv, {T, Hi});
      for (int64_t k : {int64_t{64}, int64_t{200}}) {
        const std::string what = "indexer bf16 operands Hi=" + std::to_string(Hi) + " di=" + std::to_string(di) +
                                 " keys " + key_precision_name(kp) + " k=" + std::to_string(k);
        const auto [ic, ig, sc, sg] = indexer_both_bf16(q, w, bc, bg, m, k, C);
        if (real) {
          EXPECT_EQ(cuda::last_indexer_tensor_cores(*gpu),
                    kp == KeyPrecision::kBf16 && cuda::cuda_feature_on("indexer_mma")) << what;
        }
        expect_close(*gpu, sg, *cpu, sc, kOpTol, what + " scores");
        const std::vector<float> scores_cpu = cpu->download_f32(sc), scores_gpu = gpu->download_f32(sg);
        expect_same_selection(gpu->download_i32(ig), cpu->download_i32(ic), scores_cpu, T, k, C, what);
        // Sequence 1's token alone: its row of scores is the same bits.
        auto [b1c, b1g] = seqs.batches(0, 1);
        const Tensor i1 = gpu->alloc(ElemType::kI32, {1, k}), s1 = gpu->alloc(ElemType::kF32, {1, C});
        const Tensor q1 = gpu->upload_f32(std::vector<float>(qv.begin() + 2 * Hi * di, qv.end()), {1, Hi, di});
        const Tensor w1 = gpu->upload_f32(std::vector<float>(wv.begin() + 2 * Hi, wv.end()), {1, Hi});
        (void)b1c;
        gpu->indexer_topk({.out_indices = i1, .q = q1, .head_weights = w1, .batch = &b1g, .layer = 0, .ratio = m,
                           .k = k, .out_scores = s1, .bf16_operands = true});
        expect_same_bits(gpu->download_f32(s1), std::vector<float>(scores_gpu.begin() + 2 * C, scores_gpu.end()),
                         what + " token alone vs in the batch");
        // Several tiles a block (up to 32 chosen for large grids; 3 here, the last one partial), forced:
        // the same bits and selections.
        if (real) {
          const Tensor i4 = gpu->alloc(ElemType::kI32, {T, k}), s4 = gpu->alloc(ElemType::kF32, {T, C});
          cuda::set_indexer_mma_tiles(*gpu, 3);
          gpu->indexer_topk({.out_indices = i4, .q = q.second, .head_weights = w.second, .batch = &bg, .layer = 0,
                             .ratio = m, .k = k, .out_scores = s4, .bf16_operands = true});
          cuda::set_indexer_mma_tiles(*gpu, 0);
          expect_same_bits(gpu->download_f32(s4), scores_gpu, what + " three tiles a block");
          EXPECT_EQ(gpu->download_i32(i4), gpu->download_i32(ig)) << what << " three tiles a block";
        }
      }
    }
  }
}

// The bf16 key copies are kept per sequence from its first entry on: a sequence whose first keys
// were stored at fp8 has none, and a batch that also holds a sequence with copies scores on the
// fp32 kernels; the sequence with copies alone takes the tensor cores. Both match the CPU.
TEST_F(CudaOps, IndexerBf16CopiesPerSequence) {
  const bool real = std::string(gpu->name()) == "cuda";
  Rng rng(86);
  ModelConfig cfg = attn_config(AttentionKind::kCsa, 6);
  cfg.index_head_dim = 64;
  const int64_t Hi = 32, di = 64, m = cfg.compress_ratio[0];
  const CompressorCase index_case(rng, di, m, true);
  TwoSequences seqs(*cpu, *gpu, cfg);
  for (auto [n0, n1, kp] : {std::tuple{int64_t{40}, int64_t{0}, KeyPrecision::kFp8},
                            std::tuple{int64_t{21}, int64_t{46}, KeyPrecision::kBf16}})
    compress_indexer_batch(*cpu, *gpu, seqs, index_case, rng, n0, n1, kp);
  for (auto [n0, n1] : {std::pair<int64_t, int64_t>{1, 1}, std::pair<int64_t, int64_t>{0, 1}}) {
    auto [bc, bg] = seqs.batches(n0, n1);
    const int64_t T = n0 + n1, k = 8, C = max_visible(bc, m);
    const auto q = both_f32(host_bf16(rng.normal(T * Hi * di)), {T, Hi, di});
    const auto w = both_f32(rng.normal(T * Hi), {T, Hi});
    const std::string what = "indexer, bf16 copies of sequence 1 only, batch (" + std::to_string(n0) + ", " +
                             std::to_string(n1) + ")";
    const auto [ic, ig, sc, sg] = indexer_both_bf16(q, w, bc, bg, m, k, C);
    if (real) {
      EXPECT_EQ(cuda::last_indexer_tensor_cores(*gpu), n0 == 0 && cuda::cuda_feature_on("indexer_mma")) << what;
    }
    expect_close(*gpu, sg, *cpu, sc, kOpTol, what + " scores");
    expect_same_selection(gpu->download_i32(ig), cpu->download_i32(ic), cpu->download_f32(sc), T, k, C, what);
  }
}

// Indexer keys built so that both backends compute them bit for bit (every softmax weight equal,
// sums of small integers, a norm of exactly 1, RoPE at angle 0): pooled values in {0, ±1, ±2} with
// sum of squares = di, times fp32 norm weights. The rounded keys must then be identical on both
// backends, and the scores and top-k (k = 3, and k = 8, more than most tokens see) those of the CPU
// for every key precision.
TEST_F(CudaOps, IndexerTopkWithEveryKeyPrecisionMatchesCpu) {
  const ModelConfig base = attn_config(AttentionKind::kCsa, 6);
  const int64_t Hi = 3, di = 45, m = base.compress_ratio[0];
  ModelConfig cfg = base;
  cfg.index_head_dim = di;
  const RopeTable identity{.inv_freq = {0.0, 0.0, 0.0, 0.0}};
  // Pooled value of entry w of sequence s: ±1 everywhere, then some groups of four ±1s become
  // (±2, 0, 0, 0), which keeps the sum of squares at di.
  auto pattern = [&](int s, int64_t w) {
    Rng r(1000 + 97 * s + w);
    std::vector<float> a(di);
    for (auto& x : a) x = r.integer(0, 1) ? 1.0f : -1.0f;
    std::vector<int64_t> order(di);
    for (int64_t i = 0; i < di; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937_64(50 + 13 * s + w));
    const int64_t groups = r.integer(0, di / 4);
    for (int64_t g = 0; g < groups; ++g) {
      a[order[4 * g]] *= 2.0f;
      a[order[4 * g + 1]] = a[order[4 * g + 2]] = a[order[4 * g + 3]] = 0.0f;
    }
    return a;
  };
  for (KeyPrecision p : kKeyPrecisions) {
    Rng rng(79);
    const Stored ape = stored_floats(DType::kF32, {m, 2 * di}, std::vector<float>(m * 2 * di, 0.0f));
    const Stored norm = stored_floats(DType::kF32, {di}, rng.normal(di, 0.4, 1.0));
    TwoSequences seqs(*cpu, *gpu, cfg);
    for (auto [n0, n1] : {std::pair{2, 7}, std::pair{11, 1}, std::pair{9, 30}, std::pair{0, 3}, std::pair{1, 1}}) {
      auto [bc, bg] = seqs.batches(n0, n1);
      const int64_t T = n0 + n1;
      // Token at position pos (window u) carries entry u's values in its second half and entry
      // u+1's in its first half, so every slot of an entry's pool holds the same value.
      std::vector<float> kv(T * 2 * di);
      for (int64_t t = 0; t < T; ++t) {
        const int s = t < n0 ? 0 : 1;
        const int64_t u = bc.positions[t] / m;
        const std::vector<float> next = pattern(s, u + 1), cur = pattern(s, u);
        std::copy(next.begin(), next.end(), kv.begin() + t * 2 * di);
        std::copy(cur.begin(), cur.end(), kv.begin() + t * 2 * di + di);
      }
      auto [kc, kg] = both_f32(kv, {T, 2 * di});
      auto [gc, gg] = both_f32(std::vector<float>(T * 2 * di, 0.0f), {T, 2 * di});
      for (auto [be, k_, g_, b_] : {std::tuple{cpu.get(), kc, gc, &bc}, std::tuple{gpu.get(), kg, gg, &bg}})
        be->compressor({.kv = k_, .gate = g_, .ape = ape.view, .norm_weight = norm.view, .batch = b_, .rope = &identity,
                        .layer = 0, .slot = CompressorSlot::kIndexer, .ratio = m, .dim = di, .overlap = true,
                        .norm_eps = 0.0, .key_precision = p});
      for (int s = 0; s < 2; ++s) {
        const std::vector<float> want = cpu_entries(*seqs.cpu[s], CompressorSlot::kIndexer);
        const std::vector<float> got = std::string(gpu->name()) == "cpu"
                                           ? cpu_entries(*seqs.gpu[s], CompressorSlot::kIndexer)
                                           : cuda::state_entries(*seqs.gpu[s], 0, CompressorSlot::kIndexer);
        expect_same_bits(got, want, std::string("keys ") + key_precision_name(p) + " seq " + std::to_string(s));
      }
      std::vector<float> hw = rng.normal(T * Hi);
      for (int64_t h = 0; h < Hi; ++h) hw[(T - 1) * Hi + h] = 0.0f;  // last token: every score 0, a full tie
      const auto q = both_f32(rng.normal(T * Hi * di), {T, Hi, di});
      const auto w = both_f32(hw, {T, Hi});
      const int64_t C = max_visible(bc, m);
      for (int64_t k : {int64_t{3}, int64_t{8}}) {
        const std::string what = std::string("indexer keys ") + key_precision_name(p) + " batch (" +
                                 std::to_string(n0) + ", " + std::to_string(n1) + ") k=" + std::to_string(k);
        const std::vector<int32_t> got = indexer_on_both(*cpu, *gpu, q, w, bc, bg, m, k, C + 1, what);
        for (int64_t t = 0; t < T; ++t) {  // fewer visible entries than k: the tail is -1 on both
          const int64_t visible = (bc.positions[t] + 1) / m;
          for (int64_t i = visible; i < k; ++i) EXPECT_EQ(got[t * k + i], -1) << what << " token " << t << " slot " << i;
        }
      }
      seqs.advance(n0, n1);
    }
  }
}

// Attention over window (ring + batch) and compressed entries, two sequences per batch, across
// batches longer than the window (ring overwrite). CSA selections come from the CPU indexer with
// -1 holes punched in, so both backends attend to the same entries.
// Every attention kind against the CPU over a run of two-sequence batches: `window`, `k` CSA
// selections per token (index 1 and every index from `masked_from` on are -1), queries of scale 0.5.
void CudaOps::check_attention_every_kind(int64_t window, int64_t k, int64_t masked_from,
                                         std::initializer_list<std::pair<int64_t, int64_t>> batches, uint64_t seed,
                                         int64_t H) {
  for (AttentionKind kind : {AttentionKind::kSliding, AttentionKind::kHca, AttentionKind::kCsa}) {
    Rng rng(seed);
    const ModelConfig cfg = attn_config(kind, window);
    const int64_t Dh = cfg.head_dim, m = cfg.compress_ratio[0];
    const bool csa = kind == AttentionKind::kCsa;
    std::vector<float> sink_values = {0.3f, -1.0f, 4.0f};
    while (static_cast<int64_t>(sink_values.size()) < H) sink_values.push_back(static_cast<float>(rng.normal(1, 2.0)[0]));
    sink_values.resize(H);
    Stored sinks = stored_floats(DType::kF32, {H}, sink_values);
    const CompressorCase main_case(rng, Dh, std::max<int64_t>(m, 1), csa);
    TwoSequences seqs(*cpu, *gpu, cfg);
    for (auto [n0, n1] : batches) {
      auto [bc, bg] = seqs.batches(n0, n1);
      const int64_t T = n0 + n1;
      if (kind != AttentionKind::kSliding) {
        auto [kc, kg] = both_f32(rng.normal(T * main_case.width), {T, main_case.width});
        auto [gc, gg] = both_f32(rng.normal(T * main_case.width), {T, main_case.width});
        cpu->compressor(main_case.params(kc, gc, bc, kRope, CompressorSlot::kMain));
        gpu->compressor(main_case.params(kg, gg, bg, kRope, CompressorSlot::kMain));
      }
      Tensor sel_c, sel_g;
      if (csa) {
        std::vector<int32_t> sel(T * k);
        for (int64_t t = 0; t < T; ++t) {
          const int64_t visible = (bc.positions[t] + 1) / m;
          for (int64_t i = 0; i < k; ++i)
            sel[t * k + i] = (i == 1 || i >= masked_from || visible == 0)
                                 ? -1
                                 : static_cast<int32_t>(rng.integer(0, visible - 1));
        }
        std::tie(sel_c, sel_g) = both_i32(sel, {T, k});
      }
      auto [qc, qg] = both_f32(rng.normal(T * H * Dh, 0.5), {T, H, Dh});
      auto [vc, vg] = both_f32(rng.normal(T * Dh), {T, Dh});
      auto [oc, og] = both_alloc(ElemType::kF32, {T, H, Dh});
      const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
      cpu->attention({.out = oc, .q = qc, .kv = vc, .selected = sel_c, .sinks = sinks.view, .batch = &bc, .layer = 0,
                     .kind = kind, .ratio = m, .window = cfg.sliding_window, .scale = scale});
      gpu->attention({.out = og, .q = qg, .kv = vg, .selected = sel_g, .sinks = sinks.view, .batch = &bg, .layer = 0,
                     .kind = kind, .ratio = m, .window = cfg.sliding_window, .scale = scale});
      expect_close(*gpu, og, *cpu, oc, kOpTol,
                   "attention kind " + std::to_string(static_cast<int>(kind)) + " window " + std::to_string(window) +
                       " batch (" + std::to_string(n0) + ", " + std::to_string(n1) + ")");
      cpu->window_append({.kv = vc, .batch = &bc, .layer = 0});
      gpu->window_append({.kv = vg, .batch = &bg, .layer = 0});
      seqs.advance(n0, n1);
    }
  }
}

TEST_F(CudaOps, AttentionMatchesCpuForEveryKind) {
  check_attention_every_kind(5, 4, 4, {{7, 3}, {4, 9}, {1, 1}, {12, 6}}, 81);
}

// Candidate counts across several blocks of the split attention (64 candidates a block): a window
// of 70, 150 CSA selections of which 40.. are -1 (at least one block of masked candidates), HCA
// entries past 64, over sequences of about 300 tokens in prefill chunks and single decode steps.
TEST_F(CudaOps, AttentionAcrossManySplitsMatchesCpu) {
  check_attention_every_kind(70, 150, 40, {{64, 40}, {64, 64}, {64, 64}, {64, 63}, {1, 1}, {1, 64}, {1, 1}},
                             83);
}

// 16 and 24 heads: the split attention takes 8 heads a block (each key read once for all of them);
// each head's sums are those of a block of one head.
TEST_F(CudaOps, AttentionManyHeadsABlockMatchesCpu) {
  check_attention_every_kind(70, 150, 40, {{64, 40}, {1, 1}, {1, 64}}, 84, 16);
  check_attention_every_kind(70, 150, 40, {{64, 40}, {1, 1}}, 85, 24);
}

// The fast profiles' attention on the tensor cores (AttentionParams::bf16_operands): q, the
// batch's keys and the compressed entries bf16 values (the compressor's bf16 rounding); every kind,
// 32 heads x Dh 128 and 256 and V4's 64 x 512 (the 16-head blocks take Dh 256 and 512); candidates
// past one split of 640 (CSA: a window of 70 and 600 selections, 40 of them -1 and one more every
// 7th; HCA: 590 entries). Held at the op bar to the fp32 CUDA-core kernels on the same device state
// (the two compressors' bf16 roundings of an entry can differ by an ulp, so the CPU's entries are
// not the GPU's), and to the CPU where the inputs are the same (window only); the keys read from
// the state's bf16 copies and converted in the kernel give the same bits, so do both block shapes;
// sequence 1's tokens alone give the same bits as in their batch.
// AttentionParams::weights_bf16 (`--attn-weights bf16`) on the call `w` (bf16 operands), whose
// exact result `exact` was the GPU's last attention call: the tensor-core kernel's one-term weights,
// or where the call cannot run on that kernel (attn_mma or attn_split off) attention_kernel's; and
// on `fp32_path` (fp32 operands, its exact result in its out) always attention_kernel's. A weight rounded to bf16 moves by at most 2^-8 of
// itself (half a unit of its 8-bit significand; 2^-9 at the top of its binade), by 2^-9 / sqrt(3) to
// 2^-8 / sqrt(3) in RMS, and a row's rounding errors are independent, so the outputs move by about
// that much of their RMS: the bar is 2^-7, and some output must move beyond kOpTol (the flag was applied). Where
// `on_cpu` is given (a sliding-window call, the same keys on both backends, one split a token: the
// CPU's chunks) the CPU's experiment is the reference: the kernel lies within a quarter of the
// rounding's own move of it. What differs there is the fp32 order of the logits and expf, a few
// ulps of a weight, so a weight that near a bf16 tie rounds the other way (about 1e-4 of them: a
// few hundredths of the move); a kernel that ignored the flag would lie the whole move away.
// The call p at every block shape of the tensor-core attention gives the bits `want` (its output at
// the shape the call's size picks): 16 heads and 16 warps a block (Dh 256 and 512; Dh 128 stays at
// 32), 32 heads and 8 warps, or 64 heads a block on wgmma (where H takes them; from the bf16
// copies). The 16-head blocks from the bf16 copies with a chunk's logits beside the chunk before's
// softmax and weighted sum (the default) and without (cuda::set_attention_overlap(-1)); each
// (token, 16 heads, split) on 1, 2 or 4 blocks, each with its slice of the dims
// (cuda::set_attention_dim_slices; 0: as the call's size picks); the 64-head blocks in three
// forms: a chunk a round without its logits issued before the chunk before's softmax and with
// them (cuda::set_attention_wg_pair(-1), cuda::set_attention_wg_ahead: -1 and 1), and two chunks a
// round (set_attention_wg_pair(1)). Where a shape is forced, the launch must have run it (its dim
// slices, the wgmma form), so a form the launch skips for the call (the weights' one-term form
// once was) fails here.
void CudaOps::check_attention_block_shapes(const AttentionParams& p, const std::vector<float>& want,
                                           const std::string& what) {
  const int64_t T = p.out.dim(0), H = p.out.dim(1), Dh = p.out.dim(2);
  const bool copies = cuda::cuda_feature_on("attn_mma") && cuda::cuda_feature_on("attn_split") &&
                      cuda::cuda_feature_on("attn_bf16_kv");
  for (int heads : {16, 32, 64})
    for (int overlap : {0, -1, 1})
      for (int slices : {0, 1, 2, 4}) {
        if ((heads == 32 && overlap != 0) || (heads != 16 && slices != 0) || (heads != 64 && overlap == 1)) continue;
        // (NaN-filled: a form that left an output unwritten fails the comparison.)
        AttentionParams forced = p;
        forced.out = gpu->upload_f32(std::vector<float>(T * H * Dh, std::nanf("")), {T, H, Dh});
        cuda::set_attention_block_heads(*gpu, heads);
        cuda::set_attention_overlap(overlap);
        cuda::set_attention_wg_ahead(overlap == 0 ? -1 : 1);
        cuda::set_attention_wg_pair(overlap == 1 ? 1 : -1);
        cuda::set_attention_dim_slices(slices);
        gpu->attention(forced);
        // (Where attn_mma or attn_split is off the kernels without blocks of heads ran.)
        const int ran = cuda::last_attention_tensor_cores(*gpu) ? cuda::last_attention_dim_slices() : 1;
        const bool wgmma = cuda::last_attention_tensor_cores(*gpu) && cuda::last_attention_wgmma();
        const int wg_form = cuda::last_attention_wg_form();
        cuda::set_attention_block_heads(*gpu, 0);
        cuda::set_attention_overlap(0);
        cuda::set_attention_wg_ahead(0);
        cuda::set_attention_wg_pair(0);
        cuda::set_attention_dim_slices(0);
        if (heads == 64) {
          EXPECT_EQ(wgmma, cuda::last_attention_tensor_cores(*gpu) && H % 64 == 0 && copies) << what << ", 64 heads";
          // (and the form forced: 0 a chunk a round, 1 the logits ahead, 2 two chunks a round)
          if (wgmma) {
            EXPECT_EQ(wg_form, overlap == 1 ? 2 : overlap < 0 ? 1 : 0) << what << ", 64 heads, overlap " << overlap;
          }
        } else {
          EXPECT_FALSE(wgmma) << what << ", " << heads << " heads";
        }
        const std::string form = what + ": " + std::to_string(heads) + " heads a block" +
                                 (overlap < 0 ? (heads == 64 ? ", the logits ahead" : ", the halves one after the other")
                                  : overlap > 0 ? ", two chunks a round" : "") +
                                 ", dim slices " + std::to_string(slices) + " (ran " + std::to_string(ran) + ")";
        // (Dh 128 stays on 32-head blocks, one slice.)
        const bool narrow = heads == 16 && Dh >= 256 && cuda::last_attention_tensor_cores(*gpu);
        if (slices != 0) {
          EXPECT_EQ(ran, narrow ? slices : 1) << form;
        }
        // (A token of AttentionOnTensorCoresMatchesCpu, the caller, has at most 670 candidates, so
        // at most this many splits at the process's split size (gpu-check runs these tests at 128
        // too): where twice the blocks fit in the SMs, the size's choice is more than one slice,
        // with attn_dims on.)
        const int64_t most_splits = (670 + cuda::attn_mma_split_candidates() - 1) / cuda::attn_mma_split_candidates();
        if (slices == 0 && narrow && cuda::cuda_feature_on("attn_dims") &&
            2 * T * (H / 16) * most_splits <= cuda::sm_count()) {
          EXPECT_GT(ran, 1) << form;
        }
        expect_same_bits(gpu->download_f32(forced.out), want, form);
      }
}

void CudaOps::check_attention_bf16_weights(AttentionParams w, const Tensor& exact, AttentionParams fp32_path,
                                           AttentionParams on_cpu, const std::string& what) {
  const bool real = std::string(gpu->name()) == "cuda";
  const bool mma = !real || cuda::last_attention_tensor_cores(*gpu);
  w.weights_bf16 = on_cpu.weights_bf16 = true;
  gpu->attention(w);
  const std::vector<float> got = gpu->download_f32(w.out), ex = gpu->download_f32(exact);
  if (real && mma) {
    // The one-term form with the keys converted from the fp32 state in the kernel: the same values,
    // so the same bits.
    AttentionParams converted = w;
    converted.out = gpu->alloc(ElemType::kF32, w.out.shape());
    cuda::set_attention_bf16_kv(*gpu, false);
    gpu->attention(converted);
    cuda::set_attention_bf16_kv(*gpu, true);
    expect_same_bits(gpu->download_f32(converted.out), got, what + ": bf16 weights, keys converted in the kernel");
    // The one-term weights at every block shape: the same bits, as with three terms.
    check_attention_block_shapes(w, got, what + ", bf16 weights");
  }
  std::vector<float> want;
  if (on_cpu.batch != nullptr) {
    on_cpu.out = cpu->alloc(ElemType::kF32, w.out.shape());
    cpu->attention(on_cpu);
    want = cpu->download_f32(on_cpu.out);
  }
  const auto rms = [](const std::vector<float>& a, const std::vector<float>* b) {
    double s = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double d = static_cast<double>(a[i]) - (b ? static_cast<double>((*b)[i]) : 0.0);
      s += d * d;
    }
    return std::sqrt(s / static_cast<double>(a.empty() ? 1 : a.size()));
  };
  // The rounded outputs `r` against the exact ones `e` of the same path, and against the CPU's
  // rounding within `bar` of the move: a quarter on the tensor cores (fp32 logits and expf, so a
  // weight near a bf16 tie may round the other way), a five-hundredth on attention_kernel (its logits
  // and weights made as the CPU's, fp64: only the weighted sum's fp32 order differs; with fp32
  // logits it lay 0 to 0.049 of the move away, H200 2026-12-05).
  const auto check = [&](const std::vector<float>& r, const std::vector<float>& e, const std::string& path, double bar) {
    ASSERT_EQ(r.size(), e.size()) << path;
    const double moved = rms(r, &e), scale = rms(e, nullptr);
    int64_t beyond = 0;
    for (size_t i = 0; i < r.size(); ++i)
      beyond += std::abs(r[i] - e[i]) > kOpTol.atol + kOpTol.rtol * std::abs(e[i]) ? 1 : 0;
    std::printf("[bf16 weights] %s: moved rms %.3g = %.3f 2^-9 of the output's rms, %lld beyond kOpTol\n", path.c_str(),
                moved, moved / scale * 512.0, static_cast<long long>(beyond));
    EXPECT_GT(beyond, 0) << path << ": weights_bf16 changed nothing";
    EXPECT_LE(moved, scale / 128.0) << path << ": weights_bf16 moved the outputs more than their rounding can";
    if (want.empty()) return;
    const double apart = rms(r, &want);
    std::printf("[bf16 weights] %s: vs the CPU's experiment rms %.3g (%.3f of the move)\n", path.c_str(), apart,
                moved > 0.0 ? apart / moved : 0.0);
    EXPECT_LE(apart, bar * moved) << path << ": weights_bf16 on the GPU is not the CPU's rounding";
  };
  check(got, ex, what + (mma ? "" : " (attention_kernel: attn_mma or attn_split off)"), mma ? 0.25 : 0.002);
  if (!real) return;
  // fp32 operands (the fp32 profile with --attn-weights bf16), whose exact result is fp32_path's:
  // attention_kernel, one block a (token, head) and the CPU's chunks, whatever attn_split says.
  AttentionParams rounded = fp32_path;
  rounded.out = gpu->alloc(ElemType::kF32, fp32_path.out.shape());
  rounded.weights_bf16 = true;
  gpu->attention(rounded);
  EXPECT_FALSE(cuda::last_attention_tensor_cores(*gpu)) << what << ": fp32 operands";
  check(gpu->download_f32(rounded.out), gpu->download_f32(fp32_path.out), what + ", fp32 operands (attention_kernel)",
        0.002);
}

// AttentionParams::weights_bf16 rounds a weight where it weights its key, not in the denominator.
// Token t of one sequence attends to t + 1 keys: key 0 with logit 0 (its weight 1, exact) and t keys
// with logit a / 16 < 0 (weight p = exp(a / 16), chosen so that bf16(p) = p (1 + d) with |d| at
// least 0.9 x 2^-9, at most 2^-8). Dim 1 of every key is 1, so out[1] = (1 + t bf16(p)) / (1 + t p): about 1 + d away from 1,
// where a denominator of rounded weights, or exact weights, would give 1. The sink (-60) adds
// nothing measurable. Both backends must land within a tenth of that deviation of it, at every
// t and head (32 heads, Dh 128; 40 tokens: two chunks of 32 past t = 31, the max in the first).
TEST_F(CudaOps, AttentionWithBf16WeightsSumsTheUnroundedWeights) {
  const int64_t H = 32, Dh = 128, T = 40;
  // The key value a (a bf16 in [-8, -1]) whose weight rounds farthest from itself.
  float a = -1.0f;
  double d = 0.0;
  for (int i = 0; i <= 896; ++i) {  // (steps of 2^-7: every bf16 in [-2, -1], every other one below)
    const float v = bf16_round(-8.0f + static_cast<float>(i) / 128.0f);
    const double pv = static_cast<float>(std::exp(static_cast<double>(v) / 16.0));
    const double dv = (bf16_round(static_cast<float>(pv)) - pv) / pv;
    if (std::abs(dv) > std::abs(d)) a = v, d = dv;
  }
  ASSERT_GT(std::abs(d), 0.9 / 512.0) << "no key value whose weight rounds far enough";
  const double p = static_cast<float>(std::exp(static_cast<double>(a) / 16.0)), pr = bf16_round(static_cast<float>(p));
  ModelConfig cfg = attn_config(AttentionKind::kSliding, T);
  cfg.head_dim = Dh;
  Stored sinks = stored_floats(DType::kF32, {H}, std::vector<float>(H, -60.0f));
  TwoSequences seqs(*cpu, *gpu, cfg);
  auto [bc, bg] = seqs.batches(T, 0);
  std::vector<float> q(T * H * Dh, 0.0f), kv(T * Dh, 0.0f);
  for (int64_t i = 0; i < T * H; ++i) q[i * Dh] = 1.0f;
  for (int64_t j = 0; j < T; ++j) kv[j * Dh] = j == 0 ? 0.0f : a, kv[j * Dh + 1] = 1.0f;
  auto [qc, qg] = both_f32(q, {T, H, Dh});
  auto [vc, vg] = both_f32(kv, {T, Dh});
  auto [oc, og] = both_alloc(ElemType::kF32, {T, H, Dh});
  auto params = [&](const Tensor& o, const Tensor& qt, const Tensor& vt, const BatchInfo& b) {
    return AttentionParams{.out = o, .q = qt, .kv = vt, .sinks = sinks.view, .batch = &b, .layer = 0,
                           .kind = AttentionKind::kSliding, .window = T, .scale = 1.0 / 16.0, .bf16_operands = true,
                           .weights_bf16 = true};
  };
  cpu->attention(params(oc, qc, vc, bc));
  gpu->attention(params(og, qg, vg, bg));
  // And with fp32 operands (on CUDA attention_kernel's rounding, off the tensor cores).
  AttentionParams fp32_operands = params(gpu->alloc(ElemType::kF32, {T, H, Dh}), qg, vg, bg);
  fp32_operands.bf16_operands = false;
  gpu->attention(fp32_operands);
  const std::vector<float> got = gpu->download_f32(og), want = cpu->download_f32(oc),
                           got_fp32 = gpu->download_f32(fp32_operands.out);
  for (int64_t t = 1; t < T; ++t) {
    const double expected = (1.0 + static_cast<double>(t) * pr) / (1.0 + static_cast<double>(t) * p);
    const double bar = 0.1 * std::abs(expected - 1.0);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t i = (t * H + h) * Dh + 1;
      ASSERT_NEAR(want[i], expected, bar) << "cpu, token " << t << " head " << h << " (a " << a << ", d " << d << ")";
      ASSERT_NEAR(got[i], expected, bar) << "gpu, token " << t << " head " << h << " (a " << a << ", d " << d << ")";
      ASSERT_NEAR(got_fp32[i], expected, bar)
          << "gpu, fp32 operands, token " << t << " head " << h << " (a " << a << ", d " << d << ")";
    }
  }
}

// The attention's scratch stays within a cap by running the tokens in passes
// (cuda::set_attention_scratch_cap), whichever kernel the switches give a call: attention_kernel's
// logits and weights (bf16 weights off the tensor cores, or every call with attn_split off; H x
// candidates floats a token), the split kernel's and the tensor cores' split parts (700
// candidates: two tensor-core splits a token by default). Any cap gives the one pass's bits.
TEST_F(CudaOps, AttentionInPassesGivesTheOnePassBits) {
  if (std::string(gpu->name()) != "cuda") GTEST_SKIP() << "passes are the CUDA backend's";
  const int64_t H = 32, Dh = 128, T = 700;
  Rng rng(4242);
  ModelConfig cfg = attn_config(AttentionKind::kSliding, T);
  cfg.head_dim = Dh;
  Stored sinks = stored_floats(DType::kF32, {H}, rng.normal(H, 1.0));
  TwoSequences seqs(*cpu, *gpu, cfg);
  seqs.ids.assign(T, 0);
  auto [bc, bg] = seqs.batches(T, 0);
  std::vector<float> q = rng.normal(T * H * Dh, 0.3), kv = rng.normal(T * Dh);
  for (float& x : q) x = bf16_round(x);
  for (float& x : kv) x = bf16_round(x);
  auto [qc, qg] = both_f32(q, {T, H, Dh});
  auto [vc, vg] = both_f32(kv, {T, Dh});
  const auto run = [&](bool bf16_operands, bool weights_bf16, int64_t cap) {
    cuda::set_attention_scratch_cap(cap);
    // (The output starts as NaN: a token no pass writes cannot keep the one-pass run's values, which
    // a pooled allocation could hand back.)
    const std::vector<float> unwritten(T * H * Dh, std::numeric_limits<float>::quiet_NaN());
    AttentionParams p{.out = gpu->upload_f32(unwritten, {T, H, Dh}), .q = qg, .kv = vg, .sinks = sinks.view, .batch = &bg,
                      .layer = 0, .kind = AttentionKind::kSliding, .window = T, .scale = 1.0 / std::sqrt(double(Dh)),
                      .bf16_operands = bf16_operands, .weights_bf16 = weights_bf16};
    gpu->attention(p);
    cuda::set_attention_scratch_cap(0);
    return std::tuple{gpu->download_f32(p.out), cuda::last_attention_passes(*gpu), cuda::last_attention_tensor_cores(*gpu)};
  };
  // Which kernel takes each call, from the switches (attn_mma and attn_split on: the tensor cores for
  // bf16 operands; attn_split on: the split kernel for exact weights; else attention_kernel), and
  // its scratch a token: the splits' parts H x splits x (Dh + 2) floats (640 candidates a
  // tensor-core split by default, SPARROW_CUDA_ATTN_MMA_SPLIT; 64 a split-kernel split), or
  // attention_kernel's H x T logits and weights.
  const bool split_on = cuda::cuda_feature_on("attn_split");
  for (const bool bf16_operands : {false, true}) {
    for (const bool weights_bf16 : {false, true}) {
      const std::string what = std::string(bf16_operands ? "bf16" : "fp32") + " operands, " +
                               (weights_bf16 ? "bf16" : "exact") + " weights";
      const bool tc = bf16_operands && cuda::attention_tensor_cores_take(H, Dh);
      const bool kernel = !tc && (weights_bf16 || !split_on);
      const int64_t splits = cuda::attention_splits(T, tc);
      const int64_t token_bytes = (kernel ? H * T : H * splits * (Dh + 2)) * int64_t{sizeof(float)};
      // (One split a token: the tensor-core kernel finishes each token itself, without scratch.)
      const int64_t want_passes = tc && splits == 1 ? 1 : (T + 2) / 3;
      const auto [one, one_passes, mma] = run(bf16_operands, weights_bf16, 0);
      EXPECT_EQ(mma, tc) << what;
      EXPECT_EQ(one_passes, 1) << what;
      EXPECT_EQ(std::count_if(one.begin(), one.end(), [](float x) { return std::isnan(x); }), 0) << what << ": outputs unwritten";
      // Three tokens' scratch a pass.
      const auto [many, passes, mma_too] = run(bf16_operands, weights_bf16, 3 * token_bytes);
      std::printf("[attention passes] %s: %s, %lld passes\n", what.c_str(),
                  tc ? "tensor cores" : kernel ? "attention_kernel" : "split kernel", static_cast<long long>(passes));
      EXPECT_EQ(passes, want_passes) << what;
      EXPECT_EQ(mma_too, tc) << what;
      ASSERT_EQ(many.size(), one.size());
      EXPECT_EQ(0, std::memcmp(many.data(), one.data(), one.size() * sizeof(float))) << what << ": passes changed bits";
    }
  }
}

TEST_F(CudaOps, AttentionOnTensorCoresMatchesCpu) {
  const bool real = std::string(gpu->name()) == "cuda";
  int64_t o_folds = 0;  // calls that rotated their output back in the kernel (AttentionParams::o_rope)
  for (auto [H, Dh] : {std::pair<int64_t, int64_t>{32, 128}, std::pair<int64_t, int64_t>{32, 256}, std::pair<int64_t, int64_t>{64, 512},
                       std::pair<int64_t, int64_t>{64, 128}, std::pair<int64_t, int64_t>{64, 256}}) {
    for (AttentionKind kind : {AttentionKind::kSliding, AttentionKind::kHca, AttentionKind::kCsa}) {
      Rng rng(90 + Dh + static_cast<int>(kind) + H);
      ModelConfig cfg = attn_config(kind, 70);
      cfg.head_dim = Dh;
      const int64_t m = cfg.compress_ratio[0];
      const bool csa = kind == AttentionKind::kCsa;
      const int64_t k = csa ? 600 : 0;
      Stored sinks = stored_floats(DType::kF32, {H}, rng.normal(H, 1.0));
      const CompressorCase main_case(rng, Dh, std::max<int64_t>(m, 1), csa);
      TwoSequences seqs(*cpu, *gpu, cfg);
      seqs.ids.assign(3000, 0);
      auto bf16_normal = [&](int64_t n, double sd) {
        std::vector<float> v = rng.normal(n, sd);
        for (float& x : v) x = bf16_round(x);
        return v;
      };
      // (2950, 150) fills the state (HCA to 590 entries); the others are checked.
      for (auto [n0, n1] : {std::pair<int64_t, int64_t>{2950, 150}, std::pair<int64_t, int64_t>{5, 3},
                            std::pair<int64_t, int64_t>{1, 1}, std::pair<int64_t, int64_t>{2, 9}}) {
        const bool check = n0 < 100;
        auto [bc, bg] = seqs.batches(n0, n1);
        const int64_t T = n0 + n1;
        if (kind != AttentionKind::kSliding) {
          auto [kc, kg] = both_f32(rng.normal(T * main_case.width), {T, main_case.width});
          auto [gc, gg] = both_f32(rng.normal(T * main_case.width), {T, main_case.width});
          for (auto [be, k_, g_, b_] : {std::tuple{cpu.get(), kc, gc, &bc}, std::tuple{gpu.get(), kg, gg, &bg}}) {
            CompressorParams cp = main_case.params(k_, g_, *b_, kRope, CompressorSlot::kMain);
            cp.round_bf16 = true;
            be->compressor(cp);
          }
        }
        // (Dims 0..3 of every row zero: a sliding layer's outputs there are exact zeros, which the
        // 64-head ending leaves to the division rather than its head's reciprocal; the block shapes'
        // check holds it to the other forms' bits.)
        std::vector<float> kv = bf16_normal(T * Dh, 1.0);
        for (int64_t r = 0; r < T; ++r) std::fill_n(kv.begin() + r * Dh, 4, 0.0f);
        auto [vc, vg] = both_f32(kv, {T, Dh});
        if (check) {
          std::vector<int32_t> sel(T * k);
          for (int64_t t = 0; t < T; ++t) {
            const int64_t visible = (bc.positions[t] + 1) / std::max<int64_t>(m, 1);
            for (int64_t i = 0; i < k; ++i)
              sel[t * k + i] = (i >= 560 || i % 7 == 3 || visible == 0) ? -1 : static_cast<int32_t>(rng.integer(0, visible - 1));
          }
          Tensor sel_c, sel_g;
          if (csa) std::tie(sel_c, sel_g) = both_i32(sel, {T, k});
          const std::vector<float> qv = bf16_normal(T * H * Dh, 0.5);
          auto [qc, qg] = both_f32(qv, {T, H, Dh});
          auto [oc, og] = both_alloc(ElemType::kF32, {T, H, Dh});
          const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
          auto params = [&](const Tensor& o, const Tensor& q, const Tensor& v, const Tensor& sl, const BatchInfo& b) {
            return AttentionParams{.out = o, .q = q, .kv = v, .selected = sl, .sinks = sinks.view, .batch = &b,
                                   .layer = 0, .kind = kind, .ratio = m, .window = cfg.sliding_window, .scale = scale,
                                   .bf16_operands = true};
          };
          cpu->attention(params(oc, qc, vc, sel_c, bc));
          AttentionParams fp32_path = params(gpu->alloc(ElemType::kF32, {T, H, Dh}), qg, vg, sel_g, bg);
          fp32_path.bf16_operands = false;
          gpu->attention(fp32_path);
          gpu->attention(params(og, qg, vg, sel_g, bg));
          // (Read now: the checks below make calls of their own.)
          const bool og_bf16_kv = real && cuda::last_attention_bf16_kv(*gpu);
          const std::string what = "attention mma H=" + std::to_string(H) + " Dh=" + std::to_string(Dh) + " kind " +
                                   std::to_string(static_cast<int>(kind)) + " batch (" + std::to_string(n0) + ", " +
                                   std::to_string(n1) + ")";
          if (real) {
            EXPECT_EQ(cuda::last_attention_tensor_cores(*gpu),
                      cuda::cuda_feature_on("attn_mma") && cuda::cuda_feature_on("attn_split"))
                << what;
          }
          expect_close(*gpu, og, *gpu, fp32_path.out, kOpTol, what + " vs the fp32 kernels");
          if (kind == AttentionKind::kSliding) expect_close(*gpu, og, *cpu, oc, kOpTol, what + " vs the CPU");
          check_attention_bf16_weights(params(gpu->alloc(ElemType::kF32, {T, H, Dh}), qg, vg, sel_g, bg), og, fp32_path,
                                       kind == AttentionKind::kSliding ? params(oc, qc, vc, sel_c, bc) : AttentionParams{},
                                       what);
          if (real) {
            // The keys from the state's bf16 copies (kept since the state was made) or converted
            // from the fp32 state in the kernel: the same values, the same bits.
            const bool copies = cuda::cuda_feature_on("attn_mma") && cuda::cuda_feature_on("attn_split") &&
                                cuda::cuda_feature_on("attn_bf16_kv");
            EXPECT_EQ(og_bf16_kv, copies) << what;
            const Tensor converted = gpu->alloc(ElemType::kF32, {T, H, Dh});
            cuda::set_attention_bf16_kv(*gpu, false);
            gpu->attention(params(converted, qg, vg, sel_g, bg));
            cuda::set_attention_bf16_kv(*gpu, true);
            EXPECT_FALSE(cuda::last_attention_bf16_kv(*gpu)) << what;
            expect_same_bits(gpu->download_f32(converted), gpu->download_f32(og), what + ": bf16 copies vs converted");
            check_attention_block_shapes(params(og, qg, vg, sel_g, bg), gpu->download_f32(og), what);
            // q's per-head norm and RoPE inside the attention (AttentionParams::q_rope: folded into
            // the kernel's staging of q) against the rms_norm and rope ops first: the same bits, with
            // and without bf16 roundings, at both block shapes. The rotated dims start mid-chunk of a
            // warp's 32 at Dh 128 and 256 (48 of them), on a chunk at 512 (V4's 64).
            const int64_t rope_dim = Dh == 512 ? 64 : 48;
            RopeTable qrope;
            for (int64_t i = 0; i < rope_dim / 2; ++i) qrope.inv_freq.push_back(std::pow(10000.0, -2.0 * i / rope_dim));
            // (Its own generator: the cases after it get the same inputs on every backend.)
            Rng qrng(700 + Dh + static_cast<int>(kind) + n0);
            const std::vector<float> raw = qrng.normal(T * H * Dh, 3.0);
            for (bool round : {true, false})
              for (int heads : {0, 16, 32, 64}) {
                const std::string tag = what + (round ? ", rounded" : ", fp32") + ", q folded, heads " + std::to_string(heads);
                const Tensor q_ops = gpu->upload_f32(raw, {T, H, Dh}), q_fold = gpu->upload_f32(raw, {T, H, Dh});
                gpu->rms_norm({.out = q_ops, .in = q_ops, .weight = {}, .group = Dh, .eps = 1e-6, .round_bf16 = round});
                gpu->rope({.x = q_ops, .table = &qrope, .direction = RopeDirection::kForward, .round_bf16 = round}, bg);
                const Tensor o_ops = gpu->alloc(ElemType::kF32, {T, H, Dh}), o_fold = gpu->alloc(ElemType::kF32, {T, H, Dh});
                cuda::set_attention_block_heads(*gpu, heads);
                AttentionParams pa = params(o_ops, q_ops, vg, sel_g, bg);
                pa.round_bf16 = round;
                gpu->attention(pa);
                AttentionParams pf = params(o_fold, q_fold, vg, sel_g, bg);
                pf.round_bf16 = round;
                pf.q_rope = &qrope;
                pf.q_norm_eps = 1e-6;
                gpu->attention(pf);
                cuda::set_attention_block_heads(*gpu, 0);
                // (Folded only on the tensor-core kernel: with attn_mma or attn_split off, the ops run first.)
                EXPECT_EQ(cuda::last_attention_q_fold(*gpu),
                          cuda::cuda_feature_on("attn_q_fold") && cuda::last_attention_tensor_cores(*gpu))
                    << tag;
                expect_same_bits(gpu->download_f32(o_fold), gpu->download_f32(o_ops), tag);
                // The output's inverse RoPE inside the attention (AttentionParams::o_rope: in the
                // tensor-core kernel's stores where every token is one split, else the rope op after
                // it) against the rope op after the attention: the same bits. (Folded only where every
                // token of the call is one split: CSA calls here reach 670 candidates as the window
                // fills, and are then not folded.)
                const Tensor r_ops = gpu->alloc(ElemType::kF32, {T, H, Dh}), r_fold = gpu->alloc(ElemType::kF32, {T, H, Dh});
                cuda::set_attention_block_heads(*gpu, heads);
                AttentionParams ra = params(r_ops, q_ops, vg, sel_g, bg);
                ra.round_bf16 = round;
                gpu->attention(ra);
                gpu->rope({.x = r_ops, .table = &qrope, .direction = RopeDirection::kInverse, .round_bf16 = round}, bg);
                AttentionParams rf = params(r_fold, q_ops, vg, sel_g, bg);
                rf.round_bf16 = round;
                rf.o_rope = &qrope;
                gpu->attention(rf);
                const bool o_folded = cuda::last_attention_o_fold(*gpu);
                cuda::set_attention_block_heads(*gpu, 0);
                o_folds += o_folded ? 1 : 0;
                if (o_folded) {
                  EXPECT_TRUE(cuda::cuda_feature_on("attn_o_fold") && cuda::last_attention_tensor_cores(*gpu)) << tag;
                  EXPECT_FALSE(cuda::last_attention_wgmma()) << tag << ": folded on the 64-head blocks, which do not rotate";
                }
                expect_same_bits(gpu->download_f32(r_fold), gpu->download_f32(r_ops), tag + ", output rotated back");
              }
          }
          // Sequence 1's tokens alone.
          auto [b1c, b1g] = seqs.batches(0, n1);
          (void)b1c;
          const Tensor q1 = gpu->upload_f32(std::vector<float>(qv.begin() + n0 * H * Dh, qv.end()), {n1, H, Dh});
          const Tensor v1 = gpu->upload_f32(std::vector<float>(kv.begin() + n0 * Dh, kv.end()), {n1, Dh});
          Tensor s1;
          if (csa) s1 = gpu->upload_i32(std::vector<int32_t>(sel.begin() + n0 * k, sel.end()), {n1, k});
          const Tensor o1 = gpu->alloc(ElemType::kF32, {n1, H, Dh});
          gpu->attention(params(o1, q1, v1, s1, b1g));
          const std::vector<float> all = gpu->download_f32(og);
          expect_same_bits(gpu->download_f32(o1), std::vector<float>(all.begin() + n0 * H * Dh, all.end()),
                           what + ": sequence 1 alone vs in the batch");
        }
        cpu->window_append({.kv = vc, .batch = &bc, .layer = 0});
        gpu->window_append({.kv = vg, .batch = &bg, .layer = 0});
        seqs.advance(n0, n1);
      }
    }
  }
  // The fold ran (SWA and HCA tokens are one split here) wherever the tensor-core kernel does.
  if (real && cuda::cuda_feature_on("attn_o_fold") && cuda::cuda_feature_on("attn_mma") && cuda::cuda_feature_on("attn_split")) {
    EXPECT_GT(o_folds, 0);
  }
}

// The KV stored as FP8 KV records (LayerState::ring_rec, CompressorBuffer::entries_rec: what the
// fast profiles keep under SPARROW_CUDA_ENABLE=kv_record), every kind at V4's shape (64 heads, Dh
// 512 with 64 RoPE dims): two sequences in shared batches on GPU states keeping records and on GPU
// states keeping values (cuda::set_kv_records on and off when they are made), with the same inputs,
// the kv rows record values as the fast profile makes them. The attention outputs are the same bits (a record decodes to its bf16
// copy's values), so are the compressed entries (decoded: entry_sim's values); the ring wraps (a
// window of 70 under 150-token batches) and the entries' buffer grows (its records copied) on the way.
// A call that would leave records unread or unwritten fails with an error naming the layer.
TEST_F(CudaOps, KvRecordsInTheStateGiveTheValuesBits) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  const int64_t H = 64, Dh = 512, rope_dim = 64;
  RopeTable rope;
  for (int64_t i = 0; i < rope_dim / 2; ++i) rope.inv_freq.push_back(std::pow(10000.0, -2.0 * i / rope_dim));
  ASSERT_EQ(rope.rope_dim(), rope_dim);
  const KvRecordLayout l = kv_record_layout(Dh, rope_dim);
  for (AttentionKind kind : {AttentionKind::kSliding, AttentionKind::kHca, AttentionKind::kCsa}) {
    Rng rng(584 + static_cast<int>(kind));
    ModelConfig cfg = attn_config(kind, 70);
    cfg.num_heads = H, cfg.head_dim = Dh, cfg.rope_dim = rope_dim;
    if (cuda::kv_records_layout(cfg).bytes == 0) GTEST_SKIP() << "records are off (SPARROW_CUDA_DISABLE)";
    const int64_t m = cfg.compress_ratio[0];
    const bool csa = kind == AttentionKind::kCsa;
    const int64_t k = csa ? 96 : 0;
    const std::string name = kind == AttentionKind::kSliding ? "SWA" : csa ? "CSA" : "HCA";
    Stored sinks = stored_floats(DType::kF32, {H}, rng.normal(H, 1.0));
    const CompressorCase main_case(rng, Dh, std::max<int64_t>(m, 1), csa);
    std::unique_ptr<SequenceState> rec[2], val[2];
    cuda::set_kv_records(*gpu, true);
    for (int s = 0; s < 2; ++s) rec[s] = gpu->create_sequence_state(cfg);
    cuda::set_kv_records(*gpu, false);
    for (int s = 0; s < 2; ++s) val[s] = gpu->create_sequence_state(cfg);
    cuda::set_kv_records(*gpu, cuda::cuda_feature_enabled("kv_record"));  // (the default again)
    const std::vector<int32_t> ids(200, 0);
    for (auto [n0, n1] : {std::pair<int64_t, int64_t>{150, 150}, std::pair<int64_t, int64_t>{1, 1},
                          std::pair<int64_t, int64_t>{5, 3}, std::pair<int64_t, int64_t>{1, 0},
                          std::pair<int64_t, int64_t>{0, 2}, std::pair<int64_t, int64_t>{40, 1}}) {
      const int64_t T = n0 + n1;
      const auto batch_of = [&](std::unique_ptr<SequenceState>* st) {
        std::vector<SequenceChunk> chunks;
        if (n0 > 0) chunks.push_back({st[0].get(), std::span<const int32_t>(ids).subspan(0, n0)});
        if (n1 > 0) chunks.push_back({st[1].get(), std::span<const int32_t>(ids).subspan(0, n1)});
        return batch_build(chunks);
      };
      const BatchInfo br = batch_of(rec), bv = batch_of(val);
      // kv: record values (encoded and decoded on the host); q: bf16 values.
      std::vector<float> kv = rng.normal(T * Dh, 1.0);
      std::vector<uint8_t> bytes(l.bytes);
      for (int64_t t = 0; t < T; ++t) {
        kv_record_encode(kv.data() + t * Dh, l, bytes.data());
        kv_record_decode(bytes.data(), l, kv.data() + t * Dh);
      }
      std::vector<float> qv = rng.normal(T * H * Dh, 0.5);
      for (float& x : qv) x = bf16_round(x);
      std::vector<int32_t> sel(T * k);
      for (int64_t t = 0; t < T; ++t) {
        const int64_t visible = (br.positions[t] + 1) / std::max<int64_t>(m, 1);
        for (int64_t i = 0; i < k; ++i)
          sel[t * k + i] = (i % 5 == 2 || visible == 0) ? -1 : static_cast<int32_t>(rng.integer(0, visible - 1));
      }
      const std::vector<float> ckv = csa || m > 0 ? rng.normal(T * main_case.width) : std::vector<float>{};
      const std::vector<float> cgate = csa || m > 0 ? rng.normal(T * main_case.width, 2.0) : std::vector<float>{};
      std::vector<float> out[2], out_w[2];
      for (int side = 0; side < 2; ++side) {
        const bool records = side == 0;
        const BatchInfo& b = records ? br : bv;
        if (kind != AttentionKind::kSliding) {
          CompressorParams cp = main_case.params(gpu->upload_f32(ckv, {T, main_case.width}),
                                                 gpu->upload_f32(cgate, {T, main_case.width}), b, rope, CompressorSlot::kMain);
          cp.round_bf16 = true;
          cp.entry_sim = {QuantSimKind::kFp8Pow2Block64};
          gpu->compressor(cp);
        }
        const Tensor q = gpu->upload_f32(qv, {T, H, Dh}), v = gpu->upload_f32(kv, {T, Dh});
        const Tensor o = gpu->alloc(ElemType::kF32, {T, H, Dh});
        const Tensor sel_g = csa ? gpu->upload_i32(sel, {T, k}) : Tensor();
        // Into `out` (o, or a NaN-filled tensor of its own: a form that left an output unwritten fails).
        const auto attend = [&](const Tensor& out, bool weights_bf16) {
          gpu->attention({.out = out, .q = q, .kv = v, .selected = sel_g, .sinks = sinks.view, .batch = &b, .layer = 0,
                          .kind = kind, .ratio = m, .window = cfg.sliding_window,
                          .scale = 1.0 / std::sqrt(static_cast<double>(Dh)), .round_bf16 = true, .bf16_operands = true,
                          .kv_record = true, .weights_bf16 = weights_bf16});
        };
        attend(o, false);
        const std::string what = name + (records ? " records" : " values") + " batch (" + std::to_string(n0) + ", " +
                                 std::to_string(n1) + ")";
        EXPECT_EQ(cuda::last_attention_records(*gpu), records) << what;
        out[side] = gpu->download_f32(o);
        for (int heads : {16, 32})  // either block shape, 16 heads on 1, 2 or 4 blocks: the same bits
          for (int slices : {1, 2, 4}) {
            if (heads == 32 && slices != 1) continue;
            cuda::set_attention_block_heads(*gpu, heads);
            cuda::set_attention_dim_slices(slices);
            const Tensor formed = gpu->upload_f32(std::vector<float>(T * H * Dh, std::nanf("")), {T, H, Dh});
            attend(formed, false);
            cuda::set_attention_block_heads(*gpu, 0);
            cuda::set_attention_dim_slices(0);
            expect_same_bits(gpu->download_f32(formed), out[side],
                             what + ", " + std::to_string(heads) + " heads a block, dim slices " + std::to_string(slices));
          }
        // With the weights as one bf16 term (AttentionParams::weights_bf16): the records' form too.
        attend(o, true);
        EXPECT_EQ(cuda::last_attention_records(*gpu), records) << what << ", bf16 weights";
        out_w[side] = gpu->download_f32(o);
        gpu->window_append({.kv = v, .batch = &b, .layer = 0, .kv_record = true});
        for (int s = 0; s < 2; ++s) {
          EXPECT_EQ(cuda::state_keeps_records(*(records ? rec : val)[s], 0), records) << what << " seq " << s;
          (records ? rec : val)[s]->advance(s == 0 ? n0 : n1);
        }
      }
      const std::string what = name + " batch (" + std::to_string(n0) + ", " + std::to_string(n1) + ")";
      expect_same_bits(out[0], out[1], what + ": attention over records vs values");
      expect_same_bits(out_w[0], out_w[1], what + ": attention over records vs values, bf16 weights");
      EXPECT_NE(out_w[0], out[0]) << what << ": bf16 weights changed nothing";
      if (kind != AttentionKind::kSliding)
        for (int s = 0; s < 2; ++s)
          expect_same_bits(cuda::state_entries(*rec[s], 0, CompressorSlot::kMain),
                           cuda::state_entries(*val[s], 0, CompressorSlot::kMain), what + " entries seq " + std::to_string(s));
    }
    if (kind != AttentionKind::kSliding) {
      EXPECT_GT(cuda::state_entries(*rec[0], 0, CompressorSlot::kMain).size(), 0u);
      // Records only: 584 bytes an entry against the values' 2048 (+ 1024 for the bf16 copies where
      // kept), at the same capacities; records with a bf16 copy too would be 1608.
      for (int s = 0; s < 2; ++s)
        EXPECT_LT(3 * cuda::state_entry_bytes(*rec[s], 0), cuda::state_entry_bytes(*val[s], 0)) << name << " seq " << s;
    }
    // Records, then a call whose rows are not record values: refused with the layer named.
    std::vector<SequenceChunk> one{{rec[0].get(), std::span<const int32_t>(ids).subspan(0, 1)}};
    const BatchInfo b1 = batch_build(one);
    const Tensor v1 = gpu->upload_f32(std::vector<float>(Dh, 0.5f), {1, Dh});
    const Tensor q1 = gpu->upload_f32(std::vector<float>(H * Dh, 0.25f), {1, H, Dh});
    const Tensor o1 = gpu->alloc(ElemType::kF32, {1, H, Dh});
    const Tensor s1 = csa ? gpu->upload_i32(std::vector<int32_t>(k, 0), {1, k}) : Tensor();
    const auto message = [](auto&& f) {
      try {
        f();
      } catch (const std::exception& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    const std::string attn_error = message([&] {
      gpu->attention({.out = o1, .q = q1, .kv = v1, .selected = s1, .sinks = sinks.view, .batch = &b1, .layer = 0,
                      .kind = kind, .ratio = m, .window = cfg.sliding_window, .scale = 0.1, .round_bf16 = true,
                      .bf16_operands = true});
    });
    EXPECT_NE(attn_error.find("layer 0"), std::string::npos) << name << ": " << attn_error;
    EXPECT_NE(attn_error.find("records"), std::string::npos) << name << ": " << attn_error;
    const std::string append_error = message([&] { gpu->window_append({.kv = v1, .batch = &b1, .layer = 0}); });
    EXPECT_NE(append_error.find("layer 0"), std::string::npos) << name << ": " << append_error;
    EXPECT_NE(append_error.find("kv_record"), std::string::npos) << name << ": " << append_error;
  }
}

// No window and every selection -1: the sink is all a query has, and the output is 0.
TEST_F(CudaOps, AttentionWithNothingButTheSink) {
  Rng rng(82);
  const ModelConfig cfg = attn_config(AttentionKind::kCsa, 0);
  const int64_t H = 2, Dh = cfg.head_dim, k = 3, T = 5;
  Stored sinks = stored_floats(DType::kF32, {H}, {0.5f, -2.0f});
  TwoSequences seqs(*cpu, *gpu, cfg);
  auto [bc, bg] = seqs.batches(T, 0);
  auto [sc, sg] = both_i32(std::vector<int32_t>(T * k, -1), {T, k});
  auto [qc, qg] = both_f32(rng.normal(T * H * Dh), {T, H, Dh});
  auto [vc, vg] = both_f32(rng.normal(T * Dh), {T, Dh});
  auto [oc, og] = both_alloc(ElemType::kF32, {T, H, Dh});
  const std::vector<float> poison(T * H * Dh, 7.0f);
  og = gpu->upload_f32(poison, {T, H, Dh});  // every element must be written
  for (auto [be, o, q, v, s, b] : {std::tuple{cpu.get(), oc, qc, vc, sc, &bc}, std::tuple{gpu.get(), og, qg, vg, sg, &bg}})
    be->attention({.out = o, .q = q, .kv = v, .selected = s, .sinks = sinks.view, .batch = b, .layer = 0,
                   .kind = AttentionKind::kCsa, .ratio = 4, .window = 0, .scale = 0.2});
  expect_close(*gpu, og, *cpu, oc, kExact, "attention with only the sink");
  for (float x : gpu->download_f32(og)) ASSERT_EQ(x, 0.0f);
}

// The same on the tensor-core kernels (32 and 64 heads, Dh 128; they write one-split tokens themselves): no
// candidates at all (a window of 0) and only masked ones (CSA, every selection -1) give 0.
TEST_F(CudaOps, AttentionOnTensorCoresWithNothingButTheSink) {
  Rng rng(83);
  const int64_t Dh = 128, k = 3, T = 5;
  // (H 64: the 64-head wgmma blocks where attn_wgmma is on, whose tokens without candidates leave early.)
  for (int64_t H : {32, 64}) {
    for (AttentionKind kind : {AttentionKind::kSliding, AttentionKind::kCsa}) {
      ModelConfig cfg = attn_config(kind, 0);
      cfg.head_dim = Dh;
      Stored sinks = stored_floats(DType::kF32, {H}, rng.normal(H, 1.0));
      TwoSequences seqs(*cpu, *gpu, cfg);
      auto [bc, bg] = seqs.batches(T, 0);
      (void)bc;
      Tensor sg;
      if (kind == AttentionKind::kCsa) sg = gpu->upload_i32(std::vector<int32_t>(T * k, -1), {T, k});
      const Tensor qg = gpu->upload_f32(host_bf16(rng.normal(T * H * Dh)), {T, H, Dh});
      const Tensor vg = gpu->upload_f32(host_bf16(rng.normal(T * Dh)), {T, Dh});
      const Tensor og = gpu->upload_f32(std::vector<float>(T * H * Dh, 7.0f), {T, H, Dh});  // every element must be written
      gpu->attention({.out = og, .q = qg, .kv = vg, .selected = sg, .sinks = sinks.view, .batch = &bg, .layer = 0,
                      .kind = kind, .ratio = cfg.compress_ratio[0], .window = 0, .scale = 0.2, .bf16_operands = true});
      if (std::string(gpu->name()) == "cuda") {
        EXPECT_EQ(cuda::last_attention_tensor_cores(*gpu), cuda::cuda_feature_on("attn_mma") && cuda::cuda_feature_on("attn_split"));
      }
      for (float x : gpu->download_f32(og)) ASSERT_EQ(x, 0.0f) << "H " << H << ", kind " << static_cast<int>(kind);
    }
  }
}

// ---- router and experts -------------------------------------------------------------------------

struct RouterCase {
  StoredMatrix gate;
  Stored bias, tid_i64, tid_i32;
  int64_t E, D, K, V;
  RouterCase(Rng& rng, int64_t E_, int64_t D_, int64_t K_, int64_t V_) : E(E_), D(D_), K(K_), V(V_) {
    std::vector<float> g = rng.normal(E * D, 1.0 / std::sqrt(static_cast<double>(D)));
    std::vector<float> b = rng.normal(E, 0.1);
    // Experts 4 and 9 are identical: an exact tie, which goes to the lower index.
    std::copy(g.begin() + 4 * D, g.begin() + 5 * D, g.begin() + 9 * D);
    b[9] = b[4];
    gate = float_matrix(DType::kBF16, E, D, g);
    bias = stored_floats(DType::kF32, {E}, b);
    std::vector<int64_t> table(V * K);
    for (int64_t v = 0; v < V; ++v)
      for (int64_t i = 0; i < K; ++i) table[v * K + i] = (v * 5 + i * 3) % E;
    tid_i64 = stored_ints(DType::kI64, {V, K}, table);
    tid_i32 = stored_ints(DType::kI32, {V, K}, table);
  }
};

TEST_F(CudaOps, RouterScoredHashAndForcedBothPlacements) {
  Rng rng(91);
  RouterCase rc(rng, 13, 23, 3, 11);
  const int64_t T = 9;
  std::vector<int32_t> ids(T);
  for (auto& id : ids) id = static_cast<int32_t>(rng.integer(0, rc.V - 1));
  const BatchInfo batch = simple_batch(ids);
  auto [xc, xg] = both_f32(rng.normal(T * rc.D), {T, rc.D});
  std::vector<int32_t> forced(T * rc.K);
  for (int64_t i = 0; i < T * rc.K; ++i) forced[i] = static_cast<int32_t>((i * 7) % rc.E);
  auto [fc, fg] = both_i32(forced, {T, rc.K});
  struct Variant {
    std::string name;
    MoeKind kind;
    const Stored* tid;
    bool forced;
  };
  for (const Variant& v : {Variant{"scored", MoeKind::kScored, nullptr, false},
                           Variant{"hash i64", MoeKind::kHash, &rc.tid_i64, false},
                           Variant{"hash i32", MoeKind::kHash, &rc.tid_i32, false},
                           Variant{"forced", MoeKind::kScored, nullptr, true}}) {
    for (RoutedScalePlacement pl : {RoutedScalePlacement::kInRouterWeights, RoutedScalePlacement::kInExpertCombine}) {
      auto [ec, eg] = both_alloc(ElemType::kI32, {T, rc.K});
      auto [wc, wg] = both_alloc(ElemType::kF32, {T, rc.K});
      auto params = [&](const Tensor& e, const Tensor& w, const Tensor& x, const Tensor& f) {
        return RouterParams{.out_experts = e, .out_weights = w, .x = x, .gate = &rc.gate.w, .bias = rc.bias.view,
                            .tid2eid = v.tid ? v.tid->view : TensorView{}, .batch = &batch, .kind = v.kind, .k = rc.K,
                            .routed_scale = 1.5, .placement = pl, .forced_experts = v.forced ? f : Tensor{}};
      };
      cpu->router(params(ec, wc, xc, fc));
      gpu->router(params(eg, wg, xg, fg));
      const std::string what = "router " + v.name + " placement " + std::to_string(static_cast<int>(pl));
      EXPECT_EQ(gpu->download_i32(eg), cpu->download_i32(ec)) << what;
      expect_close(*gpu, wg, *cpu, wc, kOpTol, what + " weights");
    }
  }
}

// The scored top-k with ties everywhere: experts in groups of four with identical gate rows and
// biases, so every score comes four times and the order among equals is by index; tokens alone and
// 40 at once. V4-Flash's 256 experts, top 6 (`router_warp`'s form with 8 keys a lane), 384 experts
// (its 64-key form) and K = 40 of 96 (the weights' second slot a lane, slots 32 and up).
TEST_F(CudaOps, RouterTopkOf256WithTiedGroups) {
  Rng rng(256);
  for (const auto& [E, K] : {std::pair<int64_t, int64_t>{256, 6}, {384, 8}, {96, 40}}) {
    const int64_t D = 16;
    std::vector<float> g = rng.normal(E * D, 0.25), b = rng.normal(E, 0.05);
    for (int64_t e = 0; e < E; ++e) {
      std::copy(g.begin() + (e / 4 * 4) * D, g.begin() + (e / 4 * 4 + 1) * D, g.begin() + e * D);
      b[e] = b[e / 4 * 4];
    }
    const StoredMatrix gate = float_matrix(DType::kBF16, E, D, g);
    const Stored bias = stored_floats(DType::kF32, {E}, b);
    for (int64_t T : {1, 40}) {
      const std::string what = std::to_string(E) + " experts, top " + std::to_string(K) + ", " + std::to_string(T) + " tokens";
      const BatchInfo batch = simple_batch(std::vector<int32_t>(T, 0));
      auto [xc, xg] = both_f32(rng.normal(T * D), {T, D});
      auto [ec, eg] = both_alloc(ElemType::kI32, {T, K});
      auto [wc, wg] = both_alloc(ElemType::kF32, {T, K});
      auto params = [&](const Tensor& e, const Tensor& w, const Tensor& x) {
        return RouterParams{.out_experts = e, .out_weights = w, .x = x, .gate = &gate.w, .bias = bias.view,
                            .batch = &batch, .kind = MoeKind::kScored, .k = K, .routed_scale = 2.5,
                            .placement = RoutedScalePlacement::kInRouterWeights};
      };
      cpu->router(params(ec, wc, xc));
      gpu->router(params(eg, wg, xg));
      const std::vector<int32_t> want = cpu->download_i32(ec);
      EXPECT_EQ(gpu->download_i32(eg), want) << what;
      expect_close(*gpu, wg, *cpu, wc, kOpTol, what + ": weights");
      int64_t tied = 0;  // (the case is what it says: picks whose group mate was picked too)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i + 1 < K; ++i) tied += want[t * K + i] / 4 == want[t * K + i + 1] / 4 ? 1 : 0;
      EXPECT_GT(tied, 0) << what;
    }
  }
}

TEST_F(CudaOps, RouterExtremeLogitsAndTies) {
  // x = [1]; logits 100, -100, 0, -100.5, 0 (experts 2 and 4 tie exactly).
  const StoredMatrix gate = float_matrix(DType::kF32, 5, 1, {100, -100, 0, -100.5, 0});
  const Stored bias = stored_floats(DType::kF32, {5}, {0, 0, 0, 0, 0});
  const Stored tid = stored_ints(DType::kI64, {4, 2}, {0, 0, 0, 0, 0, 0, 1, 3});  // token 3 -> experts {1, 3}
  const BatchInfo batch = simple_batch({3});
  auto [xc, xg] = both_f32({1.0f}, {1, 1});
  for (MoeKind kind : {MoeKind::kScored, MoeKind::kHash}) {
    auto [ec, eg] = both_alloc(ElemType::kI32, {1, 2});
    auto [wc, wg] = both_alloc(ElemType::kF32, {1, 2});
    auto params = [&](const Tensor& e, const Tensor& w, const Tensor& x) {
      return RouterParams{.out_experts = e, .out_weights = w, .x = x, .gate = &gate.w, .bias = bias.view,
                          .tid2eid = tid.view, .batch = &batch, .kind = kind, .k = 2, .routed_scale = 1.5,
                          .placement = RoutedScalePlacement::kInRouterWeights};
    };
    cpu->router(params(ec, wc, xc));
    gpu->router(params(eg, wg, xg));
    EXPECT_EQ(gpu->download_i32(eg), cpu->download_i32(ec));
    expect_close(*gpu, wg, *cpu, wc, kOpTol, "extreme router weights");
  }
}

// Experts with the given weights; `skip` is an expert no token picks.
struct MoeCase {
  std::vector<StoredMatrix> store;
  std::vector<ExpertWeights> routed;
  ExpertWeights shared;
  int64_t D, F, E;
};

// E MXFP4 routed experts and an FP8 shared expert with 128 x 128 weight blocks, as released.
MoeCase make_released_moe(Rng& rng, int64_t E, int64_t D, int64_t F) {
  MoeCase mc;
  mc.D = D, mc.F = F, mc.E = E;
  mc.store.reserve(3 * (E + 1));
  for (int64_t e = 0; e <= E; ++e) {
    const bool routed = e < E;
    for (const auto& [out, in] : {std::pair{F, D}, std::pair{D, F}, std::pair{F, D}})
      mc.store.push_back(routed ? fp4_matrix(rng, out, in, 118, 121) : fp8_matrix(rng, out, in, 128, 128, DType::kF8E8M0));
    const ExpertWeights w{.w1 = mc.store[3 * e].w, .w2 = mc.store[3 * e + 1].w, .w3 = mc.store[3 * e + 2].w};
    if (routed) mc.routed.push_back(w);
    else mc.shared = w;
  }
  return mc;
}

MoeCase make_moe(Rng& rng, int64_t E, int64_t D, int64_t F, bool quantised) {
  MoeCase c;
  c.D = D, c.F = F, c.E = E;
  auto mat = [&](int64_t out, int64_t in, bool fp4) {
    if (quantised) return fp4 ? fp4_matrix(rng, out, in, 118, 121) : fp8_matrix(rng, out, in, 16, 16, DType::kF8E8M0, 9, 118, 121);
    return float_matrix(DType::kBF16, out, in, rng.normal(out * in, 1.0 / std::sqrt(static_cast<double>(in))));
  };
  c.store.reserve(3 * (E + 1));
  for (int64_t e = 0; e <= E; ++e) {
    const bool fp4 = e < E;  // routed experts FP4, the shared expert FP8 (as released)
    c.store.push_back(mat(F, D, fp4));
    c.store.push_back(mat(D, F, fp4));
    c.store.push_back(mat(F, D, fp4));
  }
  for (int64_t e = 0; e <= E; ++e) {
    ExpertWeights w{.w1 = c.store[3 * e].w, .w2 = c.store[3 * e + 1].w, .w3 = c.store[3 * e + 2].w};
    if (e < E) c.routed.push_back(w);
    else c.shared = w;
  }
  return c;
}

TEST_F(CudaOps, MoeMatchesCpuWithUnpickedExpertClampAndPlacements) {
  Rng rng(101);
  for (bool quantised : {false, true}) {
    const MoeCase mc = quantised ? make_moe(rng, 6, 64, 32, true) : make_moe(rng, 6, 19, 11, false);
    const int64_t T = 7, K = 2, D = mc.D;
    std::vector<int32_t> experts(T * K);
    for (int64_t i = 0; i < T * K; ++i) experts[i] = static_cast<int32_t>((i * 3 + 1) % 5);  // expert 5 never picked
    auto [ec, eg] = both_i32(experts, {T, K});
    auto [wc, wg] = both_f32(rng.uniform(T * K, 0.1, 1.0), {T, K});
    auto [xc, xg] = both_f32(rng.normal(T * D, 2.0), {T, D});
    std::vector<float> unclamped;
    for (double limit : {0.0, 0.3}) {  // 0.3: the clamp is active on most values
      for (bool with_shared : {true, false}) {
        for (RoutedScalePlacement pl :
             {RoutedScalePlacement::kInRouterWeights, RoutedScalePlacement::kInExpertCombine}) {
          auto [oc, og] = both_alloc(ElemType::kF32, {T, D});
          auto params = [&](const Tensor& o, const Tensor& x, const Tensor& e, const Tensor& w) {
            return MoeParams{.out = o, .x = x, .experts = e, .weights = w, .routed = &mc.routed,
                             .shared = with_shared ? &mc.shared : nullptr, .swiglu_limit = limit, .routed_scale = 1.5,
                             .placement = pl};
          };
          cpu->moe(params(oc, xc, ec, wc));
          gpu->moe(params(og, xg, eg, wg));
          if (with_shared && pl == RoutedScalePlacement::kInRouterWeights) {
            if (limit == 0.0) unclamped = cpu->download_f32(oc);
            else EXPECT_NE(cpu->download_f32(oc), unclamped) << "the clamp must change the output";
          }
          expect_close(*gpu, og, *cpu, oc, kOpTol,
                       std::string("moe ") + (quantised ? "fp4/fp8" : "bf16") + " limit " + std::to_string(limit) +
                           (with_shared ? " shared" : " no shared") + " placement " + std::to_string(static_cast<int>(pl)));
        }
      }
    }
  }
}

// Many choices for the device plan (4200 of them over 40 experts: several counting blocks, an expert
// with one row, one with none, one with 8 rows exactly, the rest tens of rows in tiles of 8): the
// grouping must put each expert's rows in (token, slot) order, or outputs land in the wrong slots.
// Then 300 experts (the plan's scan of the counts in two chunks of 256), the choices spread past 256.
TEST_F(CudaOps, MoePlanOfManyChoicesMatchesCpu) {
  Rng rng(102);
  for (const int64_t E : {40, 300}) {
    const MoeCase mc = make_moe(rng, E, 24, 16, false);
    const int64_t T = E == 40 ? 700 : 120, K = 6, D = mc.D;
    std::vector<int32_t> experts(T * K);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < K; ++i) {
        experts[t * K + i] = E == 40 ? static_cast<int32_t>(1 + (t * 7 + i * 5 + t / 3) % 36)
                                     : static_cast<int32_t>((t * 53 + i * 47) % E);
      }
    if (E == 40) {
      experts[5 * K + 2] = 37;  // expert 37: one row
      for (int64_t t = 100; t < 108; ++t) experts[t * K + 4] = 38;  // expert 38: eight rows; 39 and 0: none
    }
    auto [ec, eg] = both_i32(experts, {T, K});
    auto [wc, wg] = both_f32(rng.uniform(T * K, 0.1, 1.0), {T, K});
    auto [xc, xg] = both_f32(rng.normal(T * D, 1.0), {T, D});
    auto [oc, og] = both_alloc(ElemType::kF32, {T, D});
    auto params = [&](const Tensor& o, const Tensor& x, const Tensor& e, const Tensor& w) {
      return MoeParams{.out = o, .x = x, .experts = e, .weights = w, .routed = &mc.routed, .shared = &mc.shared,
                       .swiglu_limit = 7.0, .routed_scale = 1.5, .placement = RoutedScalePlacement::kInExpertCombine};
    };
    cpu->moe(params(oc, xc, ec, wc));
    gpu->moe(params(og, xg, eg, wg));
    expect_close(*gpu, og, *cpu, oc, kOpTol, "moe " + std::to_string(T * K) + " choices over " + std::to_string(E) + " experts");
  }
}

// The routed scale is applied exactly once: router + experts on the GPU with the scale folded into
// the router's weights give the CPU's output with the scale applied in the combine, and the other
// way round, for hash and scored routing.
TEST_F(CudaOps, RoutedScalePlacementsAgreeAcrossBackends) {
  Rng rng(111);
  RouterCase rc(rng, 13, 19, 3, 11);
  const MoeCase mc = make_moe(rng, 13, 19, 9, false);
  const int64_t T = 8;
  std::vector<int32_t> ids(T);
  for (auto& id : ids) id = static_cast<int32_t>(rng.integer(0, rc.V - 1));
  const BatchInfo batch = simple_batch(ids);
  auto [xc, xg] = both_f32(rng.normal(T * rc.D), {T, rc.D});
  auto run = [&](Backend& be, const Tensor& x, MoeKind kind, RoutedScalePlacement pl) {
    Tensor e = be.alloc(ElemType::kI32, {T, rc.K}), w = be.alloc(ElemType::kF32, {T, rc.K});
    be.router({.out_experts = e, .out_weights = w, .x = x, .gate = &rc.gate.w, .bias = rc.bias.view,
               .tid2eid = rc.tid_i64.view, .batch = &batch, .kind = kind, .k = rc.K, .routed_scale = 1.5,
               .placement = pl});
    Tensor out = be.alloc(ElemType::kF32, {T, rc.D});
    be.moe({.out = out, .x = x, .experts = e, .weights = w, .routed = &mc.routed, .shared = &mc.shared,
            .swiglu_limit = 0.5, .routed_scale = 1.5, .placement = pl});
    return out;
  };
  for (MoeKind kind : {MoeKind::kHash, MoeKind::kScored}) {
    const Tensor ref_router = run(*cpu, xc, kind, RoutedScalePlacement::kInRouterWeights);
    const Tensor ref_combine = run(*cpu, xc, kind, RoutedScalePlacement::kInExpertCombine);
    expect_close(*cpu, ref_combine, *cpu, ref_router, kOpTol, "cpu placements agree");
    const std::string k = kind == MoeKind::kHash ? "hash" : "scored";
    expect_close(*gpu, run(*gpu, xg, kind, RoutedScalePlacement::kInRouterWeights), *cpu, ref_combine, kOpTol,
                 k + ": gpu in-router vs cpu in-combine");
    expect_close(*gpu, run(*gpu, xg, kind, RoutedScalePlacement::kInExpertCombine), *cpu, ref_router, kOpTol,
                 k + ": gpu in-combine vs cpu in-router");
  }
}

// ---- greedy choice ----------------------------------------------------------------------------------

// argmax_rows on the device gives the host rule's ids (core/argmax.h): rows of every width class
// (1; odd widths, whose rows after the first are not 16-byte aligned: the scalar kernel; whole
// 16-byte words up to V4-Flash's vocabulary: the 4-wide one), with the maximum planted several times
// (the lowest wins, wherever the threads' strides put the copies), at the last element, NaNs
// (the first wins), all equal, all -inf.
TEST_F(CudaOps, ArgmaxRowsGivesTheHostRulesIds) {
  Rng rng(97);
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t N : {int64_t{1}, int64_t{3}, int64_t{513}, int64_t{4100}, int64_t{129280}}) {
    const int64_t T = 9;
    std::vector<float> x = rng.normal(T * N);
    for (int64_t r = 0; r < T; ++r) {
      float* row = x.data() + r * N;
      const int64_t a = rng.integer(0, N - 1), b = rng.integer(0, N - 1), c = rng.integer(0, N - 1);
      switch (r) {
        case 1: row[a] = row[b] = row[c] = 9.0f; break;  // a max three times (or fewer where they meet)
        case 2: row[N - 1] = 9.0f; break;                // at the end, past the last whole word
        case 3: row[b] = nan, row[a] = inf; break;       // a NaN beats +inf
        case 4: row[c] = nan, row[b] = nan; break;       // two NaNs: the first
        case 5: std::fill(row, row + N, 0.5f); break;    // all equal: index 0
        case 6: std::fill(row, row + N, -inf); break;    // all -inf: index 0
        case 7: row[a] = inf, row[c] = inf; break;
        default: break;                                  // plain normal values
      }
    }
    std::vector<int32_t> want(static_cast<size_t>(T));
    for (int64_t r = 0; r < T; ++r) want[r] = static_cast<int32_t>(argmax_first(x.data() + r * N, N));
    auto [xc, xg] = both_f32(x, {T, N});
    EXPECT_EQ(cpu->download_i32(cpu->argmax_rows(xc)), want) << "CPU, N = " << N;
    EXPECT_EQ(gpu->download_i32(gpu->argmax_rows(xg)), want) << "device, N = " << N;
  }
}

// ---- backend creation ---------------------------------------------------------------------------

// Without a GPU the factory answers with a Status (CI checks this); with one it gives "cuda".
// ---- the fast / deepseek-ref numerics flags -------------------------------------------------------
// Each rounding step against the CPU's on identical fp32 input, bit for bit (quant_sim, and linear
// with an identity weight, where both backends' products are exact); each bf16 output flag equals
// bf16 of the same device op's fp32 output, bit for bit; and every flagged op against the CPU's at
// one bf16 ulp (the fp32 results it rounds differ in the last bits, so a value can round one ulp
// apart), or, where an FP8/FP4 rounding follows, most elements identical and a small cosine.

// Rows whose magnitudes span 10^-6 .. 10^6, plus edge rows (rounding midpoints at scale 1, zeros,
// signed zeros, a NaN) where the row is wide enough.
std::vector<float> sim_rows(Rng& rng, int64_t n, int64_t row) {
  std::vector<float> v;
  for (int64_t r = 0; r < n; ++r) {
    std::vector<float> x = rng.normal(row, std::pow(10.0, static_cast<double>(r % 13) - 6.0));
    v.insert(v.end(), x.begin(), x.end());
  }
  if (row >= 12) {
    std::vector<float> e8 = {448.0f, 444.0f, -444.0f, 3 * 0x1p-10f, -5 * 0x1p-10f, 0.0f, -0.0f, 1e-30f, 17.0f, 18.0f, 19.0f, 0x1p-7f};
    std::vector<float> e2 = {6.0f, 5.0f, 2.5f, -0.25f, 0.75f, -1.75f, 1.25f, 3.5f, 0.0f, -0.0f, 4.5f, 0.3f};
    std::vector<float> zeros(row, 0.0f);
    for (auto* e : {&e8, &e2}) {
      e->resize(row, 0.0f);
      v.insert(v.end(), e->begin(), e->end());
    }
    v.insert(v.end(), zeros.begin(), zeros.end());
    std::vector<float> nan_row = rng.normal(row);
    nan_row[row / 2] = std::numeric_limits<float>::quiet_NaN();
    v.insert(v.end(), nan_row.begin(), nan_row.end());
  }
  return v;
}

TEST_F(CudaOps, QuantSimIsTheCpuOneBitForBit) {
  Rng rng(201);
  struct Case {
    QuantSimKind kind;
    int64_t row, dims;
  };
  for (const Case& c : {Case{QuantSimKind::kBf16, 45, 45}, Case{QuantSimKind::kBf16, 50, 37},
                        Case{QuantSimKind::kFp8Pow2Block64, 45, 45}, Case{QuantSimKind::kFp8Pow2Block64, 200, 130},
                        Case{QuantSimKind::kFp8Pow2Block64, 20, 12}, Case{QuantSimKind::kFp4Pow2Block32, 45, 45},
                        Case{QuantSimKind::kFp4Pow2Block32, 70, 64}, Case{QuantSimKind::kHadamardBf16, 128, 128},
                        Case{QuantSimKind::kHadamardBf16, 70, 64}, Case{QuantSimKind::kHadamardBf16, 16, 16}}) {
    const bool hadamard = c.kind == QuantSimKind::kHadamardBf16;
    std::vector<float> v = sim_rows(rng, 9, c.row);
    if (hadamard)  // the CPU's transform would carry a NaN into the whole row on both sides; keep it finite
      for (auto& x : v)
        if (std::isnan(x)) x = 1.0f;
    const int64_t rows = static_cast<int64_t>(v.size()) / c.row;
    auto [xc, xg] = both_f32(v, {rows, c.row});
    cpu->quant_sim({.x = xc, .row = c.row, .dims = c.dims, .kind = c.kind});
    gpu->quant_sim({.x = xg, .row = c.row, .dims = c.dims, .kind = c.kind});
    const std::string what = "quant_sim kind " + std::to_string(static_cast<int>(c.kind)) + " row " +
                             std::to_string(c.row) + " dims " + std::to_string(c.dims);
    expect_same_bits(gpu->download_f32(xg), cpu->download_f32(xc), what);
    EXPECT_NE(cpu->download_f32(xc), v) << what << ": the rounding changed nothing";
  }
}

TEST_F(CudaOps, LinearActQuantFp8AndBf16OutputAreTheCpuRoundings) {
  Rng rng(202);
  // Identity weights: out = the quantised input exactly on both backends.
  for (int64_t K : {45, 200, 259}) {
    std::vector<float> eye(K * K, 0.0f);
    for (int64_t i = 0; i < K; ++i) eye[i * K + i] = 1.0f;
    const StoredMatrix m = float_matrix(DType::kF32, K, K, eye);
    const int64_t T = 7;
    std::vector<float> x;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> r = rng.normal(K, std::pow(10.0, static_cast<double>(t) - 3.0));
      x.insert(x.end(), r.begin(), r.end());
    }
    std::vector<float> want = x;
    for (int64_t t = 0; t < T; ++t) fp8_pow2_quant_sim(want.data() + t * K, K, 128);
    for (bool round : {false, true}) {
      auto [xc, xg] = both_f32(x, {T, K});
      auto [oc, og] = both_alloc(ElemType::kF32, {T, K});
      cpu->linear({.out = oc, .in = xc, .weight = &m.w, .act_quant_fp8 = true, .round_bf16 = round});
      gpu->linear({.out = og, .in = xg, .weight = &m.w, .act_quant_fp8 = true, .round_bf16 = round});
      const std::string what = "linear identity K=" + std::to_string(K) + (round ? " bf16" : "");
      expect_same_bits(gpu->download_f32(og), cpu->download_f32(oc), what);
      expect_same_bits(gpu->download_f32(og), round ? host_bf16(want) : want, what + " vs host");
      expect_same_bits(gpu->download_f32(xg), x, what + ": input untouched");
    }
  }
  // A checkpoint-like FP8 weight: the quantised inputs are identical, the sums differ by rounding.
  // (With fp8_gemm on, the default, this weight runs on cuBLASLt: CudaFp8Linear.* test that.)
  if (cuda::cuda_feature_on("fp8_gemm")) return;
  const StoredMatrix w = fp8_matrix(rng, 131, 259, 128, 128, DType::kF8E8M0);
  const int64_t T = 5;
  auto [xc, xg] = both_f32(rng.normal(T * 259, 2.0), {T, 259});
  auto [o32c, o32g] = both_alloc(ElemType::kF32, {T, 131});
  auto [obc, obg] = both_alloc(ElemType::kF32, {T, 131});
  cpu->linear({.out = o32c, .in = xc, .weight = &w.w, .act_quant_fp8 = true});
  gpu->linear({.out = o32g, .in = xg, .weight = &w.w, .act_quant_fp8 = true});
  cpu->linear({.out = obc, .in = xc, .weight = &w.w, .act_quant_fp8 = true, .round_bf16 = true});
  gpu->linear({.out = obg, .in = xg, .weight = &w.w, .act_quant_fp8 = true, .round_bf16 = true});
  expect_close(*gpu, o32g, *cpu, o32c, kOpTol, "linear fp8 act_quant");
  expect_same_bits(gpu->download_f32(obg), host_bf16(gpu->download_f32(o32g)), "linear fp8 bf16 = bf16(fp32)");
  expect_close(*gpu, obg, *cpu, obc, kBf16Tol, "linear fp8 act_quant bf16");
}

// Runs `op(backend, round, inputs)` on fresh copies of the same inputs: flag on equals bf16 of flag
// off on the device bit for bit, and flag on is within one bf16 ulp of the CPU's.
template <class Op>
void check_bf16_flag(Backend& cpu, Backend& gpu, const std::vector<std::pair<std::vector<float>, std::vector<int64_t>>>& in,
                     Op op, const std::string& what) {
  auto upload = [&](Backend& b) {
    std::vector<Tensor> t;
    for (const auto& [v, shape] : in) t.push_back(b.upload_f32(v, shape));
    return t;
  };
  std::vector<Tensor> g0 = upload(gpu), g1 = upload(gpu), c1 = upload(cpu);
  const Tensor out0 = op(gpu, false, g0), out1 = op(gpu, true, g1), ref = op(cpu, true, c1);
  expect_same_bits(gpu.download_f32(out1), host_bf16(gpu.download_f32(out0)), what + ": bf16 = bf16(fp32)");
  expect_close(gpu, out1, cpu, ref, kBf16Tol, what + " vs cpu");
}

TEST_F(CudaOps, Bf16OutputFlagsRoundTheFp32Result) {
  Rng rng(203);
  const int64_t T = 7, S = 3, D = 37;
  Stored nw = stored_floats(DType::kBF16, {D}, rng.normal(D, 0.2, 1.0));
  check_bf16_flag(*cpu, *gpu, {{rng.normal(T * D, 3.0), {T, D}}},
                  [&](Backend& b, bool r, std::vector<Tensor>& t) {
                    Tensor o = b.alloc(ElemType::kF32, {T, D});
                    b.rms_norm({.out = o, .in = t[0], .weight = nw.view, .group = D, .eps = 1e-6, .round_bf16 = r});
                    return o;
                  }, "rms_norm");
  const StoredMatrix gw = float_matrix(DType::kBF16, 3 * 7, 19, rng.normal(3 * 7 * 19, 0.3));
  check_bf16_flag(*cpu, *gpu, {{rng.normal(T * 3 * 19), {T, 3 * 19}}},
                  [&](Backend& b, bool r, std::vector<Tensor>& t) {
                    Tensor o = b.alloc(ElemType::kF32, {T, 3 * 7});
                    b.grouped_linear({.out = o, .in = t[0], .weight = &gw.w, .groups = 3, .round_bf16 = r});
                    return o;
                  }, "grouped_linear");
  const BatchInfo batch = simple_batch(std::vector<int32_t>(T, 0), 1000);
  // rope's input is bf16 where the flag is used (RopeParams::round_bf16), so its result is all bf16.
  check_bf16_flag(*cpu, *gpu, {{host_bf16(rng.normal(T * 3 * 20)), {T, 3, 20}}},
                  [&](Backend& b, bool r, std::vector<Tensor>& t) {
                    b.rope({.x = t[0], .table = &kRope, .direction = RopeDirection::kInverse, .round_bf16 = r}, batch);
                    return t[0];
                  }, "rope");
  check_bf16_flag(*cpu, *gpu,
                  {{rng.normal(T * S * D), {T, S, D}}, {rng.normal(T * D), {T, D}}, {rng.uniform(T * S, 0, 2), {T, S}},
                   {rng.uniform(T * S * S, 0, 1), {T, S, S}}},
                  [&](Backend& b, bool r, std::vector<Tensor>& t) {
                    b.hc_post({.streams = t[0], .sublayer = t[1], .post = t[2], .comb = t[3], .round_bf16 = r});
                    return t[0];
                  }, "hc_post");
  const int64_t mix = (2 + S) * S;
  Stored fn = stored_floats(DType::kF32, {mix, S * D}, rng.normal(mix * S * D, 0.1));
  Stored base = stored_floats(DType::kF32, {mix}, rng.normal(mix));
  Stored scale = stored_floats(DType::kF32, {3}, rng.uniform(3, 0.5, 1.5));
  HcWeights hw{.fn = fn.view, .base = base.view, .scale = scale.view};
  check_bf16_flag(*cpu, *gpu, {{rng.normal(T * S * D), {T, S, D}}},
                  [&](Backend& b, bool r, std::vector<Tensor>& t) {
                    Tensor u = b.alloc(ElemType::kF32, {T, D}), post = b.alloc(ElemType::kF32, {T, S}),
                           comb = b.alloc(ElemType::kF32, {T, S, S});
                    b.hc_pre({.out_input = u, .out_post = post, .out_comb = comb, .streams = t[0], .weights = &hw,
                              .sinkhorn_iters = 20, .hc_eps = 1e-6, .norm_eps = 1e-6, .round_bf16 = r});
                    return u;
                  }, "hc_pre");
  Stored hfn = stored_floats(DType::kF32, {S, S * D}, rng.normal(S * S * D, 0.1));
  Stored hbase = stored_floats(DType::kF32, {S}, rng.normal(S));
  Stored hscale = stored_floats(DType::kF32, {1}, {0.7f});
  HcWeights hh{.fn = hfn.view, .base = hbase.view, .scale = hscale.view};
  check_bf16_flag(*cpu, *gpu, {{rng.normal(T * S * D), {T, S, D}}},
                  [&](Backend& b, bool r, std::vector<Tensor>& t) {
                    Tensor o = b.alloc(ElemType::kF32, {T, D});
                    b.hc_head({.out = o, .streams = t[0], .weights = &hh, .hc_eps = 1e-6, .norm_eps = 1e-6, .round_bf16 = r});
                    return o;
                  }, "hc_head");
  // Attention over the window only (fresh sequence state per run: nothing is appended).
  const ModelConfig cfg = attn_config(AttentionKind::kSliding, 5);
  const int64_t H = 3, Dh = cfg.head_dim;
  Stored sinks = stored_floats(DType::kF32, {H}, {0.3f, -1.0f, 4.0f});
  check_bf16_flag(*cpu, *gpu, {{rng.normal(T * H * Dh, 0.5), {T, H, Dh}}, {rng.normal(T * Dh), {T, Dh}}},
                  [&](Backend& b, bool r, std::vector<Tensor>& t) {
                    auto st = b.create_sequence_state(cfg);
                    BatchInfo bb = simple_batch(std::vector<int32_t>(T, 0));
                    bb.seqs = {st.get()};
                    Tensor o = b.alloc(ElemType::kF32, {T, H, Dh});
                    b.attention({.out = o, .q = t[0], .kv = t[1], .selected = {}, .sinks = sinks.view, .batch = &bb,
                                 .layer = 0, .kind = AttentionKind::kSliding, .ratio = 0, .window = cfg.sliding_window,
                                 .scale = 1.0 / std::sqrt(static_cast<double>(Dh)), .round_bf16 = r});
                    return o;
                  }, "attention");
}

// rope's bf16 flag rounds the dims it rotates and leaves the others as they came (fp32 here), on
// each backend: the rotated ones are bf16 of its own fp32 rotation.
TEST_F(CudaOps, RopeBf16FlagRoundsOnlyTheRotatedDims) {
  Rng rng(211);
  const int64_t T = 5, n = 3, width = 20, rd = kRope.rope_dim();
  const BatchInfo batch = simple_batch(std::vector<int32_t>(T, 0), 700);
  const std::vector<float> x = rng.normal(T * n * width, 2.0);
  for (Backend* be : {cpu.get(), gpu.get()}) {
    std::vector<float> out[2];
    for (bool r : {false, true}) {
      const Tensor t = be->upload_f32(x, {T, n, width});
      be->rope({.x = t, .table = &kRope, .direction = RopeDirection::kForward, .round_bf16 = r}, batch);
      out[r] = be->download_f32(t);
    }
    int64_t rounded = 0;
    for (int64_t i = 0; i < T * n * width; ++i) {
      const bool rotated = i % width >= width - rd;
      ASSERT_EQ(out[1][i], rotated ? bf16_round(out[0][i]) : x[i])
          << be->name() << ", element " << i << (rotated ? " (rotated)" : " (not rotated)");
      rounded += rotated && out[1][i] != out[0][i];
    }
    EXPECT_GT(rounded, T * n * rd / 2) << be->name() << ": the rotated dims were rounded";
  }
}

// Most elements identical and the rest near: an FP8/FP4 rounding after fp32 work that differs in
// the last bits moves a value by at most one code, which is rare.
void expect_mostly_identical(const std::vector<float>& got, const std::vector<float>& want, double min_identical,
                             double max_cosine, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_FALSE(want.empty()) << what;
  int64_t same = 0;
  for (size_t i = 0; i < got.size(); ++i) same += f32_to_bits(got[i]) == f32_to_bits(want[i]) ? 1 : 0;
  const double frac = static_cast<double>(same) / static_cast<double>(got.size());
  // The elements that differ are bounded through the cosine and, each, by 1/64 of the largest
  // |want| (a few bf16 roundings of the largest values); no bound of their own (atol infinite).
  const CompareResult r = compare_f32(
      got, want,
      {.atol = std::numeric_limits<double>::infinity(), .max_cosine_distance = max_cosine, .max_rel_to_max = 1.0 / 64});
  std::printf("[cuda-fast-op] %-40s identical %.4f  %s\n", what.c_str(), frac, r.summary().c_str());
  EXPECT_GE(frac, min_identical) << what;
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

TEST_F(CudaOps, CompressorBf16AndEntrySimMatchCpu) {
  for (AttentionKind kind : {AttentionKind::kCsa, AttentionKind::kHca}) {
    Rng rng(204);
    ModelConfig cfg = attn_config(kind, 6);
    cfg.index_head_dim = 16;  // a power of two for the Hadamard transform
    const bool csa = kind == AttentionKind::kCsa;
    const CompressorCase main_case(rng, cfg.head_dim, cfg.compress_ratio[0], csa);
    const CompressorCase index_case(rng, cfg.index_head_dim, cfg.compress_ratio[0], true);
    TwoSequences seqs(*cpu, *gpu, cfg);
    for (auto [n0, n1] : {std::pair{3, 5}, std::pair{6, 0}, std::pair{1, 12}, std::pair{13, 7}}) {
      auto [bc, bg] = seqs.batches(n0, n1);
      const int64_t T = n0 + n1;
      for (const CompressorCase* cc : {&main_case, &index_case}) {
        if (cc == &index_case && !csa) continue;
        const bool main = cc == &main_case;
        const CompressorSlot slot = main ? CompressorSlot::kMain : CompressorSlot::kIndexer;
        auto [kc, kg] = both_f32(rng.normal(T * cc->width), {T, cc->width});
        auto [gc, gg] = both_f32(rng.normal(T * cc->width, 2.0), {T, cc->width});
        auto params = [&](const Tensor& k, const Tensor& g, const BatchInfo& b) {
          CompressorParams p = cc->params(k, g, b, kRope, slot);
          p.round_bf16 = true;
          if (main) p.entry_sim = {QuantSimKind::kFp8Pow2Block64};
          else p.entry_sim = {QuantSimKind::kHadamardBf16, QuantSimKind::kFp4Pow2Block32};
          if (!main) p.key_precision = KeyPrecision::kBf16;
          return p;
        };
        cpu->compressor(params(kc, gc, bc));
        gpu->compressor(params(kg, gg, bg));
      }
      seqs.advance(n0, n1);
    }
    for (CompressorSlot slot : {CompressorSlot::kMain, CompressorSlot::kIndexer}) {
      if (slot == CompressorSlot::kIndexer && !csa) continue;
      std::vector<float> got, want;
      for (int s = 0; s < 2; ++s) {
        const std::vector<float> w = cpu_entries(*seqs.cpu[s], slot);
        const std::vector<float> g = std::string(gpu->name()) == "cpu" ? cpu_entries(*seqs.gpu[s], slot)
                                                                        : cuda::state_entries(*seqs.gpu[s], 0, slot);
        want.insert(want.end(), w.begin(), w.end());
        got.insert(got.end(), g.begin(), g.end());
      }
      // FP4 (indexer) moves a value by up to a quarter of its block's scale when it flips.
      expect_mostly_identical(got, want, 0.95, slot == CompressorSlot::kMain ? 1e-4 : 1e-3,
                              std::string(csa ? "CSA" : "HCA") + (slot == CompressorSlot::kMain ? " main" : " indexer") +
                                  " entries bf16+sim");
    }
  }
}

TEST_F(CudaOps, IndexerBf16ScoresMatchCpu) {
  Rng rng(205);
  const ModelConfig cfg = attn_config(AttentionKind::kCsa, 6);
  const int64_t Hi = 3, di = cfg.index_head_dim, m = cfg.compress_ratio[0];
  const CompressorCase index_case(rng, di, m, true);
  TwoSequences seqs(*cpu, *gpu, cfg);
  auto [bc, bg] = seqs.batches(23, 17);
  const int64_t T = 40;
  auto [kc, kg] = both_f32(rng.normal(T * 2 * di), {T, 2 * di});
  auto [gc, gg] = both_f32(rng.normal(T * 2 * di), {T, 2 * di});
  cpu->compressor(index_case.params(kc, gc, bc, kRope, CompressorSlot::kIndexer));
  gpu->compressor(index_case.params(kg, gg, bg, kRope, CompressorSlot::kIndexer));
  auto [qc, qg] = both_f32(rng.normal(T * Hi * di), {T, Hi, di});
  auto [wc, wg] = both_f32(rng.normal(T * Hi), {T, Hi});
  const int64_t C = 23 / m + 1, k = 3;
  auto [sc, sg] = both_alloc(ElemType::kF32, {T, C});
  auto [ic, ig] = both_alloc(ElemType::kI32, {T, k});
  cpu->indexer_topk({.out_indices = ic, .q = qc, .head_weights = wc, .batch = &bc, .layer = 0, .ratio = m, .k = k,
                     .out_scores = sc, .bf16_scores = true});
  gpu->indexer_topk({.out_indices = ig, .q = qg, .head_weights = wg, .batch = &bg, .layer = 0, .ratio = m, .k = k,
                     .out_scores = sg, .bf16_scores = true});
  const std::vector<float> s = gpu->download_f32(sg);
  for (float v : s) {
    if (std::isfinite(v)) {
      EXPECT_EQ(v, bf16_round(v)) << "scores are bf16";
    }
  }
  expect_mostly_identical(s, cpu->download_f32(sc), 0.9, 1e-3, "indexer bf16 scores");
}

TEST_F(CudaOps, MoeRefNumericsMatchesCpu) {
  Rng rng(206);
  for (bool quantised : {false, true}) {
    const MoeCase mc = quantised ? make_moe(rng, 6, 160, 96, true) : make_moe(rng, 6, 45, 37, false);
    const int64_t T = 7, K = 2, D = mc.D;
    std::vector<int32_t> experts(T * K);
    for (int64_t i = 0; i < T * K; ++i) experts[i] = static_cast<int32_t>((i * 3 + 1) % 5);
    auto [ec, eg] = both_i32(experts, {T, K});
    auto [wc, wg] = both_f32(rng.uniform(T * K, 0.1, 1.0), {T, K});
    auto [xc, xg] = both_f32(rng.normal(T * D, 2.0), {T, D});
    for (RoutedScalePlacement pl : {RoutedScalePlacement::kInRouterWeights, RoutedScalePlacement::kInExpertCombine}) {
      auto [oc, og] = both_alloc(ElemType::kF32, {T, D});
      auto params = [&](const Tensor& o, const Tensor& x, const Tensor& e, const Tensor& w) {
        return MoeParams{.out = o, .x = x, .experts = e, .weights = w, .routed = &mc.routed, .shared = &mc.shared,
                         .swiglu_limit = 0.0, .routed_scale = 1.5, .placement = pl, .ref_numerics = true};
      };
      cpu->moe(params(oc, xc, ec, wc));
      gpu->moe(params(og, xg, eg, wg));
      const std::vector<float> g = gpu->download_f32(og);
      for (float v : g) EXPECT_EQ(v, bf16_round(v)) << "moe output is bf16";
      expect_mostly_identical(g, cpu->download_f32(oc), 0.8, 1e-4,
                              std::string("moe ref_numerics ") + (quantised ? "fp4/fp8" : "bf16") + " placement " +
                                  std::to_string(static_cast<int>(pl)));
    }
  }
}

// Token t's two experts: t % E and (3 t + 1) % E ([T, 2]; distinct where E does not divide 2 t + 1).
std::vector<int32_t> two_experts_a_token(int64_t T, int64_t E) {
  std::vector<int32_t> choices(2 * T);
  for (int64_t t = 0; t < T; ++t)
    choices[2 * t] = static_cast<int32_t>(t % E), choices[2 * t + 1] = static_cast<int32_t>((3 * t + 1) % E);
  return choices;
}

// The MoE call of the W4A8 tests: reference numerics (the path W4A8 serves), the routed scale
// applied in the combine, the clamp active on some values.
MoeParams w4a8_moe_params(const MoeCase& mc, const Tensor& o, const Tensor& x, const Tensor& e, const Tensor& w) {
  return MoeParams{.out = o, .x = x, .experts = e, .weights = w, .routed = &mc.routed, .shared = &mc.shared,
                   .swiglu_limit = 7.0, .routed_scale = 1.5, .placement = RoutedScalePlacement::kInExpertCombine,
                   .ref_numerics = true};
}

// A W4A8 MoE call's inputs on both backends: MXFP4 experts (6 of them, D = 256, F = 96), T tokens
// with the given K choices each, random routing weights and inputs (drawn in that order).
struct W4A8Inputs {
  MoeCase mc;
  int64_t D;
  Tensor ec, eg, wc, wg, xc, xg;
  MoeParams cpu_params(const Tensor& out) const { return w4a8_moe_params(mc, out, xc, ec, wc); }
  MoeParams gpu_params(const Tensor& out) const { return w4a8_moe_params(mc, out, xg, eg, wg); }
};

W4A8Inputs CudaOps::w4a8_inputs(Rng& rng, const std::vector<int32_t>& experts, int64_t T, int64_t K, int64_t F, int64_t D) {
  W4A8Inputs in{.mc = make_moe(rng, 6, D, F, true)};
  in.D = in.mc.D;
  std::tie(in.ec, in.eg) = both_i32(experts, {T, K});
  std::tie(in.wc, in.wg) = both_f32(rng.uniform(T * K, 0.1, 1.0), {T, K});
  std::tie(in.xc, in.xg) = both_f32(rng.normal(T * in.D, 2.0), {T, in.D});
  return in;
}

// Two choices a token for T tokens: the first `heavy` tokens' first choice expert 0, the others'
// 1 + t % 4; every second choice 1 + 7t % 4 (expert 5 idle): one expert with many rows.
std::vector<int32_t> expert0_heavy_choices(int64_t T, int64_t heavy) {
  std::vector<int32_t> experts(2 * T);
  for (int64_t t = 0; t < T; ++t) {
    experts[2 * t] = t < heavy ? 0 : static_cast<int32_t>(1 + t % 4);
    experts[2 * t + 1] = static_cast<int32_t>(1 + (t * 7) % 4);
  }
  return experts;
}

// The GPU's moe with the op profile on: whether the profile names `op`.
bool moe_ran(Backend& gpu, const MoeParams& p, const std::string& op) {
  cuda::set_op_profiling(gpu, true);
  gpu.moe(p);
  cuda::set_op_profiling(gpu, false);
  bool ran = false;
  for (const cuda::OpTime& t : cuda::take_op_profile(gpu)) ran = ran || t.op == op;
  return ran;
}

// The W4A8 routed experts (tensor cores) against the CPU's reference numerics and against
// the CUDA-core path: MXFP4 experts with D = 256, F = 96 (K multiples of 32, one past a 128-block),
// 16 rows per expert (two tiles of 8), odd N; the output is bf16, so most values are the same bits
// and the rest one rounding apart. The profile shows which path ran.
TEST_F(CudaOps, MoeW4A8ExpertsMatchCpu) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(207);
  const int64_t T = 40, K = 2;
  std::vector<int32_t> experts(T * K);
  for (int64_t i = 0; i < T * K; ++i) experts[i] = static_cast<int32_t>(i % 5);  // 16 rows each, expert 5 idle
  const W4A8Inputs in = w4a8_inputs(rng, experts, T, K);
  auto [oc, og] = both_alloc(ElemType::kF32, {T, in.D});
  cpu->moe(in.cpu_params(oc));
  const Tensor cores = gpu->alloc(ElemType::kF32, {T, in.D});
  cuda::set_w4a8_experts(*gpu, false);
  gpu->moe(in.gpu_params(cores));
  cuda::set_w4a8_experts(*gpu, true);
  const bool ran = moe_ran(*gpu, in.gpu_params(og), "moe/experts w1, w3 (w4a8)");
  cuda::set_w4a8_experts(*gpu, cuda::cuda_feature_on("w4a8"));
  // The W4A8 kernel works over the grouped plan; SPARROW_CUDA_DISABLE=grouped_moe runs one expert at a time.
  EXPECT_EQ(ran, cuda::cuda_feature_on("grouped_moe")) << "the W4A8 path ran: " << ran;
  const std::vector<float> g = gpu->download_f32(og);
  for (float v : g) ASSERT_EQ(v, bf16_round(v)) << "moe output is bf16";
  expect_mostly_identical(g, cpu->download_f32(oc), 0.8, 1e-4, "moe w4a8 vs cpu");
  expect_mostly_identical(g, gpu->download_f32(cores), 0.8, 1e-4, "moe w4a8 vs cuda cores");
}

// Many rows an expert (an average of 32 or more) take the tiled W4A8 kernel (64 rows x 128
// columns a block); each of its outputs is the small kernel's arithmetic, so the MoE's
// output must be the same bits with the tiled kernel on and off. Expert 0 gets 100 rows (a full
// tile of 64 and a partial one), the others 50, expert 5 none; N = 96 and 256, K = 256 and 96 (a
// partial group of 128 inputs).
TEST_F(CudaOps, MoeW4A8TiledKernelGivesTheSmallKernelsBits) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(208);
  const int64_t T = 150, K = 2;
  const std::vector<int32_t> experts = expert0_heavy_choices(T, 100);
  const W4A8Inputs in = w4a8_inputs(rng, experts, T, K);
  auto [oc, og] = both_alloc(ElemType::kF32, {T, in.D});
  cpu->moe(in.cpu_params(oc));
  const Tensor small = gpu->alloc(ElemType::kF32, {T, in.D});
  cuda::set_w4a8_experts(*gpu, true);
  cuda::set_w4a8_tiled(*gpu, false);
  gpu->moe(in.gpu_params(small));
  cuda::set_w4a8_tiled(*gpu, true);
  const bool ran = moe_ran(*gpu, in.gpu_params(og), "moe/experts w1, w3 (w4a8 tiled)");
  cuda::set_w4a8_experts(*gpu, cuda::cuda_feature_on("w4a8"));
  cuda::set_w4a8_tiled(*gpu, cuda::cuda_feature_on("w4a8_tiled"));
  EXPECT_EQ(ran, cuda::cuda_feature_on("grouped_moe")) << "the tiled W4A8 kernel ran: " << ran;
  const std::vector<float> g = gpu->download_f32(og);
  expect_same_bits(g, gpu->download_f32(small), "moe w4a8 tiled vs small kernel");
  expect_mostly_identical(g, cpu->download_f32(oc), 0.8, 1e-4, "moe w4a8 tiled vs cpu");
}

// The W4A8 experts' swiglu, routing weight and act_quant in one kernel give the three kernels' bits:
// the MoE's output with the fused kernel on and off, for F = 96 (a partial block of 128 inputs: the
// mma.sync kernels) and 256 (wgmma: 0.6 of the values identical to the CPU, as the wgmma tests), with
// the small kernels (5 tokens) and the tiled ones (150: expert 0 with 100 rows); the profile shows
// the W4A8 path ran (where the experts are grouped: SPARROW_CUDA_DISABLE=grouped_moe takes the
// per-expert path, which has no fused kernel). (Each test has its own backend: no switch restored.)
TEST_F(CudaOps, MoeW4A8FusedActivationGivesTheSameBits) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(209);
  cuda::set_w4a8_experts(*gpu, true);
  cuda::set_w4a8_tiled(*gpu, true);
  cuda::set_w4a8_wgmma(*gpu, true);
  for (const int64_t F : {96, 256}) {
    for (const int64_t T : {5, 150}) {
      const int64_t K = 2;
      const W4A8Inputs in = w4a8_inputs(rng, expert0_heavy_choices(T, 100), T, K, F);
      const Tensor fused = gpu->alloc(ElemType::kF32, {T, in.D}), apart = gpu->alloc(ElemType::kF32, {T, in.D});
      const Tensor oc = cpu->alloc(ElemType::kF32, {T, in.D});
      cpu->moe(in.cpu_params(oc));
      cuda::set_moe_fused_act(*gpu, false);
      gpu->moe(in.gpu_params(apart));
      cuda::set_moe_fused_act(*gpu, true);
      const std::string path = std::string(F % 128 == 0 ? "w4a8 wgmma" : "w4a8") + (T == 150 ? " tiled" : "");
      const bool ran = moe_ran(*gpu, in.gpu_params(fused), "moe/experts w1, w3 (" + path + ")");
      const std::string tag = " F=" + std::to_string(F) + " T=" + std::to_string(T);
      EXPECT_EQ(ran, cuda::cuda_feature_on("grouped_moe")) << "the " << path << " path ran: " << ran << tag;
      const std::vector<float> g = gpu->download_f32(fused);
      expect_same_bits(g, gpu->download_f32(apart), "moe w4a8 fused activation vs three kernels" + tag);
      expect_mostly_identical(g, cpu->download_f32(oc), 0.6, 1e-4, "moe w4a8 fused activation vs cpu" + tag);
    }
  }
}

// A split decode GEMM's parts added by the kernel that reads its output (`parts_in_readers`,
// kernels.h PartsView) give the bits of the parts' own sum, with the reader's rounding after:
// the stacked linears' split_cols (FP8 with and without round_bf16, and bf16), the scored router's
// logits (a bf16 gate), and in the MoE (MXFP4 routed experts on wgmma, an FP8 shared expert with
// 128 x 128 blocks, as released) the fused activation, the scatter, swiglu_sim and the combine;
// each at 1 and 5 tokens (a decode GEMM splits K over blocks at these sizes) and at 100 (the TMA
// kernels split these few tiles into separate items; the routed experts take the tiled kernel,
// which does not split), with the switch off and on. The count of outputs read that way must grow
// by the readers' number when on, and stay put when off: the comparison saw the left parts, not
// two summed runs. (Each test has its own backend: no switch restored.)
TEST_F(CudaOps, PartsLeftForReadersGiveTheSummedBits) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(212);
  cuda::set_fp8_gemm_in_linear(*gpu, true);
  cuda::set_w4a8_experts(*gpu, true);
  cuda::set_w4a8_wgmma(*gpu, true);
  cuda::set_moe_fused_act(*gpu, true);
  const int64_t K = 512, D = 256, F = 256, E = 6;
  const StoredMatrix a8 = fp8_matrix(rng, 256, K, 128, 128, DType::kF8E8M0),
                     b8 = fp8_matrix(rng, 128, K, 128, 128, DType::kF8E8M0);
  const StoredMatrix a16 = float_matrix(DType::kBF16, 200, K, rng.normal(200 * K, 0.05)),
                     b16 = float_matrix(DType::kBF16, 56, K, rng.normal(56 * K, 0.05));
  const StoredMatrix gate = float_matrix(DType::kBF16, 256, D, rng.normal(256 * D, 0.1));
  const Stored bias = stored_floats(DType::kF32, {256}, rng.normal(256, 0.05));
  const MoeCase mc = make_released_moe(rng, E, D, F);
  for (const int64_t T : {1, 5, 100}) {
    std::vector<float> x = rng.normal(T * K), xd = rng.normal(T * D, 2.0);
    for (float& v : x) v = bf16_round(v);
    for (float& v : xd) v = bf16_round(v);
    const Tensor xg = gpu->upload_f32(x, {T, K}), xdg = gpu->upload_f32(xd, {T, D});
    std::vector<int32_t> ids(T);
    for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>(t);
    const BatchInfo batch = simple_batch(ids);
    const Tensor eg = gpu->upload_i32(two_experts_a_token(T, E), {T, 2}), wg = gpu->upload_f32(rng.uniform(2 * T, 0.1, 1.0), {T, 2});
    // Every output of the four calls, in order, and the reads of left parts they made.
    auto run_all = [&](bool on) {
      cuda::set_parts_in_readers(*gpu, on);
      const int64_t before = cuda::parts_left_for_readers(*gpu);
      std::vector<std::vector<float>> outs;
      for (const bool round : {false, true}) {
        const Tensor oa = gpu->alloc(ElemType::kF32, {T, 256}), ob = gpu->alloc(ElemType::kF32, {T, 128});
        const LinearParams ps[] = {{.out = oa, .in = xg, .weight = &a8.w, .act_quant_fp8 = true, .round_bf16 = round},
                                   {.out = ob, .in = xg, .weight = &b8.w, .act_quant_fp8 = true, .round_bf16 = round}};
        gpu->linears(ps);
        outs.push_back(gpu->download_f32(oa));
        outs.push_back(gpu->download_f32(ob));
      }
      {
        const Tensor oa = gpu->alloc(ElemType::kF32, {T, 200}), ob = gpu->alloc(ElemType::kF32, {T, 56});
        const LinearParams ps[] = {{.out = oa, .in = xg, .weight = &a16.w, .input_bf16 = true},
                                   {.out = ob, .in = xg, .weight = &b16.w, .input_bf16 = true}};
        gpu->linears(ps);
        outs.push_back(gpu->download_f32(oa));
        outs.push_back(gpu->download_f32(ob));
      }
      {
        const Tensor oe = gpu->alloc(ElemType::kI32, {T, 6}), ow = gpu->alloc(ElemType::kF32, {T, 6});
        gpu->router({.out_experts = oe, .out_weights = ow, .x = xdg, .gate = &gate.w, .bias = bias.view,
                     .batch = &batch, .kind = MoeKind::kScored, .k = 6, .routed_scale = 1.5,
                     .placement = RoutedScalePlacement::kInRouterWeights, .input_bf16 = true});
        const std::vector<int32_t> experts = gpu->download_i32(oe);
        outs.emplace_back(experts.begin(), experts.end());
        outs.push_back(gpu->download_f32(ow));
      }
      {
        const Tensor o = gpu->alloc(ElemType::kF32, {T, D});
        gpu->moe(w4a8_moe_params(mc, o, xdg, eg, wg));
        outs.push_back(gpu->download_f32(o));
      }
      return std::pair{outs, cuda::parts_left_for_readers(*gpu) - before};
    };
    // On first: its slices then land in buffers that have not held these values (the off run's
    // slices, the same values, would hide a reader that ran before its GEMM or read stale slices).
    const auto [on, left_on] = run_all(true);
    const auto [off, left_off] = run_all(false);
    const std::string tag = " T=" + std::to_string(T);
    EXPECT_EQ(left_off, 0) << "parts were left with the switch off" << tag;
    // 2 + 1 stacked FP8 / bf16 products, the router's logits, the experts' w1 / w3 and w2 (not at 100
    // rows), the shared expert's w1 / w3 and w2: where the paths that leave them are all on (read
    // once from SPARROW_CUDA_DISABLE, which gpu-check's fallback rows set; no setters).
    bool defaults = true;
    for (const char* s : {"fp8_stack", "fp8_wgmma", "fp8_tma", "bf16_gemm", "bf16_wgmma", "bf16_tma", "grouped_moe",
                          "moe_device_plan", "w4a8_pair", "swiglu_sim"})
      defaults = defaults && cuda::cuda_feature_on(s);
    if (defaults) {
      EXPECT_EQ(left_on, T <= 64 ? 8 : 6) << "not every reader added the parts itself" << tag;
    }
    ASSERT_EQ(on.size(), off.size());
    for (size_t i = 0; i < on.size(); ++i) expect_same_bits(on[i], off[i], "output " + std::to_string(i) + tag);
    EXPECT_GT(std::count_if(on.back().begin(), on.back().end(), [](float v) { return v != 0.0f; }), T * D / 2) << tag;
  }
}

// The MoE's FP8-rounded input rows made only where a CUDA-core projection reads them
// (cuda::set_moe_x_lazy): the W4A8 experts and the shared expert's FP8 tensor-core GEMMs quantise the
// unrounded input themselves (lazy) where they quantised the rounded rows (not lazy), which must
// give the same bits, also where re-quantising halves a block's scale (a block whose largest value,
// 225 x 2^-7, rounds down to 224 x its scale: the rounded block's scale is half the input's, its
// codes double). At 1, 5 and 100 tokens, W4A8 routed experts and a 128 x 128 FP8 shared expert,
// with the lazy rows and without; then the routed experts on the CUDA cores (W4A8 off), then the
// shared expert's projections on the CUDA cores (fp8_gemm off): those read the rounded rows.
TEST_F(CudaOps, MoeInputRoundedOnlyWhereReadGivesTheSameBits) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(231);
  cuda::set_fp8_gemm_in_linear(*gpu, true);
  cuda::set_w4a8_wgmma(*gpu, true);
  const int64_t D = 256, F = 256, E = 6;
  const MoeCase mc = make_released_moe(rng, E, D, F);
  for (const int64_t T : {1, 5, 100}) {
    std::vector<float> x = rng.uniform(T * D, -1.6, 1.6);
    for (float& v : x) v = bf16_round(v);
    for (int64_t t = 0; t < T; t += 2) x[t * D + 5] = 1.7578125f;  // 225 x 2^-7: the scale-halving block
    const Tensor xg = gpu->upload_f32(x, {T, D}), eg = gpu->upload_i32(two_experts_a_token(T, E), {T, 2}),
                 wg = gpu->upload_f32(rng.uniform(2 * T, 0.1, 1.0), {T, 2});
    const std::string tag = " T=" + std::to_string(T);
    // W4A8 experts and the shared expert on the FP8 tensor cores (the fast path); the experts on the
    // CUDA cores; the shared expert's projections on the CUDA cores too (its fallback: cc_x).
    for (const auto& [w4a8, fp8_gemm] : {std::pair{true, true}, std::pair{false, true}, std::pair{true, false}}) {
      cuda::set_w4a8_experts(*gpu, w4a8);
      cuda::set_fp8_gemm_in_linear(*gpu, fp8_gemm);
      std::vector<float> out[2];
      bool made[2] = {};
      for (const bool lazy : {true, false}) {  // (lazy first: buffers that never held the other's values)
        cuda::set_moe_x_lazy(*gpu, lazy);
        const Tensor o = gpu->alloc(ElemType::kF32, {T, D});
        gpu->moe(w4a8_moe_params(mc, o, xg, eg, wg));
        out[lazy ? 0 : 1] = gpu->download_f32(o);
        made[lazy ? 0 : 1] = cuda::last_moe_x_rounded(*gpu);
      }
      const std::string what = std::string(w4a8 ? " w4a8" : " cuda cores") + (fp8_gemm ? "" : ", shared on cuda cores") + tag;
      EXPECT_TRUE(made[1]) << "without the lazy rows the rounded rows are always made" << what;
      // The CUDA-core projections read them; on the fast paths nothing does (where the grouped plan
      // runs: gpu-check's fallback rows turn it off through SPARROW_CUDA_DISABLE).
      if (!w4a8 || !fp8_gemm) {
        EXPECT_TRUE(made[0]) << what;
      } else if (cuda::cuda_feature_on("grouped_moe")) {
        EXPECT_FALSE(made[0]) << "the rounded rows were made though no projection reads them" << what;
      }
      expect_same_bits(out[0], out[1], "moe lazy vs eager rounded input" + what);
      EXPECT_GT(std::count_if(out[0].begin(), out[0].end(), [](float v) { return v != 0.0f; }), T * D / 2) << what;
    }
  }
}

// The shared expert on a stream of its own beside the routed experts (cuda::set_moe_shared_beside):
// the same kernels on the same inputs, so the same bits as one stream (whose output the other MoE
// tests hold against the CPU), at 1, 5 and 64 tokens (100: past the row limit, one stream either
// way), with the fast paths (W4A8 experts, the shared expert on the FP8 tensor cores), the routed
// experts on the CUDA cores, the shared expert's projections on the CUDA cores (each frees scratch
// of its own inside the fork, which the join must hold back; the shared expert makes the rounded
// rows on its stream), and both on the CUDA cores (the routed experts then read those rows: the
// default stream waits for the side stream's mark), with the rounded rows made lazily and before;
// and twice in a row without a read between (the second call must not reuse memory the first
// call's shared expert still reads). A race shows as other bits.
TEST_F(CudaOps, MoeSharedExpertBesideTheRoutedGivesTheSameBits) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(233);
  cuda::set_w4a8_wgmma(*gpu, true);
  const int64_t D = 256, F = 256, E = 6;
  const MoeCase mc = make_released_moe(rng, E, D, F);
  for (const int64_t T : {1, 5, 64, 100}) {
    std::vector<float> x = rng.uniform(T * D, -1.6, 1.6);
    for (float& v : x) v = bf16_round(v);
    const Tensor xg = gpu->upload_f32(x, {T, D}), eg = gpu->upload_i32(two_experts_a_token(T, E), {T, 2}),
                 wg = gpu->upload_f32(rng.uniform(2 * T, 0.1, 1.0), {T, 2});
    for (const auto& [w4a8, fp8_gemm] :
         {std::pair{true, true}, std::pair{false, true}, std::pair{true, false}, std::pair{false, false}})
      for (const bool lazy : {true, false}) {
        cuda::set_w4a8_experts(*gpu, w4a8);
        cuda::set_fp8_gemm_in_linear(*gpu, fp8_gemm);
        cuda::set_moe_x_lazy(*gpu, lazy);
        const std::string what = std::string(w4a8 ? " w4a8" : " routed on cuda cores") +
                                 (fp8_gemm ? "" : ", shared on cuda cores") + (lazy ? "" : ", rows rounded first") +
                                 " T=" + std::to_string(T);
        std::vector<float> out[2][2];
        for (const bool beside : {true, false}) {  // (beside first: buffers that never held the other's values)
          cuda::set_moe_shared_beside(*gpu, beside);
          const Tensor o1 = gpu->alloc(ElemType::kF32, {T, D}), o2 = gpu->alloc(ElemType::kF32, {T, D});
          gpu->moe(w4a8_moe_params(mc, o1, xg, eg, wg));
          EXPECT_EQ(cuda::last_moe_shared_beside(*gpu), beside && T <= 64) << what;
          gpu->moe(w4a8_moe_params(mc, o2, xg, eg, wg));
          out[beside][0] = gpu->download_f32(o1);
          out[beside][1] = gpu->download_f32(o2);
        }
        expect_same_bits(out[1][0], out[0][0], "moe shared expert beside vs after the routed, first call" + what);
        expect_same_bits(out[1][1], out[0][1], "moe shared expert beside vs after the routed, second call" + what);
        EXPECT_GT(std::count_if(out[1][0].begin(), out[1][0].end(), [](float v) { return v != 0.0f; }), T * D / 2) << what;
      }
  }
  cuda::set_moe_shared_beside(*gpu, cuda::cuda_feature_on("moe_shared_beside"));
  cuda::set_moe_x_lazy(*gpu, cuda::cuda_feature_on("moe_x_lazy"));
  cuda::set_w4a8_experts(*gpu, cuda::cuda_feature_on("w4a8"));
  cuda::set_fp8_gemm_in_linear(*gpu, cuda::cuda_feature_on("fp8_gemm"));
}

// The small W4A8 kernel's width (16 or 32 output columns a block; chosen by the batch) is not part
// of its arithmetic: the MoE's output is the same bits at either width, for the CUDA test's shapes
// (N = 96 and 256: a partial 32-column block and a 16-column one past N), 7 to 16 rows an expert
// (full and partial tiles of 8).
TEST_F(CudaOps, MoeW4A8SmallKernelWidthGivesTheSameBits) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(210);
  const int64_t T = 23, K = 3;
  std::vector<int32_t> experts(T * K);
  for (int64_t i = 0; i < T * K; ++i) experts[i] = static_cast<int32_t>((i * i + i / 3) % 6);
  const W4A8Inputs in = w4a8_inputs(rng, experts, T, K);
  const int64_t D = in.D;
  cuda::set_w4a8_experts(*gpu, true);
  std::vector<float> out[3];
  for (int tiles : {1, 2, 0}) {
    cuda::set_w4a8_small_tiles(*gpu, tiles);
    const Tensor o = gpu->alloc(ElemType::kF32, {T, D});
    gpu->moe(in.gpu_params(o));
    out[tiles] = gpu->download_f32(o);
  }
  cuda::set_w4a8_small_tiles(*gpu, 0);
  cuda::set_w4a8_experts(*gpu, cuda::cuda_feature_on("w4a8"));
  expect_same_bits(out[1], out[2], "moe w4a8 16 vs 32 columns a block");
  expect_same_bits(out[0], out[2], "moe w4a8 chosen width vs 32 columns");
  // Not all zero: the comparison saw real outputs.
  EXPECT_GT(std::count_if(out[2].begin(), out[2].end(), [](float v) { return v != 0.0f; }), T * D / 2);
}

// The W4A8 experts on wgmma (K multiples of 128: D = 256, F = 384, so 2 and 3 groups a row) against
// the CPU's reference numerics and against the mma.sync W4A8 kernels. The two differ in how a group's
// products are summed (one wgmma chain of 128 products with the block scales folded into e5m2
// weights, against f16 mma steps of 16 and a scale per block of 32), so both comparisons are
// "mostly the same bf16 bits" with the cosine bound the other W4A8 tests use. The profile shows the
// wgmma kernel ran.
TEST_F(CudaOps, MoeW4A8WgmmaMatchesCpuAndTheMmaKernels) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(211);
  const int64_t T = 40, K = 2;
  std::vector<int32_t> experts(T * K);
  for (int64_t i = 0; i < T * K; ++i) experts[i] = static_cast<int32_t>(i % 5);  // 16 rows each, expert 5 idle
  const W4A8Inputs in = w4a8_inputs(rng, experts, T, K, 384);
  auto [oc, og] = both_alloc(ElemType::kF32, {T, in.D});
  cpu->moe(in.cpu_params(oc));
  cuda::set_w4a8_experts(*gpu, true);
  cuda::set_w4a8_wgmma(*gpu, false);
  const Tensor mma = gpu->alloc(ElemType::kF32, {T, in.D});
  gpu->moe(in.gpu_params(mma));
  cuda::set_w4a8_wgmma(*gpu, true);
  const bool ran = moe_ran(*gpu, in.gpu_params(og), "moe/experts w1, w3 (w4a8 wgmma)");
  EXPECT_EQ(ran, cuda::cuda_feature_on("grouped_moe")) << "the wgmma W4A8 path ran: " << ran;
  const std::vector<float> g = gpu->download_f32(og);
  for (float v : g) ASSERT_EQ(v, bf16_round(v)) << "moe output is bf16";
  expect_mostly_identical(g, cpu->download_f32(oc), 0.6, 1e-4, "moe w4a8 wgmma vs cpu");
  expect_mostly_identical(g, gpu->download_f32(mma), 0.6, 1e-4, "moe w4a8 wgmma vs mma.sync");
}

// The wgmma path's prefill kernel (64 rows a block) and decode kernel (8 rows a block) give every
// output the same arithmetic: the MoE's output is the same bits with the tiled kernel on and off.
// Expert 0 gets 100 rows (a full tile of 64 and a partial one), the others 50, expert 5 none.
TEST_F(CudaOps, MoeW4A8WgmmaTiledKernelGivesTheDecodeKernelsBits) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(212);
  const int64_t T = 150, K = 2;
  const std::vector<int32_t> experts = expert0_heavy_choices(T, 100);
  const W4A8Inputs in = w4a8_inputs(rng, experts, T, K, 384);
  auto [oc, og] = both_alloc(ElemType::kF32, {T, in.D});
  cpu->moe(in.cpu_params(oc));
  const Tensor small = gpu->alloc(ElemType::kF32, {T, in.D});
  cuda::set_w4a8_experts(*gpu, true);
  cuda::set_w4a8_wgmma(*gpu, true);
  cuda::set_w4a8_tiled(*gpu, false);
  gpu->moe(in.gpu_params(small));
  cuda::set_w4a8_tiled(*gpu, true);
  const bool ran = moe_ran(*gpu, in.gpu_params(og), "moe/experts w1, w3 (w4a8 wgmma tiled)");
  EXPECT_EQ(ran, cuda::cuda_feature_on("grouped_moe")) << "the tiled wgmma kernel ran: " << ran;
  // The tiled kernel stores w2's rows in their slots itself (`moe_scatter_store`; the decode forms'
  // runs below check the split ones leave them to the scatter kernel).
  EXPECT_EQ(cuda::last_moe_scatter_store(*gpu), ran && cuda::cuda_feature_on("moe_scatter_store"));
  const std::vector<float> g = gpu->download_f32(og);
  expect_same_bits(g, gpu->download_f32(small), "moe w4a8 wgmma tiled vs decode kernel");
  expect_mostly_identical(g, cpu->download_f32(oc), 0.6, 1e-4, "moe w4a8 wgmma tiled vs cpu");
  // The tiled kernel's width (1, 2 or 4 warpgroups of 64 columns a block) and its raster (a tile's
  // column blocks in a row or a column block's tiles) are not part of the arithmetic either: each
  // form on `inputs` against `want`, bit for bit.
  // At four warpgroups, the block-barrier form and the mbarrier ring's four forms
  // (cuda::set_w4a8_ring 1, 2, 3, 4: sources by the group number, advanced, advanced with the weights
  // by bulk copies, that in a persistent grid; its warps up to two groups apart). Form 4 with a
  // block an SM (every block one tile here) and with 3 blocks, each taking tile after tile (its ring
  // running on from one into the next; each block's last item past the last tile). And the default
  // (ring 0): form 4 unless the switches say otherwise (cuda_backend.h set_w4a8_ring), checked by its
  // launches as the forms asked for are.
  const char* advance = std::getenv("SPARROW_CUDA_W4A8_RING_ADVANCE");
  const int default_ring = !cuda::cuda_feature_on("w4a8_ring")                ? -1
                           : advance != nullptr && std::string(advance) == "0" ? 1
                           : !cuda::cuda_feature_on("w4a8_ring_bulk")          ? 2
                           : cuda::cuda_feature_on("w4a8_persistent")          ? 4
                                                                               : 3;
  const auto tiled_forms = [&](const W4A8Inputs& inputs, int64_t rows_total, const std::vector<float>& want, const std::string& what) {
    for (int cols_fast : {1, -1})
      for (int wg : {1, 2, 4})
        for (int asked : {-1, 0, 1, 2, 3, 4})
          for (int grid : {0, 3}) {
            if ((wg != 4 && asked != -1) || (asked != 4 && grid != 0)) continue;
            const int ring = asked == 0 ? default_ring : asked;
            cuda::set_w4a8_cols_fast(cols_fast);
            cuda::set_w4a8_wgmma_warpgroups(*gpu, wg);
            cuda::set_w4a8_ring(asked);
            cuda::set_w4a8_persistent_grid(grid);
            const Tensor o = gpu->alloc(ElemType::kF32, {rows_total, inputs.D});
            const int64_t rings = cuda::w4a8_ring_launches(), bulk = cuda::w4a8_ring_bulk_launches(),
                          persistent = cuda::w4a8_persistent_launches(), expanded = cuda::w4a8_expanded_launches();
            gpu->moe(inputs.gpu_params(o));
            const std::string form = what + "warpgroups " + std::to_string(wg) + ", ring " + std::to_string(asked) +
                                     (asked == 0 ? " (form " + std::to_string(ring) + ")" : "") + ", grid " +
                                     std::to_string(grid) + ", cols fast " + std::to_string(cols_fast);
            // w1, w3 and w2 on the ring where it is asked for (unless the opt-in expanded form took
            // them); form 3's bulk copies for each of them (N = F and D, multiples of 64; at F = 384
            // the second 256-column block's last two warpgroups have no columns); form 4 for those
            // whose K has more groups than the copies run ahead (3): w2 (K = F) at F = 1152, not 384;
            // w1 and w3 (K = D; their rows gathered through in_rows) at D = 640, not 256; form 3 for
            // the rest.
            const int64_t persistent_want =
                ring == 4 ? (inputs.D / 128 > 3 ? 2 : 0) + (inputs.mc.F / 128 > 3 ? 1 : 0) : 0;
            if (cuda::cuda_feature_on("grouped_moe") && cuda::w4a8_expanded_launches() == expanded) {
              EXPECT_EQ(cuda::w4a8_ring_launches() - rings, ring > 0 ? 3 : 0) << form;
              EXPECT_EQ(cuda::w4a8_ring_bulk_launches() - bulk, ring >= 3 ? 3 - persistent_want : 0) << form;
              EXPECT_EQ(cuda::w4a8_persistent_launches() - persistent, persistent_want) << form;
            }
            expect_same_bits(gpu->download_f32(o), want, form);
          }
    cuda::set_w4a8_cols_fast(0);
    cuda::set_w4a8_ring(0);
    cuda::set_w4a8_persistent_grid(0);
  };
  tiled_forms(in, T, g, "moe w4a8 wgmma tiled, ");
  // The decode kernel with K's quarters in separate blocks (then added in order) or in one.
  // Split, the quarters over 1, 2 or 4 blocks (each block's quarters into their own slices); each
  // way with ring slots of 1, 2 or 4 groups (cuda::set_w4a8_decode_span; a block's 2 or 3 groups,
  // or its quarter's 0 or 1, leave the wider slots part empty), and 8 or 16 rows a block
  // (cuda::set_w4a8_decode_rows; expert 0's 100 rows are 13 items of 8, so 16 takes 6 whole pairs
  // and a last item of 4 rows alone, the others' 50 rows 3 pairs and a last item of 2).
  // Each way with the copies from a producer warp (w4a8_decode_ws_kernel) and from every thread
  // (cuda::set_w4a8_decode_producer).
  // One form of the decode kernel (producer warp or not, rows, span, split, quarter blocks) on
  // `inputs` against `want`, bit for bit; reset() puts every knob back to its default.
  const auto decode_form = [&](const W4A8Inputs& inputs, int64_t rows_total, const std::vector<float>& want,
                               const std::string& what, int producer, int rows, int span, int split, int qb) {
    cuda::set_w4a8_decode_producer(producer);
    cuda::set_w4a8_decode_rows(rows);
    cuda::set_w4a8_decode_span(span);
    cuda::set_w4a8_wgmma_split(*gpu, split);
    cuda::set_decode_quarter_blocks(qb);
    const Tensor o = gpu->alloc(ElemType::kF32, {rows_total, inputs.D});
    gpu->moe(inputs.gpu_params(o));
    // Unsplit (split 1), a block sums all of K and stores w2's rows in their slots itself; split,
    // the scatter kernel adds the quarters (where the grouped MoE runs at all).
    EXPECT_EQ(cuda::last_moe_scatter_store(*gpu),
              split == 1 && cuda::cuda_feature_on("moe_scatter_store") && cuda::cuda_feature_on("grouped_moe"))
        << what << "split " << split;
    expect_same_bits(gpu->download_f32(o), want,
                     what + (producer > 0 ? "producer warp, " : "") + std::to_string(rows) + " rows, span " +
                         std::to_string(span) + ", split " + std::to_string(split) + ", quarter blocks " + std::to_string(qb));
  };
  const auto reset = [&] {
    cuda::set_w4a8_wgmma_split(*gpu, 0);
    cuda::set_decode_quarter_blocks(0);
    cuda::set_w4a8_decode_producer(0);
    cuda::set_w4a8_decode_span(0);
    cuda::set_w4a8_decode_rows(0);
  };
  cuda::set_w4a8_tiled(*gpu, false);
  for (int producer : {1, -1})
    for (int rows : {8, 16})
      for (int span : {1, 2, 4})
        for (int split : {1, 2})
          for (int qb : {0, 1, 2, 4})
            if (split == 2 || qb == 0) decode_form(in, T, g, "moe w4a8 wgmma decode kernel, ", producer, rows, span, split, qb);
  reset();
  // Longer K and more tiles: F = 1152, so w2's K is 9 groups of 128 inputs and every kernel's ring
  // wraps (the case above has 2 or 3 groups); expert 0 with 280 rows (five 64-row tiles, the last
  // partial), experts 1..4 about 80 rows each; the tiled kernel at both widths against the decode
  // kernel, bit for bit.
  const int64_t T2 = 300;
  const std::vector<int32_t> experts2 = expert0_heavy_choices(T2, 280);
  const W4A8Inputs in2 = w4a8_inputs(rng, experts2, T2, K, 1152);
  const Tensor decode2 = gpu->alloc(ElemType::kF32, {T2, in2.D});
  gpu->moe(in2.gpu_params(decode2));  // (tiled off)
  const std::vector<float> want2 = gpu->download_f32(decode2);
  // The decode kernel's wider slots over 9 groups (a slot of 2 or 4 past the ring's wrap, the last
  // one part empty), K's quarters in one block and over 4 (quarters of 2 and 3 groups).
  for (int producer : {1, -1})
    for (int rows : {8, 16})
      for (int span : {2, 4})
        for (int qb : {0, 4})
          decode_form(in2, T2, want2, "moe w4a8 wgmma decode kernel, 9 groups, ", producer, rows, span, qb == 0 ? 1 : 2, qb);
  reset();
  cuda::set_w4a8_tiled(*gpu, true);
  tiled_forms(in2, T2, want2, "moe w4a8 wgmma tiled, 9 groups, ");
  // D = 640: w1 and w3 have 5 groups of K, so ring form 4 takes them too, their rows gathered
  // through in_rows (w2's are its grouped rows); F = 384 leaves w2 (3 groups) to form 3.
  const int64_t T3 = 150;
  const W4A8Inputs in3 = w4a8_inputs(rng, expert0_heavy_choices(T3, 100), T3, K, 384, 640);
  cuda::set_w4a8_tiled(*gpu, false);
  const Tensor decode3 = gpu->alloc(ElemType::kF32, {T3, in3.D});
  gpu->moe(in3.gpu_params(decode3));
  const std::vector<float> want3 = gpu->download_f32(decode3);
  cuda::set_w4a8_tiled(*gpu, true);
  tiled_forms(in3, T3, want3, "moe w4a8 wgmma tiled, D 640, ");
}

// The far and NaN scales of MoeW4A8WgmmaFarAndNanScales (below), set in the host bytes before the
// GPU first sees the weights: expert 0's w1, block 0 of every group all zero codes at scale byte
// 145 and blocks 1..3 at 118, 117 and 119; expert 1's w2, output column 3's block 2 at byte 255.
void set_far_and_nan_scales(W4A8Inputs& in) {
  const int64_t D = in.D, F = in.mc.F;
  auto& codes = *in.mc.store[0].data.bytes;    // expert 0's w1: [F, D / 2]
  auto& scales = *in.mc.store[0].scale.bytes;  // [F, D / 32]
  for (int64_t n = 0; n < F; ++n)
    for (int64_t grp = 0; grp < D / 128; ++grp) {
      std::fill_n(codes.begin() + n * (D / 2) + 64 * grp, 16, uint8_t{0});
      const uint8_t s[4] = {145, 118, 117, 119};
      std::copy_n(s, 4, scales.begin() + n * (D / 32) + 4 * grp);
    }
  (*in.mc.store[4].scale.bytes)[3 * (F / 32) + 2] = 255;  // expert 1's w2: [D, F / 32]
}

// The expanded form (kernels.h GroupedW4A8Args::expanded: the experts' weights written once as
// e5m2 bytes, then the FP8 TMA kernel's 128 x 128 tiles) gives every output the tiled kernel's
// arithmetic: the MoE's output is the same bits with it forced on and off. Three projections a call
// (w1 and w3 on rows gathered into grouped order, w2 on the swiglu's rows, stored into their
// slots); experts with 0, about 50 and 100 rows (a partial 128-row tile) at F = 384 (w2's K 3
// groups: quarters of no group), then 300 rows (two whole tiles and a partial one) at F = 1152 (9
// groups: the ring wraps, an item's first group in every stage); 151 tokens make 302 rows, and
// experts start at rows that are not multiples of 4 (the scales are read at any row: a tensor
// copy's box could not start there). Then the far and NaN scales of
// MoeW4A8WgmmaFarAndNanScales (below) on the same shapes: the expansion's rounded tables and a NaN
// row scale. By default (and, with SPARROW_CUDA_ENABLE=w4a8_expand, below kW4A8ExpandRows rows an
// expert, as here) the tiled kernel runs.
TEST_F(CudaOps, MoeW4A8ExpandedFormGivesTheTiledKernelsBits) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(214);
  cuda::set_w4a8_experts(*gpu, true);
  cuda::set_w4a8_wgmma(*gpu, true);
  cuda::set_w4a8_tiled(*gpu, true);
  const int64_t K = 2;
  const auto check = [&](const W4A8Inputs& in, int64_t T, const std::string& what) {
    const Tensor tiled = gpu->alloc(ElemType::kF32, {T, in.D}), expanded = gpu->alloc(ElemType::kF32, {T, in.D});
    cuda::set_w4a8_expand(*gpu, 0);
    gpu->moe(in.gpu_params(tiled));
    EXPECT_FALSE(cuda::last_w4a8_expanded(*gpu)) << what << ": the default took the expanded form below its rows";
    const int64_t before = cuda::w4a8_expanded_launches();
    cuda::set_w4a8_expand(*gpu, 2);
    gpu->moe(in.gpu_params(expanded));
    const bool grouped = cuda::cuda_feature_on("grouped_moe");
    EXPECT_EQ(cuda::last_w4a8_expanded(*gpu), grouped) << what;
    EXPECT_EQ(cuda::w4a8_expanded_launches() - before, grouped ? 3 : 0) << what << ": w1, w3 and w2 expanded";
    EXPECT_EQ(cuda::last_moe_scatter_store(*gpu), grouped && cuda::cuda_feature_on("moe_scatter_store")) << what;
    cuda::set_w4a8_expand(*gpu, 0);
    expect_same_bits(gpu->download_f32(expanded), gpu->download_f32(tiled), what);
    return gpu->download_f32(expanded);
  };
  const int64_t T = 151;
  const W4A8Inputs in = w4a8_inputs(rng, expert0_heavy_choices(T, 100), T, K, 384);
  {
    auto [oc, og] = both_alloc(ElemType::kF32, {T, in.D});
    cpu->moe(in.cpu_params(oc));
    const std::vector<float> g = check(in, T, "moe w4a8 expanded, F 384");
    expect_mostly_identical(g, cpu->download_f32(oc), 0.6, 1e-4, "moe w4a8 expanded vs cpu");
  }
  const int64_t T2 = 400;
  check(w4a8_inputs(rng, expert0_heavy_choices(T2, 300), T2, K, 1152), T2, "moe w4a8 expanded, F 1152, 300 rows");
  // (New weights, changed before the GPU first sees them.)
  W4A8Inputs far = w4a8_inputs(rng, expert0_heavy_choices(T, 100), T, K, 384);
  set_far_and_nan_scales(far);
  const std::vector<float> g = check(far, T, "moe w4a8 expanded, far and NaN scales");
  int64_t nans = 0;
  for (float v : g) nans += std::isnan(v);
  EXPECT_GT(nans, 0) << "expert 1's NaN column reached the output";
}

// Scales the wgmma kernels' e5m2 tables treat apart. Expert 0's w1: block 0 of every group all
// zero codes at scale byte 145, blocks 1..3 at 118, 117 and 119 (the other weights' range), so its
// outputs come only from blocks 2^-27 and 2^-28 below the group's largest scale (the table's
// rounded path, here exact e5m2 subnormals) and 2^-26 below it (the direct path), at ordinary
// magnitudes. Expert 1's w2: output column 3's block 2 at scale byte 255 (NaN): that column is NaN
// for expert 1's rows, on the CPU too. Everything else must agree with the CPU as in the tests
// above, and expert 0's far blocks must weigh enough in the output that dropping them would not.
// (Each test has its own backend, so the switches set here need no restoring.)
TEST_F(CudaOps, MoeW4A8WgmmaFarAndNanScales) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(213);
  const int64_t T = 24, K = 2;
  std::vector<int32_t> experts(T * K);
  for (int64_t i = 0; i < T * K; ++i) experts[i] = static_cast<int32_t>(i % 3);
  W4A8Inputs in = w4a8_inputs(rng, experts, T, K, 128);
  const int64_t D = in.D, F = in.mc.F;
  set_far_and_nan_scales(in);
  auto [oc, og] = both_alloc(ElemType::kF32, {T, D});
  cpu->moe(in.cpu_params(oc));
  cuda::set_w4a8_experts(*gpu, true);
  cuda::set_w4a8_wgmma(*gpu, true);
  const bool ran = moe_ran(*gpu, in.gpu_params(og), "moe/experts w1, w3 (w4a8 wgmma)");
  EXPECT_EQ(ran, cuda::cuda_feature_on("grouped_moe")) << "the wgmma W4A8 path ran: " << ran;
  std::vector<float> g = gpu->download_f32(og), c = cpu->download_f32(oc);
  int64_t nan_rows = 0;
  for (int64_t tk = 0; tk < T; ++tk)
    for (int64_t d = 0; d < D; ++d) {
      const bool routed_to_1 = experts[tk * K] == 1 || experts[tk * K + 1] == 1;
      const bool want_nan = routed_to_1 && d == 3;
      ASSERT_EQ(std::isnan(c[tk * D + d]), want_nan) << "cpu token " << tk << " column " << d;
      ASSERT_EQ(std::isnan(g[tk * D + d]), want_nan) << "gpu token " << tk << " column " << d;
      if (want_nan) g[tk * D + d] = c[tk * D + d] = 0.0f, nan_rows += d == 3;
    }
  EXPECT_GT(nan_rows, 0);
  expect_mostly_identical(g, c, 0.6, 1e-4, "moe w4a8 wgmma far and NaN scales vs cpu");
  // The far blocks counted: the CPU's output without them (their codes zeroed; the CPU reads the
  // host bytes at every call) is farther from the one with them than expect_mostly_identical's
  // 1/64 of max|ref| allows, so a kernel that dropped them would have failed above.
  auto& codes = *in.mc.store[0].data.bytes;
  for (int64_t n = 0; n < F; ++n)
    for (int64_t grp = 0; grp < D / 128; ++grp) std::fill_n(codes.begin() + n * (D / 2) + 64 * grp + 16, 48, uint8_t{0});
  const Tensor oc0 = cpu->alloc(ElemType::kF32, {T, D});
  cpu->moe(in.cpu_params(oc0));
  const std::vector<float> c0 = cpu->download_f32(oc0);
  double max_ref = 0, max_drop = 0;
  for (int64_t i = 0; i < T * D; ++i) {
    if (std::isnan(c0[i])) continue;  // (column 3 of expert 1's rows, zeroed in c)
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(c[i])));
    max_drop = std::max(max_drop, std::fabs(static_cast<double>(c[i]) - c0[i]));
  }
  EXPECT_GT(max_drop, 4.0 * max_ref / 64) << "expert 0's far blocks weigh too little to be checked";
}

// A prefill long enough for more work items than grid y's 65,535 (90,000 tokens, 6 experts each,
// 8 experts: 67,508 items): the grouped W4A8 path still runs (the items are on grid x) rather than
// the one-expert-at-a-time fallback, whose sums differ; a token's output is the same bits as in a
// call of 100 tokens.
TEST_F(CudaOps, MoeGroupedBeyondGridYItemsIsBatchInvariant) {
  SPARROW_SKIP_UNLESS_CUDA(gpu);
  Rng rng(209);
  const MoeCase mc = make_moe(rng, 8, 64, 32, true);
  const int64_t T = 90000, K = 6, D = mc.D, T_small = 100;
  std::vector<int32_t> experts(T * K);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < K; ++i) experts[t * K + i] = static_cast<int32_t>((t + i * 3) % 8);
  const std::vector<float> w = rng.uniform(T * K, 0.1, 1.0), x = rng.normal(T * D, 1.0);
  auto run = [&](int64_t n, bool profile) {
    const Tensor e = gpu->upload_i32(std::vector<int32_t>(experts.begin(), experts.begin() + n * K), {n, K});
    const Tensor wt = gpu->upload_f32(std::vector<float>(w.begin(), w.begin() + n * K), {n, K});
    const Tensor xt = gpu->upload_f32(std::vector<float>(x.begin(), x.begin() + n * D), {n, D});
    const Tensor o = gpu->alloc(ElemType::kF32, {n, D});
    cuda::set_op_profiling(*gpu, profile);
    gpu->moe(w4a8_moe_params(mc, o, xt, e, wt));
    cuda::set_op_profiling(*gpu, false);
    return gpu->download_f32(o);
  };
  const std::vector<float> all = run(T, true);
  bool grouped = false;
  for (const cuda::OpTime& op : cuda::take_op_profile(*gpu)) grouped = grouped || op.op.starts_with("moe/experts w1, w3 (w4a8");
  EXPECT_EQ(grouped, cuda::cuda_feature_on("grouped_moe") && cuda::cuda_feature_on("w4a8")) << "the grouped W4A8 path ran";
  const std::vector<float> small = run(T_small, false);
  for (int64_t i = 0; i < T_small * D; ++i)
    ASSERT_EQ(f32_to_bits(small[i]), f32_to_bits(all[i])) << "token " << i / D << " differs among 90,000 and among 100";
}

// The captured steps' fill and upload kernels (kernels.h launch_fill_bytes, launch_upload_pinned)
// write exactly their bytes, at any length and any destination alignment (the byte path), and
// nothing around them: each case between guard bytes of another value.
TEST(CudaCopyKernels, FillAndUploadWriteExactlyTheirBytes) {
  std::unique_ptr<Backend> gpu;
  SPARROW_REQUIRE_CUDA(gpu);
  constexpr int64_t kMax = 70003, kGuard = 64;
  uint8_t* dev = nullptr;
  uint8_t* pinned = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), kMax + 2 * kGuard), cudaSuccess);
  ASSERT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&pinned), kMax, cudaHostAllocMapped), cudaSuccess);
  std::mt19937 rng(17);
  for (int64_t i = 0; i < kMax; ++i) pinned[i] = static_cast<uint8_t>(rng());
  std::vector<uint8_t> got(kMax + 2 * kGuard);
  for (int64_t bytes :
       {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{255}, int64_t{4096}, int64_t{16387}, kMax}) {
    for (int64_t offset : {0, 1, 3, 16}) {
      const int64_t n = std::min<int64_t>(bytes, kMax - offset);
      for (bool upload : {true, false}) {
        ASSERT_EQ(cudaMemset(dev, 0xa5, kMax + 2 * kGuard), cudaSuccess);
        if (upload) cuda::launch_upload_pinned(dev + kGuard + offset, pinned, n);
        else cuda::launch_fill_bytes(dev + kGuard + offset, 0x3c, n);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(got.data(), dev, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
        int64_t wrong = 0, first = -1;
        for (int64_t i = 0; i < static_cast<int64_t>(got.size()); ++i) {
          const int64_t at = i - kGuard - offset;
          const uint8_t want = at >= 0 && at < n ? (upload ? pinned[at] : 0x3c) : 0xa5;
          if (got[i] != want && wrong++ == 0) first = i;
        }
        EXPECT_EQ(wrong, 0) << (upload ? "upload" : "fill") << " of " << n << " bytes at offset " << offset
                            << ": first wrong byte at " << first - kGuard - offset;
      }
    }
  }
  cudaFree(dev);
  cudaFreeHost(pinned);
}

// dev_div_recip (a quotient from the divisor's reciprocal, taken once, and one correction) against
// the IEEE division over divisor and dividend significands in [1, 2): pairs checked and the smallest
// pair that differs (~0 where none does).
namespace {
struct DivRecipCheck {
  unsigned long long checked = 0, differing = 0, example = ~0ull;
};
DivRecipCheck div_recip_check(uint32_t d_first, uint32_t d_count, uint32_t d_step, uint32_t x_step) {
  unsigned long long* d_out = nullptr;
  if (cudaMalloc(reinterpret_cast<void**>(&d_out), 3 * sizeof(unsigned long long)) != cudaSuccess) {
    ADD_FAILURE() << "cudaMalloc of the check's counters";
    return {};  // (nothing checked: the caller's count comparison fails too)
  }
  EXPECT_EQ(cudaMemset(d_out, 0, 2 * sizeof(unsigned long long)), cudaSuccess);
  EXPECT_EQ(cudaMemset(d_out + 2, 0xff, sizeof(unsigned long long)), cudaSuccess);
  cuda::launch_div_recip_check(d_first, d_count, d_step, x_step, d_out, d_out + 2);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  unsigned long long out[3] = {};
  EXPECT_EQ(cudaMemcpy(out, d_out, sizeof(out), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d_out);
  return {out[0], out[1], out[2]};
}
std::string div_recip_pair(unsigned long long example) {
  std::ostringstream s;
  s << "divisor significand 0x" << std::hex << (example >> 23) << ", dividend 0x" << (example & 0x7fffff);
  return s.str();
}
}  // namespace

// The attention's endings divide by a head's denominator through its reciprocal. Sampled here: 32,641
// divisors (every 257th significand) against every dividend, every divisor against every 4,099th
// dividend, and the 256 divisors whose significands are nearly all ones (1/d's rounding is hardest
// there) against every dividend: about 2.9e11 pairs.
TEST(CudaElementwise, QuotientByReciprocalIsTheDivision) {
  std::unique_ptr<Backend> gpu;
  SPARROW_REQUIRE_CUDA(gpu);
  struct Sweep {
    uint32_t d_first, d_count, d_step, x_step;
  };
  for (const Sweep& w : {Sweep{0, (1u << 23) / 257 + 1, 257, 1}, Sweep{0, 1u << 23, 1, 4099}, Sweep{(1u << 23) - 256, 256, 1, 1}}) {
    const DivRecipCheck r = div_recip_check(w.d_first, w.d_count, w.d_step, w.x_step);
    const unsigned long long dividends = ((1ull << 23) + w.x_step - 1) / w.x_step;
    EXPECT_EQ(r.checked, w.d_count * dividends) << "pairs checked, divisor step " << w.d_step;
    EXPECT_EQ(r.differing, 0u) << "the smallest differing pair: " << div_recip_pair(r.example);
  }
}

// The full form: every divisor significand against every dividend significand, 2^46 pairs (66 s on
// an H100, 2026-12-06; run with --gtest_also_run_disabled_tests). Its result is what dev_div_recip's
// comment rests on.
TEST(CudaElementwise, DISABLED_QuotientByReciprocalIsTheDivisionForEveryPair) {
  std::unique_ptr<Backend> gpu;
  SPARROW_REQUIRE_CUDA(gpu);
  const DivRecipCheck r = div_recip_check(0, 1u << 23, 1, 1);
  EXPECT_EQ(r.checked, 1ull << 46) << "pairs checked";
  EXPECT_EQ(r.differing, 0u) << "the smallest differing pair: " << div_recip_pair(r.example);
}

// The bf16 conversion and rounding passes (launch_f32_to_bf16, launch_bf16_round) take four values a
// thread where the length is a multiple of 4 and the arrays aligned, one elsewhere: either way each
// value must be the host's round-to-nearest-even bf16 (NaN kept a NaN), at every length and offset,
// and nothing past the end may be written.
TEST(CudaElementwise, Bf16PassesRoundEveryValueAtAnyLengthAndAlignment) {
  std::unique_ptr<Backend> gpu;
  SPARROW_REQUIRE_CUDA(gpu);
  constexpr int64_t kMax = 70001, kLen = kMax + 8;  // (n + offset stays under kLen)
  std::mt19937 rng(29);
  std::vector<float> x(kLen);
  for (float& v : x) v = std::bit_cast<float>(static_cast<uint32_t>(rng()));  // every exponent, NaNs, subnormals
  x[0] = 1.0f + 0x1p-8f, x[1] = 1.0f + 0x3p-8f, x[2] = -0.0f, x[3] = std::numeric_limits<float>::infinity();
  float* d_in = nullptr;
  uint16_t* d_out = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_in), kLen * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_out), kLen * sizeof(uint16_t)), cudaSuccess);
  std::vector<float> rounded(kLen);
  std::vector<uint16_t> bits(kLen);
  for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{1024}, int64_t{4099}, kMax - 1}) {
    for (const int64_t offset : {0, 1, 4}) {
      const std::string what = "n=" + std::to_string(n) + " offset " + std::to_string(offset);
      ASSERT_EQ(cudaMemcpy(d_in, x.data(), kLen * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemset(d_out, 0xa5, kLen * sizeof(uint16_t)), cudaSuccess);
      cuda::launch_f32_to_bf16(d_in + offset, d_out + offset, n);
      cuda::launch_bf16_round(d_in + offset, n);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
      ASSERT_EQ(cudaMemcpy(rounded.data(), d_in, kLen * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(bits.data(), d_out, bits.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost), cudaSuccess);
      int64_t wrong = 0;
      for (int64_t i = 0; i < kLen; ++i) {
        const bool in = i >= offset && i < offset + n;
        const float v = x[i];
        const bool nan = std::isnan(v);
        const bool round_ok = in ? (nan ? std::isnan(rounded[i]) : f32_to_bits(rounded[i]) == f32_to_bits(bf16_round(v)))
                                 : f32_to_bits(rounded[i]) == f32_to_bits(v);
        const bool bits_ok = in ? (nan ? std::isnan(bf16_to_f32(bits[i])) : bits[i] == f32_to_bf16(v)) : bits[i] == 0xa5a5;
        if ((!round_ok || !bits_ok) && wrong++ < 3)
          ADD_FAILURE() << what << ": value " << i << " (" << v << "): rounded " << rounded[i] << ", bits " << bits[i];
      }
      EXPECT_EQ(wrong, 0) << what;
    }
  }
  cudaFree(d_in);
  cudaFree(d_out);
}

// The W4A8 wgmma kernels' e5m2 tables are relative to the weight row's largest scale byte e_ref
// (DevWeight::row_emax). The decode kernels take a group's from w4a8_group_prep (once a row's group,
// by multiply-adds), falling back to the per-block table where the prep marks the group. Over every
// e_ref 0..255 with blocks 0..31 below it (the boundary of the prep's direct path is 26), e_ref
// equal to the word's largest byte or above it, and random words: both give every block the same
// table bytes; the direct path's bytes are the e5m2 of the e2m1 magnitudes 0.5 .. 6 times 2^(13 +
// e_blk - e_ref); the marking is exactly a block more than 26 below e_ref (so the common path is
// the prep's); the row's scale is 2^(e_ref - 140), NaN at 255.
TEST(CudaW4A8Tables, GroupPrepGivesThePerBlockTables) {
  std::unique_ptr<Backend> gpu;
  SPARROW_REQUIRE_CUDA(gpu);
  std::mt19937 rng(31);
  std::vector<uint32_t> words, e_refs;
  for (uint32_t e_max = 0; e_max < 256; ++e_max)
    for (int k = 0; k < 256; ++k) {
      uint32_t w = 0;
      const int top = static_cast<int>(rng() % 4);
      for (int b = 0; b < 4; ++b) {
        const uint32_t d = b == top ? 0 : rng() % 32;
        w |= (e_max >= d ? e_max - d : 0u) << (8 * b);
      }
      words.push_back(w);
      // Half the entries with the row's largest byte in another group, up to 8 above this one's.
      const uint32_t up = k % 2 == 0 ? 0u : static_cast<uint32_t>(rng() % 9);
      e_refs.push_back(std::min(255u, e_max + up));
    }
  for (int k = 0; k < 65536; ++k) {
    const uint32_t w = static_cast<uint32_t>(rng());
    uint32_t hi = 0;
    for (int b = 0; b < 4; ++b) hi = std::max(hi, (w >> (8 * b)) & 0xffu);
    words.push_back(w);
    e_refs.push_back(std::min(255u, hi + static_cast<uint32_t>(rng() % 4)));
  }
  const int64_t n = static_cast<int64_t>(words.size());
  uint32_t* d_words = nullptr;
  uint32_t* d_refs = nullptr;
  uint32_t* d_out = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_words), n * sizeof(uint32_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_refs), n * sizeof(uint32_t)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_out), 18 * n * sizeof(uint32_t)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_words, words.data(), n * sizeof(uint32_t), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_refs, e_refs.data(), n * sizeof(uint32_t), cudaMemcpyHostToDevice), cudaSuccess);
  cuda::launch_w4a8_table_pair(d_words, d_refs, n, d_out);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint32_t> out(18 * n);
  ASSERT_EQ(cudaMemcpy(out.data(), d_out, out.size() * sizeof(uint32_t), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(d_words);
  cudaFree(d_refs);
  cudaFree(d_out);
  // The e5m2 byte of magnitude v (1..7: 0.5, 1, 1.5, 2, 3, 4, 6) times 2^q, a normal: (1 + f) 2^k.
  const auto e5m2_of = [](int v, int q) {
    const int k[8] = {0, -1, 0, 0, 1, 1, 2, 2};
    const bool half[8] = {false, false, false, true, false, true, false, true};
    return static_cast<uint32_t>(((k[v] + q + 15) << 2) | (half[v] ? 2 : 0));
  };
  int64_t wrong = 0, marked = 0, direct_checked = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t w = words[i], e_ref = e_refs[i];
    const uint32_t* o = out.data() + 18 * i;
    uint32_t lo = 255;
    for (int b = 0; b < 4; ++b) lo = std::min(lo, (w >> (8 * b)) & 0xffu);
    const bool want_marked = e_ref - lo > 26;
    marked += o[0] == 0;
    if ((o[0] == 0) != want_marked && wrong++ < 3)
      ADD_FAILURE() << std::hex << "word 0x" << w << " e_ref " << std::dec << e_ref << ": marked " << (o[0] == 0) << ", want "
                    << want_marked;
    const float cs = std::bit_cast<float>(o[1]), want_cs = std::ldexp(1.0f, static_cast<int>(e_ref) - 140);
    if ((e_ref == 255 ? !std::isnan(cs) : cs != want_cs) && wrong++ < 3)
      ADD_FAILURE() << "e_ref " << e_ref << ": row scale " << cs << ", want " << want_cs;
    for (int b = 0; b < 4; ++b) {
      const uint32_t* ob = o + 2 + 4 * b;
      if ((ob[0] != ob[2] || ob[1] != ob[3]) && wrong++ < 3)
        ADD_FAILURE() << std::hex << "word 0x" << w << " block " << b << ": prep " << ob[0] << " " << ob[1] << ", table " << ob[2]
                      << " " << ob[3];
      const int s = static_cast<int>((w >> (8 * b)) & 0xffu) - static_cast<int>(e_ref);
      if (s < -26) continue;
      ++direct_checked;
      uint32_t want[2] = {0u, 0u};
      for (int v = 1; v < 8; ++v) want[v / 4] |= e5m2_of(v, 13 + s) << (8 * (v % 4));
      if ((ob[2] != want[0] || ob[3] != want[1]) && wrong++ < 3)
        ADD_FAILURE() << std::hex << "word 0x" << w << " block " << b << ": table " << ob[2] << " " << ob[3] << ", want " << want[0]
                      << " " << want[1];
    }
  }
  EXPECT_EQ(wrong, 0);
  // Both paths were exercised: most structured words through the prep, the random ones marked.
  EXPECT_GT(marked, 65536 / 2);
  EXPECT_LT(marked, n - 65536 / 4);
  EXPECT_GT(direct_checked, n);
}

// The W4A8 prefill kernels' tile search: block b's expert and first row for expert counts of one to
// three of its 256-expert passes (a pass's last lane part full: 257, 300, 700), random row counts
// with empty experts among them (a third), a large expert of many tiles, and blocks past the last
// tile (expert -1); against the tiles counted on the host.
TEST(CudaW4A8Tiles, TileSearchFindsEachBlocksExpertAndRow) {
  std::unique_ptr<Backend> gpu;
  SPARROW_REQUIRE_CUDA(gpu);
  std::mt19937 rng(57);
  for (const int64_t E : {1, 5, 31, 256, 257, 300, 512, 700}) {
    std::vector<int64_t> offsets{0};
    for (int64_t e = 0; e < E; ++e) {
      const int64_t rows = e == E / 2 ? 1000 : (rng() % 3 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 200));
      offsets.push_back(offsets.back() + rows);
    }
    std::vector<int64_t> want;  // (expert, first row) a block
    for (int64_t e = 0; e < E; ++e)
      for (int64_t t0 = 0; t0 < offsets[e + 1] - offsets[e]; t0 += 64) want.insert(want.end(), {e, t0});
    for (int k = 0; k < 3; ++k) want.insert(want.end(), {-1, 0});
    const int64_t blocks = static_cast<int64_t>(want.size()) / 2;
    int64_t* d_off = nullptr;
    int64_t* d_out = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_off), offsets.size() * sizeof(int64_t)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_out), want.size() * sizeof(int64_t)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_off, offsets.data(), offsets.size() * sizeof(int64_t), cudaMemcpyHostToDevice), cudaSuccess);
    cuda::launch_w4a8_find_tiles(d_off, E, blocks, d_out);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<int64_t> got(want.size());
    ASSERT_EQ(cudaMemcpy(got.data(), d_out, got.size() * sizeof(int64_t), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(d_off);
    cudaFree(d_out);
    int64_t wrong = 0, first = -1;
    for (int64_t b = 0; b < blocks; ++b)
      if (got[2 * b] != want[2 * b] || (want[2 * b] >= 0 && got[2 * b + 1] != want[2 * b + 1])) {
        if (first < 0) first = b;
        ++wrong;
      }
    EXPECT_EQ(wrong, 0) << E << " experts, " << blocks << " blocks; first wrong block " << first << ": expert "
                        << (first >= 0 ? got[2 * first] : 0) << " row " << (first >= 0 ? got[2 * first + 1] : 0) << ", want "
                        << (first >= 0 ? want[2 * first] : 0) << " row " << (first >= 0 ? want[2 * first + 1] : 0);
  }
}

// The MXFP4 device layout (fp4_layout.h), on the host (no GPU needed): each input's magnitude bits
// stay in its nibble and its sign lands on the bit the W4A8 conversion reads (bit 7 of byte j of w
// for inputs j < 4, of w << 4 for 4 + j), nothing else set; and the readers' inverse gives back
// every released word. The kernels' use of it is checked against the CPU by the MXFP4 linear and
// MoE tests.
TEST(CudaFp4Layout, SignsWhereTheE5m2BytesTakeThemAndBackAgain) {
  for (int j = 0; j < 8; ++j)
    for (uint32_t code = 0; code < 16; ++code) {
      const uint32_t d = cuda::fp4_word_to_device(code << (4 * j));
      const uint32_t mag = (code & 7u) << (4 * j), sign = (code >> 3) << cuda::fp4_device_sign_bit(j);
      EXPECT_EQ(d, mag | sign) << "input " << j << " code " << code;
      const uint32_t sign_byte = (j < 4 ? d : d << 4) & (0x80u << (8 * (j % 4)));
      EXPECT_EQ(sign_byte != 0, (code & 8u) != 0) << "input " << j << " code " << code;
      EXPECT_EQ(cuda::fp4_word_released(d), code << (4 * j)) << "input " << j << " code " << code;
    }
  std::mt19937 gen(7);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t w = static_cast<uint32_t>(gen());
    const uint32_t d = cuda::fp4_word_to_device(w);
    ASSERT_EQ(d & 0x77777777u, w & 0x77777777u) << std::hex << w;
    ASSERT_EQ(cuda::fp4_word_released(d), w) << std::hex << w;
  }
}

// The MXFP4 rows' tiled order (fp4_layout.h), on the host: a permutation of the weight's bytes;
// every 64-row block's group of 64 bytes a row in one 4 KB piece (a W4A8 decode slot's), the
// groups of a block in order; fp4_tiled_source its inverse (the upload kernel's); the untiled
// order the released one; only shapes of whole 64-row blocks and 64-byte groups tiled.
TEST(CudaFp4Layout, TiledOrderIsAPermutationWithEachBlocksGroupInOnePiece) {
  for (const auto& [rows, row_bytes] : std::vector<std::pair<int64_t, int64_t>>{{64, 64}, {128, 192}, {192, 1024}}) {
    ASSERT_TRUE(cuda::fp4_tiles(rows, row_bytes));
    std::vector<int> seen(static_cast<size_t>(rows * row_bytes), 0);
    for (int64_t n = 0; n < rows; ++n)
      for (int64_t b = 0; b < row_bytes; ++b) {
        ASSERT_EQ(cuda::fp4_offset(false, row_bytes, n, b), n * row_bytes + b);
        const int64_t o = cuda::fp4_offset(true, row_bytes, n, b);
        ASSERT_GE(o, 0);
        ASSERT_LT(o, rows * row_bytes);
        ++seen[static_cast<size_t>(o)];
        const int64_t piece = (n / 64) * 64 * row_bytes + (b / 64) * 4096;  // the block's group
        ASSERT_GE(o, piece) << n << " " << b;
        ASSERT_LT(o, piece + 4096) << n << " " << b;
        int64_t n2 = -1, b2 = -1;
        cuda::fp4_tiled_source(row_bytes, o, n2, b2);
        ASSERT_EQ(n2, n);
        ASSERT_EQ(b2, b);
      }
    for (int c : seen) ASSERT_EQ(c, 1) << rows << " x " << row_bytes;
  }
  EXPECT_FALSE(cuda::fp4_tiles(96, 64));
  EXPECT_FALSE(cuda::fp4_tiles(64, 48));
  EXPECT_FALSE(cuda::fp4_tiles(0, 64));
}

// The tensor-core attention's weighted sum shared out (attn_layout.h), on the host: for every form
// (Dh 128 / 256 / 512 as pairs of n8 tiles; 8 or 16 weighted-sum warps, or the overlapped form's
// 12) and 1, 2 or 4 dim slices, every pair made by exactly one (slice's block, warp), a slice's
// pairs its own quarter or half in order, no warp holding more pairs than the form's accumulators
// (the whole-Dh count rounded up), and a warp that makes no weighted sum (index -1) holding none.
TEST(CudaAttnLayout, EveryDimPairOnceOverSlicesAndWarps) {
  for (int pairs : {8, 16, 32})
    for (int warps : {8, 12, 16})
      for (int slices : {1, 2, 4}) {
        const std::string what = std::to_string(pairs) + " pairs, " + std::to_string(warps) + " warps, " +
                                 std::to_string(slices) + " slices";
        const int most = (pairs + warps - 1) / warps;
        std::vector<int> seen(static_cast<size_t>(pairs), 0);
        for (int slice = 0; slice < slices; ++slice) {
          int first = -1, count = -1;
          cuda::attention_pv_pairs(pairs, slices, slice, -1, warps, first, count);
          EXPECT_EQ(count, 0) << what;
          int next = slice * (pairs / slices);  // the warps' ranges follow each other
          for (int w = 0; w < warps; ++w) {
            cuda::attention_pv_pairs(pairs, slices, slice, w, warps, first, count);
            ASSERT_GE(count, 0) << what;
            ASSERT_LE(count, most) << what << " warp " << w;
            if (count > 0) {
              ASSERT_EQ(first, next) << what << " slice " << slice << " warp " << w;
            }
            next += count;
            for (int p = first; p < first + count; ++p) {
              ASSERT_GE(p, slice * (pairs / slices)) << what;
              ASSERT_LT(p, (slice + 1) * (pairs / slices)) << what;
              ++seen[static_cast<size_t>(p)];
            }
          }
          EXPECT_EQ(next, (slice + 1) * (pairs / slices)) << what << " slice " << slice;
        }
        for (int p = 0; p < pairs; ++p) EXPECT_EQ(seen[static_cast<size_t>(p)], 1) << what << " pair " << p;
      }
  // The whole-Dh forms as the kernel had them: 16 warps at Dh 512 two pairs each, the overlapped
  // form's 12 warps 8 x 3 + 4 x 2.
  int first = 0, count = 0;
  cuda::attention_pv_pairs(32, 1, 0, 5, 16, first, count);
  EXPECT_EQ(first, 10);
  EXPECT_EQ(count, 2);
  cuda::attention_pv_pairs(32, 1, 0, 7, 12, first, count);
  EXPECT_EQ(first, 21);
  EXPECT_EQ(count, 3);
  cuda::attention_pv_pairs(32, 1, 0, 8, 12, first, count);
  EXPECT_EQ(first, 24);
  EXPECT_EQ(count, 2);
  // The launch's choice: 4 slices while 4 x the blocks fit in the SMs, then 2, then 1 (batch 1 on
  // V4-Flash: 4 blocks of 16 heads, so 16 blocks on the H200's 132 SMs; batch 8: 32 -> 128).
  EXPECT_EQ(cuda::attention_dim_slices_for(4, 132), 4);
  EXPECT_EQ(cuda::attention_dim_slices_for(33, 132), 4);
  EXPECT_EQ(cuda::attention_dim_slices_for(34, 132), 2);
  EXPECT_EQ(cuda::attention_dim_slices_for(66, 132), 2);
  EXPECT_EQ(cuda::attention_dim_slices_for(67, 132), 1);
  EXPECT_EQ(cuda::attention_dim_slices_for(256, 132), 1);
}

// The TMA kernels' raster (tile_raster.h), on the host: every (token tile, weight tile) taken once
// at any group, the default order a weight tile's token tiles in a row, and with a group of G the
// tiles of a token tile's group of weight tiles (G of them, fewer in the last group) in a row.
TEST(CudaTileRaster, EveryTileOnceAndGroupsInARow) {
  for (const auto& [mt, nt] : std::vector<std::pair<int, int>>{{1, 1}, {33, 2}, {64, 32}, {33, 8}, {5, 17}, {64, 256}})
    for (int group : {0, 1, 3, 4, 8, 16, 64}) {
      std::vector<int> seen(static_cast<size_t>(mt * nt), 0);
      for (int t = 0; t < mt * nt; ++t) {
        int m = -1, n = -1;
        cuda::tma_tile_at(t, mt, nt, group, m, n);
        ASSERT_GE(m, 0);
        ASSERT_LT(m, mt);
        ASSERT_GE(n, 0);
        ASSERT_LT(n, nt);
        ++seen[static_cast<size_t>(m * nt + n)];
        if (group <= 1) {
          ASSERT_EQ(m, t % mt);
          ASSERT_EQ(n, t / mt);
        } else {
          const int first = (n / group) * group, width = std::min(group, nt - first);
          ASSERT_EQ(t, first * mt + m * width + (n - first)) << mt << " x " << nt << ", group " << group;
        }
      }
      for (int c : seen) ASSERT_EQ(c, 1) << mt << " x " << nt << ", group " << group;
    }
}

// The raster chosen by size (tma_raster_auto) at the V4-Flash shapes it was measured on, 8192 rows:
// groups of 8 where a weight tile's activations pass 24 MiB (wo_a's bf16 group slice of 4096, wo_b's
// 8192, wq_a's 4096 in FP8), a weight tile's token tiles in a row below (wq_b's 1024, w2's 2048).
TEST(CudaTileRaster, ChoiceBySizeAtTheMeasuredShapes) {
  EXPECT_EQ(cuda::tma_raster_auto(int64_t{8192} * 4096 * 2), 8);  // wo_a, bf16
  EXPECT_EQ(cuda::tma_raster_auto(int64_t{8192} * 8192), 8);      // wo_b, FP8
  EXPECT_EQ(cuda::tma_raster_auto(int64_t{8192} * 4096), 8);      // wq_a / wkv / shared w1, FP8
  EXPECT_EQ(cuda::tma_raster_auto(int64_t{8192} * 2048), 1);      // shared w2, FP8
  EXPECT_EQ(cuda::tma_raster_auto(int64_t{8192} * 1024), 1);      // wq_b, FP8
  EXPECT_EQ(cuda::tma_raster_auto(int64_t{256} * 8192), 1);       // decode sizes
  EXPECT_EQ(cuda::tma_raster_auto(cuda::kTmaRasterAutoBytes), 1);
  EXPECT_EQ(cuda::tma_raster_auto(cuda::kTmaRasterAutoBytes + 1), 8);
}

// The FFN's SwiGLU, routing-weight rounding and fp8 rounding in one kernel (launch_swiglu_sim_fp8)
// give the three passes' bits (launch_swiglu, launch_route_scale_bf16, launch_row_sim): stacked (a
// and b halves of rows of 2F) and in place, with and without routing weights, F not a multiple of
// the block, values past the clamp limit, a zero row (the scale's floor).
TEST(CudaSwigluSim, OnePassGivesTheThreePassesBits) {
  std::unique_ptr<Backend> gpu;
  SPARROW_REQUIRE_CUDA(gpu);
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const float limit = 7.0f;
  for (const int64_t F : {int64_t{1000}, int64_t{256}, int64_t{37}}) {
    const int64_t R = 5, T = 3, K = 4;
    std::vector<float> ab(static_cast<size_t>(R * 2 * F));
    for (float& v : ab) v = normal(rng);
    for (int64_t i = 0; i < 2 * F; ++i) ab[2 * 2 * F + i] = 0.0f;  // row 2: zeros
    ab[1] = 9.5f, ab[F + 1] = -8.0f;                               // row 0: past the limit
    std::vector<float> weights(T * K);
    for (float& v : weights) v = std::abs(normal(rng));
    const std::vector<int32_t> slots = {3, 0, 11, 7, 5};
    float *d_ab = nullptr, *d_w = nullptr, *ref = nullptr, *got = nullptr, *h1 = nullptr, *h3 = nullptr;
    int32_t* d_slots = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_ab), ab.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_w), weights.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_slots), slots.size() * sizeof(int32_t)), cudaSuccess);
    for (float** p : {&ref, &got, &h1, &h3})
      ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(p), R * F * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_ab, ab.data(), ab.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_w, weights.data(), weights.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_slots, slots.data(), slots.size() * sizeof(int32_t), cudaMemcpyHostToDevice), cudaSuccess);
    for (const bool stacked : {true, false}) {
      for (const bool routed : {false, true}) {
        const float* w = routed ? d_w : nullptr;
        const double scale = routed ? 1.5 : 1.0;
        // The three passes into ref.
        if (stacked) {
          cuda::launch_swiglu(
              {.a = d_ab, .b = d_ab + F, .n = R * F, .limit = limit, .out = ref, .cols = F, .stride = 2 * F});
        } else {
          for (int64_t r = 0; r < R; ++r) {
            ASSERT_EQ(cudaMemcpy(ref + r * F, d_ab + r * 2 * F, F * sizeof(float), cudaMemcpyDeviceToDevice), cudaSuccess);
            ASSERT_EQ(cudaMemcpy(h3 + r * F, d_ab + r * 2 * F + F, F * sizeof(float), cudaMemcpyDeviceToDevice),
                      cudaSuccess);
          }
          ASSERT_EQ(cudaMemcpy(h1, ref, R * F * sizeof(float), cudaMemcpyDeviceToDevice), cudaSuccess);
          cuda::launch_swiglu({.a = ref, .b = h3, .n = R * F, .limit = limit});
        }
        cuda::launch_route_scale_bf16({.h = ref, .slots = d_slots, .weights = w, .R = R, .F = F, .scale = scale});
        cuda::launch_row_sim({.x = ref, .rows = nullptr, .n = R, .row_stride = F, .dims = F,
                              .kind = cuda::RowSimKind::kFp8Pow2, .block = 128});
        // One pass into got (in place over h1 when not stacked).
        float* out = stacked ? got : h1;
        cuda::launch_swiglu_sim_fp8({.out = out, .a = stacked ? d_ab : h1, .b = stacked ? d_ab + F : h3, .R = R, .F = F,
                                     .stride = stacked ? 2 * F : F, .limit = limit, .slots = d_slots, .weights = w,
                                     .scale = scale, .block = 128});
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        std::vector<float> want(R * F), have(R * F);
        ASSERT_EQ(cudaMemcpy(want.data(), ref, want.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(have.data(), out, have.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
        int64_t clamped = 0;
        for (int64_t i = 0; i < R * F; ++i) {
          uint32_t bw, bh;
          std::memcpy(&bw, &want[i], 4);
          std::memcpy(&bh, &have[i], 4);
          ASSERT_EQ(bh, bw) << "F=" << F << (stacked ? " stacked" : " in place") << (routed ? " routed" : "")
                            << ": value " << i << " " << have[i] << " vs " << want[i];
        }
        for (int64_t r = 0; r < R; ++r)
          for (int64_t i = 0; i < F; ++i) clamped += ab[r * 2 * F + i] > limit;
        EXPECT_GT(clamped, 0) << "no gate value past the limit";
      }
    }
    for (float* p : {d_ab, d_w, ref, got, h1, h3}) cudaFree(p);
    cudaFree(d_slots);
  }
}

// The KV record's device codec (launch_kv_record_encode / decode) gives the host codec's bytes and
// values (core/kv_record.h), bit for bit: V4-Flash's layout (7 blocks, a padding byte) and one of 2
// blocks (none), strided rows, entries with per-block magnitudes 2^-40..2^40, an all-zero block, a
// NaN and -0 in both parts, the e4m3 maximum, values past it.
TEST(CudaKvRecord, DeviceCodecIsTheHostCodec) {
  std::unique_ptr<Backend> gpu;
  SPARROW_REQUIRE_CUDA(gpu);
  std::mt19937 rng(584);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-40, 40);
  for (const auto& [dim, rope] : {std::pair<int64_t, int64_t>{512, 64}, std::pair<int64_t, int64_t>{192, 64}}) {
    const KvRecordLayout l = kv_record_layout(dim, rope);
    const int64_t rows = 37, in_stride = dim + 5, rec_stride = l.bytes + 8;
    std::vector<float> x(static_cast<size_t>(rows * in_stride), 0.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t b = 0; b < dim / 64; ++b) {
        const float m = std::ldexp(1.0f, exponent(rng));
        for (int64_t i = 0; i < 64; ++i) x[r * in_stride + 64 * b + i] = normal(rng) * m;
      }
    for (int64_t i = 0; i < 64; ++i) x[1 * in_stride + i] = 0.0f;  // row 1: a zero block
    x[2 * in_stride + 3] = std::numeric_limits<float>::quiet_NaN();
    x[2 * in_stride + dim - 2] = std::numeric_limits<float>::quiet_NaN();
    x[3 * in_stride + 5] = -0.0f, x[3 * in_stride + dim - 1] = -0.0f;
    x[4 * in_stride + 7] = 448.0f, x[4 * in_stride + 8] = -9000.0f;
    std::vector<uint8_t> want(static_cast<size_t>(rows * rec_stride), 0xab);
    for (int64_t r = 0; r < rows; ++r) kv_record_encode(x.data() + r * in_stride, l, want.data() + r * rec_stride);
    float *d_x = nullptr, *d_out = nullptr;
    uint8_t *d_rec = nullptr, *d_want = nullptr;
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_x), x.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_out), x.size() * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_rec), want.size()), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&d_want), want.size()), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_x, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_want, want.data(), want.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(d_rec, 0xab, want.size()), cudaSuccess);
    ASSERT_EQ(cudaMemset(d_out, 0xff, x.size() * sizeof(float)), cudaSuccess);
    const cuda::KvRecordArgs args{.in = d_x, .rec = d_rec, .rec_in = d_want, .out = d_out, .rows = rows,
                                  .in_stride = in_stride, .rec_stride = rec_stride, .out_stride = in_stride,
                                  .layout = l};
    cuda::launch_kv_record_encode(args);
    cuda::launch_kv_record_decode(args);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> got(want.size());
    std::vector<float> back(x.size());
    ASSERT_EQ(cudaMemcpy(got.data(), d_rec, got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(back.data(), d_out, back.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t p = 0; p < rec_stride; ++p)  // (the bytes past a record stay as they were: 0xab)
        ASSERT_EQ(got[r * rec_stride + p], want[r * rec_stride + p])
            << "dim " << dim << ": row " << r << " byte " << p << " of the record";
      std::vector<float> host(static_cast<size_t>(dim));
      kv_record_decode(want.data() + r * rec_stride, l, host.data());
      for (int64_t i = 0; i < dim; ++i) {
        uint32_t a, b;
        std::memcpy(&a, &back[r * in_stride + i], 4);
        std::memcpy(&b, &host[i], 4);
        ASSERT_EQ(a, b) << "dim " << dim << ": row " << r << " value " << i << " decoded " << back[r * in_stride + i]
                        << ", on the host " << host[i];
      }
    }
    for (void* p : {static_cast<void*>(d_x), static_cast<void*>(d_out), static_cast<void*>(d_rec),
                    static_cast<void*>(d_want)})
      cudaFree(p);
  }
}

// The CUDA backend's integer knobs (SPARROW_CUDA_ATTN_MMA_SPLIT, SPARROW_CUDA_W4A8_SPAN,
// SPARROW_CUDA_W4A8_ROWS, SPARROW_CUDA_DECODE_SPLIT_BLOCKS, SPARROW_CUDA_GRAPH_NODES) through cuda_env_int: the fallback when unset or empty, the value
// when the rule takes it, and an error naming the variable, its value and the rule otherwise. No GPU.
TEST(CudaEnv, IntKnobsTakeValidValuesAndNameBadOnes) {
  const char* var = "SPARROW_CUDA_TEST_KNOB";
  const auto even = [](int64_t n) { return n > 0 && n % 2 == 0; };
  const char* rule = "must be a positive even number";
  ::unsetenv(var);
  EXPECT_EQ(cuda::cuda_env_int(var, 7, even, rule), 7);  // (the fallback is not checked)
  ::setenv(var, "", 1);
  EXPECT_EQ(cuda::cuda_env_int(var, 7, even, rule), 7);
  ::setenv(var, "256", 1);
  EXPECT_EQ(cuda::cuda_env_int(var, 7, even, rule), 256);
  for (const char* bad : {"3", "0", "-4", "12x", " 12", "+12", "0x10", "99999999999999999999"}) {
    ::setenv(var, bad, 1);
    try {
      const int64_t got = cuda::cuda_env_int(var, 7, even, rule);
      ADD_FAILURE() << bad << " was taken as " << got;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), std::string(var) + "=" + bad + ": " + rule);
    }
  }
  ::unsetenv(var);
}

// The launch-cost probes' counts (SPARROW_CUDA_REPEAT_*): 0 when unset, 0 to 8, anything else
// refused naming the variable.
TEST(CudaEnv, ProbeRepeatsTakeZeroToEight) {
  const char* var = "SPARROW_CUDA_TEST_PROBE";
  ::unsetenv(var);
  EXPECT_EQ(cuda::cuda_probe_repeats(var), 0);
  for (const char* good : {"0", "3", "8"}) {
    ::setenv(var, good, 1);
    EXPECT_EQ(cuda::cuda_probe_repeats(var), std::stoi(good));
  }
  for (const char* bad : {"9", "-1", "2x"}) {
    ::setenv(var, bad, 1);
    try {
      const int got = cuda::cuda_probe_repeats(var);
      ADD_FAILURE() << bad << " was taken as " << got;
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), std::string(var) + "=" + bad + ": a probe's extra launches must be 0 to 8");
    }
  }
  ::unsetenv(var);
}

TEST(CudaBackendFactory, NoGpuIsAStatusNotACrash) {
  auto be = backend_create("cuda");
  if (be.is_ok()) {
    EXPECT_STREQ((*be)->name(), "cuda");
  } else {
    EXPECT_NE(be.status().to_string().find("no usable CUDA device"), std::string::npos) << be.status().to_string();
  }
}

}  // namespace
}  // namespace sparrow
