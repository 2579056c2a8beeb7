"""Voice activity detection with Silero VAD (v6, 16 kHz): where a recording holds speech.

`detect_speech` finds the speech chunks of a recording (optionally only inside given clips); the
`SpanMap` it returns (spans.py) joins them into the audio that is decoded and maps segment (and
word) times from that audio back to the recording. A chunk longer than
`VadOptions.max_speech_duration_s` is split, at its last pause when it has one (`speech_runs`).

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

import warnings
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specasr.constants import SAMPLE_RATE
from specasr.longform.spans import SpanMap
from specasr.options import VadOptions

CHUNK = 512  # samples per speech probability (32 ms)
CONTEXT = 64  # samples of the previous chunk each chunk sees
WEIGHTS = "silero_vad/data/silero_vad.jit"  # inside the silero-vad distribution
LSTM_PARAMETERS = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
BLOCK = 8192  # chunks per batched convolution pass (bounds memory on long recordings)
SPLIT_PAUSE = 0.098  # s: the shortest pause a chunk over its longest is split at (Silero's)


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


def speech_runs(probs: np.ndarray, options: VadOptions) -> list[tuple[int, int, bool]]:
    """Speech probabilities per chunk -> [(start, end, split)] chunk indices of speech, unpadded.

    Speech starts at a chunk with P >= threshold and ends once P stays below neg_threshold for
    min_silence s (hysteresis: a dip between words does not end it). A run that would outgrow
    max_speech_duration_s once padded is split as Silero's get_speech_timestamps does (its
    last-pause rule): at the start of its last pause of at least SPLIT_PAUSE s, the next run
    starting where speech came back (if it has), else hard, before the chunk that outgrows it.
    split: the run ends or starts at such a split.
    """
    high, low = options.threshold, options.end_threshold
    min_silence = options.min_silence * SAMPLE_RATE / CHUNK  # in chunks
    min_pause = SPLIT_PAUSE * SAMPLE_RATE / CHUNK  # in chunks
    longest = (options.max_speech_duration_s * SAMPLE_RATE - 2 * _pad(options)) / CHUNK  # in chunks
    runs: list[tuple[int, int, bool]] = []
    start = quiet_from = pause = resume = None  # chunk indices in the run (pause: its last pause)
    split = False  # the current run starts at a split
    for i, p in enumerate(probs):
        if start is None:
            if p >= high:
                start, quiet_from, pause, resume, split = i, None, None, None, False
            continue
        if p >= high:
            if quiet_from is not None and i - quiet_from >= min_pause:
                pause, resume = quiet_from, i
            quiet_from = None
        elif p < low:
            quiet_from = i if quiet_from is None else quiet_from
            if i + 1 - quiet_from >= min_silence:
                runs.append((start, quiet_from, split))
                start = None
                continue
            if i + 1 - quiet_from >= min_pause:
                pause, resume = quiet_from, None
        if i + 1 - start > longest:  # with chunk i the run would be too long
            runs.append((start, i if pause is None else pause, True))
            start = (i if p >= high else None) if pause is None else resume
            pause = resume = None
            split = start is not None
    if start is not None:
        runs.append((start, len(probs) if quiet_from is None else quiet_from, split))
    return runs


def speech_chunks(probs: np.ndarray, n_samples: int, options: VadOptions) -> list[tuple[int, int]]:
    """Speech probabilities per chunk -> [(start, end)] samples of speech, padded and merged.

    Runs (`speech_runs`) shorter than min_speech s are dropped, unless a split made them; each is
    widened by speech_pad s, and chunks that then touch merge when the merged chunk stays within
    max_speech_duration_s, else meet halfway between their runs (Silero's rule for close chunks).
    """
    pad = _pad(options)
    longest = options.max_speech_duration_s * SAMPLE_RATE  # samples
    out: list[tuple[int, int]] = []
    last = 0  # the previous run's unpadded end (samples)
    for a, b, split in speech_runs(probs, options):
        if not split and (b - a) * CHUNK < options.min_speech * SAMPLE_RATE:
            continue
        a, b = a * CHUNK, min(n_samples, b * CHUNK)
        lo, hi = max(0, a - pad), min(n_samples, b + pad)
        if out and lo <= out[-1][1] and hi - out[-1][0] <= longest:
            out[-1] = (out[-1][0], hi)
        elif out and lo <= out[-1][1]:  # merged, it would be too long: meet halfway between the runs
            lo = last + (a - last) // 2
            out[-1] = (out[-1][0], lo)
            out.append((lo, hi))
        else:
            out.append((lo, hi))
        last = b
    return out


def _pad(options: VadOptions) -> int:
    return round(options.speech_pad * SAMPLE_RATE)  # samples


def detect_speech(
    samples: np.ndarray, options: VadOptions, within: list[tuple[int, int]] | None = None
) -> SpanMap:
    """samples: float32 [n] mono 16 kHz -> the map of its speech chunks. within: [(start, end)]
    samples (the clips of `TranscribeOptions.clip_timestamps`): only speech inside them, each
    searched on its own (Silero's state starts afresh at each), so no chunk reaches past one."""
    chunks = []
    for a, b in [(0, samples.size)] if within is None else within:
        if b > a:
            probs = speech_probabilities(samples[a:b])  # [ceil((b - a) / 512)]
            chunks += [(a + s, a + e) for s, e in speech_chunks(probs, b - a, options)]
    return SpanMap(chunks)
