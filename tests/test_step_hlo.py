"""benchmarks/step_hlo.py's counting rule on HLO whose kernels, FLOPs and bytes are known
by hand, and the script on the tiny config (CPU target): its sections and its estimate."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from tests.conftest import REPO, load_script

# The script's functions, imported as a module (its flags are defined only when it runs as a
# program); registered first, as dataclasses need.
step_hlo = load_script("benchmarks/step_hlo.py", register=True)

# A scan-like loop (3 trips, known) writing one f32[4,8] row per trip into a stacked buffer
# in place, a dot, a cuBLAS GEMM custom call, and a fusion reading one row of the buffer.
HLO = """HloModule audit_test

%fused_dus (p0: f32[3,4,8], p1: f32[4,8], p2: s32[]) -> f32[3,4,8] {
  %p0 = f32[3,4,8]{2,1,0} parameter(0)
  %p1 = f32[4,8]{1,0} parameter(1)
  %p2 = s32[] parameter(2)
  %row = f32[1,4,8]{2,1,0} bitcast(%p1)
  %z = s32[] constant(0)
  ROOT %dus = f32[3,4,8]{2,1,0} dynamic-update-slice(%p0, %row, %p2, %z, %z)
}

%fused_slice (p0.1: f32[3,4,8], p1.1: s32[]) -> f32[4,8] {
  %p0.1 = f32[3,4,8]{2,1,0} parameter(0)
  %p1.1 = s32[] parameter(1)
  %z.1 = s32[] constant(0)
  %ds = f32[1,4,8]{2,1,0} dynamic-slice(%p0.1, %p1.1, %z.1, %z.1), dynamic_slice_sizes={1,4,8}
  ROOT %r = f32[4,8]{1,0} bitcast(%ds)
}

%body (carry: (s32[], f32[3,4,8], f32[4,8])) -> (s32[], f32[3,4,8], f32[4,8]) {
  %carry = (s32[], f32[3,4,8]{2,1,0}, f32[4,8]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%carry), index=0
  %buf = f32[3,4,8]{2,1,0} get-tuple-element(%carry), index=1
  %x = f32[4,8]{1,0} get-tuple-element(%carry), index=2
  %upd = f32[3,4,8]{2,1,0} fusion(%buf, %x, %i), kind=kLoop, calls=%fused_dus, metadata={op_name="jit(f)/jvp(M)/layer/dynamic_update_slice"}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one), metadata={op_name="jit(f)/add"}
  ROOT %t = (s32[], f32[3,4,8]{2,1,0}, f32[4,8]{1,0}) tuple(%next, %upd, %x)
}

%cond (carry.1: (s32[], f32[3,4,8], f32[4,8])) -> pred[] {
  %carry.1 = (s32[], f32[3,4,8]{2,1,0}, f32[4,8]{1,0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%carry.1), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT, metadata={op_name="jit(f)/lt"}
}

ENTRY %main (a: f32[8,16], b: f32[16,32], buf.1: f32[3,4,8], x.1: f32[4,8]) -> (f32[4,8], (f32[32,32], s8[1024])) {
  %a = f32[8,16]{1,0} parameter(0)
  %b = f32[16,32]{1,0} parameter(1)
  %buf.1 = f32[3,4,8]{2,1,0} parameter(2)
  %x.1 = f32[4,8]{1,0} parameter(3)
  %d = f32[8,32]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(f)/jvp(M)/dense/dot_general"}
  %g = (f32[32,32]{1,0}, s8[1024]{0}) custom-call(%d, %d), custom_call_target="__cublas$gemm", metadata={op_name="jit(f)/transpose(jvp(M))/dense/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["0"],"rhs_contracting_dimensions":["0"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]}}}
  %zero = s32[] constant(0)
  %init = (s32[], f32[3,4,8]{2,1,0}, f32[4,8]{1,0}) tuple(%zero, %buf.1, %x.1)
  %w = (s32[], f32[3,4,8]{2,1,0}, f32[4,8]{1,0}) while(%init), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  %out = f32[3,4,8]{2,1,0} get-tuple-element(%w), index=1
  %one.1 = s32[] constant(1)
  %sl = f32[4,8]{1,0} fusion(%out, %one.1), kind=kLoop, calls=%fused_slice, metadata={op_name="jit(f)/mul"}
  ROOT %res = (f32[4,8]{1,0}, (f32[32,32]{1,0}, s8[1024]{0})) tuple(%sl, %g)
}
"""


def _by_name(kernels):
    return {k.name: k for k in kernels}


def test_counting_rule_on_handwritten_hlo():
    kernels = _by_name(step_hlo.audit(HLO))
    # dot, GEMM call, 3 x (row write + counter add), 4 loop tests, the row read.
    assert sorted(kernels) == ["d", "g", "lt", "next", "sl", "upd"]
    assert {n: k.count for n, k in kernels.items()} == {
        "d": 1, "g": 1, "upd": 3, "next": 3, "lt": 4, "sl": 1}
    assert kernels["d"].kind == kernels["g"].kind == "gemm"
    assert kernels["d"].flops == 2 * 8 * 32 * 16
    assert kernels["g"].flops == 2 * 32 * 32 * 8  # contracts d's 8 rows
    assert kernels["g"].dtype == "f32 x f32 -> f32" and kernels["g"].impl == "cuBLAS GEMM"
    # In place: the written row (128 B), the row read (128 B, via a bitcast) and the index.
    assert kernels["upd"].bytes == 128 + 128 + 4
    # A slice of the buffer, not the whole 384 B: one row in, one row out, the index.
    assert kernels["sl"].bytes == 128 + 128 + 4
    assert kernels["next"].bytes == 3 * 4 and kernels["lt"].bytes == 4 + 4 + 1
    assert kernels["upd"].phase == "forward" and kernels["g"].phase == "backward"
    assert kernels["sl"].phase == "optimizer"

    totals = step_hlo.summarize(list(kernels.values()), gemm_tflops=1.0, hbm_tbps=1.0,
                                launch_us=1.0)
    assert totals["launches"] == 13
    assert totals["gemm_flops"] == 8192 + 16384
    assert totals["other_bytes"] == 3 * 260 + 3 * 12 + 4 * 9 + 260
    assert totals["estimate_s"] == pytest.approx(
        24576 / 1e12 + totals["other_bytes"] / 1e12 + 13e-6)


def test_a_loop_without_a_known_trip_count_counts_its_condition_constant():
    """A TPU compile's layer loops carry no known_trip_count: the trips are the constant
    of the condition's `counter < N`; the same counts as with the backend config."""
    tpu_style = HLO.replace(', backend_config={"known_trip_count":{"n":"3"}}', "")
    assert "known_trip_count" not in tpu_style
    kernels = _by_name(step_hlo.audit(tpu_style))
    assert {n: k.count for n, k in kernels.items()} == {
        "d": 1, "g": 1, "upd": 3, "next": 3, "lt": 4, "sl": 1}
    # A condition of another form counts its body once.
    other = tpu_style.replace("direction=LT", "direction=NE")
    assert _by_name(step_hlo.audit(other))["upd"].count == 1
    # GEMMs keep their bytes apart: the dot reads 512 + 2,048 B and writes 1,024 B.
    d = _by_name(step_hlo.audit(HLO))["d"]
    assert (d.bytes, d.all_bytes) == (0, 8 * 16 * 4 + 16 * 32 * 4 + 8 * 32 * 4)
    assert d.traffic == (("f32[8,16]{1,0}", 512), ("f32[16,32]{1,0}", 2048),
                         ("f32[8,32]{1,0}", 1024))
    # A fusion's traffic array by array: the buffer it updates in place (not read), the
    # row it reads, the index, the row it writes.
    upd = _by_name(step_hlo.audit(HLO))["upd"]
    assert upd.traffic == (("f32[3,4,8]{2,1,0}", 0), ("f32[4,8]{1,0}", 128), ("s32[]", 4),
                           ("f32[1,4,8]{2,1,0}", 128)), upd.traffic


# A TPU-style read of one layer's slice of a stacked [3, 4, 8] buffer: the dynamic-slice
# sits in a fusion nested inside the kernel's fusion.
NESTED_HLO = """HloModule nested_test

%inner_slice (q0: f32[3,4,8], q1: s32[]) -> f32[1,4,8] {
  %q0 = f32[3,4,8]{2,1,0} parameter(0)
  %q1 = s32[] parameter(1)
  %zq = s32[] constant(0)
  ROOT %dsq = f32[1,4,8]{2,1,0} dynamic-slice(%q0, %q1, %zq, %zq), dynamic_slice_sizes={1,4,8}
}

%outer (p0: f32[3,4,8], p1: s32[]) -> f32[4,8] {
  %p0 = f32[3,4,8]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %nested = f32[1,4,8]{2,1,0} fusion(%p0, %p1), kind=kLoop, calls=%inner_slice
  %c = f32[1,4,8]{2,1,0} copy(%nested)
  ROOT %r = f32[4,8]{1,0} bitcast(%c)
}

ENTRY %main (buf: f32[3,4,8], i: s32[]) -> f32[4,8] {
  %buf = f32[3,4,8]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  ROOT %row = f32[4,8]{1,0} fusion(%buf, %i), kind=kLoop, calls=%outer, metadata={op_name="jit(f)/jvp(M)/row"}
}
"""


def test_a_slice_read_inside_a_nested_fusion_counts_the_slice():
    """One 128 B row of the 384 B buffer in, the row out, the index: not the whole buffer
    (a rolled layer loop on TPU reads each layer's saved activations this way)."""
    row = _by_name(step_hlo.audit(NESTED_HLO))["row"]
    assert row.bytes == 128 + 4 + 128
    assert row.traffic == (("f32[3,4,8]{2,1,0}", 128), ("s32[]", 4), ("f32[1,4,8]{2,1,0}", 128))


# A loop fusion that converts and biases a bf16 [64, 100] table and gathers 8 of its rows'
# elements (as the MLM loss takes its labels' logits); and one that also writes the whole
# converted table.
GATHER_HLO = """HloModule gather_test

%fused_take (t: bf16[64,100], b: f32[100], idx: s32[8,1]) -> f32[8] {
  %t = bf16[64,100]{1,0} parameter(0)
  %b = f32[100]{0} parameter(1)
  %idx = s32[8,1]{1,0} parameter(2)
  %c = f32[64,100]{1,0} convert(%t)
  %bb = f32[64,100]{1,0} broadcast(%b), dimensions={1}
  %sum = f32[64,100]{1,0} add(%c, %bb)
  ROOT %g = f32[8]{0} gather(%sum, %idx), offset_dims={}, collapsed_slice_dims={0,1}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,1}
}

%fused_both (t.1: bf16[64,100], idx.1: s32[8,1]) -> (f32[8], f32[64,100]) {
  %t.1 = bf16[64,100]{1,0} parameter(0)
  %idx.1 = s32[8,1]{1,0} parameter(1)
  %c.1 = f32[64,100]{1,0} convert(%t.1)
  %g.1 = f32[8]{0} gather(%c.1, %idx.1), offset_dims={}, collapsed_slice_dims={0,1}, start_index_map={0}, index_vector_dim=1, slice_sizes={1,1}
  ROOT %tup = (f32[8]{0}, f32[64,100]{1,0}) tuple(%g.1, %c.1)
}

ENTRY %main (t.2: bf16[64,100], b.2: f32[100], i.2: s32[8,1]) -> (f32[8], (f32[8], f32[64,100])) {
  %t.2 = bf16[64,100]{1,0} parameter(0)
  %b.2 = f32[100]{0} parameter(1)
  %i.2 = s32[8,1]{1,0} parameter(2)
  %take = f32[8]{0} fusion(%t.2, %b.2, %i.2), kind=kLoop, calls=%fused_take, metadata={op_name="jit(f)/jvp()/take"}
  %both = (f32[8]{0}, f32[64,100]{1,0}) fusion(%t.2, %i.2), kind=kLoop, calls=%fused_both, metadata={op_name="jit(f)/jvp()/both"}
  ROOT %r = (f32[8]{0}, (f32[8]{0}, f32[64,100]{1,0})) tuple(%take, %both)
}
"""


def test_a_gather_reads_only_the_gathered_elements():
    kernels = _by_name(step_hlo.audit(GATHER_HLO))
    # 8 bf16 table elements (through the convert and the bias add), the 400 B bias read
    # whole (a broadcast), the 32 B of indices, the 32 B written.
    assert kernels["take"].bytes == 8 * 2 + 400 + 32 + 32
    # The converted table is also an output: the whole table is read.
    assert kernels["both"].bytes == 64 * 100 * 2 + 32 + (32 + 64 * 100 * 4)


# The FP8 product as XLA compiled it for the H100 description (model.fp8; metadata cut):
# a Triton GEMM fusion of two float8_e4m3fn operands, the dequantizing scale in its
# epilogue; beside it a bfloat16 cuBLAS GEMM.
FP8_HLO = """HloModule fp8_test

%gemm_fusion_dot_computation (parameter_0: f8e4m3fn[2048,128], parameter_1: f8e4m3fn[128,256], parameter_2: bf16[]) -> bf16[2048,256] {
  %parameter_0 = f8e4m3fn[2048,128]{1,0} parameter(0)
  %parameter_1 = f8e4m3fn[128,256]{0,1} parameter(1)
  %transpose.251 = f8e4m3fn[128,256]{0,1} transpose(%parameter_1), dimensions={1,0}
  %dot.81 = bf16[2048,256]{1,0} dot(%parameter_0, %transpose.251), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %parameter_2 = bf16[] parameter(2)
  %broadcast.1283 = bf16[2048,256]{1,0} broadcast(%parameter_2), dimensions={}
  ROOT %mul.53 = bf16[2048,256]{1,0} multiply(%dot.81, %broadcast.1283)
}

ENTRY %main (a: f8e4m3fn[2048,128], b: f8e4m3fn[128,256], s: bf16[], c: bf16[256,64], d: bf16[64,32]) -> (bf16[2048,256], (bf16[256,32], s8[0])) {
  %a = f8e4m3fn[2048,128]{1,0} parameter(0)
  %b = f8e4m3fn[128,256]{0,1} parameter(1)
  %s = bf16[] parameter(2)
  %c = bf16[256,64]{1,0} parameter(3)
  %d = bf16[64,32]{1,0} parameter(4)
  %q = bf16[2048,256]{1,0} fusion(%a, %b, %s), kind=kCustom, calls=%gemm_fusion_dot_computation, metadata={op_name="jit(f)/jvp(M)/layer/Fp8DirectDotGeneralOp_0/dot_general"}, backend_config={"fusion_backend_config":{"kind":"__triton_gemm"}}
  %g = (bf16[256,32]{1,0}, s8[0]{0}) custom-call(%c, %d), custom_call_target="__cublas$lt$matmul", metadata={op_name="jit(f)/jvp(M)/head/dot_general"}, backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],"rhs_contracting_dimensions":["0"]}}}
  ROOT %r = (bf16[2048,256]{1,0}, (bf16[256,32]{1,0}, s8[0]{0})) tuple(%q, %g)
}
"""


def test_fp8_gemms_are_counted_at_their_own_rate():
    kernels = _by_name(step_hlo.audit(FP8_HLO))
    assert sorted(kernels) == ["g", "q"]
    fp8, bf16 = kernels["q"], kernels["g"]
    assert (fp8.kind, fp8.impl, fp8.dtype) == ("gemm", "Triton GEMM fusion",
                                               "f8e4m3fn x f8e4m3fn -> bf16")
    assert fp8.flops == 2 * 2048 * 256 * 128 and step_hlo.is_fp8(fp8)
    assert bf16.dtype == "bf16 x bf16 -> bf16" and not step_hlo.is_fp8(bf16)
    assert bf16.flops == 2 * 256 * 32 * 64
    totals = step_hlo.summarize(list(kernels.values()), gemm_tflops=1.0, hbm_tbps=1.0,
                                launch_us=0.0)
    assert totals["fp8_gemm_flops"] == fp8.flops
    # FP8 at twice the bfloat16 rate unless told otherwise
    assert totals["gemm_s"] == pytest.approx((fp8.flops / 2 + bf16.flops) / 1e12)
    slower = step_hlo.summarize(list(kernels.values()), gemm_tflops=1.0, hbm_tbps=1.0,
                                launch_us=0.0, fp8_gemm_tflops=1.0)
    assert slower["gemm_s"] == pytest.approx((fp8.flops + bf16.flops) / 1e12)


def test_two_matmuls_of_a_jitted_function():
    def f(a, b, c):
        return jnp.tanh(a @ b) @ c

    shapes = [(8, 16), (16, 32), (32, 4)]
    compiled = jax.jit(f).lower(*[jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]).compile()
    kernels = step_hlo.audit(compiled.as_text())
    gemms = sorted(k.flops for k in kernels if k.kind == "gemm")
    assert gemms == sorted([2 * 8 * 32 * 16, 2 * 8 * 4 * 32])
    assert all(k.dtype == "f32 x f32 -> f32" for k in kernels if k.kind == "gemm")
    cost = step_hlo.cost_analysis(compiled)
    if cost is not None:  # XLA's own count agrees on the GEMMs (tanh adds a few FLOPs)
        assert cost[0]["flops"] >= sum(gemms)


def test_script_prints_the_sections_and_the_estimate_last():
    out = subprocess.run(
        [sys.executable, "benchmarks/step_hlo.py", "--config=configs/bert_tiny.py",
         "--batch=2", "--seq=32", "--target=cpu"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout
    for section in ("compile: ", "XLA cost analysis: ", "launches: ", "launches by phase:",
                    "custom calls and custom fusions by kind:", "GEMMs by dtype",
                    "other kernels' bytes by phase", "largest other kernels (top 15"):
        assert section in text, section
    for phase in ("forward", "backward", "heads", "optimizer"):
        assert f"  {phase}: " in text
    # The tiny model's matrix products: 2 layers x (4 attention + 2 FFN) forward, at least
    # as many again backward.
    launches = int(text.split("launches: ", 1)[1].split()[0].replace(",", ""))
    assert launches > 24
    last = text.strip().splitlines()[-1]
    assert last.startswith("estimate: "), last
    assert float(last.split()[1]) > 0


def test_a_gpu_description_without_the_gpu_target_is_refused_in_one_line():
    """--gpu_target_config alone used to compile for the CPU (the default target) without a
    word, its figures read as the GPU's."""
    out = subprocess.run(
        [sys.executable, "benchmarks/step_hlo.py", "--config=configs/bert_tiny.py",
         "--batch=2", "--seq=32", "--gpu_target_config=benchmarks/gpu/h200.txtpb"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode != 0 and "compile: " not in out.stdout
    assert ("--gpu_target_config describes a GPU to compile for: add --target=h100"
            in out.stderr), out.stderr[-2000:]

