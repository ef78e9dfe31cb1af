"""The synthetic mode's measuring subprocesses (``python -m lab.speed.workers SPEC OUT``, each from a fresh
process: peak memory is per model, no allocator state carries over): the random batches every model
sees, the peak memory of one model, the interleaved timing of several."""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lab.speed.model import Built


def log(msg):
    print(f"[benchmark {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_dictionary(directory, size):
    """Joined src/tgt dictionary with ``size`` symbols in total (fairseq adds 4 specials)."""
    words = "".join(f"w{i} {size - i}\n" for i in range(size - 4))
    for lang in ("src", "tgt"):
        Path(directory, f"dict.{lang}.txt").write_text(words)


def make_batches(spec, dictionary):
    """Random sentences batched as fairseq-train does (sorted by length, --max-tokens): (train, decode)."""
    import numpy as np
    import torch
    from fairseq.data import LanguagePairDataset, data_utils

    rng = np.random.RandomState(spec["seed"])
    n_train = spec["warmup"] + spec["iters"]

    def dataset(n, **kw):
        src_len = np.clip(np.round(rng.normal(spec["len_mean"], spec["len_std"], n)), 2, spec["len_max"]).astype(int)
        tgt_len = np.clip(np.round(src_len * rng.uniform(0.8, 1.25, n)), 2, spec["len_max"]).astype(int)
        src, tgt = ([torch.tensor(rng.randint(dictionary.nspecial, len(dictionary), size=k - 1).tolist()
                                  + [dictionary.eos()], dtype=torch.long) for k in lengths]
                    for lengths in (src_len, tgt_len))
        return LanguagePairDataset(src, np.array([len(s) for s in src]), dictionary, tgt,
                                   np.array([len(t) for t in tgt]), dictionary, left_pad_source=True,
                                   left_pad_target=False, **kw)

    # a pool a few times bigger than what is used, so batches mix lengths like an epoch does
    ds = dataset(int(3 * n_train * spec["max_tokens"] / spec["len_mean"]) + 16, shuffle=True)
    with data_utils.numpy_seed(spec["seed"]):
        order = ds.ordered_indices()
    batches = ds.batch_by_size(order, max_tokens=spec["max_tokens"], required_batch_size_multiple=8)
    rng.shuffle(batches)
    train = [ds.collater([ds[int(i)] for i in b]) for b in batches[:n_train]]
    if len(train) < n_train:
        raise RuntimeError("not enough random sentences for the requested batches")
    dds = dataset(spec["decode_sentences"])
    return train, dds.collater([dds[i] for i in range(len(dds))])


def _rss_kib(field_name):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field_name + ":"))


def _reset_peak_rss():
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


def _flex_compiles():
    """Graphs dynamo has compiled in this process (flex_attention and block masks under torch.compile)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return 0
    return int(counters["stats"]["unique_graphs"])


def memory_worker(spec):
    """Peak training memory of ONE model (this process holds nothing else), on the set's largest batch."""
    import torch
    from fairseq import utils

    device = _torch_setup(spec)
    m = spec["models"][0]
    with tempfile.TemporaryDirectory() as data_dir:
        write_dictionary(data_dir, spec["dict_size"])
        built = Built(spec, m, data_dir, device)
        train, _ = make_batches(spec, built.task.source_dictionary)
    sample = max(train, key=lambda b: b["net_input"]["src_tokens"].numel() + b["target"].numel())
    cuda = device.type == "cuda"
    if cuda:
        sample = utils.move_to_cuda(sample)
        torch.cuda.empty_cache()
        mem0, reset_ok = torch.cuda.memory_allocated(), True
        torch.cuda.reset_peak_memory_stats()
    else:
        mem0, reset_ok = _rss_kib("VmRSS") * 1024, _reset_peak_rss()
    for it in range(spec["memory_iters"]):
        if cuda and it == 1:
            # the first step compiled / autotuned kernels and grew the allocator: the peak of more steps is the steady state's
            torch.cuda.reset_peak_memory_stats()
        (dt, _), _ = built.train_step(sample)
        log(f"  memory {m['label']}: step {it + 1}/{spec['memory_iters']} on the largest batch "
            f"({int(sample['ntokens'])} tok) {dt:.2f}s")
    peak_abs = torch.cuda.max_memory_allocated() if cuda else _rss_kib("VmHWM") * 1024
    return {"params": built.params, "train_peak_bytes": int(peak_abs - mem0), "peak_abs_bytes": int(peak_abs),
            "peak_reset": reset_ok, "memory_batch_tokens": int(sample["ntokens"])}


def _interleaved(models, results, times, n, warmup, what, step):
    """``n`` rounds, every model in turn (A B C A B C ...: a change of machine load hits them alike);
    ``step(key, built, round)`` -> ((wall s, CPU s), note); times after ``warmup`` rounds go to
    ``times[key][what]``; a model that fails leaves ``models`` with its error in ``results``."""
    for it in range(n):
        for key, built in list(models.items()):
            before = _flex_compiles()
            try:
                (dt, cpu), note = step(key, built, it)
            except Exception as e:
                failed = {"train": "training step failed", "decode": "decoding failed"}[what]
                results[key] = {"error": f"{failed}: {type(e).__name__}: {e}"}
                log(f"  {built.label}: {failed.upper()}: {type(e).__name__}: {e}")
                del models[key]
                continue
            times[key]["compiled_graphs"] += _flex_compiles() - before
            if it >= warmup:
                times[key][what].append(dt)
                times[key][what + "_cpu"].append(cpu)
            log(f"  {what} {it + 1}/{n} ({'warm-up' if it < warmup else 'timed'}) {built.label}: {note} in {dt:.2f}s "
                f"(process CPU {cpu:.2f}s)")


def timing_worker(spec):
    """Training and decoding speed of several models (all of one width, in this process), interleaved."""
    from fairseq import utils
    from fairseq.sequence_generator import SequenceGenerator

    device = _torch_setup(spec)
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
    if device.type == "cuda":
        train, decode_sample = [utils.move_to_cuda(b) for b in train], utils.move_to_cuda(decode_sample)
    pad = first.task.source_dictionary.pad()
    batch_info = {"batch_tokens": [int(b["ntokens"]) for b in train],
                  "batch_sentences": [int(b["nsentences"]) for b in train],
                  "batch_pad_fraction": [float((b["net_input"]["src_tokens"] == pad).float().mean()) for b in train]}
    times = {k: {"train": [], "train_cpu": [], "decode": [], "decode_cpu": [], "compiled_graphs": 0} for k in models}

    def train_step(key, built, it):
        timed, loss = built.train_step(train[it])
        return timed, f"{int(train[it]['ntokens'])} tok, loss {loss:.3f}"

    _interleaved(models, results, times, len(train), spec["warmup"], "train", train_step)
    for key, built in models.items():
        times[key]["train_kernels"] = built.kernels()
        del built.optimizer  # free Adam state before decoding
    nsent = int(decode_sample["nsentences"])

    def decode_step(key, built, it):
        generator = SequenceGenerator([built.model], built.task.target_dictionary, beam_size=spec["beam"],
                                      max_len_a=0, max_len_b=spec["decode_len"], min_len=spec["decode_len"])
        timed, hyps = built.decode(generator, decode_sample)
        times[key]["decode_hyp_len"] = statistics.mean(len(h[0]["tokens"]) for h in hyps)
        return timed, f"{nsent} sent x beam {spec['beam']}"

    _interleaved(models, results, times, spec["decode_warmup"] + spec["decode_iters"], spec["decode_warmup"],
                 "decode", decode_step)
    tokens = batch_info["batch_tokens"][spec["warmup"]:]
    for key, built in models.items():
        t = times[key]
        # the clock of the rates: wall time, or this process's CPU time (steadier on a shared machine with --threads 1)
        train_t, dec_t = (t["train"], t["decode"]) if spec["clock"] == "wall" else (t["train_cpu"], t["decode_cpu"])
        results[key].update(batch_info, **{
            "train_times": t["train"], "train_cpu_times": t["train_cpu"],
            "train_tok_s": statistics.median(n / s for n, s in zip(tokens, train_t)),
            "train_tok_s_wall": statistics.median(n / s for n, s in zip(tokens, t["train"])),
            "train_tok_s_cpu": statistics.median(n / s for n, s in zip(tokens, t["train_cpu"])),
            "train_tok_s_total": sum(tokens) / sum(train_t),
            "decode_times": t["decode"], "decode_cpu_times": t["decode_cpu"],
            "decode_sent_s": statistics.median(nsent / s for s in dec_t),
            "decode_sent_s_wall": statistics.median(nsent / s for s in t["decode"]),
            "decode_sent_s_cpu": statistics.median(nsent / s for s in t["decode_cpu"]),
            "decode_sentences": nsent, "decode_hyp_len": t.get("decode_hyp_len"),
            "compiled_graphs": t["compiled_graphs"],
            "skipped_updates": built.skipped_updates,  # fp16 overflows (the loss scale settling)
            "train_kernels": t["train_kernels"], "decode_kernels": built.kernels()})
    return results


def spawn(spec):
    """Run one worker in a fresh process; returns its result dict or {'error': ...}."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    spec_path, result_path = f.name, f.name + ".out"
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(name, str(spec["threads"]))
    env.setdefault("PYTHONWARNINGS", "ignore")  # hydra deprecation chatter of fairseq 0.12
    # the worker imports this checkout (lab and man_fairseq), not another installed copy: fairseq's
    # --user-dir refuses a second man_fairseq
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([repo] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    try:
        proc = subprocess.run([sys.executable, "-m", "lab.speed.workers", spec_path, result_path], env=env,
                              stdout=subprocess.PIPE, stderr=None, text=True)
        if proc.returncode != 0:
            return {"error": f"worker exited with {proc.returncode} (see its log above)"}
        return json.loads(Path(result_path).read_text())
    finally:
        for p in (spec_path, result_path):
            if os.path.exists(p):
                os.unlink(p)


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    Path(sys.argv[2]).write_text(json.dumps(memory_worker(spec) if spec["mode"] == "memory" else timing_worker(spec)))
