"""Pieces the command-line front ends share: model loading and the common options."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from pathlib import Path

import click

from specasr.backends.process import start_up
from specasr.constants import COMPUTE_TYPES, bf16_window, int8_decoder
from specasr.models.presets import PRESETS
from specasr.options import GAMMA_LIMIT, GAMMA_POLICIES, DecodeOptions

DEFAULTS = DecodeOptions()

_DEVICE = re.compile(r"^(cpu|mps|(cuda|xpu)(:\d+)?)$")
# English-only Whisper checkpoints use the GPT-2 vocabulary plus Whisper's special tokens
_ENGLISH_ONLY_VOCAB = 51864
PRESET_NAMES = tuple(PRESETS)  # models/presets.py imports no torch


def compute_type_option(help: str):
    """`--compute-type`, one of COMPUTE_TYPES (default float32): the CLI's and the research tools'."""
    return click.option(
        "--compute-type", type=click.Choice(COMPUTE_TYPES), default="float32", show_default=True, help=help
    )


def check_device(device: str | None) -> None:
    """A usage error (exit 2) for a --device that is malformed or not available here.
    The syntax is checked without torch; availability (cuda, mps, xpu) imports it."""
    if device is None or device == "cpu":
        return
    if not _DEVICE.match(device):
        raise click.BadParameter(
            f"{device!r}: expected cpu, cuda, cuda:N, mps, xpu or xpu:N", param_hint="'--device'"
        )
    import torch

    kind, _, index = device.partition(":")
    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise click.BadParameter(f"{device!r}: no CUDA device is available here", param_hint="'--device'")
        if index and int(index) >= count:
            raise click.BadParameter(
                f"{device!r}: this machine has {count} CUDA device(s) (cuda:0 … cuda:{count - 1})",
                param_hint="'--device'",
            )
    elif kind == "mps" and not torch.backends.mps.is_available():
        raise click.BadParameter(f"{device!r}: MPS is not available here", param_hint="'--device'")
    elif kind == "xpu" and not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        raise click.BadParameter(f"{device!r}: no XPU device is available here", param_hint="'--device'")


def _vocab_size_of_dir(path: Path) -> int | None:
    """A model directory's vocabulary size from its small files (config.json, else the
    tokenizer's <|endoftext|> id or a CTranslate2 vocabulary file); None when unknown."""
    try:
        config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
        if isinstance(config.get("vocab_size"), int):
            return config["vocab_size"]
        if (path / "tokenizer.json").is_file():
            tokenizer = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
            for token in tokenizer.get("added_tokens", []):
                if token.get("content") == "<|endoftext|>":  # 50256 English-only, 50257 multilingual
                    return _ENGLISH_ONLY_VOCAB if token["id"] == 50256 else _ENGLISH_ONLY_VOCAB + 1
        if (path / "vocabulary.json").is_file():
            return len(json.loads((path / "vocabulary.json").read_text(encoding="utf-8")))
        if (path / "vocabulary.txt").is_file():
            return len((path / "vocabulary.txt").read_text(encoding="utf-8").splitlines())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return None


def english_only(model: str) -> bool | None:
    """Whether `--model` names an English-only checkpoint, without loading it: a local
    directory by its vocabulary size (51864 English-only, 51865+ multilingual), any other
    spec (presets, hub ids) by its name ending in ".en". None when it cannot be told."""
    path = Path(model).expanduser()
    if model not in PRESET_NAMES and path.is_dir():
        vocab = _vocab_size_of_dir(path)
        if vocab is not None:
            return vocab == _ENGLISH_ONLY_VOCAB
    if model.rstrip("/").lower().endswith(".en"):
        return True
    return None


# files that hold weights, not a model: --model takes a preset, a hub id or a directory
_WEIGHT_FILES = (".bin", ".pt", ".pth", ".safetensors", ".ckpt", ".onnx", ".gguf")


def check_model_spec(model: str) -> None:
    """Usage errors (exit 2) in a --model that need nothing loaded: a path that is not there,
    a file where a directory is meant, a weights file's name."""
    path = Path(model).expanduser()
    if path.is_file():
        raise click.BadParameter(
            f"{model!r} is a file; give the model's directory (HF or CTranslate2), a preset or a hub id",
            param_hint="'--model'",
        )
    if path.exists():
        return
    if model.startswith((".", "/", "~")):
        raise click.BadParameter(f"{model!r}: no such directory", param_hint="'--model'")
    if model.lower().endswith(_WEIGHT_FILES):
        raise click.BadParameter(
            f"{model!r}: no such file, and --model takes a model directory, a preset "
            f"({', '.join(PRESET_NAMES)}) or a Hugging Face hub id",
            param_hint="'--model'",
        )


def decoder_layers(model: str) -> int | None:
    """The target's decoder layers, where known without loading it: a preset's, or a Hugging
    Face directory's config.json; None otherwise (a hub id, a CTranslate2 directory)."""
    if model in PRESETS:
        return PRESETS[model].decoder_layers
    config = Path(model).expanduser() / "config.json"
    try:
        layers = json.loads(config.read_text()).get("decoder_layers")
    except (OSError, ValueError, AttributeError):
        return None
    return layers if isinstance(layers, int) else None


def check_model_options(model: str, draft: str | None, mode: str, language: str | None, task: str) -> None:
    """Usage errors (exit 2) that need no model loaded: the draft a speculative mode needs,
    the language and task an English-only model can do. `language` None means auto."""
    from specasr.tokenizer import LANGUAGES  # no torch

    speculative = mode != "autoregressive"
    if speculative and draft == "none":
        raise click.UsageError(
            f"--mode {mode} needs a draft model; drop --draft none or use --mode autoregressive"
        )
    check_model_spec(model)
    path_like = model.startswith((".", "/", "~"))
    not_preset = model not in PRESET_NAMES and (
        Path(model).expanduser().exists() or ("/" in model and not path_like)
    )
    if speculative and draft in (None, "default") and not_preset:
        raise click.UsageError(
            f"--model {model} has no default draft: name one with --draft (self:K, a distilled draft "
            "file or a model) or use --mode autoregressive"
        )
    if draft and draft.startswith("self:"):
        k = draft.removeprefix("self:")
        if not k.isdigit():
            raise click.BadParameter(
                f"{draft!r}: expected self:K with K a number of layers", param_hint="'--draft'"
            )
        layers = decoder_layers(model)
        if int(k) < 1 or (layers is not None and int(k) > layers):
            bound = "K >= 1" if layers is None else f"1 <= K <= {layers} (the target's decoder layers)"
            raise click.BadParameter(f"{draft!r}: self:K needs {bound}", param_hint="'--draft'")
    if language is not None and language not in LANGUAGES:
        raise click.BadParameter(
            f"unknown language {language!r}; use a Whisper language code (en, de, fr, …) or 'auto'",
            param_hint="'--language'",
        )
    if english_only(model):
        if task == "translate":
            raise click.UsageError(
                f"--model {model} is English-only and cannot translate; use a multilingual model"
            )
        if language not in (None, "en"):
            raise click.UsageError(
                f"--model {model} is English-only: --language {language} is not available; "
                "use a multilingual model (e.g. base)"
            )


def check_compute_type(compute_type: str, modes) -> None:
    """A usage error (exit 2), before any model loads, for a bf16 compute type on a CPU
    without native bf16 (`specasr.backends.cpu.bf16.available`), and for --compute-type int8 with a
    speculative mode on a machine whose BLAS gives no row-invariant attention: there an int8
    target decodes autoregressively only (`specasr.decode.loop.INT8_SPECULATIVE`). The checks
    import torch, so they run as the process's start-up (`start_up`)."""
    modes = [modes] if isinstance(modes, str) else list(modes)
    spec = [m for m in modes if m != "autoregressive"]
    needs_bf16, needs_rows = bf16_window(compute_type), int8_decoder(compute_type) and bool(spec)
    if not (needs_bf16 or needs_rows):
        return
    with start_up():  # once: the first start-up of a process freezes what it leaves
        native = invariant = True
        if needs_bf16:
            from specasr.backends.cpu import bf16

            native = bf16.available()
        if needs_rows:
            from specasr.backends.cpu.invariant import fixed_rows

            invariant = fixed_rows() > 0
    if not native:
        raise click.UsageError(
            f"--compute-type {compute_type} needs a CPU with native bf16 dot products "
            "(AVX512_BF16 or AMX), and this one has none: emulated bf16 is slower than fp32. "
            "Use --compute-type int8 or float32"
        )
    if not invariant:
        raise click.UsageError(
            f"--compute-type {compute_type} decodes with --mode autoregressive only here, "
            f"not {', '.join(spec)}: "
            "this machine's BLAS computes attention rows differently in a k-token verify pass "
            "and a one-token step. Use --compute-type float32 (or auto) for speculative modes"
        )


def check_loaded(pair, mode: str, language: str | None, task: str) -> None:
    """The checks of `check_model_options` again against the loaded model (exit 2 once,
    not an error per file), for what could not be told before loading."""
    tok = pair.tokenizer
    if mode != "autoregressive" and pair.draft is None:
        raise click.UsageError(
            f"--mode {mode} needs a draft model; name one with --draft or use --mode autoregressive"
        )
    if not tok.multilingual:
        if task == "translate":
            raise click.UsageError(f"{pair.target_name} is English-only and cannot translate")
        if language not in (None, "en"):
            raise click.UsageError(
                f"{pair.target_name} is English-only: --language {language} is not available"
            )
    elif language is not None and language not in tok.language_tokens:
        raise click.BadParameter(
            f"{pair.target_name} has no language {language!r}", param_hint="'--language'"
        )


def prepare_output_dir(output_dir: str) -> None:
    """Creates --output-dir and checks that files can be made in it; a usage error (exit 2)
    naming the directory and the reason otherwise."""
    path = Path(output_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".specasr-probe.", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        reason = e.strerror or str(e)
        raise click.BadParameter(
            f"cannot write to {output_dir!r}: {reason}" + (f" ({e.filename})" if e.filename else ""),
            param_hint="'--output-dir'",
        ) from e


def load_models(
    model: str,
    draft: str | None,
    mode: str,
    device: str | None,
    dtype: str | None,
    compute_type: str = "float32",
    half_weights: bool | None = None,
    threads: int = 0,
):
    """The ModelPair for `--model/--draft/--device/--dtype/--compute-type`; no draft for
    target-only decoding; half_weights: `load_pair`'s (True for long-lived processes);
    threads: `--threads` (0: torch's default), set before the load, where the fused draft step
    reads it, and kept by the threads the process starts later (a server's engine thread).
    A --device that cannot be used is a usage error (exit 2); a model that cannot be loaded
    is reported on stderr and exits with status 1."""
    if threads:
        from specasr.backends.cpu import set_threads

        set_threads(threads)
    try:
        with start_up():
            check_device(device)
            return pair_loader(model, draft, mode, device, dtype, compute_type, half_weights)()
    except (ValueError, FileNotFoundError, OSError) as e:
        click.echo(f"error: cannot load model: {e}", err=True)
        sys.exit(1)


def pair_loader(
    model: str,
    draft: str | None,
    mode: str,
    device: str | None,
    dtype: str | None,
    compute_type: str = "float32",
    half_weights: bool | None = None,
):
    """`load_pair` bound to `--model/--draft/--device/--dtype/--compute-type` (no draft for
    target-only decoding) and `half_weights`, uncalled: Ray actors call it where they run."""
    from functools import partial

    from specasr.models.loading import load_pair

    want_draft = None if mode == "autoregressive" and draft in (None, "default") else (draft or "default")
    return partial(
        load_pair,
        model,
        want_draft,
        device=device,
        dtype=torch_dtype(dtype),
        compute_type=compute_type,
        half_weights=half_weights,
    )


DTYPES = ("fp32", "fp16", "bf16")  # `--dtype`'s names
dtype_option = click.option(
    "--dtype",
    type=click.Choice(DTYPES),
    default=None,
    help="Model dtype (default: fp32 on CPU, fp16 on CUDA, where fp16 can flip a near-tie of exact mode).",
)


def torch_dtype(name: str | None):
    """A `--dtype` name -> its torch dtype (None: the device's default, `load_pair`'s)."""
    import torch

    names = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    return None if name is None else names[name]


def ray_settings(address: str | None, workers: int | None, cpus: float | None, gpus: float | None):
    """`RayOptions` of `--ray` and the worker options; None without --ray. Usage errors
    (exit 2): a worker option without --ray, or --ray where Ray is not installed."""
    given = [
        n
        for n, v in (("--workers", workers), ("--cpus-per-worker", cpus), ("--gpus-per-worker", gpus))
        if v is not None
    ]
    if address is None:
        if given:
            raise click.UsageError(f"{', '.join(given)} go(es) with --ray")
        return None
    try:
        import ray.data  # noqa: F401
    except ImportError:
        raise click.UsageError("--ray needs Ray, an optional extra: pip install 'specasr[ray]'") from None
    from specasr.eval.ray_runner import RayOptions

    try:
        workers, cpus = 1 if workers is None else workers, 1.0 if cpus is None else cpus
        return RayOptions(address, workers, cpus, gpus or 0.0)
    except ValueError as e:
        raise click.UsageError(str(e)) from e


def _stack(*options):
    def apply(f):
        for option in reversed(options):
            f = option(f)
        return f

    return apply


threads_option = click.option(
    "--threads",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="CPU threads for the models (0: torch's default, the cores this process may use).",
)

model_options = _stack(
    click.option(
        "--model",
        default="base",
        show_default=True,
        help="Target: preset, HF hub id, HF or CTranslate2 directory.",
    ),
    click.option(
        "--draft",
        default="default",
        show_default=True,
        help="Draft: 'default' (the preset's), 'none', 'self:K' (first K target layers), or a model spec.",
    ),
    click.option("--device", default=None, help="cpu, cuda, cuda:1 … (default: cuda when available)."),
    dtype_option,
    compute_type_option(
        "The target's products. int8 (CPU): the decoder's, faster, a lossy model of its own; "
        "speculative modes give its own greedy tokens. bfloat16 (CPUs with AVX512_BF16 or AMX): "
        "the once-per-window products, faster per window, lossy; int8_bfloat16: both. "
        "auto: int8 for --mode autoregressive on AVX2/AVX-512 CPUs with fbgemm (int8_bfloat16 with "
        "native bf16), else float32.",
    ),
)

gamma_options = _stack(
    click.option(
        "--gamma",
        type=click.IntRange(1, GAMMA_LIMIT),
        default=DEFAULTS.gamma,
        show_default=True,
        help="Draft tokens per step (start value).",
    ),
    click.option(
        "--gamma-policy", type=click.Choice(GAMMA_POLICIES), default=DEFAULTS.gamma_policy, show_default=True
    ),
    click.option(
        "--draft-stop",
        type=click.FloatRange(0, 1, max_open=True),
        default=DEFAULTS.draft_stop,
        show_default=True,
        help="End a draft run at a proposal the draft gives probability below this (0: always γ). Exact.",
    ),
)

_RAY_ADDRESS = re.compile(r"^(local|auto|[a-z]+://\S+|[\w.\-\[\]]+:\d+)$")


class RayCommand(click.Command):
    """A command with `ray_options`: a bare `--ray` followed by something that is not a Ray
    address (local, auto, ray://…, HOST:PORT) means `--ray local`, so `transcribe --ray
    a.wav` transcribes a.wav on a local Ray instead of taking a.wav for the address."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        args = list(args)
        for i, arg in enumerate(args):
            if arg == "--":
                break
            if arg == "--ray" and i + 1 < len(args) and not args[i + 1].startswith("-"):
                if not _RAY_ADDRESS.match(args[i + 1]):
                    args.insert(i + 1, "local")
                break
        return super().parse_args(ctx, args)


ray_options = _stack(
    click.option(
        "--ray",
        "ray_address",
        is_flag=False,
        flag_value="local",
        default=None,
        metavar="[ADDRESS]",
        help="Run on Ray (specasr[ray]): alone or 'local' starts a local Ray; 'auto' or HOST:PORT "
        "joins a running cluster.",
    ),
    click.option("--workers", type=int, default=None, help="Ray: actors, each loads the models once [1]."),
    click.option(
        "--cpus-per-worker", type=float, default=None, help="Ray: CPUs (torch threads) per actor [1]."
    ),
    click.option(
        "--gpus-per-worker", type=float, default=None, help="Ray: GPUs per actor; > 0 runs on CUDA [0]."
    ),
)
