"""benchmarks/tma_desc_probe.py: its report names the promotion field and the encoding the
DSL's descriptor equals; its DSL half compiles without a GPU."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("tma_desc_probe",
                                              ROOT / "benchmarks" / "tma_desc_probe.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def _encodings(at: int = 10) -> dict:
    base = bytes(range(128))
    return {n: base[:at] + bytes([i << 4]) + base[at + 1:] for i, n in enumerate(probe.PROMOTIONS)}


def test_report_names_the_equal_encoding():
    d = _encodings()
    row = probe.report(d, d["256B"])
    assert row["field_bytes"] == [10]
    assert row["field_values"]["128B"] == [32]
    assert (row["dsl_equals"], row["dsl_field_values"]) == ("256B", [48])


def test_report_lists_where_the_dsl_differs_from_every_encoding():
    d = _encodings()
    dsl = bytearray(d["none"])
    dsl[40] ^= 0xFF
    row = probe.report(d, bytes(dsl))
    assert row["dsl_equals"] is None
    assert row["dsl_differs_from_none_at"] == [(40, 40, 40 ^ 0xFF)]


def test_probe_compiles():
    pytest.importorskip("cutlass")
    assert probe.compile_probe() is not None


def test_the_knob_s_probes_compile():
    """One per promotion: ``launch.tma_descs.encode``'s descriptor copied out of the kernel
    parameter it travels in."""
    pytest.importorskip("cutlass")
    assert set(probe.compile_knob_probes()) == set(probe.PROMOTIONS)


def test_driver_arguments_convert():
    """The binding takes the encode's arguments (no TypeError); without a driver library
    (CI) or with address 0 the call itself then fails."""
    pytest.importorskip("cuda.bindings.driver")

    class FakeX:
        shape = (512, 1024)

        def data_ptr(self):
            return 0

        def element_size(self):
            return 2

    try:
        probe.driver_descs(FakeX())
    except TypeError as e:
        pytest.fail(f"argument conversion: {e}")
    except Exception:
        pass  # no driver here, or address 0 refused: the arguments got through
