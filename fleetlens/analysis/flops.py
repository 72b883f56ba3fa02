"""FLOPs of a training step and the peak rates they are measured against.

Model FLOPs (MFU's numerator) count only the operations the architecture requires: 6 per
parameter per token for forward and backward, plus the attention score and value products,
12 x layers x d_model x sequence per token for a causal decoder counted in full (PaLM, Chowdhery
et al. 2022, appendix B). Hardware FLOPs (HFU's numerator) add what the implementation executes
on top, chiefly activation recomputation. Peak rates are dense (no structured sparsity), per
device, from each vendor's datasheet named in ``source``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

__all__ = [
    "ACCELERATORS",
    "Accelerator",
    "accelerator",
    "dense_flops_per_token",
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

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Peak FLOP/s (not TFLOP/s) of one device at ``dtype``."""
        try:
            return self.tflops[dtype] * 1e12
        except KeyError:
            raise ConfigError(
                f"{self.name} has no {dtype} peak in the table; known: {sorted(self.tflops)}"
            ) from None


ACCELERATORS: dict[str, Accelerator] = {
    a.name: a
    for a in (
        Accelerator(
            "H100-SXM",
            {"fp64": 67.0, "tf32": 494.7, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
            3.35,
            "NVIDIA H100 Tensor Core GPU Datasheet (SXM column; sparse figures halved)",
        ),
        Accelerator(
            "H100-PCIe",
            {"fp64": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0, "fp8": 1513.0},
            2.0,
            "NVIDIA H100 Tensor Core GPU Datasheet (PCIe column; sparse figures halved)",
        ),
        Accelerator(
            "H200-SXM",
            {"fp64": 67.0, "tf32": 494.7, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0},
            4.8,
            "NVIDIA H200 Tensor Core GPU Datasheet (SXM column; sparse figures halved)",
        ),
        Accelerator(
            "B200",
            {"tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "fp4": 9000.0},
            8.0,
            "NVIDIA DGX B200 Datasheet (8-GPU totals divided by 8; sparse figures halved)",
        ),
        Accelerator(
            "A100-SXM-80GB",
            {"fp64": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
            2.039,
            "NVIDIA A100 Tensor Core GPU Datasheet (80GB SXM column)",
        ),
        Accelerator(
            "A100-SXM-40GB",
            {"fp64": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
            1.555,
            "NVIDIA A100 Tensor Core GPU Datasheet (40GB SXM column)",
        ),
        Accelerator(
            "MI300X",
            {"fp64": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
            5.3,
            "AMD Instinct MI300X Accelerator Data Sheet (dense matrix figures)",
        ),
        Accelerator(
            "MI325X",
            {"fp64": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9},
            6.0,
            "AMD Instinct MI325X Accelerator Data Sheet (dense matrix figures)",
        ),
        Accelerator(
            "V100-SXM2",
            {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0},
            0.9,
            "NVIDIA Tesla V100 GPU Datasheet (SXM2 column, tensor performance)",
        ),
        Accelerator(
            "L40S",
            {"tf32": 183.0, "bf16": 362.05, "fp16": 362.05, "fp8": 733.0},
            0.864,
            "NVIDIA L40S GPU Datasheet (sparse figures halved)",
        ),
        Accelerator(
            "TPU-v5p",
            {"bf16": 459.0, "int8": 918.0},
            2.765,
            "Google Cloud TPU v5p documentation (system architecture, per-chip specifications)",
        ),
    )
}


def accelerator(name: str) -> Accelerator:
    """The table entry for ``name`` (case-insensitive), or a ConfigError listing the known ones."""
    for key, acc in ACCELERATORS.items():
        if key.lower() == name.lower():
            return acc
    raise ConfigError(f"unknown accelerator {name!r}; known: {', '.join(ACCELERATORS)}")


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
