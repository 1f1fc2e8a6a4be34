// Where a persistent grid's CTAs land: the SM (%smid) of each block of one-CTA-per-SM
// grids launched as clusters of 1, 2, 4, 8 and 16 CTAs (16: non-portable), as many clusters
// as fit at once. A cluster's CTAs share a GPC, so the 8- and 16-CTA launches group the SMs
// by GPC, and the 2-CTA launch shows which GPCs the 2x1-cluster lanes 0, 1, 2, ... take:
// whether neighbouring lanes of the tile order (units that share x's or w's tiles) sit on
// one GPC, where the L2 request coalescer can merge their requests (docs/perf/HISTORY.md
// (av); on one H100 (ay): they do not: SM ids interleave the GPCs, TPC t in GPC t mod 8 for
// the first 32 TPCs, so consecutive blocks and clusters land on different GPCs; the output
// is docs/perf/sm-placement-h100-2026-12-07ay.txt). Built here, run on the GPU machine:
//   nvcc -O2 -arch=sm_90a -cudart static -o .device/sm_placement benchmarks/sm_placement.cu
//   (carry .device)  .device/sm_placement > $OUT/sm_placement.txt
// Each line: "block:smid/cluster/rank-in-cluster".
#include <cstdio>
#include <cuda_runtime.h>
__global__ void k(int *out) {
  extern __shared__ char pad[];
  unsigned smid, nsmid, crank, cid;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
  asm volatile("mov.u32 %0, %%nsmid;" : "=r"(nsmid));
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(crank));
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cid));
  if (threadIdx.x == 0) {
    pad[0] = 1;
    long long t0; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    while (true) { long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); if (t - t0 > 2000000) break; }
    out[blockIdx.x * 4 + 0] = smid; out[blockIdx.x * 4 + 1] = cid;
    out[blockIdx.x * 4 + 2] = crank; out[blockIdx.x * 4 + 3] = nsmid;
  }
}
int main() {
  int *d; cudaMalloc(&d, 4096 * 16);
  int smem = 200 * 1024;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  int sizes[] = {1, 2, 4, 8, 16};
  for (int s : sizes) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = s; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
    cfg.blockDim = dim3(32); cfg.dynamicSmemBytes = smem; cfg.attrs = at; cfg.numAttrs = 1;
    cfg.gridDim = dim3(s);
    int ncl = 0;
    cudaError_t e = cudaOccupancyMaxActiveClusters(&ncl, (void *)k, &cfg);
    int grid = (s == 1 ? 132 : ncl * s);
    cfg.gridDim = dim3(grid);
    cudaMemset(d, 0xff, 4096 * 16);
    cudaError_t e2 = cudaLaunchKernelEx(&cfg, k, d);
    cudaError_t e3 = cudaDeviceSynchronize();
    static int h[4096 * 4];
    cudaMemcpy(h, d, grid * 16, cudaMemcpyDeviceToHost);
    printf("cluster %d maxActiveClusters %d (%s) grid %d launch %s sync %s\n", s, ncl,
           cudaGetErrorString(e), grid, cudaGetErrorString(e2), cudaGetErrorString(e3));
    for (int b = 0; b < grid; ++b) printf("%d:%d/%d/%d ", b, h[b * 4], h[b * 4 + 1], h[b * 4 + 2]);
    printf("\n");
  }
  return 0;
}
