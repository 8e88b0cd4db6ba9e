// bench/floors: every term on a small config worked out by hand (comments show the sums), then
// on DeepSeek-V4-Flash's real dimensions against the figures of ../shared/docs/dsv4-spec.md.
// The V4-Flash config is written out here from spec §1.1/§1.2, not taken from tools/synth, so a
// wrong preset cannot pass unnoticed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "bench/floors.h"

namespace sparrow::bench {
namespace {

// D 256, H 4, Dh 64 (rope 16, nope 48), q_lora 128, o_lora 64 in 2 groups, window 8, indexer 2
// heads of 32 with top-3, 8 experts of width 64 with K = 2 and one shared, 2 streams. Layers:
// SWA (hash MoE), CSA m=4 (scored), HCA m=8 (scored).
ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab_size = 1000;
  c.hidden_size = 256;
  c.num_layers = 3;
  c.num_heads = 4;
  c.head_dim = 64;
  c.rope_dim = 16;
  c.q_lora_rank = 128;
  c.o_lora_rank = 64;
  c.o_groups = 2;
  c.sliding_window = 8;
  c.index_heads = 2;
  c.index_head_dim = 32;
  c.index_topk = 3;
  c.num_experts = 8;
  c.num_shared_experts = 1;
  c.experts_per_token = 2;
  c.moe_intermediate = 64;
  c.hc_mult = 2;
  c.attention = {AttentionKind::kSliding, AttentionKind::kCsa, AttentionKind::kHca};
  c.compress_ratio = {0, 4, 8};
  c.moe = {MoeKind::kHash, MoeKind::kScored, MoeKind::kScored};
  c.expert_dtype = "fp4";
  return c;
}

// Spec §1.1 (released config.json) and §1.2 (schedule: SWA, SWA, then CSA/HCA alternating from
// layer 2; hash routing in layers 0-2).
ModelConfig v4_flash() {
  ModelConfig c;
  c.vocab_size = 129280;
  c.hidden_size = 4096;
  c.num_layers = 43;
  c.num_heads = 64;
  c.head_dim = 512;
  c.rope_dim = 64;
  c.q_lora_rank = 1024;
  c.o_lora_rank = 1024;
  c.o_groups = 8;
  c.sliding_window = 128;
  c.index_heads = 64;
  c.index_head_dim = 128;
  c.index_topk = 512;
  c.num_experts = 256;
  c.num_shared_experts = 1;
  c.experts_per_token = 6;
  c.moe_intermediate = 2048;
  c.hc_mult = 4;
  c.expert_dtype = "fp4";
  for (int64_t l = 0; l < 43; ++l) {
    const int64_t m = l < 2 ? 0 : (l % 2 == 0 ? 4 : 128);
    c.compress_ratio.push_back(m);
    c.attention.push_back(m == 0 ? AttentionKind::kSliding : m == 4 ? AttentionKind::kCsa : AttentionKind::kHca);
    c.moe.push_back(l < 3 ? MoeKind::kHash : MoeKind::kScored);
  }
  return c;
}

TEST(BenchFloors, StoredSizesOfTheReleasedFormats) {
  // FP8: one byte per value plus one e8m0 per 128x128 tile (partial tiles count).
  EXPECT_EQ(fp8_block_weight_bytes(128, 256), 32768 + 1 * 2);
  EXPECT_EQ(fp8_block_weight_bytes(129, 1), 129 + 2 * 1);
  EXPECT_EQ(fp8_block_weight_bytes(1024, 4096), 4194304 + 8 * 32);  // wq_a, scale [8, 32] (spec §2.1)
  // MXFP4: half a byte per value plus one e8m0 per 1x32 block.
  EXPECT_EQ(mxfp4_weight_bytes(64, 256), 64 * 128 + 64 * 8);
  EXPECT_EQ(mxfp4_weight_bytes(2048, 4096), 2048 * 2048 + 2048 * 128);  // w1: I8 [2048, 2048] + scale [2048, 128]
  EXPECT_EQ(mxfp4_weight_bytes(4096, 2048), 4096 * 1024 + 4096 * 64);   // w2
  // KV record: nope e4m3 + a scale per 64, padded to 8 bytes, + rope bf16.
  EXPECT_EQ(kv_record_bytes(tiny_config()), 56 + 32);  // 48 + 1 -> 56; 16 x 2
  EXPECT_EQ(kv_record_bytes(v4_flash()), 584);          // 448 + 7 + 1 pad + 128 (spec §5.1)
  EXPECT_EQ(index_key_bytes(v4_flash(), IndexKeyFormat::kFp8), 132);  // 128 + fp32 scale (vLLM)
  EXPECT_EQ(index_key_bytes(v4_flash(), IndexKeyFormat::kFp4), 68);   // 64 + 4 e8m0 (spec §5.1)
  EXPECT_EQ(index_key_bytes(v4_flash(), IndexKeyFormat::kBf16), 256);
  EXPECT_EQ(index_key_bytes(tiny_config(), IndexKeyFormat::kFp4), 16 + 1);
}

TEST(BenchFloors, ExpectedDistinctExperts) {
  EXPECT_DOUBLE_EQ(expected_distinct_experts(8, 2, 1), 2.0);   // one token: its K experts
  EXPECT_DOUBLE_EQ(expected_distinct_experts(8, 2, 2), 3.5);   // 2 + 2 * (6/8): the second token's new ones
  EXPECT_DOUBLE_EQ(expected_distinct_experts(8, 8, 5), 8.0);   // K = E: all of them
  EXPECT_DOUBLE_EQ(expected_distinct_experts(8, 2, 0), 0.0);
  EXPECT_NEAR(expected_distinct_experts(256, 6, 8), 44.2418, 1e-4);
  EXPECT_NEAR(expected_distinct_experts(256, 6, 256), 255.4092, 1e-4);  // 256 (1 - (250/256)^256)
  EXPECT_LT(expected_distinct_experts(256, 6, 256), 256.0);
}

TEST(BenchFloors, TinyDecodeOnCsaLayerTermByTerm) {
  const ModelConfig c = tiny_config();
  const StepFloor f = decode_floor(c, /*layer=*/1, /*batch=*/2, /*context=*/20, floor_options_for(c));
  // Attention: wq_a [128,256] 32768+2, wq_b [256,128] 32768+2, wkv [64,256] 16384+2,
  // wo_a [128,128] 16384+1, wo_b [256,128] 32768+2 = 131081; q_norm 256 + kv_norm 128 + sink 16.
  EXPECT_DOUBLE_EQ(f.bytes.attn_weights, 131081 + 256 + 128 + 16);
  // CSA extras: compressor wkv/wgate [128,256] bf16 = 131072; ape rows 4 (1 - (3/4)^2) = 1.75 of
  // 128 fp32 = 896; norm 128; indexer wq_b [64,128] fp8 8192+1; weights_proj [2,256] bf16 1024;
  // indexer compressor [64,256] x2 bf16 = 65536; its ape 1.75 x 64 x 4 = 448; its norm 64.
  EXPECT_DOUBLE_EQ(f.bytes.extra_weights, 131072 + 896 + 128 + 8193 + 1024 + 65536 + 448 + 64);
  EXPECT_DOUBLE_EQ(f.bytes.router_weights, 8 * 256 * 2 + 8 * 4);  // gate bf16 + bias fp32
  EXPECT_DOUBLE_EQ(f.experts_touched, 3.5);
  // Expert: w1, w3 [64,256] and w2 [256,64] MXFP4: 3 x (8192 + 512).
  EXPECT_DOUBLE_EQ(f.bytes.routed_experts, 3.5 * 26112);
  EXPECT_DOUBLE_EQ(f.bytes.shared_expert, 3 * 16386);  // FP8: 16384 + 2 tiles each
  // attn_norm + ffn_norm bf16 1024; mHC fn [8, 512] fp32 16384 + base 32 + scale 12, twice.
  EXPECT_DOUBLE_EQ(f.bytes.norms_mhc, 1024 + 2 * (16384 + 32 + 12));
  // Token at position 20: window min(8, 21) = 8; visible 21/4 = 5; selected min(3, 5) = 3.
  EXPECT_DOUBLE_EQ(f.bytes.kv_window, 2 * 8 * 88);
  EXPECT_DOUBLE_EQ(f.bytes.kv_compressed, 2 * 3 * 88);
  EXPECT_DOUBLE_EQ(f.bytes.index_keys, 2 * 5 * 36);  // fp8 keys: 32 + 4
  // Per token: a record, compressor kv+gate rows 2 x 128 bf16, indexer's 2 x 64 bf16.
  EXPECT_DOUBLE_EQ(f.bytes.state_writes, 2 * (88 + 512 + 256));
  EXPECT_DOUBLE_EQ(f.bytes.activations, 2 * 2 * (2 * 256) * 2);  // streams in + out, bf16
  EXPECT_EQ(f.attended_keys, 2 * 11);
  EXPECT_EQ(f.scored_entries, 2 * 5);
  // FLOPs per token, FP8 weights: 2 (32768 + 32768 + 16384 + 16384 + 32768) = 262144; experts and
  // shared 3 x 3 x 2 x 64 x 256 = 294912; indexer wq_b 2 x 64 x 128 = 16384.
  EXPECT_DOUBLE_EQ(f.flops.gemm_fp8, 2 * (262144 + 294912 + 16384));
  // bf16/fp32 weights: router 2x8x256 = 4096; mHC 2 x 2x8x512 = 16384; compressor 2 x 2x128x256 =
  // 131072; weights_proj 2x2x256 = 1024; indexer compressor 2 x 2x64x256 = 65536.
  EXPECT_DOUBLE_EQ(f.flops.gemm_bf16, 2 * (4096 + 16384 + 131072 + 1024 + 65536));
  EXPECT_DOUBLE_EQ(f.flops.attention, 2 * 4 * 4 * 64 * 11);  // 4 H Dh per key, 8 + 3 keys
  EXPECT_DOUBLE_EQ(f.flops.indexer, 2 * (2 * 2 * 32 + 2 * 2) * 5);
}

TEST(BenchFloors, TinyDecodeOnSlidingHashLayerAndShortContext) {
  const ModelConfig c = tiny_config();
  const StepFloor f = decode_floor(c, /*layer=*/0, /*batch=*/3, /*context=*/5, floor_options_for(c));
  EXPECT_DOUBLE_EQ(f.bytes.extra_weights, 0.0);
  EXPECT_DOUBLE_EQ(f.bytes.router_weights, 8 * 256 * 2 + 3 * 2 * 8);  // gate + 3 tid2eid rows of 2 int64
  EXPECT_DOUBLE_EQ(f.bytes.kv_window, 3 * 6 * 88);                    // positions 0..5: 6 < W
  EXPECT_DOUBLE_EQ(f.bytes.kv_compressed + f.bytes.index_keys + f.flops.indexer, 0.0);
  EXPECT_DOUBLE_EQ(f.bytes.state_writes, 3 * 88.0);
  EXPECT_DOUBLE_EQ(f.flops.attention, 3 * 4 * 4 * 64 * 6);
  EXPECT_DOUBLE_EQ(f.flops.gemm_bf16, 3 * (4096 + 16384));
}

TEST(BenchFloors, TinyDecodeOnHcaLayerReadsEveryVisibleEntry) {
  const ModelConfig c = tiny_config();
  const StepFloor f = decode_floor(c, /*layer=*/2, /*batch=*/1, /*context=*/70, floor_options_for(c));
  // 71 / 8 = 8 entries, all read; no indexer; compressor [64,256] x2 bf16 + 1 ape row (64 fp32) + norm.
  EXPECT_DOUBLE_EQ(f.bytes.kv_compressed, 8 * 88);
  EXPECT_DOUBLE_EQ(f.bytes.index_keys, 0.0);
  EXPECT_DOUBLE_EQ(f.bytes.extra_weights, 65536 + 256 + 128);
  EXPECT_DOUBLE_EQ(f.bytes.state_writes, 88 + 2 * 64 * 2);
  EXPECT_DOUBLE_EQ(f.flops.attention, 4 * 4 * 64 * (8 + 8));
  EXPECT_DOUBLE_EQ(f.experts_touched, 2.0);
}

TEST(BenchFloors, TinyPrefillSumsEveryPosition) {
  const ModelConfig c = tiny_config();
  // HCA m=8, 20 tokens. Window keys: 1+2+...+7 = 28 for t < 7, then 13 x 8 = 104: 132.
  // Entries visible: floor((t+1)/8) = 0 for 7 tokens, 1 for 8, 2 for 5: 18.
  const StepFloor h = prefill_floor(c, 2, 20, floor_options_for(c));
  EXPECT_EQ(h.attended_keys, 132 + 18);
  EXPECT_DOUBLE_EQ(h.flops.attention, 4 * 4 * 64 * 150.0);
  EXPECT_DOUBLE_EQ(h.flops.indexer, 0.0);
  EXPECT_DOUBLE_EQ(h.bytes.kv_compressed, 2 * 88);  // 20/8 entries written
  EXPECT_DOUBLE_EQ(h.bytes.state_writes, 8 * 88);   // the window ring left behind
  EXPECT_DOUBLE_EQ(h.bytes.activations, 20 * 2 * 512 * 2);
  EXPECT_DOUBLE_EQ(h.bytes.kv_window, 0.0);
  EXPECT_DOUBLE_EQ(h.bytes.extra_weights, 65536 + 8 * 64 * 4 + 128);  // every ape row
  EXPECT_NEAR(h.experts_touched, 8 * (1 - std::pow(0.75, 20)), 1e-12);
  EXPECT_DOUBLE_EQ(h.flops.gemm_fp8, 20.0 * (262144 + 294912));
  EXPECT_DOUBLE_EQ(h.flops.gemm_bf16, 20.0 * (4096 + 16384 + 65536));
  // CSA m=4, 20 tokens. Scored floor((t+1)/4): 0 x3, 1 x4, 2 x4, 3 x4, 4 x4, 5 x1 = 45; selected
  // min(3, .): 0 + 4 + 8 + 12 + 12 + 3 = 39.
  const StepFloor s = prefill_floor(c, 1, 20, floor_options_for(c));
  EXPECT_EQ(s.scored_entries, 45);
  EXPECT_EQ(s.attended_keys, 132 + 39);
  EXPECT_DOUBLE_EQ(s.bytes.index_keys, 5 * 36);  // 20/4 keys written
  EXPECT_DOUBLE_EQ(s.flops.indexer, 45 * (2 * 2 * 32 + 2 * 2.0));
}

TEST(BenchFloors, FloorTimeTakesTheLargerTermWithPerClassPeaks) {
  StepFloor f;
  f.bytes.attn_weights = 4e9;  // 4 ms at 1 TB/s
  f.flops.gemm_fp8 = 2e12;     // 1 ms at 2 PFLOP/s
  f.flops.indexer = 2e12;      // 1 ms at the fp8 peak too
  f.flops.attention = 1e12;    // 1 ms at 1 PFLOP/s bf16
  const Peaks p{.hbm_bytes_per_s = 1e12, .bf16_flops_per_s = 1e15, .fp8_flops_per_s = 2e15};
  FloorTime t = floor_time(f, p);
  EXPECT_DOUBLE_EQ(t.memory_s, 4e-3);
  EXPECT_DOUBLE_EQ(t.compute_s, 3e-3);
  EXPECT_DOUBLE_EQ(t.floor_s, 4e-3);
  EXPECT_TRUE(t.memory_bound);
  f.flops.gemm_bf16 = 2e12;  // +2 ms
  t = floor_time(f, p);
  EXPECT_DOUBLE_EQ(t.floor_s, 5e-3);
  EXPECT_FALSE(t.memory_bound);
}

TEST(BenchFloors, FlashExpertsInFp8WhenTheConfigSaysSo) {
  ModelConfig c = v4_flash();
  c.expert_dtype = "fp8";  // V4-Flash-Base (spec §1.1 variants)
  const FloorOptions o = floor_options_for(c);
  EXPECT_EQ(o.experts, ExpertFormat::kFp8Block);
  const StepFloor f = decode_floor(c, 4, 1, 4096, o);
  EXPECT_DOUBLE_EQ(f.bytes.routed_experts, 6.0 * 25167360);  // like the shared expert's FP8 tiles
}

// ---- V4-Flash against the spec's own figures ------------------------------------------------------

TEST(BenchFloors, FlashWeightsPerLayerMatchSpecSection8) {
  const ModelConfig c = v4_flash();
  const FloorOptions o = floor_options_for(c);
  const StepFloor csa = decode_floor(c, 4, 1, 4096, o);
  // Spec §8: "attention FP8 (incl. 128x128 scales) 107.0 MB/layer": 106,961,280 bytes of FP8 and
  // scales (wq_a 4194304+256, wq_b 33554432+2048, wkv 2097152+128, wo_a 33554432+2048, wo_b
  // 33554432+2048), plus q_norm 2048, kv_norm 1024 and attn_sink 256.
  EXPECT_DOUBLE_EQ(csa.bytes.attn_weights, 106961280 + 2048 + 1024 + 256);
  // "routed experts FP4 (0.53125 B/param incl. 1x32 scales) 6 x 13.37 MB": 13,369,344 per expert.
  EXPECT_DOUBLE_EQ(csa.bytes.routed_experts, 6.0 * 13369344);
  // "shared expert FP8 25.17 MB": 3 x (8388608 + 16 x 32) = 25,167,360.
  EXPECT_DOUBLE_EQ(csa.bytes.shared_expert, 25167360);
  // "CSA extras (bf16 compressors, FP8 indexer wq_b, bf16 weights_proj) = 30 MB": 29,886,208 plus
  // one ape row of each compressor (1024 + 256 fp32).
  EXPECT_DOUBLE_EQ(csa.bytes.extra_weights, 29886208 + 1024 * 4 + 256 * 4);
  // "HCA extras = 8.4 MB": 2 x 512 x 4096 bf16 + norm 1024 = 8,389,632, plus one ape row.
  const StepFloor hca = decode_floor(c, 3, 1, 4096, o);
  EXPECT_DOUBLE_EQ(hca.bytes.extra_weights, 8389632 + 512 * 4);
  // "mHC fn (fp32) + router (bf16) = 5.2 MB": fn 2 x 24 x 16384 x 4 = 3.15 MB, gate 2.10 MB.
  EXPECT_NEAR((csa.bytes.norms_mhc + csa.bytes.router_weights) / 1e6, 5.2, 0.1);
}

TEST(BenchFloors, FlashWholeModelPerTokenMatchesSpecSection8) {
  const ModelConfig c = v4_flash();
  const FloorOptions o = floor_options_for(c);
  for (const int64_t T : {4096, 131072}) {
    double kv = 0, attention = 0, indexer = 0, dense = 0, attn_w = 0, experts_w = 0;
    for (int64_t l = 0; l < c.num_layers; ++l) {
      const StepFloor f = decode_floor(c, l, 1, T, o);
      kv += f.bytes.kv_window + f.bytes.kv_compressed + f.bytes.index_keys;
      attention += f.flops.attention;
      indexer += f.flops.indexer;
      dense += f.flops.gemm_fp8 + f.flops.gemm_bf16;
      attn_w += f.bytes.attn_weights;
      experts_w += f.bytes.routed_experts;
    }
    // Spec §8: active parameters 13.27 B per token including the head (129280 x 4096 = 0.53 B),
    // so the 43 layers hold 12.74 B: 2 FLOPs each. Exactly: 25,477,251,072.
    EXPECT_DOUBLE_EQ(dense, 25477251072.0);
    EXPECT_NEAR(attn_w / 1e9, 4.60, 0.005);      // "107.0 MB x 43 = 4.60 GB"
    EXPECT_NEAR(experts_w / 1e9, 3.45, 0.005);   // "6 x 13.37 MB x 43 = 3.45 GB"
    if (T == 4096) {
      // "4 K: attention+indexer 2.6 GFLOP, of which indexer 0.36; KV read (FP8 layout) 12.7 MB":
      // window 43 x 128 x 584 + CSA 21 x 512 x 584 + HCA 20 x 32 x 584 + keys 21 x 1024 x 132.
      EXPECT_DOUBLE_EQ(kv, 12705792.0);
      EXPECT_DOUBLE_EQ(indexer, 355074048.0);       // 21 x 1024 x (2x64x128 + 2x64)
      EXPECT_DOUBLE_EQ(attention + indexer, 2569666560.0);
    } else {
      // "128 K: 16.2 GFLOP, of which indexer 11.4; KV read 112 MB".
      EXPECT_DOUBLE_EQ(kv, 112286720.0);
      EXPECT_DOUBLE_EQ(indexer, 11362369536.0);     // 21 x 32768 x 16512
      EXPECT_DOUBLE_EQ(attention + indexer, 16177430528.0);
    }
  }
}

// The whole model's decode step: the layers' batch-1 floors summed, each the larger of its own
// terms (so not the larger of the summed terms), plus the head's bytes.
TEST(BenchFloors, ModelStepSumsTheLayersFloorsAndTheHead) {
  const ModelConfig c = tiny_config();
  const FloorOptions o = floor_options_for(c);
  // Peaks that make the CSA layer compute-bound at 64 (its compressors' bf16 FLOPs) and the other
  // two memory-bound.
  const Peaks p{.hbm_bytes_per_s = 1e12, .bf16_flops_per_s = 5e11, .fp8_flops_per_s = 1e13};
  EXPECT_FALSE(floor_time(decode_floor(c, 1, 1, 64, o), p).memory_bound);
  EXPECT_TRUE(floor_time(decode_floor(c, 0, 1, 64, o), p).memory_bound);
  double sum = 0, mem = 0, comp = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const FloorTime t = floor_time(decode_floor(c, l, 1, 64, o), p);
    sum += t.floor_s;
    mem += t.memory_s;
    comp += t.compute_s;
  }
  const ModelStepFloor f = model_step_floor(c, 64, 512000.0, o, p);
  EXPECT_DOUBLE_EQ(f.layers_s, sum);
  EXPECT_DOUBLE_EQ(f.head_s, 512000.0 / 1e12);
  EXPECT_DOUBLE_EQ(f.total_s(), sum + 512000.0 / 1e12);
  EXPECT_GT(f.layers_s, std::max(mem, comp) * (1 + 1e-12)) << "the layers' floors must be summed one by one";
}

TEST(BenchFloors, FlashBatchScalesKvButSharesWeights) {
  const ModelConfig c = v4_flash();
  const FloorOptions o = floor_options_for(c);
  const StepFloor one = decode_floor(c, 4, 1, 32768, o);
  const StepFloor many = decode_floor(c, 4, 256, 32768, o);
  EXPECT_DOUBLE_EQ(many.bytes.attn_weights, one.bytes.attn_weights);
  EXPECT_DOUBLE_EQ(many.bytes.shared_expert, one.bytes.shared_expert);
  EXPECT_DOUBLE_EQ(many.bytes.kv_window + many.bytes.kv_compressed + many.bytes.index_keys,
                   256 * (one.bytes.kv_window + one.bytes.kv_compressed + one.bytes.index_keys));
  EXPECT_NEAR(many.bytes.routed_experts / 13369344.0, 255.4092, 1e-4);
  EXPECT_DOUBLE_EQ(many.flops.gemm_fp8, 256 * one.flops.gemm_fp8);
  // Batch 1 at 4K on a CSA layer is memory bound on an H200-like device (4.8 TB/s, 989/1979 TFLOP/s):
  // about 0.24 GB of weights and KV against 0.6 GFLOP.
  const Peaks h200{.hbm_bytes_per_s = 4.8e12, .bf16_flops_per_s = 989e12, .fp8_flops_per_s = 1979e12};
  EXPECT_TRUE(floor_time(decode_floor(c, 4, 1, 4096, o), h200).memory_bound);
  // Prefill of 8K tokens is compute bound: 8192 x 0.6 GFLOP of GEMMs against the same weights.
  EXPECT_FALSE(floor_time(prefill_floor(c, 4, 8192, o), h200).memory_bound);
}

// The model-step cell's per-segment medians: steps start at segment 0, only the last ones count,
// and the node counts are the last step's.
TEST(SummariseSegments, MediansOverTheLastSteps) {
  std::vector<SegmentSample> s;
  const double ms[3][3] = {{1.0, 2.0, 3.0}, {1.5, 2.5, 3.5}, {0.5, 4.0, 3.0}};
  for (int step = 0; step < 3; ++step)
    for (int seg = 0; seg < 3; ++seg)
      s.push_back({.segment = seg, .ms = ms[step][seg], .nodes = 10 * step + seg, .kernels = seg, .driver_kernels = step});
  const std::vector<SegmentSummary> two = summarise_segments(s, 2);
  ASSERT_EQ(two.size(), 3u);
  EXPECT_EQ(two[0].segment, 0);
  EXPECT_DOUBLE_EQ(two[0].median_ms, 1.5);  // {0.5, 1.5}: the upper median
  EXPECT_DOUBLE_EQ(two[1].median_ms, 4.0);  // {2.5, 4.0}
  EXPECT_DOUBLE_EQ(two[2].median_ms, 3.5);  // {3.0, 3.5}
  EXPECT_EQ(two[2].nodes, 22);
  EXPECT_EQ(two[2].driver_kernels, 2);
  const std::vector<SegmentSummary> all = summarise_segments(s, 10);
  EXPECT_DOUBLE_EQ(all[0].median_ms, 1.0);  // {0.5, 1.0, 1.5}
  EXPECT_DOUBLE_EQ(all[1].median_ms, 2.5);
  EXPECT_TRUE(summarise_segments({}, 4).empty());
}

TEST(BenchFloors, ShortKernelNames) {
  EXPECT_EQ(short_kernel_name("_ZN7sparrow4cuda50_GLOBAL__N__bfd6f308_17_kernels_linear_cu_6340f12b25grouped_w4a8_wgmma_"
                              "kernelILi8ELi1ELi4ELb1EEEvNS0_15GroupedW4A8ArgsE"),
            "grouped_w4a8_wgmma_kernel<8,1,4,1>");
  EXPECT_EQ(short_kernel_name("_ZN7sparrow4cuda49_GLOBAL__N__2b895537_16_kernels_basic_cu_563fd95d15rms_norm_kernelILi16EEEv"
                              "NS0_11RmsNormArgsE"),
            "rms_norm_kernel<16>");
  EXPECT_EQ(short_kernel_name("_ZN7sparrow4cuda47_GLOBAL__N__00ab6da7_14_kernels_moe_cu_5db84cc513router_kernelENS0_10RouterArgsE"),
            "router_kernel");
  EXPECT_EQ(short_kernel_name("(driver kernel)"), "(driver kernel)");
  EXPECT_EQ(short_kernel_name("_Z3fooILin2EEvv"), "_Z3fooILin2EEvv");  // no "...kernel" identifier: as it is
}

// Timestamps in ns: the chain is the next kernel's past-wait minus this one's, medians over a
// segment's complete launches with the same kernel list; others are counted as skipped.
TEST(BenchFloors, KernelTraceSummary) {
  using R = TracedLaunch::Record;
  const std::vector<std::string> k3 = {"_Z8a_kernelv", "_Z8b_kernelv", "_Z8c_kernelv"};
  std::vector<TracedLaunch> l;
  // Segment 0, launch 1: a past its wait at 1000, b at 3000, c at 4000.
  l.push_back({.segment = 0, .kernels = k3,
               .records = {R{900, 1000, 1500, 4}, R{1200, 3000, 3100, 8}, R{2800, 4000, 4000, 1}}, .complete = true});
  // Launch 2: a 10000, b 14000, c 15000; b sat 500 at its wait.
  l.push_back({.segment = 0, .kernels = k3,
               .records = {R{9000, 10000, 10200, 4}, R{13500, 14000, 14300, 8}, R{14900, 15000, 15000, 1}},
               .complete = true});
  // Launch 3: b past its wait 6000 after a, c 1000 after b.
  l.push_back({.segment = 0, .kernels = k3,
               .records = {R{19000, 20000, 20100, 4}, R{25000, 26000, 26000, 8}, R{26500, 27000, 27000, 1}},
               .complete = true});
  // Incomplete, and another kernel list: skipped.
  l.push_back({.segment = 0, .kernels = k3, .records = {R{1, 2, 3, 1}}, .complete = false});
  l.push_back({.segment = 0, .kernels = {"_Z8a_kernelv"}, .records = {R{1, 2, 3, 1}}, .complete = true});
  l.push_back({.segment = 2, .kernels = {"_Z8z_kernelv"}, .records = {R{5, 5, 5, 1}}, .complete = false});
  const std::vector<TracedSegment> t = summarise_kernel_trace(l);
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].segment, 0);
  EXPECT_EQ(t[0].launches, 3);
  EXPECT_EQ(t[0].skipped, 2);
  ASSERT_EQ(t[0].kernels.size(), 3u);
  EXPECT_EQ(t[0].kernels[0].name, "a_kernel");
  EXPECT_DOUBLE_EQ(t[0].kernels[0].chain_us, 4.0);   // {2, 4, 6}
  EXPECT_DOUBLE_EQ(t[0].kernels[1].chain_us, 1.0);   // {1, 1, 1}
  EXPECT_DOUBLE_EQ(t[0].kernels[2].chain_us, -1.0);  // the last: no next kernel
  EXPECT_DOUBLE_EQ(t[0].kernels[0].resident_us, 1.0);
  EXPECT_DOUBLE_EQ(t[0].kernels[1].resident_us, 1.0);  // {1.8, 0.5, 1.0}
  EXPECT_DOUBLE_EQ(t[0].kernels[0].spread_us, 0.2);    // {0.5, 0.2, 0.1}
  EXPECT_EQ(t[0].kernels[1].blocks, 8);
  EXPECT_DOUBLE_EQ(t[0].span_us, 5.0);  // {3, 5, 7}
  ASSERT_EQ(t[0].by_name.size(), 2u);  // c has no chain time
  EXPECT_EQ(t[0].by_name[0].name, "a_kernel");
  EXPECT_DOUBLE_EQ(t[0].by_name[0].chain_us, 4.0);
  EXPECT_EQ(t[0].by_name[1].name, "b_kernel");
  EXPECT_EQ(t[0].by_name[1].count, 1);
  EXPECT_EQ(t[1].segment, 2);
  EXPECT_EQ(t[1].launches, 0);
  EXPECT_EQ(t[1].skipped, 1);
  EXPECT_TRUE(summarise_kernel_trace({}).empty());
}

}  // namespace
}  // namespace sparrow::bench
