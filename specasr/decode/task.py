"""What one decode is asked to do: its start sequence, its logit filters, its token limit,
and the language when none is given."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from specasr.constants import N_TEXT_CTX
from specasr.decode.filters import LogitFilter, build_filters
from specasr.decode.runners import make_runner
from specasr.options import DecodeOptions


def start_sequence(
    pair, options: DecodeOptions, language: str | None, prompt: list[int] | None
) -> tuple[list[int], int]:
    """Initial decoder tokens and the index of <|startoftranscript|> in them."""
    tok = pair.tokenizer
    seq = tok.sot_sequence(language, options.task, options.timestamps)
    if not prompt:
        return seq, 0
    prev = [tok.sot_prev] + list(prompt)[-(N_TEXT_CTX // 2 - 1) :]
    return prev + seq, len(prev)


def prefix_tokens(pair, options: DecodeOptions) -> list[int]:
    """The tokens `options.prefix` forces at the start of every row: with timestamps, the
    first timestamp <|0.00|> and then the text (as faster-whisper forces it), else the text;
    none without a prefix."""
    if not options.prefix or not options.prefix.strip():
        return []
    tok = pair.tokenizer
    text = tok.encode(" " + options.prefix.strip())
    return ([tok.timestamp_begin] if options.timestamps else []) + text


def task_filters(pair, options: DecodeOptions, sample_begin: int) -> list[LogitFilter]:
    """Whisper's logit filters for decoding with `options` after `sample_begin` prompt tokens."""
    beyond = [t for t in options.suppress_ids if t >= pair.vocab_size]
    if beyond:
        raise ValueError(f"token {beyond[0]} to suppress is beyond the vocabulary ({pair.vocab_size} tokens)")
    return build_filters(
        pair.tokenizer,
        vocab_size=pair.vocab_size,
        sample_begin=sample_begin,
        suppress_tokens=(pair.suppress_tokens if options.suppress_tokens else ()) + options.suppress_ids,
        begin_suppress_tokens=pair.begin_suppress_tokens,
        suppress_blank=options.suppress_blank,
        timestamps=options.timestamps,
        max_initial_timestamp=options.max_initial_timestamp,
    )


@dataclass(frozen=True)
class Task:
    """One decode's fixed inputs: every row starts from `init` and stops at eot or `limit`."""

    init: list[int]  # prompt (if any) + start sequence + forced prefix (if any)
    sot_index: int  # index of <|startoftranscript|> in init
    limit: int  # total context length at which a row stops
    filters: list[LogitFilter]
    language: str | None
    forced: int = 0  # init's last tokens that are the prefix (`prefix_tokens`): output, not sampled

    @property
    def sample_begin(self) -> int:
        """Where each row's output starts: the forced prefix is output, and the filters read it
        as sampled (a prefix's <|0.00|> is the first timestamp of the timestamp grammar)."""
        return len(self.init) - self.forced

    @property
    def prompt_len(self) -> int:
        """Prompt tokens between <|startofprev|> and <|startoftranscript|> (0: no prompt)."""
        return max(self.sot_index - 1, 0)

    @classmethod
    def build(cls, pair, options: DecodeOptions, language: str | None, prompt: list[int] | None) -> Task:
        init, sot_index = start_sequence(pair, options, language, prompt)
        begin = len(init)  # the output's first position
        forced = prefix_tokens(pair, options)
        most = options.max_new_tokens
        limit = N_TEXT_CTX if most is None else min(N_TEXT_CTX, begin + most)
        if limit <= begin + len(forced):
            used = begin + len(forced)
            raise ValueError(f"the prompt and prefix leave no room to decode ({used} of {N_TEXT_CTX} places)")
        filters = task_filters(pair, options, begin)
        return cls(init + forced, sot_index, limit, filters, language, len(forced))


def task_language(pair, options, target_states: Tensor) -> str:
    """The decode's language: `options.language`, else the one every row detects (rows of
    one batch that detect different languages are refused)."""
    if options.language is not None:
        return options.language
    languages = set(detect_language(pair, target_states))
    if len(languages) > 1:
        raise ValueError("rows of one batch detected different languages; decode them separately")
    return languages.pop()


def detect_language(pair, target_states: Tensor) -> list[str]:
    """Most likely language per row, from the target's logits after <|startoftranscript|>."""
    return [max(probs, key=probs.get) for probs in language_probs(pair, target_states)]


@torch.inference_mode()
def language_probs(pair, target_states: Tensor) -> list[dict[str, float]]:
    """Per row, each language's probability (Whisper's: the softmax of the target's logits
    after <|startoftranscript|> over the language tokens alone); {"en": 1.0} per row for an
    English-only model."""
    tok = pair.tokenizer
    if not tok.multilingual:
        return [{"en": 1.0} for _ in range(target_states.shape[0])]
    runner = make_runner(pair.target, target_states)
    sot = torch.full((target_states.shape[0], 1), tok.sot, device=target_states.device)
    logits = runner(sot, 1)[:, -1].float()  # [B, V]
    codes, ids = zip(*tok.language_tokens.items())
    probs = logits[:, list(ids)].softmax(dim=-1).tolist()  # [B, languages]
    return [dict(zip(codes, row)) for row in probs]
