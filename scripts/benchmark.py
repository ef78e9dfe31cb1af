#!/usr/bin/env python
"""Speed and memory of the man-fairseq families against fairseq's own Transformer.

For every case (a family's arch + options) and for fairseq's ``transformer`` of the same width,
on the SAME random token batches, this measures

* training target tokens/s: forward + backward + optimizer step with the family's criterion
  (``label_smoothed_cross_entropy`` or ``calibrated_label_smoothed_cross_entropy``) and
  fairseq's Adam, median over the timed iterations after warm-up iterations;
* peak training memory: on CPU the peak resident set size (VmHWM, reset through
  ``/proc/self/clear_refs`` after the model is built) minus the RSS just before the first
  update, i.e. gradients + Adam state + activations + allocator slack; on CUDA
  ``torch.cuda.max_memory_allocated`` minus the memory allocated before the first update;
* beam-search decoding sentences/s with fairseq's ``SequenceGenerator`` (beam 4) on one source
  batch; ``min_len = max_len_b`` forces every hypothesis to the same length, so untrained models
  that emit EOS at different times are compared on the same number of decoder steps.

Every model is built through fairseq's own path (``options.get_training_parser`` ->
``parse_args_and_arch`` -> ``convert_namespace_to_omegaconf`` -> ``tasks.setup_task`` ->
``task.build_model`` / ``task.build_criterion`` / ``optim.build_optimizer``) with
``--user-dir man_fairseq --share-all-embeddings`` on a temporary joined dictionary, and runs in a
subprocess of its own (so peak memory is per model and one model's allocator state does not
leave garbage for the next). It prints (and with ``--output`` writes) a Markdown table with the
absolute numbers, the case/baseline ratios, and each case's target.

Examples::

    python scripts/benchmark.py                                 # CPU, base width, all cases
    python scripts/benchmark.py --cases man --iters 5 --output bench.md
    python scripts/benchmark.py --device cuda --dtype fp16 --max-tokens 4096 --iters 20
    python scripts/benchmark.py --device cuda --dtype bf16 --width small,base,big \
        --backend auto,sdpa,flex,explicit --max-tokens 8192 --output bench-gpu.md   # scripts/benchmark_gpu.sh

Each family runs with ``--attention-backend`` set to every backend of ``--backend``; fairseq's
``transformer`` is measured again next to each (width, backend) group, in the same process, on
the same batches. The targets checked are the issue's: on CPU (issue 2) at base width, on CUDA
(issue 13) at every width, including peak memory for MAN. With ``flex`` the number of graphs
dynamo compiled during each model's steps is reported (bucketed lengths keep it small).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

REPO = Path(__file__).resolve().parent.parent
USER_DIR = str(REPO / "man_fairseq")

# fairseq's Transformer of each width (the baseline) and the dictionary size of the paper's
# parameter counts (IWSLT14 10k joint BPE, WMT14 En-De 37k joint BPE).
BASELINE_ARCH = {
    "tiny": "transformer_wmt_en_de",
    "small": "transformer_iwslt_de_en",
    "base": "transformer_wmt_en_de",
    "big": "transformer_vaswani_wmt_en_de_big",
}
DEFAULT_DICT_SIZE = {"tiny": 1000, "small": 10000, "base": 37000, "big": 37000}
# "tiny" is a smoke-test width: the base archs shrunk to a few thousand parameters per layer.
TINY_OVERRIDES = [
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
    "--encoder-layers", "3", "--decoder-layers", "3",
]
ARCH_WIDTH_SUFFIX = {"tiny": "base", "small": "small", "base": "base", "big": "big"}

# the values of --attention-backend (man_fairseq/modules/attention_backend.py; a test checks they agree)
ATTENTION_BACKENDS = ("auto", "sdpa", "flex", "explicit")

LS_CRITERION = "label_smoothed_cross_entropy"
CALIBRATED_CRITERION = "calibrated_label_smoothed_cross_entropy"


@dataclass
class Case:
    name: str
    family_arch: str  # arch name with "{w}" for the width suffix (small|base|big)
    extra_args: List[str] = field(default_factory=list)
    criterion: str = LS_CRITERION
    # ratio targets (case/baseline) that apply at base width: {"train": x, "decode": y}
    targets: Dict[str, float] = field(default_factory=dict)
    # issue 13's targets on CUDA, every width: "train"/"decode" >= x, "mem" (peak memory) <= x
    gpu_targets: Dict[str, float] = field(default_factory=dict)
    fixed_width: Optional[str] = None  # a case pinned to one width (man_small)
    note: str = ""

    def width(self, requested: str) -> str:
        if self.fixed_width and requested != "tiny":
            return self.fixed_width
        return requested

    def arch(self, width: str) -> str:
        return self.family_arch.format(w=ARCH_WIDTH_SUFFIX[width])


CASES = {
    c.name: c
    for c in [
        Case("man", "transformer_man_{w}", targets={"train": 0.85, "decode": 0.85},
             gpu_targets={"train": 0.95, "mem": 1.1, "decode": 0.95},
             note="issue 2: >= 0.85x training and decoding on CPU at base width; issue 13 (CUDA): "
                  ">= 0.95x training, <= 1.1x peak memory (equal FLOPs by design), >= 0.95x decoding"),
        Case("man_small", "transformer_man_{w}", fixed_width="small",
             gpu_targets={"train": 0.95, "mem": 1.1, "decode": 0.95},
             note="IWSLT size vs transformer_iwslt_de_en; no CPU target, MAN's targets on CUDA"),
        Case("localness", "transformer_localness_{w}", targets={"train": 0.95},
             gpu_targets={"train": 0.97, "decode": 0.95},
             note="default options: query-specific window, encoder layers 0,1,2; target >= 0.95x training "
                  "on CPU, >= 0.97x on CUDA (paper: 0.925x)"),
        Case("diffwin", "transformer_diffwin_{w}", ["--diffwin-preset", "enc_aw-cr_aw_seg-dec_mw"],
             targets={"train": 0.87}, gpu_targets={"train": 0.90, "decode": 0.95},
             note="Enc(AW)-Cr(AW,Seg)-Dec(MW); target >= 0.87x training on CPU, >= 0.90x on CUDA (paper: 0.87x)"),
        Case("calibration", "transformer_calibrated_{w}", criterion=CALIBRATED_CRITERION,
             gpu_targets={"decode": 0.95},
             note="two decoder passes per update: ~1.5x cost per update expected; no training target"),
    ]
}


def log(msg: str):
    print(f"[benchmark {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# worker: one model, in its own process
# ----------------------------------------------------------------------------------------------

def _rss_kib(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field_name} not in /proc/self/status")


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def write_dictionary(directory: str, size: int):
    """Joined src/tgt dictionary with ``size`` symbols in total (fairseq adds 4 specials)."""
    words = "".join(f"w{i} {size - i}\n" for i in range(size - 4))
    for lang in ("src", "tgt"):
        Path(directory, f"dict.{lang}.txt").write_text(words)


def make_batches(spec, dictionary):
    """Random sentences batched as fairseq-train does (sorted by length, --max-tokens)."""
    import numpy as np
    import torch
    from fairseq.data import LanguagePairDataset

    rng = np.random.RandomState(spec["seed"])
    n_train_batches = spec["warmup"] + spec["iters"]
    mean, std = spec["len_mean"], spec["len_std"]
    max_len = spec["len_max"]

    def sentences(n):
        src_len = np.clip(np.round(rng.normal(mean, std, n)), 2, max_len).astype(int)
        tgt_len = np.clip(np.round(src_len * rng.uniform(0.8, 1.25, n)), 2, max_len).astype(int)
        lo, hi = dictionary.nspecial, len(dictionary)

        def sent(length):
            toks = rng.randint(lo, hi, size=length - 1).tolist() + [dictionary.eos()]
            return torch.tensor(toks, dtype=torch.long)

        src = [sent(length) for length in src_len]
        tgt = [sent(length) for length in tgt_len]
        return src, tgt

    # a pool a few times bigger than what is used, so batches mix lengths like an epoch does
    pool = int(3 * n_train_batches * spec["max_tokens"] / mean) + 16
    src, tgt = sentences(pool)
    ds = LanguagePairDataset(
        src, np.array([len(s) for s in src]), dictionary, tgt, np.array([len(t) for t in tgt]), dictionary,
        left_pad_source=True, left_pad_target=False, shuffle=True,
    )
    with _numpy_seed(spec["seed"]):
        order = ds.ordered_indices()
    batches = ds.batch_by_size(order, max_tokens=spec["max_tokens"], required_batch_size_multiple=8)
    rng.shuffle(batches)
    train = [ds.collater([ds[int(i)] for i in b]) for b in batches[:n_train_batches]]
    if len(train) < n_train_batches:
        raise RuntimeError("not enough random sentences for the requested batches")

    dsrc, dtgt = sentences(spec["decode_sentences"])
    dds = LanguagePairDataset(
        dsrc, np.array([len(s) for s in dsrc]), dictionary, dtgt, np.array([len(t) for t in dtgt]),
        dictionary, left_pad_source=True, left_pad_target=False,
    )
    decode = dds.collater([dds[i] for i in range(len(dds))])
    return train, decode


class _numpy_seed:
    def __init__(self, seed):
        self.seed = seed

    def __enter__(self):
        from fairseq.data import data_utils

        self.ctx = data_utils.numpy_seed(self.seed)
        self.ctx.__enter__()

    def __exit__(self, *exc):
        return self.ctx.__exit__(*exc)


def _torch_setup(spec):
    import torch

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    device = torch.device(spec["device"])
    amp_dtype = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[spec["dtype"]]
    return device, amp_dtype


def _sync(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _autocast(device, amp_dtype):
    import torch

    if amp_dtype is None:
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=amp_dtype)


class Built:
    """One model with its criterion and optimizer, built as fairseq-train builds them."""

    def __init__(self, spec, model_spec, data_dir, device, amp_dtype):
        import torch
        from fairseq import optim, options, tasks, utils
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf

        self.label = model_spec["label"]
        argv = [
            data_dir, "--user-dir", USER_DIR, "--task", "translation", "--source-lang", "src",
            "--target-lang", "tgt", "--arch", model_spec["arch"], "--share-all-embeddings",
            "--criterion", model_spec["criterion"], "--label-smoothing", "0.1",
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.0005",
            "--max-tokens", str(spec["max_tokens"]), "--seed", str(spec["seed"]),
        ] + (["--cpu"] if device.type != "cuda" else []) + model_spec["extra_args"]
        args = options.parse_args_and_arch(options.get_training_parser(), argv)
        cfg = convert_namespace_to_omegaconf(args)
        utils.import_user_module(cfg.common)
        self.task = tasks.setup_task(cfg.task)
        self.model = self.task.build_model(cfg.model).to(device)
        self.criterion = self.task.build_criterion(cfg.criterion).to(device)
        self.params = sum(p.numel() for p in self.model.parameters())
        trainable = [p for p in self.model.parameters() if p.requires_grad] + [
            p for p in self.criterion.parameters() if p.requires_grad
        ]
        self.optimizer = optim.build_optimizer(cfg.optimizer, trainable)
        self.scaler = (torch.amp.GradScaler("cuda")
                       if device.type == "cuda" and amp_dtype == torch.float16 else None)
        self.device, self.amp_dtype = device, amp_dtype
        self.num_updates = 0

    def train_step(self, sample):
        """forward + backward + optimizer step; returns (seconds, loss per token)."""
        self.model.train()
        self.criterion.train()
        _sync(self.device)
        t0, c0 = time.perf_counter(), time.process_time()
        self.optimizer.zero_grad()
        if hasattr(self.model, "set_num_updates"):
            self.model.set_num_updates(self.num_updates)
        if hasattr(self.criterion, "set_num_updates"):
            self.criterion.set_num_updates(self.num_updates)
        with _autocast(self.device, self.amp_dtype):
            loss, sample_size, _ = self.criterion(self.model, sample)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer._optimizer)
            self.scaler.step(self.optimizer._optimizer)
            self.scaler.update()
        else:
            loss.backward()
            self.optimizer.step()
        _sync(self.device)
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
        import torch

        self.model.eval()
        _sync(self.device)
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.no_grad(), _autocast(self.device, self.amp_dtype):
            hyps = generator.generate([self.model], sample)
        _sync(self.device)
        return (time.perf_counter() - t0, time.process_time() - c0), hyps


def _flex_compiles() -> int:
    """Graphs dynamo has compiled in this process (flex_attention and block masks under torch.compile)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["stats"]["unique_graphs"])


def memory_worker(spec) -> dict:
    """Peak training memory of ONE model (this process holds nothing else)."""
    import torch

    device, amp_dtype = _torch_setup(spec)
    m = spec["models"][0]
    with tempfile.TemporaryDirectory() as data_dir:
        write_dictionary(data_dir, spec["dict_size"])
        built = Built(spec, m, data_dir, device, amp_dtype)
        train, _ = make_batches(spec, built.task.source_dictionary)
    # the largest batch of the set, the same one for every model
    sample = max(train, key=lambda b: b["net_input"]["src_tokens"].numel() + b["target"].numel())
    if device.type == "cuda":
        from fairseq import utils

        sample = utils.move_to_cuda(sample)
        torch.cuda.empty_cache()
        mem0 = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        reset_ok = True
    else:
        mem0 = _rss_kib("VmRSS") * 1024
        reset_ok = _reset_peak_rss()
    for it in range(spec["memory_iters"]):
        if device.type == "cuda" and it == 1:
            # the first step compiled / autotuned kernels (flex, cuDNN) and grew the allocator: with
            # more steps, the peak is the steady state's
            torch.cuda.reset_peak_memory_stats()
        (dt, _), loss = built.train_step(sample)
        log(f"  memory {m['label']}: step {it + 1}/{spec['memory_iters']} on the largest batch "
            f"({int(sample['ntokens'])} tok) {dt:.2f}s")
    if device.type == "cuda":
        peak_abs = torch.cuda.max_memory_allocated()
    else:
        peak_abs = _rss_kib("VmHWM") * 1024
    return {"params": built.params, "train_peak_bytes": int(peak_abs - mem0), "peak_abs_bytes": int(peak_abs),
            "peak_reset": reset_ok, "memory_batch_tokens": int(sample["ntokens"])}


def timing_worker(spec) -> dict:
    """Training and decoding speed of several models, interleaved batch by batch.

    All models of one width live in this process and take turns on every batch (A B C A B C ...),
    so a change of machine load during the run hits every model alike.
    """
    from fairseq import utils
    from fairseq.sequence_generator import SequenceGenerator

    device, amp_dtype = _torch_setup(spec)
    cuda = device.type == "cuda"
    results, models = {}, {}
    with tempfile.TemporaryDirectory() as data_dir:
        write_dictionary(data_dir, spec["dict_size"])
        for m in spec["models"]:
            try:
                t0 = time.perf_counter()
                models[m["key"]] = Built(spec, m, data_dir, device, amp_dtype)
                results[m["key"]] = {"params": models[m["key"]].params, "build_s": time.perf_counter() - t0}
                log(f"  built {m['label']}: {models[m['key']].params / 1e6:.2f}M parameters")
            except Exception as e:  # another family's code may be mid-edit; report, go on
                results[m["key"]] = {"error": f"build failed: {type(e).__name__}: {e}"}
                log(f"  {m['label']}: BUILD FAILED: {type(e).__name__}: {e}")
        if not models:
            return results
        first = next(iter(models.values()))
        train, decode_sample = make_batches(spec, first.task.source_dictionary)
    if cuda:
        train = [utils.move_to_cuda(b) for b in train]
        decode_sample = utils.move_to_cuda(decode_sample)
    batch_info = {
        "batch_tokens": [int(b["ntokens"]) for b in train],
        "batch_sentences": [int(b["nsentences"]) for b in train],
        "batch_pad_fraction": [
            float((b["net_input"]["src_tokens"] == first.task.source_dictionary.pad()).float().mean()) for b in train
        ],
    }
    times = {k: [] for k in models}
    cpu_times = {k: [] for k in models}
    compiles = {k: 0 for k in models}
    for it, sample in enumerate(train):
        phase = "warm-up" if it < spec["warmup"] else "timed"
        for key, built in list(models.items()):
            try:
                before = _flex_compiles()
                (dt, cpu), loss = built.train_step(sample)
                compiles[key] += _flex_compiles() - before
            except Exception as e:
                results[key] = {"error": f"training step failed: {type(e).__name__}: {e}"}
                log(f"  {built.label}: TRAIN STEP FAILED: {type(e).__name__}: {e}")
                del models[key]
                continue
            if it >= spec["warmup"]:
                times[key].append(dt)
                cpu_times[key].append(cpu)
            log(f"  train iter {it + 1}/{len(train)} ({phase}) {built.label}: "
                f"{int(sample['ntokens'])} tok in {dt:.2f}s (process CPU {cpu:.2f}s), loss {loss:.3f}")
    train_kernels = {key: built.kernels() for key, built in models.items()}
    for built in models.values():
        del built.optimizer  # free Adam state before decoding
    nsent = int(decode_sample["nsentences"])
    dec_times = {k: [] for k in models}
    dec_cpu_times = {k: [] for k in models}
    hyp_len = {}
    n_dec = spec["decode_warmup"] + spec["decode_iters"]
    for it in range(n_dec):
        phase = "warm-up" if it < spec["decode_warmup"] else "timed"
        for key, built in list(models.items()):
            generator = SequenceGenerator(
                [built.model], built.task.target_dictionary, beam_size=spec["beam"], max_len_a=0,
                max_len_b=spec["decode_len"], min_len=spec["decode_len"],
            )
            try:
                before = _flex_compiles()
                (dt, cpu), hyps = built.decode(generator, decode_sample)
                compiles[key] += _flex_compiles() - before
            except Exception as e:
                results[key] = {"error": f"decoding failed: {type(e).__name__}: {e}"}
                log(f"  {built.label}: DECODING FAILED: {type(e).__name__}: {e}")
                del models[key]
                continue
            if it >= spec["decode_warmup"]:
                dec_times[key].append(dt)
                dec_cpu_times[key].append(cpu)
            hyp_len[key] = statistics.mean(len(h[0]["tokens"]) for h in hyps)
            log(f"  decode {it + 1}/{n_dec} ({phase}) {built.label}: {nsent} sent x beam {spec['beam']} in {dt:.2f}s (process CPU {cpu:.2f}s)")
    tokens = batch_info["batch_tokens"][spec["warmup"]:]
    for key in models:
        r = results[key]
        r.update(batch_info)
        # the clock used for the rates: wall time, or the CPU time of this process (steadier on a
        # shared machine, meaningful with --threads 1 where no OpenMP thread spins)
        train_t = times[key] if spec["clock"] == "wall" else cpu_times[key]
        dec_t = dec_times[key] if spec["clock"] == "wall" else dec_cpu_times[key]
        r["train_times"], r["train_cpu_times"] = times[key], cpu_times[key]
        r["train_tok_s"] = statistics.median(n / t for n, t in zip(tokens, train_t))
        r["train_tok_s_wall"] = statistics.median(n / t for n, t in zip(tokens, times[key]))
        r["train_tok_s_cpu"] = statistics.median(n / t for n, t in zip(tokens, cpu_times[key]))
        r["train_tok_s_total"] = sum(tokens) / sum(train_t)
        r["decode_times"], r["decode_cpu_times"] = dec_times[key], dec_cpu_times[key]
        r["decode_sent_s"] = statistics.median(nsent / t for t in dec_t)
        r["decode_sent_s_wall"] = statistics.median(nsent / t for t in dec_times[key])
        r["decode_sent_s_cpu"] = statistics.median(nsent / t for t in dec_cpu_times[key])
        r["decode_sentences"] = nsent
        r["decode_hyp_len"] = hyp_len[key]
        r["compiled_graphs"] = compiles[key]
        r["train_kernels"], r["decode_kernels"] = train_kernels[key], models[key].kernels()
    return results


def registered(user_dir: str):
    """Arch and criterion names registered by fairseq + the plugin, as the CLI sees them."""
    from argparse import Namespace

    from fairseq import utils
    from fairseq.criterions import CRITERION_REGISTRY
    from fairseq.models import ARCH_MODEL_REGISTRY

    utils.import_user_module(Namespace(user_dir=user_dir))
    return set(ARCH_MODEL_REGISTRY), set(CRITERION_REGISTRY)


def spawn(spec, python: str) -> dict:
    """Run one model in a fresh process; returns its result dict or {'error': ...}."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        spec_path = f.name
    result_path = spec_path + ".out"
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(spec["threads"]))
    env.setdefault("MKL_NUM_THREADS", str(spec["threads"]))
    env.setdefault("PYTHONWARNINGS", "ignore")  # hydra deprecation chatter of fairseq 0.12
    try:
        proc = subprocess.run(
            [python, str(Path(__file__).resolve()), "--worker", spec_path, "--worker-output", result_path],
            env=env, stdout=subprocess.PIPE, stderr=None, text=True,
        )
        if proc.returncode != 0:
            return {"error": f"worker exited with {proc.returncode} (see its log above)"}
        with open(result_path) as f:
            return json.load(f)
    finally:
        for p in (spec_path, result_path):
            if os.path.exists(p):
                os.unlink(p)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fmt_ratio(x: Optional[float]) -> str:
    return "—" if x is None else f"{x:.3f}×"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--cases", default="all",
                   help=f"comma-separated subset of {','.join(CASES)} (default: all that are registered)")
    p.add_argument("--width", default="base",
                   help="model width(s), comma-separated: small, base, big; baselines: small=transformer_iwslt_de_en, "
                        "base=transformer_wmt_en_de, big=transformer_vaswani_wmt_en_de_big; tiny = base archs "
                        "shrunk (smoke test, alone)")
    p.add_argument("--backend", default="auto",
                   help=f"comma-separated --attention-backend values for the families "
                        f"({','.join(ATTENTION_BACKENDS)}); each is a group with its own baseline run")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32",
                   help="fp16/bf16 run under torch.autocast with fp32 weights (fairseq --amp style); "
                        "fp16 on CUDA uses a GradScaler")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    p.add_argument("--iters", type=int, default=None,
                   help="timed training iterations per model (default: 3 on CPU, 20 on CUDA)")
    p.add_argument("--warmup", type=int, default=None, help="untimed warm-up iterations (default: 1 CPU, 5 CUDA)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="tokens per training batch as fairseq's --max-tokens (default: 2048 CPU, 4096 CUDA)")
    p.add_argument("--dict-size", type=int, default=None,
                   help="joined dictionary size incl. specials (default: 10000 small, 37000 base/big)")
    p.add_argument("--len-mean", type=float, default=25.0, help="mean sentence length in tokens (incl. EOS)")
    p.add_argument("--len-std", type=float, default=10.0, help="std of the sentence length")
    p.add_argument("--len-max", type=int, default=100, help="length clip")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--decode-sentences", type=int, default=None,
                   help="source sentences in the decoding batch (default: 16 CPU, 64 CUDA)")
    p.add_argument("--decode-len", type=int, default=None,
                   help="decoded length (max_len_b = min_len; default: 15 CPU, 40 CUDA)")
    p.add_argument("--decode-iters", type=int, default=None, help="timed decoding calls (default 2 CPU, 5 CUDA)")
    p.add_argument("--decode-warmup", type=int, default=1)
    p.add_argument("--memory-iters", type=int, default=1,
                   help="training steps on the largest batch for the peak-memory measurement (0: skip memory)")
    p.add_argument("--clock", choices=["wall", "process"], default="wall",
                   help="time base of the rates: wall clock, or the CPU time of the benchmark process "
                        "(for a shared, loaded CPU machine; use it with --threads 1; CPU only)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output", default=None, help="also write the Markdown report to this file")
    p.add_argument("--json", default=None, help="also write the raw per-model measurements as JSON")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-output", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.worker:
        with open(args.worker) as f:
            spec = json.load(f)
        result = memory_worker(spec) if spec["mode"] == "memory" else timing_worker(spec)
        with open(args.worker_output, "w") as f:
            json.dump(result, f)
        return 0

    widths = [w.strip() for w in args.width.split(",") if w.strip()]
    bad = [w for w in widths if w not in BASELINE_ARCH]
    if bad or not widths:
        p.error(f"--width: unknown {bad or args.width!r}; choose from {', '.join(BASELINE_ARCH)}")
    if "tiny" in widths and len(widths) > 1:
        p.error("--width tiny is a smoke test: run it alone")
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    bad = [b for b in backends if b not in ATTENTION_BACKENDS]
    if bad or not backends:
        p.error(f"--backend: unknown {bad or args.backend!r}; choose from {', '.join(ATTENTION_BACKENDS)}")
    cuda = args.device == "cuda"
    if cuda:
        import torch

        if not torch.cuda.is_available():
            p.error("--device cuda: torch.cuda.is_available() is False")
    if args.dtype == "fp16" and not cuda:
        p.error("--dtype fp16 is only supported with --device cuda (CPU autocast: use bf16)")
    if args.clock == "process" and cuda:
        p.error("--clock process measures CPU time; use --clock wall with --device cuda")
    threads = args.threads or os.cpu_count() or 1
    defaults_used = []

    def default(name, cpu_value, cuda_value):
        value = getattr(args, name)
        if value is None:
            value = cuda_value if cuda else cpu_value
            defaults_used.append(f"--{name.replace('_', '-')} {value}")
        return value

    # CPU defaults keep a base-width run of all cases to a few minutes on an idle 2-core machine;
    # they are few iterations, so the report lists them and more give steadier numbers
    iters = default("iters", 2, 20)
    warmup = default("warmup", 1, 5)
    max_tokens = default("max_tokens", 1024, 4096)
    decode_sentences = default("decode_sentences", 8, 64)
    decode_len = default("decode_len", 10, 40)
    decode_iters = default("decode_iters", 2, 5)
    if widths == ["tiny"]:
        # smoke-test width: short sentences, small batches
        max_tokens = args.max_tokens or 256
        args.len_mean, args.len_std = 8.0, 3.0
        decode_len = args.decode_len or 5
        defaults_used = [d for d in defaults_used if not d.startswith(("--max-tokens", "--decode-len"))] + [
            f"--decode-len {decode_len} (tiny)",
            f"--max-tokens {max_tokens} (tiny)", "sentence length 8±3 (tiny)"]

    archs, criterions = registered(USER_DIR)
    wanted = list(CASES) if args.cases == "all" else [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in wanted if c not in CASES]
    if unknown:
        p.error(f"unknown case(s) {unknown}; known: {', '.join(CASES)}")

    skipped = []
    runs = []  # (case, width, arch, backend)
    for requested in widths:
        for name in wanted:
            case = CASES[name]
            width = case.width(requested)
            if any(r[0] is case and r[1] == width for r in runs):
                continue  # a case pinned to one width runs once
            arch = case.arch(width)
            if arch not in archs:
                msg = f"{name}: arch {arch} is not registered (yet) — skipped"
                log(msg)
                skipped.append(msg)
                continue
            if case.criterion not in criterions:
                msg = f"{name}: criterion {case.criterion} is not registered (yet) — skipped"
                log(msg)
                skipped.append(msg)
                continue
            for backend in backends:
                runs.append((case, width, arch, backend))

    def common_spec(width):
        return {
            "dict_size": args.dict_size or DEFAULT_DICT_SIZE[width],
            "device": args.device, "dtype": args.dtype, "threads": threads, "seed": args.seed,
            "iters": iters, "warmup": warmup, "max_tokens": max_tokens,
            "len_mean": args.len_mean, "len_std": args.len_std, "len_max": args.len_max,
            "beam": args.beam, "decode_sentences": decode_sentences, "decode_len": decode_len,
            "decode_iters": decode_iters, "decode_warmup": args.decode_warmup,
            "memory_iters": args.memory_iters, "clock": args.clock,
        }

    def model_spec(key, label, arch, width, extra, criterion):
        return {"key": key, "label": label, "arch": arch, "criterion": criterion,
                "extra_args": (TINY_OVERRIDES if width == "tiny" else []) + extra}

    # one group per (width, backend): the baseline of that width and the cases compared with it
    groups: Dict[tuple, List[dict]] = {}
    for case, width, arch, backend in runs:
        group = groups.setdefault((width, backend), [
            model_spec(baseline_key(width, backend), f"baseline {BASELINE_ARCH[width]}", BASELINE_ARCH[width],
                       width, [], LS_CRITERION)])
        group.append(model_spec(case_key(case.name, width, backend), f"{case.name} {arch} [{backend}]", arch, width,
                                case.extra_args + ["--attention-backend", backend], case.criterion))

    results: Dict[str, dict] = {}
    started = time.time()
    header_load = os.getloadavg()
    for (width, backend), models in groups.items():
        log(f"width {width}, backend {backend}: timing {len(models)} models interleaved batch by batch: "
            + ", ".join(m["label"] for m in models))
        timing = spawn(dict(common_spec(width), mode="timing", models=models), sys.executable)
        for m in models:
            results[m["key"]] = dict(timing.get(m["key"], {"error": timing.get("error", "no result")}))
        if args.memory_iters > 0:
            for i, m in enumerate(models):
                log(f"width {width}: peak memory [{i + 1}/{len(models)}] {m['label']} (own process)")
                mem = spawn(dict(common_spec(width), mode="memory", models=[m]), sys.executable)
                if "error" in mem:
                    results[m["key"]].setdefault("memory_error", mem["error"])
                else:
                    results[m["key"]].update({k: v for k, v in mem.items() if k != "params"})
        for m in models:
            r = results[m["key"]]
            if "error" in r:
                log(f"  {m['label']}: FAILED: {r['error']}")
            else:
                mem = f"{r['train_peak_bytes'] / 2**20:.0f} MiB peak" if "train_peak_bytes" in r else "no memory"
                log(f"  {m['label']}: {r['params'] / 1e6:.2f}M params, {r['train_tok_s']:.0f} tok/s train, "
                    f"{mem}, {r['decode_sent_s']:.2f} sent/s decode")

    report = render(args, widths, runs, results, skipped, defaults_used, threads, iters, warmup, max_tokens,
                    decode_sentences, decode_len, decode_iters, header_load, time.time() - started)
    print(report)
    if args.output:
        Path(args.output).write_text(report)
        log(f"wrote {args.output}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


def baseline_key(width: str, backend: str) -> str:
    return f"baseline:{width}@{backend}"


def case_key(name: str, width: str, backend: str) -> str:
    return f"{name}:{width}@{backend}"


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=10)
        return out.stdout.strip() + ("+local changes" if dirty.stdout.strip() else "") or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def render(args, widths, runs, results, skipped, defaults_used, threads, iters, warmup, max_tokens,
           decode_sentences, decode_len, decode_iters, header_load, elapsed) -> str:
    import fairseq
    import torch

    lines = []
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    dev = cpu_model() if args.device == "cpu" else torch.cuda.get_device_name(0)
    lines.append(f"## Benchmark: width {','.join(widths)}, {args.device} ({dev}), {args.dtype}, "
                 f"attention backend {args.backend}")
    lines.append("")
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    accel = (f"CUDA {torch.version.cuda}, cuDNN {cudnn}, " if args.device == "cuda" else "")
    lines.append(f"- date {now}; commit {git_commit()}; {os.cpu_count()} CPU cores, torch threads {threads}; "
                 f"torch {torch.__version__}, {accel}fairseq {fairseq.__version__}, Python {platform.python_version()}")
    lines.append(f"- load average before the run {header_load[0]:.2f} (1 min); total run time {elapsed:.0f}s")
    lines.append("- clock: " + ("wall time" if args.clock == "wall" else
                                "CPU time of the benchmark process (time.process_time), not wall time"))
    lines.append(f"- training: {warmup} warm-up + {iters} timed iterations per model, --max-tokens {max_tokens}, "
                 f"random sentences of length ~{args.len_mean:g}±{args.len_std:g} batched by length as "
                 f"fairseq-train does; tokens/s = target tokens (fairseq's ntokens) per second, median over the "
                 f"timed iterations; fairseq Adam; label-smoothed CE 0.1 (calibration: its own criterion). "
                 f"All models of a width run in one process and take turns on every batch, so load changes "
                 f"on the machine hit them alike")
    mem_method = ("peak RSS (VmHWM, reset through /proc/self/clear_refs after the model is built) minus the RSS "
                  "just before the first update, i.e. gradients + Adam state + activations + allocator slack"
                  if args.device == "cpu" else
                  "torch.cuda.max_memory_allocated minus the memory allocated before the first update")
    lines.append(f"- peak memory: {mem_method}; each model in its own process, {args.memory_iters} training "
                 f"step(s) on the largest batch of the set")
    lines.append(f"- decoding: fairseq SequenceGenerator, beam {args.beam}, {decode_sentences} source sentences, "
                 f"every hypothesis forced to {decode_len} tokens (min_len = max_len_b), median of "
                 f"{decode_iters} timed calls after {args.decode_warmup} warm-up")
    if defaults_used:
        lines.append(f"- defaults chosen for this device (override for steadier numbers): {', '.join(defaults_used)}")
    first = next((r for r in results.values() if "batch_tokens" in r), None)
    if first is not None:
        bt = first["batch_tokens"]
        lines.append(f"- batches (identical for every model): {len(bt)} batches, mean {statistics.mean(bt):.0f} target "
                     f"tokens, mean {statistics.mean(first['batch_sentences']):.0f} sentences, mean source pad "
                     f"fraction {statistics.mean(first['batch_pad_fraction']):.3f}")
    lines.append("")
    lines.append("| case | model | backend | params | train tok/s | ratio | peak train mem | ratio | decode sent/s "
                 "| ratio | target | met | kernels (train / decode) | compiled graphs |")
    lines.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|---:|")
    empty = "|" * 12

    def mib(x):
        return "—" if x is None else f"{x / 2**20:.0f} MiB"

    def kernels(r):
        return f"{' '.join(r.get('train_kernels', [])) or '—'} / {' '.join(r.get('decode_kernels', [])) or '—'}"

    shown_baselines = set()
    extra_notes = []
    both_clocks = []
    for case, width, arch, backend in runs:
        base_key = baseline_key(width, backend)
        base = results.get(base_key, {"error": "not run"})
        if base_key not in shown_baselines:
            shown_baselines.add(base_key)
            if "error" in base:
                lines.append(f"| baseline ({width}) | {BASELINE_ARCH[width]} | fairseq | error: {base['error']} {empty}")
            else:
                lines.append(f"| baseline ({width}) | {BASELINE_ARCH[width]} | fairseq | {base['params'] / 1e6:.2f}M | "
                             f"{base['train_tok_s']:.0f} | 1 | {mib(base.get('train_peak_bytes'))} | 1 | "
                             f"{base['decode_sent_s']:.2f} | 1 | | | {kernels(base)} | {base.get('compiled_graphs', 0)} |")
        r = results.get(case_key(case.name, width, backend), {"error": "not run"})
        model = arch + ("" if not case.extra_args else " " + " ".join(case.extra_args))
        if case.criterion != LS_CRITERION:
            model += f" (criterion {case.criterion})"
        if "error" in r or "error" in base:
            lines.append(f"| {case.name} | {model} | {backend} | error: {r.get('error') or base.get('error')} {empty}")
            continue
        tr = r["train_tok_s"] / base["train_tok_s"]
        mr = (r["train_peak_bytes"] / base["train_peak_bytes"]
              if r.get("train_peak_bytes") and base.get("train_peak_bytes") else None)
        dr = r["decode_sent_s"] / base["decode_sent_s"]
        targets = case.gpu_targets if args.device == "cuda" else (case.targets if width == "base" else {})
        if targets:
            parts, met = [], []
            for kind, ratio in (("train", tr), ("mem", mr), ("decode", dr)):
                if kind not in targets:
                    continue
                if kind == "mem":
                    parts.append(f"mem ≤ {targets[kind]:.2f}×")
                    met.append(ratio is not None and ratio <= targets[kind])
                else:
                    parts.append(f"{kind} ≥ {targets[kind]:.2f}×")
                    met.append(ratio >= targets[kind])
            target, ok = "; ".join(parts), ("yes" if all(met) else "**no**")
        elif case.targets and args.device != "cuda":
            target, ok = "(CPU targets are for base width)", ""
        else:
            target, ok = "none", ""
        if case.criterion == CALIBRATED_CRITERION:
            target = f"{target}; cost per update {1 / tr:.2f}× (≈1.5× expected)"
            note = (f"- calibration: extra parameters over {BASELINE_ARCH[width]}: "
                    f"{(r['params'] - base['params']) / 1e6:+.2f}M (paper: about 6M at base width)")
            if note not in extra_notes:
                extra_notes.append(note)
        both_clocks.append(
            f"- {case.name} ({width}, {backend}): training ratio {r['train_tok_s_wall'] / base['train_tok_s_wall']:.3f}× wall / "
            f"{r['train_tok_s_cpu'] / base['train_tok_s_cpu']:.3f}× process CPU time; decoding ratio "
            f"{r['decode_sent_s_wall'] / base['decode_sent_s_wall']:.3f}× wall / "
            f"{r['decode_sent_s_cpu'] / base['decode_sent_s_cpu']:.3f}× process CPU time")
        for who, res in ((case.name, r), (f"baseline ({width})", base)):
            if "memory_error" in res and f"- {who}: peak memory not measured: {res['memory_error']}" not in extra_notes:
                extra_notes.append(f"- {who}: peak memory not measured: {res['memory_error']}")
        lines.append(f"| {case.name} | {model} | {backend} | {r['params'] / 1e6:.2f}M | {r['train_tok_s']:.0f} | "
                     f"{fmt_ratio(tr)} | {mib(r.get('train_peak_bytes'))} | {fmt_ratio(mr)} | {r['decode_sent_s']:.2f} | "
                     f"{fmt_ratio(dr)} | {target} | {ok} | {kernels(r)} | {r.get('compiled_graphs', 0)} |")
    lines.append("")
    lines.extend(extra_notes)
    if both_clocks:
        lines.append("- the same ratios by both clocks (wall time is what a user waits; process CPU time is "
                     "steadier when other jobs share the CPU):")
        lines.extend("  " + line for line in both_clocks)
    for s in skipped:
        lines.append(f"- skipped: {s}")
    if not runs:
        lines.append("- no case could run (none of the requested archs is registered)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
