"""One model with its criterion and optimizer, built and stepped as ``fairseq-train`` does it.

Precision is the recipes' (``fairseq-train --fp16`` / ``--bf16``): the whole model and criterion
are cast to half and fairseq's ``FP16Optimizer`` keeps fp32 master weights (with dynamic loss
scaling for fp16, none for bf16) -- not ``torch.autocast``, which is fairseq's ``--amp``.
"""

import time
from typing import List

import man_fairseq  # noqa: F401  (registers the plugin's archs and criterions)
from man_fairseq.paths import USER_DIR  # noqa: F401  (bench.model.USER_DIR, as cli.py imports it)

PRECISION_FLAGS = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"]}


def sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


class Built:
    """The model, criterion and optimizer of one benchmark entry, on ``device`` in ``dtype``."""

    def __init__(self, spec, model_spec, data_dir, device):
        from fairseq import optim, options, tasks, utils
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf

        self.label = model_spec["label"]
        argv = [
            data_dir, "--user-dir", USER_DIR, "--task", "translation", "--source-lang", "src",
            "--target-lang", "tgt", "--arch", model_spec["arch"], "--share-all-embeddings",
            "--criterion", model_spec["criterion"], "--label-smoothing", "0.1",
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.0005",
            "--max-tokens", str(spec["max_tokens"]), "--seed", str(spec["seed"]),
        ] + (["--cpu"] if device.type != "cuda" else []) + PRECISION_FLAGS[spec["dtype"]] + model_spec["extra_args"]
        args = options.parse_args_and_arch(options.get_training_parser(), argv)
        cfg = convert_namespace_to_omegaconf(args)
        utils.import_user_module(cfg.common)
        self.task = tasks.setup_task(cfg.task)
        self.model = self.task.build_model(cfg.model)
        self.criterion = self.task.build_criterion(cfg.criterion)
        # fairseq's Trainer: cast model and criterion, then build the optimizer on their parameters
        self.half = spec["dtype"] != "fp32"
        if self.half:
            dtype = half_dtype(spec["dtype"])
            self.model, self.criterion = self.model.to(dtype), self.criterion.to(dtype)
        self.model, self.criterion = self.model.to(device), self.criterion.to(device)
        self.params = sum(p.numel() for p in self.model.parameters())
        trainable = [p for p in self.model.parameters() if p.requires_grad] + [
            p for p in self.criterion.parameters() if p.requires_grad
        ]
        if self.half:
            self.optimizer = optim.FP16Optimizer.build_optimizer(cfg, trainable)
        else:
            self.optimizer = optim.build_optimizer(cfg.optimizer, trainable)
        self.device = device
        self.num_updates = 0
        self.skipped_updates = 0

    def train_step(self, sample):
        """forward + backward + optimizer step; returns ((wall s, process CPU s), loss per token)."""
        self.model.train()
        self.criterion.train()
        sync(self.device)
        t0, c0 = time.perf_counter(), time.process_time()
        self.optimizer.zero_grad()
        if hasattr(self.model, "set_num_updates"):
            self.model.set_num_updates(self.num_updates)
        if hasattr(self.criterion, "set_num_updates"):
            self.criterion.set_num_updates(self.num_updates)
        loss, sample_size, _ = self.criterion(self.model, sample)
        self.optimizer.backward(loss)
        # as fairseq's Trainer: normalise by the sample size, check for overflow (the fp16 loss
        # scaler lowers its scale and the update is skipped), step
        self.optimizer.multiply_grads(1.0 / max(1.0, float(sample_size)))
        try:
            self.optimizer.clip_grad_norm(0.0)
            self.optimizer.step()
        except OverflowError:
            self.skipped_updates += 1
        sync(self.device)
        self.num_updates += 1
        return (time.perf_counter() - t0, time.process_time() - c0), loss.item() / max(1.0, float(sample_size))

    def kernels(self) -> List[str]:
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


def half_dtype(name: str):
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[name]
