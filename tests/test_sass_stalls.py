"""benchmarks/sass_stalls.py: an mbarrier try-wait loop's samples count as a wait, the rest
by what each instruction does."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("sass_stalls", ROOT / "benchmarks" / "sass_stalls.py")
sass_stalls = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sass_stalls)

HEAD = ('"Address","Source","# Samples","Instructions Executed","stall_long_sb",'
        '"stall_barrier","stall_long_sb (Not Issued)"')


def _csv(tmp_path, rows):
    body = "\n".join(",".join(f'"{x}"' for x in r) for r in rows)
    f = tmp_path / "src.csv"
    f.write_text('"Kernel Name","k"\n' + HEAD + "\n" + body + "\n")
    return str(f)


def test_categories_and_top(tmp_path, capsys):
    path = _csv(tmp_path, [
        ("0x0", "SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR5], R24", 1, 10, 0, 0, 0),
        ("0x10", "R2UR UR12, R138", 2, 10, 0, 0, 0),
        ("0x20", "@!P0  BRA 0x100", 30, 10, 30, 0, 30),
        ("0x30", "HGMMA.64x224x16.F32.BF16 R24, gdesc[UR12], R24", 5, 10, 0, 0, 0),
        ("0x40", "WARPGROUP.DEPBAR.LE gsb0, 0x1", 7, 10, 0, 7, 0),
        ("0x50", "F2FP.BF16.F32.PACK_AB R117, R115, R114", 3, 10, 0, 0, 0),
        ("0x60", "STSM.16.M88.4 [R16+0x2b400], R108", 4, 10, 0, 0, 0),
    ])
    rows = sass_stalls.read_rows(path)
    assert [r["samples"] for r in rows] == [1, 2, 30, 5, 7, 3, 4]
    assert rows[2]["stalls"] == {"long_sb": 30, "barrier": 0}  # not-issued columns left out
    got = sass_stalls.categorize(rows)
    assert got["mbarrier wait"] == 31 and got["wgmma issue"] == 5 and got["wgmma wait"] == 7
    assert got["epilogue convert"] == 3 and got["epilogue smem store"] == 4
    assert got["other"] == 2 and sum(got.values()) == 52
    assert sass_stalls.main([path, "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "52 warp samples" in out and "mbarrier wait" in out
    assert out.index("@!P0  BRA 0x100") < out.index("WARPGROUP.DEPBAR")  # most samples first
    assert "R2UR" not in out  # no context unless asked


def test_context_lines_precede_each_top_instruction(tmp_path, capsys):
    path = _csv(tmp_path, [
        ("0x0", "LDG.E.64 R2, desc[UR4][R4.64]", 0, 4, 0, 0, 0),
        ("0x10", "R2UR UR18, R2", 1, 4, 0, 0, 0),
        ("0x20", "UISETP.NE.U32.AND UP0, UPT, UR18, 0x6, UPT", 9, 4, 9, 0, 0),
    ])
    assert sass_stalls.main([path, "--top", "1", "--context", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    top = next(i for i, line in enumerate(out) if "UISETP" in line)
    assert "LDG.E.64" in out[top + 1] and "R2UR" in out[top + 2] and "0x0" in out[top + 1]


def test_no_rows_is_an_error(tmp_path, capsys):
    assert sass_stalls.main([_csv(tmp_path, [])]) == 1
    assert "no instruction rows" in capsys.readouterr().err
