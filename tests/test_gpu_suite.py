"""benchmarks/gpu_suite.py, the one command a GPU session runs: its --smoke mode goes through
the same code paths on CPU (children per measurement, the table, the profile, the files
under --out) with TensorFlow unimportable, as on the GPU image."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, load_script

CASES = {"base128": (4, 32, 5), "large128": (4, 32, 5), "large512": (2, 64, 10),
         "packed512": (2, 512, 77)}

# Any `import tensorflow` (even one caught by a library probing for it) leaves a marker.
_TF_BLOCKER = """import os, traceback
with open(os.environ["GPU_SUITE_TF_MARKER"], "a") as f:
    f.write("".join(traceback.format_stack()) + "\\n")
raise ImportError("tensorflow is blocked by tests/test_gpu_suite.py")
"""


# bert_jax's dependencies that the GPU image (jax, flax, optax, orbax, torch, transformers;
# ml_collections carried in) lacks: the first GPU session lost a call to a child's
# `import google_crc32c` through the pre-training task's data module.
_NOT_ON_GPU_IMAGE = ("google_crc32c", "sentencex", "sentencepiece", "tensorflow_datasets")


def _suite_module(name: str):
    """benchmarks/gpu/<name>.py, imported as benchmarks/gpu_suite.py imports it (loading the
    script puts benchmarks/ on sys.path)."""
    load_script("benchmarks/gpu_suite.py")
    return importlib.import_module(f"gpu.{name}")


def _positive(text: str) -> float:
    value = float(text.rstrip("%x"))
    assert value > 0 and math.isfinite(value), text
    return value


@pytest.mark.slow  # ~3-5 min on two shared cores: a dozen child processes
def test_smoke_run(tmp_path):
    block = tmp_path / "no_tf" / "tensorflow"
    block.mkdir(parents=True)
    (block / "__init__.py").write_text(_TF_BLOCKER)
    for name in _NOT_ON_GPU_IMAGE:  # the suite must run without them, as on the GPU image
        (block.parent / name).mkdir()
        (block.parent / name / "__init__.py").write_text(
            f"raise ImportError('{name} is blocked by tests/test_gpu_suite.py')\n")
    marker = tmp_path / "tf_imported.txt"
    env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2",
               GPU_SUITE_TF_MARKER=str(marker),
               PYTHONPATH=os.pathsep.join(filter(None, [str(block.parent), str(REPO),
                                                        os.environ.get("PYTHONPATH")])))
    env.pop("OUT", None)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_suite.py", "--smoke", f"--out={out}",
         "--variants=base128:attention=xla;base128:remat=bogus;large128:no_such_key=1"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    text = proc.stdout
    assert proc.returncode == 0, (text[-3000:], proc.stderr[-3000:])
    assert not marker.exists(), marker.read_text()[-3000:]
    assert "tensorflow modules loaded by the children: none" in text

    # The kernel check ran first: the Pallas kernels (interpret mode here) against the XLA
    # path, float32 to rounding (float32 sums of 64 rows in another order: 2e-5 of the
    # largest bias gradient), bfloat16 to a few bf16 ulps.
    checks = {(c["path"], c["dtype"], c["dropout"]): c for c in
              json.loads((out / "gpu_suite.json").read_text())["checks"]["checks"]}
    # Then the rows that check cuDNN's own dropout on a GPU, here against the stand-in (the
    # XLA path with the hash dropout): padded rows, packed rows as a bias and as segments.
    standin = {(p, "bfloat16", 0.1) for p in (
        "cudnn stand-in", "cudnn stand-in bias", "cudnn stand-in segments")}
    assert set(checks) == standin | {(p, d, r) for d in ("float32", "bfloat16") for p, r in (
        ("pallas", 0.1), ("pallas", 0.0), ("residual_norm", 0.1), ("residual_norm", 0.0),
        ("gelu", 0.0))}
    for (path, dtype, _), c in checks.items():
        assert "error" not in c, c  # the stand-in's masks pass the statistics too
        limit = 2e-2 if dtype == "bfloat16" else 1e-5 if path == "pallas" else 2e-5
        assert c["out_err"] < limit and c["grad_err"] < limit, c
    assert "  pallas        float32   dropout 0.1  output " in text
    assert "  residual_norm bfloat16  dropout 0.1  output " in text
    assert "  cudnn stand-in segments bfloat16  dropout 0.1  output " in text

    # The table: one default row per case with bert_jax and torch numbers, the variants.
    table = text.split("== Results:", 1)[1].split("\n\n", 1)[0].splitlines()
    rows = {}
    for line in table[3:]:
        cells = line.split()
        if cells and cells[0] in CASES:
            rows[(cells[0], cells[1])] = cells
    for case in CASES:
        cells = rows[(case, "default")]
        assert len(cells) == 14, cells
        assert cells[2] == "auto->xla", cells
        # the configs' scan_unroll "auto" unrolls on CPU (and GPU)
        assert cells[3] == ("none" if case == "base128" else "minimal_ffn") + \
            "+scan(unroll=0)", cells
        jax_ms, jax_seq, tok_s, mfu, first = map(_positive, cells[4:9])
        assert cells[7].endswith("%") and mfu < 100, cells
        if case == "packed512":  # no torch rows for packed rows
            assert cells[9:] == ["n/a", "n/a", "n/a", "-", "-"], cells
            continue
        torch_ms, torch_seq = map(_positive, cells[9:11])
        assert cells[11] == "n/a" and cells[13] == "-", cells  # no torch.compile in smoke
        _positive(cells[12])  # the ratio; checked against the JSON's figures below
        batch, seq = CASES[case][:2]
        for seq_s, ms in ((jax_seq, jax_ms), (torch_seq, torch_ms)):  # both printed to 0.1
            # seq/s is off by at most 0.05 for its own rounding, plus what ms's rounding
            # (0.05) moves batch / ms: batch * 1e3 * 0.05 / ms^2 (large when steps are fast).
            bound = 0.051 + batch * 1e3 * 0.0501 / (ms - 0.05) ** 2
            assert abs(seq_s - batch / ms * 1e3) <= bound, cells
        assert abs(tok_s - jax_seq * seq) <= 0.5 + 0.051 * seq, cells  # every token real
    xla = rows[("base128", "attention=xla")]
    assert xla[2] == "xla->xla" and len(xla) == 11, xla
    assert all(_positive(x) for x in xla[4:9]) and xla[10] == "-", xla  # ratio to eager
    bogus = rows[("base128", "remat=bogus")]
    assert bogus[4] == "ERR[1]", bogus  # a failed cell; the suite went on
    assert "[1] base128 bert_jax remat=bogus: ConfigError: BertConfig.remat='bogus'" in text
    # A key the model does not have fails its row before anything is built (model.fp8
    # before the checkout has the FP8 option), rather than running the default silently.
    unknown = rows[("large128", "no_such_key=1")]
    assert unknown[4].startswith("ERR["), unknown
    assert ("large128 bert_jax no_such_key=1: ConfigError: model.no_such_key is neither a key "
            "of configs/bert_large.py's model section nor a BertConfig field") in text
    # Under the table, a GEMM census per bert_jax row (a CPU compile has no GPU GEMMs).
    for case in CASES:
        assert (f"GEMMs autotuned: {case} default: 0 of 0 (no GPU GEMM kernels in this "
                "compile)") in text
    assert "GEMMs autotuned: base128 remat=bogus: -" in text

    # The profile of base128: XLA:CPU ops of 3 traced steps stand for the device kernels.
    profile = text.split("== Profile: base128 bert_jax default, 3 traced steps ==", 1)[1]
    assert "host threads' XLA ops" in profile, profile[:2000]
    kernels = profile.split("calls/step", 1)[1].split("\n", 1)[1].split("\n\n", 1)[0]
    kernels = kernels.splitlines()
    assert 5 <= len(kernels) <= 15, kernels
    shares = [float(k.split()[-1]) for k in kernels]
    assert all(_positive(k.split()[-3]) for k in kernels)
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 100.1, shares

    # The files under --out: few, small, and the report as printed.
    files = sorted(os.listdir(out))
    assert files == ["base128.xplane.pb", "base128_trace.json.gz", "gpu_suite.json",
                     "gpu_suite.txt", "gpu_suite_children.log"], files
    assert all(os.path.getsize(out / f) < 16 * 2 ** 20 for f in files)
    assert (out / "gpu_suite.txt").read_text() == text
    with gzip.open(out / "base128_trace.json.gz", "rt") as f:
        assert json.load(f)["traceEvents"]
    data = json.loads((out / "gpu_suite.json").read_text())
    header = data["header"]
    assert header["smoke"] is True and header["device_kind"] == "cpu", header
    assert (header["steps"], header["warmup"]) == (2, 1)
    assert header["jax"] and header["torch"] and header["transformers"], header
    assert "--smoke" in header["argv"] and header["tensorflow_modules"] == []
    by_kind = {}
    for r in data["rows"]:
        assert r["tensorflow_modules"] == [], r
        by_kind[(r["case"], r["kind"], r["variant"])] = r
    assert len(data["rows"]) == 10, sorted(by_kind)
    for case, (batch, seq, preds) in CASES.items():
        ours = by_kind[(case, "bert_jax", "default")]
        theirs = by_kind.get((case, "torch_eager", "eager"), {})
        for r in (ours, theirs) if theirs else (ours,):
            assert (r["batch"], r["seq"], r["preds"]) == (batch, seq, preds), r
            assert r["config"] == "configs/bert_tiny.py" and "error" not in r, r
            assert len(r["step_ms"]) == 2 and all(t > 0 for t in r["step_ms"]), r
            assert 8 < r["loss"] < 14, r  # ~ln(30522) + ln(2) at init
            # From the child's start to its first step's end: more than the step itself.
            assert r["first_step_s"] > r.get("compile_s", r.get("compile_step_s")) > 0, r
        assert abs(ours["rows_per_s"] - batch / ours["ms_per_step"] * 1e3) < 1e-6 * batch * 1e3
        assert ours["first_step_s"] > ours["init_s"] + ours["compile_s"], ours
        assert rows[(case, "default")][4] == f"{ours['ms_per_step']:.1f}"
        assert rows[(case, "default")][8] == f"{ours['first_step_s']:.1f}"
        assert ours["model"] == dict(num_hidden_layers=2, hidden_size=128, num_attention_heads=2,
                                     intermediate_size=512, vocab_size=30522), ours
        assert ours["dtype"] == "bfloat16" and ours["attention_resolved"] == "xla", ours
        assert ours["scan_layers"] is True and ours["scan_unroll"] == 0, ours
        assert 0 < ours["mfu"] < 1 and ours["flops_per_example"] > 0 and ours["compile_s"] > 0
        assert ours["init_s"] > 0
        assert ours["gemms"] == dict(gemms=0, autotuned=0, fp8=0, by_backend={}, configs={})
        assert f"first step, {case}: bert_jax default {ours['first_step_s']:.1f} s" in text
        if case == "packed512":
            continue
        assert abs(ours["seq_per_s"] - ours["rows_per_s"]) < 1e-6 * ours["rows_per_s"], ours
        assert ours["padding"] == 0 and ours["sequences_per_row"] == 1, ours
        assert ours["n_params"] == theirs["n_params"], (ours, theirs)  # the same model
        assert abs(theirs["seq_per_s"] - batch / theirs["ms_per_step"] * 1e3) < 1e-6 * batch * 1e3
        assert rows[(case, "default")][12] == f"{ours['seq_per_s'] / theirs['seq_per_s']:.2f}x"
        assert rows[(case, "default")][10] == f"{theirs['seq_per_s']:.1f}"
        assert theirs["attn_implementation"] == "sdpa" and theirs["autocast"] == "off", theirs
        assert theirs["fused_adamw"] is False and theirs["labels_per_row"] == preds, theirs
        assert f"HF torch eager {theirs['first_step_s']:.1f} s (the step alone" in text

    # packed512: the held-out sample's rows, as data_prep packs them; sequences and real
    # tokens a second from the two batches the steps alternate.
    ours = by_kind[("packed512", "bert_jax", "default")]
    host = _suite_module("packed").batches(
        _suite_module("packed").heldout_rows(512, preds=77, k=3), 2)
    sequences = sum(b["next_sentence_weights"].sum() for b in host) / 2
    tokens = sum(b["input_mask"].sum() for b in host) / 2
    assert sequences > 2, sequences  # the rows of these batches hold several sequences
    step_s = ours["ms_per_step"] / 1e3
    assert ours["seq_per_s"] == pytest.approx(sequences / step_s, rel=1e-6)
    assert ours["tokens_per_s"] == pytest.approx(tokens / step_s, rel=1e-6)
    assert ours["sequences_per_row"] == pytest.approx(sequences / 2, rel=1e-6)
    assert ours["padding"] == pytest.approx(1 - tokens / (2 * 512), rel=1e-6)
    assert ours["packed"] == 3 and ours["heldout_rows"] > 100, ours
    assert (f"packed512: 2 rows of 512 tokens a step, packed with up to 3 sequences of the "
            f"held-out sample ({ours['heldout_rows']} rows): {sequences / 2:.2f} sequences "
            f"per row") in text
    assert by_kind[("base128", "bert_jax", "attention=xla")]["overrides"] == {"attention": "xla"}
    assert by_kind[("base128", "bert_jax", "remat=bogus")]["remat"] == "bogus"
    profile = data["profile"]
    assert profile["case"] == "base128" and profile["events"] > 0, profile
    assert profile["kernels"][0]["ms_per_step"] > 0 and profile["device_ms_per_step"] > 0


def test_top_kernels_reads_gpu_stream_lines(tmp_path):
    """The GPU trace layout (xprof's trace viewer JSON): kernels come from the device
    process's "Stream #" lines, not its derived XLA Ops line nor the host's events."""
    suite = _suite_module("profile")
    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 2, "tid": 7, "name": "thread_name",
         "args": {"name": "Stream #7(Compute)"}},
        {"ph": "M", "pid": 2, "tid": 8, "name": "thread_name",
         "args": {"name": "Stream #8(MemcpyH2D)"}},
        {"ph": "M", "pid": 2, "tid": 9, "name": "thread_name", "args": {"name": "XLA Ops"}},
        {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 900.0, "name": "PjitFunction(step)",
         "args": {"hlo_op": "x"}},
        {"ph": "X", "pid": 2, "tid": 9, "ts": 0, "dur": 500.0, "name": "fusion.1"},
    ]
    for i in range(3):  # 3 steps: one gemm (300 us), two fusions (50 us), one copy (20 us)
        events += [
            {"ph": "X", "pid": 2, "tid": 7, "ts": i, "dur": 300.0,
             "name": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64" + "x" * 40},
            {"ph": "X", "pid": 2, "tid": 7, "ts": i, "dur": 25.0, "name": "loop_add_fusion"},
            {"ph": "X", "pid": 2, "tid": 7, "ts": i, "dur": 25.0, "name": "loop_add_fusion"},
            {"ph": "X", "pid": 2, "tid": 8, "ts": i, "dur": 20.0, "name": "MemcpyH2D"}]
    path = tmp_path / "perfetto_trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": events}, f)
    k = suite.top_kernels(str(path), steps=3)
    assert k["source"] == "device stream lines", k
    assert k["lines"] == ["Stream #7(Compute)", "Stream #8(MemcpyH2D)"]
    assert k["events"] == 12 and abs(k["device_ms_per_step"] - 0.37) < 1e-9, k
    names = [x["name"] for x in k["kernels"]]
    assert names[0].startswith("sm90_xmma_gemm") and names[1:] == ["loop_add_fusion",
                                                                   "MemcpyH2D"], names
    gemm, fusion, copy = k["kernels"]
    assert abs(gemm["ms_per_step"] - 0.3) < 1e-9 and gemm["calls_per_step"] == 1.0
    assert abs(fusion["ms_per_step"] - 0.05) < 1e-9 and fusion["calls_per_step"] == 2.0
    assert abs(gemm["pct"] + fusion["pct"] + copy["pct"] - 100) < 1e-9
    assert abs(gemm["pct"] - 100 * 0.3 / 0.37) < 1e-9
    kinds = {x["kind"]: x for x in k["kinds"]}
    assert [x["kind"] for x in k["kinds"]] == ["matmul", "elementwise fusion", "memcpy / memset"]
    assert abs(kinds["matmul"]["ms_per_step"] - 0.3) < 1e-9
    assert kinds["elementwise fusion"]["calls_per_step"] == 2.0
    assert abs(sum(x["pct"] for x in k["kinds"]) - 100) < 1e-9


def test_kernel_kinds_of_gpu_kernel_names():
    suite = _suite_module("profile")
    kinds = {name: suite.kernel_kind(name) for name in (
        "flash_attention_bwd_dkdv", "cudnn_generated_fort_native_sdpa_sm90_flash_fprop",
        "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNN", "gemm_fusion_dot_general_12",
        "sm90_xmma_gemm_bf16bf16_bf16f32", "input_scatter_fusion", "input_add_reduce_fusion_7",
        "loop_multiply_fusion_3", "MemcpyD2D", "Memset", "cub_something")}
    assert kinds == {
        "flash_attention_bwd_dkdv": "attention",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop": "attention",
        "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NNN": "matmul",
        "gemm_fusion_dot_general_12": "matmul", "sm90_xmma_gemm_bf16bf16_bf16f32": "matmul",
        "input_scatter_fusion": "scatter / gather",
        "input_add_reduce_fusion_7": "reduction fusion",
        "loop_multiply_fusion_3": "elementwise fusion", "MemcpyD2D": "memcpy / memset",
        "Memset": "memcpy / memset", "cub_something": "other"}


def test_variants_flag():
    suite = _suite_module("suite")
    cases = ["base128", "large128", "large512"]
    got = suite.parse_variants("attention=xla; base128+large512:model.remat=full,"
                               "fused_qkv=true;;large128:hidden_dropout_prob=0.0", cases)
    assert got == [("attention=xla", {"attention": "xla"}, set(cases)),
                   ("remat=full,fused_qkv=True", {"remat": "full", "fused_qkv": True},
                    {"base128", "large512"}),
                   ("hidden_dropout_prob=0.0", {"hidden_dropout_prob": 0.0}, {"large128"})]
    assert suite.parse_variants("", cases) == []
    assert suite.preds_for(128) == 20 and suite.preds_for(512) == 77


def test_xla_flags_variant_reaches_the_child_environment(monkeypatch):
    """A variant's xla_flags go to its child's XLA_FLAGS after the suite's own (XLA takes
    the later of two settings of a flag), never into the model section."""
    suite = _suite_module("suite")
    got = suite.parse_variants(
        "base128:xla_flags=--xla_gpu_enable_latency_hiding_scheduler=true "
        "--xla_gpu_enable_command_buffer=,attention=xla", ["base128", "large128"])
    assert got == [("xla_flags=--xla_gpu_enable_latency_hiding_scheduler=true "
                    "--xla_gpu_enable_command_buffer=,attention=xla",
                    {"xla_flags": "--xla_gpu_enable_latency_hiding_scheduler=true "
                                  "--xla_gpu_enable_command_buffer=", "attention": "xla"},
                    {"base128"})]
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_command_buffer=FUSION")
    children = _suite_module("children")
    env = children.child_env("jax", False, "--xla_gpu_enable_command_buffer=")
    assert env["XLA_FLAGS"] == ("--xla_gpu_enable_command_buffer=FUSION "
                                "--xla_gpu_enable_command_buffer=")
    assert (children.child_env("jax", False)["XLA_FLAGS"]
            == "--xla_gpu_enable_command_buffer=FUSION")


def test_deadline_skips_measurements_and_still_prints_the_table(tmp_path, monkeypatch, capsys):
    """--deadline_s: a measurement that would start with under a minute left is skipped
    (no child is started) and its cell says SKIP, so a run cut to a command's time limit
    still prints its table and its closing line."""
    suite = _suite_module("suite")
    started = []
    monkeypatch.setattr(suite, "spawn", lambda spec, timeout, report: started.append(spec))
    out = tmp_path / "out"
    assert suite.main(["--smoke", f"--out={out}", "--deadline_s=30", "--cases=base128",
                       "--variants=base128:attention=xla"]) == 0
    assert started == []
    text = (out / "gpu_suite.txt").read_text()
    rows = [ln.split() for ln in text.split("== Results:", 1)[1].splitlines()
            if ln.startswith("base128")]
    assert [r[:2] for r in rows] == [["base128", "default"], ["base128", "attention=xla"]]
    assert rows[0][4] == "SKIP[1]" and rows[0][9] == "SKIP[2]", rows
    assert "[1] base128 bert_jax default: skipped: --deadline_s=30 reached" in text
    assert "no trace: skipped: --deadline_s=30 reached" in text
    assert text.rstrip().splitlines()[-1].startswith("total ")


def test_skip_check_starts_no_kernel_check(tmp_path, monkeypatch):
    """--skip_check (a session's later calls): no check child, a line saying so, and the
    measurements still run; --skip_mask_check: the check child without cuDNN's masks."""
    suite = _suite_module("suite")
    kinds = []

    def spawn(spec, timeout, report):
        kinds.append(spec["kind"])
        return {"error": "not run in this test", "wall_s": 0.0}

    monkeypatch.setattr(suite, "spawn", spawn)
    out = tmp_path / "out"
    assert suite.main(["--smoke", f"--out={out}", "--skip_check", "--cases=base128",
                       "--variants=", "--profile_case="]) == 0
    assert kinds == ["info", "jax", "torch"]
    text = (out / "gpu_suite.txt").read_text()
    assert "== Kernel check: skipped (--skip_check) ==" in text
    assert json.loads((out / "gpu_suite.json").read_text())["checks"] == {"skipped": True}
    # --skip_mask_check: the check runs without cuDNN's masks (attention_masks.py ran them).
    specs = []
    monkeypatch.setattr(suite, "spawn", lambda spec, timeout, report: specs.append(spec) or {
        "error": "not run in this test", "wall_s": 0.0})
    assert suite.main(["--smoke", f"--out={out}", "--skip_mask_check", "--cases=base128",
                       "--variants=", "--profile_case="]) == 0
    assert [(s["kind"], s.get("skip_masks")) for s in specs[:2]] == [("info", None),
                                                                     ("check", True)]


def test_torch_compile_follows_eager_in_each_case_and_packed_cases_have_no_torch(
        tmp_path, monkeypatch):
    """Per case: bert_jax's default row, torch eager, torch.compile, then the case's
    variants (torch.compile was never reached within a deadline while it ran last); a
    packed case has no torch rows and tells its child the rows' K."""
    suite = _suite_module("suite")
    specs = []

    def spawn(spec, timeout, report):
        specs.append(spec)
        return {"error": "not run in this test", "wall_s": 0.0}

    monkeypatch.setattr(suite, "spawn", spawn)
    assert suite.main(["--smoke", f"--out={tmp_path}", "--skip_check", "--profile_case=",
                       "--cases=base128,packed512", "--compile_cases=base128",
                       "--variants=attention=xla;packed512:fp8=true"]) == 0
    got = [(s["kind"], s.get("compile", False), s.get("overrides"), s.get("packed"))
           for s in specs]
    assert got == [("info", False, None, None),
                   ("jax", False, {}, 0), ("torch", False, {}, 0), ("torch", True, {}, 0),
                   ("jax", False, {"attention": "xla"}, 0),
                   ("jax", False, {}, 3), ("jax", False, {"attention": "xla"}, 3),
                   ("jax", False, {"fp8": True}, 3)]
    assert [(s["batch"], s["seq"], s["preds"]) for s in specs[1:]] == \
        [(4, 32, 5)] * 4 + [(2, 512, 77)] * 3
    # --eager_cases='' (a short session): torch.compile without its eager row.
    specs.clear()
    assert suite.main(["--smoke", f"--out={tmp_path}", "--skip_check", "--profile_case=",
                       "--cases=base128", "--compile_cases=base128", "--eager_cases=",
                       "--variants=attention=cudnn"]) == 0
    assert [(s["kind"], s.get("compile", False), s.get("overrides")) for s in specs] == [
        ("info", False, None), ("jax", False, {}), ("torch", True, {}),
        ("jax", False, {"attention": "cudnn"})]


def test_the_default_run_is_two_parts(tmp_path):
    """--part=1 / --part=2: the default run's two calls under a 10-minute limit each (the
    FP8 rows last, every eager row, torch.compile for base128 and large512, base128's cuDNN
    row, the kernel check and the profile in part 1 only); flags given explicitly win;
    without --part, everything in one run."""
    suite = _suite_module("suite")
    p = suite.parser("")

    def resolved(*argv):
        args = p.parse_args(list(argv))
        cases = suite.resolve_args(p, args)
        return (cases, args.variants, args.compile_cases, args.profile_case, args.skip_check,
                args.deadline_s)

    assert resolved("--part=1") == (["base128", "large128"],
                                    "base128:attention=cudnn;large128:fp8=true", "base128",
                                    "base128", False, 560.0)
    assert resolved("--part=2") == (["large512", "packed512"],
                                    "large512:fp8=true;packed512:fp8=true", "large512", "",
                                    True, 560.0)
    assert resolved() == (["base128", "large128", "large512", "packed512"],
                          "base128:attention=cudnn;large128:fp8=true;large512:fp8=true;"
                          "packed512:fp8=true", "base128,large128,large512", "base128", False,
                          None)
    assert resolved("--part=2", "--cases=large512", "--variants=", "--deadline_s=500",
                    "--compile_cases=") == (["large512"], "", "", "", True, 500.0)
    assert resolved("--smoke")[2] == ""  # no torch.compile on CPU unless asked
    assert resolved("--variants=extra")[1] == suite.EXTRA_VARIANTS
    # Part 1 puts cuDNN with its own attention dropout (dropout left on) beside base128's
    # default Pallas row, before the FP8 rows; every other variant is an FP8 row of its
    # part's cases.
    for part, (cases, _, _, compiled) in suite.PARTS.items():
        assert set(compiled.split(",")) <= set(cases.split(",")), part
        rows = suite.parse_variants(suite.PART_VARIANTS[part], list(suite.CASES))
        if part == 1:
            assert rows[0] == ("attention=cudnn", {"attention": "cudnn"}, {"base128"})
            rows = rows[1:]
        for _, overrides, only in rows:
            assert overrides == {"fp8": True} and only <= set(cases.split(",")), part


def test_an_override_the_model_lacks_fails_before_anything_is_built():
    """A variant's key that is neither in the config's model section nor a BertConfig
    field is an error (ConfigError, the row's one line), never a silent default run; a
    BertConfig field the config file omits is applied."""
    import dataclasses

    from bert_jax.models import BertConfig, ConfigError

    common = _suite_module("common")
    spec = {"config": "configs/bert_large.py", "smoke": True}
    with pytest.raises(ConfigError, match=r"model\.no_such_key is neither a key of "
                       r"configs/bert_large\.py's model section nor a BertConfig field"):
        common.case_config(dict(spec, overrides={"attention": "xla", "no_such_key": 1}))
    config = common.case_config(dict(spec, overrides={"attention": "xla", "pallas_block_q": 64}))
    assert config.model.attention == "xla" and config.model.pallas_block_q == 64
    assert config.model.hidden_size == 128 and config.model.remat == "minimal_ffn"  # smoke
    fp8 = dict(spec, overrides={"fp8": True})
    if "fp8" in {f.name for f in dataclasses.fields(BertConfig)}:  # the FP8 option is in
        assert common.case_config(fp8).model.fp8 is True
    else:
        with pytest.raises(ConfigError, match=r"model\.fp8 is neither"):
            common.case_config(fp8)


def test_packed_rows_carry_the_held_out_samples_sequences():
    """packed512's rows: the held-out documents' sequences as data_prep makes them, packed
    3 to a row; the same multiset of lengths as the unpacked held-out rows (the quick
    start's evaluation set is built the same way: seed, dupe factor), and batches cut in
    order, cycling when short."""
    import numpy as np

    packed = _suite_module("packed")
    rows = packed.heldout_rows(512, 77, 3)
    flat = packed.heldout_rows(512, 77, 0)
    n = len(rows["input_ids"])
    assert rows["input_ids"].shape == (n, 512) and rows["masked_lm_positions"].shape == (n, 80)
    per_row = (rows["sequence_ids"][..., None] == np.arange(1, 4)).sum(axis=1)  # [n, 3]
    lengths = np.sort(per_row[per_row > 0])
    assert np.array_equal(lengths, np.sort(flat["input_mask"].sum(axis=1)))
    assert np.array_equal((per_row > 0).sum(axis=1), rows["next_sentence_weights"].sum(axis=1))
    assert np.array_equal(per_row.sum(axis=1), rows["input_mask"].sum(axis=1))
    assert len(flat["input_ids"]) / n > 1.5  # at 512 most rows hold more than one sequence
    assert 0 < 1 - rows["input_mask"].mean() < 0.1  # padding after packing
    two = packed.batches(rows, n - 1)
    assert np.array_equal(two[1]["input_ids"][0], rows["input_ids"][n - 1])
    assert np.array_equal(two[1]["input_ids"][1], rows["input_ids"][0])  # cycled
    stats = packed.stats(two[0])
    assert stats["input/sequences"] == rows["next_sentence_weights"][:n - 1].sum()
    assert stats["input/tokens"] == rows["input_mask"][:n - 1].sum()
    # float32 sums, as inside the step: ~3e7 is past float32's exact integers
    assert stats["input/square_lengths"] == pytest.approx(
        (per_row[:n - 1].astype(float) ** 2).sum(), rel=1e-6)


# Lines of an optimized HLO module for a GPU. The first fusion and its computation are
# verbatim (metadata cut) from the step compiled for the H100 target on a CPU host, where
# XLA cannot autotune; the others have the shapes of what a GPU compile writes: Triton tiles
# the autotuner picked, a cuBLAS call with and one without a selected algorithm, and a
# Pallas kernel's custom call, which is not a GEMM.
_HLO = r"""HloModule jit_train_step, entry_computation_layout={()->()}

%gemm_fusion_dot.3_computation (parameter_0.1: bf16[1024,128], parameter_1.1: bf16[128,128]) -> bf16[1024,128] {
  %parameter_0.1 = bf16[1024,128]{1,0} parameter(0)
  %parameter_1.1 = bf16[128,128]{1,0} parameter(1)
  ROOT %dot.84 = bf16[1024,128]{1,0} dot(%parameter_0.1, %parameter_1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}, backend_config={"sizes":["16"]}
}

%gemm_fusion_dot.9_computation (parameter_0.2: bf16[32768,768], parameter_1.2: bf16[768,3072]) -> bf16[32768,3072] {
  %parameter_0.2 = bf16[32768,768]{1,0} parameter(0)
  %parameter_1.2 = bf16[768,3072]{1,0} parameter(1)
  ROOT %dot.90 = bf16[32768,3072]{1,0} dot(%parameter_0.2, %parameter_1.2), lhs_contracting_dims={1}, rhs_contracting_dims={0}, backend_config={"sizes":["64"]}
}

ENTRY %main.1 (p0: bf16[1024,128], p1: bf16[128,128]) -> bf16[1024,128] {
  %gemm_fusion_dot.3 = bf16[1024,128]{1,0} fusion(%bitcast.392.0, %bitcast.391.0), kind=kCustom, calls=%gemm_fusion_dot.3_computation, backend_config={"operation_queue_id":"0","fusion_backend_config":{"kind":"__triton_nested_gemm_fusion","block_level_fusion_config":{"num_warps":"2","output_tiles":[{"sizes":["16","8"]}],"num_ctas":1,"num_stages":1,"is_tma_allowed":false,"is_warp_specialization_allowed":false,"waves_per_eu":0}},"force_earliest_schedule":false,"reification_cost":[],"device_type":"DEVICE_TYPE_INVALID"}
  %gemm_fusion_dot.9 = bf16[32768,3072]{1,0} fusion(%a, %b), kind=kCustom, calls=%gemm_fusion_dot.9_computation, backend_config={"operation_queue_id":"0","fusion_backend_config":{"kind":"__triton_nested_gemm_fusion","block_level_fusion_config":{"num_warps":"8","output_tiles":[{"sizes":["128","256"]}],"num_ctas":1,"num_stages":4,"is_tma_allowed":true}}}
  %gemm_fusion_dot.11 = bf16[256,768]{1,0} fusion(%c, %d), kind=kCustom, calls=%gemm_fusion_dot.11_computation, backend_config={"fusion_backend_config":{"kind":"__triton_gemm","triton_gemm_config":{"block_m":"64","block_n":"128","block_k":"32","split_k":"1","num_stages":"3","num_warps":"4","num_ctas":"1"}}}
  %custom-call.1 = (bf16[768,768]{1,0}, s8[4194304]{0}) custom-call(%e, %f), custom_call_target="__cublas$gemm", backend_config={"operation_queue_id":"0","gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":{"lhs_contracting_dimensions":["0"],"rhs_contracting_dimensions":["0"]},"selected_algorithm":"11","epilogue":"DEFAULT"}}
  %custom-call.2 = (bf16[768,2]{1,0}, s8[0]{0}) custom-call(%g, %h), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"alpha_real":1,"beta":0,"epilogue":"DEFAULT","precision_config":{"operand_precision":["DEFAULT","DEFAULT"]}}}
  %pallas_call.14 = (bf16[8,128,2,64]{3,2,1,0}, f32[8,2,128]{2,1,0}) custom-call(%i, %j), custom_call_target="__gpu$xla.gpu.triton", backend_config={"name":"flash_attention_fwd","num_warps":4,"num_stages":2}
  ROOT %loop_add_fusion = bf16[1024,128]{1,0} fusion(%gemm_fusion_dot.3), kind=kLoop, calls=%fused_add
}
"""


def test_gemm_census_reads_autotuned_configs_from_the_hlo():
    gemms = _suite_module("gemms")
    census = gemms.gemm_census(_HLO)
    assert census["gemms"] == 5 and census["autotuned"] == 3, census
    assert census["by_backend"] == {"triton": 3, "cublas": 1, "cublasLt": 1}, census
    assert census["configs"] == {"triton 16x8x16 w2 s1": 1, "triton 128x256x64 w8 s4": 1,
                                 "triton 64x128x32 w4 s3": 1, "cublas algorithm 11": 1,
                                 "cublasLt algorithm -": 1}, census
    line = gemms.summary(census, top=2)
    assert line.startswith("3 of 5 (cublas 1, cublasLt 1, triton 3); triton 16x8x16 w2 s1 x1, "
                           "triton 128x256x64 w8 s4 x1, +3 more"), line
    # untuned everywhere: XLA's fallback tiles only, no cuBLAS algorithm
    untuned = _HLO.replace('"selected_algorithm":"11",', "").replace(
        '"num_warps":"8"', '"num_warps":"2"').replace('"num_stages":4', '"num_stages":1').replace(
        '["128","256"]', '["8","16"]').replace('"block_m":"64","block_n":"128"',
                                               '"block_m":"16","block_n":"16"').replace(
        '"num_stages":"3","num_warps":"4"', '"num_stages":"1","num_warps":"2"')
    assert gemms.gemm_census(untuned)["autotuned"] == 0
    assert gemms.summary(gemms.gemm_census("HloModule m\n")) == (
        "0 of 0 (no GPU GEMM kernels in this compile)")
    assert gemms.summary({"error": "ValueError: x"}) == "no census (ValueError: x)"


_FP8_HLO = r"""HloModule jit_train_step, entry_computation_layout={()->()}

%gemm_fusion_dot.5_computation (parameter_0.5: f8e4m3fn[1024,128], parameter_1.5: f8e4m3fn[128,128]) -> bf16[1024,128] {
  %parameter_0.5 = f8e4m3fn[1024,128]{1,0} parameter(0)
  %parameter_1.5 = f8e4m3fn[128,128]{1,0} parameter(1)
  ROOT %dot.5 = bf16[1024,128]{1,0} dot(%parameter_0.5, %parameter_1.5), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main.2 (p0: bf16[1024,128], p1: bf16[128,128]) -> bf16[1024,128] {
  %custom-call.7 = (bf16[4096,1024]{1,0}, s8[33554432]{0}) custom-call(%a, %b, %c, %d), custom_call_target="__cublas$lt$matmul$f8", backend_config={"gemm_backend_config":{"alpha_real":1,"selected_algorithm":"2"}}
  %gemm_fusion_dot.5 = bf16[1024,128]{1,0} fusion(%e, %f), kind=kCustom, calls=%gemm_fusion_dot.5_computation, backend_config={"fusion_backend_config":{"kind":"__triton_gemm","triton_gemm_config":{"block_m":"64","block_n":"128","block_k":"64","split_k":"1","num_stages":"3","num_warps":"4","num_ctas":"1"}}}
  ROOT %custom-call.8 = (bf16[768,768]{1,0}, s8[4194304]{0}) custom-call(%g, %h), custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"selected_algorithm":"5","epilogue":"DEFAULT"}}
}
"""


def test_gemm_census_counts_fp8_gemms():
    """An FP8 row says how many GEMMs really take FP8 operands: cuBLASLt's f8 call and a
    fusion over f8 parameters, not the bf16 call beside them."""
    gemms = _suite_module("gemms")
    census = gemms.gemm_census(_FP8_HLO)
    assert (census["gemms"], census["autotuned"], census["fp8"]) == (3, 3, 2), census
    assert census["by_backend"] == {"cublasLt": 2, "triton": 1}, census
    assert gemms.summary(census).startswith("3 of 3 (cublasLt 2, triton 1); FP8 2 of 3; ")
    assert gemms.gemm_census(_HLO)["fp8"] == 0


def test_extra_variants_keep_the_first_sessions_rows():
    """--variants=extra: the rows a first GPU session measured (or had no time for), each a
    BertConfig field or XLA flags."""
    suite = _suite_module("suite")
    cases = ["base128", "large128", "large512"]
    got = [(sorted(only), overrides) for _, overrides, only in
           suite.parse_variants(suite.EXTRA_VARIANTS, cases)]
    base, large = ["base128"], ["large128"]
    assert got[:9] == [
        (base, {"residual_norm": "xla"}),  # XLA's residual + LayerNorm against the kernels
        (base, {"gelu_backward": "xla"}),  # XLA's GELU backward against the default kernel
        (large, {"gelu_backward": "xla"}),  # ... and against its remat form
        (base, {"xla_flags": "--xla_gpu_enable_triton_gemm=false"}),
        (base, {"xla_flags": "--xla_gpu_enable_command_buffer="}),
        (base, {"attention": "cudnn", "attention_probs_dropout_prob": 0}),
        (base, {"attention": "pallas", "attention_probs_dropout_prob": 0}),
        (sorted(base + large), {"scan_unroll": 1}),  # the rolled loop against the default
        (large, {"scan_layers": False})], got
    assert (base, {"pallas_block_q": 64, "pallas_block_k": 128}) in got
    assert (large, {"remat": "none"}) in got and (base, {"attention": "xla"}) in got
    # every model key of them is a BertConfig field the config accepts
    from bert_jax.models import BertConfig

    for _, overrides in got:
        model = {k: v for k, v in overrides.items() if k != "xla_flags"}
        BertConfig(**model)


def test_a_rows_layer_cell_says_how_its_layers_ran():
    report = _suite_module("report")
    assert report.layers_tag({"scan_layers": False, "scan_unroll": 0}) == ""
    assert report.layers_tag({"scan_layers": True, "scan_unroll": 1}) == "+scan"
    assert report.layers_tag({"scan_layers": True, "scan_unroll": 0}) == "+scan(unroll=0)"
    assert report.jax_cells({"case": "large128", "variant": "default", "remat": "minimal_ffn",
                             "scan_layers": True, "scan_unroll": 0},
                            report.Notes())[3] == "minimal_ffn+scan(unroll=0)"
