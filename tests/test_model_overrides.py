"""``--model-overrides`` of the analysis commands is read as a literal dict, never evaluated."""

import pytest

from man_recipes.cli import localness_windows
from man_recipes.analysis.utils import parse_model_overrides


def test_a_literal_dict_is_parsed():
    assert parse_model_overrides("{'attention_backend': 'flex', 'dropout': 0.0}") == {
        "attention_backend": "flex", "dropout": 0.0}
    assert parse_model_overrides("{}") == {}


@pytest.mark.parametrize("text", ["__import__('os').system('true')", "[1, 2]", "{1: 'x'}", "{'a': ", "dict(a=1)"])
def test_anything_else_is_refused_with_a_clear_error(text):
    with pytest.raises(SystemExit, match="--model-overrides must be a literal dict") as err:
        parse_model_overrides(text)
    assert repr(text) in str(err.value)


def test_localness_windows_never_runs_the_overrides_as_code(toy_data_bin, tmp_path, capsys):
    marker = tmp_path / "ran"
    evil = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    with pytest.raises(SystemExit) as stopped:  # refused as fairseq's parser reads it (the plugin's type)
        localness_windows.cli_main([str(toy_data_bin), "--path", str(tmp_path / "model.pt"), "--cpu",
                                    "--windows-output-dir", str(tmp_path / "out"), "--model-overrides", evil])
    assert stopped.value.code == 2
    assert "error: argument --model-overrides: must be a literal dict" in capsys.readouterr().err
    assert not marker.exists()
