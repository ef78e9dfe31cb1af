"""Recipe configs (``configs/*.yaml``): loading, inheritance and validation.

A config is one row of one paper table. It names the architecture, the model options (agreed
fairseq option names, without the leading ``--``), the paper's training hyper-parameters and
effective batch, the evaluation settings and the paper's reported numbers. ``inherit:`` names
another YAML file (relative to the config) whose mapping is deep-merged underneath, so the
dataset-level settings live once in ``configs/_base/``.
"""

import copy
from pathlib import Path

import yaml

from man_recipes.metrics import config_metrics
from man_recipes.paths import CONFIG_DIR, REPO  # noqa: F401  (config.REPO: the recipes' name for it)
from man_recipes.scoring import ROUGE_ORDERS

# The keys a row config may carry; anything else is a typo and fails loudly.
TOP_LEVEL_KEYS = {
    "inherit", "name", "paper", "table", "row", "dataset", "task", "data", "source_lang",
    "target_lang", "arch", "model", "train", "batch", "eval", "paper_results", "notes",
}
PAPERS = {"man", "localness", "diffwin", "calibration"}
# ``paper: none``: an experiment config that is no paper row (e.g. configs/multi30k/); it needs
# no table / row / paper_results and the paper-table code (all_configs) leaves it out.
NO_PAPER = "none"


class ConfigError(ValueError):
    pass


def deep_merge(base, override):
    out = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _load_raw(path, seen=()):
    path = Path(path).resolve()
    if path in seen:
        raise ConfigError(f"inheritance cycle through {path}")
    with open(path) as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    parent = data.pop("inherit", None)
    if parent:
        base = _load_raw(path.parent / parent, seen + (path,))
        data = deep_merge(base, data)
    return data


def load_config(path):
    """Load a row config with its ``inherit`` chain resolved; validates the structure."""
    path = Path(path)
    if not path.is_file():
        # also accept a path relative to the repository, or a bare row name
        candidates = [REPO / path, CONFIG_DIR / f"{path}.yaml"]
        if len(path.parts) == 1:
            candidates += sorted(CONFIG_DIR.rglob(f"{path.name}.yaml"))
        found = [c for c in candidates if c.is_file()]
        if not found:
            where = ("" if CONFIG_DIR.is_dir() else f"; the recipe configs are the checkout's configs/ folder, which an "
                     f"installed wheel does not have ({CONFIG_DIR}): give a config file's path")
            raise ConfigError(f"config not found: {path}{where}")
        path = found[0]
    cfg = _load_raw(path)
    cfg.setdefault("name", path.stem)
    cfg["_path"] = str(path.resolve())
    validate(cfg)
    return cfg


# the archs that are pre-norm by default (--man-norm; transformer_man is transformer_man_base)
PRE_NORM_ARCHS = ("transformer_man", "transformer_man_small", "transformer_man_base", "transformer_man_big")


def validate(cfg):
    where = cfg.get("_path", cfg.get("name"))
    unknown = set(cfg) - TOP_LEVEL_KEYS - {"_path"}
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
    required = ("name", "paper", "table", "row", "dataset", "data", "arch", "train", "batch", "eval")
    if cfg.get("paper") == NO_PAPER:
        required = tuple(k for k in required if k not in ("table", "row"))
    for key in required:
        if key not in cfg:
            raise ConfigError(f"{where}: missing key '{key}'")
    if cfg["paper"] not in PAPERS | {NO_PAPER}:
        raise ConfigError(f"{where}: paper must be one of {sorted(PAPERS | {NO_PAPER})}, got {cfg['paper']!r}")
    if cfg["eval"].get("metric") not in config_metrics():  # man_recipes/metrics.py's records
        raise ConfigError(f"{where}: eval.metric must be one of {config_metrics()}")
    if cfg["eval"].get("rouge_order", "hyp-ref") not in ROUGE_ORDERS:
        raise ConfigError(f"{where}: eval.rouge_order must be one of {sorted(ROUGE_ORDERS)}")
    batch = cfg["batch"]
    for key in ("paper_gpus", "paper_update_freq"):
        if not isinstance(batch.get(key), int) or batch[key] < 1:
            raise ConfigError(f"{where}: batch.{key} must be a positive integer")
    if "max-tokens" not in cfg["train"]:
        raise ConfigError(f"{where}: train.max-tokens is required (the per-GPU batch of the paper)")
    model = cfg.get("model") or {}
    post = [k for k in ("encoder-normalize-before", "decoder-normalize-before") if model.get(k) is False]
    if post and cfg["arch"] in PRE_NORM_ARCHS and "man-norm" not in model:
        # a false flag is dropped from the command line, where this arch is pre-norm without it
        raise ConfigError(f"{where}: model.{post[0]}: false changes nothing on {cfg['arch']}, which is pre-norm "
                          "by default; set model.man-norm: post for post-norm")
    return cfg


def all_configs(config_dir=CONFIG_DIR, include_no_paper=False):
    """Every paper-row config (files under configs/ except the ``_base`` includes), sorted by name;
    ``paper: none`` experiment configs only with ``include_no_paper``."""
    paths = sorted(p for p in Path(config_dir).rglob("*.yaml") if "_base" not in p.parts)
    configs = [load_config(p) for p in paths]
    return [c for c in configs if include_no_paper or c["paper"] != NO_PAPER]


def option_args(options):
    """``{"encoder-layers": 6, "share-all-embeddings": True}`` -> fairseq argv fragments.

    True is a bare flag, False/None drop the option, lists are space-separated values.
    """
    argv = []
    for key, value in (options or {}).items():
        flag = "--" + str(key).lstrip("-")
        if value is True:
            argv.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            argv += [flag] + [str(v) for v in value]
        else:
            argv += [flag, str(value)]
    return argv
