"""Every family's layers trace into whole graphs under ``torch.compile(fullgraph=True)``.

One encoder layer and one decoder layer of each family (which hold every attention module kind
of the family: encoder self, decoder self, cross, with their bias modules and post-softmax
transforms) are traced by dynamo and run as traced, like the ``eager`` backend: no code is
generated, so it is cheap on CPU. ``fullgraph=True`` turns a graph break (Python branching on a
tensor's value: ``if key_padding_mask.any()``, ``torch.equal``) into an error. torch 2.13's
dynamo traces a ``.item()`` or ``bool(tensor)`` whose value is only computed with (no branch)
into the graph instead of breaking it, so the backend also fails on any value read back from a
tensor (an unbacked symbol: a host sync on GPU). The compiled outputs must equal the uncompiled
ones. Backends: ``explicit`` (the reference path) and ``auto`` (SDPA on CPU).
"""

import pytest
import torch
import torch._dynamo
from fairseq import utils
from model_families import FAMILIES, build_family, tokens
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.utils._pytree import tree_leaves

from man_fairseq.modules.biased_attention import BiasedMultiheadAttention
from man_fairseq.modules.calibration import PERTURBED, calibration_mode

BACKENDS = ("explicit", "auto")
# same kernels with and without dynamo's eager backend: measured difference 0
TOL = dict(rtol=1e-6, atol=1e-6)
LOCALNESS_BOUND = dict(rtol=0, atol=2e-5)  # docs/localness.md#the-bias-as-extra-querykey-dimensions
DIM = 32  # TINY_MODEL's embedding width


GRAPHS = []  # node count of every graph the backend received


def no_host_sync_backend(gm, example_inputs):
    """dynamo's ``eager`` backend (the traced graph run as it is) that first rejects a graph
    holding a value read from a tensor's data (``.item()``, ``bool(t)``, a data-dependent shape)."""
    symbolic = (torch.Tensor, torch.SymInt, torch.SymBool, torch.SymFloat)
    reads = [node.format_node() for node in gm.graph.nodes
             if any(free_unbacked_symbols(v) for v in tree_leaves(node.meta.get("example_value"))
                    if isinstance(v, symbolic))]
    assert not reads, "values read from tensor data in the traced graph:\n" + "\n".join(reads)
    GRAPHS.append(len(gm.graph.nodes))
    return gm.forward


def strict_compile(fn):
    """``fn`` compiled by dynamo alone; a graph break raises (fullgraph) instead of splitting."""
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=no_host_sync_backend)


def set_backend(model, backend):
    for m in model.modules():
        if isinstance(m, BiasedMultiheadAttention):
            m.attention_backend = backend


def source_padding(d):
    """(B, S) key padding: two sentences padded on the left, two on the right, one full."""
    left = tokens(d, [9, 4], left=True, seed=1)
    right = tokens(d, [9, 6, 3], left=False, seed=2)[1:]
    return torch.cat([left, right, tokens(d, [9], left=False, seed=3)]).eq(d.pad())


class EncoderDecoderLayers(torch.nn.Module):
    """Encoder layer then decoder layer, as fairseq's training forward calls them: one graph."""

    def __init__(self, model):
        super().__init__()
        self.enc, self.dec = model.encoder.layers[0], model.decoder.layers[0]

    def forward(self, x, src_pad, y, future, tgt_pad):
        enc = self.enc(x, src_pad)
        return enc, self.dec(y, enc, src_pad, self_attn_mask=future, self_attn_padding_mask=tgt_pad)[0]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_model(request):
    return request.param, *build_family(request.param)


def test_training_forward_compiles_without_graph_break(family_model):
    family, model, task = family_model
    d = task.source_dictionary
    g = torch.Generator().manual_seed(0)
    src_pad = source_padding(d)
    tgt_pad = tokens(d, [7, 3, 5, 7, 6], left=False, seed=4).eq(d.pad())
    x, y = torch.randn(9, 5, DIM, generator=g), torch.randn(7, 5, DIM, generator=g)
    future = torch.triu(utils.fill_with_neg_inf(torch.zeros(7, 7)), 1)  # fairseq's future mask
    layers = EncoderDecoderLayers(model).train()
    cases = [(b, None) for b in BACKENDS]
    if family.startswith("calibration"):
        cases.append(("explicit", PERTURBED))  # the criterion's perturbation pass
    for backend, mode in cases:
        set_backend(model, backend)
        compiled = strict_compile(layers)
        before = len(GRAPHS)
        with calibration_mode(model, mode) if mode else torch.enable_grad():
            ref = layers(x, src_pad, y, future, tgt_pad)
            out = compiled(x, src_pad, y, future, tgt_pad)
        assert len(GRAPHS) - before == 1, (backend, mode)  # traced, in one piece
        # eager localness writes its bias as extra query/key columns, which a compiled graph leaves
        # for the float mask (their block count reads the data): equal within the float32 bound
        tol = LOCALNESS_BOUND if family.startswith("localness") and backend == "auto" else TOL
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r, **tol, msg=lambda m: f"{backend} {mode}: {m}")


def test_decoding_step_compiles_without_graph_break(family_model):
    """Incremental decoding as fairseq-generate runs it (eval, no alignment weights): each step's
    output and the decoding cache equal the uncompiled layer's."""
    family, model, task = family_model
    model.make_generation_fast_(need_attn=False)
    model.eval()
    d = task.source_dictionary
    g = torch.Generator().manual_seed(1)
    src_pad = source_padding(d)
    # two steps: an empty cache, then one cached key (one graph each; a third would only add the
    # dynamic-shape recompilation, with the same code traced)
    enc, ys = torch.randn(9, 5, DIM, generator=g), torch.randn(2, 1, 5, DIM, generator=g)
    dec = model.decoder.layers[0]
    for backend in BACKENDS:
        set_backend(model, backend)
        compiled = strict_compile(dec)
        state, ref_state = {}, {}
        before = len(GRAPHS)
        with torch.no_grad():
            for t in range(len(ys)):
                ref = dec(ys[t], enc, src_pad, incremental_state=ref_state)[0]
                out = compiled(ys[t], enc, src_pad, incremental_state=state)[0]
                torch.testing.assert_close(out, ref, **TOL, msg=lambda m: f"{backend} step {t}: {m}")
        assert len(GRAPHS) - before == len(ys), backend  # traced at every step
        assert state.keys() == ref_state.keys()
        for key, buffers in ref_state.items():
            assert buffers.keys() == state[key].keys()
            for name, value in buffers.items():
                if value is None:
                    assert state[key][name] is None, (backend, key, name)
                else:
                    torch.testing.assert_close(state[key][name], value, **TOL)


# ----------------------------------------------------------------------------------------------
# flex compilations through a real fairseq-generate
# ----------------------------------------------------------------------------------------------

def documented_bucket(n):
    """results/speed/README.md: lengths bucketed to 16/32/64, then multiples of 128."""
    return next((b for b in (16, 32, 64) if n <= b), -(-n // 128) * 128)


def documented_batch_bucket(n):
    """results/speed/README.md: with static kernels the batch is padded to a power of two."""
    return 1 << (n - 1).bit_length()


@pytest.fixture(scope="module")
def dman_checkpoint(toy_data_bin, tmp_path_factory):
    from conftest import TINY_MODEL, TINY_TRAIN, USER_DIR, run_cli

    save = tmp_path_factory.mktemp("dman_flex")
    run_cli(["fairseq-train", toy_data_bin, "--user-dir", USER_DIR, "--arch", "transformer_man_base",
             "--encoder-sublayers", "dman,ffn", "--decoder-sublayers", "dman,cross,ffn", "--share-all-embeddings",
             *TINY_MODEL, *TINY_TRAIN, "--max-update", "1", "--disable-validation", "--save-dir", save,
             "--no-save-optimizer-state"])
    return save / "checkpoint_last.pt"


def generate_in_process(data, checkpoint, backend, out_dir):
    """fairseq-generate's own main in this process (so the forced compilation applies); the
    hypotheses by sentence id."""
    from conftest import USER_DIR
    from fairseq import options
    from fairseq_cli import generate

    parser = options.get_generation_parser()
    # batches of at most 40 tokens: 2..6 sentences of 4..10 tokens (greedy search, at most 20
    # target tokens): several batch sizes, key lengths 1..21 (buckets 16 and 32)
    args = options.parse_args_and_arch(parser, [
        str(data), "--user-dir", USER_DIR, "--path", str(checkpoint), "--gen-subset", "test", "--cpu",
        "--beam", "1", "--max-tokens", "40", "--max-len-a", "0", "--max-len-b", "20",
        "--results-path", str(out_dir), "--model-overrides", str({"attention_backend": backend})])
    generate.main(args)
    lines = (out_dir / "generate-test.txt").read_text().splitlines()
    return {line.split("\t")[0]: line.split("\t")[2] for line in lines if line.startswith("H-")}


def test_flex_compilations_in_fairseq_generate_are_bounded_by_buckets(dman_checkpoint, toy_data_bin, tmp_path,
                                                                       monkeypatch):
    """Compiled flex (forced on CPU) in a real generation: graphs grow with the (structure, batch
    size, length bucket) keys, not with the lengths; the hypotheses are the explicit path's."""
    from man_fairseq.modules import flex_backend as flex

    runner = flex.FlexRunner()
    runner.compiling = True  # CPU runs flex eagerly by default; compile it as on CUDA
    monkeypatch.setattr(flex, "FLEX_RUNNER", runner)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # written under tmp_path only
    # the kernels' C++ at -O0: what is counted (graphs) and compared (hypotheses) does not depend on
    # it; measured 71 -> 58 CPU-s for this test
    monkeypatch.setenv("TORCHINDUCTOR_DEBUG_COMPILE", "1")
    calls = []
    call = flex.flex_attention_call

    def recording_call(q, k, v, mods, *args):  # the unpadded shapes and the mods' structure
        structure = tuple(m.__qualname__ for m in mods.score_mods + mods.mask_mods)
        calls.append((q.size(0), q.size(2), k.size(2), structure))
        return call(q, k, v, mods, *args)

    monkeypatch.setattr(flex, "flex_attention_call", recording_call)
    torch._dynamo.reset()
    before = runner.recompiles()
    (tmp_path / "flex").mkdir()
    hyps = generate_in_process(toy_data_bin, dman_checkpoint, "flex", tmp_path / "flex")
    compiled = runner.recompiles() - before
    torch._dynamo.reset()

    batch_sizes = {b for b, _, _, _ in calls}
    lengths = {(t, s) for _, t, s, _ in calls}
    keys = {(documented_batch_bucket(b), documented_bucket(t), documented_bucket(s), structure)
            for b, t, s, structure in calls}
    assert len(batch_sizes) >= 3 and len(lengths) >= 20, (batch_sizes, lengths)  # what varies
    # flex_attention: one static kernel per key (the CPU fallback, the batch padded to a power of
    # two), plus the first compilation, the failed dynamic one and the failing call's own static
    # kernel at its unpadded batch size; create_block_mask: at most one per key and that call's.
    # Measured: 18 graphs for 12 keys (24 with the batch unpadded)
    assert 1 <= compiled <= 2 * len(keys) + 4, (compiled, sorted(keys))
    assert hyps and hyps == generate_in_process(toy_data_bin, dman_checkpoint, "explicit", tmp_path)
