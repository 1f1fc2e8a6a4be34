"""The sub-tile ring's geometry as the communication threads walk it: a sub-tile is
128 x 32 elements (bf16 or fp16), contiguous in a slot, read and written in 16-byte chunks
that the 96 communication threads share out in rounds."""
from __future__ import annotations

from .geometry import BM, EPI_N

SUB_BYTES = BM * EPI_N * 2        # one 128 x 32 bf16 / fp16 sub-tile, contiguous in slots
SUB_CHUNKS = SUB_BYTES // 16      # 16-byte pieces per sub-tile
EPI_PITCH = EPI_N + 8             # padded smem row (80 B): stmatrix and 16-B reads conflict-free
COMM_THREADS = 96
CHUNK_ITERS = -(-SUB_CHUNKS // COMM_THREADS)
