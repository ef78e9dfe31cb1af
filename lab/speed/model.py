"""The one model builder of every mode: fairseq-train's arguments parsed and built as fairseq-train does
(``parse_args_and_arch`` -> omegaconf -> task -> model, criterion), and :class:`Built`, a model with
its criterion and optimizer stepped as fairseq's Trainer steps it. Half precision is the recipes'
(``--fp16``/``--bf16``): the whole model cast, fp32 master weights in ``FP16Optimizer``; not autocast."""

import time

import man_fairseq  # noqa: F401  (registers the plugin's archs and criterions)
from man_fairseq.paths import USER_DIR

PRECISION_FLAGS = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"]}


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
    from man_fairseq.recipes.training.launch import train_args

    return train_args(cfg, "/nonexistent-save-dir", device="cpu", precision="fp32", data=data,
                      extra=["--seed", 1, *extra])


def sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


class Built:
    """A synthetic run's model (``model_spec``: arch, criterion, extra_args) on ``device`` in ``spec["dtype"]``."""

    def __init__(self, spec, model_spec, data_dir, device):
        import torch
        from fairseq import optim

        self.label = model_spec["label"]
        argv = [data_dir, "--user-dir", USER_DIR, "--task", "translation", "--source-lang", "src", "--target-lang",
                "tgt", "--arch", model_spec["arch"], "--share-all-embeddings", "--criterion", model_spec["criterion"],
                "--label-smoothing", "0.1", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.0005",
                "--max-tokens", spec["max_tokens"], "--seed", spec["seed"]] + (
            ["--cpu"] if device.type != "cuda" else []) + PRECISION_FLAGS[spec["dtype"]] + model_spec["extra_args"]
        self.task, self.model, self.criterion, cfg = build(argv)
        # fairseq's Trainer: cast model and criterion, then build the optimizer on their parameters
        self.half = spec["dtype"] != "fp32"
        if self.half:
            dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[spec["dtype"]]
            self.model, self.criterion = self.model.to(dtype), self.criterion.to(dtype)
        self.model, self.criterion = self.model.to(device), self.criterion.to(device)
        self.params = sum(p.numel() for p in self.model.parameters())
        trainable = [p for m in (self.model, self.criterion) for p in m.parameters() if p.requires_grad]
        self.optimizer = (optim.FP16Optimizer.build_optimizer(cfg, trainable) if self.half
                          else optim.build_optimizer(cfg.optimizer, trainable))
        self.device, self.num_updates, self.skipped_updates = device, 0, 0

    def train_step(self, sample):
        """forward + backward + optimizer step; returns ((wall s, process CPU s), loss per token)."""
        self.model.train()
        self.criterion.train()
        sync(self.device)
        t0, c0 = time.perf_counter(), time.process_time()
        self.optimizer.zero_grad()
        for m in (self.model, self.criterion):
            if hasattr(m, "set_num_updates"):
                m.set_num_updates(self.num_updates)
        loss, sample_size, _ = self.criterion(self.model, sample)
        self.optimizer.backward(loss)
        # as fairseq's Trainer: normalise by the sample size; on an fp16 overflow the loss scaler
        # lowers its scale and the update is skipped
        self.optimizer.multiply_grads(1.0 / max(1.0, float(sample_size)))
        try:
            self.optimizer.clip_grad_norm(0.0)
            self.optimizer.step()
        except OverflowError:
            self.skipped_updates += 1
        sync(self.device)
        self.num_updates += 1
        return (time.perf_counter() - t0, time.process_time() - c0), loss.item() / max(1.0, float(sample_size))

    def kernels(self):
        """The attention kernels the self-attentions took in their last call (e.g. ``sdpa[EFFICIENT,MATH]``)."""
        from man_fairseq.modules.biased_attention import BiasedMultiheadAttention

        seen = set()
        for m in self.model.modules():
            if isinstance(m, BiasedMultiheadAttention) and m.last_kernel is not None:
                k = m.last_kernel
                seen.add(k.path + (f"[{','.join(b.split('_')[0] for b in k.sdpa_backends)}]" if k.sdpa_backends else ""))
        return sorted(seen)

    def decode(self, generator, sample):
        """Beam search with the model as it is (cast like ``fairseq-generate --fp16/--bf16``)."""
        import torch

        self.model.eval()
        sync(self.device)
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.no_grad():
            hyps = generator.generate([self.model], sample)
        sync(self.device)
        return (time.perf_counter() - t0, time.process_time() - c0), hyps
