"""FLOPs of a training step and the peak rates they are measured against.

Model FLOPs (MFU's numerator) count only the operations the architecture requires: 6 per
parameter per token for forward and backward, plus the attention score and value products,
12 x layers x d_model x sequence per token for a causal decoder counted in full (PaLM, Chowdhery
et al. 2022, appendix B). Hardware FLOPs (HFU's numerator) add what the implementation executes
on top, chiefly activation recomputation. Peak rates are dense (no structured sparsity), per
device, from each vendor's datasheet named in ``source``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError, UnknownName

__all__ = [
    "ACCELERATORS",
    "Accelerator",
    "accelerator",
    "dense_flops_per_token",
    "dtype_name",
    "hardware_flops_per_token",
    "mbu",
    "mfu",
    "moe_flops_per_token",
]


def dense_flops_per_token(
    n_params: float, n_layers: int = 0, d_model: int = 0, seq_len: int = 0
) -> float:
    """Model FLOPs per trained token of a dense transformer: 6N plus the attention term.

    Pass ``n_layers``, ``d_model`` and ``seq_len`` to include attention (12 L d S); with any of
    them 0 the result is the 6N approximation.
    """
    if n_params <= 0:
        raise ConfigError(f"n_params is {n_params}; a model has a positive parameter count")
    return 6.0 * n_params + 12.0 * n_layers * d_model * seq_len


def moe_flops_per_token(
    active_params: float, n_layers: int = 0, d_model: int = 0, seq_len: int = 0
) -> float:
    """Model FLOPs per token of a mixture-of-experts model: only the parameters a token uses.

    ``active_params`` is the shared parameters plus the top-k experts' (e.g. ~37B of a 671B
    model routed 8-of-256); the router's own FLOPs are negligible and left out.
    """
    return dense_flops_per_token(active_params, n_layers, d_model, seq_len)


def hardware_flops_per_token(model_flops_per_token: float, recompute: str = "none") -> float:
    """FLOPs executed per token, for HFU: full recomputation repeats the forward pass (+1/3).

    ``recompute``: ``"none"``, ``"full"`` (every layer's forward again: 8N instead of 6N) or a
    fraction as a string (``"0.25"``: that share of the forward pass recomputed).
    """
    if recompute == "none":
        extra = 0.0
    elif recompute == "full":
        extra = 1.0
    else:
        try:
            extra = float(recompute)
        except ValueError:
            raise ConfigError(
                f"recompute is {recompute!r}; use 'none', 'full' or a fraction like '0.25'"
            ) from None
        if not 0.0 <= extra <= 1.0:
            raise ConfigError(f"recompute fraction {extra} is outside 0..1")
    # The forward pass is a third of the 6N-style count.
    return model_flops_per_token * (1.0 + extra / 3.0)


@dataclass(frozen=True)
class Accelerator:
    """Dense peak rates in TFLOP/s by dtype, HBM bandwidth in TB/s, and where they come from."""

    name: str
    tflops: dict[str, float]
    hbm_tb_s: float
    source: str
    # What a free-form name is matched on (:func:`accelerator`): the chip, the board form
    # factor when the chip ships in several, the memory when it tells two entries apart.
    family: str = ""
    form: str = ""
    memory_gb: int = 0

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s (not TFLOP/s) of one device at ``dtype`` (``bfloat16``, ``half``... too)."""
        key = dtype_name(dtype)
        try:
            return self.tflops[key] * 1e12
        except KeyError:
            raise UnknownName(
                f"{self.name} has no {dtype} peak in the table; known: {', '.join(self.tflops)}"
            ) from None

    @property
    def peak_bytes_per_s(self) -> float:
        return self.hbm_tb_s * 1e12


_DTYPES = {
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "float64": "fp64",
    "double": "fp64",
    "float8": "fp8",
    "fp8e4m3": "fp8",
    "fp8e5m2": "fp8",
    "float8e4m3fn": "fp8",
    "float8e5m2": "fp8",
    "float4": "fp4",
    "tensorfloat32": "tf32",
}


def dtype_name(dtype: str) -> str:
    """The table's key for a dtype as people and frameworks write it (``torch.bfloat16`` ->
    ``bf16``); a name it does not recognise comes back compacted, for the caller to refuse."""
    key = re.sub(r"[^a-z0-9]", "", dtype.lower().removeprefix("torch."))
    return _DTYPES.get(key, key)


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator(
            "H100-SXM",
            {"fp64": 67.0, "tf32": 494.7, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
            3.35,
            "NVIDIA H100 Tensor Core GPU Datasheet (SXM column; sparse figures halved)",
            family="h100",
            form="sxm",
            memory_gb=80,
        ),
        Accelerator(
            "H100-PCIe",
            {"fp64": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0},
            2.0,
            "NVIDIA H100 Tensor Core GPU Datasheet (PCIe column; sparse figures halved)",
            family="h100",
            form="pcie",
            memory_gb=80,
        ),
        Accelerator(
            "H200-SXM",
            {"fp64": 67.0, "tf32": 494.7, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
            4.8,
            "NVIDIA H200 Tensor Core GPU Datasheet (SXM column; sparse figures halved)",
            family="h200",
            form="sxm",
            memory_gb=141,
        ),
        Accelerator(
            "B200",
            {"tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "fp4": 9000.0},
            8.0,
            "NVIDIA DGX B200 Datasheet (8-GPU totals divided by 8; sparse figures halved)",
            family="b200",
            memory_gb=180,
        ),
        Accelerator(
            "A100-SXM-80GB",
            {"fp64": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
            2.039,
            "NVIDIA A100 Tensor Core GPU Datasheet (80GB SXM column)",
            family="a100",
            form="sxm",
            memory_gb=80,
        ),
        Accelerator(
            "A100-SXM-40GB",
            {"fp64": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
            1.555,
            "NVIDIA A100 Tensor Core GPU Datasheet (40GB SXM column)",
            family="a100",
            form="sxm",
            memory_gb=40,
        ),
        Accelerator(
            "MI300X",
            {"fp64": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
            5.3,
            "AMD Instinct MI300X Accelerator Data Sheet (dense matrix figures)",
            family="mi300x",
            memory_gb=192,
        ),
        Accelerator(
            "MI325X",
            {"fp64": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
            6.0,
            "AMD Instinct MI325X Accelerator Data Sheet (dense matrix figures)",
            family="mi325x",
            memory_gb=256,
        ),
        Accelerator(
            "V100-SXM2",
            {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0},
            0.9,
            "NVIDIA Tesla V100 GPU Datasheet (SXM2 column, tensor performance)",
            family="v100",
            form="sxm",
        ),
        Accelerator(
            "L40S",
            {"tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
            0.864,
            "NVIDIA L40S GPU Datasheet (sparse figures halved)",
            family="l40s",
            memory_gb=48,
        ),
        Accelerator(
            "TPU-v5p",
            {"bf16": 459.0, "int8": 918.0},
            2.765,
            "Google Cloud TPU v5p documentation (system architecture, per-chip specifications)",
            family="tpuv5p",
            memory_gb=95,
        ),
    )
}


# A name as people, schedulers and NVML write it, read as a sequence of these parts: the
# vendor's words are dropped, the chip picks the family, "SXM4"/"PCIe"/"NVL" the board, "80GB"
# the memory. Anything else in the name refuses it: a guess would give a wrong peak.
_NAME_PART = re.compile(
    r"(?P<family>mi325x|mi300x|h100|h200|b200|a100|v100|l40s|tpuv5p)"
    r"|(?P<form>sxm\d?|pcie|nvl)"
    r"|(?P<memory>\d+(?:gb|g))"
    r"|(?P<noise>nvidia|amd|instinct|tesla|google|cloud|tensorcore|gpu|hbm\d?e?)"
)


def _parse_name(name: str) -> dict[str, str] | None:
    compact = re.sub(r"[^a-z0-9]", "", name.lower())
    parts: dict[str, str] = {}
    pos = 0
    while pos < len(compact):
        m = _NAME_PART.match(compact, pos)
        if m is None or m.lastgroup is None:
            return None
        kind, text = m.lastgroup, m.group()
        if kind == "form":
            text = re.sub(r"\d", "", text)
        elif kind == "memory":
            text = text.rstrip("gb")
        if kind != "noise":
            if kind in parts and parts[kind] != text:
                return None
            parts[kind] = text
        pos = m.end()
    return parts if "family" in parts else None


def accelerator(name: str) -> Accelerator:
    """The table entry a free-form accelerator name means, or :class:`UnknownName` listing the
    known ones.

    Case, spaces and punctuation do not matter, and NVML's marketing names resolve: ``h100``,
    ``H100 SXM``, ``NVIDIA H100 80GB HBM3`` -> H100-SXM; ``a100-80g`` and
    ``NVIDIA A100-SXM4-80GB`` -> A100-SXM-80GB; ``NVIDIA H100 PCIe`` -> H100-PCIe. A chip named
    without its board or memory is the table's first entry for it (the SXM board, the largest
    memory), whose dense peak is the chip's; a board or memory the table lacks (``H100 NVL``,
    ``A100 PCIe``) is refused rather than given another board's peak.
    """
    if not isinstance(name, str) or not name.strip():
        raise UnknownName(f"accelerator name is {name!r}; known: {', '.join(ACCELERATORS)}")
    exact = {k.lower(): a for k, a in ACCELERATORS.items()}.get(name.strip().lower())
    if exact is not None:
        return exact
    parts = _parse_name(name)
    found = None
    if parts is not None:
        cands = [a for a in ACCELERATORS.values() if a.family == parts["family"]]
        if "form" in parts:
            cands = [a for a in cands if a.form == parts["form"]]
        if "memory" in parts and any(a.memory_gb for a in cands):
            cands = [a for a in cands if a.memory_gb in (0, int(parts["memory"]))]
        found = cands[0] if cands else None
    if found is None:
        raise UnknownName(
            f"unknown accelerator {name!r}; known: {', '.join(ACCELERATORS)} (also as NVML "
            "names them, e.g. 'NVIDIA H100 80GB HBM3'); or give peak_flops in the run config"
        )
    return found


def mfu(flops: float, seconds: float, devices: int, peak_flops_per_device: float) -> float:
    """Model FLOPs utilization: useful FLOPs over what ``devices`` could do at peak in ``seconds``.

    Measured over retained steps only (their productive time), this is program goodput.
    """
    if seconds <= 0 or devices <= 0 or peak_flops_per_device <= 0:
        raise ConfigError(
            f"mfu needs positive seconds, devices and peak (got {seconds}, {devices}, "
            f"{peak_flops_per_device})"
        )
    return flops / (seconds * devices * peak_flops_per_device)


def mbu(bytes_moved: float, seconds: float, devices: int, peak_bytes_per_s: float) -> float:
    """Model bandwidth utilization: required bytes (weights + KV cache) over peak bandwidth.

    The program goodput of bandwidth-bound decode, where MFU would blame the batch size on the
    kernels.
    """
    if seconds <= 0 or devices <= 0 or peak_bytes_per_s <= 0:
        raise ConfigError("mbu needs positive seconds, devices and peak bandwidth")
    return bytes_moved / (seconds * devices * peak_bytes_per_s)
