"""The measuring subprocesses: peak memory of one model, interleaved timing of several.

``spawn`` runs ``python -m lab.speed.workers SPEC OUT`` so that every measurement starts
from a fresh process (peak memory is per model; no allocator state carries over).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from lab.speed.batching import make_batches, write_dictionary
from lab.speed.model import Built


def log(msg: str):
    print(f"[benchmark {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


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



def _torch_setup(spec):
    import torch

    torch.set_num_threads(spec["threads"])
    torch.manual_seed(spec["seed"])
    return torch.device(spec["device"])


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

    device = _torch_setup(spec)
    m = spec["models"][0]
    with tempfile.TemporaryDirectory() as data_dir:
        write_dictionary(data_dir, spec["dict_size"])
        built = Built(spec, m, data_dir, device)
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


@dataclass
class _Timings:
    """One model's timed calls in the timing worker (seconds, by both clocks) and what they ran."""
    train: List[float] = field(default_factory=list)
    train_cpu: List[float] = field(default_factory=list)
    decode: List[float] = field(default_factory=list)
    decode_cpu: List[float] = field(default_factory=list)
    compiles: int = 0
    hyp_len: Optional[float] = None
    train_kernels: List[str] = field(default_factory=list)


def _build_models(spec, data_dir, device, results) -> Dict[str, Built]:
    """Every model of the spec that builds; one that fails gets its error in ``results``."""
    models = {}
    for m in spec["models"]:
        try:
            t0 = time.perf_counter()
            models[m["key"]] = Built(spec, m, data_dir, device)
            results[m["key"]] = {"params": models[m["key"]].params, "build_s": time.perf_counter() - t0}
            log(f"  built {m['label']}: {models[m['key']].params / 1e6:.2f}M parameters")
        except Exception as e:  # another family's code may be mid-edit; report, go on
            results[m["key"]] = {"error": f"build failed: {type(e).__name__}: {e}"}
            log(f"  {m['label']}: BUILD FAILED: {type(e).__name__}: {e}")
    return models


def _batch_info(train, pad: int) -> dict:
    return {
        "batch_tokens": [int(b["ntokens"]) for b in train],
        "batch_sentences": [int(b["nsentences"]) for b in train],
        "batch_pad_fraction": [float((b["net_input"]["src_tokens"] == pad).float().mean()) for b in train],
    }


def _train_interleaved(spec, models, train, timings, results):
    """Every batch, every model in turn; a model whose step fails leaves ``models`` with its error."""
    for it, sample in enumerate(train):
        phase = "warm-up" if it < spec["warmup"] else "timed"
        for key, built in list(models.items()):
            try:
                before = _flex_compiles()
                (dt, cpu), loss = built.train_step(sample)
                timings[key].compiles += _flex_compiles() - before
            except Exception as e:
                results[key] = {"error": f"training step failed: {type(e).__name__}: {e}"}
                log(f"  {built.label}: TRAIN STEP FAILED: {type(e).__name__}: {e}")
                del models[key]
                continue
            if it >= spec["warmup"]:
                timings[key].train.append(dt)
                timings[key].train_cpu.append(cpu)
            log(f"  train iter {it + 1}/{len(train)} ({phase}) {built.label}: "
                f"{int(sample['ntokens'])} tok in {dt:.2f}s (process CPU {cpu:.2f}s), loss {loss:.3f}")


def _decode_interleaved(spec, models, decode_sample, timings, results):
    """Beam search on the one decoding batch, every model in turn; a failing model leaves ``models``."""
    from fairseq.sequence_generator import SequenceGenerator

    nsent = int(decode_sample["nsentences"])
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
                timings[key].compiles += _flex_compiles() - before
            except Exception as e:
                results[key] = {"error": f"decoding failed: {type(e).__name__}: {e}"}
                log(f"  {built.label}: DECODING FAILED: {type(e).__name__}: {e}")
                del models[key]
                continue
            if it >= spec["decode_warmup"]:
                timings[key].decode.append(dt)
                timings[key].decode_cpu.append(cpu)
            timings[key].hyp_len = statistics.mean(len(h[0]["tokens"]) for h in hyps)
            log(f"  decode {it + 1}/{n_dec} ({phase}) {built.label}: {nsent} sent x beam {spec['beam']} in {dt:.2f}s (process CPU {cpu:.2f}s)")


def _rates(spec, t: _Timings, tokens: List[int], nsent: int) -> dict:
    """The times and the rates computed from them, as the report and the JSON name them."""
    # the clock used for the rates: wall time, or the CPU time of this process (steadier on a
    # shared machine, meaningful with --threads 1 where no OpenMP thread spins)
    train_t = t.train if spec["clock"] == "wall" else t.train_cpu
    dec_t = t.decode if spec["clock"] == "wall" else t.decode_cpu
    return {
        "train_times": t.train, "train_cpu_times": t.train_cpu,
        "train_tok_s": statistics.median(n / s for n, s in zip(tokens, train_t)),
        "train_tok_s_wall": statistics.median(n / s for n, s in zip(tokens, t.train)),
        "train_tok_s_cpu": statistics.median(n / s for n, s in zip(tokens, t.train_cpu)),
        "train_tok_s_total": sum(tokens) / sum(train_t),
        "decode_times": t.decode, "decode_cpu_times": t.decode_cpu,
        "decode_sent_s": statistics.median(nsent / s for s in dec_t),
        "decode_sent_s_wall": statistics.median(nsent / s for s in t.decode),
        "decode_sent_s_cpu": statistics.median(nsent / s for s in t.decode_cpu),
        "decode_sentences": nsent,
        "decode_hyp_len": t.hyp_len,
        "compiled_graphs": t.compiles,
    }


def timing_worker(spec) -> dict:
    """Training and decoding speed of several models, interleaved batch by batch.

    All models of one width live in this process and take turns on every batch (A B C A B C ...),
    so a change of machine load during the run hits every model alike.
    """
    from fairseq import utils

    device = _torch_setup(spec)
    results = {}
    with tempfile.TemporaryDirectory() as data_dir:
        write_dictionary(data_dir, spec["dict_size"])
        models = _build_models(spec, data_dir, device, results)
        if not models:
            return results
        first = next(iter(models.values()))
        train, decode_sample = make_batches(spec, first.task.source_dictionary)
    if device.type == "cuda":
        train = [utils.move_to_cuda(b) for b in train]
        decode_sample = utils.move_to_cuda(decode_sample)
    batch_info = _batch_info(train, first.task.source_dictionary.pad())
    timings = {k: _Timings() for k in models}
    _train_interleaved(spec, models, train, timings, results)
    for key, built in models.items():
        timings[key].train_kernels = built.kernels()
        del built.optimizer  # free Adam state before decoding
    _decode_interleaved(spec, models, decode_sample, timings, results)
    tokens = batch_info["batch_tokens"][spec["warmup"]:]
    for key, built in models.items():
        r = results[key]
        r.update(batch_info)
        r.update(_rates(spec, timings[key], tokens, int(decode_sample["nsentences"])))
        r["skipped_updates"] = built.skipped_updates  # fp16 overflows (the loss scale settling)
        r["train_kernels"], r["decode_kernels"] = timings[key].train_kernels, built.kernels()
    return results


def spawn(spec) -> dict:
    """Run one worker in a fresh process; returns its result dict or {'error': ...}."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
        spec_path = f.name
    result_path = spec_path + ".out"
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(spec["threads"]))
    env.setdefault("MKL_NUM_THREADS", str(spec["threads"]))
    env.setdefault("PYTHONWARNINGS", "ignore")  # hydra deprecation chatter of fairseq 0.12
    # the worker imports this very package (not another installed copy): fairseq's --user-dir
    # refuses a second man_fairseq
    package_root = str(Path(__file__).resolve().parent.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([package_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    try:
        proc = subprocess.run([sys.executable, "-m", "lab.speed.workers", spec_path, result_path],
                              env=env, stdout=subprocess.PIPE, stderr=None, text=True)
        if proc.returncode != 0:
            return {"error": f"worker exited with {proc.returncode} (see its log above)"}
        with open(result_path) as f:
            return json.load(f)
    finally:
        for p in (spec_path, result_path):
            if os.path.exists(p):
                os.unlink(p)


def main(argv):
    spec_path, result_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    result = memory_worker(spec) if spec["mode"] == "memory" else timing_worker(spec)
    with open(result_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
