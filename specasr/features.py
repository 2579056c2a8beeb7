"""Whisper's log-Mel spectrogram in torch.

STFT (periodic Hann, n_fft 400, hop 160, centred with reflect padding) -> power -> drop the
last frame -> slaney mel filterbank -> log10 -> floor at (max - 8) per example -> (x + 4) / 4.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.nn.functional as F

from specasr.constants import HOP_LENGTH, N_SAMPLES, SAMPLE_RATE

N_FFT = 400

_F_SP = 200.0 / 3  # slaney scale: linear below 1 kHz, 200/3 Hz per mel
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP  # 15 mels
_LOGSTEP = np.log(6.4) / 27.0  # log-spaced above 1 kHz: 27 mels per factor 6.4


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    log_part = _MIN_LOG_MEL + np.log(np.maximum(hz, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOGSTEP
    return np.where(hz >= _MIN_LOG_HZ, log_part, hz / _F_SP)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    log_part = _MIN_LOG_HZ * np.exp(_LOGSTEP * (mel - _MIN_LOG_MEL))
    return np.where(mel >= _MIN_LOG_MEL, log_part, mel * _F_SP)


@functools.cache
def _mel_filters_cpu(n_mels: int) -> torch.Tensor:
    """Slaney filterbank (librosa's htk=False, norm="slaney"), float32 [n_mels, N_FFT//2+1]."""
    fft_hz = np.linspace(0.0, SAMPLE_RATE / 2, N_FFT // 2 + 1)  # [n_bins]
    edges = np.linspace(_hz_to_mel(np.array(0.0)), _hz_to_mel(np.array(SAMPLE_RATE / 2.0)), n_mels + 2)
    edge_hz = _mel_to_hz(edges)  # [n_mels + 2]: left, centre, right of each triangle
    left, centre, right = edge_hz[:-2, None], edge_hz[1:-1, None], edge_hz[2:, None]
    rising = (fft_hz - left) / (centre - left)
    falling = (right - fft_hz) / (right - centre)
    weights = np.maximum(0.0, np.minimum(rising, falling))  # [n_mels, n_bins]
    weights *= 2.0 / (right - left)  # slaney norm: each triangle has unit area in Hz
    return torch.from_numpy(weights.astype(np.float32))


@functools.cache
def _mel_filters_on(n_mels: int, device: torch.device) -> torch.Tensor:
    return _mel_filters_cpu(n_mels).to(device)


def mel_filters(n_mels: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Cached slaney mel filterbank: Tensor float32, shape = (n_mels, N_FFT // 2 + 1)."""
    return _mel_filters_on(n_mels, torch.device(device if device is not None else "cpu"))


def pad_or_trim(x: np.ndarray | torch.Tensor, length: int = N_SAMPLES, axis: int = -1):
    """Zero-pad or cut ``x`` along ``axis`` to exactly ``length``; keeps the array type."""
    size = x.shape[axis]
    if isinstance(x, torch.Tensor):
        if size > length:
            return x.narrow(axis, 0, length)
        if size < length:
            moved = x.movedim(axis, -1)
            return F.pad(moved, (0, length - size)).movedim(-1, axis)
        return x
    if size > length:
        return np.take(x, np.arange(length), axis=axis)
    if size < length:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, length - size)
        return np.pad(x, widths)
    return x


def log_mel(
    audio: np.ndarray | torch.Tensor,
    n_mels: int = 80,
    *,
    padding: int = 0,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Whisper log-Mel spectrogram, float32.

    audio: shape = (n_samples,) or (batch, n_samples), 16 kHz.
    padding: zeros appended to each row before the STFT.
    device: where to compute; defaults to the tensor's device, or CPU for numpy input.
    Returns: Tensor, shape = (batch, n_mels, (n_samples + padding) // HOP_LENGTH); a 1-D
        input gives batch = 1. The (max - 8) floor is taken per example.
    """
    x = torch.as_tensor(audio)
    if device is not None:
        x = x.to(device)
    x = x.to(torch.float32)
    if x.ndim == 1:
        x = x[None]
    if x.ndim != 2:
        raise ValueError(f"audio must be [n_samples] or [batch, n_samples], got {tuple(x.shape)}")
    if padding > 0:
        x = F.pad(x, (0, padding))
    if x.shape[-1] <= N_FFT // 2:
        raise ValueError(f"need more than {N_FFT // 2} samples for a reflect-padded STFT")

    log_spec = _mel_power(x, n_mels).clamp_(min=1e-10).log10_()  # [batch, n_mels, n_frames]
    peak = log_spec.amax(dim=(1, 2), keepdim=True)  # [batch, 1, 1]
    log_spec = torch.maximum(log_spec, peak - 8.0)
    return log_spec.add_(4.0).div_(4.0)


MEL_SLICE = 30_000  # frames (5 min): a longer recording's spectrum is made in slices of at most this


def _mel_power(x: torch.Tensor, n_mels: int, most: int | None = None) -> torch.Tensor:
    """x [batch, n_samples] -> mel power [batch, n_mels, n_samples // HOP_LENGTH]: the STFT
    (Hann window, reflect-padded at both ends as `torch.stft(center=True)` pads) in equal
    slices of at most `most` frames (default MEL_SLICE), so the complex spectrum and its
    powers, five times the mel's size, exist for one slice only. A frame reads only its own
    samples, and slices of hundreds of frames take the filterbank product's usual kernel, so
    slicing changes no value (tested bitwise); equal slices leave no tiny last one."""
    pad = N_FFT // 2
    padded = F.pad(x[None], (pad, pad), mode="reflect")[0]  # [batch, n_samples + N_FFT]
    frames = x.shape[-1] // HOP_LENGTH
    size = -(-frames // -(-frames // (most or MEL_SLICE)))  # frames per slice, the slices equal
    window = torch.hann_window(N_FFT, periodic=True, device=x.device)
    filters = mel_filters(n_mels, x.device)  # [n_mels, n_bins]
    out = x.new_empty(x.shape[0], n_mels, frames)
    for a in range(0, frames, size):
        b = min(frames, a + size)
        piece = padded[:, a * HOP_LENGTH : (b - 1) * HOP_LENGTH + N_FFT]  # frames a … b - 1
        stft = torch.stft(piece, N_FFT, HOP_LENGTH, window=window, center=False, return_complex=True)
        out[:, :, a:b] = filters @ stft.abs().square()  # [batch, n_bins, b - a] -> [batch, n_mels, b - a]
    return out


def log_mel_window(
    audio: np.ndarray | torch.Tensor, n_mels: int = 80, device: torch.device | str | None = None
) -> torch.Tensor:
    """One 30 s decoder window: each row padded or trimmed to N_SAMPLES.

    audio: shape = (n_samples,) or (batch, n_samples), 16 kHz.
    Returns: Tensor float32, shape = (batch, n_mels, N_FRAMES).
    """
    return log_mel(pad_or_trim(audio, N_SAMPLES), n_mels, device=device)
