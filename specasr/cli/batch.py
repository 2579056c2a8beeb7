"""One CLI batch of files, transcribed one by one: output names, locks, skips, provenance and
the per-file error report (a failure is counted, never raised). Shared by the local run
(`cli.transcribe`), the Ray actors (`cli.transcribe_ray`) and the client of a server
(`transcribe --server`, `cli.remote`): each file's transcript is made by the local pair or by
the server, and everything around it is this one loop. Importing it loads no torch."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import click

from specasr.cli.common import check_loaded
from specasr.writers import SubtitleOptions, segment_line

if TYPE_CHECKING:
    from specasr.results import Segment, TranscriptionInfo
    from specasr.stats import DecodeStats


def output_stems(files: list[str]) -> list[str]:
    """Output name per input, stable and unique for a set of inputs in any order: its path
    relative to the common parent folder of all the inputs, without its audio suffix
    (A/x.wav, B/x.wav -> "A/x", "B/x"; one input -> its stem). Inputs that would still share
    a name (x.wav and x.mp3 in one folder) keep their suffix ("x.wav", "x.mp3"); any left
    after that get a short hash of their absolute path."""
    if not files:
        return []
    absolute = [os.path.abspath(f) for f in files]
    root = os.path.commonpath([os.path.dirname(a) for a in absolute])
    relative = [Path(os.path.relpath(a, root)) for a in absolute]
    stems = [r.with_name(r.stem).as_posix() for r in relative]
    counts = Counter(stems)
    stems = [r.as_posix() if counts[s] > 1 else s for r, s in zip(relative, stems)]
    counts = Counter(stems)
    return [
        s if counts[s] == 1 else f"{s}-{hashlib.sha1(a.encode()).hexdigest()[:8]}"
        for s, a in zip(stems, absolute)
    ]


class _NoBar:
    """The progress bar where none is shown (stderr is not a terminal): tqdm, which would draw
    nothing either, is not imported, a few ms of a `--server` client's start."""

    n = 0

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def update(self, n: float = 1) -> None:
        self.n += n

    @staticmethod
    def write(line: str, file=None) -> None:
        print(line, file=file or sys.stdout)


def progress(quiet: bool, **bar):
    """tqdm's bar (arguments `bar`) on a terminal; `_NoBar` when `quiet`."""
    if quiet:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(**bar)


class Transcript(Protocol):
    """One input's transcript, as the batch prints and writes it."""

    duration: float  # seconds of audio
    stats: DecodeStats  # speculative statistics of the whole input

    def render(self, fmt: str, source: dict | None) -> str:
        """The text of one format (`writers.render`); json records `source` when given."""

    def plain(self) -> str:
        """One line: the segments' texts, stripped and joined by spaces."""


class Remote(Protocol):
    """Where a batch sends its files instead of decoding them here (`cli.remote.Client`)."""

    def transcribe(self, path: str) -> Transcript: ...


class LocalTranscript:
    """A transcript decoded in this process: its segments, rendered on demand."""

    def __init__(self, segments: list[Segment], info: TranscriptionInfo, subtitles: SubtitleOptions | None):
        self.segments, self.info, self.subtitles = segments, info, subtitles
        self.duration, self.stats = info.duration, info.stats

    def render(self, fmt: str, source: dict | None) -> str:
        from specasr import writers

        return writers.render(fmt, self.segments, self.info, source, self.subtitles)

    def plain(self) -> str:
        return " ".join(s.text.strip() for s in self.segments)


class Batch:
    """Transcribes files one by one, with the local `pair` or, given `remote`, on a server;
    failures are reported and counted, never raised."""

    def __init__(
        self, pair, options, formats, output_dir, skip_existing, stats, n_inputs, remote: Remote | None = None
    ) -> None:
        from specasr.stats import DecodeStats

        self.pair, self.remote, self.options, self.formats = pair, remote, options, formats
        self.output_dir, self.skip_existing, self.show_stats = output_dir, skip_existing, stats
        self.n_inputs = n_inputs
        self.done = self.failed = self.skipped = 0
        self.audio_s = 0.0
        self.total = DecodeStats()
        self.quiet = not sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.started = time.time()
        self.subtitles: SubtitleOptions | None = None  # srt/vtt layout of word-timed segments
        self.verbose = False  # print each segment to stderr as it comes (`--verbose`)

    def run(self, files: list[str]) -> None:
        if self.remote is None:  # what only the loaded model can tell: exit 2, once, before any file
            dec = self.options.decode
            check_loaded(self.pair, dec.mode, dec.language, dec.task)
        stems = output_stems(files)
        self.clean_temps(stems)
        busy = []
        with progress(self.quiet, total=len(files), desc="files", unit="file", position=0) as bar:
            for path, stem in zip(files, stems):
                if not self.one(path, stem, single=self.n_inputs == 1, last_try=False):
                    busy.append((path, stem))  # another run is writing it: try again at the end
                else:
                    bar.update(1)
            for path, stem in busy:
                self.one(path, stem, single=False, last_try=True)
                bar.update(1)

    def clean_temps(self, stems: list[str]) -> None:
        """Removes temporary files left in the output folders by runs that were killed."""
        from specasr import writers

        if self.output_dir is not None:
            for folder in sorted({(Path(self.output_dir) / stem).parent for stem in stems}):
                writers.clean_stale_temps(folder)

    def _check_existing(self, path: str, stem: str, source: dict) -> str | None:
        """What to do with `stem`'s existing outputs: "skip", "refuse" (another run wrote
        them from another source during this run; reported), or None (transcribe)."""
        from specasr import writers

        paths = writers.output_paths(stem, self.output_dir, self.formats)
        record = writers.provenance(stem, self.output_dir)
        present = {fmt: record.get(fmt) for fmt, p in paths.items() if p.is_file()}
        ours = [fmt for fmt, r in present.items() if r is not None and r["source"] == source]
        if len(ours) == len(paths) and (
            self.skip_existing or all(present[f].get("written_at", 0) >= self.started for f in ours)
        ):
            return "skip"  # with --skip-existing, or another run just made them from this same file
        for fmt, r in present.items():
            if r is None or r["source"] == source:
                continue
            other = r["source"].get("path", "another file")
            if r.get("written_at", 0) >= self.started:
                click.echo(
                    f"error: {paths[fmt]} was written from {other} by another run while this one "
                    f"ran; not overwritten with {path} (use another --output-dir)",
                    err=True,
                )
                return "refuse"
            click.echo(f"warning: overwriting {paths[fmt]}, made from {other}, with {path}", err=True)
        return None

    def one(self, path: str, stem: str, single: bool, last_try: bool = True) -> bool:
        """Transcribes one input; False when its output name is locked by another run and
        this is not the last try (the caller comes back to it)."""
        from specasr import writers

        if self.output_dir is None:
            self._transcribe(path, stem, single, None)
            return True
        try:
            with writers.output_lock(stem, self.output_dir):
                try:
                    source = writers.source_record(path)
                except OSError as e:
                    self._failed(path, e)
                    return True
                action = self._check_existing(path, stem, source)
                if action == "skip":
                    self.skipped += 1
                elif action == "refuse":
                    self.failed += 1
                else:
                    self._transcribe(path, stem, single, source)
        except writers.OutputBusyError as e:
            if not last_try:
                return False
            self._failed(path, e)
        except OSError as e:  # the lock could not be made (an unwritable subfolder …)
            self._failed(path, e)
        return True

    def _failed(self, path: str, e: Exception) -> None:
        self.failed += 1
        click.echo(f"error: {path}: {e}" if str(path) not in str(e) else f"error: {e}", err=True)

    def _transcribe(self, path: str, stem: str, single: bool, source: dict | None) -> None:
        from specasr import writers

        try:
            result = self._decode(path) if self.remote is None else self.remote.transcribe(path)
            if self.verbose and self.remote is not None:  # a server answers with the whole file
                for (start, end), text in zip(result.spans, result.texts):
                    click.echo(segment_line(start, end, text), err=True)
            if self.output_dir is not None:
                texts = {fmt: result.render(fmt, source) for fmt in self.formats}
                writers.write_rendered(texts, stem, self.output_dir, source)
            elif single:
                if source is None and self.formats[0] == "json":
                    source = writers.source_record(path)
                click.echo(result.render(self.formats[0], source), nl=False)
            else:
                click.echo(f"{path}: {result.plain()}")
        except Exception as e:  # a batch reports the file and goes on, whatever went wrong
            self._failed(path, e)
            return
        self.done += 1
        self.audio_s += result.duration
        self.total = self.total.merge(result.stats)
        if self.show_stats:
            click.echo(f"[{path}] {result.stats.summary()}", err=True)

    def _decode(self, path: str) -> LocalTranscript:
        """`path` transcribed with the local pair, its progress shown in seconds of audio."""
        from specasr.transcription import transcribe

        segments, info = transcribe(path, self.pair, self.options)
        if info.language_detected:  # (detection ran on the first window, before any segment)
            said = f"detected language {info.language} (probability {info.language_probability:.2f})"
            click.echo(f"{Path(path).name}: {said}", err=True)
        done = []
        with progress(
            self.quiet, total=round(info.duration, 1), desc=Path(path).name, unit="s", leave=False
        ) as bar:
            for seg in segments:
                done.append(seg)
                if self.verbose:  # above the progress bar, on stderr: stdout holds the transcript
                    bar.write(segment_line(seg.start, seg.end, seg.text), file=sys.stderr)
                bar.update(round(seg.end, 1) - bar.n)
        return LocalTranscript(done, info, self.subtitles)

    def summary(self) -> str:
        wall = time.perf_counter() - self.t0
        rtf = wall / self.audio_s if self.audio_s else 0.0
        t = self.total
        alpha = "n/a"
        if t.proposed:
            alpha = f"{t.token_acceptance:.3f} (accepted/proposed {t.acceptance_rate:.3f})"
        return (
            f"files: {self.done} done, {self.skipped} skipped, {self.failed} failed"
            + (
                f", {left} not started"
                if (left := self.n_inputs - self.done - self.skipped - self.failed)
                else ""
            )
            + "; "
            f"audio {self.audio_s:.1f} s, wall {wall:.1f} s, real-time factor {rtf:.3f}, "
            f"α̂ per token {alpha}"
        )
