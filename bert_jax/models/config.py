"""BertConfig: the original `bert_config.json` format plus our numerics/memory options."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Iterable, Mapping

import jax.numpy as jnp
from etils import epath

from bert_jax.errors import UserError
from bert_jax.models.kernels import backend

# Keys of Google's original bert_config.json, in the order the original tool writes them.
ORIGINAL_KEYS = (
    "attention_probs_dropout_prob",
    "hidden_act",
    "hidden_dropout_prob",
    "hidden_size",
    "initializer_range",
    "intermediate_size",
    "max_position_embeddings",
    "num_attention_heads",
    "num_hidden_layers",
    "type_vocab_size",
    "vocab_size",
)

ACTIVATIONS = ("gelu", "gelu_new", "gelu_tanh", "relu", "tanh", "silu")
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "minimal",
                  "minimal_ffn")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "pallas")
GELU_BACKWARDS = ("auto", "xla", "pallas")
RESIDUAL_NORMS = ("auto", "xla", "pallas")
DTYPES = ("auto", "float32", "bfloat16", "float16")
PARAM_DTYPES = ("float32", "bfloat16", "float16")
DROPOUT_RNGS = ("hash", "jax")
POSITION_EMBEDDINGS = ("learned", "rotary")
INIT_SCHEMES = ("bert", "modernbert")
FFN_TYPES = ("dense", "geglu", "swiglu")
# The activation of a gated FFN's input half: GeGLU takes a GELU, SwiGLU SiLU.
FFN_ACTIVATIONS = {"geglu": ("gelu", "gelu_new", "gelu_tanh"), "swiglu": ("silu",)}


class ConfigError(UserError, ValueError):
    """A model config that cannot describe a valid BERT."""


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Hyper-parameters of a BERT encoder.

    The first block is exactly the original `bert_config.json`; the second is ours:
      layer_norm_eps: LayerNorm epsilon (1e-12 as the original TF code).
      pre_ln: LayerNorm before each sub-layer (plus a final one) instead of after (paper).
      dtype: compute dtype: "auto" (bfloat16 when the step compiles for a GPU or TPU,
        float32 on CPU: `dtype_for`), "float32", "bfloat16" or "float16"; param_dtype:
        storage dtype of the parameters (float32 by default, whatever dtype is).
      fp8: the encoder layers' dense products (Q, K, V and attention output projections,
        the FFN's two) through flax's FP8 dot_general (Fp8DirectDotGeneralOp): operands
        scaled into float8_e4m3fn, output gradients into float8_e5m2, each scale from
        the largest magnitude of the last 1,024 steps (delayed scaling; see
        models/fp8.py). Their scaling state is training state, not parameters.
      remat: what each layer keeps for the backward pass (see models/remat.py): none
        (everything XLA keeps), full (only the layer input; recompute the rest), minimal
        (the layer input, Q / K / V, the attention context and the residual-stream values
        before each LayerNorm, all in the compute dtype; the FFN and the attention scores
        are recomputed), minimal_ffn (minimal plus the FFN's pre-activation), or jax's
        dots_saveable / dots_with_no_batch_dims_saveable.
      attention: the attention path (models/kernels/attention/): auto / xla / cudnn / pallas.
      fused_qkv: compute Q, K and V with one product against the three kernels stacked
        (parameters unchanged); False keeps three products (the XLA path's numerics).
      scan_layers: run the layer stack with `nn.scan` (params stacked on a leading
        "layers" axis): compile time independent of depth.
      scan_unroll: how the scanned stack runs (scan_layers only; the params are the same
        whatever it is, the float32 results up to summation order): 1 a loop of one layer
        per iteration, 0 every layer unrolled (no loop: none of the loop's copies of each
        layer's saved activations into and out of stacked buffers, more to compile), k > 1
        k layers per iteration (jax runs the layers a whole number of iterations leaves
        over unrolled after the loop, so k need not divide the depth; k >= the depth is
        0), or "auto": 1 on TPU, 0 on GPU and CPU (`unroll_for`).
      dropout_rng: how dropout masks are drawn: "hash" (default: one threefry draw per
        call, then a counter-based hash per element; much cheaper masks on CPU, the same
        mask on any mesh; see models/dropout.py) or "jax" (flax's nn.Dropout,
        jax.random.bernoulli, bit for bit).
      pallas_block_q, pallas_block_k: query and key block of the Pallas flash-attention
        kernel's forward pass on GPU (0: 128 x 64); pallas_bwd_block_q, pallas_bwd_block_k:
        those of its two backward kernels (0: as the forward's when that is set, else
        64 x 64). Powers of two >= 16; a block longer than the sequence is cut to it.
      pallas_num_warps, pallas_num_stages: Triton's warps per program (a power of two up
        to 32) and software-pipelining stages (>= 1) for those kernels (0: 4 and 2);
        pallas_bwd_num_warps, pallas_bwd_num_stages: those of the backward kernels alone
        (0: as the forward's).
        Run-time options: they change speed, never results (up to float summation order).
      gelu_backward: the backward pass of the FFN's bias + exact GELU (models/kernels/gelu.py):
        "auto" (one Pallas kernel on GPU under bfloat16 / float16 compute, with the FFN's
        second product in its backward pass under remat; else XLA's),
        "xla", or "pallas" (also on CPU, interpret mode: tests). Speed only: the kernel
        computes what jax's backward pass of that expression defines (bias gradient: the
        float32 sum of the rounded GELU gradient).
      residual_norm: each post-LN sublayer's end, bias + dropout + residual add + LayerNorm
        (models/kernels/residual_norm.py): "auto" (one Pallas kernel each way on GPU under
        bfloat16 / float16 compute with hash dropout and remat none; else XLA's), "xla", or
        "pallas" (also on CPU, interpret mode: tests). Speed only: the same expression, up to float32
        summation order and one rounding fewer in the LayerNorm's input gradient.

    The third block is the architecture of later encoders (ModernBERT: rotary positions,
    GeGLU, no biases, pre-LN, alternating global / sliding-window attention); every
    default is BERT's:
      position_embedding: "learned" (a table of max_position_embeddings rows added to the
        embeddings) or "rotary" (no table; queries and keys rotated by their position, the
        rotate-half convention of transformers; max_position_embeddings still bounds the length).
      rope_theta, local_rope_theta: the rotary base of global and of local
        (sliding-window) layers.
      ffn_type: "dense" (intermediate + activation + output) or a gated FFN, "geglu" /
        "swiglu": act(x W_in) * (x W_gate), then the output projection; hidden_act is the
        gate's activation (a GELU for geglu, silu for swiglu).
      use_bias: biases of the dense layers (attention projections, FFN, pooler, the MLM
        transform; not the classifier heads nor the MLM output bias). norm_bias: LayerNorm biases.
      layer0_attention_norm: pre-LN only: False leaves out layer 0's attention LayerNorm
        (its input is the embedding LayerNorm's output already), as ModernBERT does.
      pooler: False has no pooler dense: the pooled output is the [CLS] hidden state.
      global_attn_every_n_layers, local_attention: with N > 1, layer i is global when
        i % N == 0 and local otherwise; a local layer's query at i attends the keys j
        with |i - j| <= local_attention // 2 (ModernBERT's window). 0 or 1: every layer global.
      type_vocab_size: 0 for no token-type embeddings (token_type_ids are then ignored).
      init_scheme: "bert" (every weight a normal of std initializer_range cut at +-2 std) or
        "modernbert" (output projections initializer_range / sqrt(2 L), classifier heads
        hidden_size ** -0.5: bert_jax.models.layers.init_std).
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02

    layer_norm_eps: float = 1e-12
    pre_ln: bool = False
    dtype: str = "auto"
    param_dtype: str = "float32"
    fp8: bool = False
    remat: str = "none"
    scan_layers: bool = False
    scan_unroll: int | str = 1
    dropout_rng: str = "hash"
    attention: str = "auto"
    fused_qkv: bool = False
    pallas_block_q: int = 0
    pallas_block_k: int = 0
    pallas_bwd_block_q: int = 0
    pallas_bwd_block_k: int = 0
    pallas_num_warps: int = 0
    pallas_num_stages: int = 0
    pallas_bwd_num_warps: int = 0
    pallas_bwd_num_stages: int = 0
    gelu_backward: str = "auto"
    residual_norm: str = "auto"

    position_embedding: str = "learned"
    rope_theta: float = 10000.0
    local_rope_theta: float = 10000.0
    ffn_type: str = "dense"
    use_bias: bool = True
    norm_bias: bool = True
    layer0_attention_norm: bool = True
    pooler: bool = True
    global_attn_every_n_layers: int = 0
    local_attention: int = 0
    init_scheme: str = "bert"

    def __post_init__(self):
        for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"BertConfig.{key} must be a positive integer, got {value!r}")
        if (not isinstance(self.type_vocab_size, int) or isinstance(self.type_vocab_size, bool)
                or self.type_vocab_size < 0):
            raise ConfigError(f"BertConfig.type_vocab_size must be an integer >= 0 (0: no "
                              f"token-type embeddings), got {self.type_vocab_size!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"BertConfig.hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}")
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, key)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"BertConfig.{key} must be in [0, 1), got {value!r}")
        if not self.initializer_range > 0:
            raise ConfigError(f"BertConfig.initializer_range must be > 0, got {self.initializer_range!r}")
        if not self.layer_norm_eps > 0:
            raise ConfigError(f"BertConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"BertConfig.hidden_act={self.hidden_act!r}; expected one of {ACTIVATIONS}")
        if self.remat not in REMAT_POLICIES:
            raise ConfigError(f"BertConfig.remat={self.remat!r}; expected one of {REMAT_POLICIES}")
        if self.attention not in ATTENTION_IMPLS:
            raise ConfigError(
                f"BertConfig.attention={self.attention!r}; expected one of {ATTENTION_IMPLS}")
        if self.gelu_backward not in GELU_BACKWARDS:
            raise ConfigError(f"BertConfig.gelu_backward={self.gelu_backward!r}; expected one "
                              f"of {GELU_BACKWARDS}")
        if self.residual_norm not in RESIDUAL_NORMS:
            raise ConfigError(f"BertConfig.residual_norm={self.residual_norm!r}; expected one "
                              f"of {RESIDUAL_NORMS}")
        if self.dropout_rng not in DROPOUT_RNGS:
            raise ConfigError(
                f"BertConfig.dropout_rng={self.dropout_rng!r}; expected one of {DROPOUT_RNGS}")
        self._check_scan_unroll()
        if self.dtype not in DTYPES:
            raise ConfigError(f"BertConfig.dtype={self.dtype!r}; expected one of {DTYPES}")
        if self.param_dtype not in PARAM_DTYPES:
            raise ConfigError(f"BertConfig.param_dtype={self.param_dtype!r}; expected one of "
                              f"{PARAM_DTYPES}")
        if not isinstance(self.fp8, bool):
            raise ConfigError(f"BertConfig.fp8 must be true or false, got {self.fp8!r}")
        if self.fp8 and self.fused_qkv:
            raise ConfigError("BertConfig.fp8=True scales each of the Q, K, V products by its "
                              "own amax history, which fused_qkv=True (one product over the "
                              "three kernels) has not: set fused_qkv=False")
        self._check_pallas()
        self._check_architecture()

    def _check_architecture(self) -> None:
        """The fields of later encoders (class doc, third block)."""
        if self.position_embedding not in POSITION_EMBEDDINGS:
            raise ConfigError(f"BertConfig.position_embedding={self.position_embedding!r}; "
                              f"expected one of {POSITION_EMBEDDINGS}")
        if self.init_scheme not in INIT_SCHEMES:
            raise ConfigError(f"BertConfig.init_scheme={self.init_scheme!r}; expected one of "
                              f"{INIT_SCHEMES}")
        for key in ("rope_theta", "local_rope_theta"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 1:
                raise ConfigError(f"BertConfig.{key} must be a number > 1, got {value!r}")
        if self.position_embedding == "rotary" and self.head_dim % 2:
            raise ConfigError(f"BertConfig.position_embedding='rotary' needs an even head "
                              f"size, got hidden_size / num_attention_heads = {self.head_dim}")
        if self.ffn_type not in FFN_TYPES:
            raise ConfigError(f"BertConfig.ffn_type={self.ffn_type!r}; expected one of "
                              f"{FFN_TYPES}")
        if self.ffn_type in FFN_ACTIVATIONS and \
                self.hidden_act not in FFN_ACTIVATIONS[self.ffn_type]:
            raise ConfigError(f"BertConfig.ffn_type={self.ffn_type!r} gates with "
                              f"{' / '.join(FFN_ACTIVATIONS[self.ffn_type])}, but hidden_act="
                              f"{self.hidden_act!r}")
        for key in ("use_bias", "norm_bias", "layer0_attention_norm", "pooler"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"BertConfig.{key} must be true or false, got "
                                  f"{getattr(self, key)!r}")
        if not self.layer0_attention_norm and not self.pre_ln:
            raise ConfigError("BertConfig.layer0_attention_norm=False needs pre_ln=True (a "
                              "post-LN layer normalises after attention, not before)")
        for key in ("global_attn_every_n_layers", "local_attention"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"BertConfig.{key} must be an integer >= 0, got {value!r}")
        has_local = self.global_attn_every_n_layers > 1 and self.num_hidden_layers > 1
        if has_local and self.local_attention < 2:
            raise ConfigError(
                f"BertConfig.global_attn_every_n_layers={self.global_attn_every_n_layers} "
                f"makes layers local, which needs local_attention >= 2 (the window: keys "
                f"within local_attention // 2 of the query), got {self.local_attention}")
        if self.local_attention and not has_local:
            raise ConfigError(
                f"BertConfig.local_attention={self.local_attention} but no layer is local "
                f"(global_attn_every_n_layers={self.global_attn_every_n_layers}, "
                f"num_hidden_layers={self.num_hidden_layers}); set "
                f"global_attn_every_n_layers > 1, or local_attention=0")

    def _check_scan_unroll(self) -> None:
        value = self.scan_unroll
        if isinstance(value, str) and value.strip().isdigit():
            # A command-line override of a config that says "auto" arrives as a string.
            object.__setattr__(self, "scan_unroll", int(value))
        elif not (value == "auto" or (isinstance(value, int) and not isinstance(value, bool)
                                      and value >= 0)):
            raise ConfigError(f"BertConfig.scan_unroll must be an integer >= 0 (layers per "
                              f"iteration of the scanned stack; 0: all unrolled) or 'auto' "
                              f"(1 on TPU, 0 elsewhere), got {value!r}")

    def unroll_for(self, platform: str) -> int:
        """scan_unroll on `platform` ("gpu", "tpu", "cpu"): "auto" keeps the loop on TPU,
        where unrolled BERT-Large took more memory and compile time for no gain measured
        yet, and unrolls every layer elsewhere: on GPU and CPU the loop's copies of each
        layer's saved activations into and out of stacked buffers (and on GPU its extra
        launches) cost more than a longer compile."""
        if self.scan_unroll == "auto":
            return 1 if platform == "tpu" else 0
        return self.scan_unroll

    def layer_window(self, index: int) -> int:
        """Half width of layer `index`'s attention window: keys j with |i - j| <= it;
        0 for a global layer."""
        n = self.global_attn_every_n_layers
        return self.local_attention // 2 if n > 1 and index % n else 0

    def _check_pallas(self) -> None:
        """The Pallas kernel's tuning fields: 0 (the kernel's default) or a value it takes."""
        rules = {"pallas_block_q": ("a power of two >= 16", lambda v: v >= 16 and _pow2(v)),
                 "pallas_block_k": ("a power of two >= 16", lambda v: v >= 16 and _pow2(v)),
                 "pallas_bwd_block_q": ("a power of two >= 16",
                                        lambda v: v >= 16 and _pow2(v)),
                 "pallas_bwd_block_k": ("a power of two >= 16",
                                        lambda v: v >= 16 and _pow2(v)),
                 "pallas_num_warps": ("a power of two <= 32", lambda v: v <= 32 and _pow2(v)),
                 "pallas_num_stages": ("an integer >= 1", lambda v: v >= 1),
                 "pallas_bwd_num_warps": ("a power of two <= 32",
                                          lambda v: v <= 32 and _pow2(v)),
                 "pallas_bwd_num_stages": ("an integer >= 1", lambda v: v >= 1)}
        for key, (what, ok) in rules.items():
            value = getattr(self, key)
            if (not isinstance(value, int) or isinstance(value, bool) or value < 0
                    or (value and not ok(value))):
                raise ConfigError(f"BertConfig.{key} must be 0 (the kernel's default) or "
                                  f"{what}, got {value!r}")

    @property
    def pallas_options(self) -> dict:
        """The Pallas flash-attention kernel's keyword arguments these fields set
        (kernels.attention.pallas_flash.flash_attention): the unset (0) ones left out."""
        names = {"pallas_block_q": "block_q", "pallas_block_k": "block_k",
                 "pallas_bwd_block_q": "bwd_block_q", "pallas_bwd_block_k": "bwd_block_k",
                 "pallas_num_warps": "num_warps", "pallas_num_stages": "num_stages",
                 "pallas_bwd_num_warps": "bwd_num_warps",
                 "pallas_bwd_num_stages": "bwd_num_stages"}
        return {arg: getattr(self, key) for key, arg in names.items() if getattr(self, key)}

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def dtype_for(self, platform: str) -> str:
        """The compute dtype's name on `platform` ("gpu", "tpu", "cpu"): "auto" is
        bfloat16 on GPU and TPU, whose matrix units and memory bandwidth pay for half
        the bytes, and float32 on CPU, where bfloat16 has no speed to give and the
        goldens and the quick start are float32; any other value is itself."""
        if self.dtype != "auto":
            return self.dtype
        return "bfloat16" if platform in ("gpu", "tpu") else "float32"

    def describe_compute(self, platform: str) -> str:
        """The numerics on `platform` in a few words, for the run's first line: "compute
        bfloat16 (model.dtype=auto), params float32", and ", FP8 products (model.fp8)"."""
        line = (f"compute {self.dtype_for(platform)} (model.dtype={self.dtype}), params "
                f"{self.param_dtype}")
        return line + (", FP8 products (model.fp8)" if self.fp8 else "")

    @property
    def compute_dtype(self):
        """The compute dtype of the trace in progress: `dtype_for` the platform it compiles
        for (backend.platform: the mesh's devices, a compile target's included)."""
        return jnp.dtype(self.dtype_for(backend.platform()))

    @property
    def storage_dtype(self):
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes) -> "BertConfig":
        return dataclasses.replace(self, **changes)

    # --- (de)serialisation -------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, ignore: Iterable[str] = (),
                  source: str = "config") -> "BertConfig":
        """Builds a config; keys neither ours nor in `ignore` are an error naming them."""
        fields = {f.name for f in dataclasses.fields(cls)}
        ignore = set(ignore)
        unknown = sorted(k for k in d if k not in fields and k not in ignore)
        if unknown:
            raise ConfigError(
                f"{source}: unknown BERT config key(s) {unknown}; expected keys are "
                f"{sorted(fields)}")
        kwargs = {k: v for k, v in d.items() if k in fields}
        return cls(**kwargs)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike, *, ignore: Iterable[str] = ()) -> "BertConfig":
        try:
            with epath.Path(path).open("r", encoding="utf-8") as f:  # local or gs://
                d = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from e
        if not isinstance(d, dict):
            raise ConfigError(f"{path}: expected a JSON object, got {type(d).__name__}")
        return cls.from_dict(d, ignore=ignore, source=str(path))

    def to_dict(self, original_only: bool = False) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if original_only:
            d = {k: d[k] for k in ORIGINAL_KEYS}
        return d

    def to_json_string(self, original_only: bool = False) -> str:
        d = self.to_dict(original_only)
        if d.get("dtype") == "auto":
            # Left out (the default when read back): transformers reads a bert_config.json's
            # "dtype" as a torch dtype's name (getattr(torch, value)), which "auto" is not.
            del d["dtype"]
        return json.dumps(d, indent=2, sort_keys=True) + "\n"

    def to_json_file(self, path: str | os.PathLike, original_only: bool = False) -> None:
        with epath.Path(path).open("w", encoding="utf-8") as f:  # local or gs://
            f.write(self.to_json_string(original_only))


def _pow2(n: int) -> bool:
    return n > 0 and not n & (n - 1)


def model_config(**overrides):
    """The `model` section of a run config: every BertConfig field, as an
    ml_collections.ConfigDict (so `--config.model.dtype=bfloat16` works and unknown keys
    are errors once the config is locked)."""
    import ml_collections

    base = BertConfig().to_dict()
    unknown = sorted(set(overrides) - set(base))
    if unknown:
        raise ConfigError(f"model_config: unknown BERT config key(s) {unknown}")
    base.update(overrides)
    BertConfig(**base)  # validate now, not at the first step
    # An integer or "auto" in any config, set from Python or the command line (a plain
    # field would keep the type of the config's own value).
    base["scan_unroll"] = ml_collections.FieldReference(base["scan_unroll"], field_type=object)
    return ml_collections.ConfigDict(base)


def from_config_dict(section) -> BertConfig:
    """BertConfig from a config's `model` section (a ConfigDict or a mapping)."""
    d = section.to_dict() if hasattr(section, "to_dict") else dict(section)
    fields = {f.name for f in dataclasses.fields(BertConfig)}
    return BertConfig.from_dict({k: v for k, v in d.items() if k in fields},
                                source="config.model")
