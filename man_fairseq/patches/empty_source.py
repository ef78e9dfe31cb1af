"""``TranslationTask.inference_step`` answers an empty source with an empty hypothesis.

``fairseq-interactive`` (and ``fairseq-generate``) fed an empty source line to the model as a lone
end-of-sentence token and printed whatever the decoder hallucinated from it (``A2 A2``). An empty
source now gets an empty hypothesis (score 0) and a warning; the other sentences of the batch are
decoded as before.
"""

import logging

import torch
from fairseq.tasks.translation import TranslationTask

from .install import install

logger = logging.getLogger(__name__)


def _empty_hypothesis(eos, device, beam):
    return [{"tokens": torch.tensor([eos], device=device), "score": 0.0, "attention": None,
             "alignment": None, "positional_scores": torch.zeros(1, device=device)}
            for _ in range(beam)]


def skipping_empty_sources(original):
    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        """``TranslationTask.inference_step`` that answers an empty source (only end-of-sentence)
        with an empty hypothesis instead of decoding it."""
        net_input = sample.get("net_input") or {}
        lengths = net_input.get("src_lengths")
        if lengths is None or not torch.is_tensor(lengths) or not bool((lengths <= 1).any()):
            return original(self, generator, models, sample, prefix_tokens, constraints)
        bsz = lengths.size(0)
        empty = (lengths <= 1).nonzero().view(-1).tolist()
        keep = (lengths > 1).nonzero().view(-1)
        ids = sample.get("id")  # sentence ids where the caller has them (fairseq-generate)
        which = f" (ids {[int(ids[i]) for i in empty]})" if torch.is_tensor(ids) else ""
        logger.warning("%d empty source sentence(s)%s: empty hypothesis (nothing to translate)", len(empty), which)
        hypos = [None] * bsz
        if keep.numel():
            def pick(value):
                return value.index_select(0, keep) if torch.is_tensor(value) and value.dim() and value.size(0) == bsz else value

            sub = dict(sample)
            sub["net_input"] = {k: pick(v) for k, v in net_input.items()}
            for key in ("id", "target", "nsentences"):
                if key in sample:
                    sub[key] = pick(sample[key])
            if "nsentences" in sample:
                sub["nsentences"] = int(keep.numel())
            decoded = original(self, generator, models, sub, None if prefix_tokens is None else pick(prefix_tokens),
                               None if constraints is None else pick(constraints))
            for row, result in zip(keep.tolist(), decoded):
                hypos[row] = result
        beam = max(1, getattr(generator, "beam_size", 1))
        eos = self.target_dictionary.eos()
        for row in empty:
            hypos[row] = _empty_hypothesis(eos, lengths.device, beam)
        return hypos

    return inference_step


def apply():
    install(TranslationTask, "inference_step", skipping_empty_sources)
