"""`to-savedmodel`: any of our checkpoints as a TensorFlow SavedModel for TF Serving.

    python -m bert_jax.convert to-savedmodel --checkpoint=/tmp/mrpc/best_model \
        --output=/tmp/mrpc_savedmodel/1 --with_tokenizer

The model goes through `jax.experimental.jax2tf` (native serialization: the exported
StableHLO runs inside TF's XlaCallModule op), with the parameters as tf.Variables. The
signature `serving_default` takes `input_ids`, `input_mask`, `segment_ids` (<int32>[batch,
length]; multiple choice: [batch, choices, length]), batch and length free (length at most
max_position_embeddings), and returns the head's outputs by name (HEAD_OUTPUTS), float32.
With a tokenizer (tensorflow-text's ops), `serve_text` takes <string>[batch] and
`serve_text_pair` takes two, and they also return the ids they built.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Callable, Mapping, Optional, Sequence
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from bert_jax import paths
from bert_jax.convert import sources
from bert_jax.errors import ReportedError
from bert_jax.models import bert as models
from bert_jax.models import layers
from bert_jax.models.config import BertConfig
from bert_jax.models.kernels import gelu as gelu_kernel
from bert_jax.tokenization import load_tokenizer

HEADS = ("encoder", "pretraining", "sequence", "token", "qa", "choice")
HEAD_OUTPUTS = {
    "encoder": ("sequence_output", "pooled_output"),
    "pretraining": ("mlm_logits", "nsp_logits"),
    "sequence": ("logits",),
    "token": ("logits",),
    "qa": ("start_logits", "end_logits"),
    "choice": ("logits",),
}
HEAD_NAMES = {"encoder": "the bare encoder", "pretraining": "pre-training (MLM/NSP)",
              "sequence": "sequence classification", "token": "token classification",
              "qa": "span question answering", "choice": "multiple choice"}
# A fine-tuning config's task.kind -> the head its "classifier" is.
TASK_HEADS = {"glue": "sequence", "ner": "token", "choice": "choice", "squad": "qa"}
INPUTS = ("input_ids", "input_mask", "segment_ids")
EXPORT_INFO = "bert_jax_export.json"
TEXT_MISSING = ("--with_tokenizer needs tensorflow-text, whose ops put the WordPiece "
                "tokenizer in the graph: pip install --no-deps \"tensorflow-text~={tf}\" (the "
                "release of the installed TensorFlow, {tf}; --no-deps keeps pip from adding "
                "the full tensorflow); or export without --with_tokenizer "
                "and tokenize on the client")


class ExportError(ValueError):
    """A checkpoint, head or option that cannot be exported (one line, naming the fix)."""


# --- which head ------------------------------------------------------------------------

def pick_head(params: Mapping, requested: str = "auto", task_kind: Optional[str] = None) -> str:
    """The head to export: `requested` if its parameters are there; "auto" reads it from
    the parameter trees, and a "classifier" (sequence, token or multiple choice: the same
    tree) from the training run's task.kind."""
    if requested not in ("auto",) + HEADS:
        raise ExportError(f"--head={requested}; expected auto or one of {', '.join(HEADS)}")
    present = sorted(k for k in params if k != "bert")
    if requested == "auto":
        if "mlm" in params:
            return "pretraining"
        if "qa_outputs" in params:
            return "qa"
        if "classifier" in params:
            if task_kind in TASK_HEADS and TASK_HEADS[task_kind] != "qa":
                return TASK_HEADS[task_kind]
            raise ExportError(
                "the checkpoint's 'classifier' head may be sequence classification, token "
                "classification or multiple choice, and it does not say which; pass "
                "--head=sequence, --head=token or --head=choice")
        return "encoder"
    need = {"pretraining": "mlm", "qa": "qa_outputs", "sequence": "classifier",
            "token": "classifier", "choice": "classifier"}.get(requested)
    if need and need not in params:
        raise ExportError(f"--head={requested} needs the '{need}' parameters, and the "
                          f"checkpoint has {', '.join(present) or 'no head'} besides the "
                          f"encoder; try --head=auto")
    if requested == "choice" and np.shape(params["classifier"]["dense"]["bias"])[0] != 1:
        raise ExportError("--head=choice needs a classifier with one output (one score per "
                          "choice); this one has "
                          f"{np.shape(params['classifier']['dense']['bias'])[0]}")
    return requested


def task_kind_of(checkpoint: str) -> Optional[str]:
    """task.kind of the model behind `checkpoint`: the task it records (a model directory's
    task.json, a Hugging Face directory's architecture, a run's config), else for an older
    WORKDIR/best_model the config of WORKDIR/run_<i>; None if there is none."""
    path = paths.resolve(checkpoint)
    try:
        recorded = sources.open_source(path, "--checkpoint").task
    except (FileNotFoundError, ValueError, ReportedError):
        recorded = None
    if recorded and recorded.get("kind"):
        return recorded["kind"]
    candidates = [path]
    if not sources.locate(path):
        parent = os.path.dirname(path)
        candidates = [paths.join(parent, f"run_{i}") for i in range(4)]
    for cand in candidates:
        if sources.locate(cand) is None:
            continue
        try:
            config = sources.open_run(cand, "--checkpoint").config
        except (FileNotFoundError, ValueError):
            continue
        kind = (config.get("task") or {}).get("kind")
        if kind:
            return kind
    return None


def head_function(head: str, config: BertConfig, params: Mapping
                  ) -> tuple[Callable, dict]:
    """(fn(params, input_ids, input_mask, segment_ids) -> {output name: float32 array},
    the parameter trees it reads)."""
    n = lambda tree: int(np.shape(tree["dense"]["bias"])[0])  # noqa: E731
    if head == "encoder":
        model, used = models.BertModel(config), {"bert": params["bert"]}
    elif head == "pretraining":
        nsp = "nsp" in params
        model = models.BertForPreTraining(config, nsp=nsp)
        used = {k: params[k] for k in ("bert", "mlm", "nsp") if k in params}
    elif head == "sequence":
        model = models.BertForSequenceClassification(config, n(params["classifier"]))
    elif head == "token":
        model = models.BertForTokenClassification(config, n(params["classifier"]))
    elif head == "qa":
        model = models.BertForQuestionAnswering(config)
    else:
        model = models.BertForMultipleChoice(config)
    if head in ("sequence", "token", "choice"):
        used = {"bert": params["bert"], "classifier": params["classifier"]}
    elif head == "qa":
        used = {"bert": params["bert"], "qa_outputs": params["qa_outputs"]}

    def fn(tree, input_ids, input_mask, segment_ids):
        out = model.apply({"params": tree}, input_ids, input_mask, segment_ids)
        if head == "encoder" or head == "qa":
            named = dict(zip(HEAD_OUTPUTS[head], out))
        elif head == "pretraining":
            named = {"mlm_logits": out[0]}
            if out[1] is not None:
                named["nsp_logits"] = out[1]
        else:
            named = {"logits": out}
        return {k: v.astype(jnp.float32) for k, v in named.items()}

    return fn, used


# --- jax -> TF --------------------------------------------------------------------------

def erf_rational(x):
    """erf from multiplies and one divide (Eigen's and XLA's float32 rational form, the one
    the GELU backward kernel uses): no chlo.erf in the exported program."""
    return gelu_kernel.erf_f32(x.astype(jnp.float32)).astype(x.dtype)


def _gelu_rational(x):
    half = jnp.asarray(0.5, x.dtype)
    return x * half * (1 + erf_rational(x * jnp.asarray(0.7071067811865476, x.dtype)))


@contextlib.contextmanager
def tf_compatible_export() -> None:
    """Inside: jax exports what the installed TensorFlow can run.

    - StableHLO: jax writes a version about a month old, which a TensorFlow released in the
      same period may not read yet ("failed to deserialize portable artifact"); the
      version is capped at the one TensorFlow's own StableHLO reports.
    - GELU: jax writes lax.erf as a composite op whose body TensorFlow's shape refinement
      does not reach, so a program with a free length fails to compile there ("op has
      dynamic shapes"); the exact GELU's erf is computed from a rational function instead.
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(layers, "gelu_erf", _gelu_rational))
        target = _tf_stablehlo_target()
        if target is not None:
            from jax._src import xla_bridge
            from jax._src.export import _export
            from jax._src.lib import _jax

            def to_bytecode(module):
                return _jax.mlir.serialize_portable_artifact(
                    module, target, xla_bridge.get_backend().serialize_with_sdy)

            stack.enter_context(mock.patch.object(_export, "_module_to_bytecode", to_bytecode))
        yield


def _tf_stablehlo_target() -> Optional[str]:
    """The older of jax's StableHLO target and TensorFlow's own version; None where either
    side does not say (jax's default then stands)."""
    try:
        from jax._src.export import _export
        from jax._src.lib.mlir.dialects import hlo
        from tensorflow.compiler.mlir.stablehlo import stablehlo as tf_stablehlo

        if not hasattr(_export, "_module_to_bytecode"):
            return None
        ours = hlo.get_version_from_compatibility_requirement(
            hlo.StablehloCompatibilityRequirement.WEEK_4)
        return tf_stablehlo.get_smaller_version(ours, tf_stablehlo.get_current_version())
    except (ImportError, AttributeError):
        return None


def _path_name(path) -> str:
    return "/".join(str(getattr(k, "key", k)) for k in path)


def build_module(params: Mapping, config: BertConfig, head: str,
                 vocab_file: Optional[str] = None, with_tokenizer: bool = False,
                 do_lower_case: bool = True, max_seq_length: Optional[int] = None,
                 platforms: Sequence[str] = ("cpu", "cuda")):
    """(tf.Module holding the variables and the signatures' functions, signatures)."""
    import tensorflow as tf
    from jax.experimental import jax2tf

    # An exported program runs on every platform it names, and its logits are held to
    # ours at 1e-4: model.dtype=auto exports float32 (an explicit dtype is kept).
    config = config.replace(scan_layers=False, remat="none", attention="xla",
                            dtype=config.dtype_for("cpu"), fp8=False)
    fn, used = head_function(head, config, params)
    leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(used)
    names = [_path_name(p) for p, _ in leaves_with_path]

    def flat_fn(flat, input_ids, input_mask, segment_ids):
        return fn(jax.tree_util.tree_unflatten(treedef, flat), input_ids, input_mask,
                  segment_ids)

    dims = "(b, c, l)" if head == "choice" else "(b, l)"
    converted = jax2tf.convert(
        flat_fn, polymorphic_shapes=[None, dims, dims, dims],
        polymorphic_constraints=(f"l <= {config.max_position_embeddings}",),
        with_gradient=False, native_serialization_platforms=tuple(platforms))

    module = tf.Module()
    module.variables_list = [tf.Variable(np.asarray(v), trainable=False, name=n)
                             for (_, v), n in zip(leaves_with_path, names)]
    rank = 3 if head == "choice" else 2
    specs = [tf.TensorSpec([None] * rank, tf.int32, name=k) for k in INPUTS]

    @tf.function(input_signature=specs, autograph=False)
    def serve(input_ids, input_mask, segment_ids):
        return converted(module.variables_list, input_ids, input_mask, segment_ids)

    module.serve = serve
    signatures = {"serving_default": serve}
    if vocab_file:
        module.vocab = tf.saved_model.Asset(vocab_file)
    if with_tokenizer:
        if not vocab_file:
            raise ExportError("--with_tokenizer needs the model's vocab.txt, and the "
                              "checkpoint has none; put vocab.txt in the model directory")
        encoder = TextEncoder(vocab_file, do_lower_case,
                              min(max_seq_length or config.max_position_embeddings,
                                  config.max_position_embeddings))
        module.text_encoder = encoder
        text_rank = [None] * (rank - 1)

        def with_ids(ids, mask, segments):
            out = dict(serve(ids, mask, segments))
            out.update(input_ids=ids, input_mask=mask, segment_ids=segments)
            return out

        @tf.function(input_signature=[tf.TensorSpec(text_rank, tf.string, name="text")],
                     autograph=False)
        def serve_text(text):
            return with_ids(*encoder(text))

        @tf.function(input_signature=[tf.TensorSpec(text_rank, tf.string, name="text"),
                                      tf.TensorSpec(text_rank, tf.string, name="text_pair")],
                     autograph=False)
        def serve_text_pair(text, text_pair):
            return with_ids(*encoder(text, text_pair))

        module.serve_text, module.serve_text_pair = serve_text, serve_text_pair
        signatures.update(serve_text=serve_text, serve_text_pair=serve_text_pair)
    return module, signatures


def export_savedmodel(output: str, params: Mapping, config: BertConfig, head: str,
                      vocab_file: Optional[str] = None, with_tokenizer: bool = False,
                      do_lower_case: bool = True, max_seq_length: Optional[int] = None,
                      platforms: Sequence[str] = ("cpu", "cuda")) -> dict:
    """Writes the SavedModel to OUTPUT (staged, renamed at the end; a URI works). Returns
    {"signatures": {name: ([inputs], [outputs])}} as TensorFlow records them."""
    import tensorflow as tf

    if with_tokenizer:
        require_tensorflow_text()
    with paths.staged_dir(output) as local:
        with tf_compatible_export():
            module, signatures = build_module(
                params, config, head, vocab_file, with_tokenizer, do_lower_case,
                max_seq_length, platforms)
            tf.saved_model.save(module, local, signatures=signatures)
        info = {"head": head, "platforms": list(platforms),
                "do_lower_case": do_lower_case if with_tokenizer else None,
                "signatures": {k: ([s.name for s in f.input_signature],
                                   sorted(f.get_concrete_function().structured_outputs))
                               for k, f in signatures.items()}}
        with open(os.path.join(local, EXPORT_INFO), "w", encoding="utf-8") as f:
            json.dump(dict(info, bert_config=config.to_dict()), f, indent=2)
    return info


def require_tensorflow_text():
    import tensorflow as tf

    try:
        import tensorflow_text  # noqa: F401
    except ImportError as e:
        raise ImportError(TEXT_MISSING.format(tf=tf.__version__)) from e


# --- the tokenizer in the graph ---------------------------------------------------------

# bert_jax.tokenization's WordPiece (tokenizers' BertNormalizer + BertPreTokenizer +
# WordPiece), rebuilt from TensorFlow and tensorflow-text ops that TF Serving links:
# - clean text: control and format characters removed, every separator a space;
_REMOVED = r"[\x{0}-\x{8}\x{B}\x{C}\x{E}-\x{1F}\x{7F}-\x{9F}\x{FFFD}\p{Cf}\p{Co}]"
_SEPARATORS = r"\p{Z}"
# - uncased: lower-case (Unicode, not case folding: "ß" stays), NFD, accents (Mn) dropped;
# - split on whitespace, and around each punctuation mark (ASCII symbols count) and CJK
#   character (the original's ranges), which are words of their own;
_KEPT = "|".join([r"[!-/:-@\[-`{-~\p{P}]", r"[\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}"
                  r"\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}\x{2B740}-\x{2B81F}"
                  r"\x{2B820}-\x{2CEAF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}]"])
_SPLIT = r"\s+|" + _KEPT
# - a word over 100 characters is [UNK]; then greedy longest-match-first WordPiece.
MAX_CHARS_PER_WORD = 100


def _text_encoder_class():
    import tensorflow as tf

    class TextEncoder(tf.Module):
        """strings -> (input_ids, input_mask, segment_ids) <int32>[..., length]: [CLS] a
        [SEP] (b [SEP]), a pair trimmed longest-first (B loses a token on a tie, as the
        original _truncate_seq_pair), padded to the longest row (at most max_seq_length)."""

        def __init__(self, vocab_file: str, do_lower_case: bool, max_seq_length: int):
            import tensorflow_text as tf_text

            super().__init__()
            tok = load_tokenizer(vocab_file=vocab_file, do_lower_case=do_lower_case)
            index = {t: i for i, t in enumerate(tok.vocab)}  # later duplicates win
            self.table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(
                    tf.constant(list(index), tf.string),
                    tf.constant(list(index.values()), tf.int64)), default_value=-1)
            self.do_lower_case = do_lower_case
            self.max_seq_length = max_seq_length
            self.cls_id, self.sep_id, self.pad_id = tok.cls_id, tok.sep_id, tok.pad_id
            self._split = tf_text.regex_split
            self._wordpiece = tf_text.WordpieceTokenizer(
                self.table, suffix_indicator="##", unknown_token="[UNK]",
                max_bytes_per_word=4 * MAX_CHARS_PER_WORD, token_out_type=tf.int64)
            self._normalize = tf_text.normalize_utf8

        def ids(self, text):
            """<string>[n] -> <int64>[n, (pieces)] word pieces, no specials."""
            text = tf.strings.regex_replace(text, _REMOVED, "")
            text = tf.strings.regex_replace(text, _SEPARATORS, " ")
            if self.do_lower_case:
                text = tf.strings.lower(text, encoding="utf-8")
                text = self._normalize(text, "NFD")
                text = tf.strings.regex_replace(text, r"\p{Mn}", "")
            words = self._split(text, _SPLIT, _KEPT)
            too_long = tf.strings.length(words.flat_values, unit="UTF8_CHAR") > \
                MAX_CHARS_PER_WORD
            words = words.with_flat_values(
                tf.where(too_long, tf.constant("[UNK]"), words.flat_values))
            return self._wordpiece.tokenize(words).merge_dims(-2, -1)

        def __call__(self, text, text_pair=None):
            shape = tf.shape(text)
            a = self.ids(tf.reshape(text, [-1]))
            la = a.row_lengths()
            if text_pair is None:
                b = tf.RaggedTensor.from_row_lengths(tf.zeros([0], tf.int64),
                                                     tf.zeros_like(la))
            else:
                b = self.ids(tf.reshape(text_pair, [-1]))
            lb = b.row_lengths()
            pair = tf.cast(lb > 0, tf.int64)
            budget = self.max_seq_length - 2 - pair
            keep_a = tf.where(la + lb <= budget, la,
                              tf.minimum(la, tf.maximum(budget - lb, (budget + 1) // 2)))
            keep_b = tf.minimum(lb, budget - keep_a)
            a = tf.ragged.boolean_mask(a, tf.ragged.range(la) < keep_a[:, None])
            b = tf.ragged.boolean_mask(b, tf.ragged.range(lb) < keep_b[:, None])
            n = tf.shape(la, out_type=tf.int64)[0]
            const = lambda v, k: tf.RaggedTensor.from_row_lengths(  # noqa: E731
                tf.fill([tf.reduce_sum(k)], tf.constant(v, tf.int64)), k)
            one = tf.ones([n], tf.int64)
            cls, sep, sep_b = const(self.cls_id, one), const(self.sep_id, one), \
                const(self.sep_id, pair)
            ids = tf.concat([cls, a, sep, b, sep_b], axis=1)
            first = keep_a + 2
            segments = tf.concat([const(0, first), const(1, keep_b + pair)], axis=1)
            ids = tf.cast(ids.to_tensor(default_value=self.pad_id), tf.int32)
            mask = tf.cast(tf.ones_like(segments).to_tensor(), tf.int32)
            segments = tf.cast(segments.to_tensor(), tf.int32)
            out_shape = tf.concat([shape, tf.shape(ids)[-1:]], axis=0)
            return tuple(tf.reshape(x, out_shape) for x in (ids, mask, segments))

    return TextEncoder


def TextEncoder(vocab_file: str, do_lower_case: bool = True, max_seq_length: int = 512):
    """The in-graph tokenizer (a tf.Module; needs tensorflow-text)."""
    require_tensorflow_text()
    return _text_encoder_class()(vocab_file, do_lower_case, max_seq_length)
