"""benchmarks/attention_sweep.py --smoke: the sweep's code paths on CPU (Pallas interpret
mode, one tiny shape): the default tiling, a swept one, the no-dropout and XLA rows, each
compared with the default's output and gradients, the summary and the files."""

from __future__ import annotations

import importlib.util
import json

from tests.conftest import REPO


def _sweep_module():
    spec = importlib.util.spec_from_file_location("attention_sweep",
                                                  REPO / "benchmarks/attention_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flops_count_flash_attention_2s_convention():
    sweep = _sweep_module()
    fwd, bwd = sweep.flops((256, 128, 12, 64))
    assert fwd == 4 * 256 * 12 * 128 * 128 * 64 and bwd == 2.5 * fwd


def test_smoke_sweep(tmp_path, capsys):
    sweep = _sweep_module()
    assert sweep.main(["--smoke", f"--out={tmp_path}", "--shapes=base128"]) == 0
    text = capsys.readouterr().out
    data = json.loads((tmp_path / "sweep.json").read_text())
    assert (tmp_path / "sweep.txt").read_text().splitlines()[0].startswith(
        "== attention sweep: cpu")
    rows = [r for r in data["rows"] if "summary" not in r]
    by_note = {(r["path"], r["dropout"], r["note"]): r for r in rows}
    assert set(by_note) >= {("pallas", 0.1, "default"), ("pallas", 0.1, "sweep"),
                            ("pallas", 0.0, "no dropout"), ("xla", 0.1, "")}
    for r in rows:
        assert "error" not in r, r
        assert r["fwd_ms"] > 0 and r["fwd_bwd_ms"] > 0, r
    assert by_note["pallas", 0.1, "sweep"]["options"] == {"pallas_bwd_block_q": 16}
    # Against the default tiling's output and gradients at the same dropout rate (the first
    # row measured at it): a tiling changes only the summation order, the XLA path (same
    # hash mask) agrees to bf16 rounding. A wrong mask or tiling is off by O(1).
    assert "err" not in by_note["pallas", 0.1, "default"]
    assert by_note["pallas", 0.1, "sweep"]["err"] < 1e-2
    assert 0 < by_note["xla", 0.1, ""]["err"] < 2e-2
    summary, = [r["summary"] for r in data["rows"] if "summary" in r]
    assert summary["shape_name"] == "base128" and summary["default_ms"] > 0
    assert "== best Pallas tiling per shape (fwd+bwd, dropout 0.1) ==" in text
    best_line = text.split("== best Pallas tiling per shape", 1)[1].splitlines()[1]
    assert best_line.startswith("base128: ")
    if summary["best"]:
        assert "--config.model.pallas_bwd_block_q=16" in best_line
