"""Whisper's special tokens and text <-> token conversion, over a `tokenizers` JSON file.

Decoding, all a transcription does, reads a cached byte table (`DecodeTable`); the
`tokenizers` library parses the JSON only to encode text (prompts) or to build that table.

English-only checkpoints (vocab 51864) and multilingual ones (51865+) number their special
tokens differently, so every id is looked up by name, never hard-coded. Some shipped
`tokenizer.json` files lack the timestamp tokens; they always follow `<|notimestamps|>`.
"""

from __future__ import annotations

import hashlib
import json
import struct
from array import array
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from specasr.cache import default_cache_root, store
from specasr.constants import SECONDS_PER_TIMESTAMP

if TYPE_CHECKING:
    from tokenizers import Tokenizer as _HFTokenizer

# Whisper's language codes in token order (<|en|> first); the model's tokenizer decides
# how many of them exist (99 for v1/v2 models, 100 for large-v3).
LANGUAGES = (
    "en zh de es ru ko fr ja pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no "
    "th ur hr bg lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw "
    "gl mr pa si km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl "
    "mg as tt haw ln ha ba jw su yue"
).split()
# Whisper's language names (lower case, as OpenAI's verbose_json gives them), in LANGUAGES' order
_NAMES = (
    "english chinese german spanish russian korean french japanese portuguese turkish polish "
    "catalan dutch arabic swedish italian indonesian hindi finnish vietnamese hebrew ukrainian "
    "greek malay czech romanian danish hungarian tamil norwegian thai urdu croatian bulgarian "
    "lithuanian latin maori malayalam welsh slovak telugu persian latvian bengali serbian "
    "azerbaijani slovenian kannada estonian macedonian breton basque icelandic armenian nepali "
    "mongolian bosnian kazakh albanian swahili galician marathi punjabi sinhala khmer shona yoruba "
    "somali afrikaans occitan georgian belarusian tajik sindhi gujarati amharic yiddish lao uzbek "
    "faroese haitian_creole pashto turkmen nynorsk maltese sanskrit luxembourgish myanmar tibetan "
    "tagalog malagasy assamese tatar hawaiian lingala hausa bashkir javanese sundanese cantonese"
).split()
LANGUAGE_NAMES = {code: name.replace("_", " ") for code, name in zip(LANGUAGES, _NAMES)}

TASKS = ("transcribe", "translate")


def _hf_tokenizer(text: str) -> _HFTokenizer:
    from tokenizers import Tokenizer as HF  # a Rust extension: imported only when text is encoded

    return HF.from_str(text)


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet inverted: the character a byte-level BPE writes for each
    byte -> that byte. Printable Latin-1 bytes stand for themselves; the other 68 bytes are
    written as characters 256, 257, … in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = dict(zip(keep, keep))
    for b in range(256):
        if b not in chars:
            chars[b] = 256 + len(chars) - len(keep)
    return {chr(c): b for b, c in chars.items()}


@dataclass(frozen=True)
class DecodeTable:
    """What turning ids back into text needs for a byte-level BPE tokenizer (every Whisper
    tokenizer), in a form read quickly: each base-vocabulary id's bytes, the special tokens
    by name, and the vocabulary size. Parsing the full `tokenizer.json` (50 000 merges) is a
    noticeable part of every start, and decoding is all a transcription does;
    encoding text (a prompt) parses it then (`Tokenizer.hf`).

    Decoding joins the ids' bytes and reads them as UTF-8, an invalid sequence becoming
    U+FFFD: what `tokenizers`' ByteLevel decoder does (tests/test_tokenizer.py compares the
    two on every id and on random sequences). Built once from a `tokenizers.Tokenizer` and
    cached under the sha256 of the JSON text (`Tokenizer.from_file`)."""

    blob: bytes  # every base id's bytes, in id order
    offsets: array  # uint32 [n + 1]: id i's bytes are blob[offsets[i] : offsets[i + 1]]
    specials: dict[str, int]  # added tokens and <|…|> base entries: content -> id
    vocab_size: int  # with added tokens, as tokenizers counts it

    MAGIC = b"SPECASR-DECODE-1"

    def decode(self, ids) -> str:
        """Text of `ids`; an id outside the base vocabulary is skipped, as tokenizers does."""
        off, n = self.offsets, len(self.offsets) - 1
        data = b"".join([self.blob[off[t] : off[t + 1]] for t in ids if 0 <= t < n])
        return data.decode("utf-8", "replace")

    @classmethod
    def of(cls, hf: _HFTokenizer, spec: dict) -> DecodeTable | None:
        """The table of a tokenizer and its JSON (`spec`), or None where decoding is more
        than byte-level BPE (another model or decoder, a normalizer that decoding undoes)."""
        model, decoder = spec.get("model") or {}, spec.get("decoder") or {}
        if model.get("type") != "BPE" or decoder.get("type") != "ByteLevel" or model.get("byte_fallback"):
            return None
        alphabet = _byte_alphabet()
        vocab = hf.get_vocab(with_added_tokens=False)  # token -> id
        by_id: list[bytes] = [b""] * (max(vocab.values(), default=-1) + 1)
        specials = {}
        for token, tid in vocab.items():
            if any(c not in alphabet for c in token):
                return None
            by_id[tid] = bytes(alphabet[c] for c in token)
            if token.startswith("<|") and token.endswith("|>"):
                specials[token] = tid
        specials.update({t.content: tid for tid, t in hf.get_added_tokens_decoder().items()})
        offsets = array("I", [0])
        for piece in by_id:
            offsets.append(offsets[-1] + len(piece))
        return cls(b"".join(by_id), offsets, specials, hf.get_vocab_size(with_added_tokens=True))

    def to_bytes(self) -> bytes:
        names = json.dumps(self.specials).encode()
        n = len(self.offsets) - 1
        head = struct.pack("<16sIIII", self.MAGIC, n, len(self.blob), len(names), self.vocab_size)
        return head + self.offsets.tobytes() + self.blob + names

    @classmethod
    def from_bytes(cls, data: bytes) -> DecodeTable:
        """Reads `to_bytes`'s layout; ValueError for anything else (a truncated file)."""
        size = struct.calcsize("<16sIIII")
        if len(data) < size:
            raise ValueError("not a decode table")
        magic, n, blob_len, names_len, vocab_size = struct.unpack_from("<16sIIII", data)
        offsets = array("I")
        whole = size + 4 * (n + 1) + blob_len + names_len
        if magic != cls.MAGIC or offsets.itemsize != 4 or len(data) != whole:
            raise ValueError("not a decode table")
        offsets.frombytes(data[size : size + 4 * (n + 1)])
        at = size + 4 * (n + 1)
        if offsets[-1] != blob_len:
            raise ValueError("not a decode table")
        specials = json.loads(data[at + blob_len :])
        return cls(data[at : at + blob_len], offsets, specials, vocab_size)


def _cached_table(text: bytes) -> tuple[DecodeTable | None, _HFTokenizer | None]:
    """(the decode table of a tokenizer.json's bytes, the parsed tokenizer if it had to be
    parsed). The table is cached in <cache>/tokenizers/ under the text's sha256; an
    unwritable cache only means the next start parses again."""
    path = default_cache_root() / "tokenizers" / f"{hashlib.sha256(text).hexdigest()[:32]}.bin"
    try:
        return DecodeTable.from_bytes(path.read_bytes()), None
    except (OSError, ValueError):
        pass
    decoded = text.decode("utf-8")
    hf = _hf_tokenizer(decoded)
    table = DecodeTable.of(hf, json.loads(decoded))
    if table is not None:
        try:
            store(path, table.to_bytes())
        except OSError:
            pass
    return table, hf


class Tokenizer:
    """Whisper's special-token vocabulary over a `tokenizers.Tokenizer` (`hf`).

    `from_file` decodes through a cached `DecodeTable` and parses the full tokenizer only
    when text is encoded; a Tokenizer made from a `tokenizers.Tokenizer` uses it throughout."""

    def __init__(
        self, hf: _HFTokenizer | None = None, *, table: DecodeTable | None = None, path: Path | None = None
    ) -> None:
        if hf is None and (table is None or path is None):
            raise ValueError("a Tokenizer needs a tokenizers.Tokenizer, or a decode table and its file")
        self._hf, self.table, self.path = hf, table, path

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        table, hf = _cached_table(path.read_bytes())  # hf: None when the cached table served
        return cls(hf, table=table, path=path)

    @property
    def hf(self) -> _HFTokenizer:
        """The full `tokenizers` tokenizer, parsed on first use where a table serves decoding."""
        if self._hf is None:
            self._hf = _hf_tokenizer(Path(self.path).read_text(encoding="utf-8"))
        return self._hf

    def _id(self, token: str) -> int | None:
        if self.table is not None:
            tid = self.table.specials.get(token)
            if tid is not None or (token.startswith("<|") and token.endswith("|>")):
                return tid
        return self.hf.token_to_id(token)

    def _required(self, token: str) -> int:
        tid = self._id(token)
        if tid is None:
            raise ValueError(f"tokenizer has no {token} token; is this a Whisper tokenizer?")
        return tid

    # ---- special tokens -------------------------------------------------------------
    @cached_property
    def eot(self) -> int:
        return self._required("<|endoftext|>")

    @cached_property
    def sot(self) -> int:
        return self._required("<|startoftranscript|>")

    @cached_property
    def translate(self) -> int:
        return self._required("<|translate|>")

    @cached_property
    def transcribe(self) -> int:
        return self._required("<|transcribe|>")

    @cached_property
    def sot_lm(self) -> int:
        return self._required("<|startoflm|>")

    @cached_property
    def sot_prev(self) -> int:
        return self._required("<|startofprev|>")

    @cached_property
    def no_speech(self) -> int:
        tid = self._id("<|nospeech|>")
        return tid if tid is not None else self._required("<|nocaptions|>")

    @cached_property
    def no_timestamps(self) -> int:
        return self._required("<|notimestamps|>")

    @cached_property
    def timestamp_begin(self) -> int:
        """Id of <|0.00|>; timestamps step by SECONDS_PER_TIMESTAMP from here to the end of the vocab."""
        return self.no_timestamps + 1

    @cached_property
    def language_tokens(self) -> dict[str, int]:
        out = {}
        for code in LANGUAGES:
            tid = self._id(f"<|{code}|>")
            if tid is not None and self.sot < tid < self.translate:
                out[code] = tid
        return out

    @cached_property
    def multilingual(self) -> bool:
        # English-only checkpoints keep the language tokens but use the GPT-2 vocabulary,
        # where <|endoftext|> is 50256; multilingual vocabularies put it at 50257.
        return self.eot >= 50257

    # ---- sequences ------------------------------------------------------------------
    def sot_sequence(
        self, language: str | None = "en", task: str = "transcribe", timestamps: bool = False
    ) -> list[int]:
        """The decoder's forced start: <|sot|> [<|lang|> <|task|>] [<|notimestamps|>]."""
        seq = [self.sot]
        if self.multilingual:
            lang = language or "en"
            if lang not in self.language_tokens:
                raise ValueError(f"unknown language {lang!r}; known: {sorted(self.language_tokens)}")
            if task not in TASKS:
                raise ValueError(f"unknown task {task!r}; expected one of {TASKS}")
            seq += [self.language_tokens[lang], self.transcribe if task == "transcribe" else self.translate]
        if not timestamps:
            seq.append(self.no_timestamps)
        return seq

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def _text(self, tokens: list[int]) -> str:
        if self.table is not None:
            return self.table.decode(tokens)
        return self.hf.decode(tokens, skip_special_tokens=False)

    def decode(self, tokens: list[int]) -> str:
        """Text of the ordinary tokens; special and timestamp tokens are dropped."""
        return self._text([t for t in tokens if t < self.eot])

    def decode_with_timestamps(self, tokens: list[int]) -> str:
        """Text with timestamp tokens rendered as <|1.08|>."""
        parts: list[str] = []
        run: list[int] = []
        for t in tokens:
            if t >= self.timestamp_begin:
                parts.append(self._text(run) if run else "")
                run = []
                parts.append(f"<|{(t - self.timestamp_begin) * SECONDS_PER_TIMESTAMP:.2f}|>")
            elif t < self.eot:
                run.append(t)
        if run:
            parts.append(self._text(run))
        return "".join(parts)

    @cached_property
    def vocab_size(self) -> int:
        if self.table is not None:
            return self.table.vocab_size
        return self.hf.get_vocab_size(with_added_tokens=True)

    def same_base_vocabulary(self, other: Tokenizer) -> bool:
        """Whether both give every base-vocabulary id the same token."""
        if self.table is not None and other.table is not None:
            return self.table.blob == other.table.blob and self.table.offsets == other.table.offsets
        return self.hf.get_vocab(with_added_tokens=False) == other.hf.get_vocab(with_added_tokens=False)
