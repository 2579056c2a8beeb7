"""Shared fixtures. Keep these generic: other test modules build on them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import pytest

DATA = Path(__file__).parent / "data"

# The backoff γ policy's cost curves are measured on the machine that decodes, on first use
# (`specasr.decode.calibration`). Tests use the stored tables instead, so what a test sees does
# not depend on the machine or on what an earlier run left in the cache; test_calibration.py
# turns measurement on where it tests it. Set here, so CLI runs in child processes inherit it.
os.environ["SPECASR_CALIBRATE"] = "off"

# The interpreted-Triton tests need TRITON_INTERPRET=1 before triton is imported: they run in
# child processes started by test_kernels_triton.py, which set it, and are not collected here.
collect_ignore = [] if os.environ.get("TRITON_INTERPRET") == "1" else ["test_kernels_interpreted.py"]


# Test tiers: `pytest -m "not slow"` runs what needs no real weights (tiny random models,
# kernels on CPU, filters, writers, options) in under two minutes. A test is `slow` when it
# loads packaged weights: through one of these fixtures (directly or through another
# fixture), or, marked by hand, in its body or through the CLI (`--model tiny.en`); when it
# runs external tools (espeak-ng, Chromium, the Triton interpreter); or when it is listed in
# SLOW_WITHOUT_WEIGHTS below.
REAL_WEIGHT_FIXTURES = frozenset(
    {
        "base_pair",  # conftest: the packaged `base`
        "tiny_en_pair",  # conftest: the packaged `tiny.en`
        "all_modes",  # test_eval: `specasr eval --model tiny.en`
        "tiny_hf_dir",  # test_models: tiny.en converted to a Hugging Face directory
    }
)


# Tests without real weights that still take 5-35 s each on a 2-core CPU: checks that the
# statistical distribution tests have the power to reject a wrong verifier (the distribution
# tests themselves stay in the fast tier), and the lab's A/B harnesses. Listed here as
# "file::test" (every parametrisation).
SLOW_WITHOUT_WEIGHTS = frozenset(
    {
        "test_kernels_torch.py::test_distribution_test_rejects_a_wrong_verifier",
        "test_decoding_tiny.py::test_sampling_check_rejects_an_always_accepting_verifier",
        # the lab's A/B harnesses (benchmarks/tests): every configuration decoded side by side
        "test_half_weights_bench.py::test_the_ab_table_reports_every_configuration_with_the_same_tokens",
        "test_draft_rows_bench.py::test_the_ab_table_reports_both_strategies_with_the_same_passes",
    }
)


def pytest_collection_modifyitems(config, items):
    slow = pytest.mark.slow
    for item in items:
        by_name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}" in SLOW_WITHOUT_WEIGHTS
        if by_name or REAL_WEIGHT_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(slow)


@pytest.fixture()
def heap_calls(monkeypatch):
    """Records the heap policy's mallopt settings and trims (`specasr.backends.process`)
    instead of making them; the policy starts unset."""
    from specasr.backends import process

    seen: list = []
    monkeypatch.setattr(process, "_set", lambda *a: seen.append(("set", *a)))
    monkeypatch.setattr(process, "malloc_trim", lambda: seen.append(("trim",)))
    monkeypatch.setattr(process, "_lean", False)
    monkeypatch.setattr(process, "_depth", 0)
    return seen


class Clip(NamedTuple):
    id: str
    path: Path  # 16 kHz mono PCM_16 wav
    text: str  # reference transcript, lower case, no punctuation


@pytest.fixture(scope="session")
def librivox() -> list[Clip]:
    """The LibriVox clips in tests/data, with references from transcripts.txt."""
    clips = []
    for line in (DATA / "transcripts.txt").read_text().splitlines():
        if not line.strip():
            continue
        clip_id, text = line.split(maxsplit=1)
        clips.append(Clip(clip_id, DATA / f"{clip_id}.wav", text))
    assert clips and all(c.path.is_file() for c in clips), "tests/data is incomplete"
    return clips


@pytest.fixture(scope="session")
def base_pair():
    """The packaged `base` target with no draft (attach drafts with `with_self_draft`)."""
    from specasr.models.loading import load_pair

    return load_pair("base", None, device="cpu")


@pytest.fixture(scope="session")
def tiny_en_pair():
    from specasr.models.loading import load_pair

    return load_pair("tiny.en", None, device="cpu")


@pytest.fixture(scope="session")
def base_shipped(base_pair):
    """`base_pair` with the packaged distilled draft, int8 where this build has it: what
    `load_pair("base")` returns, without loading `base` a second time."""
    from dataclasses import replace

    from specasr.backends.cpu.linear import int8_available
    from specasr.models.draft import load_draft
    from specasr.models.loading import packaged_draft

    draft = load_draft(packaged_draft("base"), base_pair.target, base_pair.dtype, base_pair.device)
    int8 = int8_available()
    if int8:
        draft.quantize_int8()
    name = "packaged:base (int8)" if int8 else "packaged:base"
    return replace(base_pair, draft=draft, shared_encoder=True, draft_name=name)


def with_self_draft(pair, k: int):
    """The same target with `self:k` as its draft (no weights copied)."""
    from dataclasses import replace

    from specasr.models.loading import self_draft

    return replace(pair, draft=self_draft(pair.target, k), shared_encoder=True, draft_name=f"self:{k}")


@pytest.fixture(scope="session")
def librivox_mels(librivox):
    """Log-Mel windows [1, 80, 3000] of each LibriVox clip, keyed by clip id."""
    from specasr.audio import load_audio
    from specasr.features import log_mel_window

    return {c.id: log_mel_window(load_audio(c.path), n_mels=80) for c in librivox}


@pytest.fixture(scope="session")
def base_ar(base_pair, librivox, librivox_mels):
    """`base`'s autoregressive greedy result per LibriVox clip, keyed by clip id: the exactness
    reference that several modules compare speculative decodes with (decoded once per session)."""
    from specasr.decode.loop import decode
    from specasr.options import DecodeOptions

    ar = DecodeOptions(mode="autoregressive")
    return {c.id: decode(base_pair, librivox_mels[c.id], ar)[0] for c in librivox}


@pytest.fixture
def one_clip_data(tmp_path) -> Path:
    """A data directory like tests/data with only its first clip and transcript line (for
    research tools that build the long-form fixture from `--data`)."""
    import shutil

    data = tmp_path / "data"
    data.mkdir()
    line = next(x for x in open("tests/data/transcripts.txt") if x.strip())
    shutil.copy(f"tests/data/{line.split()[0]}.wav", data)
    (data / "transcripts.txt").write_text(line)
    return data


def write_corpus(root: Path, rows) -> Path:
    """A corpus split like `specasr distill corpus` writes, at root: each (wav path, source,
    text or None) row copied under root/audio and listed in root/corpus.jsonl, language "en"."""
    import json
    import shutil

    (root / "audio").mkdir(parents=True)
    with open(root / "corpus.jsonl", "w") as f:
        for i, (wav, source, text) in enumerate(rows):
            wav = Path(wav)
            shutil.copy(wav, root / "audio" / wav.name)
            rec = {"id": f"w-{i}", "path": f"audio/{wav.name}", "source": source, "language": "en"}
            f.write(json.dumps(rec | ({"texts": [text]} if text is not None else {})) + "\n")
    return root


@pytest.fixture
def spy(monkeypatch):
    """Records (options, prompt) of every decode_states call of the long-form loop."""
    from specasr.longform import engine as engine_module

    calls = []
    real = engine_module.decode_states

    def record(pair, target_states, draft_states, options, prompt=None, stats=None):
        calls.append((options, prompt))
        return real(pair, target_states, draft_states, options, prompt, stats)

    monkeypatch.setattr(engine_module, "decode_states", record)
    return calls
