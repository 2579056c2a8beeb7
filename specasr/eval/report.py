"""Reports of an eval run: summary.json, a markdown table like the paper's Table 1, and a plot
of verifier time per decoding step against γ like its Fig. 3b.

Δ% columns compare a mode's total with the `baseline` verifier's: (mode − baseline) / baseline.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from specasr.eval.metric import wer_normalized
from specasr.writers import write_atomic

SUMMARY, TABLE, PLOT = "summary.json", "table.md", "verify_vs_gamma.png"


def _mode_summary(records: list[dict]) -> dict:
    ok = [r for r in records if r["error"] is None]
    scored = [r for r in ok if r["reference_norm"].strip()]
    out = {
        "decoded": len(ok),
        "failed": len(records) - len(ok),
        "dropped_empty_reference": len(ok) - len(scored),
    }
    if scored:
        w, n, words = wer_normalized(
            [r["reference_norm"] for r in scored], [r["hypothesis_norm"] for r in scored]
        )
        out |= {"wer": w, "utterances": n, "words": words}
    else:
        out |= {"wer": None, "utterances": 0, "words": 0}
    stats = [r["stats"] for r in ok if r["stats"] is not None]
    total = {
        k: sum(s[k] for s in stats) for k in ("verify_s", "proposed", "accepted", "emitted", "row_steps")
    }
    total |= {k: sum(s[k] for s in stats) for k in ("target_calls", "draft_calls", "encoder_s", "decoder_s")}
    audio_s = sum(r["duration"] for r in ok)
    wall_s = sum(r["wall_s"] for r in ok)
    out |= {
        "audio_s": audio_s,
        "wall_s": wall_s,
        "verify_s": total["verify_s"],
        "verify_passes": sum(len(s["verify_times"]) for s in stats),
        "acceptance_rate": total["accepted"] / total["proposed"] if total["proposed"] else None,
        "tokens_per_target_call": total["emitted"] / total["row_steps"] if total["row_steps"] else None,
        "rtf": wall_s / audio_s if audio_s else None,
        "totals": total,
    }
    return out


def _delta(x: float | None, ref: float | None) -> float | None:
    return None if x is None or not ref else 100 * (x - ref) / ref


def summarize(config: dict, records: list[dict]) -> dict:
    """Per-mode metrics of the records; Δ% against `baseline` where it was run."""
    modes = {m: _mode_summary([r for r in records if r["mode"] == m]) for m in config["modes"]}
    base = modes.get("baseline")
    for s in modes.values():
        speculative = s["verify_passes"] > 0
        s["verify_delta_pct"] = _delta(s["verify_s"], base and base["verify_s"]) if speculative else None
        s["wall_delta_pct"] = _delta(s["wall_s"], base and base["wall_s"])
    return {"config": config, "utterances": len({r["id"] for r in records}), "modes": modes}


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "—" if x is None else f"{x:{spec}}{suffix}"


def table(summary: dict) -> str:
    """Markdown: rows = modes; WER, Δ% verifier time and wall clock vs baseline, α̂, tokens/call, RTF."""
    c = summary["config"]
    d = c["decode"]
    lines = [
        f"{c.get('dataset', '?')}: model {c.get('model', '?')}, draft {c.get('draft', '?')}, "
        f"T = {d['temperature']}, γ {d['gamma']} ({d['gamma_policy']}), batch {c['batch_size']}, "
        f"max tokens {d['max_new_tokens'] or 'to the 448-token context'}, device {c.get('device', '?')}",
        "",
        "| mode | WER (%) | utts | words | verifier time (s) | Δ% verifier | wall (s) | Δ% wall "
        "| α̂ | tokens / target call | RTF | failed |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, s in summary["modes"].items():
        wer = None if s["wer"] is None else 100 * s["wer"]
        verify = s["verify_s"] if s["verify_passes"] else None
        lines.append(
            f"| {mode} | {_fmt(wer, '.2f')} | {s['utterances']} | {s['words']} | {_fmt(verify, '.4f')} "
            f"| {_fmt(s['verify_delta_pct'], '+.1f', '%')} | {_fmt(s['wall_s'], '.2f')} "
            f"| {_fmt(s['wall_delta_pct'], '+.1f', '%')} | {_fmt(s['acceptance_rate'], '.3f')} "
            f"| {_fmt(s['tokens_per_target_call'], '.2f')} | {_fmt(s['rtf'], '.3f')} | {s['failed']} |"
        )
    return "\n".join(lines) + "\n"


def verify_by_gamma(records: list[dict]) -> dict[str, dict[int, list[float]]]:
    """mode -> γ -> verifier seconds of each verify pass run with that γ."""
    out: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        s = r["stats"]
        if r["error"] is None and s is not None:
            for g, t in zip(s["gammas"], s["verify_times"]):
                out[r["mode"]][g].append(t)
    return out


def plot(records: list[dict], path: Path, title: str) -> bool:
    """Mean verifier time per decoding step against γ, one line per mode; False without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(5, 3.5))
    data = verify_by_gamma(records)
    for mode, by_gamma in sorted(data.items()):
        gammas = sorted(by_gamma)
        ax.plot(gammas, [1e3 * sum(by_gamma[g]) / len(by_gamma[g]) for g in gammas], marker="o", label=mode)
    if not data:
        ax.text(0.5, 0.5, "no speculative decoding steps", ha="center", transform=ax.transAxes)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_xlabel("γ (draft tokens per step)")
    ax.set_ylabel("verifier time per step (ms)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if data:
        ax.legend()
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return True


def write_reports(output_dir: str | Path, config: dict, records: list[dict]) -> dict:
    """Writes summary.json, table.md and the plot (atomically); returns the summary."""
    out = Path(output_dir)
    summary = summarize(config, records)
    write_atomic(out / SUMMARY, json.dumps(summary, indent=1, ensure_ascii=False) + "\n")
    write_atomic(out / TABLE, table(summary))
    summary["plot"] = plot(records, out / PLOT, f"{config.get('dataset', '')} {config.get('model', '')}")
    return summary
