"""``from_pretrained(..., **overrides)`` follows the command line's ``--model-overrides`` rule (issue 82):
another family's option, a misspelt option and an attention backend on fairseq's own Transformer are
refused in one line naming the keyword (they were set where nothing reads them, without a word); an
option of the checkpoint, and the options of a tokenizer or BPE the keywords choose, are applied."""

import pytest

from test_bad_inputs import man_checkpoint  # noqa: F401  (a fixture)

from man_fairseq.plugin_options import PluginOptionError


def _save(folder, arch):
    """An untrained checkpoint of ``arch`` in ``folder`` as fairseq-train saves one, its dictionaries beside it."""
    from fairseq import checkpoint_utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    from conftest import build_fairseq_model

    model, _, args = build_fairseq_model(arch, ["--encoder-layers", "1", "--decoder-layers", "1"], dict_size=20,
                                         tmp_dir=folder)
    cfg = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
    checkpoint_utils.torch_persistent_save({"cfg": cfg, "args": None, "model": model.state_dict(), "optimizer_history": [
        {"criterion_name": "CrossEntropyCriterion", "optimizer_name": "Adam", "lr_scheduler_state": {},
         "num_updates": 0}], "extra_state": {}, "last_optimizer_state": None}, str(folder / "checkpoint_last.pt"))
    return folder


@pytest.fixture(scope="module")
def transformer_checkpoint(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("transformer_ckpt"), "transformer_iwslt_de_en")


def _load(folder, **overrides):
    from fairseq.models.transformer import TransformerModel

    return TransformerModel.from_pretrained(str(folder), checkpoint_file="checkpoint_last.pt",
                                            data_name_or_path=str(folder), **overrides)


@pytest.mark.parametrize("key, said", [
    ("localness_window", "has no option of that name, so it would be ignored; `man-options ARCH` lists"),
    ("dropuot", "has no option of that name, so it would be ignored; did you mean 'dropout'?")])
def test_a_keyword_the_checkpoint_has_no_option_of_is_refused(key, said, man_checkpoint):
    path = man_checkpoint / "checkpoint_last.pt"
    with pytest.raises(PluginOptionError) as e:
        _load(man_checkpoint, **{key: "gaussian"})
    assert str(e.value).startswith(f"from_pretrained({key}=...): {path} (arch transformer_man_small) {said}")


def test_an_attention_backend_on_fairseqs_transformer_is_refused(transformer_checkpoint):
    with pytest.raises(PluginOptionError, match=r"^from_pretrained\(attention_backend=\.\.\.\): .* \(arch "
                                                r"transformer_iwslt_de_en\) has no option of that name"):
        _load(transformer_checkpoint, attention_backend="flex")


def test_options_of_the_checkpoint_and_of_the_chosen_tokenizer_and_bpe_are_applied(man_checkpoint, tmp_path):
    codes = tmp_path / "code"
    codes.write_text("#version: 0.2\nw 1\n")
    hub = _load(man_checkpoint, dropout=0.25, attention_backend="explicit", beam=3, tokenizer="moses",
                moses_no_dash_splits=True, bpe="subword_nmt", bpe_codes=str(codes))
    assert (hub.cfg.model.dropout, hub.cfg.model.attention_backend, hub.cfg.generation.beam) == (0.25, "explicit", 3)
    assert hub.cfg.tokenizer.moses_no_dash_splits and hub.cfg.bpe.bpe_codes == str(codes)
