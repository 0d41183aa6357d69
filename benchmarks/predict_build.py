r"""What predicting with a fine-tuned model (`train.do_train=False`) builds before its first
eval batch, and its cost: the eval step alone (`loop.build_eval`, what predict builds) or the
training build (`loop.build`: the optimizer, the optimizer state's abstract tree, the train
step's jit), each measured in a fresh process.

    python benchmarks/predict_build.py --model=base
    python benchmarks/predict_build.py --model=tiny --repeats=3

--model: base (BERT-Base, H 768, 12 layers) or tiny (H 128, 2 layers), GLUE MRPC's head,
sequences of 128, float32 on this host's devices. Nothing is allocated on the devices by
either build (abstract shapes only) and neither compiles anything: the figures are the
host's wall time of the build and its peak memory (ru_maxrss) after it, in MiB. The last
line: the build's seconds and peak MiB for each, the median of --repeats processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODELS = {"base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                       intermediate_size=3072),
          "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=512)}


def child(model: str, mode: str) -> dict:
    """One build in this process: {"seconds", "peak_mib", "params"}."""
    import resource
    import time

    from bert_jax.models.config import from_config_dict
    from bert_jax.models.params import count_params
    from bert_jax.tasks.registry import task_from_config
    from bert_jax.train import loop
    from bert_jax.train.checked import check
    from configs.glue import get_config
    from data_prep import SAMPLE_VOCAB

    config = get_config("mrpc")
    config.model.update(dict(MODELS[model], dtype="float32"))
    config.train.update(dict(do_train=False, steps=1))
    checked = check(config)
    task = task_from_config(config, vocab_file=str(SAMPLE_VOCAB))
    task.prepare(config, from_config_dict(config.model), None, [], None)
    start = time.perf_counter()
    if mode == "eval":
        params = loop.build_eval(task, checked).abstract_params
    else:
        params = loop.build(config, task, checked, steps=1).abstract.params
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "peak_mib": peak, "params": count_params(params)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="base")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--child", choices=("eval", "training"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(a.model, a.child)))
        return
    figures = {}
    for mode in ("training", "eval"):
        runs = []
        for _ in range(a.repeats):
            out = subprocess.run([sys.executable, __file__, f"--model={a.model}",
                                  f"--child={mode}"], check=True, capture_output=True,
                                 text=True).stdout
            runs.append(json.loads(out.strip().splitlines()[-1]))
            print(f"{mode:>8} build: {runs[-1]['seconds']:.3f} s, peak "
                  f"{runs[-1]['peak_mib']:.0f} MiB ({runs[-1]['params']:,} params)",
                  flush=True)
        figures[mode] = (statistics.median(r["seconds"] for r in runs),
                         statistics.median(r["peak_mib"] for r in runs))
    (ts, tm), (es, em) = figures["training"], figures["eval"]
    print(f"{a.model}: training build {ts:.3f} s {tm:.0f} MiB; eval build {es:.3f} s "
          f"{em:.0f} MiB")


if __name__ == "__main__":
    main()
