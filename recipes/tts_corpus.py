"""Synthetic English training audio from Debian's TTS voices, for draft distillation.

    specasr distill corpus OUT_DIR --windows 1500

Each output is a 16 kHz mono wav of up to 30 s (`w000123.wav`), plus `corpus.jsonl` with
one line per window: {"id", "texts", "voices", "seconds"}. Windows are packed from 1–6
utterances with pauses; a fifth hold a single short utterance (like a clip padded to
30 s). Voices, rate, pitch, gain and noise are drawn per utterance from a seeded RNG, so a
corpus is reproducible from (--seed, --windows) and the installed packages.

Needs (Debian): espeak-ng, flite, festival festvox-kallpc16k festvox-us-slt-hts, fortunes.
Text: Debian's `fortunes` quotes, cleaned to plain sentences; any quote sharing a 5-word
run with a held-out transcript (`--exclude`, e.g. the LibriVox fixtures) is dropped.

Transcripts here are what the voices were asked to say; distillation does not use them
(it trains on the target's own greedy transcripts), they are for inspection only.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

RATE = 16000
WINDOW_S = 30.0
FORTUNES = Path("/usr/share/games/fortunes")
ESPEAK_VOICES = (
    "en-us",
    "en-gb",
    "en-gb-scotland",
    "en-gb-x-rp",
    "en-gb-x-gbclan",
    "en-029",
    "en-us-nyc",
    "en-gb-x-gbcwmd",
)
ESPEAK_VARIANTS = (
    "",
    "m1",
    "m2",
    "m3",
    "m4",
    "m5",
    "m6",
    "m7",
    "f1",
    "f2",
    "f3",
    "f4",
    "f5",
    "klatt",
    "klatt2",
    "klatt3",
    "Annie",
    "Andy",
    "Michael",
    "Linda",
    "Steph",
    "Gene",
    "Alex",
    "Rob",
    "Belinda",
    "David",
    "Ed",
)
FLITE_VOICES = ("kal", "kal16", "awb", "rms", "slt")
FESTIVAL_VOICES = ("kal_diphone", "cmu_us_slt_arctic_hts")
_WORD = re.compile(r"[a-z']+")


@dataclass(frozen=True)
class CorpusOptions:
    windows: int = 1500  # how many 30 s windows to write
    seed: int = 0
    workers: int = 2  # synthesis processes
    festival_share: float = 0.15  # fraction of utterances voiced by festival (slowest engine)
    flite_share: float = 0.35  # by flite; the rest by espeak-ng
    noise_share: float = 0.5  # windows with added noise (white or brown, 10–40 dB SNR)


def missing_tools(opts: CorpusOptions | None = None) -> list[str]:
    """Debian packages the synthesis needs (for `opts`' engine shares) that are not installed."""
    opts = opts or CorpusOptions()
    need = {"espeak-ng": "espeak-ng"}
    if opts.flite_share > 0:
        need["flite"] = "flite"
    if opts.festival_share > 0:
        need["text2wave"] = "festival festvox-kallpc16k festvox-us-slt-hts"
    out = [pkg for exe, pkg in need.items() if shutil.which(exe) is None]
    if not FORTUNES.is_dir():
        out.append("fortunes")
    return out


def _clean(quote: str) -> str | None:
    """A fortune as one plain spoken paragraph, or None when it is not prose."""
    lines = [ln.strip() for ln in quote.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith(("--", "-- ", "~", "\t"))]
    text = " ".join(lines)
    text = re.sub(r"\s+", " ", text).strip()
    if not text or not text.isascii() or re.search(r"[<>{}\[\]|\\_=#@*^~`]", text):
        return None
    n = len(text.split())
    if not 4 <= n <= 45 or sum(c.isalpha() for c in text) < 0.7 * len(text):
        return None
    return text


def _ngrams(text: str, n: int = 5) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def load_texts(exclude: list[str] = (), root: Path = FORTUNES) -> list[str]:
    """Cleaned fortunes (files of quotes separated by % lines under `root`), minus any
    sharing a 5-word run with an `exclude` text."""
    banned = set().union(*(_ngrams(t) for t in exclude)) if exclude else set()
    texts = []
    for f in sorted(Path(root).iterdir()):
        if f.suffix or not f.is_file():
            continue
        for quote in f.read_text(encoding="utf-8", errors="replace").split("\n%\n"):
            text = _clean(quote)
            if text and not (_ngrams(text) & banned):
                texts.append(text)
    return sorted(set(texts))


def _synth(text: str, rng: random.Random, shares: tuple[float, float], tmp: Path) -> tuple[np.ndarray, str]:
    """One utterance -> (float32 samples at 16 kHz, voice description). Writes through files:
    `espeak-ng --stdout` can emit WAV headers libsndfile rejects."""
    from specasr.audio import load_audio

    out, txt = tmp / "u.wav", tmp / "u.txt"
    txt.write_text(text)
    r = rng.random()
    if r < shares[0]:
        voice = rng.choice(FESTIVAL_VOICES)
        stretch = rng.uniform(0.85, 1.2)
        cmd = [
            "text2wave",
            "-eval",
            f"(voice_{voice})",
            "-eval",
            f"(Parameter.set 'Duration_Stretch {stretch:.2f})",
            "-o",
            str(out),
            str(txt),
        ]
        desc = f"festival:{voice}:x{stretch:.2f}"
    elif r < shares[0] + shares[1]:
        voice = rng.choice(FLITE_VOICES)
        stretch, f0 = rng.uniform(0.8, 1.25), rng.randint(80, 180)
        cmd = [
            "flite",
            "-voice",
            voice,
            "--setf",
            f"duration_stretch={stretch:.2f}",
            "--setf",
            f"int_f0_target_mean={f0}",
            "-f",
            str(txt),
            "-o",
            str(out),
        ]
        desc = f"flite:{voice}:x{stretch:.2f}:f0={f0}"
    else:
        variant = rng.choice(ESPEAK_VARIANTS)
        voice = rng.choice(ESPEAK_VOICES) + (f"+{variant}" if variant else "")
        speed, pitch = rng.randint(120, 210), rng.randint(25, 75)
        cmd = ["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch), "-f", str(txt), "-w", str(out)]
        desc = f"espeak-ng:{voice}:s{speed}:p{pitch}"
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    audio = load_audio(out)
    peak = float(np.abs(audio).max()) or 1.0
    return (audio / peak * rng.uniform(0.2, 0.9)).astype(np.float32), desc


def coloured(white: np.ndarray, kind: str) -> np.ndarray:
    """White noise as it is ("white"), or integrated and detrended to unit-variance brown noise."""
    if kind == "white":
        return white
    brown = np.cumsum(white)
    brown -= np.convolve(brown, np.ones(801) / 801, mode="same")  # remove the drift
    return (brown / (brown.std() + 1e-9)).astype(np.float32)


def mix_at_snr(x: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    """x plus unit-variance `noise` scaled to `snr_db` below x's power."""
    power = float(np.mean(x**2)) or 1e-6
    return x + noise * np.sqrt(power / 10 ** (snr_db / 10))


def _window(job: tuple[int, list[str], int, CorpusOptions, str]) -> dict:
    """Synthesises and writes one window; returns its corpus.jsonl record."""
    import soundfile as sf

    from specasr.audio import AudioError

    index, texts, seed, opts, out_dir = job
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    shares = (opts.festival_share, opts.flite_share)
    parts, used, voices = [], [], []
    total = rng.uniform(0.0, 1.5)
    parts.append(np.zeros(int(total * RATE), np.float32))
    with tempfile.TemporaryDirectory(prefix="specasr-tts-") as tmp:
        for text in texts:
            try:
                audio, desc = _synth(text, rng, shares, Path(tmp))
            except (subprocess.SubprocessError, OSError, ValueError, AudioError):
                # an engine crashed on this text (festival segfaults on some): espeak-ng instead
                audio, desc = _synth(text, rng, (0.0, 0.0), Path(tmp))
            if (total + len(audio) / RATE > WINDOW_S - 0.5) and used:
                break
            audio = audio[: int((WINDOW_S - 0.5 - total) * RATE)]
            gap = rng.uniform(0.15, 1.2)
            parts += [audio, np.zeros(int(gap * RATE), np.float32)]
            total += len(audio) / RATE + gap
            used.append(text)
            voices.append(desc)
    samples = np.concatenate(parts)[: int(WINDOW_S * RATE)]
    if nrng.random() < opts.noise_share:
        snr = nrng.uniform(10, 40)
        kind = "white" if nrng.random() < 0.5 else "brown"
        white = nrng.standard_normal(len(samples)).astype(np.float32)
        samples = mix_at_snr(samples, coloured(white, kind), snr)
    samples = np.clip(samples, -1, 1)
    path = Path(out_dir) / f"w{index:06d}.wav"
    tmp_path = path.with_name(path.name + ".part")  # not an audio suffix: never picked up half-written
    sf.write(tmp_path, samples, RATE, subtype="PCM_16", format="WAV")
    tmp_path.replace(path)
    return {"id": path.stem, "texts": used, "voices": voices, "seconds": round(len(samples) / RATE, 2)}


def make_corpus(out_dir: str | Path, opts: CorpusOptions, exclude: list[str] = (), progress=None) -> Path:
    """Writes `opts.windows` windows into out_dir (resumable: existing windows are kept)."""
    if missing := missing_tools(opts):
        raise RuntimeError("synthesis needs Debian packages: apt-get install " + " ".join(missing))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = load_texts(exclude)
    rng = random.Random(opts.seed)
    jobs = []
    for i in range(opts.windows):
        single = rng.random() < 0.2
        picks = rng.sample(texts, 1 if single else 6)
        jobs.append((i, picks, rng.randrange(2**31), opts, str(out)))
    manifest = out / "corpus.jsonl"
    done = set()
    if manifest.is_file():
        done = {json.loads(ln)["id"] for ln in manifest.read_text().splitlines() if ln.strip()}
    todo = [j for j in jobs if f"w{j[0]:06d}" not in done]
    with manifest.open("a") as log, ProcessPoolExecutor(opts.workers) as pool:
        for record in pool.map(_window, todo, chunksize=4):
            log.write(json.dumps(record) + "\n")
            log.flush()
            if progress:
                progress(1)
    return out
