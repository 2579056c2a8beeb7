"""`specasr bench`'s report (specasr/eval/bench.py, in the package): its derived ratios."""

from __future__ import annotations

import pytest

from specasr.decode.gamma import theoretical_speedup
from specasr.eval.bench import BenchReport


def test_bench_report_ratios():
    report = BenchReport(
        files=2,
        repeats=3,
        ar_decoder_s=6.0,
        spec_decoder_s=3.0,
        ar_total_s=8.0,
        spec_total_s=5.0,
        alpha=0.7,
        token_alpha=0.8,
        tokens_per_call=2.5,
        mean_gamma=3.6,
        c=0.2,
        identical=True,
        verify_ms=0.5,
    )
    assert report.decoder_speedup == 2.0 and report.total_speedup == pytest.approx(1.6)
    theory = theoretical_speedup(0.8, 4, 0.2)  # γ: the mean, rounded
    assert report.theoretical == pytest.approx(theory)
    assert report.of_theoretical == pytest.approx(2.0 / theory)
