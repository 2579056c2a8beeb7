"""Multilingual training audio from Debian packages: real recorded speech plus espeak-ng.

    specasr distill corpus OUT --source asterisk:fr --source fillets:cs --source espeak:de …

Sources (each a Debian package set; `SOURCES` names them):

- `asterisk:LANG` (en, es, fr, it, ru): the Asterisk PBX prompts, one professional speaker
  per language, 8 kHz telephone recordings (`asterisk-core-sounds-LANG-wav`) with their
  transcripts (`asterisk-core-sounds-LANG`, core-sounds-LANG.txt.gz).
- `fillets:LANG` (cs, nl): the voiced dialogue of the game Fish Fillets (`fillets-ng-data-LANG`),
  several actors, with the texts in `fillets-ng-data`'s script/LEVEL/dialogs_LANG.lua.
- `espeak:LANG` (any language espeak-ng speaks and fillets has text for: bg, cs, de, en, eo,
  es, fr, it, nl, pl, ru, sl, sv): the fillets texts of that language, voiced by espeak-ng
  with a random variant, rate and pitch.

**Held out by source, never by window.** Each utterance belongs to a group: an asterisk
prompt, a fillets level, an espeak voice variant plus the level of its text. A group is
held out when a stable hash of (source, group) falls below `holdout`; espeak's variant
`HELD_OUT_VARIANT` is always held out. Held-out utterances only ever go into
`OUT/heldout/`, training ones into `OUT/train/`, so a draft trained on `OUT/train` has
never heard a held-out prompt, level or voice.

Windows (16 kHz mono wav) pack a source's utterances in a seeded order, with 0.2–1.0 s
pauses, up to `max_seconds`; a fifth hold a single utterance. Per window, seeded: gain,
speed perturbation (±10%, which moves pitch too), a synthetic room reverb, and white or
brown noise at 10–40 dB SNR. `OUT/SPLIT/corpus.jsonl` has one line per window: {"id",
"path", "source", "language", "texts", "seconds"}; the label stage takes each window's
language from it (`window_languages`). A corpus is reproducible from its sources, seed and
the installed packages. Resumable: a window already listed is kept.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from specasr.recipes.tts_corpus import coloured, mix_at_snr

RATE = 16000
ASTERISK = Path("/usr/share/asterisk/sounds")
ASTERISK_DOC = Path("/usr/share/doc")
ASTERISK_VOICES = {
    "en": "en_US_f_Allison",
    "es": "es_MX_f_Allison",
    "fr": "fr_CA_f_June",
    "it": "it_IT_m_Carlo",
    "ru": "ru_RU_f_IvrvoiceRU",
}
FILLETS = Path("/usr/share/games/fillets-ng")
FILLETS_VOICED = ("cs", "nl")
ESPEAK_VARIANTS = ("", "m1", "m2", "m3", "m4", "f1", "f2", "f4", "klatt", "Andy", "Linda", "Steph")
HELD_OUT_VARIANT = "f3"  # never used for training audio
_DIALOG = re.compile(r'dialogId\("([^"]+)"[^\n]*\)\s*\n\s*dialogStr\("((?:[^"\\]|\\.)*)"\)')
_DIALOG_EN = re.compile(
    r'dialogId\("([^"]+)",\s*"[^"]*",\s*"((?:[^"\\]|\\.)*)"\)'
)  # English: the id's own text


@dataclass(frozen=True)
class Utterance:
    audio: Path | None  # a recording, or None: espeak-ng speaks `text`
    text: str
    group: str  # the hold-out unit within its source


@dataclass(frozen=True)
class SpeechCorpusOptions:
    sources: tuple[str, ...] = ("asterisk:en",)
    windows: int = 60  # at most this many windows per source and split
    max_seconds: float = 24.0  # keeps non-Latin labels well under the 200-token loop cut
    holdout: float = 0.15  # share of groups held out
    seed: int = 0
    noise_share: float = 0.3
    reverb_share: float = 0.2
    speed_share: float = 0.3

    def __post_init__(self) -> None:
        for s in self.sources:
            parse_source(s)


def parse_source(source: str) -> tuple[str, str]:
    kind, _, lang = source.partition(":")
    if kind == "asterisk" and lang in ASTERISK_VOICES:
        return kind, lang
    if kind == "fillets" and lang in FILLETS_VOICED:
        return kind, lang
    if kind == "espeak" and re.fullmatch(r"[a-z]{2}(_[A-Z]{2})?", lang or ""):
        return kind, lang
    raise ValueError(
        f"unknown source {source!r}: asterisk:{{{','.join(ASTERISK_VOICES)}}}, "
        f"fillets:{{{','.join(FILLETS_VOICED)}}} or espeak:LANG"
    )


def missing_packages(sources: tuple[str, ...]) -> list[str]:
    """Debian packages the sources need that are not installed."""
    out = []
    for s in sources:
        kind, lang = parse_source(s)
        if kind == "asterisk":
            if not (ASTERISK / ASTERISK_VOICES[lang]).is_dir():
                out.append(f"asterisk-core-sounds-{lang}-wav")
            if not _asterisk_doc(lang).is_file():
                out.append(f"asterisk-core-sounds-{lang}")
        else:
            if not (FILLETS / "script").is_dir():
                out.append("fillets-ng-data")
            if kind == "fillets" and not any((FILLETS / "sound").glob(f"*/{lang}")):
                out.append(f"fillets-ng-data-{lang}")
            if kind == "espeak" and shutil.which("espeak-ng") is None:
                out.append("espeak-ng")
    return sorted(set(out))


def _asterisk_doc(lang: str) -> Path:
    return ASTERISK_DOC / f"asterisk-core-sounds-{lang}" / f"core-sounds-{lang}.txt.gz"


def asterisk_utterances(lang: str) -> list[Utterance]:
    """Prompts with a spoken transcript (bracketed notes such as "[beep]" are not speech)."""
    voice = ASTERISK / ASTERISK_VOICES[lang]
    out = []
    with gzip.open(_asterisk_doc(lang), "rt", encoding="utf-8", errors="replace") as f:
        for line in f:
            name, sep, text = line.partition(":")
            text = re.sub(r"\[[^\]]*\]", " ", text).strip()
            if not sep or name.startswith(";") or not re.search(r"\w", text):
                continue
            path = voice / f"{name.strip()}.wav"
            if path.is_file():
                out.append(Utterance(path, re.sub(r"\s+", " ", text), name.strip()))
    return out


def fillets_texts(lang: str, root: Path | None = None) -> dict[str, tuple[str, str]]:
    """Dialogue id -> (level, text) from script/LEVEL/dialogs_LANG.lua."""
    root, out = root or FILLETS, {}
    for f in sorted((root / "script").glob(f"*/dialogs_{lang}.lua")):
        pattern = _DIALOG_EN if lang == "en" else _DIALOG
        for did, text in pattern.findall(f.read_text(encoding="utf-8", errors="replace")):
            text = re.sub(r"\s+", " ", text.replace('\\"', '"')).strip()
            if re.search(r"\w", text):
                out[did] = (f.parent.name, text)
    return out


def fillets_utterances(lang: str, root: Path | None = None) -> list[Utterance]:
    root = root or FILLETS
    texts = fillets_texts(lang, root)
    out = []
    for path in sorted((root / "sound").glob(f"*/{lang}/*.ogg")):
        if path.stem in texts:
            level, text = texts[path.stem]
            out.append(Utterance(path, text, level))
    return out


def espeak_utterances(lang: str, root: Path | None = None) -> list[Utterance]:
    """Fillets texts of `lang` for espeak-ng; the group is the text's level (the voice
    variant is drawn later, per window)."""
    return [Utterance(None, text, level) for _, (level, text) in sorted(fillets_texts(lang, root).items())]


def utterances(source: str) -> list[Utterance]:
    kind, lang = parse_source(source)
    return {"asterisk": asterisk_utterances, "fillets": fillets_utterances, "espeak": espeak_utterances}[
        kind
    ](lang)


def held_out(source: str, group: str, share: float) -> bool:
    """Stable across runs and machines (not Python's salted hash)."""
    h = hashlib.sha1(f"{source}\x00{group}".encode()).digest()
    return int.from_bytes(h[:4], "big") / 2**32 < share


# ---- audio ---------------------------------------------------------------------------------
def _espeak(text: str, lang: str, variant: str, rng: random.Random, tmp: Path) -> np.ndarray:
    from specasr.audio import load_audio

    out, txt = tmp / "u.wav", tmp / "u.txt"
    txt.write_text(text, encoding="utf-8")
    voice = lang + (f"+{variant}" if variant else "")
    cmd = ["espeak-ng", "-v", voice, "-s", str(rng.randint(130, 190)), "-p", str(rng.randint(30, 70))]
    subprocess.run([*cmd, "-f", str(txt), "-w", str(out)], check=True, capture_output=True, timeout=120)
    return load_audio(out)


def _reverb(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A synthetic room: exponentially decaying noise, RT60 0.15–0.6 s, mixed with the dry
    signal (direct-to-reverberant ratio 0–10 dB)."""
    rt60 = rng.uniform(0.15, 0.6)
    t = np.arange(int(rt60 * RATE)) / RATE
    ir = rng.standard_normal(len(t)) * np.exp(-6.9 * t / rt60)
    ir = ir / (np.sqrt(np.sum(ir**2)) + 1e-9)
    n = 1 << (len(x) + len(ir) - 1).bit_length()  # linear convolution by FFT
    wet = np.fft.irfft(np.fft.rfft(x, n) * np.fft.rfft(ir, n), n)[: len(x)].astype(np.float32)
    drr = 10 ** (rng.uniform(0, 10) / 20)
    return (drr * x + wet) / (drr + 1)


def _speed(x: np.ndarray, factor: float) -> np.ndarray:
    import soxr

    return soxr.resample(x, RATE * factor, RATE).astype(np.float32)


def render_window(parts: list[np.ndarray], seed: int, opts: SpeechCorpusOptions) -> np.ndarray:
    """Utterances -> one augmented window (float32, 16 kHz, ≤ opts.max_seconds)."""
    rng = np.random.default_rng(seed)
    pieces = [np.zeros(int(rng.uniform(0.0, 1.0) * RATE), np.float32)]
    for p in parts:
        peak = float(np.abs(p).max()) or 1.0
        pieces += [p / peak * rng.uniform(0.3, 0.9), np.zeros(int(rng.uniform(0.2, 1.0) * RATE), np.float32)]
    x = np.concatenate(pieces).astype(np.float32)
    if rng.random() < opts.speed_share:
        x = _speed(x, rng.uniform(0.9, 1.1))
    if rng.random() < opts.reverb_share:
        x = _reverb(x, rng)
    x = x[: int(opts.max_seconds * RATE)]
    if rng.random() < opts.noise_share:
        snr = rng.uniform(10, 40)
        white = rng.standard_normal(len(x)).astype(np.float32)
        x = mix_at_snr(x, coloured(white, "white" if rng.random() < 0.5 else "brown"), snr)
    return np.clip(x, -1, 1).astype(np.float32)


def plan_windows(utts: list[Utterance], seconds: list[float], rng: random.Random, opts) -> list[list[int]]:
    """Utterance indices per window, in a seeded order, each window within max_seconds."""
    order = list(range(len(utts)))
    rng.shuffle(order)
    windows, cur, total = [], [], 0.0
    single = rng.random() < 0.2
    for i in order:
        gap_budget = 1.0 * (len(cur) + 1) + 1.0
        if cur and (single or total + seconds[i] + gap_budget > opts.max_seconds):
            windows.append(cur)
            cur, total, single = [], 0.0, rng.random() < 0.2
        if seconds[i] + 2.0 > opts.max_seconds:  # too long for any window: left out
            continue
        cur.append(i)
        total += seconds[i]
    if cur:
        windows.append(cur)
    return windows[: opts.windows]


def _duration(u: Utterance) -> float:
    import soundfile as sf

    if u.audio is not None:
        try:
            return sf.info(str(u.audio)).duration
        except (RuntimeError, OSError):  # unreadable: planned as empty, reported when loaded
            return 0.0
    return len(u.text.split()) / 2.5 + 0.5  # espeak at ~150 words per minute


def make_speech_corpus(out_dir: str | Path, opts: SpeechCorpusOptions, progress=None) -> Path:
    """Writes OUT/train and OUT/heldout windows for every source (resumable)."""
    import soundfile as sf

    from specasr.audio import AudioError, load_audio

    if missing := missing_packages(opts.sources):
        raise RuntimeError("these sources need Debian packages: apt-get install " + " ".join(missing))
    out = Path(out_dir)
    for source in opts.sources:
        kind, lang = parse_source(source)
        utts = utterances(source)
        if not utts:
            raise RuntimeError(f"{source}: no utterances found")
        tag = source.replace(":", "-")
        for split in ("train", "heldout"):
            mine = [u for u in utts if held_out(source, u.group, opts.holdout) == (split == "heldout")]
            rng = random.Random(f"{opts.seed}:{source}:{split}")
            plan = plan_windows(mine, [_duration(u) for u in mine], rng, opts)
            folder = out / split / tag
            folder.mkdir(parents=True, exist_ok=True)
            manifest = out / split / "corpus.jsonl"
            done = {r["id"] for r in read_manifest(out / split)}
            with manifest.open("a") as log, tempfile.TemporaryDirectory(prefix="specasr-corpus-") as tmp:
                for w, idx in enumerate(plan):
                    wid = f"{tag}-{w:05d}"
                    if wid in done:
                        continue
                    wrng = random.Random(f"{opts.seed}:{wid}")
                    if kind == "espeak":
                        variant = HELD_OUT_VARIANT if split == "heldout" else wrng.choice(ESPEAK_VARIANTS)
                        parts = [_espeak(mine[i].text, lang, variant, wrng, Path(tmp)) for i in idx]
                    else:
                        parts, kept = [], []
                        for i in idx:
                            try:
                                parts.append(load_audio(mine[i].audio))
                                kept.append(i)
                            except AudioError as e:  # a broken file in the package: reported, skipped
                                print(f"skipping {e}", file=sys.stderr)
                        if not parts:
                            continue
                        idx = kept
                    samples = render_window(parts, wrng.randrange(2**31), opts)
                    path = folder / f"{wid}.wav"
                    part = path.with_name(path.name + ".part")  # never picked up half-written
                    sf.write(part, samples, RATE, subtype="PCM_16", format="WAV")
                    part.replace(path)
                    record = {
                        "id": wid,
                        "path": str(path.relative_to(out / split)),
                        "source": source,
                        "language": lang.split("_")[0],
                        "texts": [mine[i].text for i in idx],
                        "seconds": round(len(samples) / RATE, 2),
                    }
                    log.write(json.dumps(record, ensure_ascii=False) + "\n")
                    log.flush()
                    if progress:
                        progress(1)
    return out


def read_manifest(split: str | Path) -> list[dict]:
    """The records of split/corpus.jsonl (none when it is absent), in order."""
    manifest = Path(split) / "corpus.jsonl"
    if not manifest.is_file():
        return []
    return [json.loads(x) for x in manifest.read_text(encoding="utf-8").splitlines() if x.strip()]


def window_languages(audio_dir: str | Path) -> dict[str, str]:
    """Relative path -> language, from audio_dir/corpus.jsonl when it names languages."""
    return {r["path"]: r["language"] for r in read_manifest(audio_dir) if r.get("language") and r.get("path")}
