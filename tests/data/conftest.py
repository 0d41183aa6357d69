import pytest

from tests.data import fixtures


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """6 files of uneven sizes (length 32, 5 predictions): (glob, paths, records)."""
    d = tmp_path_factory.mktemp("shards")
    paths, records = fixtures.write_files(d, 6, [40, 33, 47, 29, 38, 41], seq=32, preds=5)
    return str(d / "*.tfrecord"), paths, records
