"""fairseq-train's own option parsing of every plugin family on a tiny dictionary: shared by the
option tests (tests/test_options.py, tests/test_option_errors.py)."""

from conftest import TINY_MODEL, USER_DIR

FAMILY_ARCH = {
    "transformer_man": "transformer_man_small",
    "transformer_localness": "transformer_localness_small",
    "transformer_diffwin": "transformer_diffwin_small",
    "transformer_calibrated": "transformer_calibrated_small",
    "transformer_masked": "transformer_masked_small",
}
CRITERION = "calibrated_label_smoothed_cross_entropy"


def parse(tmp_path, arch, *extra, criterion=None):
    """fairseq-train's own parsing (arch function included) on a tiny dictionary."""
    from fairseq import options
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(30):
        d.add_symbol(f"w{i}")
    for lang in ("src", "tgt"):
        d.save(str(tmp_path / f"dict.{lang}.txt"))
    argv = [str(tmp_path), "--user-dir", USER_DIR, "--task", "translation", "-s", "src", "-t", "tgt",
            "--arch", arch, "--share-all-embeddings", *TINY_MODEL, *map(str, extra)]
    if criterion is None and arch.startswith("transformer_calibrated") and "--criterion" not in argv:
        criterion = CRITERION  # the one it trains with
    if criterion:
        argv += ["--criterion", criterion]
    return options.parse_args_and_arch(options.get_training_parser(), argv)
