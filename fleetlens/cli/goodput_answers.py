"""What ``fleetlens goodput RUN`` adds below the breakdown: MFU/HFU/MBU, equation 4 measured
and predicted, ceiling gains, and ``--what-if`` (a change judged by the product of ratios)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ._output import Table, fmt, pct

if TYPE_CHECKING:
    from ..api.goodput_models import RunGoodputOut, WhatIfOut

__all__ = ["add_options", "parse_ceilings", "parse_what_if", "print_answers", "print_what_if"]

FACTORS = ("scheduling", "runtime", "program")
TERMS = ("startup", "data_stall", "checkpoint", "recovery", "preemption", "other")


def add_options(g: argparse.ArgumentParser) -> None:
    g.add_argument(
        "--accelerator",
        help="the accelerator, overriding the run config's (h100, 'NVIDIA H100 80GB HBM3', ...)",
    )
    g.add_argument("--dtype", help="the dtype the peak is taken at (default the config's, bf16)")
    g.add_argument(
        "--ceiling",
        action="append",
        default=[],
        metavar="FACTOR=VALUE",
        help="a lever's reachable ceiling for the ceiling gains (default 1), e.g. program=0.65",
    )
    g.add_argument(
        "--what-if",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="judge a change by the product of ratios against the run's factors: a factor "
        "(scheduling, runtime, program) as a value after (program=0.65, program=65%%), a ratio "
        "(program=x1.35) or a relative change (runtime=-25%%); or an equation-4 term (startup, "
        "data_stall, checkpoint, recovery, preemption, other) as its share of held time after "
        "(checkpoint=1%%) or a ratio of its measured share (checkpoint=x0.5). Repeatable.",
    )


def _number(name: str, text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ConfigError(f"{name}: {text!r} is not a number") from None
    if v != v or v in (float("inf"), float("-inf")):
        raise ConfigError(f"{name}: {text!r} is not a finite number")
    return v


def parse_ceilings(specs: list[str]) -> dict[str, float]:
    out = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        if not sep or name not in FACTORS:
            raise ConfigError(f"--ceiling {spec!r}: give FACTOR=VALUE, FACTOR one of {FACTORS}")
        out[name] = _number(f"--ceiling {name}", text.rstrip("%")) / (
            100.0 if text.endswith("%") else 1.0
        )
    return out


def parse_what_if(specs: list[str], measured_terms: dict[str, float]) -> dict[str, Any]:
    """``--what-if`` values as the what-if route's body (``after``, ``ratios``, ``terms``)."""
    after: dict[str, float] = {}
    ratios: dict[str, float] = {}
    terms: dict[str, float] = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        name, text = name.strip(), text.strip()
        if not sep or not text or name not in FACTORS + TERMS:
            raise ConfigError(
                f"--what-if {spec!r}: give NAME=VALUE, NAME a factor ({', '.join(FACTORS)}) or "
                f"an equation-4 term ({', '.join(TERMS)})"
            )
        if name in after or name in ratios or name in terms:
            raise ConfigError(f"--what-if names {name} twice")
        label = f"--what-if {name}"
        if text[0] in "x*":
            ratio = _number(label, text[1:])
            if name in TERMS:
                terms[name] = measured_terms.get(name, 0.0) * ratio
            else:
                ratios[name] = ratio
        elif text[0] in "+-" and text.endswith("%"):
            if name in TERMS:
                raise ConfigError(f"{label}: give a term as its share after (1%) or a ratio (x0.5)")
            ratios[name] = 1.0 + _number(label, text[:-1]) / 100.0
        else:
            share = _number(label, text.rstrip("%")) / (100.0 if text.endswith("%") else 1.0)
            (terms if name in TERMS else after)[name] = share
    return {"after": after, "ratios": ratios, "terms": terms}


def print_answers(gp: RunGoodputOut) -> None:
    """The program line (MFU/HFU/MBU or why not), equation 4, ceiling gains."""
    prog = gp.program
    if prog.mfu is not None:
        peak = prog.peak_flops_per_device
        print(
            f"  MFU {pct(prog.mfu)}  HFU {pct(prog.hfu)}  MBU {pct(prog.mbu)}  "
            f"over retained steps ({fmt(prog.devices)} x {prog.accelerator or '-'}"
            f" at {fmt(peak / 1e12 if peak else None, '.1f')} TFLOP/s {prog.dtype or ''})"
        )
    else:
        print(f"  MFU unknown: {prog.missing}")
    terms = gp.runtime_terms
    if terms is not None:
        pred, res = terms.predicted or {}, terms.residual or {}
        print("  equation 4, share of held time:")
        t = Table(("TERM", "<12"), ("MEASURED", ">9"), ("PREDICTED", ">10"), ("RESIDUAL", ">9"))
        t.indent = "    "
        print(t.header())
        for name, v in terms.measured.items():
            r = res.get(name)
            print(t.row(name, pct(v), pct(pred.get(name)), "-" if r is None else f"{r:+.2%}"))
        if "total" in res:
            print(t.row("residual", "", "", f"{res['total']:+.2%}"))
    gains = gp.advice.ceiling_gains
    if gains:
        cells = [
            f"{k} at {v.ceiling:.2f}: MPG {v.mpg:.3f} ({fmt(v.gain, '+.1%')})"
            for k, v in gains.items()
        ]
        print("  ceiling gains: " + "; ".join(cells))


def print_what_if(w: WhatIfOut) -> None:
    b, a, r = w.before, w.after, w.ratios
    print("what-if, judged by the product of ratios (003 s9.9.1):")
    for k in FACTORS:
        print(f"  {k:<11} {getattr(b, k):.3f} -> {getattr(a, k):.3f}  x{r[k]:.3f}")
    verdict = "improves" if w.improves else "does not improve"
    print(
        f"  product x{w.product:.3f} (MPG {b.mpg:.3f} -> {a.mpg:.3f}; job product "
        f"x{w.job_product_ratio:.3f}): the change {verdict} the fleet's goodput"
    )
    be = w.break_even
    print("  break-even ratios: " + ", ".join(f"{k} x{be[k]:.3f}" for k in FACTORS))
