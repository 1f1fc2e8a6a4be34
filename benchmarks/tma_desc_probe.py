"""Which L2 promotion the CuTe DSL writes into our TMA descriptors, and where the field sits.

    python3 benchmarks/tma_desc_probe.py [--json OUT]      # on the GPU machine, ~10 s
    CUTE_DSL_ARCH=sm_90a python3 benchmarks/tma_desc_probe.py --build-only   # CPU: compile

The mainloop's load of x (bf16 [M, K] row-major, a 128 x 64 box under the 128-byte swizzle,
as ``launch.sm90_kernel`` builds it) is encoded five times: four times by the driver
(``cuTensorMapEncodeTiled``, L2 promotion none / 64 B / 128 B / 256 B) and once by the DSL
(``make_tiled_tma_atom``; a one-thread kernel copies the descriptor out of its parameter with
``copy_tensormap``). The bytes where the driver's four differ are the promotion field; the
report names the driver encoding the DSL's equals, or lists every byte where it equals none.
Then ``Tuning.tma_promo``'s descriptors (``launch.tma_descs.encode``, each promotion), copied
out of the kernel parameter they travel in: each should equal the driver's of its promotion
(``knob_equals``), so the knob's "none" is the DSL atom's descriptor where the DSL's is none.

Why: at 512 x 7168 x 1024 our MMA warps wait for stage data with the producer never blocked
(docs/PERF.md (ba)), so each stage's loads take longer than cuBLAS's; CUTLASS's C++ encodes a
promotion, and the DSL's choice is not exposed by ``make_tiled_tma_atom``.
"""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BM, BK = 128, 64
PROMOTIONS = ("none", "64B", "128B", "256B")


def dsl_probe() -> Any:
    """The @cute.jit host function: x's TMA atom built as the kernel builds it, its
    descriptor copied to ``out_addr`` (128 bytes, 128-byte aligned) by one thread."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    import cutlass.utils.hopper_helpers as sm90_utils
    from cutlass import Int32, Int64
    from cutlass.tensor_utils import TensorMapManager, TensorMapUpdateMode

    manager = TensorMapManager(TensorMapUpdateMode.GMEM, 128)

    @cute.kernel
    def copy_desc(tma: cute.CopyAtom, out_addr: Int64) -> None:
        ptr = cute.make_ptr(cutlass.Int64, out_addr, cute.AddressSpace.gmem, assumed_align=128)
        manager.init_tensormap_from_atom(tma, manager.get_tensormap_ptr(ptr), 0)

    @cute.jit
    def probe(x_addr: Int64, out_addr: Int64, M: Int32, K: Int32,
              stream: cuda.CUstream) -> None:
        atom = cute.nvgpu.warpgroup.make_smem_layout_atom(
            sm90_utils.get_smem_layout_atom(cutlass.tensor_utils.LayoutEnum.ROW_MAJOR,
                                            cutlass.BFloat16, BK), cutlass.BFloat16)
        smem = cute.tile_to_shape(atom, (BM, BK), order=(0, 1))
        a_ptr = cute.make_ptr(cutlass.BFloat16, x_addr, cute.AddressSpace.gmem,
                              assumed_align=16)
        mA = cute.make_tensor(a_ptr, cute.make_layout((M, K), stride=(K, 1)))
        tma, _ = cute.nvgpu.cpasync.make_tiled_tma_atom(
            cute.nvgpu.cpasync.CopyBulkTensorTileG2SOp(), mA, smem, (BM, BK))
        copy_desc(tma, out_addr).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)

    return probe


def knob_probe(promo: str) -> Any:
    """The @cute.jit host function: x's descriptor as ``launch.tma_descs.encode`` makes it
    for the kernels (promotion ``promo``), copied by one thread from the grid-constant kernel
    parameter it travels in to ``out_addr`` (128 bytes)."""
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass import Int32, Int64

    from launch import tma_descs

    @cute.kernel
    def copy_param(desc: cutlass.GridConstant[tma_descs.tm.TensorMap], out_addr: Int64) -> None:
        src = cute.make_tensor(cute.make_ptr(Int64, desc.get_ptr().toint(),
                                             cute.AddressSpace.generic, assumed_align=64),
                               cute.make_layout(16))
        dst = cute.make_tensor(cute.make_ptr(Int64, out_addr, cute.AddressSpace.gmem,
                                             assumed_align=16), cute.make_layout(16))
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            for i in cutlass.range_constexpr(16):
                dst[i] = src[i]

    @cute.jit
    def probe(x_addr: Int64, out_addr: Int64, M: Int32, K: Int32,
              stream: cuda.CUstream) -> None:
        desc = tma_descs.encode(cutlass.BFloat16, x_addr, M, K, BM, BK, promo)
        copy_param(desc, out_addr).launch(grid=(1, 1, 1), block=(32, 1, 1), stream=stream)

    return probe


def compile_knob_probes() -> dict[str, Any]:
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute
    from cutlass import Int32, Int64
    return {p: cute.compile(knob_probe(p), Int64(0), Int64(0), Int32(BM), Int32(BK),
                            cuda.CUstream(0)) for p in PROMOTIONS}


def compile_probe() -> Any:
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute
    from cutlass import Int32, Int64
    return cute.compile(dsl_probe(), Int64(0), Int64(0), Int32(BM), Int32(BK),
                        cuda.CUstream(0))


def driver_descs(x: Any) -> dict[str, bytes]:
    """x's descriptor from ``cuTensorMapEncodeTiled`` at each L2 promotion."""
    import cuda.bindings.driver as drv
    M, K = x.shape
    u32, u64 = drv.cuuint32_t, drv.cuuint64_t  # the binding converts no plain int in a list
    out = {}
    for i, name in enumerate(PROMOTIONS):
        err, tmap = drv.cuTensorMapEncodeTiled(
            drv.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, x.data_ptr(),
            [u64(K), u64(M)], [u64(K * x.element_size())], [u32(BK), u32(BM)], [u32(1), u32(1)],
            drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            drv.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            drv.CUtensorMapL2promotion(i),
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        if err != drv.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuTensorMapEncodeTiled (promotion {name}): {err}")
        out[name] = b"".join(int(w).to_bytes(8, "little") for w in tmap.opaque)
    return out


def report(drv_descs: dict[str, bytes], dsl: bytes) -> dict:
    """The promotion field (bytes where the driver's encodings differ, with each one's
    value) and the driver encoding the DSL's equals (None: the bytes where it equals none)."""
    field = [i for i in range(128) if len({d[i] for d in drv_descs.values()}) > 1]
    same = [name for name, d in drv_descs.items() if d == dsl]
    row = {"field_bytes": field,
           "field_values": {n: [d[i] for i in field] for n, d in drv_descs.items()},
           "dsl_field_values": [dsl[i] for i in field],
           "dsl_equals": same[0] if same else None}
    if not same:
        row["dsl_differs_from_none_at"] = [
            (i, drv_descs["none"][i], dsl[i]) for i in range(128) if drv_descs["none"][i] != dsl[i]]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-only", action="store_true", help="compile the DSL probe, no GPU")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    compiled = compile_probe()
    knobs = compile_knob_probes()
    if a.build_only:
        print("tma_desc_probe: the DSL probe and the knob's compiled")
        return 0
    import cuda.bindings.driver as cuda
    import torch
    M, K = 512, 1024
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    out = torch.zeros(16, device="cuda", dtype=torch.int64)
    stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)

    def copied(fn: Any) -> bytes:
        out.fill_(-1)
        fn(x.data_ptr(), out.data_ptr(), M, K, stream)
        torch.cuda.synchronize()
        return b"".join(int(w).to_bytes(8, "little", signed=True) for w in out.tolist())

    drv = driver_descs(x)
    row = report(drv, copied(compiled))
    knob = {p: copied(fn) for p, fn in knobs.items()}
    row["knob_equals"] = {p: [n for n, d in drv.items() if d == knob[p]] for p in PROMOTIONS}
    print(json.dumps(row, indent=1))
    if a.json:
        a.json.write_text(json.dumps(row, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
