"""Gradient norm of every sublayer during the first updates of a real ``fairseq-train`` run.

``python -m lab.sublayer_grads --out DIR -- <fairseq-train arguments>`` runs
fairseq's own training loop unchanged and, after each update, records the L2 norm of the
gradient (the one the optimizer steps with: normalised by the sample size, before clipping) of
each sublayer: ``enc0.san``, ``enc0.dman``, ``enc0.dman.mask`` (the DMAN mask's own ``w, P, U``),
``enc0.ffn``, ``dec2.cross``, ... (attention or FFN weights with their LayerNorm), plus the
embeddings. Writes ``DIR/sublayer_grads.json`` and ``DIR/sublayer_grads.png``. Use
``--max-update`` to stop it (e.g. 100) and ``--no-save --disable-validation`` to keep it short.

It answers "which sublayer receives what gradient" when two architectures train differently at
the same learning rate (docs/man.md, "Training speed against the Transformer").
"""

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

from man_recipes.training.launch import split_fairseq_args
from man_recipes.atomic import write_text
from man_recipes.logging_setup import quiet_logging
from man_recipes.interrupt import one_line_on_ctrl_c

# fairseq's own layers: parameter prefix inside a layer -> sublayer name
FAIRSEQ_SUBLAYERS = {
    "self_attn": "san", "self_attn_layer_norm": "san",
    "encoder_attn": "cross", "encoder_attn_layer_norm": "cross",
    "fc1": "ffn", "fc2": "ffn", "final_layer_norm": "ffn",
}
FLUSH_EVERY = 25  # updates between two writes of the JSON during the run
LAYER_RE = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(.*)$")


def sublayer_groups(model):
    """{parameter name: group name} for every trainable parameter of a fairseq encoder-decoder."""
    groups = {}
    man_names = {}
    for name, module in model.named_modules():
        if hasattr(module, "sublayers") and hasattr(module, "blocks"):  # MANLayer
            man_names[name] = list(module.sublayers)
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        m = LAYER_RE.match(name)
        if m is None:
            groups[name] = "embeddings" if "embed" in name else "other"
            continue
        side, idx, rest = m.group(1), int(m.group(2)), m.group(3)
        prefix = f"{'enc' if side == 'encoder' else 'dec'}{idx}"
        layer_name = f"{side}.layers.{idx}"
        parts = rest.split(".")
        if layer_name in man_names and parts[0] in ("blocks", "sublayer_norms"):
            sub = man_names[layer_name][int(parts[1])]
            if parts[0] == "blocks" and len(parts) > 2 and parts[2] == "bias_module":
                sub += ".mask"
        else:
            sub = FAIRSEQ_SUBLAYERS.get(parts[0], parts[0])
        groups[name] = f"{prefix}.{sub}"
    return groups


def group_norms(model, groups):
    """{group: L2 norm of its parameters' current gradients} (groups without gradient left out)."""
    squares = defaultdict(float)
    for name, param in model.named_parameters():
        if name in groups and param.grad is not None:
            squares[groups[name]] += float(param.grad.detach().float().pow(2).sum())
    return {g: s ** 0.5 for g, s in squares.items()}


def record(train_argv, out_dir):
    """Run fairseq-train with ``train_argv``, recording group norms after every update."""
    import torch
    from fairseq import trainer as fairseq_trainer
    from fairseq_cli import train as fairseq_train

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    original = fairseq_trainer.Trainer.train_step

    def train_step(self, samples, raise_oom=False):
        out = original(self, samples, raise_oom)
        model = self.model
        if not hasattr(model, "_sublayer_groups"):
            model._sublayer_groups = sublayer_groups(model)
        # fairseq leaves the stepped (normalised) gradients in .grad until the next zero_grad
        with torch.no_grad():
            rows.append({"update": self.get_num_updates(), "lr": self.get_lr(),
                         "norms": group_norms(model, model._sublayer_groups)})
        if len(rows) % FLUSH_EVERY == 0:
            write(out_dir, train_argv, rows)  # a long run can be read while it goes
        return out

    fairseq_trainer.Trainer.train_step = train_step
    argv0 = sys.argv
    try:
        sys.argv = ["fairseq-train"] + list(train_argv)
        fairseq_train.cli_main()
    finally:
        sys.argv = argv0
        fairseq_trainer.Trainer.train_step = original
    write(out_dir, train_argv, rows)
    return rows


def write(out_dir, train_argv, rows):
    write_text(Path(out_dir) / "sublayer_grads.json",
               json.dumps({"argv": [str(a) for a in train_argv], "updates": rows}, indent=1))


def plot(rows, png, title=""):
    from man_recipes.logging_setup import pyplot

    plt = pyplot()
    groups = sorted({g for r in rows for g in r["norms"]})
    encoder = [g for g in groups if g.startswith("enc")]
    decoder = [g for g in groups if g.startswith("dec")]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    for ax, names, side in ((axes[0], encoder, "encoder"), (axes[1], decoder, "decoder")):
        for g in names:
            xs = [r["update"] for r in rows if g in r["norms"]]
            ys = [r["norms"][g] for r in rows if g in r["norms"]]
            ax.plot(xs, ys, label=g, lw=1.2, ls="--" if g.endswith(".mask") else "-")
        ax.set_yscale("log")
        ax.set_xlabel("update")
        ax.set_title(f"{side} sublayers {title}".strip())
        ax.legend(fontsize=7, ncol=2)
    axes[0].set_ylabel("gradient L2 norm (per update, before clipping)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


@one_line_on_ctrl_c("python -m lab.sublayer_grads")
def main(argv=None):
    quiet_logging()  # first: fairseq's import left the root logger at DEBUG
    ours, train_argv = split_fairseq_args(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                usage="%(prog)s --out DIR [--title T] -- FAIRSEQ_TRAIN_ARGS")
    p.add_argument("--out", required=True, help="folder for sublayer_grads.json and .png")
    p.add_argument("--title", default="", help="plot title suffix")
    args = p.parse_args(ours)
    if not train_argv:
        p.error("give the fairseq-train arguments after --")
    rows = record(train_argv, args.out)
    if not rows:
        raise SystemExit("sublayer_grads: fairseq-train made no update")
    plot(rows, Path(args.out) / "sublayer_grads.png", args.title)
    print(f"sublayer_grads: {len(rows)} updates -> {Path(args.out) / 'sublayer_grads.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
