"""The torch and fairseq this plugin runs with, checked when ``man_fairseq`` is imported.

Neither is a declared dependency of the package (pyproject.toml says why), so a plain
``pip install`` of the plugin can leave one missing, too old, or a fairseq that does not import
(fairseq 0.12.2 on Python 3.11 raises a dataclass ValueError, fairseq issue 5012). Without this
check that surfaces as a traceback deep inside fairseq; with it, as one line naming what was
found, the supported versions and the install command. torch is checked before fairseq is
imported: fairseq's own import errors are the fallout of a missing or old torch.
"""

import re

# torch: the versions this project was tested with (the Makefile's 2.13.0 CPU wheel; 2.11.0+cu130
# on the GPU nodes, docs/install.md); older ones are refused rather than guessed at.
MIN_TORCH = (2, 11)
TESTED_TORCH = "2.11 and 2.13"
# fairseq: the 0.12 line, as the maintained forks ship it (`make install`'s FAIRSEQ_PKG)
FAIRSEQ_SERIES = (0, 12)
FAIRSEQ_PKG = "fairseq-fixed==0.12.3.1"
SUPPORTED = (f"man-fairseq needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (tested: {TESTED_TORCH}) and fairseq "
             f"0.12 ({FAIRSEQ_PKG}, or ve-fairseq==0.12.3)")
INSTALL = (f"`make install` in the checkout; into your own environment, after its torch: pip install -e CHECKOUT, "
           f"then pip install --no-deps --no-build-isolation {FAIRSEQ_PKG} (docs/install.md)")


def release(version):
    """The leading numbers of a version string: '2.13.0+cpu' -> (2, 13, 0)."""
    return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0])[:3])


def torch_problem(version):
    return f"torch {version} is too old" if release(version)[:2] < MIN_TORCH else None


def fairseq_problem(version):
    return None if release(version)[:2] == FAIRSEQ_SERIES else f"fairseq {version or '(no version)'} is not 0.12"


def message(what):
    return f"{what}: {SUPPORTED}; install: {INSTALL}"


def import_problem(name, err):
    if isinstance(err, ModuleNotFoundError) and err.name == name:
        return f"{name} is not installed"
    text = str(err).strip().splitlines()
    return f"{name} does not import ({type(err).__name__}: {text[0] if text else ''})"


def require():
    """Raise ImportError with one line when torch or fairseq is missing, too old or does not import."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001  (an unusable torch fails in many ways: OSError, ...)
        raise ImportError(message(import_problem("torch", e))) from None
    what = torch_problem(torch.__version__)
    if what is None:
        try:
            import fairseq
        except Exception as e:  # noqa: BLE001  (fairseq 0.12.2 on Python 3.11: ValueError)
            what = import_problem("fairseq", e)
        else:
            what = fairseq_problem(getattr(fairseq, "__version__", ""))
    if what is not None:
        raise ImportError(message(what))
