// Hopper's warpgroup matrix multiply (wgmma, sm_90a) as the kernels use it: the fences, commit and
// wait, the shared-memory operand descriptors of the 128-byte swizzled layouts, and the accumulator
// operand lists of the instruction wrappers. (The wrappers themselves live beside their kernels.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace sparrow::cuda {

__device__ inline uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
// Dynamic shared memory from its first 1024-byte boundary (the 128-byte swizzle's period, which
// the wgmma descriptors assume).
__device__ inline uint8_t* smem_align_1024(uint8_t* raw) { return raw + ((1024 - (smem_u32(raw) & 1023u)) & 1023u); }

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ inline void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory"); }
// Keeps the compiler from moving reads or writes of an accumulator across the asynchronous wgmma.
__device__ inline void wgmma_fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
// The same for a register operand of wgmma's A (the weights' fragments, made by selects just
// before the chain): without it the compiler may place their moves between the chain's wgmma and
// ptxas then fences each later wgmma (warning C7519, the chain serialised).
__device__ inline void wgmma_fence_operand(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }
// Writes to shared memory by ordinary stores or cp.async made visible to the tensor core's (async
// proxy) reads.
__device__ inline void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// mbarriers in shared memory (CTA scope): set up, arrive (raising the expected bytes of a transaction),
// and wait for the phase of the given parity to complete.
__device__ inline void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ inline void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ inline void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ inline void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (done == 0);
}
// The executing thread's earlier cp.async copies arrive on bar when they complete (without raising
// its expected count: bar counts these arrivals).
__device__ inline void cp_async_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// `bytes` (a multiple of 16; both addresses 16-byte aligned) from global src to shared dst by the
// bulk copy engine, counted on bar as they land (the caller has raised bar's expected bytes);
// kEvictFirst marks the lines read first to leave L2 (weights read once a step).
template <bool kEvictFirst>
__device__ inline void bulk_copy_to_smem(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  if constexpr (kEvictFirst) {
    asm volatile(
        "{\n.reg .b64 pol;\ncreatepolicy.fractional.L2::evict_first.b64 pol, 1.0;\n"
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], pol;\n}\n" ::"r"(
            smem_u32(dst)),
        "l"(src), "r"(bytes), "r"(smem_u32(bar))
        : "memory");
  } else {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
  }
}

// Descriptors of operands laid out in 128-byte swizzled atoms (8 rows of 128 bytes, 1024 bytes, the
// 16-byte pieces of row r at piece index ^ (r % 8)); the atoms must start on 1024-byte boundaries.
// K-major: rows of 128 bytes along K, 8-row groups 1024 bytes apart (a k-step inside the 128 bytes
// moves the start address by its bytes).
__device__ inline uint64_t wgmma_desc_sw128(const void* smem) {
  return static_cast<uint64_t>((smem_u32(smem) & 0x3ffffu) >> 4) | (static_cast<uint64_t>(1) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}
// MN-major (the same bytes read the other way: 128 bytes along M or N a row, K the rows): 8 rows
// of K 1024 bytes apart, the next 128 bytes of M or N `atom_stride` bytes on.
__device__ inline uint64_t wgmma_desc_sw128_mn(const void* smem, uint32_t atom_stride) {
  return static_cast<uint64_t>((smem_u32(smem) & 0x3ffffu) >> 4) | (static_cast<uint64_t>(atom_stride >> 4) << 16) |
         (static_cast<uint64_t>(1024 >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// wgmma's accumulator operands, for the wrappers: the outputs d[0..15], d[0..31] or d[0..63] and
// their placeholders in the instruction ("{%0, ..., %15}" ...), written once.
#define SPARROW_WGMMA_D16 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define SPARROW_WGMMA_D32 SPARROW_WGMMA_D16, "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define SPARROW_WGMMA_D64 SPARROW_WGMMA_D32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define SPARROW_WGMMA_P16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define SPARROW_WGMMA_P32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define SPARROW_WGMMA_P64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

}  // namespace sparrow::cuda
