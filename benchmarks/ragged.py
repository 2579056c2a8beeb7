"""Per-row acceptance of batched speculative decoding: batch 1 against batch B, chunked.

    python -m benchmarks.ragged --model base --batch-size 8 --repeats 5 [--draft-stop 0]

Transcribes the long-form fixture (`longform.long_recording`: the LibriVox clips `repeats`
times over, with pauses; 5 gives about 190 s, 9 chunked windows) with the chunked strategy,
its windows decoded 1 at a time and B at a time, and once target-only. Per configuration:
α̂ per token (accepted / (accepted + rejected)), tokens each row emits per target pass
(what a row loses in lockstep), (row, pass) pairs, and whether the tokens equal the
target-only ones. Rows are ragged, so each row keeps all it accepted; γ and the draft stop
are still the batch's (the run stops once every row is unsure), so with a draft stop a
row in a batch can draft further than alone. Counts only, no timings: safe on a busy
machine.
"""

from __future__ import annotations

from dataclasses import replace

import click

from specasr.options import TranscribeOptions


def _run(pair, samples, options: TranscribeOptions):
    """-> (every segment's tokens, the TranscriptionInfo with the summed DecodeStats)."""
    from specasr.transcription import transcribe

    segments, info = transcribe(samples, pair, options, source_rate=16000)
    return [s.tokens for s in segments], info


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True, help="Draft spec; default: the preset's.")
@click.option("--batch-size", type=int, default=8, show_default=True, help="Windows per batched decode.")
@click.option("--repeats", type=int, default=5, show_default=True, help="Times the clips recur.")
@click.option("--draft-stop", type=float, default=None, help="DecodeOptions.draft_stop (default: its own).")
@click.option(
    "--data", type=click.Path(exists=True, file_okay=False), default="tests/data", show_default=True
)
@click.option("--device", default="cpu", show_default=True)
def main(model, draft, batch_size, repeats, draft_stop, data, device) -> None:
    from benchmarks.longform import long_recording
    from specasr.models.loading import load_pair

    rec = long_recording(data, repeats=repeats)
    pair = load_pair(model, draft, device=device)
    base = TranscribeOptions(strategy="chunked")
    if draft_stop is not None:
        base = base.with_decode(draft_stop=draft_stop)
    ar_tokens, ar_info = _run(pair, rec.samples, base.with_decode(mode="autoregressive"))
    click.echo(
        f"{model} + {pair.draft_name}, {len(rec.samples) / 16000:.0f} s, {ar_info.windows} chunked windows, "
        f"draft_stop {base.decode.draft_stop}"
    )
    click.echo("| windows per batch | α̂ | tokens per row per target pass | (row, pass) pairs | same tokens |")
    click.echo("|---|---|---|---|---|")
    for b in (1, batch_size):
        tokens, info = _run(pair, rec.samples, replace(base, batch_size=b))
        s = info.stats
        click.echo(
            f"| {b} | {s.token_acceptance:.3f} | {s.tokens_per_target_call:.2f} | {s.row_steps} "
            f"| {'yes' if tokens == ar_tokens else 'no'} |"
        )


if __name__ == "__main__":
    main()
