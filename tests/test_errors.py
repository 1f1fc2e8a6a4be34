"""What a timed-out kernel wait tells the user."""
from rsar_core import RsarTimeoutError


def test_timeout_message_names_the_peer_and_what_it_never_sent():
    tile = str(RsarTimeoutError(rank=0, tile=7, src=1, epoch=89, kind=1))
    assert "rank 0 timed out waiting for rank 1 (partial tile, tile 7, launch 89)" in tile
    start = RsarTimeoutError(rank=1, tile=-1, src=0, epoch=3, kind=3)
    assert "rank 1 timed out waiting for rank 0 (start of this launch, launch 3)" in str(start)
    assert (start.rank, start.src, start.tile, start.kind) == (1, 0, -1, 3)
    assert "kind 9" in str(RsarTimeoutError(rank=0, tile=0, src=1, epoch=0, kind=9))
