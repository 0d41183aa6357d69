"""Vectorized `tf.train.Example` serialization and TFRecord framing, without TensorFlow.

Written by hand because no library does it fast: building one `tf.train.Example` proto per
instance is slow in Python, and importing TensorFlow costs seconds and hundreds of MB of RSS
in every worker (benchmarks/RESULTS.md). Here a whole batch of instances is encoded with
numpy: every record is laid out in one row of a byte matrix with a validity mask, and
`matrix[mask]` concatenates the records. The bytes parse with `tf.io.parse_single_example`
to the same values (tests/data_prep/test_tfrecord.py).

Wire format (protobuf): Example{1: Features{1: map<string, Feature>}}; a map entry is
{1: key, 2: Feature}; Feature{2: FloatList, 3: Int64List}; each list {1: packed values}.
Int64 values are base-128 varints (non-negative here), floats are little-endian float32.
TFRecord: uint64 length, masked crc32c(length), data, masked crc32c(data).
"""

from __future__ import annotations

import struct
from typing import Iterator, Mapping

import numpy as np

try:  # a declared dependency; optional at import only (below)
    import google_crc32c
except ImportError:  # pragma: no cover - exercised by tests/test_gpu_suite.py's blocker
    class _NoCrc32c:
        """Stands in for google_crc32c where it is not installed: the pre-training task
        imports this module (through data_prep), and a machine that only builds and times
        models (benchmarks/gpu_suite.py on a GPU image) never checksums a record."""

        @staticmethod
        def value(data):
            raise ModuleNotFoundError("google_crc32c is not installed; reading or writing "
                                      "TFRecords needs it: pip install google-crc32c")

    google_crc32c = _NoCrc32c()

from bert_jax.data.features import PRETRAIN_FEATURES

_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


_THRESHOLDS = np.array([1 << (7 * b) for b in range(1, 10)], dtype=np.uint64)


def _varint_len(x: np.ndarray) -> np.ndarray:
    """Bytes of the varint encoding of each non-negative value (1..10)."""
    x = np.asarray(x).astype(np.uint64)
    return 1 + np.searchsorted(_THRESHOLDS, x, side="right")


def _varint_cols(x: np.ndarray, max_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Varints of x <[n, k]> as (bytes <uint8>[n, k*max_bytes], valid <bool>[n, k*max_bytes])."""
    x = np.asarray(x)
    n, k = x.shape
    lo, hi = (int(x.min()), int(x.max())) if x.size else (0, 0)
    if lo < 0:
        raise ValueError("negative int64 values are not supported by the fast serializer")
    if hi < 128:  # one byte each: the common case of masks, segment ids, labels, positions
        return x.astype(np.uint8), np.ones((n, k), dtype=bool)
    need = int(_varint_len(np.array([hi]))[0])
    if need > max_bytes:
        raise ValueError(f"value {hi} needs more than {max_bytes} varint bytes")
    dt = np.uint32 if need <= 4 else np.uint64
    x = x.astype(dt)
    out = np.empty((n, k, need), dtype=np.uint8)
    valid = np.empty((n, k, need), dtype=bool)
    valid[:, :, 0] = True
    for b in range(need):
        # byte b carries bits 7b..7b+6, with the high bit set when more bytes follow.
        more = x >= dt(1 << (7 * (b + 1))) if b + 1 < need else np.zeros((n, k), bool)
        out[:, :, b] = ((x >> dt(7 * b)) & dt(0x7F)).astype(np.uint8) | (more.view(np.uint8) << 7)
        if b + 1 < need:
            valid[:, :, b + 1] = more
    return out.reshape(n, k * need), valid.reshape(n, k * need)


def _bytes_needed(max_value: int) -> int:
    return int(_varint_len(np.array([max(max_value, 0)]))[0])


def _varint_bytes(v: int) -> bytes:
    out = bytearray()
    while True:
        out.append((v & 0x7F) | (0x80 if v >= 0x80 else 0))
        v >>= 7
        if not v:
            return bytes(out)


class _VarintTable:
    """Varints of 0..size-1 packed in uint32 words (bytes, and 0x01 where a byte is used):
    one 1-D `np.take` encodes a whole matrix of ids."""

    def __init__(self, size: int):
        x = np.arange(size, dtype=np.int64)[:, None]
        b, valid = _varint_cols(x, 4)
        self.bytes = np.zeros((size, 4), np.uint8)
        self.bytes[:, :b.shape[1]] = b
        self.valid = np.zeros((size, 4), np.uint8)
        self.valid[:, :b.shape[1]] = valid
        self.bytes = self.bytes.view("<u4")[:, 0].copy()
        self.valid = self.valid.view("<u4")[:, 0].copy()
        self.len = valid.sum(1).astype(np.uint8)


_TABLES: dict[int, _VarintTable] = {}


def _table(max_value: int) -> _VarintTable | None:
    if max_value >= 1 << 22:  # beyond ~4M a table costs more than it saves
        return None
    size = 1 << max(int(max_value).bit_length(), 7)
    if size not in _TABLES:
        _TABLES[size] = _VarintTable(size)
    return _TABLES[size]


def _encode_ints(v: np.ndarray, max_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Packed varint payload of each row: (bytes <uint8>[n, w], valid <bool>[n, w], len <[n]>)."""
    n, k = v.shape
    if v.size and (v.min() < 0 or v.max() > max_id):
        if v.min() < 0:
            raise ValueError("negative int64 values are not supported by the fast serializer")
        raise ValueError(f"value {v.max()} is above max_id={max_id}; varint bytes too few")
    hi = int(v.max()) if v.size else 0
    if hi < 128:  # one byte each: masks, segment ids, labels, positions < 128
        return v.astype(np.uint8), None, np.full(n, k, dtype=np.int64)
    t = _table(max_id)
    if t is None:
        b, valid = _varint_cols(v, _bytes_needed(max_id))
        return b, valid, valid.sum(1)
    b = np.take(t.bytes, v).view(np.uint8).reshape(n, 4 * k)
    valid = np.take(t.valid, v).view(bool).reshape(n, 4 * k)
    return b, valid, np.take(t.len, v).sum(1, dtype=np.int64)


def serialize_examples(features: dict[str, np.ndarray], max_id: int,
                       table: Mapping[str, tuple] = PRETRAIN_FEATURES) -> tuple[bytes, np.ndarray]:
    """TFRecord-framed `tf.train.Example`s for a batch.

    features: the names of `table` (PRETRAIN_FEATURES, or PACKED_FEATURES for packed rows)
    -> <int or float32>[n, length] (a length-1 feature may be [n]), written in the table's
    order; max_id: largest value any int64 feature can hold (e.g. vocab_size - 1).
    Returns (blob, ends): the framed records back to back and <int64>[n] end offsets.
    """
    n = len(features["input_ids"])
    if n == 0:
        return b"", np.zeros(0, dtype=np.int64)
    # Column blocks of the record matrix: (bytes [n, w] or bytes constant, valid or None).
    blocks: list = []
    features_len = np.zeros(n, dtype=np.int64)
    for name, (dtype, _) in table.items():
        v = np.asarray(features[name])
        if v.ndim == 1:
            v = v[:, None]
        if dtype == "float":
            payload = np.ascontiguousarray(v, dtype="<f4").view(np.uint8).reshape(n, -1)
            valid, plen = None, np.full(n, payload.shape[1], dtype=np.int64)
            list_tag = 0x12
        else:
            payload, valid, plen = _encode_ints(v, max_id)
            list_tag = 0x1A
        key = name.encode()
        if (plen == plen[0]).all():  # the whole entry header is one constant
            p0 = int(plen[0])
            lst = b"\x0a" + _varint_bytes(p0)
            feat = bytes([list_tag]) + _varint_bytes(len(lst) + p0) + lst
            entry = b"\x0a" + bytes([len(key)]) + key + b"\x12" + _varint_bytes(len(feat) + p0) + feat
            head = b"\x0a" + _varint_bytes(len(entry) + p0) + entry
            blocks.append((head, None))
            features_len += len(head) + p0
        else:
            list_len = 1 + _varint_len(plen) + plen             # 0x0A varint(plen) payload
            feat_len = 1 + _varint_len(list_len) + list_len     # tag varint(list_len) list
            key_hdr = b"\x0a" + bytes([len(key)]) + key + b"\x12"
            entry_len = len(key_hdr) + _varint_len(feat_len) + feat_len
            blocks += [(b"\x0a", None), _varint_cols(entry_len[:, None], 5),
                       (key_hdr, None), _varint_cols(feat_len[:, None], 5),
                       (bytes([list_tag]), None), _varint_cols(list_len[:, None], 5),
                       (b"\x0a", None), _varint_cols(plen[:, None], 5)]
            features_len += 1 + _varint_len(entry_len) + entry_len
        blocks.append((payload, valid))
    example_len = 1 + _varint_len(features_len) + features_len
    # TFRecord header: uint64 length + masked crc32c of those 8 bytes.
    hdr = np.empty((n, 12), dtype=np.uint8)
    hdr[:, :8] = example_len.astype("<u8").view(np.uint8).reshape(n, 8)
    # Records of a batch share few distinct lengths: one crc per distinct length.
    uniq, inverse = np.unique(example_len, return_inverse=True)
    hdr_crc = np.array([masked_crc32c(struct.pack("<Q", int(v))) for v in uniq],
                       dtype=np.uint32)[inverse]
    hdr[:, 8:] = hdr_crc.astype("<u4").view(np.uint8).reshape(n, 4)
    blocks = [(hdr, None), (b"\x0a", None), _varint_cols(features_len[:, None], 5)] + blocks
    blocks.append((bytes(4), None))  # room for the data crc
    # Lay the blocks side by side in one matrix; `valid` marks the bytes records keep.
    widths = [len(b) if isinstance(b, bytes) else b.shape[1] for b, _ in blocks]
    mat = np.empty((n, sum(widths)), dtype=np.uint8)
    valid = np.ones(mat.shape, dtype=bool)
    col = 0
    for (b, v), w in zip(blocks, widths):
        mat[:, col:col + w] = np.frombuffer(b, dtype=np.uint8) if isinstance(b, bytes) else b
        if v is not None:
            valid[:, col:col + w] = v
        col += w
    flat = mat[valid]
    rec_len = example_len + 16
    ends = np.cumsum(rec_len)
    starts = ends - rec_len
    data = flat.tobytes()  # google_crc32c takes bytes, not memoryviews
    crcs = np.fromiter((masked_crc32c(data[s + 12:e - 4])
                        for s, e in zip(starts.tolist(), ends.tolist())), dtype=np.uint32, count=n)
    flat[(ends - 4)[:, None] + np.arange(4)[None, :]] = (
        crcs.astype("<u4").view(np.uint8).reshape(n, 4))
    return flat.tobytes(), ends


def read_records(path: str, check_crc: bool = True) -> Iterator[bytes]:
    """The records of a TFRecord file (uncompressed), checking both CRCs."""
    with open(path, "rb") as f:
        while True:
            head = f.read(12)
            if not head:
                return
            if len(head) < 12:
                raise ValueError(f"{path}: truncated record header")
            (length,) = struct.unpack("<Q", head[:8])
            if check_crc and struct.unpack("<I", head[8:])[0] != masked_crc32c(head[:8]):
                raise ValueError(f"{path}: bad length crc")
            data = f.read(length)
            (crc,) = struct.unpack("<I", f.read(4))
            if check_crc and crc != masked_crc32c(data):
                raise ValueError(f"{path}: bad data crc")
            yield data
