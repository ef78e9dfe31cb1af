"""The benchmark's cases: each family's arch and options, the baseline of each width, targets."""

from dataclasses import dataclass, field
from typing import Dict, List, Optional

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
    # the project's ratio targets (case/baseline) on CPU at base width: {"train": x, "decode": y}
    targets: Dict[str, float] = field(default_factory=dict)
    # the project's targets on CUDA, every width: "train"/"decode" >= x, "mem" (peak memory) <= x
    gpu_targets: Dict[str, float] = field(default_factory=dict)
    fixed_width: Optional[str] = None  # a case pinned to one width (man_small)

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
             gpu_targets={"train": 0.95, "mem": 1.1, "decode": 0.95}),
        Case("man_small", "transformer_man_{w}", fixed_width="small",
             gpu_targets={"train": 0.95, "mem": 1.1, "decode": 0.95}),
        # default options: query-specific window, encoder layers 0,1,2
        Case("localness", "transformer_localness_{w}", targets={"train": 0.95},
             gpu_targets={"train": 0.97, "decode": 0.95}),
        # Enc(AW)-Cr(AW,Seg)-Dec(MW)
        Case("diffwin", "transformer_diffwin_{w}", ["--diffwin-preset", "enc_aw-cr_aw_seg-dec_mw"],
             targets={"train": 0.87}, gpu_targets={"train": 0.90, "decode": 0.95}),
        # two decoder passes per update: ~1.5x the cost per update expected; no training target
        Case("calibration", "transformer_calibrated_{w}", criterion=CALIBRATED_CRITERION,
             gpu_targets={"decode": 0.95}),
    ]
}


def baseline_key(width: str, backend: str) -> str:
    return f"baseline:{width}@{backend}"


def case_key(name: str, width: str, backend: str) -> str:
    return f"{name}:{width}@{backend}"
