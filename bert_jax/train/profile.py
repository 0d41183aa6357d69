"""`train.profile_steps`: a jax.profiler trace of a few steps of a run."""

from __future__ import annotations

import os
import shutil
import tempfile

import jax
from etils import epath

from bert_jax import paths
from bert_jax.train import console


class Profiler:
    """A jax.profiler trace of steps first+1 .. first+count (first = the start step +
    `skip`), on process 0 only (each process would trace only its own devices). A bucket
    directory is traced locally and copied there (etils.epath) when the trace stops."""

    def __init__(self, directory: str, start: int, skip: int, count: int, is_main: bool):
        self.directory, self.active, self.local = directory, False, directory
        self.first = start + max(skip, 0) if count > 0 and is_main else None
        self.last = None if self.first is None else self.first + count

    def before(self, step: int) -> None:
        if step == self.first:
            if paths.is_uri(self.directory):
                self.local = tempfile.mkdtemp(prefix="bert_jax_profile_")
            jax.profiler.start_trace(self.local)
            self.active = True

    def after(self, step: int, state) -> None:
        if self.active and step == self.last:
            jax.block_until_ready(state)  # the traced steps' device work, not only dispatch
            self.close()
            console.say(f"profile of steps {self.first + 1}..{self.last} in {self.directory} "
                        f"(TensorBoard's profile tab, or xprof)")

    def close(self) -> None:
        if self.active:
            self.active = False
            jax.profiler.stop_trace()
            if self.local != self.directory:
                for root, _, files in os.walk(self.local):
                    for name in files:
                        rel = os.path.relpath(os.path.join(root, name), self.local)
                        target = epath.Path(self.directory) / rel
                        target.parent.mkdir(parents=True, exist_ok=True)
                        target.write_bytes(epath.Path(root, name).read_bytes())
                shutil.rmtree(self.local, ignore_errors=True)
