"""Speculative vs autoregressive decoding, side by side in one process.

Both run on the same audio and models, interleaved and repeated, so machine noise hits
both alike; we report medians and ratios. The theoretical speedup uses the measured α̂ and
cost ratio c = (draft step time) / (target single-token step time):

    S_theory = (1 − α^(γ+1)) / ((1 − α)(γc + 1))
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from specasr.audio import load_audio
from specasr.decoding import decode
from specasr.features import log_mel_window
from specasr.gamma import theoretical_speedup
from specasr.options import DecodeOptions
from specasr.stats import DecodeStats


@dataclass
class BenchReport:
    files: int
    repeats: int
    ar_decoder_s: float  # median over repeats of the summed decoder-loop time, target only
    spec_decoder_s: float  # the same for speculative decoding
    ar_total_s: float  # median of encoder + decoder time, target only
    spec_total_s: float
    alpha: float  # α̂ over all speculative runs
    tokens_per_call: float  # mean tokens per target pass (speculative)
    mean_gamma: float
    c: float  # draft step time / target single-token step time (medians)
    identical: bool  # speculative tokens == autoregressive tokens on every file and repeat

    @property
    def decoder_speedup(self) -> float:
        return self.ar_decoder_s / self.spec_decoder_s

    @property
    def total_speedup(self) -> float:
        return self.ar_total_s / self.spec_total_s

    @property
    def theoretical(self) -> float:
        return theoretical_speedup(self.alpha, round(self.mean_gamma), self.c)

    def table(self) -> str:
        rows = [
            ("files × repeats", f"{self.files} × {self.repeats}"),
            ("decoder time, autoregressive (median, s)", f"{self.ar_decoder_s:.3f}"),
            ("decoder time, speculative (median, s)", f"{self.spec_decoder_s:.3f}"),
            ("decoder-phase speedup", f"{self.decoder_speedup:.2f}×"),
            ("end-to-end speedup (encoder + decoder)", f"{self.total_speedup:.2f}×"),
            ("α̂ (accepted / proposed)", f"{self.alpha:.3f}"),
            ("tokens per target call", f"{self.tokens_per_call:.2f}"),
            ("mean γ", f"{self.mean_gamma:.2f}"),
            ("cost ratio c (draft step / target step)", f"{self.c:.3f}"),
            ("theoretical speedup (1-α^(γ+1))/((1-α)(γc+1))", f"{self.theoretical:.2f}×"),
            ("achieved ÷ theoretical", f"{self.decoder_speedup / self.theoretical:.2f}"),
            ("T=0 tokens identical", "yes" if self.identical else "NO"),
        ]
        return "| metric | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def run_bench(pair, files: list, options: DecodeOptions, repeats: int = 3, warmup: int = 1) -> BenchReport:
    """Interleaves autoregressive and `options` decoding on each file, `repeats` times."""
    mels = [log_mel_window(load_audio(f), n_mels=pair.n_mels, device=pair.device) for f in files]
    ar_opts = replace(options, mode="autoregressive")
    for mel in mels[:warmup]:
        decode(pair, mel, ar_opts)
        decode(pair, mel, options)
    ar_dec, sp_dec, ar_tot, sp_tot = [], [], [], []
    ar_step, draft_step = [], []
    spec_all = DecodeStats()
    identical = True
    for _ in range(repeats):
        sums = [0.0, 0.0, 0.0, 0.0]
        for mel in mels:
            ar = decode(pair, mel, ar_opts)[0]
            sp = decode(pair, mel, options)[0]
            identical &= ar.tokens == sp.tokens or options.temperature > 0
            sums[0] += ar.stats.decoder_s
            sums[1] += sp.stats.decoder_s
            sums[2] += ar.stats.decoder_s + ar.stats.encoder_s
            sums[3] += sp.stats.decoder_s + sp.stats.encoder_s
            ar_step.append(ar.stats.target_s / ar.stats.target_calls)
            if sp.stats.draft_calls:
                draft_step.append(sp.stats.draft_s / sp.stats.draft_calls)
            spec_all = spec_all.merge(sp.stats)
        for acc, v in zip((ar_dec, sp_dec, ar_tot, sp_tot), sums):
            acc.append(v)
    gammas = spec_all.gammas or [0]
    return BenchReport(
        files=len(files),
        repeats=repeats,
        ar_decoder_s=statistics.median(ar_dec),
        spec_decoder_s=statistics.median(sp_dec),
        ar_total_s=statistics.median(ar_tot),
        spec_total_s=statistics.median(sp_tot),
        alpha=spec_all.acceptance_rate,
        tokens_per_call=spec_all.tokens_per_target_call,
        mean_gamma=sum(gammas) / len(gammas),
        c=statistics.median(draft_step) / statistics.median(ar_step) if draft_step else 0.0,
        identical=identical,
    )
