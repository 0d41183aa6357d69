"""The loop's view of the input pipeline (bert_jax.data.pretrain): a train iterator with
get_state / set_state and a fresh eval iterable per evaluation, both yielding process-local
numpy batches of the original feature names."""

from __future__ import annotations


def make_train_data(config, workdir: str):
    from bert_jax.data import pretrain

    raise NotImplementedError(pretrain)


def make_eval_data(config, workdir: str):
    from bert_jax.data import pretrain

    raise NotImplementedError(pretrain)
