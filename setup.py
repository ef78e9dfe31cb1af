from setuptools import find_packages, setup

setup(
    name="man-fairseq",
    version="0.1.0",
    description="Local / masked attention Transformers (MAN, localness, differentiable window, "
    "attention calibration) as a fairseq user-dir plugin",
    packages=find_packages(include=["man_fairseq", "man_fairseq.*"]),
    python_requires=">=3.9",
    # torch and fairseq are installed explicitly by `make install` (see README): an unpinned
    # torch pulls a multi-GB CUDA build and the fairseq forks pin torchaudio.
    install_requires=[],
    entry_points={
        "console_scripts": [
            "man-average-checkpoints=man_fairseq.cli.average_checkpoints:cli_main",
            "man-localness-windows=man_fairseq.cli.localness_windows:cli_main",
            "man-export-calibration=man_fairseq.cli.export_calibration:cli_main",
            "man-attention-locality=man_fairseq.cli.attention_locality:cli_main",
            "man-options=man_fairseq.cli.options:cli_main",
            "man-diffwin-windows=man_fairseq.cli.diffwin_windows:cli_main",
            "man-analyze=man_fairseq.cli.analyze:cli_main",
            "man-files2rouge=man_fairseq.cli.files2rouge:cli_main",
        ]
    },
)
