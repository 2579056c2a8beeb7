"""A distilled draft's rows over its own vocabulary against full rows, side by side.

    python -m benchmarks.draft_rows --repeats 8

The speculative loop keeps a distilled draft's logits over its N columns (16384 for base's
packaged draft, against V = 51865): the filters (`decode.filters.on_vocab`), the race and the
confidence stop read [B, N], and the verifier gets full rows once per pass
(`decode.step.Proposal.full_logits`). This transcribes the long-form fixture
(`benchmarks.longform.long_recording`) in exact mode, sequentially and chunked, alternating the
reduced path with the full-row path (`DistilledDraft.reduce_rows = False`) over `--repeats`
rounds after a warm-up. It prints the median decoder phase of each, the median of the paired
ratios (full ÷ reduced, run i of each back to back), and whether both paths made the same
passes: at T = 0 they propose, stop and accept the same tokens. Both arms run the draft's
torch path: its fused one-token step (`specasr.backends.cpu.fused`) serves reduced rows only and
rounds differently, so it is off here.
"""

from __future__ import annotations

import statistics

import click

from specasr.options import TranscribeOptions

PATHS = {"full rows": False, "reduced rows": True}  # name -> DistilledDraft.reduce_rows


def configurations() -> dict[str, TranscribeOptions]:
    return {
        "sequential": TranscribeOptions().with_decode(mode="exact"),
        "chunked": TranscribeOptions(strategy="chunked").with_decode(mode="exact"),
    }


def run_rounds(pair, samples, repeats: int) -> tuple[dict, bool]:
    """(config, path) -> decoder seconds per round; and whether every run of a configuration
    made the same passes (tokens, draft steps, target calls)."""
    from specasr.constants import SAMPLE_RATE
    from specasr.transcription import transcribe

    times: dict[tuple[str, str], list[float]] = {}
    seen: dict[str, set] = {}
    fused, pair.draft.fused = getattr(pair.draft, "fused", None), None  # both arms on the torch path
    try:
        for rnd in range(repeats + 1):  # round 0 warms up
            for config, opts in configurations().items():
                for path, reduce in PATHS.items():
                    pair.draft.reduce_rows = reduce
                    segments, info = transcribe(samples, pair, opts, source_rate=SAMPLE_RATE)
                    tokens = str([s.tokens for s in segments])  # decodes: the stats are final after
                    st = info.stats
                    seen.setdefault(config, set()).add((tokens, st.draft_calls, st.target_calls))
                    if rnd:
                        times.setdefault((config, path), []).append(st.decoder_s)
    finally:
        pair.draft.reduce_rows = True
        pair.draft.fused = fused
    return times, all(len(v) == 1 for v in seen.values())


def table(times: dict) -> str:
    lines = [
        "| strategy (exact) | decoder s, full rows | decoder s, reduced rows | full ÷ reduced, paired median "
        "| lowest – highest pair |",
        "|---|---|---|---|---|",
    ]
    for config in configurations():
        full, reduced = times[(config, "full rows")], times[(config, "reduced rows")]
        ratios = sorted(a / b for a, b in zip(full, reduced))
        lines.append(
            f"| {config} | {statistics.median(full):.3f} | {statistics.median(reduced):.3f} "
            f"| {statistics.median(ratios):.3f}× | {ratios[0]:.3f}× – {ratios[-1]:.3f}× |"
        )
    return "\n".join(lines)


@click.command()
@click.option("--model", default="base", show_default=True)
@click.option("--draft", default="default", show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=8, show_default=True)
@click.option(
    "--data", type=click.Path(exists=True, file_okay=False), default="tests/data", show_default=True
)
def main(model: str, draft: str, repeats: int, data: str) -> None:
    from benchmarks.longform import long_recording
    from specasr.constants import SAMPLE_RATE
    from specasr.models.loading import load_pair

    rec = long_recording(data)
    pair = load_pair(model, draft)
    if getattr(pair.draft, "reduced_vocab", None) is None:
        raise click.UsageError(f"draft {draft!r} has no reduced vocabulary: there is nothing to compare")
    times, same = run_rounds(pair, rec.samples, repeats)
    click.echo(
        f"{model} + {draft}, {len(rec.samples) / SAMPLE_RATE:.1f} s long-form fixture, {repeats} rounds; "
        f"same passes and tokens on both paths: {'yes' if same else 'NO'}\n"
    )
    click.echo(table(times))


if __name__ == "__main__":
    main()
