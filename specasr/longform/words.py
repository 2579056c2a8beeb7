"""Word timestamps from the cross-attention of the target's alignment heads, as Whisper does.

Per decoded window, one teacher-forced target pass over its final tokens

    <|sot|> [<|lang|> <|task|>] <|notimestamps|> text tokens <|endoftext|>

gives the alignment heads' cross-attention scores [heads, tokens, frames]. Per head: softmax
over the window's audio frames (20 ms each), each frame standardised over the tokens, a median
filter (width 7) along time; then the mean over heads. Dynamic time warping finds the cheapest
monotonic path through -matrix from the <|notimestamps|> row to the last text row. The row of
a token predicts the next one, so text token i starts where the path enters row i (row 0 is
<|notimestamps|>) and ends where it enters row i + 1. A word spans its tokens; its probability
is the mean of their teacher-forced probabilities (softmax over the text vocabulary).

The tokens are the decode's own, and at T = 0 those equal target-only greedy decoding, so in
every mode the word times equal what autoregressive decoding gives.

Then, as openai-whisper and faster-whisper do: a word made of sentence-ending punctuation, or
one right after it, lasts at most twice the median word length; punctuation joins its word;
the first word after a pause is shortened the same way; a segment's bounds come from its words
unless its first (last) word runs more than 0.5 s past the decoder's timestamp. Every word lies
inside its segment, and (`in_order`, over the stream a strategy yields) no word or segment
starts before the previous one ends.
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from specasr.constants import N_TEXT_CTX, SECONDS_PER_TIMESTAMP
from specasr.options import TranscribeOptions
from specasr.results import Segment, TranscriptionInfo, Word

MEDIAN_WIDTH = 7  # encoder frames (20 ms each) of the median filter
PREPEND = TranscribeOptions.prepend_punctuations  # default: punctuation joining the word after it
APPEND = TranscribeOptions.append_punctuations  # default: punctuation joining the word before it
SENTENCE_END = ".。!！?？"
UNSPACED = frozenset({"zh", "ja", "th", "lo", "my", "yue"})  # split at characters, not spaces
MAX_MEDIAN = 0.7  # s: the median word length used by the heuristics is at most this
TIMESTAMP_SLACK = 0.5  # s a first/last word may overrun its segment's timestamp before that wins

# Whisper's alignment heads per model, for checkpoints whose configs lack them, keyed by
# (decoder_layers, decoder_attention_heads, d_model, vocab_size). large-v1 and large-v2 share
# a key but not heads, so neither is listed (they fall back to the upper half of the decoder).
# fmt: off
WHISPER_HEADS: dict[tuple[int, int, int, int], tuple[tuple[int, int], ...]] = {
    (4, 6, 384, 51864): ((1, 0), (2, 0), (2, 5), (3, 0), (3, 1), (3, 2), (3, 3), (3, 4)),  # tiny.en
    (4, 6, 384, 51865): ((2, 2), (3, 0), (3, 2), (3, 3), (3, 4), (3, 5)),  # tiny
    (6, 8, 512, 51864): ((3, 3), (4, 7), (5, 1), (5, 5), (5, 7)),  # base.en
    (6, 8, 512, 51865): ((3, 1), (4, 2), (4, 3), (4, 7), (5, 1), (5, 2), (5, 4), (5, 6)),  # base
    (12, 12, 768, 51864): (  # small.en
        (6, 6), (7, 0), (7, 3), (7, 8), (8, 2), (8, 5), (8, 7), (9, 0), (9, 4), (9, 8),
        (9, 10), (10, 0), (10, 1), (10, 2), (10, 3), (10, 6), (10, 11), (11, 2), (11, 4),
    ),
    (12, 12, 768, 51865): ((5, 3), (5, 9), (8, 0), (8, 4), (8, 7), (8, 8), (9, 0), (9, 7), (9, 9), (10, 5)),
    (24, 16, 1024, 51864): (  # medium.en
        (11, 4), (14, 1), (14, 12), (14, 14), (15, 4), (16, 0), (16, 4), (16, 9), (17, 12),
        (17, 14), (18, 7), (18, 10), (18, 15), (20, 0), (20, 3), (20, 9), (20, 14), (21, 12),
    ),
    (24, 16, 1024, 51865): ((13, 15), (15, 4), (15, 15), (16, 1), (20, 0), (23, 4)),  # medium
    (32, 20, 1280, 51866): (  # large-v3
        (7, 0), (10, 17), (12, 18), (13, 12), (16, 1), (17, 14), (19, 11), (21, 4), (24, 1), (25, 6),
    ),
    (4, 20, 1280, 51866): ((2, 4), (2, 11), (3, 3), (3, 6), (3, 11), (3, 14)),  # large-v3-turbo
}
# fmt: on


def alignment_heads(model) -> tuple[tuple[int, int], ...]:
    """The (layer, head) pairs whose cross-attention times words: the checkpoint's own (the
    CTranslate2 config's `alignment_heads`, carried into generation_config.json by
    `models.convert`), else Whisper's for a model of these sizes, else every head of the
    upper half of the decoder's layers. Heads that do not fit the decoder (a config copied
    from another model) count as absent."""
    dims = model.config
    n_layers, n_heads = dims.decoder_layers, dims.decoder_attention_heads
    own = tuple(tuple(h) for h in model.generation.alignment_heads)
    if own and all(0 <= i < n_layers and 0 <= h < n_heads for i, h in own):
        return own
    known = WHISPER_HEADS.get((n_layers, n_heads, dims.d_model, dims.vocab_size))
    if known is not None:
        return known
    return tuple((i, h) for i in range(n_layers // 2, n_layers) for h in range(n_heads))


# ---- alignment ----------------------------------------------------------------------------
def median_filter(x: Tensor, width: int) -> Tensor:
    """x [..., F] -> the running median of `width` (odd) values along F, edges reflected."""
    if width % 2 != 1:
        raise ValueError(f"the median filter width must be odd, got {width}")
    half = width // 2
    if x.shape[-1] <= half:  # too short to reflect
        return x
    shape = x.shape
    padded = F.pad(x.reshape(-1, 1, shape[-1]), (half, half), mode="reflect")  # [N, 1, F + 2·half]
    return padded.unfold(-1, width, 1).median(dim=-1).values.reshape(shape)


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cost [N, M] -> (rows, cols): the cheapest path from (0, 0) to (N-1, M-1) moving one
    step at a time diagonally, down (next row, same column) or right (same row, next column).

    D[i, j] = cost[i-1, j-1] + min(D[i-1, j-1], D[i-1, j], D[i, j-1]), over anti-diagonals
    i + j = d (each depends only on the two before it), so every diagonal is one vector step.
    The diagonal or the down move is taken only when strictly cheapest, else the right one."""
    N, M = cost.shape
    D = np.full((N + 1, M + 1), np.inf, dtype=np.float32)
    D[0, 0] = 0.0
    move = np.zeros((N + 1, M + 1), dtype=np.int8)  # 0 diagonal, 1 down, 2 right
    for d in range(2, N + M + 1):
        i = np.arange(max(1, d - M), min(N, d - 1) + 1)
        j = d - i
        diag, down, right = D[i - 1, j - 1], D[i - 1, j], D[i, j - 1]
        m = np.where((diag < down) & (diag < right), 0, np.where((down < diag) & (down < right), 1, 2))
        D[i, j] = cost[i - 1, j - 1] + np.choose(m, [diag, down, right])
        move[i, j] = m
    move[0, :], move[:, 0] = 2, 1  # along the edges the only way back is straight
    path = []
    i, j = N, M
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        m = move[i, j]
        i, j = i - (m != 2), j - (m != 1)
    rows, cols = np.array(path[::-1]).T
    return rows, cols


@dataclass(frozen=True)
class TokenTimes:
    """Times of a window's text tokens, in seconds from the start of the audio."""

    tokens: list[int]  # the text tokens aligned
    starts: np.ndarray  # [n]
    ends: np.ndarray  # [n]; ends[i] == starts[i + 1]
    probs: np.ndarray  # [n] teacher-forced probability of each token


@torch.inference_mode()
def align(
    pair, states: Tensor, tokens: list[int], frames: int, language: str | None, task: str, offset: float = 0.0
) -> TokenTimes:
    """One teacher-forced target pass and DTW: times of `tokens` (text tokens, < eot).

    states: the window's target encoder states [1, 1500, d]; frames: log-Mel frames of audio
    in the window (3000 but for the last one); offset: the window's start (s)."""
    tok = pair.tokenizer
    start = tok.sot_sequence(language, task, timestamps=False)  # ends with <|notimestamps|>
    tokens = tokens[: N_TEXT_CTX - len(start) - 1]
    n = len(tokens)
    if n == 0:
        empty = np.zeros(0)
        return TokenTimes([], empty, empty, empty)
    ids = torch.tensor([start + tokens + [tok.eot]], device=states.device)  # [1, T]
    hidden, scores = pair.target.model.decoder.cross_attention(ids, states, alignment_heads(pair.target))
    first = len(start) - 1  # the row of <|notimestamps|>, which predicts text token 0
    logits = pair.target.proj_out(hidden[0, first : first + n]).float()  # [n, V]
    picked = torch.tensor(tokens, device=logits.device)[:, None]
    probs = logits[:, : tok.eot].softmax(dim=-1).gather(1, picked)[:, 0]  # [n]
    w = scores[0, :, :, : max(frames // 2, 1)].softmax(dim=-1)  # [heads, T, F]
    std, mean = torch.std_mean(w, dim=-2, keepdim=True, unbiased=False)
    w = median_filter((w - mean) / std.clamp_min(1e-12), MEDIAN_WIDTH)
    matrix = w.mean(dim=0)[first:-1]  # [n + 1, F]: <|notimestamps|> and text rows
    rows, cols = dtw(-matrix.cpu().numpy())
    entered = np.diff(rows, prepend=-1) > 0  # the first cell of each row on the path
    times = offset + cols[entered] * SECONDS_PER_TIMESTAMP  # [n + 1]
    return TokenTimes(tokens, times[:-1], times[1:], probs.cpu().numpy())


# ---- words ----------------------------------------------------------------------------------
@dataclass
class _Timed:
    text: str
    tokens: list[int]  # indices into the window's TokenTimes
    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


def _pieces(tok, tokens: list[int]) -> list[tuple[str, list[int]]]:
    """Token positions grouped so each group decodes to whole characters (no U+FFFD)."""
    full = tok.decode(tokens)
    out: list[tuple[str, list[int]]] = []
    group: list[int] = []
    at = 0  # characters of `full` decoded so far
    for k in range(len(tokens)):
        group.append(k)
        text = tok.decode([tokens[g] for g in group])
        bad = text.find("\ufffd")
        if bad < 0 or full[at + bad : at + bad + 1] == "\ufffd":  # complete, or a real U+FFFD
            out.append((text, group))
            at += len(text)
            group = []
    if group:
        out.append((tok.decode([tokens[g] for g in group]), group))
    return out


def split_words(tok, tokens: list[int], language: str | None) -> list[tuple[str, list[int]]]:
    """Text tokens -> words as (text, token positions). Spaced languages: a word starts at a
    piece with a leading space, at punctuation, or at the start; others: at every character."""
    pieces = _pieces(tok, tokens)
    if language in UNSPACED:
        return pieces
    words: list[tuple[str, list[int]]] = []
    for text, group in pieces:
        if not words or text.startswith(" ") or text.strip() in string.punctuation:
            words.append((text, list(group)))
        else:
            words[-1] = (words[-1][0] + text, words[-1][1] + group)
    return words


def merge_punctuation(words: list[_Timed], prepend: str = PREPEND, append: str = APPEND) -> list[_Timed]:
    """Punctuation in `prepend` joins the word after it, in `append` the word before it; the
    word keeps its own times."""
    out: list[_Timed] = []
    for w in reversed(words):  # " (" + "word"
        if out and w.text.startswith(" ") and w.text.strip() in prepend:
            nxt = out[-1]
            out[-1] = replace(nxt, text=w.text + nxt.text, tokens=w.tokens + nxt.tokens)
        else:
            out.append(w)
    out.reverse()
    merged: list[_Timed] = []
    for w in out:  # "word" + ","
        if merged and not merged[-1].text.endswith(" ") and w.text in append:
            prev = merged[-1]
            merged[-1] = replace(prev, text=prev.text + w.text, tokens=prev.tokens + w.tokens)
        else:
            merged.append(w)
    return merged


def _median_duration(times: TokenTimes, words: list[tuple[str, list[int]]]) -> float:
    durations = [times.ends[g[-1]] - times.starts[g[0]] for _, g in words]
    durations = [d for d in durations if d > 0]
    return min(MAX_MEDIAN, float(np.median(durations))) if durations else 0.0


class WordTimer:
    """Adds words to the segments of a transcript. `add` one window's final tokens after
    it is decoded (one target pass), then `attach` to segments cut from it. Windows may come
    in any order (chunked lanes); `in_order` then orders the stream the strategy yields."""

    def __init__(self, pair, options: TranscribeOptions, info: TranscriptionInfo) -> None:
        self.pair, self.task = pair, options.decode.task
        self.punctuation = (options.prepend_punctuations, options.append_punctuations)
        self.info = info  # its language (given or detected) and duration
        self.windows: dict[int, tuple[TokenTimes, float]] = {}  # window -> (times, median word s)
        self.cursor: dict[int, int] = {}  # window -> first token not yet given to a segment
        self.spans: list[tuple[float, float]] = []  # (start, end) of every segment with words so far

    @classmethod
    def maybe(cls, pair, options: TranscribeOptions, info: TranscriptionInfo) -> WordTimer | None:
        """A timer when `options.word_timestamps` is on, else None."""
        return cls(pair, options, info) if options.word_timestamps else None

    def add(self, window: int, states: Tensor, offset: float, frames: int, tokens: list[int]) -> None:
        """states: the window's target encoder states [1, 1500, d]; offset: its start (s);
        frames: log-Mel frames of audio in it; tokens: its final tokens (timestamps are dropped)."""
        text = [t for t in tokens if t < self.pair.tokenizer.eot]
        times = align(self.pair, states, text, frames, self.info.language, self.task, offset)
        median = _median_duration(times, split_words(self.pair.tokenizer, times.tokens, self.info.language))
        self.windows[window] = (times, median)
        self.cursor[window] = 0

    def attach(self, segments: list[Segment]) -> list[Segment]:
        """The segments (each cut from a window given to `add`) with `words`, bounds refined."""
        return [self._one(s) for s in segments]

    def forget(self, n: int) -> None:
        """Forgets the last `n` segments given words (dropped as heard in silence): the pause before
        the next segment's first word is then measured from the speech before them."""
        del self.spans[len(self.spans) - n :]

    def _locate(self, seg: Segment, times: TokenTimes) -> int | None:
        """Where the segment's text tokens sit in its window's: the match after the last one
        used that lies closest to the segment's start (ties: the first)."""
        run = [t for t in seg.tokens if t < self.pair.tokenizer.eot]
        ids, n = times.tokens, len(run)
        for begin in (self.cursor[seg.window], 0):
            hits = [k for k in range(begin, len(ids) - n + 1) if ids[k : k + n] == run]
            if hits:
                return min(hits, key=lambda k: abs(times.starts[k] - seg.start))
        return None

    def _one(self, seg: Segment) -> Segment:
        times, median = self.windows[seg.window]
        at = self._locate(seg, times)
        if at is None or not seg.text.strip():
            return self._bounded(seg, [])
        n = len([t for t in seg.tokens if t < self.pair.tokenizer.eot])
        self.cursor[seg.window] = at + n
        longest = 2 * median
        words = [
            _Timed(text, [at + g for g in group], times.starts[at + group[0]], times.ends[at + group[-1]])
            for text, group in split_words(self.pair.tokenizer, times.tokens[at : at + n], self.info.language)
        ]
        if median > 0:  # sentence ends are where the attention lingers: cut such words short
            for prev, w in zip(words, words[1:]):
                if w.duration > longest and w.text in SENTENCE_END:
                    w.end = w.start + longest
                elif w.duration > longest and prev.text in SENTENCE_END:
                    w.start = w.end - longest
        words = merge_punctuation(words, *self.punctuation)
        start, end = seg.start, seg.end
        if words:
            first, last = words[0], words[-1]
            # the first word after a pause tends to start too early: at most twice the median
            before = max((e for s, e in self.spans if s < seg.start), default=0.0)  # the speech before
            second_long = len(words) > 1 and words[1].end - first.start > 2 * longest
            if first.end - before > 4 * median and (first.duration > longest or second_long):
                if len(words) > 1 and words[1].duration > longest:
                    first.end = words[1].start = max(words[1].start, words[1].end - longest)
                first.start = max(0.0, first.end - longest)
            if start < first.end and start - TIMESTAMP_SLACK > first.start:  # the timestamp is likelier
                first.start = max(0.0, min(first.end - median, start))
            else:
                start = first.start
            if end > last.start and end + TIMESTAMP_SLACK < last.end:
                last.end = max(last.start + median, end)
            else:
                end = last.end
            self.spans.append((seg.start, end))
        return self._bounded(replace(seg, start=start, end=end), words)

    def _bounded(self, seg: Segment, words: list[_Timed]) -> Segment:
        """The segment with its words, in order and inside it, and nothing past the audio."""
        start = max(0.0, min([seg.start] + [w.start for w in words[:1]]))
        end = max(start, min(self.info.duration, max([seg.end] + [w.end for w in words[-1:]])))
        probs = self.windows[seg.window][0].probs
        timed = [Word(w.text, w.start, w.end, float(np.mean(probs[w.tokens]))) for w in words]
        return _clamped(seg, start, end, timed)


def _clamped(seg: Segment, start: float, end: float, words: list[Word]) -> Segment:
    """seg over [start, end] with its words moved inside, each starting where the one before ends
    at the earliest."""
    out, t = [], start
    for w in words:
        a = min(max(w.start, t), end)
        t = min(max(w.end, a), end)
        out.append(Word(w.word, float(a), float(t), w.probability))
    return replace(seg, start=float(start), end=float(end), words=out)


def in_order(segments: Iterator[Segment]) -> Iterator[Segment]:
    """A word-timed transcript stream with no segment or word starting before the previous ends
    (segment bounds from words may reach past a neighbour's timestamps)."""
    floor = 0.0
    for seg in segments:
        start = max(seg.start, floor)
        end = max(seg.end, start)
        floor = end
        yield (
            _clamped(seg, start, end, seg.words)
            if seg.words is not None
            else replace(seg, start=start, end=end)
        )
