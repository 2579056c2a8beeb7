"""Voice activity detection with Silero VAD (v6, 16 kHz), and the time map back to the audio.

`detect_speech` finds the speech chunks of a recording; `SpeechMap` joins them into the audio
that is decoded and maps segment (and word) times from that audio back to the recording.

The network is Silero's, with the weights of the TorchScript model that the `silero-vad`
package ships (`silero_vad/data/silero_vad.jit`, read with torch.jit.load), written out here in
plain torch rather than run through `import silero_vad`: importing that package calls
torch.set_num_threads(1) for the whole process (the decoder would then run on one thread), its
optional audio helpers pull torchaudio (whose PyPI wheel wants a CUDA torch), and its ONNX path
needs onnxruntime. The network is small: per 32 ms chunk (512 samples plus the 64 before them),
an STFT as a strided convolution, four convolutions, an LSTM cell carried from chunk to chunk,
and a sigmoid head. All chunks' convolutions run as one batch; only the LSTM is sequential.
tests/test_vad.py checks it against the package's own TorchScript model.
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specasr.constants import HOP_LENGTH, SAMPLE_RATE
from specasr.options import VadOptions
from specasr.results import Segment

CHUNK = 512  # samples per speech probability (32 ms)
CONTEXT = 64  # samples of the previous chunk each chunk sees
WEIGHTS = "silero_vad/data/silero_vad.jit"  # inside the silero-vad distribution
LSTM_PARAMETERS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
BLOCK = 8192  # chunks per batched convolution pass (bounds memory on long recordings)


class SileroVad(nn.Module):
    """Silero VAD v6 at 16 kHz: samples -> P(speech) per 512-sample chunk."""

    def __init__(self) -> None:
        super().__init__()
        self.stft = nn.Conv1d(1, 258, 256, stride=128, bias=False)  # real and imaginary parts, 129 bins
        self.encoder = nn.Sequential(
            nn.Conv1d(129, 128, 3, padding=1),
            nn.ReLU(),
            nn.Conv1d(128, 64, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(64, 64, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(64, 128, 3, padding=1),
            nn.ReLU(),
        )
        self.lstm = nn.LSTM(128, 128, batch_first=True)
        self.head = nn.Conv1d(128, 1, 1)

    @torch.inference_mode()
    def forward(self, samples: Tensor) -> Tensor:
        """samples: [n] float32 mono 16 kHz -> [ceil(n / 512)] speech probabilities."""
        n_chunks = -(-samples.shape[0] // CHUNK)
        x = F.pad(samples.float(), (0, n_chunks * CHUNK - samples.shape[0])).view(n_chunks, CHUNK)
        context = torch.cat([x.new_zeros(1, CONTEXT), x[:-1, -CONTEXT:]])  # [chunks, 64]
        x = torch.cat([context, x], dim=1)  # [chunks, 576]
        features = torch.cat([self._features(x[i : i + BLOCK]) for i in range(0, n_chunks, BLOCK)])
        h, _ = self.lstm(features[None])  # [1, chunks, 128]: the state runs on from chunk to chunk
        return torch.sigmoid(self.head(F.relu(h[0])[..., None])).flatten()  # [chunks]

    def _features(self, x: Tensor) -> Tensor:
        """x: [chunks, 576] -> [chunks, 128]."""
        x = F.pad(x[:, None], (0, CONTEXT), mode="reflect")  # [chunks, 1, 640]
        spec = self.stft(x)  # [chunks, 258, 4]
        magnitude = torch.sqrt(spec[:, :129] ** 2 + spec[:, 129:] ** 2)  # [chunks, 129, 4]
        return self.encoder(magnitude).squeeze(-1)  # [chunks, 128, 1] -> [chunks, 128]


def weights_path() -> str:
    """Silero's TorchScript model inside the installed silero-vad package (found without importing
    the package). Its 16 kHz network is the one used here; the package's safetensors file holds
    other weights."""
    from importlib import metadata

    try:
        dist = metadata.distribution("silero-vad")
    except metadata.PackageNotFoundError as e:
        raise RuntimeError(
            "voice activity detection needs the silero-vad package: pip install 'specasr[vad]'"
        ) from e
    path = dist.locate_file(WEIGHTS)
    if not path.is_file():
        raise RuntimeError(f"silero-vad {dist.version} has no {WEIGHTS}; install silero-vad>=6.2")
    return str(path)


@lru_cache(maxsize=1)
def load_vad() -> SileroVad:
    with warnings.catch_warnings():  # torch >= 2.11 marks torch.jit.load deprecated; it still loads
        warnings.simplefilter("ignore", DeprecationWarning)
        w = torch.jit.load(weights_path(), map_location="cpu")._model.state_dict()  # the 16 kHz network
    model = SileroVad()
    model.load_state_dict(
        {
            "stft.weight": w["stft.forward_basis_buffer"],
            **{
                f"encoder.{2 * i}.{p}": w[f"encoder.{i}.reparam_conv.{p}"]
                for i in range(4)
                for p in ("weight", "bias")
            },
            **{
                f"lstm.{p}_l0": w[f"decoder.rnn.{p}"]
                for p in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
            },
            "head.weight": w["decoder.decoder.2.weight"],
            "head.bias": w["decoder.decoder.2.bias"],
        }
    )
    return model.eval()


def speech_probabilities(samples: np.ndarray) -> np.ndarray:
    """samples: float32 [n] mono 16 kHz -> P(speech) per 32 ms chunk, [ceil(n / 512)]."""
    return load_vad()(torch.from_numpy(np.ascontiguousarray(samples, np.float32))).numpy()


def speech_chunks(probs: np.ndarray, n_samples: int, options: VadOptions) -> list[tuple[int, int]]:
    """Speech probabilities per chunk -> [(start, end)] samples of speech, padded and merged.

    Speech starts at a chunk with P >= threshold and ends once P stays below neg_threshold for
    min_silence s (hysteresis: a dip between words does not end it); chunks shorter than
    min_speech s are dropped; each is widened by speech_pad s, and chunks that then touch merge.
    """
    low = options.end_threshold
    min_silence = options.min_silence * SAMPLE_RATE / CHUNK  # in chunks
    found, start, quiet_from = [], None, None
    for i, p in enumerate(probs):
        if start is None:
            if p >= options.threshold:
                start, quiet_from = i, None
        elif p >= options.threshold:
            quiet_from = None
        elif p < low:
            quiet_from = i if quiet_from is None else quiet_from
            if i + 1 - quiet_from >= min_silence:
                found.append((start, quiet_from))
                start, quiet_from = None, None
    if start is not None:
        found.append((start, len(probs) if quiet_from is None else quiet_from))
    pad = round(options.speech_pad * SAMPLE_RATE)
    out: list[tuple[int, int]] = []
    for a, b in found:
        if (b - a) * CHUNK < options.min_speech * SAMPLE_RATE:
            continue
        a, b = max(0, a * CHUNK - pad), min(n_samples, b * CHUNK + pad)
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


@dataclass(frozen=True)
class SpeechMap:
    """The speech chunks of a recording, joined end to end into the audio that is decoded."""

    chunks: list[tuple[int, int]]  # (start, end) samples of each chunk in the recording

    @property
    def starts(self) -> list[int]:
        """Where each chunk starts in the joined audio (samples)."""
        return list(np.cumsum([0] + [b - a for a, b in self.chunks[:-1]]))

    def collect(self, samples: np.ndarray) -> np.ndarray:
        """samples [n] -> the speech chunks, joined: float32 [sum of chunk lengths]."""
        if not self.chunks:
            return np.zeros(0, np.float32)
        return np.concatenate([samples[a:b] for a, b in self.chunks]).astype(np.float32, copy=False)

    def joins(self) -> list[int]:
        """Log-Mel frames of the joined audio where one chunk ends and the next begins."""
        return [s // HOP_LENGTH for s in self.starts[1:]]

    def to_original(self, t: float, end: bool = False) -> float:
        """Seconds in the joined audio -> seconds in the recording. A time exactly on a join is
        the end of the chunk before it when `end`, else the start of the chunk after it."""
        sample = t * SAMPLE_RATE
        starts = self.starts
        k = (bisect.bisect_left if end else bisect.bisect_right)(starts, sample) - 1
        k = min(max(k, 0), len(self.chunks) - 1)
        a, b = self.chunks[k]
        return min(a + sample - starts[k], b) / SAMPLE_RATE

    def restore(self, segments: Iterator[Segment]) -> Iterator[Segment]:
        """Segments timed on the joined audio -> the same, timed on the recording."""
        for seg in segments:
            start = self.to_original(seg.start)
            seg = replace(seg, start=start, end=max(start, self.to_original(seg.end, end=True)))
            if getattr(seg, "words", None):
                seg = replace(seg, words=[self._word(w) for w in seg.words])
            yield seg

    def _word(self, word):
        start = self.to_original(word.start)
        return replace(word, start=start, end=max(start, self.to_original(word.end, end=True)))


def detect_speech(samples: np.ndarray, options: VadOptions) -> SpeechMap:
    """samples: float32 [n] mono 16 kHz -> the map of its speech chunks."""
    if samples.size == 0:
        return SpeechMap([])
    return SpeechMap(speech_chunks(speech_probabilities(samples), samples.size, options))
