"""benchmarks/attention_sweep.py: --smoke on CPU (Pallas interpret mode, one tiny shape, both
row layouts): the candidates' rows, each hash-mask row against the XLA path's output and
gradients, the table, the files; and auto_rule on hand-made rows."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_script


def _sweep_module():
    return load_script("benchmarks/attention_sweep.py")


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
    rows = {(r["layout"], r["path"], r["dropout"], r["note"]): r for r in data["rows"]}
    for layout in ("padded", "packed"):
        assert {k[1:] for k in rows if k[0] == layout} == {
            ("xla", 0.1, "reference"), ("pallas", 0.1, "default"), ("pallas", 0.0, "hash cost"),
            ("pallas", 0.1, "tiling")}
        for key, r in rows.items():
            assert "error" not in r and r["ms"] > 0, r
        # Against the XLA path's output and gradients at the same dropout (the same hash
        # masks): bf16 rounding only; a wrong mask or tiling is off by O(1).
        assert "err" not in rows[layout, "xla", 0.1, "reference"]
        assert 0 < rows[layout, "pallas", 0.1, "default"]["err"] < 2e-2
        assert rows[layout, "pallas", 0.1, "tiling"]["options"] == {"pallas_bwd_block_q": 16}
        assert 0 < rows[layout, "pallas", 0.1, "tiling"]["err"] < 2e-2
    assert "== auto_rule: training (dropout 0.1)" in text
    verdicts = data["auto_rule"]
    assert set(verdicts) == {"base128/padded", "base128/packed"}
    assert all(v["path"] in ("xla", "pallas") and v["today"] == "pallas"
               for v in verdicts.values())


def _row(path, ms, layout="padded", dropout=0.1, err=0.0, **kw):
    row = dict(path=path, ms=ms, layout=layout, dropout=dropout, shape_name="base128",
               shape=[256, 128, 12, 64], options=kw.pop("options", {}), **kw)
    if err is not None:
        row["err"] = err
    return row


@pytest.mark.parametrize("rows, want", [
    # the fastest hash-mask candidate within tolerance: a tiling of ours
    ([_row("xla", 5.0, err=None), _row("pallas", 2.0),
      _row("pallas", 1.5, options={"pallas_bwd_num_warps": 8}),
      _row("pallas", 1.0, err=0.5),  # wrong: off the reference
      _row("cudnn", 1.4, packed_layout="bias", err=None)], ("pallas", 1.5)),
    # cuDNN's dropout only when it beats that by more than the margin
    ([_row("xla", 5.0, err=None), _row("pallas", 2.0),
      _row("cudnn", 1.7, packed_layout="bias", err=None)], ("cudnn", 1.7)),
    # rows without dropout never decide a training path
    ([_row("xla", 5.0, err=None), _row("pallas", 2.0), _row("pallas", 0.5, dropout=0.0),
      _row("cudnn", 0.4, dropout=0.0)], ("pallas", 2.0)),
])
def test_auto_rule(rows, want):
    sweep = _sweep_module()
    verdict = sweep.auto_rule(rows)[("base128", "padded")]
    assert (verdict["path"], verdict["ms"]) == want
    assert verdict["today"] == "pallas"
    lines = sweep.verdict_lines(rows)
    assert lines[-1].startswith(f"base128: 12 layers x {want[1]:.3f} ms = ")
    assert lines[-1].endswith("(target <= 4.0 ms: not met)") == (12 * want[1] > 4.0)


def test_the_gpu_plan_puts_every_candidate_before_the_tilings():
    # What one GPU call runs (attention_sweep.main's order): every shape's and layout's
    # fixed candidates, cuDNN's included, then the tilings (padded rows of TILED), so that a
    # deadline drops tilings first.
    sweep = _sweep_module()
    fixed, tilings = [], []
    for name in sweep.SHAPES:
        for layout in sweep.LAYOUTS:
            f, t = sweep.candidates(name, layout, gpu=True, smoke=False)
            fixed += [(name, layout, c["path"], c["dropout"], c.get("packed_layout"))
                      for c in f]
            tilings += [(name, layout, tuple(c["options"])) for c in t]
    per_layout = {("xla", 0.1, None), ("pallas", 0.1, None), ("pallas", 0.0, None),
                  ("cudnn", 0.0, None), ("cudnn", 0.1, "bias")}
    for name in sweep.SHAPES:
        assert {r[2:] for r in fixed if r[:2] == (name, "padded")} == per_layout
        assert {r[2:] for r in fixed if r[:2] == (name, "packed")} == per_layout | {
            ("cudnn", 0.1, "segments")}
    assert len(fixed) == 44
    assert {(n, layout) for n, layout, _ in tilings} == {("base128", "padded"),
                                                          ("large512", "padded")}
    assert len(tilings) == len(sweep.TILINGS[128]) + len(sweep.TILINGS[512]) == 7
    # every tiling key is a model config key that reaches the kernel
    from bert_jax.models import BertConfig

    for options in list(sweep.TILINGS[128]) + list(sweep.TILINGS[512]):
        assert set(BertConfig(**options).pallas_options) == {
            sweep.OPTION_ARGS[k] for k in options}
