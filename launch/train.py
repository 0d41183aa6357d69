r"""Pre-train or fine-tune BERT: one command from a CPU to a TPU pod, one training loop
(bert_jax.train.loop) under both; the config decides the task.

    python launch/train.py --config=configs/bert_tiny.py --workdir=/tmp/bert_tiny
    python launch/train.py --config=configs/bert_base.py --workdir=gs://bucket/base \
        --config.data.train_files='gs://bucket/data/train-*' \
        --config.data.eval_files='gs://bucket/data/eval-*' --config.mesh.fsdp=-1 \
        --config.mesh.data=1
    python launch/train.py --config=configs/bert_base.py:phase2 --workdir=... \
        --config.train.init_checkpoint=<phase-1 workdir>
    python launch/train.py --config=configs/glue.py:mrpc --workdir=... \
        --config.train.init_checkpoint=<model dir> --config.task.data_dir=glue_data/MRPC
    python launch/train.py --config=configs/swag.py --workdir=... \
        --config.train.init_checkpoint=<model dir> --config.task.train_file=train.csv \
        --config.task.dev_file=val.csv
    python launch/train.py --config=configs/bert_tiny.py --config.train.steps=10 --print_config

Runs the installed bert_jax and data_prep packages (`python -m pip install -e .` in a
checkout, as the README's quick start does), never a copy found through this file's folder.

The config is a plain Python file (configs/*.py); every key is documented in
docs/configuration.md. `--config.section.key=value` overrides, and an unknown key is an
error; --print_config prints the resolved config as YAML and exits (no --workdir needed).

Restarting the same command resumes from WORKDIR/checkpoints. SIGTERM saves and exits 0. A
mistake in the config, the flags or the input files ends in one line, `error: ...`, and exit
code 2 (a fault of the run's environment: 1); --verbose adds the traceback.

Multi-host: on TPU VMs (every host runs this same command) `jax.distributed.initialize()`
is called automatically; elsewhere pass --coordinator_address=host:port
--num_processes=N --process_id=i (or --distributed=on where the cluster is auto-detected,
e.g. SLURM). A SIGTERM to any process saves the same step on all of them; a lost process
(config.train.heartbeat_timeout) or a save failing on one of them ends every process in
one line each (docs/checkpoints.md).
"""

from __future__ import annotations

import os
import sys

from bert_jax import cli, supervise

cli.quiet_native_logs()  # before TensorFlow loads
if __name__ == "__main__" and supervise.wanted(sys.argv):
    # One of several processes: this command again as a child, whose end (even jax's abort
    # when another process is lost) is one line here.
    sys.exit(supervise.run(sys.argv))

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

from bert_jax.tasks import finetune, predict, pretraining  # noqa: E402
from bert_jax.train import coordination, runtime  # noqa: E402
from bert_jax.train.config import check_config_flag, config_path  # noqa: E402

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file(
    "config", None, "Run config: configs/<name>.py[:arg]; override keys with "
    "--config.section.key=value. Keys: docs/configuration.md; --print_config shows them.",
    lock_config=True)
flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and TensorBoard events "
                    "(required unless --print_config).")
flags.DEFINE_bool("print_config", False, "Print the resolved config (after the --config.* "
                  "overrides) as YAML and exit; nothing is built or run.")
flags.DEFINE_enum("distributed", "auto", ["auto", "on", "off"],
                  "jax.distributed.initialize(): auto = on TPU VMs or when "
                  "--coordinator_address is set; on = always (SLURM etc. auto-detected).")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process).")
flags.DEFINE_integer("num_processes", None, "Number of processes (multi-process).")
flags.DEFINE_integer("process_id", None, "This process's index (multi-process).")
flags.DEFINE_integer("debug_kill_after_step", None,
                     "Testing hook: SIGKILL this process as soon as the checkpoint of this "
                     "step is on disk (simulates a crash).")
flags.DEFINE_integer("debug_fail_save_at_step", None,
                     "Testing hook: this process's part of the checkpoint of this step fails "
                     "(no space left on device), as a full disk fails it.")
flags.mark_flag_as_required("config")


def config_yaml(config) -> str:
    """The config's values as plain YAML (tuples as lists), keys sorted as the config has
    them: readable, and loadable with yaml.safe_load. Not ConfigDict.to_yaml(), which
    serializes the Python objects (types, FieldReferences), nor str(config), which tags
    tuples `!!python/tuple`."""
    import yaml

    def sequence(dumper, value):  # a list of scalars on one line: `lrs: [1e-05, 2e-05]`
        flat = not any(isinstance(v, (list, tuple, dict)) for v in value)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flat)

    class Dumper(yaml.SafeDumper):
        pass

    Dumper.add_representer(tuple, sequence)
    Dumper.add_representer(list, sequence)
    return yaml.dump(config.to_dict(), Dumper=Dumper, default_flow_style=False,
                     sort_keys=False, width=100)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from absl import logging as absl_logging

    if not FLAGS["verbosity"].present:  # orbax logs every save at INFO
        absl_logging.set_verbosity(absl_logging.WARNING)
    # A --config file that does not exist parses (ml_collections defers the error to the
    # first use of the config): name it now.
    config_path(config_flags.get_config_filename(FLAGS["config"]), repo_fallback=False)
    if FLAGS.print_config:
        print(config_yaml(FLAGS.config), end="")
        return
    if FLAGS.workdir is None:
        raise app.UsageError("--workdir is required (only --print_config runs without it)")
    runtime.initialize(FLAGS.distributed, FLAGS.coordinator_address, FLAGS.num_processes,
                       FLAGS.process_id,
                       heartbeat_timeout=FLAGS.config.train.get("heartbeat_timeout", 60),
                       workdir=FLAGS.workdir, verbose=FLAGS.verbose)

    def kill_after(step):
        if step == FLAGS.debug_kill_after_step:
            import signal

            os.kill(os.getpid(), signal.SIGKILL)

    after_save = kill_after if FLAGS.debug_kill_after_step is not None else None
    try:
        if FLAGS.config.get("task", None) is not None:
            # Fine-tuning configs (configs/glue.py, squad.py, ner.py, swag.py: a `task`
            # section): the sweep of restarts x learning rates over the same loop. An
            # unknown task.kind is an error there, never a pre-training run.
            # train.do_train=False predicts with a fine-tuned model instead.
            if FLAGS.config.train.do_train:
                finetune.run(FLAGS.config, FLAGS.workdir)
            else:
                predict.run(FLAGS.config, FLAGS.workdir)
            return
        pretraining.run(FLAGS.config, FLAGS.workdir, after_save=after_save,
                        fail_save_at=FLAGS.debug_fail_save_at_step)
    except Exception as e:  # noqa: BLE001
        coordination.explain(e)  # a lost process: its one line ends this one here (exit 1)
        raise


if __name__ == "__main__":
    # A file the config names that is not there (task files, init_checkpoint, vocabulary)
    # is the user's mistake too: one line.
    cli.run(main, diagnose=check_config_flag, also=(FileNotFoundError,))
