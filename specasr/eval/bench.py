"""Speculative vs autoregressive decoding, side by side in one process: `specasr bench`.

Both run on the same audio and models, interleaved and repeated, so machine noise hits
both alike; we report medians and ratios. The theoretical speedup uses the measured α̂ and
cost ratio c = (draft step time) / (target single-token step time):

    S_theory = (1 − α^(γ+1)) / ((1 − α)(γc + 1))

The part of the benchmarks that ships with the package (the CLI's `bench` runs from a wheel);
the lab in the checkout's `benchmarks/` (`python -m benchmarks.speedup` ...) builds on it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace

from specasr.decode.gamma import theoretical_speedup
from specasr.decode.loop import decode
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
    alpha: float  # accepted / proposed over all speculative runs
    token_alpha: float  # per-token α̂ = accepted / (accepted + rejected): the formula's α
    tokens_per_call: float  # mean tokens per target pass (speculative)
    mean_gamma: float
    c: float  # draft step time / target single-token step time (medians)
    identical: bool  # speculative tokens == autoregressive tokens on every file and repeat
    verify_ms: float  # median verifier time per verify pass, milliseconds

    @property
    def decoder_speedup(self) -> float:
        return self.ar_decoder_s / self.spec_decoder_s

    @property
    def total_speedup(self) -> float:
        return self.ar_total_s / self.spec_total_s

    @property
    def theoretical(self) -> float:
        return theoretical_speedup(self.token_alpha, round(self.mean_gamma), self.c)

    @property
    def of_theoretical(self) -> float:
        """Achieved decoder-phase speedup ÷ theoretical."""
        return self.decoder_speedup / self.theoretical

    def table(self) -> str:
        rows = [
            ("files × repeats", f"{self.files} × {self.repeats}"),
            ("decoder time, autoregressive (median, s)", f"{self.ar_decoder_s:.3f}"),
            ("decoder time, speculative (median, s)", f"{self.spec_decoder_s:.3f}"),
            ("decoder-phase speedup", f"{self.decoder_speedup:.2f}×"),
            ("end-to-end speedup (encoder + decoder)", f"{self.total_speedup:.2f}×"),
            ("α̂ per token (accepted / (accepted + rejected))", f"{self.token_alpha:.3f}"),
            ("accepted / proposed", f"{self.alpha:.3f}"),
            ("tokens per target call", f"{self.tokens_per_call:.2f}"),
            ("mean γ", f"{self.mean_gamma:.2f}"),
            ("verifier time per call (median, ms)", f"{self.verify_ms:.3f}"),
            ("cost ratio c (draft step / target step)", f"{self.c:.3f}"),
            ("theoretical speedup (1-α^(γ+1))/((1-α)(γc+1))", f"{self.theoretical:.2f}×"),
            ("achieved ÷ theoretical", f"{self.of_theoretical:.2f}"),
            ("tokens identical to autoregressive", "yes" if self.identical else "no"),
        ]
        return "| metric | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)


def file_mels(pair, files: list) -> list:
    """One log-Mel window [1, n_mels, 3000] per audio file (each at most 30 s)."""
    from specasr.audio import load_audio  # audio I/O only where files are read
    from specasr.features import log_mel_window

    return [log_mel_window(load_audio(f), n_mels=pair.n_mels, device=pair.device) for f in files]


def run_bench(pair, mels: list, options: DecodeOptions, repeats: int = 3, warmup: int = 1) -> BenchReport:
    """Interleaves autoregressive and `options` decoding on each window, `repeats` times."""
    options = replace(options, timing=True)  # the report needs the phase times
    ar_opts = replace(options, mode="autoregressive")
    for mel in mels[:warmup]:
        decode(pair, mel, ar_opts)
        decode(pair, mel, options)
    ar_dec, sp_dec, ar_tot, sp_tot = [], [], [], []
    ar_step, draft_step, verify_call = [], [], []
    spec_all = DecodeStats()
    identical = True
    for _ in range(repeats):
        sums = [0.0, 0.0, 0.0, 0.0]
        for mel in mels:
            ar = decode(pair, mel, ar_opts)[0]
            sp = decode(pair, mel, options)[0]
            identical &= ar.tokens == sp.tokens
            sums[0] += ar.stats.decoder_s
            sums[1] += sp.stats.decoder_s
            sums[2] += ar.stats.decoder_s + ar.stats.encoder_s
            sums[3] += sp.stats.decoder_s + sp.stats.encoder_s
            ar_step.append(ar.stats.target_s / ar.stats.target_calls)
            if sp.stats.draft_calls:
                draft_step.append(sp.stats.draft_s / sp.stats.draft_calls)
                verify_call.append(sp.stats.verify_s / sp.stats.target_calls)
            spec_all = spec_all.merge(sp.stats)
        for acc, v in zip((ar_dec, sp_dec, ar_tot, sp_tot), sums):
            acc.append(v)
    gammas = spec_all.gammas or [0]
    return BenchReport(
        files=len(mels),
        repeats=repeats,
        ar_decoder_s=statistics.median(ar_dec),
        spec_decoder_s=statistics.median(sp_dec),
        ar_total_s=statistics.median(ar_tot),
        spec_total_s=statistics.median(sp_tot),
        alpha=spec_all.acceptance_rate,
        token_alpha=spec_all.token_acceptance,
        tokens_per_call=spec_all.tokens_per_target_call,
        mean_gamma=sum(gammas) / len(gammas),
        c=statistics.median(draft_step) / statistics.median(ar_step) if draft_step else 0.0,
        identical=identical,
        verify_ms=1e3 * statistics.median(verify_call) if verify_call else 0.0,
    )


def logit_pairs(pair, mels: list, options: DecodeOptions) -> dict:
    """Filtered target and draft logits at every position of each window's greedy transcript:
    {"target": [N, V], "draft": [N, V]}, the input of `python -m specasr.kernels.bench
    --sigmoid-study --logits FILE`."""
    import torch

    from specasr.decode.filters import apply_filters, build_filters
    from specasr.decode.runners import make_runner
    from specasr.decode.task import start_sequence

    ar_opts = replace(options, mode="autoregressive", temperature=0.0)
    rows = {"target": [], "draft": []}
    for mel in mels:
        result = decode(pair, mel, ar_opts)[0]
        init, _ = start_sequence(pair, ar_opts, result.language, None)
        seq = init + result.tokens + [pair.tokenizer.eot]
        filters = build_filters(
            pair.tokenizer,
            vocab_size=pair.vocab_size,
            sample_begin=len(init),
            suppress_tokens=pair.suppress_tokens,
            begin_suppress_tokens=pair.begin_suppress_tokens,
            suppress_blank=True,
            timestamps=False,
        )
        contexts = [seq[:i] for i in range(len(init), len(seq))]
        target_states, draft_states = pair.encode(mel)
        with torch.inference_mode():
            for name, model, states in (
                ("target", pair.target, target_states),
                ("draft", pair.draft, draft_states),
            ):
                logits = make_runner(model, states)(
                    torch.tensor([seq[:-1]], device=pair.device), len(contexts)
                )
                logits = logits[0].float().contiguous()  # [N, V]
                apply_filters(filters, logits, contexts)
                rows[name].append(logits.cpu())
    return {k: torch.cat(v) for k, v in rows.items()}
