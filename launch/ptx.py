"""Inline-PTX primitives the kernels' communication code is built from.

Every function takes raw 64-bit addresses (``cutlass.Int64``): the symmetric workspace,
peer mappings, the multicast mapping and the host-mapped error record are all plain
virtual addresses, and keeping them as integers lets one kernel source serve every
transport without building CuTe tensors over memory that another GPU owns.
"""
from __future__ import annotations

import cutlass
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import T, dsl_user_op

from .geometry import L2_HINTS, L2_POLICY_WORDS

Int32 = cutlass.Int32
Int64 = cutlass.Int64
Float32 = cutlass.Float32


def _asm(ret, args, text: str, constraints: str, loc, ip):
    return llvm.inline_asm(
        ret, args, text, constraints, has_side_effects=True, asm_dialect=0, loc=loc, ip=ip
    )


def _v(x, ty, loc, ip):
    return ty(x).ir_value(loc=loc, ip=ip)


def _struct(n: int, elem: str):
    return ir.Type.parse("!llvm.struct<(" + ",".join([elem] * n) + ")>")


def _ld_v4(op: str, addr, addr_ty, loc, ip):
    """The four b32 words ``op {$0, $1, $2, $3}, [$4];`` loads from ``addr`` (a 64-bit
    global or a 32-bit shared-window address, as ``addr_ty`` says)."""
    reg = "l" if addr_ty is Int64 else "r"
    s = _asm(_struct(4, "i32"), [_v(addr, addr_ty, loc, ip)], op + " {$0, $1, $2, $3}, [$4];",
             f"=r,=r,=r,=r,{reg},~{{memory}}", loc, ip)
    return tuple(Int32(llvm.extractvalue(T.i32(), s, [i], loc=loc, ip=ip)) for i in range(4))


def _st_v4(op: str, addr, addr_ty, vals, loc, ip) -> None:
    """``op [$0], {$1, $2, $3, $4};`` of four b32 words at ``addr`` (as ``_ld_v4``)."""
    reg = "l" if addr_ty is Int64 else "r"
    _asm(None, [_v(addr, addr_ty, loc, ip)] + [_v(x, Int32, loc, ip) for x in vals],
         op + " [$0], {$1, $2, $3, $4};", f"{reg},r,r,r,r,~{{memory}}", loc, ip)


# ---------------------------------------------------------------- flags and clocks
@dsl_user_op
def ld_acquire_sys(addr, *, loc=None, ip=None) -> Int32:
    """Acquire load at system scope: pairs with a peer's release store over NVLink."""
    return Int32(_asm(T.i32(), [_v(addr, Int64, loc, ip)],
                      "ld.acquire.sys.global.b32 $0, [$1];", "=r,l,~{memory}", loc, ip))


@dsl_user_op
def ld_acquire_gpu(addr, *, loc=None, ip=None) -> Int32:
    """Acquire load at GPU scope: pairs with another SM's ``fence_gpu`` and flag store."""
    return Int32(_asm(T.i32(), [_v(addr, Int64, loc, ip)],
                      "ld.acquire.gpu.global.b32 $0, [$1];", "=r,l,~{memory}", loc, ip))


@dsl_user_op
def ld_relaxed_gpu(addr, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [_v(addr, Int64, loc, ip)],
                      "ld.relaxed.gpu.global.b32 $0, [$1];", "=r,l,~{memory}", loc, ip))


@dsl_user_op
def stamp_sys(addr, val, *, loc=None, ip=None) -> None:
    """A flag a peer reads with ld.acquire.sys, stored after this thread's ``fence_sys()``:
    fence.acq_rel.sys then st.relaxed.sys is a release pattern (PTX memory model), so the
    flag orders every write the fence covers. st.release.sys would fence a second time, and
    a system-scope fence costs ~2 us on 2x H200 even with no write in flight (docs/PERF.md
    (h): fence 2.4-3.1 us, then 2.0-2.2 us more for the st.release.sys stamp)."""
    _asm(None, [_v(addr, Int64, loc, ip), _v(val, Int32, loc, ip)],
         "st.relaxed.sys.global.b32 [$0], $1;", "l,r,~{memory}", loc, ip)


@dsl_user_op
def st_relaxed_gpu(addr, val, *, loc=None, ip=None) -> None:
    _asm(None, [_v(addr, Int64, loc, ip), _v(val, Int32, loc, ip)],
         "st.relaxed.gpu.global.b32 [$0], $1;", "l,r,~{memory}", loc, ip)


@dsl_user_op
def st_relaxed_sys(addr, val, *, loc=None, ip=None) -> None:
    _asm(None, [_v(addr, Int64, loc, ip), _v(val, Int32, loc, ip)],
         "st.relaxed.sys.global.b32 [$0], $1;", "l,r,~{memory}", loc, ip)


@dsl_user_op
def st_relaxed_sys_pair(addr, lo, hi, *, loc=None, ip=None) -> None:
    """Two words in one 8-byte store (``addr`` 8-byte aligned): an 8-byte load sees both
    or neither, which two 4-byte stores would not promise without a fence between them."""
    _asm(None, [_v(addr, Int64, loc, ip), _v(lo, Int32, loc, ip), _v(hi, Int32, loc, ip)],
         "{ .reg .b64 t; mov.b64 t, {$1, $2}; st.relaxed.sys.global.b64 [$0], t; }",
         "l,r,r,~{memory}", loc, ip)


@dsl_user_op
def ld_acquire_sys_pair(addr, *, loc=None, ip=None) -> tuple:
    """(low, high) words of one 8-byte acquire load at system scope (``st_relaxed_sys_pair``)."""
    s = _asm(_struct(2, "i32"), [_v(addr, Int64, loc, ip)],
             "{ .reg .b64 t; ld.acquire.sys.global.b64 t, [$2]; mov.b64 {$0, $1}, t; }",
             "=r,=r,l,~{memory}", loc, ip)
    return tuple(Int32(llvm.extractvalue(T.i32(), s, [i], loc=loc, ip=ip)) for i in range(2))


@dsl_user_op
def atom_add_acq_rel_gpu(addr, val, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [_v(addr, Int64, loc, ip), _v(val, Int32, loc, ip)],
                      "atom.acq_rel.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r,~{memory}",
                      loc, ip))


@dsl_user_op
def atom_add_relaxed_gpu(addr, val, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [_v(addr, Int64, loc, ip), _v(val, Int32, loc, ip)],
                      "atom.relaxed.gpu.global.add.u32 $0, [$1], $2;", "=r,l,r,~{memory}",
                      loc, ip))


@dsl_user_op
def atom_cas_sys(addr, cmp, val, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [_v(addr, Int64, loc, ip), _v(cmp, Int32, loc, ip),
                                _v(val, Int32, loc, ip)],
                      "atom.relaxed.sys.global.cas.b32 $0, [$1], $2, $3;", "=r,l,r,r,~{memory}",
                      loc, ip))


@dsl_user_op
def fence_sys(*, loc=None, ip=None) -> None:
    """fence.acq_rel.sys: orders this CTA's prior stores (after a bar.sync) before a flag."""
    _asm(None, [], "fence.acq_rel.sys;", "~{memory}", loc, ip)


@dsl_user_op
def fence_gpu(*, loc=None, ip=None) -> None:
    """fence.acq_rel.gpu: as ``fence_sys`` for a flag only this GPU reads."""
    _asm(None, [], "fence.acq_rel.gpu;", "~{memory}", loc, ip)


@dsl_user_op
def l2_policy(kind: str, *, loc=None, ip=None) -> Int64:
    """An L2 cache policy giving every access it tags eviction priority ``kind``, for a TMA
    load's ``.L2::cache_hint`` operand: "normal", "first" or "last" made by ``createpolicy``,
    "fixed_normal" / "fixed_first" / "fixed_last" the fixed words of ``L2_POLICY_WORDS``."""
    if kind not in L2_HINTS[1:]:
        raise ValueError(f"l2_policy: kind must be one of {L2_HINTS[1:]}, got {kind!r}")
    if kind in L2_POLICY_WORDS:
        return Int64(_asm(T.i64(), [], f"mov.b64 $0, {L2_POLICY_WORDS[kind]:#x};", "=l", loc, ip))
    return Int64(_asm(T.i64(), [], f"createpolicy.fractional.L2::evict_{kind}.b64 $0, 1.0;",
                      "=l", loc, ip))


@dsl_user_op
def prefetch_tensormap(addr, *, loc=None, ip=None) -> None:
    """prefetch.tensormap of the TMA descriptor at generic address ``addr`` (a kernel
    parameter's, ``launch.tma_descs``), as ``prefetch_descriptor`` does for an atom's."""
    _asm(None, [_v(addr, Int64, loc, ip)], "prefetch.tensormap [$0];", "l,~{memory}", loc, ip)


@dsl_user_op
def globaltimer(*, loc=None, ip=None) -> Int64:
    return Int64(_asm(T.i64(), [], "mov.u64 $0, %globaltimer;", "=l", loc, ip))


@dsl_user_op
def nanosleep(ns, *, loc=None, ip=None) -> None:
    _asm(None, [_v(ns, Int32, loc, ip)], "nanosleep.u32 $0;", "r", loc, ip)


# ---------------------------------------------------------------- 16-byte data movement
@dsl_user_op
def st_v4(addr, a, b, c, d, *, loc=None, ip=None) -> None:
    _st_v4("st.global.v4.b32", addr, Int64, (a, b, c, d), loc, ip)


@dsl_user_op
def st_v4_f32(addr, a, b, c, d, *, loc=None, ip=None) -> None:
    _asm(None, [_v(addr, Int64, loc, ip)] + [_v(x, Float32, loc, ip) for x in (a, b, c, d)],
         "st.global.v4.f32 [$0], {$1, $2, $3, $4};", "l,f,f,f,f,~{memory}", loc, ip)


@dsl_user_op
def ld_v4_f32_cg(addr, *, loc=None, ip=None):
    """Four fp32 another SM of this GPU wrote, read through L2 (L1 may hold an older copy)."""
    s = _asm(_struct(4, "f32"), [_v(addr, Int64, loc, ip)],
             "ld.global.cg.v4.f32 {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,l,~{memory}", loc, ip)
    return tuple(Float32(llvm.extractvalue(T.f32(), s, [i], loc=loc, ip=ip)) for i in range(4))


@dsl_user_op
def ld_v4_cg(addr, *, loc=None, ip=None):
    """16-byte load cached in L2 only: peers write this memory over NVLink, L1 would be stale."""
    return _ld_v4("ld.global.cg.v4.b32", addr, Int64, loc, ip)


@dsl_user_op
def multimem_ld_reduce_bf16x8(addr, *, loc=None, ip=None):
    """Sum of 8 bf16 over every rank's copy, accumulated in fp32 by the NVLink switch."""
    return _ld_v4("multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.bf16x2", addr, Int64,
                  loc, ip)


@dsl_user_op
def multimem_ld_reduce_f16x8(addr, *, loc=None, ip=None):
    """Sum of 8 fp16 over every rank's copy, accumulated in fp32 by the NVLink switch."""
    return _ld_v4("multimem.ld_reduce.relaxed.sys.global.add.acc::f32.v4.f16x2", addr, Int64,
                  loc, ip)


@dsl_user_op
def multimem_st_v4(addr, a, b, c, d, *, loc=None, ip=None) -> None:
    """Broadcast 16 bytes to every rank's copy through the multicast mapping."""
    _st_v4("multimem.st.relaxed.sys.global.v4.f32", addr, Int64, (a, b, c, d), loc, ip)


@dsl_user_op
def multimem_red_release_sys_add(addr, val, *, loc=None, ip=None) -> None:
    _asm(None, [_v(addr, Int64, loc, ip), _v(val, Int32, loc, ip)],
         "multimem.red.release.sys.global.add.u32 [$0], $1;", "l,r,~{memory}", loc, ip)


# ---------------------------------------------------------------- bf16 arithmetic
@dsl_user_op
def bf16x2_to_f32(u, *, loc=None, ip=None):
    """Unpack two bf16 (low half first) into two fp32: a bf16 is the top half of an fp32."""
    s = _asm(_struct(2, "f32"), [_v(u, Int32, loc, ip)],
             "{ .reg .b32 t; shl.b32 t, $2, 16; mov.b32 $0, t; and.b32 t, $2, 0xffff0000; mov.b32 $1, t; }",
             "=f,=f,r", loc, ip)
    return (Float32(llvm.extractvalue(T.f32(), s, [0], loc=loc, ip=ip)),
            Float32(llvm.extractvalue(T.f32(), s, [1], loc=loc, ip=ip)))


@dsl_user_op
def f32_to_bf16x2(lo, hi, *, loc=None, ip=None) -> Int32:
    """Round two fp32 to bf16 (nearest even) and pack them, ``lo`` in the low half."""
    return Int32(_asm(T.i32(), [_v(hi, Float32, loc, ip), _v(lo, Float32, loc, ip)],
                      "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f", loc, ip))


# ---------------------------------------------------------------- fp16 arithmetic
@dsl_user_op
def f16x2_to_f32(u, *, loc=None, ip=None):
    """Unpack two fp16 (low half first) into two fp32 (exact)."""
    s = _asm(_struct(2, "f32"), [_v(u, Int32, loc, ip)],
             "{ .reg .f16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
             "=f,=f,r", loc, ip)
    return (Float32(llvm.extractvalue(T.f32(), s, [0], loc=loc, ip=ip)),
            Float32(llvm.extractvalue(T.f32(), s, [1], loc=loc, ip=ip)))


@dsl_user_op
def f32_to_f16x2(lo, hi, *, loc=None, ip=None) -> Int32:
    """Round two fp32 to fp16 (nearest even; beyond 65504 to inf, as torch's cast) and pack
    them, ``lo`` in the low half."""
    return Int32(_asm(T.i32(), [_v(hi, Float32, loc, ip), _v(lo, Float32, loc, ip)],
                      "cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f", loc, ip))


@dsl_user_op
def ld_u64_nc(addr, *, loc=None, ip=None) -> Int64:
    """Read-only 8-byte load (the peer-pointer table does not change while a kernel runs)."""
    return Int64(_asm(T.i64(), [_v(addr, Int64, loc, ip)],
                      "ld.global.nc.b64 $0, [$1];", "=l,l", loc, ip))


@dsl_user_op
def ld_v4_nc(addr, *, loc=None, ip=None):
    """Read-only 16-byte load through L1 (a bias: written before the launch, never by it)."""
    return _ld_v4("ld.global.nc.v4.b32", addr, Int64, loc, ip)


@dsl_user_op
def ld_f32_nc(addr, *, loc=None, ip=None) -> Float32:
    """Read-only 4-byte fp32 load (fp8 block scales: written before the launch, never by it)."""
    return Float32(_asm(T.f32(), [_v(addr, Int64, loc, ip)],
                        "ld.global.nc.f32 $0, [$1];", "=f,l", loc, ip))


@dsl_user_op
def cp_async_4(smem_addr, gaddr, *, loc=None, ip=None) -> None:
    """Asynchronous 4-byte copy from global memory to a 32-bit shared-window address (no
    register holds the word; ``cp.async.wait_group`` before the copy is read)."""
    _asm(None, [_v(smem_addr, Int32, loc, ip), _v(gaddr, Int64, loc, ip)],
         "cp.async.ca.shared.global [$0], [$1], 4;", "r,l,~{memory}", loc, ip)


@dsl_user_op
def ld_shared_v4(addr, *, loc=None, ip=None):
    """16-byte shared-memory load at a 32-bit shared-window address."""
    return _ld_v4("ld.shared.v4.b32", addr, Int32, loc, ip)


@dsl_user_op
def st_shared_v4(addr, a, b, c, d, *, loc=None, ip=None) -> None:
    """16-byte shared-memory store at a 32-bit shared-window address."""
    _st_v4("st.shared.v4.b32", addr, Int32, (a, b, c, d), loc, ip)


@dsl_user_op
def ld_shared_u32(addr, *, loc=None, ip=None) -> Int32:
    return Int32(_asm(T.i32(), [_v(addr, Int32, loc, ip)],
                      "ld.shared.b32 $0, [$1];", "=r,r,~{memory}", loc, ip))


@dsl_user_op
def st_async_peer_u32(addr, val, mbar, rank, *, loc=None, ip=None) -> None:
    """Writes ``val`` at shared address ``addr`` of cluster CTA ``rank`` and completes 4
    bytes of its mbarrier at ``mbar`` (both addresses as in this CTA's window)."""
    _asm(None, [_v(addr, Int32, loc, ip), _v(val, Int32, loc, ip), _v(mbar, Int32, loc, ip),
                _v(rank, Int32, loc, ip)],
         "{ .reg .b32 a, b; mapa.shared::cluster.u32 a, $0, $3; "
         "mapa.shared::cluster.u32 b, $2, $3; "
         "st.async.shared::cluster.mbarrier::complete_tx::bytes.u32 [a], $1, [b]; }",
         "r,r,r,r,~{memory}", loc, ip)


# ---------------------------------------------------------------- sm100 tensor memory
@dsl_user_op
def tmem_ld_row32(taddr, *, loc=None, ip=None):
    """sm100: 32 consecutive fp32 columns of this thread's TMEM lane (32x32b shape, x32),
    waited for. The warp reads lanes 32 * (warp % 4) .. +31 from column ``taddr & 0xffff``."""
    outs = ", ".join(f"${i}" for i in range(32))
    s = _asm(_struct(32, "f32"), [_v(taddr, Int32, loc, ip)],
             "tcgen05.ld.sync.aligned.32x32b.x32.b32 {" + outs + "}, [$32];\n"
             "tcgen05.wait::ld.sync.aligned;",
             ",".join(["=f"] * 32) + ",r,~{memory}", loc, ip)
    return [Float32(llvm.extractvalue(T.f32(), s, [i], loc=loc, ip=ip)) for i in range(32)]


# ---------------------------------------------------------------- bulk (TMA) copies
@dsl_user_op
def bulk_s2g(dst, src_smem, nbytes, *, loc=None, ip=None) -> None:
    """Asynchronous bulk copy of ``nbytes`` (multiple of 16) from shared memory to a global
    address - a peer's mapping included - by the TMA unit, in this thread's bulk group."""
    _asm(None, [_v(dst, Int64, loc, ip), _v(src_smem, Int32, loc, ip), _v(nbytes, Int32, loc, ip)],
         "cp.async.bulk.global.shared::cta.bulk_group [$0], [$1], $2;", "l,r,r,~{memory}", loc, ip)


@dsl_user_op
def bulk_commit(*, loc=None, ip=None) -> None:
    _asm(None, [], "cp.async.bulk.commit_group;", "~{memory}", loc, ip)


@dsl_user_op
def bulk_wait_read_all(*, loc=None, ip=None) -> None:
    """This thread's bulk copies have read their shared memory: the source can be reused."""
    _asm(None, [], "cp.async.bulk.wait_group.read 0;", "~{memory}", loc, ip)


@dsl_user_op
def bulk_wait_all(*, loc=None, ip=None) -> None:
    """This thread's bulk copies are complete, their writes performed."""
    _asm(None, [], "cp.async.bulk.wait_group 0;", "~{memory}", loc, ip)


@dsl_user_op
def bulk_wait_pending(n: int, *, loc=None, ip=None) -> None:
    """At most ``n`` of this thread's committed bulk groups are still incomplete."""
    _asm(None, [], f"cp.async.bulk.wait_group {int(n)};", "~{memory}", loc, ip)


@dsl_user_op
def fence_proxy_async_global(*, loc=None, ip=None) -> None:
    """Orders the async proxy's (bulk copies') global writes with this thread's later
    generic-proxy operations - the release of the arrival stamp."""
    _asm(None, [], "fence.proxy.async.global;", "~{memory}", loc, ip)


@dsl_user_op
def st_u64_relaxed_gpu(addr, val, *, loc=None, ip=None) -> None:
    _asm(None, [_v(addr, Int64, loc, ip), _v(val, Int64, loc, ip)],
         "st.relaxed.gpu.global.u64 [$0], $1;", "l,l,~{memory}", loc, ip)
