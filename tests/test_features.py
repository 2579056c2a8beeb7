import numpy as np
import pytest
import torch
from transformers import WhisperFeatureExtractor

from specasr.audio import load_audio
from specasr.constants import HOP_LENGTH, N_FRAMES, N_SAMPLES, SAMPLE_RATE
from specasr.features import N_FFT, log_mel, log_mel_window, mel_filters, pad_or_trim


@pytest.fixture(scope="module")
def waves(librivox):
    return [load_audio(c.path) for c in librivox]


@pytest.mark.parametrize("n_mels", [80, 128])
def test_matches_whisper_feature_extractor(waves, n_mels):
    extractor = WhisperFeatureExtractor(feature_size=n_mels)
    worst = worst_f64 = 0.0
    for wave in waves:
        ref = extractor(wave, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
        ours = log_mel_window(wave, n_mels)
        assert ours.shape == ref.shape == (1, n_mels, N_FRAMES) and ours.dtype == torch.float32
        worst = max(worst, (ours - ref).abs().max().item())
        # HF's numpy float64 path: an STFT independent of torch's
        padded = pad_or_trim(wave)[None].astype(np.float64)
        ref64 = extractor._np_extract_fbank_features(padded, "cpu")
        worst_f64 = max(worst_f64, float(np.abs(ours.numpy() - ref64).max()))
    print(f"n_mels={n_mels}: max |diff| vs extractor {worst:.3g}, vs its float64 path {worst_f64:.3g}")
    assert worst <= 1e-3, f"n_mels={n_mels}: max abs diff {worst:.3g} > 1e-3"
    assert worst_f64 <= 1e-3, f"n_mels={n_mels}: max abs diff vs float64 {worst_f64:.3g} > 1e-3"


@pytest.mark.parametrize("n_mels", [80, 128])
def test_filters_match_librosa_slaney(n_mels):
    ref = WhisperFeatureExtractor(feature_size=n_mels).mel_filters.T  # [n_mels, n_bins]
    ours = mel_filters(n_mels)
    assert ours.shape == (n_mels, N_FFT // 2 + 1) and ours.dtype == torch.float32
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-5, atol=1e-8)


def test_filters_cached():
    assert mel_filters(80) is mel_filters(80)
    assert mel_filters(80, "cpu") is mel_filters(80, torch.device("cpu"))
    assert mel_filters(128) is not mel_filters(80)


def test_batched_floor_is_per_row(waves):
    loud, quiet = waves[0], waves[1] * 0.001  # the quiet row sits 6 decades lower
    n = len(loud) + SAMPLE_RATE  # trailing silence makes each row reach its floor
    rows = [pad_or_trim(w, n) for w in (loud, quiet)]
    batched = log_mel(np.stack(rows))
    assert batched.shape == (2, 80, n // HOP_LENGTH)
    for i, row in enumerate(rows):
        torch.testing.assert_close(batched[i : i + 1], log_mel(row), atol=1e-5, rtol=0)
    loud_mel, quiet_mel = batched
    # loud: floored at its own max - 8 (log10), i.e. 2 after the /4 scaling
    assert loud_mel.max() - loud_mel.min() == pytest.approx(2.0, abs=1e-5)
    # quiet: its peak is < 8 decades above the 1e-10 clamp, so nothing of it is floored;
    # a floor from the batch-wide max would lift its silence to loud's floor instead
    assert quiet_mel.min().item() == pytest.approx((-10 + 4) / 4, abs=1e-6)


def test_window_pads_and_trims(waves):
    long = np.concatenate(waves * 3)
    assert len(long) > N_SAMPLES
    out = log_mel_window(torch.from_numpy(np.stack([long, long[::-1].copy()])))
    assert out.shape == (2, 80, N_FRAMES)
    torch.testing.assert_close(out[:1], log_mel(long[:N_SAMPLES]))
    assert not torch.equal(out[0], out[1])


def test_padding_appends_silence(waves):
    wave = waves[1]
    torch.testing.assert_close(log_mel(wave, padding=N_SAMPLES), log_mel(np.pad(wave, (0, N_SAMPLES))))
    assert log_mel(wave, padding=N_SAMPLES).shape[-1] == (len(wave) + N_SAMPLES) // HOP_LENGTH


def test_pad_or_trim_numpy_and_torch():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert pad_or_trim(x, 6).tolist() == [r + [0.0, 0.0] for r in x.tolist()]
    assert pad_or_trim(x, 2, axis=0).tolist() == x[:2].tolist()
    t = torch.from_numpy(x)
    assert torch.equal(pad_or_trim(t, 6), torch.from_numpy(pad_or_trim(x, 6)))
    assert torch.equal(pad_or_trim(t, 5, axis=0), torch.from_numpy(pad_or_trim(x, 5, axis=0)))
    assert pad_or_trim(t, 3).shape == (3, 3)


@pytest.mark.parametrize("most", [700, 2500, None])
def test_a_long_recordings_spectrum_in_slices_is_bitwise_the_whole_ones(most):
    """`_mel_power` slices the STFT (equal slices of at most `most` frames, default MEL_SLICE)
    so a long recording's complex spectrum is never whole in memory; every value is the one
    `torch.stft(center=True)` over the whole recording gives, for a batch too."""
    from specasr.features import _mel_power

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 95 * SAMPLE_RATE + 123, generator=g) * 0.1  # 9500 frames: 14, 4 or 1 slices
    window = torch.hann_window(N_FFT, periodic=True)
    whole = torch.stft(
        x, N_FFT, HOP_LENGTH, window=window, center=True, pad_mode="reflect", return_complex=True
    )
    want = mel_filters(80) @ whole[..., :-1].abs().square()  # [2, 80, 9500]
    got = _mel_power(x, 80, most)
    assert got.shape == want.shape == (2, 80, 9500)
    assert torch.equal(got, want)
