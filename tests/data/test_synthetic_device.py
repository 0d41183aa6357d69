"""Synthetic batches, the device hand-off and the orbax item, all without TensorFlow."""

import os
import subprocess
import sys

import numpy as np

from bert_jax.data import pretrain

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_synthetic_batches_look_like_pretraining_data():
    cfg = pretrain.data_config(source="synthetic", max_seq_length=64,
                               max_predictions_per_seq=10)
    it = pretrain.train_iterator(cfg, 16, process_index=1, process_count=2)
    b = next(it)
    assert {k: (v.shape, v.dtype.name) for k, v in b.items()} == {
        "input_ids": ((8, 64), "int32"), "input_mask": ((8, 64), "int32"),
        "segment_ids": ((8, 64), "int32"), "masked_lm_positions": ((8, 10), "int32"),
        "masked_lm_ids": ((8, 10), "int32"), "masked_lm_weights": ((8, 10), "float32"),
        "next_sentence_labels": ((8,), "int32"), "example_weights": ((8,), "float32")}
    assert (b["input_ids"][:, 0] == 101).all() and (b["input_ids"][:, -1] == 102).all()
    assert (b["input_ids"] < 30522).all() and (b["input_ids"] >= 0).all()
    pos = b["masked_lm_positions"]
    assert (np.diff(pos, axis=1) > 0).all()
    assert (np.take_along_axis(b["input_ids"], pos, 1) == 103).all()
    assert not np.isin(b["masked_lm_ids"], [0, 101, 102, 103]).any()
    # state: resume is exact, other hosts differ
    state = it.get_state()
    ref = next(it)
    it2 = pretrain.train_iterator(cfg, 16, process_index=1, process_count=2)
    it2.set_state(state)
    np.testing.assert_array_equal(next(it2)["input_ids"], ref["input_ids"])
    other = next(pretrain.train_iterator(cfg, 16, process_index=0, process_count=2))
    assert not np.array_equal(other["input_ids"], b["input_ids"])


_NO_TF = r"""
import sys
import jax, numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh
from bert_jax.data import pretrain, device, synthetic, state, checkpointing

assert len(jax.devices()) == 8
cfg = pretrain.data_config(source="synthetic", max_seq_length=32,
                           max_predictions_per_seq=5)
pretrain.check_input(cfg)
mesh = Mesh(np.array(jax.devices()).reshape(2, 4, 1), ("data", "fsdp", "tensor"))
sharding = device.batch_sharding(mesh)
assert sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp")), sharding.spec

host = pretrain.train_iterator(cfg, 16)
local = host.batch(0)
batch = device.to_global(local, sharding)
for k, v in batch.items():
    assert v.shape == local[k].shape and v.sharding == sharding, k
    np.testing.assert_array_equal(np.asarray(v), local[k])
    # 8 devices, 2 rows each, in order
    rows = sorted((s.index[0].start, s.data.shape[0]) for s in v.addressable_shards)
    assert rows == [(2 * i, 2) for i in range(8)], rows

# The prefetcher runs ahead; its state must still resume exactly.
pf = device.DevicePrefetcher(pretrain.train_iterator(cfg, 16), sharding, size=3)
for _ in range(3):
    next(pf)
import time; time.sleep(0.5)   # let the thread fill its queue
st = pf.get_state()
assert state.unpack_meta(st)["prefetched"] == 3, state.unpack_meta(st)
ref = [next(pf) for _ in range(6)]
pf.close()

directory = sys.argv[1]
mngr = ocp.CheckpointManager(directory, item_names=("data",))
mngr.save(3, args=ocp.args.Composite(data=checkpointing.InputStateSave(state=st)))
mngr.wait_until_finished()
pf2 = device.DevicePrefetcher(pretrain.train_iterator(cfg, 16), sharding, size=3)
next(pf2)
mngr.restore(3, args=ocp.args.Composite(data=checkpointing.InputStateRestore(pf2)))
for a in ref:
    b = next(pf2)
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
pf2.close()
bad = [m for m in sys.modules if m == "tensorflow" or m.startswith("tensorflow.")]
assert not bad, f"tensorflow was imported: {bad[:5]}"
print("OK")
"""


def test_synthetic_device_and_checkpoint_without_tensorflow(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=8")
    out = subprocess.run([sys.executable, "-c", _NO_TF, str(tmp_path / "ckpt")], env=env,
                         cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and "OK" in out.stdout, out.stderr[-3000:]


_HOST = r"""
import sys
import numpy as np
import jax
jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=2,
                           process_id=int(sys.argv[2]))
from jax.experimental import multihost_utils
from jax.sharding import Mesh
from bert_jax.data import device, pretrain

assert jax.process_count() == 2 and jax.device_count() == 4
cfg = pretrain.data_config(source="synthetic", max_seq_length=16,
                           max_predictions_per_seq=3)
mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 1), ("data", "fsdp", "tensor"))
with device.DevicePrefetcher(pretrain.train_iterator(cfg, 8), device.batch_sharding(mesh)) as pf:
    batch = next(pf)
everything = multihost_utils.process_allgather(batch, tiled=True)
for name, value in everything.items():
    # the global batch is host 0's local batch followed by host 1's
    want = np.concatenate([pretrain.train_iterator(cfg, 8, process_index=h,
                                                   process_count=2).batch(0)[name]
                           for h in (0, 1)])
    assert value.shape[0] == 8, value.shape
    np.testing.assert_array_equal(value, want, err_msg=name)
print("host", jax.process_index(), "OK", flush=True)
"""


def test_two_processes_assemble_one_global_batch(tmp_path):
    """Two real JAX processes (2 CPU devices each): each feeds its host-local batch and the
    global array is the two batches, in process order, on the ("data", "fsdp") axes."""
    import socket
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu",
               XLA_FLAGS="--xla_force_host_platform_device_count=2")
    procs = [subprocess.Popen([sys.executable, "-c", _HOST, f"localhost:{port}", str(i)],
                              env=env, cwd=REPO, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    outs = [p.communicate(timeout=240) for p in procs]
    for i, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"host {i} OK" in out, err[-3000:]
