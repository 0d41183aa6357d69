"""Packed rows: two sequences A, B in one row give, per sequence, the encoder outputs, the
MLM and NSP losses and the gradients of A and B each alone in a padded row of its own
(float32, rtol 1e-5), on every attention path that runs on CPU: XLA (block-diagonal mask),
the Pallas kernel (interpret mode, segment ids) and TPU splash attention (interpret mode)."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import BertForPreTraining, BertModel
from bert_jax.models.kernels.attention import resolve
from bert_jax.models.embeddings import restart_positions
from bert_jax.tasks.pretraining.loss import pretraining_loss
from bert_jax.tasks import pretraining
from tests.models.helpers import tiny_config

LENGTH = 16
# A: [CLS] a a a [SEP] b b [SEP] (8 tokens); B: [CLS] c [SEP] d d d [SEP] (7 tokens)
A = dict(ids=[2, 11, 12, 13, 3, 21, 22, 3], types=[0, 0, 0, 0, 0, 1, 1, 1],
         predict=[(2, 12), (6, 22)], nsp=0)
B = dict(ids=[2, 31, 3, 41, 42, 43, 3], types=[0, 0, 0, 1, 1, 1, 1], predict=[(4, 42)],
         nsp=1)
SLOTS = 4  # MLM slots per row (unused ones weigh 0)


def _pad(x, n=LENGTH, value=0):
    return list(x) + [value] * (n - len(x))


def _slots(predictions, offset=0):
    pos = [p + offset for p, _ in predictions]
    ids = [t for _, t in predictions]
    return _pad(pos, SLOTS), _pad(ids, SLOTS), _pad([1.0] * len(pos), SLOTS, 0.0)


def _unpacked_batch():
    rows = [A, B]
    slots = [_slots(r["predict"]) for r in rows]
    return dict(
        input_ids=jnp.array([_pad(r["ids"]) for r in rows], jnp.int32),
        input_mask=jnp.array([_pad([1] * len(r["ids"])) for r in rows], jnp.int32),
        segment_ids=jnp.array([_pad(r["types"]) for r in rows], jnp.int32),
        masked_lm_positions=jnp.array([s[0] for s in slots], jnp.int32),
        masked_lm_ids=jnp.array([s[1] for s in slots], jnp.int32),
        masked_lm_weights=jnp.array([s[2] for s in slots], jnp.float32),
        next_sentence_labels=jnp.array([[A["nsp"]], [B["nsp"]]], jnp.int32))


def _packed_batch():
    """One row [A B padding] with a third, empty NSP slot; MLM slots of both sequences."""
    n_a = len(A["ids"])
    pos, ids, w = _slots(A["predict"] + [(p + n_a, t) for p, t in B["predict"]])
    real = len(A["ids"]) + len(B["ids"])
    return dict(
        input_ids=jnp.array([_pad(A["ids"] + B["ids"])], jnp.int32),
        input_mask=jnp.array([_pad([1] * real)], jnp.int32),
        segment_ids=jnp.array([_pad(A["types"] + B["types"])], jnp.int32),
        sequence_ids=jnp.array([_pad([1] * n_a + [2] * len(B["ids"]))], jnp.int32),
        masked_lm_positions=jnp.array([pos], jnp.int32),
        masked_lm_ids=jnp.array([ids], jnp.int32),
        masked_lm_weights=jnp.array([w], jnp.float32),
        next_sentence_positions=jnp.array([[0, n_a, 0]], jnp.int32),
        next_sentence_labels=jnp.array([[A["nsp"], B["nsp"], 0]], jnp.int32),
        next_sentence_weights=jnp.array([[1.0, 1.0, 0.0]], jnp.float32))


def _params(config):
    batch = _unpacked_batch()
    return flax.linen.meta.unbox(BertForPreTraining(config).init(
        jax.random.PRNGKey(3), **pretraining.model_inputs(batch))["params"])


def _encoder(config, params, batch):
    inputs = pretraining.model_inputs(batch)
    fn = jax.jit(lambda p, i: BertModel(config).apply(
        {"params": p}, i["input_ids"], i["attention_mask"], i["token_type_ids"],
        i.get("position_ids"), deterministic=True, sequence_ids=i.get("sequence_ids"))[0])
    return fn(params["bert"], inputs)


def _loss_and_grads(config, params, batch):
    model = BertForPreTraining(config)

    def loss(p, batch):
        mlm, nsp = model.apply({"params": p}, **pretraining.model_inputs(batch),
                               deterministic=True)
        return pretraining_loss(mlm, nsp, batch)

    (_, metrics), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, batch)
    return metrics, grads


def _assert_trees_close(got, want, rtol=1e-5):
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got),
                            jax.tree_util.tree_leaves(want)):
        atol = 1e-6 * max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol,
                                   err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("attention", ["xla", "pallas"])
def test_packed_row_equals_its_sequences_unpacked(attention):
    config = tiny_config(attention=attention)
    params = _params(config)
    unpacked, packed = _unpacked_batch(), _packed_batch()

    want = _encoder(config, params, unpacked)
    got = _encoder(config, params, packed)
    n_a, n_b = len(A["ids"]), len(B["ids"])
    np.testing.assert_allclose(got[0, :n_a], want[0, :n_a], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[0, n_a:n_a + n_b], want[1, :n_b], rtol=1e-5, atol=1e-5)

    want_m, want_g = _loss_and_grads(config, params, unpacked)
    got_m, got_g = _loss_and_grads(config, params, packed)
    for key in ("mlm_loss", "nsp_loss", "loss", "mlm_count", "nsp_count", "mlm_correct",
                "nsp_correct"):
        np.testing.assert_allclose(got_m[key], want_m[key], rtol=1e-5, err_msg=key)
    assert float(got_m["nsp_count"]) == 2.0 and float(got_m["mlm_count"]) == 3.0
    _assert_trees_close(got_g, want_g)


def test_the_packed_step_divides_by_sequences_not_rows():
    mlm_total, nsp_total = pretraining.totals(_packed_batch()).values()
    assert (float(mlm_total), float(nsp_total)) == (3.0, 2.0)
    with_fillers = dict(_packed_batch(), example_weights=jnp.zeros((1,), jnp.float32))
    assert float(pretraining.totals(with_fillers)["nsp"]) == pytest.approx(1e-5)


def test_restart_positions():
    ids = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0], [1, 1, 1, 1, 1, 1, 1, 1],
                     [1, 2, 2, 2, 1, 1, 0, 0]])
    assert restart_positions(ids).tolist() == [[0, 1, 2, 0, 1, 0, 0, 1],
                                               list(range(8)),
                                               [0, 0, 1, 2, 0, 1, 0, 1]]


def test_splash_attention_keeps_packed_sequences_apart_in_interpret_mode():
    from bert_jax.models.kernels.attention import splash_tpu
    heads, dim = 2, 16
    q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (1, LENGTH, heads, dim)) for i in range(3))
    seq = jnp.array([_pad([1] * 8 + [2] * 7)])
    got, vjp = jax.vjp(lambda *a: splash_tpu.attention(*a, seq, interpret=True), q, k, v)
    # Each sequence alone in a padded row of its own.
    for lo, hi in ((0, 8), (8, 15)):
        part = [jnp.pad(x[:, lo:hi], ((0, 0), (0, LENGTH - (hi - lo)), (0, 0), (0, 0)))
                for x in (q, k, v)]
        mask = jnp.arange(LENGTH)[None, :] < hi - lo
        want = splash_tpu.attention(*part, mask, interpret=True)
        np.testing.assert_allclose(got[:, lo:hi], want[:, :hi - lo], rtol=1e-5, atol=1e-6)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in vjp(jnp.ones_like(got)))


def test_auto_takes_pallas_for_packed_rows_and_explicit_cudnn_takes_them():
    config = tiny_config(dtype="bfloat16", attention_probs_dropout_prob=0.0)
    assert resolve("auto", "gpu", config, training=False, packed=False) == "cudnn"
    assert resolve("auto", "gpu", config, training=False, packed=True) == "pallas"
    # cudnn.py: the sequence ids as an additive mask (tests/models/kernels/test_cudnn.py)
    assert resolve("cudnn", "gpu", config, training=False, packed=True) == "cudnn"
