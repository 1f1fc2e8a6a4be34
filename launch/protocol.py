"""Arch-independent device code of the communication protocol.

Shared by the sm90 and sm100 kernels: epoch stamps, bounded spin-waits that report the
rank/tile/source that never arrived, the end-of-launch epoch advance, and the ownership
formulas mirrored from ``launch.plan``. Everything here is called by one thread unless
its docstring says otherwise.
"""
from __future__ import annotations

import cutlass
import cutlass.cute as cute

from . import layout, ptx

Int32 = cutlass.Int32
Int64 = cutlass.Int64

# Error record (host-mapped int32[8]): what a timed-out wait reports, or a peer that
# started a launch with another shape (ERR_SHAPE: TILE holds the peer's shape word, KIND
# this rank's).
ERR_CODE, ERR_RANK, ERR_TILE, ERR_SRC, ERR_EPOCH, ERR_KIND = 0, 1, 2, 3, 4, 5
ERR_TIMEOUT, ERR_SHAPE = 1, 2
# A launch's shape word: M in the high 20 bits, K / 64 in the low 12 (each modulo its field)
SHAPE_K_BITS, SHAPE_M_BITS = 12, 20
KIND_ARRIVE, KIND_RESULT, KIND_STARTED, KIND_SK = 1, 2, 3, 4
# Tile classes (``CommWarps._tile_class``): rows of peers only, of this rank only, of both
TILE_FOREIGN, TILE_OWN, TILE_MIXED = 0, 1, 2


def decode_shape(word: int) -> tuple[int, int]:
    """(M, K) of a shape word, each modulo its field (``shape_word``)."""
    word &= 0xFFFFFFFF
    return word >> SHAPE_K_BITS, (word & ((1 << SHAPE_K_BITS) - 1)) * 64


@cute.jit
def shape_word(M: Int32, K: Int32) -> Int32:
    """What ``announce_start`` tells the peers of this launch: every rank must launch with
    the same M and K (K a multiple of 64)."""
    return (((M & Int32((1 << SHAPE_M_BITS) - 1)) << Int32(SHAPE_K_BITS))
            | ((K >> Int32(6)) & Int32((1 << SHAPE_K_BITS) - 1)))


@cute.jit
def report_failure(err_addr: Int64, ws: Int64, rank: Int32, tile: Int32, src: Int32,
                   epoch: Int32, kind: Int32, code: cutlass.Constexpr = ERR_TIMEOUT):
    """The first report of a launch wins (``code``: ERR_TIMEOUT, or ERR_SHAPE with the two
    shape words in ``tile`` and ``kind``); later waits of the launch give up at once."""
    old = ptx.atom_cas_sys(err_addr, Int32(0), Int32(code))
    if old == Int32(0):
        ptx.st_relaxed_sys(err_addr + Int64(4 * ERR_RANK), rank)
        ptx.st_relaxed_sys(err_addr + Int64(4 * ERR_TILE), tile)
        ptx.st_relaxed_sys(err_addr + Int64(4 * ERR_SRC), src)
        ptx.st_relaxed_sys(err_addr + Int64(4 * ERR_EPOCH), epoch)
        ptx.st_relaxed_sys(err_addr + Int64(4 * ERR_KIND), kind)
    # Later waits of this launch give up at once instead of each burning the time limit.
    ptx.st_relaxed_gpu(ws + Int64(layout.CTRL_ABORT), Int32(1))


@cute.jit
def wait_stamp(addr: Int64, target: Int32, timeout_ns: Int64, err_addr: Int64, ws: Int64,
               rank: Int32, tile: Int32, src: Int32, epoch: Int32, kind: Int32,
               local: cutlass.Constexpr = False, paired: cutlass.Constexpr = False):
    """Spin until the stamp at ``addr`` reaches ``target`` (wrap-safe), or time out.
    ``local``: the stamp comes from another SM of this GPU (GPU-scope acquire). ``paired``:
    the stamp is the low word of an 8-byte (stamp, word) pair (``st_relaxed_sys_pair``).
    Returns the stamp last read (``target - 1`` when the wait gave up) and the word beside
    it (0 unless ``paired``)."""
    v, beside = _load_stamp(addr, local, paired)
    pending = (v - target) < Int32(0)
    if pending:
        t0 = ptx.globaltimer()
        while pending:
            v, beside = _load_stamp(addr, local, paired)
            pending = (v - target) < Int32(0)
            if pending:
                aborted = ptx.ld_relaxed_gpu(ws + Int64(layout.CTRL_ABORT)) != Int32(0)
                if aborted or (ptx.globaltimer() - t0 > timeout_ns):
                    if not aborted:
                        report_failure(err_addr, ws, rank, tile, src, epoch, kind)
                    pending = False
                    v = target - Int32(1)
    return v, beside


@cute.jit
def _load_stamp(addr: Int64, local: cutlass.Constexpr, paired: cutlass.Constexpr):
    if cutlass.const_expr(paired):
        return ptx.ld_acquire_sys_pair(addr)
    if cutlass.const_expr(local):
        return ptx.ld_acquire_gpu(addr), Int32(0)
    return ptx.ld_acquire_sys(addr), Int32(0)


@cute.jit
def peer_base(peer_tab: Int64, p: Int32) -> Int64:
    return ptx.ld_u64_nc(peer_tab + Int64(p) * Int64(8))


@cute.jit
def announce_start(ws: Int64, peer_tab: Int64, epoch: Int32, world: cutlass.Constexpr,
                   rank: Int32, shape: Int32):
    """One thread of the launch, after ``griddepcontrol.wait``: tell every peer this rank has
    started launch ``epoch`` (stamp ``epoch + 1``), which it can only do once its previous
    launch has finished, every read of its buffers included, and with what ``shape``
    (``shape_word``), in the same 8-byte store. No fence: the stamp carries no data of this
    launch, and the previous launch's reads were complete when it ended."""
    for p in cutlass.range_constexpr(world):
        if Int32(p) != rank:
            ptx.st_relaxed_sys_pair(peer_base(peer_tab, Int32(p)) + Int64(layout.CTRL_STARTED)
                                    + Int64(8) * Int64(rank), epoch + Int32(1), shape)


@cute.jit
def wait_peers_started(ws: Int64, epoch: Int32, world: cutlass.Constexpr, rank: Int32,
                       shape: Int32, timeout_ns: Int64, err_addr: Int64):
    """Before the first write into a peer's memory this launch: that peer has started this
    launch (``announce_start``), so it has finished reading its buffers of the previous one.
    The acquire keeps this rank's writes after what it saw. A peer that started it with
    another shape is reported (ERR_SHAPE) and the launch given up: its plan differs from
    this rank's, so its tiles would meet this rank's in the wrong places."""
    for p in cutlass.range_constexpr(world):
        if Int32(p) != rank:
            _wait_started(ws + Int64(layout.CTRL_STARTED + 8 * p), epoch, shape, timeout_ns,
                          err_addr, ws, rank, Int32(p))


@cute.jit
def _wait_started(addr: Int64, epoch: Int32, shape: Int32, timeout_ns: Int64, err_addr: Int64,
                  ws: Int64, rank: Int32, src: Int32):
    """The wait for a peer's (stamp, shape) pair; the shapes are compared once the stamp is
    this launch's (a peer already past it, which no plan allows, is not compared)."""
    target = epoch + Int32(1)
    v, peer_shape = wait_stamp(addr, target, timeout_ns, err_addr, ws, rank, Int32(-1), src,
                               epoch, Int32(KIND_STARTED), paired=True)
    if (v == target) & (peer_shape != shape):
        report_failure(err_addr, ws, rank, peer_shape, src, epoch, shape, ERR_SHAPE)


@cute.jit
def finish_launch(ws: Int64, peer_tab: Int64, epoch: Int32, num_ctas: Int32,
                  world: cutlass.Constexpr, rank: Int32, lean: cutlass.Constexpr):
    """Called by one thread per CTA after the CTA's last memory access. The last CTA to
    get here advances the epoch. Peers learn that this launch is over from the next one's
    ``announce_start``, so nothing here needs to reach them.
    ``lean`` False (the default exit until it is measured against this one, docs/PERF.md):
    each CTA fences at system scope first, and the last CTA fences again and stamps
    ``done`` on every peer, as the protocol did before ``announce_start``. Those ``done``
    words have no reader now; the exit keeps the cost it had. An experiment of 2026-11-30
    removed only the per-CTA fence and one suite run hung on a stamp that never arrived
    (not explained); the lean exit is checked by the GPU suite before it becomes the
    default."""
    if not lean:
        ptx.fence_sys()
    old = ptx.atom_add_acq_rel_gpu(ws + Int64(layout.CTRL_EXIT_COUNT), Int32(1))
    if old == num_ctas - Int32(1):
        ptx.st_relaxed_gpu(ws + Int64(layout.CTRL_EXIT_COUNT), Int32(0))
        ptx.st_relaxed_gpu(ws + Int64(layout.CTRL_EPOCH), epoch + Int32(1))
        if not lean:
            ptx.fence_sys()
            for p in cutlass.range_constexpr(world):
                if Int32(p) != rank:
                    ptx.stamp_sys(peer_base(peer_tab, Int32(p)) + Int64(layout.CTRL_DONE)
                                  + Int64(4) * Int64(rank), epoch + Int32(1))
