"""From audio to text.

`transcribe_clip` handles audio of up to one 30 s window. Long-form transcription (seeking
windows, timestamps, temperature fallback) is not implemented yet: longer audio is refused
with a clear error rather than silently cut.
"""

from __future__ import annotations

from specasr.audio import SAMPLE_RATE, load_audio
from specasr.decoding import DecodeResult, decode
from specasr.features import N_SAMPLES, log_mel_window
from specasr.options import DecodeOptions


class AudioTooLongError(ValueError):
    pass


def transcribe_clip(pair, audio, options: DecodeOptions, *, source_rate: int | None = None) -> DecodeResult:
    """audio: a path, bytes, or a float array (with `source_rate`) of at most 30 s."""
    samples = load_audio(audio, source_rate=source_rate)  # float32 mono 16 kHz
    if len(samples) > N_SAMPLES:
        raise AudioTooLongError(
            f"audio is {len(samples) / SAMPLE_RATE:.1f} s; clips of up to 30 s are supported "
            "(long-form transcription is not implemented yet)"
        )
    mel = log_mel_window(samples, n_mels=pair.n_mels, device=pair.device)  # [1, n_mels, 3000]
    return decode(pair, mel, options)[0]
