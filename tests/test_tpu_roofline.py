"""benchmarks/tpu_roofline.py, what step_hlo.py prints for a TPU target: the chips'
published figures, the layer loop's correction of XLA's cost analysis, the roofline, and
the attention's [length, length] traffic against a flash kernel's, on made-up inputs whose
answers are known by hand."""

from __future__ import annotations

import types

import pytest

from benchmarks import step_hlo, tpu_roofline


def _devices(kind: str, coords: list) -> list:
    return [types.SimpleNamespace(device_kind=kind, coords=c) for c in coords]


def test_chips_and_devices_per_chip():
    # A v4 topology description shows each chip's two TensorCores as devices.
    v4 = _devices("TPU v4", [(x, y, 0) for x in range(2) for y in range(2) for _ in range(2)])
    assert tpu_roofline.chip_of(v4) == (tpu_roofline.CHIPS["v4"], 2)
    v5e = _devices("TPU v5 lite", [(x, y, 0) for x in range(2) for y in range(2)])
    assert tpu_roofline.chip_of(v5e) == (tpu_roofline.CHIPS["v5e"], 1)
    assert tpu_roofline.chip_of(_devices("TPU v5", [(0, 0, 0)]))[0].name == "TPU v5p"
    assert tpu_roofline.chip_of(_devices("TPU v6 lite", [(0, 0, 0)]))[0].name == "TPU v6e"
    with pytest.raises(ValueError, match="no published figures"):
        tpu_roofline.chip_of(_devices("TPU v9", [(0, 0, 0)]))
    # The published per-chip figures the estimates use.
    assert {g: (c.peak_flops, c.hbm_bps) for g, c in tpu_roofline.CHIPS.items()} == {
        "v4": (275e12, 1200e9), "v5e": (197e12, 819e9), "v5p": (459e12, 2765e9),
        "v6e": (918e12, 1638e9)}


class _Compiled:
    def __init__(self, flops, nbytes):
        self.cost = {"flops": flops, "bytes accessed": nbytes, "transcendentals": 0.0}

    def cost_analysis(self):
        return [self.cost]


class _Model:
    num_hidden_layers, scan_layers, scan_unroll = 24, True, "auto"

    def unroll_for(self, platform):
        return 1 if platform == "tpu" else 0


def test_the_layer_loop_is_counted_once_per_layer():
    """The cost analysis counts a loop body once: 100 outside + 10 a layer compiles to
    110 rolled and 120 with two layers a trip; the step is 100 + 24 x 10."""
    asked = []

    def recompile(unroll):
        asked.append(unroll)
        return _Compiled(120.0, 1200.0)

    cost, how = tpu_roofline.step_cost(_Compiled(110.0, 1100.0), _Model(), recompile)
    assert asked == [2]
    assert cost == {"flops": 340.0, "bytes": 3400.0, "transcendentals": 0.0}
    assert "24 times" in how
    unrolled = _Model()
    unrolled.scan_layers = False
    cost, how = tpu_roofline.step_cost(_Compiled(110.0, 1100.0), unrolled, None)
    assert cost["flops"] == 110.0 and "no layer loop" in how


def test_roofline_per_device():
    cost = {"flops": 275e12 * 0.01, "bytes": 1200e9 * 0.03, "transcendentals": 0.0}
    roof = tpu_roofline.roofline(cost, tpu_roofline.CHIPS["v4"], per_chip=2)
    # Half a chip per device: 137.5 TFLOP/s, 600 GB/s.
    assert roof["compute_s"] == pytest.approx(0.02) and roof["memory_s"] == pytest.approx(0.06)
    assert roof["estimate_s"] == pytest.approx(0.06) and roof["sum_s"] == pytest.approx(0.08)


def _kernel(name, kind, count, traffic, op_name=""):
    moved = sum(b for _, b in traffic)
    return step_hlo.Kernel(name, "fusion", kind, count, 0 if kind == "gemm" else moved, 0, "",
                           op_name, traffic[-1][0], "", moved, tuple(traffic))


def test_attention_traffic_against_a_flash_kernel():
    """Per device: batch 16, 16 heads of 64, length 512, 2 layers, on a v5e. The XLA path's
    kernels that touch a [512, 512] array: the scores product, a softmax + dropout fusion,
    the context product and 4 backward products a layer; not the FFN's GEMM ([16, 512,
    1024] in: one 512). Each side timed as max(products at peak, bytes at bandwidth)."""
    b, h, s, d, layers = 16, 16, 512, 64, 2
    scores = f"bf16[{b},{h},{s},{s}]"
    act = f"bf16[{b},{s},{h},{d}]"
    S, A = b * h * s * s * 2, b * s * h * d * 2  # bytes of a score array, an activation
    fwd = "jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0/attention"
    kernels = [  # (array, bytes) read and written
        _kernel("qk", "gemm", layers, [(act, A), (act, A), (scores, S)], f"{fwd}/qk"),
        _kernel("softmax_dropout", "loop", layers, [(scores, S)] * 3, f"{fwd}/mul"),
        _kernel("pv", "gemm", layers, [(scores, S), (act, A), (act, A)], f"{fwd}/pv"),
        _kernel("bwd_products", "gemm", 4 * layers, [(act, A), (act, A), (scores, S)],
                f"transpose({fwd[4:]})/dot_general"),
        _kernel("ffn", "gemm", layers, [(f"bf16[{b},{s},1024]", 2 * A),
                                        (f"bf16[{b},{s},4096]", 8 * A)]),
    ]
    sq = tpu_roofline.square_kernels(kernels, s)
    assert [k.name for k in sq] == ["qk", "softmax_dropout", "pv", "bwd_products"]
    assert tpu_roofline.square_bytes(kernels[0], s) == S
    mcfg = types.SimpleNamespace(num_hidden_layers=layers, num_attention_heads=h,
                                 hidden_size=h * d)
    chip = tpu_roofline.CHIPS["v5e"]
    lines, saved = tpu_roofline.attention_section(kernels, mcfg, b, s, chip, 1)
    whole = 18 * S + 24 * A  # 2 x (qk 2A + S, softmax 3S, pv S + 2A) + 8 x (2A + S)
    one = 2 * b * h * s * s * d  # FLOPs of one product
    assert tpu_roofline.attention_products(b, h, s, d) == one
    xla_s = max(12 * one / 197e12, whole / 819e9)
    assert (f"{7 * layers} kernels touch a [.., 512, .., 512] array (7.0 a layer) and move "
            f"{whole / 1e9:.2f} GB, {18 * S / 1e9:.2f} GB of it those arrays; 12 attention "
            f"products (6 a layer)") in lines[1], lines[1]
    assert f"= {1e3 * xla_s:.1f} ms; the largest:" in lines[1]
    flash = layers * (13 * A + 4 * b * h * s * 4)  # 13 activations and 4 row statistics
    assert tpu_roofline.flash_io(b, s, h * d, h) * layers == flash
    flash_s = max(14 * one / 197e12, flash / 819e9)
    assert saved == pytest.approx(xla_s - flash_s, rel=1e-12) and saved > 0
    assert (f"{flash / 1e9:.2f} GB, 14 products (7 a layer), {14 * one / 1e12:.2f} TFLOP -> "
            f"max({1e3 * 14 * one / 197e12:.1f} ms, {1e3 * flash / 819e9:.1f} ms) = "
            f"{1e3 * flash_s:.1f} ms") in lines[-1], lines[-1]
    # the largest of them by their square arrays' bytes, layers merged by the audit's counts
    assert [ln.split()[:5] for ln in lines[2:-1]] == [
        [f"{8 * S / 1e9:.2f}", "GB", "x8", "backward", "gemm"],
        [f"{6 * S / 1e9:.2f}", "GB", "x2", "forward", "loop"],
        [f"{2 * S / 1e9:.2f}", "GB", "x2", "forward", "gemm"],
        [f"{2 * S / 1e9:.2f}", "GB", "x2", "forward", "gemm"]], lines
    assert lines[3].endswith(" bf16[16,16,512,512] attention/mul"), lines[3]
    # Kernels that move little at this length: the flash kernel's own traffic is more.
    light = [_kernel("qk", "gemm", layers, [(scores, 1000)])]
    assert tpu_roofline.attention_section(light, mcfg, b, s, chip, 1)[1] < 0


def test_loops_line_names_the_loops_the_cost_analysis_undercounts():
    layers = [("jit(train_step)/jvp(BertForPreTraining)/bert/encoder/while", 24),
              ("jit(train_step)/transpose(jvp(BertForPreTraining))/bert/encoder/while", 24)]
    assert tpu_roofline.loops_line(layers) == "loops: 2 over the layers (24, 24 trips)"
    fsdp = layers + [("jit(train_step)/jvp(M)/bert/encoder/while/body/layers/output/"
                      "dot_general", 4)] * 3
    line = tpu_roofline.loops_line(fsdp)
    assert line.startswith("loops: 2 over the layers (24, 24 trips); 3 others (12 trips in "
                           "all), each body counted once"), line
    assert "--config.mesh.data=-1 --config.mesh.fsdp=1" in line


def test_while_loops_of_hand_written_hlo():
    from tests.test_step_hlo import HLO

    assert step_hlo.while_loops(HLO) == [("", 3)]
    tpu_style = HLO.replace(', backend_config={"known_trip_count":{"n":"3"}}', "")
    assert step_hlo.while_loops(tpu_style) == [("", 3)]
