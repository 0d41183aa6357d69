"""configs/-style file for launch/train.py tests: the tiny test model on synthetic data."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.train.common import tiny_config  # noqa: E402


def get_config(arg=None):
    del arg
    config = tiny_config(steps=20, checkpoint=dict(every=10, keep=5))
    config.train.tensorboard = False
    return config
