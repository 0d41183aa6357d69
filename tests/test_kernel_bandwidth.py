"""benchmarks/kernel_bandwidth.py: the minimum bytes by hand; --smoke on CPU (Pallas interpret
mode) runs every grid tuning of the GELU and residual + LayerNorm kernels and finds each
one's outputs equal to the default tuning's (bit for bit where only the launch changes, else
within the stated bounds); the check rejects a wrong output."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest

from bert_jax.models.kernels import gelu, residual_norm
from tests.conftest import load_script


def _bench():
    return load_script("benchmarks/kernel_bandwidth.py")


def test_minimum_bytes_by_hand():
    bench = _bench()
    # BERT-Base 256 x 128: 32,768 tokens, hidden 768, FFN 3072, bf16 activations.
    # GELU backward: p, g read, dh written (3 x 32768 x 3072 x 2 = 603,979,776) + bias
    # read and db written in float32 (2 x 3072 x 4 = 24,576).
    assert bench.kernel_bytes("gelu_bwd", 32768, 768, 3072, False) == 604_004_352
    # With the GELU's output (BERT-Large under remat, 4096 wide): one more [R, F] bf16.
    assert bench.kernel_bytes("gelu_bwd", 32768, 1024, 4096, True) == (
        4 * 32768 * 4096 * 2 + 2 * 4096 * 4)
    # LayerNorm forward: p, residual read, y, z written (4 x 32768 x 768 x 2 = 201,326,592),
    # the [4, 768] float32 vectors (12,288), mean and rstd float32 (2 x 32768 x 4 = 262,144).
    assert bench.kernel_bytes("norm_fwd", 32768, 768, 3072, False) == 201_601_024
    # LayerNorm backward: 2 cotangents and z read, d_residual and d_p written
    # (5 x 50,331,648 = 251,658,240), mean and rstd read (262,144), the vectors read and
    # their gradient written (2 x 12,288 = 24,576).
    assert bench.kernel_bytes("norm_bwd", 32768, 768, 3072, False) == 251_944_960


def test_peak_by_device_kind():
    bench = _bench()
    assert bench.peak_tbps("NVIDIA H200", None) == 4.8
    assert bench.peak_tbps("NVIDIA H100 80GB HBM3", None) == 3.35
    assert bench.peak_tbps("cpu", None) is None and bench.peak_tbps("cpu", 1.5) == 1.5


def test_grids_are_small_valid_tunings():
    bench = _bench()
    for kernel, grid in bench.GRIDS.items():
        assert 0 < len(grid) <= 24, kernel
        tunings = [bench.tuning_of(kernel, o) for o in grid]
        assert len(set(tunings)) == len(tunings), kernel  # no tuning twice
    with pytest.raises(ValueError, match="GeluTuning.cols=384"):
        gelu.GeluTuning(cols=384)
    with pytest.raises(ValueError, match="NormTuning.bwd_chunk=384: a power of two"):
        residual_norm.NormTuning(bwd_chunk=384)
    with pytest.raises(ValueError, match="bwd_step <= bwd_rows"):
        residual_norm.NormTuning(bwd_rows=4, bwd_step=8)


def test_smoke_runs_every_grid_tuning_against_the_default(tmp_path, capsys):
    bench = _bench()
    out = tmp_path / "rows.json"
    assert bench.main(["--smoke", f"--json={out}"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("== kernel bandwidth: cpu")
    rows = json.loads(out.read_text())["rows"]
    assert not [r for r in rows if r.get("error") or r.get("rejected")]
    ((n, hidden, ffn, _),) = bench.SMOKE_CASES.values()
    for kernel, grid in bench.GRIDS.items():
        mine = [r for r in rows if r["kernel"] == kernel and r["path"] == "pallas"]
        default = bench.effective(kernel, bench.tuning_of(kernel, {}), n, hidden, ffn)
        launches = {bench.effective(kernel, bench.tuning_of(kernel, o), n, hidden, ffn)
                    for o in grid} - {default}
        # every distinct launch of the grid ran, checked, then timed
        assert {tuple(r["launch"]) for r in mine if r["overrides"]} == launches, kernel
        assert len(launches) >= len(grid) - 2, kernel  # the smoke shapes keep them apart
        assert all(r["us"] > 0 and r["exact"] in (True, False) for r in mine if r["overrides"])
    by_label = {(r["kernel"], r["tuning"]): r for r in rows if r["path"] == "pallas"}
    # Triton's warps do not exist in interpret mode: the same program, bit for bit
    for key in (("gelu_bwd", "num_warps=8"),
                ("norm_fwd", "fwd_rows=8,fwd_num_warps=8"),
                ("norm_bwd", "bwd_step=8,bwd_num_warps=16")):
        assert by_label[key]["exact"] is True, key
    assert "== best per case and kernel" in text


def test_check_accepts_reordered_sums_and_rejects_a_wrong_block():
    bench = _bench()
    n, hidden, ffn = 64, 128, 256
    (p, b, g), _ = bench.inputs("gelu_bwd", n, hidden, ffn)
    dh, db = gelu.gelu_backward(p, b, g, interpret=True)
    assert bench.check("gelu_bwd", (dh, db), (dh, db), None) is None
    # a float32 sum of 64 terms in another order: within 2 n 2^-24 sum|dh|
    reordered = jnp.sum(dh[::-1].astype(jnp.float32), 0)
    assert bench.check("gelu_bwd", (dh, db), (dh, reordered), None) is None
    wrong_db = db.at[3].add(1e-3 * jnp.max(jnp.abs(db)))
    assert "db off by" in bench.check("gelu_bwd", (dh, db), (dh, wrong_db), None)
    bits = jax.lax.bitcast_convert_type(dh, jnp.uint16)
    ulp = jax.lax.bitcast_convert_type(bits.at[5, 7].add(1), dh.dtype)  # one bf16 step
    assert "dh not bit for bit" in bench.check("gelu_bwd", (dh, db), (ulp, db), None)

    ops, _ = bench.inputs("norm_bwd", n, hidden, ffn)
    want = residual_norm.backward(*ops, rate=bench.RATE, interpret=True)
    assert bench.check("norm_bwd", want, want, ops) is None
    block = want[0].at[8:16].set(0)  # one program's rows never written
    assert "d_residual off by" in bench.check("norm_bwd", want, (block, *want[1:]), ops)
    fwd_ops, _ = bench.inputs("norm_fwd", n, hidden, ffn)
    y, z, mean, rstd = residual_norm.forward(*fwd_ops, rate=bench.RATE, eps=bench.EPS,
                                             interpret=True)
    assert bench.check("norm_fwd", (y, z, mean, rstd), (y, z, mean, rstd), None) is None
    assert "rstd off by" in bench.check("norm_fwd", (y, z, mean, rstd),
                                        (y, z, mean, rstd * (1 + 1e-3)), None)
