// backends/cuda/wgmma_ptx.cuh — Hopper (sm_90a) warpgroup MMA: smem matrix descriptors for the
// 128-byte-swizzled K-major layout and wgmma.mma_async with f32 accumulators: m64n128k16 and
// m64n256k16 on bf16 / f16, m64n128k32 on FP8 e4m3, m64n{16,32,64,128}k16 f16 with A from
// registers (and the e4m3 -> f16 register conversion that feeds them); the fences around them.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace moex::cuda::wgmma {

// Descriptor of a K-major operand tile stored as rows of 64 16-bit elements (128 bytes) with the
// 128B swizzle (16-byte chunk index XOR row % 8); 8-row groups are 1024 bytes apart. The tile
// base must be 1024-byte aligned; advancing along K by 16 elements adds 32 bytes to the start.
__device__ __forceinline__ uint64_t desc_sw128(uint32_t smem_addr) {
  uint64_t d = 0;
  d |= uint64_t((smem_addr & 0x3FFFF) >> 4);
  d |= uint64_t(1) << 16;            // leading byte offset (unused with the 128B swizzle)
  d |= uint64_t(1024 >> 4) << 32;    // stride byte offset: 8 rows x 128 B
  d |= uint64_t(1) << 62;            // layout: SWIZZLE_128B
  return d;
}

__device__ __forceinline__ void fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// ---- operand lists -----------------------------------------------------------------------------
// An m64nN wgmma holds N/2 f32 accumulators per thread: fragments d[N/8][4] (the mma.sync m16n8
// layout repeated along N). The asm operand lists name every one ("+f": read and written in place).
#define MOEX_WGMMA_ACC4(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
// fragments d[b .. b+15], then the m64n128 (16 fragments) and m64n256 (32) lists
#define MOEX_WGMMA_ACC16_AT(d, b) \
  MOEX_WGMMA_ACC4(d, (b) + 0), \
  MOEX_WGMMA_ACC4(d, (b) + 1), \
  MOEX_WGMMA_ACC4(d, (b) + 2), \
  MOEX_WGMMA_ACC4(d, (b) + 3), \
  MOEX_WGMMA_ACC4(d, (b) + 4), \
  MOEX_WGMMA_ACC4(d, (b) + 5), \
  MOEX_WGMMA_ACC4(d, (b) + 6), \
  MOEX_WGMMA_ACC4(d, (b) + 7), \
  MOEX_WGMMA_ACC4(d, (b) + 8), \
  MOEX_WGMMA_ACC4(d, (b) + 9), \
  MOEX_WGMMA_ACC4(d, (b) + 10), \
  MOEX_WGMMA_ACC4(d, (b) + 11), \
  MOEX_WGMMA_ACC4(d, (b) + 12), \
  MOEX_WGMMA_ACC4(d, (b) + 13), \
  MOEX_WGMMA_ACC4(d, (b) + 14), \
  MOEX_WGMMA_ACC4(d, (b) + 15)
#define MOEX_WGMMA_ACC16(d) MOEX_WGMMA_ACC16_AT(d, 0)
#define MOEX_WGMMA_ACC32(d) MOEX_WGMMA_ACC16_AT(d, 0), MOEX_WGMMA_ACC16_AT(d, 16)
#define MOEX_WGMMA_REGS64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define MOEX_WGMMA_REGS128 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
// One wgmma.mma_async with D in %0..%(R-1), the A / B descriptors in %R / %R+1 and scale-d (0: D = A·B,
// 1: D += A·B) in %R+2 as a predicate; SHAPE_TYPES e.g. "m64n128k16.f32.bf16.bf16"; TAIL the scale and
// transpose immediates (bf16 / f16: "1, 1, 0, 0"; e4m3 has no transpose operands: "1, 1").
#define MOEX_WGMMA_ASM(SHAPE_TYPES, REGS, A, B, PRED, TAIL)                                             \
  "{\n.reg .pred p;\nsetp.ne.b32 p, " PRED ", 0;\nwgmma.mma_async.sync.aligned." SHAPE_TYPES " " REGS ", " A \
  ", " B ", p, " TAIL ";\n}\n"

// Keeps the compiler from moving accumulator accesses across wgmma issue / wait: an empty asm that
// reads and writes every accumulator, one statement per fragment in order (a loop over the
// fragments compiled the 256-wide kernels to different SASS).
#define MOEX_WGMMA_FENCE4(d, i) asm volatile("" : MOEX_WGMMA_ACC4(d, i)::"memory")
#define MOEX_WGMMA_FENCE16_AT(d, b) \
  MOEX_WGMMA_FENCE4(d, (b) + 0); \
  MOEX_WGMMA_FENCE4(d, (b) + 1); \
  MOEX_WGMMA_FENCE4(d, (b) + 2); \
  MOEX_WGMMA_FENCE4(d, (b) + 3); \
  MOEX_WGMMA_FENCE4(d, (b) + 4); \
  MOEX_WGMMA_FENCE4(d, (b) + 5); \
  MOEX_WGMMA_FENCE4(d, (b) + 6); \
  MOEX_WGMMA_FENCE4(d, (b) + 7); \
  MOEX_WGMMA_FENCE4(d, (b) + 8); \
  MOEX_WGMMA_FENCE4(d, (b) + 9); \
  MOEX_WGMMA_FENCE4(d, (b) + 10); \
  MOEX_WGMMA_FENCE4(d, (b) + 11); \
  MOEX_WGMMA_FENCE4(d, (b) + 12); \
  MOEX_WGMMA_FENCE4(d, (b) + 13); \
  MOEX_WGMMA_FENCE4(d, (b) + 14); \
  MOEX_WGMMA_FENCE4(d, (b) + 15);
__device__ __forceinline__ void fence_acc(float (&d)[16][4]) { MOEX_WGMMA_FENCE16_AT(d, 0) }
__device__ __forceinline__ void fence_acc(float (&d)[32][4]) {
  MOEX_WGMMA_FENCE16_AT(d, 0)
  MOEX_WGMMA_FENCE16_AT(d, 16)
}
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- m64n128: 64 accumulators per thread -----------------------------------------------------
__device__ __forceinline__ void wgmma_m64n128k16_bf16(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(MOEX_WGMMA_ASM("m64n128k16.f32.bf16.bf16", MOEX_WGMMA_REGS64, "%64", "%65", "%66", "1, 1, 0, 0")
               : MOEX_WGMMA_ACC16(d)
               : "l"(desc_a), "l"(desc_b), "r"(1));
}
// accumulate = 0 overwrites d (D = A·B), 1 adds (D += A·B)
__device__ __forceinline__ void wgmma_m64n128k16_f16(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b, int accumulate = 1) {
  asm volatile(MOEX_WGMMA_ASM("m64n128k16.f32.f16.f16", MOEX_WGMMA_REGS64, "%64", "%65", "%66", "1, 1, 0, 0")
               : MOEX_WGMMA_ACC16(d)
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
// FP8 (e4m3 x e4m3, f32 accumulate), m64n128k32: one K step of 32 bytes (the same 32-byte
// descriptor advance as a bf16 k16 step). FP8 wgmma reads both operands K-major only (no
// transpose). accumulate = 0 overwrites d (D = A·B), 1 adds (D += A·B).
__device__ __forceinline__ void wgmma_m64n128k32_e4m3(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(MOEX_WGMMA_ASM("m64n128k32.f32.e4m3.e4m3", MOEX_WGMMA_REGS64, "%64", "%65", "%66", "1, 1")
               : MOEX_WGMMA_ACC16(d)
               : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// ---- m64n256: 128 accumulators per thread ----------------------------------------------------
__device__ __forceinline__ void wgmma_m64n256k16_bf16(float (&d)[32][4], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(MOEX_WGMMA_ASM("m64n256k16.f32.bf16.bf16", MOEX_WGMMA_REGS128, "%128", "%129", "%130", "1, 1, 0, 0")
               : MOEX_WGMMA_ACC32(d)
               : "l"(desc_a), "l"(desc_b), "r"(1));
}
__device__ __forceinline__ void wgmma_m64n256k16_f16(float (&d)[32][4], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(MOEX_WGMMA_ASM("m64n256k16.f32.f16.f16", MOEX_WGMMA_REGS128, "%128", "%129", "%130", "1, 1, 0, 0")
               : MOEX_WGMMA_ACC32(d)
               : "l"(desc_a), "l"(desc_b), "r"(1));
}

// ---- A from registers (f16), m64nNk16 for N = 16 / 32 / 64 / 128 ----------------------------------
// The exact FP8 kernel (sm90_tma_kernel.cuh, X) converts e4m3 weight codes to f16 in registers and
// passes them as A: a[0..3] = the mma.sync m16n8k16 A fragment of this thread's warp (rows g, g+8 of
// the warp's 16, k pairs 2c, 2c+8; g = lane / 4, c = lane % 4). B from shared memory by descriptor.
// d: its first N/8 fragments are written (NFA >= N/8); accumulate 0: D = A·B, 1: D += A·B.
// The A registers must not change until the group has been waited for.
#define MOEX_WGMMA_REGS8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define MOEX_WGMMA_REGS16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define MOEX_WGMMA_REGS32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define MOEX_WGMMA_ACC2(d) MOEX_WGMMA_ACC4(d, 0), MOEX_WGMMA_ACC4(d, 1)
#define MOEX_WGMMA_ACC4F(d) MOEX_WGMMA_ACC2(d), MOEX_WGMMA_ACC4(d, 2), MOEX_WGMMA_ACC4(d, 3)
#define MOEX_WGMMA_ACC8F(d) \
  MOEX_WGMMA_ACC4F(d), MOEX_WGMMA_ACC4(d, 4), MOEX_WGMMA_ACC4(d, 5), MOEX_WGMMA_ACC4(d, 6), MOEX_WGMMA_ACC4(d, 7)
template <int N, int NFA>
__device__ __forceinline__ void mma_rega_f16(float (&d)[NFA][4], const uint32_t (&a)[4], uint64_t desc_b, int accumulate) {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128, "m64n16 / 32 / 64 / 128");
  static_assert(N / 8 <= NFA, "the accumulator set holds fewer fragments than the wgmma writes");
  if constexpr (N == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\nwgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 " MOEX_WGMMA_REGS8
        ", {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
        : MOEX_WGMMA_ACC2(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  } else if constexpr (N == 32) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\nwgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 " MOEX_WGMMA_REGS16
        ", {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
        : MOEX_WGMMA_ACC4F(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  } else if constexpr (N == 64) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " MOEX_WGMMA_REGS32
        ", {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : MOEX_WGMMA_ACC8F(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " MOEX_WGMMA_REGS64
        ", {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
        : MOEX_WGMMA_ACC16(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
  }
}
// fence_acc over the first NF fragments only (the ones an m64n(8·NF) wgmma writes).
template <int NF, int NFA>
__device__ __forceinline__ void fence_acc_first(float (&d)[NFA][4]) {
  static_assert(NF <= NFA && (NF == 2 || NF == 4 || NF == 8 || NF == 16), "2, 4, 8 or 16 fragments");
  MOEX_WGMMA_FENCE4(d, 0);
  MOEX_WGMMA_FENCE4(d, 1);
  if constexpr (NF > 2) {
    MOEX_WGMMA_FENCE4(d, 2);
    MOEX_WGMMA_FENCE4(d, 3);
  }
  if constexpr (NF > 4) {
    MOEX_WGMMA_FENCE4(d, 4);
    MOEX_WGMMA_FENCE4(d, 5);
    MOEX_WGMMA_FENCE4(d, 6);
    MOEX_WGMMA_FENCE4(d, 7);
  }
  if constexpr (NF > 8) {
    MOEX_WGMMA_FENCE16_AT(d, 0)
  }
}
// Four e4m3 codes (bytes b0..b3 of w, b0 lowest) as two f16x2 (exact): lo = (b0, b1), hi = (b2, b3),
// the first of each pair in the low half.
__device__ __forceinline__ void e4m3x4_to_f16x2x2(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}\n"
      : "=r"(lo), "=r"(hi)
      : "r"(w));
}

// One k16 step of a warpgroup's m64 × BN tile (BN = 128 or 256 accumulator columns), T the operand
// type (__nv_bfloat16 or __half): the shape / type dispatch of the grouped GEMM kernels.
template <class T, int BN>
__device__ __forceinline__ void mma_m64k16(float (&d)[BN / 8][4], uint64_t desc_a, uint64_t desc_b) {
  static_assert(BN == 128 || BN == 256, "m64n128 or m64n256");
  if constexpr (BN == 128) {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) wgmma_m64n128k16_bf16(d, desc_a, desc_b);
    else wgmma_m64n128k16_f16(d, desc_a, desc_b);
  } else {
    if constexpr (std::is_same_v<T, __nv_bfloat16>) wgmma_m64n256k16_bf16(d, desc_a, desc_b);
    else wgmma_m64n256k16_f16(d, desc_a, desc_b);
  }
}

}  // namespace moex::cuda::wgmma

#undef MOEX_WGMMA_ASM
#undef MOEX_WGMMA_REGS8
#undef MOEX_WGMMA_REGS16
#undef MOEX_WGMMA_REGS32
#undef MOEX_WGMMA_ACC2
#undef MOEX_WGMMA_ACC4F
#undef MOEX_WGMMA_ACC8F
#undef MOEX_WGMMA_FENCE4
#undef MOEX_WGMMA_FENCE16_AT
#undef MOEX_WGMMA_REGS128
#undef MOEX_WGMMA_REGS64
#undef MOEX_WGMMA_ACC32
#undef MOEX_WGMMA_ACC16
#undef MOEX_WGMMA_ACC16_AT
#undef MOEX_WGMMA_ACC4
