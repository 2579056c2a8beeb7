"""Whisper's decoding options on `specasr transcribe`, by openai-whisper's names.

Each option has the CLI's spelling (`--initial-prompt`) and openai-whisper's
(`--initial_prompt`), and a value of `specasr.options.WHISPER_DEFAULTS`, which
`front_end_options` turns into TranscribeOptions: the server takes the same names as form
fields. A threshold given as `none` is off.
"""

from __future__ import annotations

import math

import click

from specasr.options import MAX_BEAMS
from specasr.options import WHISPER_DEFAULTS as D

# the largest Whisper vocabulary (large-v3's): a token id at or above it is a usage error
# before any model loads; a smaller model's vocabulary is checked when it is loaded
MAX_VOCAB = 51866


class OptionalFloat(click.ParamType):
    """A finite number within [low, high], or `none` (the threshold is off)."""

    name = "float|none"

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, float):
            return value
        if str(value).strip().lower() == "none":
            return None
        try:
            number = float(value)
        except ValueError:
            self.fail(f"{value!r} is not a number or 'none'", param, ctx)
        if not (math.isfinite(number) and self.low <= number <= self.high):
            self.fail(f"{value!r} is not within [{self.low:g}, {self.high:g}] (or 'none')", param, ctx)
        return number


def _names(name: str) -> tuple[str, ...]:
    """`--dash-name`, `--underscore_name` (one for a one-word name), the parameter's name."""
    return (*dict.fromkeys((f"--{name.replace('_', '-')}", f"--{name}")), name)


def _option(name: str, help: str, **kwargs):
    kwargs.setdefault("default", D[name])
    return click.option(*_names(name), show_default=kwargs["default"] is not None, help=help, **kwargs)


_OPTIONS = [
    _option(
        "initial_prompt",
        "Text that prompts the first window (every window with --strategy chunked): names, terms "
        "and the style to follow.",
    ),
    _option(
        "prefix",
        "Text the transcript is forced to begin with (the first window; sequential strategy).",
    ),
    _option(
        "hotwords",
        "Words that prompt every window, before the previous text: names and terms to spell as given.",
    ),
    _option(
        "condition_on_previous_text",
        "Prompt each window with the text decoded so far (False: each window alone, which "
        "stops a repetition loop from carrying over).",
        type=click.BOOL,
    ),
    _option(
        "multilingual",
        "With --language auto: detect every window's language and decode it in that one "
        "(sequential strategy); JSON segments say which.",
        type=click.BOOL,
    ),
    _option(
        "compression_ratio_threshold",
        "Decode a window again at a higher temperature when its text's gzip ratio is above this.",
        type=OptionalFloat(0, math.inf),
    ),
    _option(
        "logprob_threshold",
        "... or when its average log-probability is below this.",
        type=OptionalFloat(-math.inf, 0),
    ),
    _option(
        "no_speech_threshold",
        "Skip a window whose P(no speech) is above this and whose log-probability is below "
        "--logprob-threshold.",
        type=OptionalFloat(0, 1),
    ),
    _option(
        "max_initial_timestamp",
        "Seconds: the first timestamp of a window is at most this.",
        type=OptionalFloat(0, 30),
    ),
    _option(
        "suppress_tokens",
        "Comma-separated token ids never to emit; -1 stands for the model's non-speech symbols, "
        "'' suppresses nothing.",
    ),
    _option(
        "clip_timestamps",
        "Decode only these spans: 'start,end,start,end,…' in seconds (an odd count: the last "
        "runs to the end); times stay the recording's.",
    ),
    _option(
        "hallucination_silence_threshold",
        "With --word-timestamps: seconds of silence around a segment of unlikely words that mark "
        "it a hallucination and skip it.",
        type=click.FloatRange(min=0, min_open=True),
    ),
    _option("prepend_punctuations", "With --word-timestamps: these join the word after them."),
    _option("append_punctuations", "With --word-timestamps: these join the word before them."),
    _option(
        "language_detection_threshold",
        "With --language auto: a window detected below this probability lets the next one vote.",
        type=click.FloatRange(0, 1),
    ),
    _option(
        "language_detection_segments",
        "With --language auto: windows that may vote on the language.",
        type=click.IntRange(1, 100),
    ),
    _option(
        "beam_size",
        "Beams at temperature 0 (1: greedy). On a CPU the beams decode with the target alone, in "
        "every mode (speculative beams give the same tokens but cost more there); on a GPU the "
        "draft proposes each beam's continuation and the target checks them in one pass.",
        type=click.IntRange(1, MAX_BEAMS),
    ),
    _option(
        "best_of",
        "Above temperature 0 (the fallbacks): independent samples per window, the best by "
        "--length-penalty's ranking kept.",
        type=click.IntRange(1, MAX_BEAMS),
    ),
    _option(
        "patience",
        "Beam search ends when round(beam size × patience) hypotheses have finished.",
        type=click.FloatRange(min=0, min_open=True),
    ),
    _option(
        "length_penalty",
        "Rank candidates by sum log-prob / ((5 + length) / 6) ** this (openai-whisper's α); "
        "'none': / length.",
        type=OptionalFloat(0, 1),
    ),
    click.option(
        "--vad-max-speech",
        type=click.FloatRange(min=0, min_open=True),
        default=D["vad_max_speech"],
        show_default=True,
        help="With --vad: seconds after which a speech chunk is split (at its last pause when it has one).",
    ),
]


def whisper_options(command):
    """The options above, added to a click command: it receives each by its
    WHISPER_DEFAULTS name."""
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def check_suppress_tokens(text: str) -> None:
    """A usage error (exit 2) for a --suppress-tokens that no Whisper vocabulary holds."""
    from specasr.options import parse_suppress_tokens

    try:
        _, ids = parse_suppress_tokens(text)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--suppress-tokens'") from None
    if any(i >= MAX_VOCAB for i in ids):
        raise click.BadParameter(
            f"token id {max(ids)} is beyond every Whisper vocabulary ({MAX_VOCAB} tokens)",
            param_hint="'--suppress-tokens'",
        )
