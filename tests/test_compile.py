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
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r, **TOL, msg=lambda m: f"{backend} {mode}: {m}")


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
