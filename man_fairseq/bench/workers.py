"""The measuring subprocesses: peak memory of one model, interleaved timing of several.

``spawn`` runs ``python -m man_fairseq.bench.workers SPEC OUT`` so that every measurement starts
from a fresh process (peak memory is per model; no allocator state carries over).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from man_fairseq.bench.batching import make_batches, write_dictionary
from man_fairseq.bench.model import Built


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


def timing_worker(spec) -> dict:
    """Training and decoding speed of several models, interleaved batch by batch.

    All models of one width live in this process and take turns on every batch (A B C A B C ...),
    so a change of machine load during the run hits every model alike.
    """
    from fairseq import utils
    from fairseq.sequence_generator import SequenceGenerator

    device = _torch_setup(spec)
    cuda = device.type == "cuda"
    results, models = {}, {}
    with tempfile.TemporaryDirectory() as data_dir:
        write_dictionary(data_dir, spec["dict_size"])
        for m in spec["models"]:
            try:
                t0 = time.perf_counter()
                models[m["key"]] = Built(spec, m, data_dir, device)
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
        r["skipped_updates"] = models[key].skipped_updates  # fp16 overflows (the loss scale settling)
        r["train_kernels"], r["decode_kernels"] = train_kernels[key], models[key].kernels()
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
        proc = subprocess.run([sys.executable, "-m", "man_fairseq.bench.workers", spec_path, result_path],
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
