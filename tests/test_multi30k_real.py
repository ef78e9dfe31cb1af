"""Multi30k end to end on the head of the real ../shared/data/multi30k (skips without it).

A file of its own so that pytest-xdist (--dist loadfile) can run it beside test_multi30k.py's
synthetic pipeline instead of after it.
"""

import gzip
import json

import pytest
from test_multi30k import check_results, prepare, reproduce_cmd, run, write_side


def test_pipeline_on_real_multi30k_head(shared_data, tmp_path):
    sample = shared_data / "multi30k"
    if not sample.is_dir():
        pytest.skip(f"{sample} is not present")
    head = tmp_path / "raw"
    head.mkdir()
    for stem, n in [("train", 400), ("val", 40), ("test_2016_flickr", 40)]:
        for lang in ("de", "en"):
            with gzip.open(sample / f"{stem}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f).rstrip("\n") for _ in range(n)]
            write_side(head / f"{stem}.{lang}", lines, gz=True)
    data, _ = prepare(head, tmp_path)
    assert json.loads((data / "multi30k.json").read_text())["test_sets"] == {"test": "test_2016_flickr"}
    run(reproduce_cmd(data, tmp_path))
    check_results(tmp_path, ["test_2016_flickr"])
