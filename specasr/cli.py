"""`specasr` command line: a thin click front end over the library.

Exit codes: 0 success, 1 some input failed (the others were still processed), 2 usage error.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import click

from specasr.options import GAMMA_POLICIES, MODES, DecodeOptions

_DEFAULTS = DecodeOptions()


def _load(model: str, draft: str | None, mode: str, device: str | None, dtype: str | None):
    import torch

    from specasr.models import load_pair

    torch_dtype = {None: None, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[dtype]
    want_draft = None if mode == "autoregressive" and draft in (None, "default") else (draft or "default")
    return load_pair(model, want_draft, device=device, dtype=torch_dtype)


@click.group()
@click.version_option(package_name="specasr")
def main() -> None:
    """Whisper transcription with exact speculative decoding."""


@main.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=True, path_type=str))
@click.option(
    "--model",
    default="base",
    show_default=True,
    help="Target: preset, HF hub id, HF or CTranslate2 directory.",
)
@click.option(
    "--draft",
    default="default",
    show_default=True,
    help="Draft: 'default' (the preset's), 'none', 'self:K' (first K target layers), or a model spec.",
)
@click.option("--mode", type=click.Choice(MODES), default=_DEFAULTS.mode, show_default=True)
@click.option(
    "--gamma",
    type=int,
    default=_DEFAULTS.gamma,
    show_default=True,
    help="Draft tokens per step (start value).",
)
@click.option(
    "--gamma-policy", type=click.Choice(GAMMA_POLICIES), default=_DEFAULTS.gamma_policy, show_default=True
)
@click.option("--temperature", type=float, default=_DEFAULTS.temperature, show_default=True)
@click.option(
    "--language", default=_DEFAULTS.language, show_default=True, help="Language code; 'auto' to detect."
)
@click.option(
    "--task", type=click.Choice(["transcribe", "translate"]), default=_DEFAULTS.task, show_default=True
)
@click.option("--seed", type=int, default=_DEFAULTS.seed, show_default=True)
@click.option("--device", default=None, help="cpu, cuda, cuda:1 … (default: cuda when available).")
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "fp16", "bf16"]),
    default=None,
    help="Model dtype (default: fp32 on CPU, fp16 on CUDA).",
)
@click.option("--stats", is_flag=True, help="Print speculative-decoding statistics to stderr.")
def transcribe(
    files, model, draft, mode, gamma, gamma_policy, temperature, language, task, seed, device, dtype, stats
):
    """Transcribe audio FILES (each up to 30 s) and print one transcript per file."""
    from specasr.audio import AudioError
    from specasr.transcribe import AudioTooLongError, transcribe_clip

    try:
        options = replace(
            _DEFAULTS,
            mode=mode,
            gamma=gamma,
            gamma_policy=gamma_policy,
            temperature=temperature,
            language=None if language == "auto" else language,
            task=task,
            seed=seed,
            gamma_max=max(_DEFAULTS.gamma_max, gamma),
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    try:
        pair = _load(model, draft, mode, device, dtype)
    except (ValueError, FileNotFoundError, OSError) as e:
        click.echo(f"error: cannot load model: {e}", err=True)
        sys.exit(1)
    failed = 0
    for path in files:
        try:
            result = transcribe_clip(pair, path, options)
        except (AudioError, AudioTooLongError) as e:
            failed += 1
            click.echo(f"error: {e}", err=True)
            continue
        prefix = f"{path}: " if len(files) > 1 else ""
        click.echo(prefix + result.text.strip())
        if stats:
            click.echo(f"[{path}] {result.stats.summary()}", err=True)
    if failed:
        click.echo(f"{failed} of {len(files)} file(s) failed", err=True)
        sys.exit(1)


@main.command()
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=str))
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option(
    "--mode",
    "modes",
    type=click.Choice(MODES[1:]),
    multiple=True,
    default=[_DEFAULTS.mode],
    show_default=True,
    help="Verifier mode; repeat to compare several against one autoregressive reference.",
)
@click.option("--gamma", type=int, default=_DEFAULTS.gamma, show_default=True)
@click.option(
    "--gamma-policy", type=click.Choice(GAMMA_POLICIES), default=_DEFAULTS.gamma_policy, show_default=True
)
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option(
    "--mels",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A torch.save'd list of [1, n_mels, 3000] windows to use instead of FILES.",
)
@click.option("--device", default=None)
@click.option("--dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default=None)
@click.option(
    "--dump-logits",
    type=click.Path(dir_okay=False),
    default=None,
    help="Instead of timing, save paired target/draft logits along the greedy transcripts.",
)
def bench(
    files, model, draft, modes, gamma, gamma_policy, temperature, repeats, mels, device, dtype, dump_logits
):
    """Speculative vs autoregressive decoding on FILES (default: the bundled example), interleaved."""
    from importlib.resources import files as resources

    import torch

    from specasr.bench import file_mels, logit_pairs, run_bench

    pair = _load(model, draft, modes[0], device, dtype)
    if mels:
        windows = [m.to(pair.device) for m in torch.load(mels)]
    else:
        windows = file_mels(pair, list(files) or [str(resources("specasr") / "assets" / "example.wav")])
    if dump_logits:
        torch.save(logit_pairs(pair, windows, _DEFAULTS), dump_logits)
        click.echo(f"saved paired logits to {dump_logits}")
        return
    for mode in modes:
        options = replace(
            _DEFAULTS,
            mode=mode,
            gamma=gamma,
            gamma_policy=gamma_policy,
            temperature=temperature,
            gamma_max=max(_DEFAULTS.gamma_max, gamma),
        )
        report = run_bench(pair, windows, options, repeats=repeats)
        click.echo(
            f"\nmodel {model}, draft {pair.draft_name}, mode {mode}, γ {gamma} ({gamma_policy}), "
            f"T {temperature}, device {pair.device}, dtype {str(pair.dtype).removeprefix('torch.')}"
        )
        click.echo(report.table())


@main.command()
def models() -> None:
    """List the model presets and whether each is available locally."""
    from specasr.models import list_presets

    rows = list_presets()
    click.echo(f"{'preset':<10} {'local':<6} {'target':<28} draft")
    for row in rows:
        local = "yes" if row["available_locally"] else "no"
        click.echo(f"{row['name']:<10} {local:<6} {row['target']:<28} {row['draft']}")
