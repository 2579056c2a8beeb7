"""Pieces the command-line front ends share: model loading and the common options."""

from __future__ import annotations

import sys

import click

from specasr.options import GAMMA_POLICIES, DecodeOptions

DEFAULTS = DecodeOptions()


def load_models(model: str, draft: str | None, mode: str, device: str | None, dtype: str | None):
    """The ModelPair for `--model/--draft/--device/--dtype`; no draft for target-only decoding.
    A model that cannot be loaded is reported on stderr and exits with status 1."""
    import torch

    from specasr.models.loading import load_pair

    torch_dtype = {None: None, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    want_draft = None if mode == "autoregressive" and draft in (None, "default") else (draft or "default")
    try:
        return load_pair(model, want_draft, device=device, dtype=torch_dtype)
    except (ValueError, FileNotFoundError, OSError) as e:
        click.echo(f"error: cannot load model: {e}", err=True)
        sys.exit(1)


def _stack(*options):
    def apply(f):
        for option in reversed(options):
            f = option(f)
        return f

    return apply


model_options = _stack(
    click.option(
        "--model",
        default="base",
        show_default=True,
        help="Target: preset, HF hub id, HF or CTranslate2 directory.",
    ),
    click.option(
        "--draft",
        default="default",
        show_default=True,
        help="Draft: 'default' (the preset's), 'none', 'self:K' (first K target layers), or a model spec.",
    ),
    click.option("--device", default=None, help="cpu, cuda, cuda:1 … (default: cuda when available)."),
    click.option(
        "--dtype",
        type=click.Choice(["fp32", "fp16", "bf16"]),
        default=None,
        help="Model dtype (default: fp32 on CPU, fp16 on CUDA).",
    ),
)

gamma_options = _stack(
    click.option(
        "--gamma",
        type=int,
        default=DEFAULTS.gamma,
        show_default=True,
        help="Draft tokens per step (start value).",
    ),
    click.option(
        "--gamma-policy", type=click.Choice(GAMMA_POLICIES), default=DEFAULTS.gamma_policy, show_default=True
    ),
    click.option(
        "--draft-stop",
        type=click.FloatRange(0, 1, max_open=True),
        default=DEFAULTS.draft_stop,
        show_default=True,
        help="End a draft run at a proposal the draft gives probability below this (0: always γ). Exact.",
    ),
)
