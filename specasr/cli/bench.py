"""`specasr bench`: speculative vs autoregressive decoding on files, interleaved, with medians."""

from __future__ import annotations

from dataclasses import replace

import click

from specasr.cli.common import DEFAULTS, check_compute_type, gamma_options, load_models, model_options
from specasr.constants import VERIFY_MODES


@click.command()
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=str))
@model_options
@gamma_options
@click.option(
    "--mode",
    "modes",
    type=click.Choice(VERIFY_MODES),
    multiple=True,
    default=[DEFAULTS.mode],
    show_default=True,
    help="Verifier mode; repeat to compare several against one autoregressive reference.",
)
@click.option("--temperature", type=float, default=0.0, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True)
@click.option(
    "--mels",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="A torch.save'd list of [1, n_mels, 3000] windows to use instead of FILES.",
)
@click.option(
    "--dump-logits",
    type=click.Path(dir_okay=False),
    default=None,
    help="Instead of timing, save paired target/draft logits along the greedy transcripts.",
)
def bench(
    files,
    model,
    draft,
    modes,
    gamma,
    gamma_policy,
    draft_stop,
    temperature,
    repeats,
    mels,
    device,
    dtype,
    compute_type,
    dump_logits,
):
    """Speculative vs autoregressive decoding on FILES (default: the bundled example), interleaved."""
    from importlib.resources import files as resources

    import torch

    from specasr.eval.bench import file_mels, logit_pairs, run_bench

    check_compute_type(compute_type, modes)
    pair = load_models(model, draft, modes[0], device, dtype, compute_type)
    if mels:
        windows = [m.to(pair.device) for m in torch.load(mels)]
    else:
        windows = file_mels(pair, list(files) or [str(resources("specasr") / "assets" / "example.wav")])
    if dump_logits:
        torch.save(logit_pairs(pair, windows, DEFAULTS), dump_logits)
        click.echo(f"saved paired logits to {dump_logits}")
        return
    for mode in modes:
        options = replace(
            DEFAULTS,
            mode=mode,
            gamma=gamma,
            gamma_policy=gamma_policy,
            draft_stop=draft_stop,
            temperature=temperature,
            gamma_max=max(DEFAULTS.gamma_max, gamma),
        )
        report = run_bench(pair, windows, options, repeats=repeats)
        click.echo(
            f"\nmodel {model}, draft {pair.draft_name}, mode {mode}, γ {gamma} ({gamma_policy}), "
            f"T {temperature}, device {pair.device}, dtype {str(pair.dtype).removeprefix('torch.')}, "
            f"compute type {pair.compute_type}"
        )
        click.echo(report.table())
