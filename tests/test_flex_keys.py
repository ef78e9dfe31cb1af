"""lab.flex_keys: the static flex kernels an epoch's batches need, counted per attention kind."""

import numpy as np
import pytest

from lab import flex_keys
from lab.flex_keys import epoch_keys


def test_epoch_keys_known_answer():
    source = np.array([10, 12, 20, 130, 5, 6, 7])
    target = np.array([4, 5, 17, 9, 3, 3, 40])
    batches = [[0, 1, 2], [3], [4, 5, 6], [0, 1, 4]]
    as_is = epoch_keys(batches, source, target, pad_batch=False)
    # batch 1: 3 sentences, sources up to 20 (bucket 32), targets up to 17 (32); batch 2: 1, 130
    # (256), 9 (16); batch 3: 3, 7 (16), 40 (64); batch 4: 3, 12 (16), 5 (16)
    assert as_is["encoder self"] == {(3, 32, 32), (1, 256, 256), (3, 16, 16)}
    assert as_is["decoder self"] == {(3, 32, 32), (1, 16, 16), (3, 64, 64), (3, 16, 16)}
    assert as_is["cross"] == {(3, 32, 32), (1, 16, 256), (3, 64, 16), (3, 16, 16)}
    padded = epoch_keys(batches, source, target, pad_batch=True)
    assert padded["encoder self"] == {(4, 32, 32), (1, 256, 256), (4, 16, 16)}
    assert {n for keys in padded.values() for n, _, _ in keys} == {1, 4}


def test_cli_counts_a_real_data_folder(toy_data_bin, capsys):
    flex_keys.main([str(toy_data_bin), "--source-lang", "src", "--target-lang", "tgt", "--max-tokens", "64"])
    out = capsys.readouterr().out
    assert "batches of" in out and "| encoder self |" in out
    rows = [line.split("|")[2:4] for line in out.splitlines() if line.startswith("| ") and "keys" not in line]
    assert len(rows) == 3 and all(0 < int(padded) <= int(as_is) for padded, as_is in rows), out


def test_a_folder_without_the_pair_is_one_line(tmp_path):
    with pytest.raises(SystemExit, match="has no dict.article.txt"):
        flex_keys.main([str(tmp_path)])
