"""From audio to text.

`transcribe` handles audio of any length and streams `Segment`s; `transcribe_clip` decodes
one clip of up to 30 s into a single `DecodeResult`; `detect_language` runs `transcribe`'s
language detection alone. Each takes the audio first, then the pair.

Strategies (TranscribeOptions.strategy):
- `sequential` (longform/sequential.py): Whisper's seek loop, one window at a time, each window
  prompted with the text before it;
- `chunked` (longform/chunked.py): the audio cut at pauses into spans of at most 30 s, each with its
  own seek loop, decoded as batches without a running prompt.

With `TranscribeOptions.vad`, Silero VAD (longform/vad.py) keeps only the speech: its chunks are
joined and decoded (chunked: packed into spans cut where chunks meet), and every time is mapped
back to the recording. Audio without speech gives no segments and decodes nothing.
`TranscribeOptions.clip_timestamps` keeps only the clips given, the same way (longform/spans.py;
with VAD, the speech inside them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from functools import partial

from torch import Tensor

from specasr.audio import AudioSource, load_audio
from specasr.backends import process
from specasr.backends.cpu import heap
from specasr.constants import N_FRAMES, N_SAMPLES, SAMPLE_RATE
from specasr.decode.loop import decode
from specasr.features import log_mel, log_mel_window
from specasr.longform.chunked import chunked
from specasr.longform.engine import Engine, LocalEngine
from specasr.longform.sequential import sequential
from specasr.longform.spans import SpanMap, clip_spans
from specasr.longform.timing import trim_trailing_silence
from specasr.longform.vad import detect_speech
from specasr.longform.windows import encode_windows, quiet_frames, window_mel
from specasr.longform.words import in_order
from specasr.options import DecodeOptions, TranscribeOptions
from specasr.results import DecodeResult, Segment, TranscriptionInfo
from specasr.stats import DecodeStats

__all__ = [
    "AudioTooLongError",
    "Segment",
    "TranscriptionInfo",
    "detect_language",
    "transcribe",
    "transcribe_clip",
]


class AudioTooLongError(ValueError):
    pass


def transcribe(
    audio: AudioSource,
    pair,
    options: TranscribeOptions = TranscribeOptions(),  # noqa: B008 (frozen, immutable)
    *,
    source_rate: int | None = None,
    engine: Engine | None = None,
) -> tuple[Iterator[Segment], TranscriptionInfo]:
    """audio: a path, bytes, or a float array (with `source_rate`) of any length.

    Returns a lazy iterator of segments (windows are decoded as it is consumed) and the
    info, whose `stats` and `windows` fill in as the iterator runs. `engine` does the model work
    (longform/engine.py): a `LocalEngine` of `pair` unless given, e.g. a server's
    `SharedEngine`, which decodes the windows of concurrent transcriptions together. The audio is loaded, and
    with no language given for a multilingual model the first window is encoded and its
    language detected, before this returns.
    """
    engine = LocalEngine(pair) if engine is None else engine
    if engine.pair is not pair:
        raise ValueError("the engine runs another pair of models than the one given")
    tok = pair.tokenizer
    dec = options.decode
    if dec.speculative and pair.draft is None:
        raise ValueError(f"mode {dec.mode!r} needs a draft model; load one or use mode 'autoregressive'")
    if dec.task == "translate" and not tok.multilingual:
        raise ValueError(f"{pair.target_name} is English-only and cannot translate")
    if tok.multilingual and dec.language is not None and dec.language not in tok.language_tokens:
        raise ValueError(f"unknown language {dec.language!r}; known: {sorted(tok.language_tokens)}")
    samples = load_audio(audio, source_rate=source_rate)  # float32 mono 16 kHz
    spans = _decoded_spans(samples, options)  # None: the whole recording
    decoded = samples if spans is None else spans.collect(samples)  # [n'] the audio decoded
    info = TranscriptionInfo(
        language=dec.language if tok.multilingual else "en",
        language_detected=False,
        duration=len(samples) / SAMPLE_RATE,
        options=options,
        model=pair.target_name,
        draft=pair.draft_name if dec.speculative else None,
        duration_after_vad=None if spans is None else len(decoded) / SAMPLE_RATE,
    )
    if decoded.size == 0:
        return iter(()), info
    mel = log_mel(decoded, pair.n_mels, padding=N_SAMPLES)[0]  # [n_mels, content frames + 3000]
    first = None
    if info.language is None:
        first, info.all_language_probs = _first_window_languages(
            engine, mel, info.stats, options.language_detection_threshold, options.language_detection_segments
        )
        info.language, info.language_probability = info.all_language_probs[0]
        info.language_detected = True
    strategy = sequential
    if options.strategy == "chunked":
        strategy = partial(chunked, joins=spans.joins() if spans is not None else ())
    quiet = quiet_frames(decoded, options.silence_peak)  # [content frames] digital silence
    segments = strategy(engine, mel, options, info, first, quiet=quiet)
    if options.word_timestamps:  # segments end with their words: no energy trim
        segments = in_order(segments)
    elif options.trim_silence:
        segments = trim_trailing_silence(segments, mel)
    if spans is not None:  # times on the joined spans -> times on the recording
        segments = spans.restore(segments)
    return _in_workspace(segments), info


def _first_window_languages(
    engine: Engine, mel: Tensor, stats: DecodeStats, threshold: float = 0.5, windows: int = 1
) -> tuple[tuple[Tensor, Tensor | None], list[tuple[str, float]]]:
    """Whisper's language detection: mel [n_mels, content frames + 3000] -> (the first window's
    encoder states, which its decode reuses; languages by probability, most likely first).

    The first 30 s decide, unless their likeliest language is below `threshold` and `windows`
    allows more: then each next window votes in turn until one is sure enough (its languages
    are the answer), else the language most windows chose wins (a tie: the likelier on average),
    with the windows' mean probabilities (TranscribeOptions.language_detection_*)."""
    content = mel.shape[-1] - N_FRAMES
    first = None
    votes: list[dict[str, float]] = []  # per window: language -> probability
    for seek in range(0, content, N_FRAMES)[:windows]:
        states = encode_windows(engine, window_mel(mel, seek, min(N_FRAMES, content - seek)), stats)
        first = states if first is None else first
        probs = engine.detect(states[0])[0]  # language -> probability
        ranked = sorted(probs.items(), key=lambda kv: -kv[1])
        if ranked[0][1] >= threshold or windows == 1:
            return first, ranked
        votes.append(probs)
    mean = {lang: sum(v[lang] for v in votes) / len(votes) for lang in votes[0]}
    count = Counter(max(v, key=v.get) for v in votes)
    chosen = max(count, key=lambda lang: (count[lang], mean[lang]))
    ranked = sorted(mean.items(), key=lambda kv: (kv[0] != chosen, -kv[1]))
    return first, ranked


def detect_language(
    audio: AudioSource, pair, *, source_rate: int | None = None
) -> tuple[str, float, list[tuple[str, float]]]:
    """audio (as `transcribe` takes it) -> (language, its probability, every language's
    probability, most likely first): the detection `transcribe` runs when no language is given,
    on the same log-Mel of the whole audio (its floor is taken over all of it), so the two agree.
    An English-only model gives ("en", 1.0, [("en", 1.0)]) without running the encoder."""
    if not pair.tokenizer.multilingual:
        return "en", 1.0, [("en", 1.0)]
    samples = load_audio(audio, source_rate=source_rate)  # float32 mono 16 kHz
    mel = log_mel(samples, pair.n_mels, padding=N_SAMPLES)[0]  # [n_mels, content frames + 3000]
    _, ranked = _first_window_languages(LocalEngine(pair), mel, DecodeStats())
    return *ranked[0], ranked


def _decoded_spans(samples, options: TranscribeOptions) -> SpanMap | None:
    """samples: float32 [n] -> the spans of them that are decoded: the clips asked for, and
    inside them (or the whole recording) the speech VAD finds; None: all of it."""
    clips = clip_spans(options.clip_timestamps, samples.size) if options.clip_timestamps else None
    if options.vad is not None:
        return detect_speech(samples, options.vad, within=clips)
    return None if clips is None else SpanMap(clips)


def _in_workspace(segments: Iterator[Segment]) -> Iterator[Segment]:
    """The segments, with every window decoded inside one `heap.workspace` (a no-op unless
    the CLI set the lean policy): the encoder's and the decoding loop's large temporaries
    (activations, a pass's logits, cross K/V) are served from the heap and reused from window
    to window instead of mapped and faulted in afresh, and the heap is trimmed when the
    iterator is exhausted or closed (docs/benchmarks.md, "Start-up and whole process"); the
    chunked strategy also trims between its rounds of windows (`longform.chunked`). The thread
    then hands its OpenMP team back (`process.hand_back_team`): threads that have transcribed
    would otherwise slow every later transcription's passes on another thread."""
    try:
        with heap.workspace():
            yield from segments
    finally:
        process.hand_back_team()


def transcribe_clip(audio, pair, options: DecodeOptions, *, source_rate: int | None = None) -> DecodeResult:
    """audio: a path, bytes, or a float array (with `source_rate`) of at most 30 s."""
    samples = load_audio(audio, source_rate=source_rate)  # float32 mono 16 kHz
    if len(samples) > N_SAMPLES:
        raise AudioTooLongError(
            f"audio is {len(samples) / SAMPLE_RATE:.1f} s; transcribe_clip takes up to 30 s "
            "(use transcribe for long-form audio)"
        )
    mel = log_mel_window(samples, n_mels=pair.n_mels, device=pair.device)  # [1, n_mels, 3000]
    try:
        return decode(pair, mel, options)[0]
    finally:
        process.hand_back_team()  # as `transcribe` does
