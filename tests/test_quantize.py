"""rsar_core.quantize against float64 references on fresh random inputs: each row, 128-group or
128 x 128 block's largest magnitude maps to fp8's 448, the scales are that amax / 448 in the
layout GemmRsAr takes, and dequantizing gives the input back within e4m3's rounding."""
from __future__ import annotations

import random

import pytest
import torch

from rsar_core import quantize as qz
from rsar_core.reference import is_block_scaled, scaled_product

# e4m3 keeps 3 mantissa bits: a normal value rounds within 2^-4 of itself; below 2^-6 (times
# the scale) the spacing is 2^-9, so the absolute error there is at most 2^-10.
REL, SUB = 2.0 ** -4, 2.0 ** -10


@pytest.fixture
def gen() -> torch.Generator:
    seed = random.SystemRandom().randrange(2 ** 31)
    print(f"seed {seed}")  # shown by pytest where a test fails
    return torch.Generator().manual_seed(seed)


def _spread(shape: tuple[int, int], unit: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    """Normal values whose ``unit``-sized tiles differ in magnitude by up to 10^+-3, so a
    scale applied to the wrong tile shows."""
    rows, cols = -(-shape[0] // unit[0]), -(-shape[1] // unit[1])
    mag = 10.0 ** (6 * torch.rand(rows, cols, generator=gen, dtype=torch.float64) - 3)
    full = mag.repeat_interleave(unit[0], 0).repeat_interleave(unit[1], 1)
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * full[:shape[0], :shape[1]]


def _expand(scale: torch.Tensor, unit: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    return (scale.double().repeat_interleave(unit[0], 0)
            .repeat_interleave(unit[1], 1)[:shape[0], :shape[1]])


def _check_dequantized(t: torch.Tensor, q: torch.Tensor, full_scale: torch.Tensor) -> None:
    deq = q.double() * full_scale
    bound = REL * t.abs() + SUB * full_scale
    assert bool((deq - t).abs().le(bound).all()), float(((deq - t).abs() - bound).max())


def _tile_amax(t: torch.Tensor, unit: tuple[int, int]) -> torch.Tensor:
    rows, cols = -(-t.shape[0] // unit[0]), t.shape[1] // unit[1]
    pad = torch.zeros(rows * unit[0], t.shape[1], dtype=t.dtype)
    pad[:t.shape[0]] = t
    return pad.abs().reshape(rows, unit[0], cols, unit[1]).amax(dim=(1, 3))


@pytest.mark.parametrize("M, K", [(37, 64), (5, 384)])
def test_rows(gen, M, K):
    t = _spread((M, K), (1, K), gen)
    q, s = qz.quantize_rows(t)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (M, K)
    assert s.dtype == torch.float32 and s.shape == (M, 1)
    torch.testing.assert_close(s.double(), t.abs().amax(dim=1, keepdim=True) / qz.FP8_MAX,
                               rtol=1e-6, atol=0)
    assert bool((q.double().abs().amax(dim=1) == qz.FP8_MAX).all())
    _check_dequantized(t, q, s.double().expand(M, K))


@pytest.mark.parametrize("M, K", [(37, 384), (1, 128), (130, 256)])
def test_groups_one_scale_per_row_and_128_group(gen, M, K):
    t = _spread((M, K), (1, 128), gen)
    t[0, :128] = 0.0  # an all-zero group: its values stay zero
    q, s = qz.quantize_groups(t)
    assert q.shape == (M, K) and q.is_contiguous() and s.shape == (M, K // 128)
    assert s.dtype == torch.float32 and s.stride() == (1, M)  # M-major: BlockWise1x128
    want = (_tile_amax(t, (1, 128)) / qz.FP8_MAX).clamp_min(1e-12)
    torch.testing.assert_close(s.double(), want, rtol=1e-6, atol=0)
    amax = _tile_amax(q.double(), (1, 128))
    assert float(amax[0, 0]) == 0.0
    assert bool((amax.flatten()[1:] == qz.FP8_MAX).all())
    _check_dequantized(t, q, _expand(s, (1, 128), (M, K)))


def test_groups_beat_rows_on_spread_groups(gen):
    # what block-wise scales are for: one scale per row loses a group far below its amax
    # (10^-7 of it: under e4m3's smallest subnormal relative to the row's largest value)
    t = torch.randn(16, 512, generator=gen, dtype=torch.float64)
    t[:, 128:256] *= 1e-7
    qg, sg = qz.quantize_groups(t)
    qr, sr = qz.quantize_rows(t)

    def worst_group(deq: torch.Tensor) -> float:
        d, r = (deq - t).reshape(16, 4, 128), t.reshape(16, 4, 128)
        return float((d.norm(dim=2) / r.norm(dim=2)).max())

    assert worst_group(qg.double() * _expand(sg, (1, 128), t.shape)) < REL
    assert worst_group(qr.double() * sr.double()) > 0.5


@pytest.mark.parametrize("N, K", [(256, 256), (200, 384), (72, 128)])
def test_blocks_one_scale_per_128x128_block(gen, N, K):
    w = _spread((N, K), (128, 128), gen)
    q, s = qz.quantize_blocks(w)
    nb, kb = -(-N // 128), K // 128
    assert q.dtype == torch.float8_e4m3fn and q.shape == (N, K) and q.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == (nb, kb) and s.is_contiguous()
    # the last block row covers the N % 128 rows there are
    torch.testing.assert_close(s.double(), _tile_amax(w, (128, 128)) / qz.FP8_MAX,
                               rtol=1e-6, atol=0)
    assert bool((_tile_amax(q.double(), (128, 128)) == qz.FP8_MAX).all())
    _check_dequantized(w, q, _expand(s, (128, 128), (N, K)))
    assert is_block_scaled(q, s) == (nb * kb > 1)


def test_block_scaled_product_matches_float64(gen):
    # the pair GemmRsAr takes (h per 128-group, w per block) multiplies back to h @ w.T
    h, w = _spread((9, 256), (1, 128), gen), _spread((200, 256), (128, 128), gen)
    h8, sh = qz.quantize_groups(h)
    w8, sw = qz.quantize_blocks(w)
    ref = h @ w.T
    err = float((scaled_product(h8, w8, sh, sw) - ref).norm() / ref.norm())
    assert err < 2 * REL, err


def test_zero_block_and_bad_shapes():
    w = torch.randn(256, 256)
    w[128:, :128] = 0.0
    q, s = qz.quantize_blocks(w)
    assert float(s[1, 0]) == pytest.approx(1e-12) and float(q.float()[128:, :128].abs().max()) == 0
    with pytest.raises(ValueError, match="multiple of 128"):
        qz.quantize_groups(torch.ones(4, 200))
    with pytest.raises(ValueError, match="multiple of 128"):
        qz.quantize_blocks(torch.ones(128, 192))


def test_quantizers_by_mode():
    assert qz.quantizers("row") == (qz.quantize_rows, qz.quantize_rows)
    assert qz.quantizers("block") == (qz.quantize_groups, qz.quantize_blocks)
    assert qz.SCALE_MODES == ("row", "block")
    with pytest.raises(ValueError, match="scales must be one of"):
        qz.quantizers("tensor")
