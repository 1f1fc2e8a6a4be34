// How long one split-K merge takes on Hopper: a CTA hands a 128 x 128 fp32 accumulator
// tile (64 KB, 64 floats per thread of 256) to the CTA that finishes the tile, which adds it
// to its own, round after round (docs/PERF.md (s)).
//
//   global : the piece stores its tile to global memory, fences and sets a flag; the
//            finisher polls the flag, loads and adds, then clears it (the kernels' split-K
//            slot hand-over, launch/sm90_kernel.py _sk_store / _sk_add).
//   dsmem  : the two CTAs form a 2x1 cluster; the piece stores into the finisher's shared
//            memory (distributed shared memory) and both meet at a cluster barrier, twice
//            a round (data ready, buffer free).
//
// Pairs run on 112 CTAs at once, as a split-K round of the fused kernel would. Prints the
// time per round (median over CTAs), in microseconds, and a checksum both must agree on.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o merge_latency benchmarks/merge_latency.cu
//   ./merge_latency [rounds]
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kFloats = 64;                       // per thread
constexpr int kVec = kFloats / 4;                 // float4 per thread
constexpr int kTileBytes = kThreads * kFloats * 4;  // 64 KB

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_relaxed_gpu(int* p, int v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void init_acc(float* acc, int seed) {
#pragma unroll
  for (int i = 0; i < kFloats; i++) acc[i] = 1e-3f * (threadIdx.x + i + seed);
}

__device__ __forceinline__ float acc_sum(const float* acc) {
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kFloats; i++) s += acc[i];
  return s;
}

// CTA 2p finishes, CTA 2p+1 is the piece; slot p and flag p are theirs.
__global__ void __launch_bounds__(kThreads) global_merge(float4* slots, int* flags, int rounds,
                                                         float* sums, unsigned long long* ns) {
  const int pair = blockIdx.x / 2, piece = blockIdx.x % 2;
  float acc[kFloats];
  init_acc(acc, blockIdx.x);
  float4* slot = slots + (size_t)pair * (kTileBytes / 16);
  int* flag = flags + pair;
  __syncthreads();
  const unsigned long long t0 = now_ns();
  for (int r = 0; r < rounds; r++) {
    if (piece) {
      if (threadIdx.x == 0)
        while (ld_acquire_gpu(flag) != 0) {}
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kVec; i++)
        slot[i * kThreads + threadIdx.x] =
            make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        st_relaxed_gpu(flag, 1);
      }
    } else {
      if (threadIdx.x == 0)
        while (ld_acquire_gpu(flag) != 1) {}
      __syncthreads();
#pragma unroll
      for (int i = 0; i < kVec; i++) {
        float4 v = __ldcg(slot + i * kThreads + threadIdx.x);
        acc[4 * i] += v.x; acc[4 * i + 1] += v.y; acc[4 * i + 2] += v.z; acc[4 * i + 3] += v.w;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        __threadfence();
        st_relaxed_gpu(flag, 0);
      }
    }
  }
  const unsigned long long t1 = now_ns();
  float s = acc_sum(acc);
  if (!piece) atomicAdd(sums, s);
  if (threadIdx.x == 0) ns[blockIdx.x] = t1 - t0;
}

__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(kThreads)
dsmem_merge(int rounds, float* sums, unsigned long long* ns) {
  extern __shared__ float4 buf[];  // kTileBytes: the finisher's receive buffer
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned piece = cluster.block_rank();
  float acc[kFloats];
  init_acc(acc, blockIdx.x);
  float4* dst = cluster.map_shared_rank(buf, 0);
  cluster.sync();
  const unsigned long long t0 = now_ns();
  for (int r = 0; r < rounds; r++) {
    if (piece) {
#pragma unroll
      for (int i = 0; i < kVec; i++)
        dst[i * kThreads + threadIdx.x] =
            make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
    }
    cluster.sync();  // the tile is in the finisher's shared memory
    if (!piece) {
#pragma unroll
      for (int i = 0; i < kVec; i++) {
        float4 v = buf[i * kThreads + threadIdx.x];
        acc[4 * i] += v.x; acc[4 * i + 1] += v.y; acc[4 * i + 2] += v.z; acc[4 * i + 3] += v.w;
      }
    }
    cluster.sync();  // the buffer is free again
  }
  const unsigned long long t1 = now_ns();
  float s = acc_sum(acc);
  if (!piece) atomicAdd(sums, s);
  if (threadIdx.x == 0) ns[blockIdx.x] = t1 - t0;
}

static void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

static double median_us_per_round(const std::vector<unsigned long long>& ns, int rounds) {
  std::vector<unsigned long long> v(ns);
  std::sort(v.begin(), v.end());
  return v[v.size() / 2] / 1e3 / rounds;
}

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 1000;
  const int ctas = 112;
  float4* slots;
  int* flags;
  float* sums;
  unsigned long long* ns;
  check(cudaMalloc(&slots, (size_t)ctas / 2 * kTileBytes), "malloc slots");
  check(cudaMalloc(&flags, ctas / 2 * sizeof(int)), "malloc flags");
  check(cudaMalloc(&sums, 2 * sizeof(float)), "malloc sums");
  check(cudaMalloc(&ns, ctas * sizeof(unsigned long long)), "malloc ns");
  check(cudaFuncSetAttribute(dsmem_merge, cudaFuncAttributeMaxDynamicSharedMemorySize, kTileBytes),
        "smem attribute");
  std::vector<unsigned long long> host(ctas);
  float s[2];
  for (int rep = 0; rep < 3; rep++) {  // the first repetition warms up
    check(cudaMemset(flags, 0, ctas / 2 * sizeof(int)), "memset");
    check(cudaMemset(sums, 0, 2 * sizeof(float)), "memset");
    global_merge<<<ctas, kThreads>>>(slots, flags, rounds, sums, ns);
    check(cudaDeviceSynchronize(), "global_merge");
    check(cudaMemcpy(host.data(), ns, ctas * 8, cudaMemcpyDeviceToHost), "copy");
    const double g = median_us_per_round(host, rounds);
    dsmem_merge<<<ctas, kThreads, kTileBytes>>>(rounds, sums + 1, ns);
    check(cudaDeviceSynchronize(), "dsmem_merge");
    check(cudaMemcpy(host.data(), ns, ctas * 8, cudaMemcpyDeviceToHost), "copy");
    const double d = median_us_per_round(host, rounds);
    check(cudaMemcpy(s, sums, 2 * sizeof(float), cudaMemcpyDeviceToHost), "copy");
    if (rep)
      std::printf("round of a 64 KB merge, %d CTAs: global %.3f us, dsmem %.3f us "
                  "(checksums %.6g / %.6g)\n", ctas, g, d, s[0], s[1]);
  }
  return 0;
}
