"""The model builder of the in-process mode (``profile``): fairseq-train's arguments parsed and built as
fairseq-train does (``parse_args_and_arch`` -> omegaconf -> task -> model, criterion); the other modes run
fairseq-train itself."""

import man_fairseq  # noqa: F401  (registers the plugin's archs and criterions)


def build(argv):
    """(task, model, criterion, fairseq cfg) of fairseq-train's argument list ``argv``."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [str(a) for a in argv])
    cfg = convert_namespace_to_omegaconf(args)
    utils.import_user_module(cfg.common)
    task = tasks.setup_task(cfg.task)
    return task, task.build_model(cfg.model), task.build_criterion(cfg.criterion), cfg


def config_argv(cfg, data, extra=()):
    """fairseq-train's arguments of a recipe config on ``data`` as ``scripts/train.sh`` passes them, seed 1."""
    from man_recipes.training.launch import train_args

    return train_args(cfg, "/nonexistent-save-dir", device="cpu", precision="fp32", data=data,
                      extra=["--seed", 1, *extra])
