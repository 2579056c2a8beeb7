"""The Gradio app: record or upload speech, pick a verifier mode, read the transcript with its
speculative-decoding statistics, and compare the mode with autoregressive decoding.

A thin front end: widgets -> `service.Controls` -> `service.run` / `service.compare` -> widgets.
The models load once (or come in preloaded) and every request shares them; a queue limits how
many decode at once. Errors reach the page as messages, never as tracebacks. Uploads and
recordings stay in Gradio's temporary directory (GRADIO_TEMP_DIR), and so do the transcript
files offered for download (`service.Downloads`): Gradio serves them from there without a copy,
and they go when the server stops. Live streaming is not offered: a transcript of a growing
prefix is not the final transcript.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import warnings
import weakref
from dataclasses import fields

import gradio as gr

from specasr.audio import AudioWarning
from specasr.options import DETECT_LANGUAGE, GAMMA_POLICIES, MAX_BEAMS, MODES, STRATEGIES

from .service import (
    PROMPT_CHARS,
    TOKEN_KINDS,
    AppOptions,
    Controls,
    Downloads,
    accepted_per_step,
    compare,
    load_input,
    run,
    token_spans,
    word_diff,
)

__all__ = ["build_app", "launch"]

log = logging.getLogger(__name__)
_DEFAULT = Controls()
_DOWNLOADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # app -> its Downloads, for `launch`
_GAMMA_MAX = _DEFAULT.options().decode.gamma_max
_INTRO = """# specasr: Whisper with speculative decoding
Record or upload speech, pick a verifier mode and **Transcribe**: the transcript shows which
tokens the draft proposed and the target accepted. **Compare** runs autoregressive decoding (the
target alone) and the chosen mode on the same audio, three times each, and shows the median
speedup. At temperature 0, `baseline` and `exact` give the target's greedy transcript token for
token; `sigmoid` is a lossy approximation. Each transcript downloads as txt, srt, vtt, tsv and json;
**Advanced** holds the prompts, VAD, the long-form strategy, word timestamps and the beam size."""


def _user_errors(handler):
    """Every failure becomes a gr.Error: its message on the page, the traceback only in the log."""

    @functools.wraps(handler)
    def wrapped(*args):
        try:
            return handler(*args)
        except gr.Error:
            raise
        except ValueError as e:  # InputError, and option values the library refuses
            raise gr.Error(str(e), print_exception=False) from None
        except Exception as e:
            log.exception("request failed")
            raise gr.Error(f"Transcription failed ({type(e).__name__}): {e}", print_exception=False) from None

    return wrapped


_KIND_COLOURS = dict(zip(TOKEN_KINDS.values(), ["#4caf50", "#f44336", "#2196f3", "#9e9e9e"]))


def _load(path, options: AppOptions):
    """`load_input`, with its warnings (audio scaled down) shown on the page."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", AudioWarning)
        samples = load_input(path, options)
    for w in caught:
        if issubclass(w.category, AudioWarning):
            gr.Warning(str(w.message).split(": ", 1)[-1])
    return samples


def _accepted_plot(result):
    """`accepted_per_step` as the BarPlot's frame (x as text, so every count shows a bar)."""
    import pandas as pd

    rows = accepted_per_step(result)
    frame = pd.DataFrame(
        {"draft tokens accepted": [str(n) for n, _ in rows], "verify steps": [c for _, c in rows]}
    )
    return gr.BarPlot(frame, sort=[str(n) for n, _ in rows] or None, visible=bool(rows))


def _control_widgets(pair) -> dict[str, gr.components.Component]:
    """One widget per `Controls` field, keyed by the field's name."""
    tok = pair.tokenizer
    languages = [DETECT_LANGUAGE, *sorted(tok.language_tokens)] if tok.multilingual else ["en"]
    with gr.Accordion("Decoding", open=True):
        widgets = {
            "mode": gr.Radio(list(MODES), value=_DEFAULT.mode, label="Mode", elem_id="mode"),
        }
        with gr.Row():
            widgets["gamma_policy"] = gr.Radio(
                list(GAMMA_POLICIES), value=_DEFAULT.gamma_policy, label="γ policy"
            )
            widgets["gamma"] = gr.Slider(
                1, _GAMMA_MAX, value=_DEFAULT.gamma, step=1, label="γ (fixed value, or start)"
            )
            widgets["draft_stop"] = gr.Slider(
                0.0,
                0.95,
                value=_DEFAULT.draft_stop,
                step=0.05,
                label="Draft stop: q(d) below ends a run (0 = off)",
            )
        widgets["temperature"] = gr.Slider(
            0.0, 1.0, value=_DEFAULT.temperature, step=0.05, label="Temperature (0 = greedy)"
        )
        with gr.Row():
            widgets["sigmoid_alpha"] = gr.Number(_DEFAULT.sigmoid_alpha, label="sigmoid α")
            widgets["sigmoid_beta"] = gr.Number(_DEFAULT.sigmoid_beta, label="sigmoid β")
        with gr.Row():
            value = _DEFAULT.language if _DEFAULT.language in languages else languages[0]
            widgets["language"] = gr.Dropdown(languages, value=value, label="Language")
            task_choices = ["transcribe", "translate"] if tok.multilingual else ["transcribe"]
            widgets["task"] = gr.Radio(task_choices, value=_DEFAULT.task, label="Task")
        with gr.Row():
            widgets["timestamps"] = gr.Checkbox(value=_DEFAULT.timestamps, label="Segment timestamps")
            widgets["seed"] = gr.Number(_DEFAULT.seed, precision=0, label="Seed (sampling)")
    with gr.Accordion("Advanced", open=False):
        with gr.Row():
            widgets["strategy"] = gr.Radio(
                list(STRATEGIES), value=_DEFAULT.strategy, label="Long-form strategy", elem_id="strategy"
            )
            widgets["vad"] = gr.Checkbox(value=_DEFAULT.vad, label="Voice activity detection (Silero)")
            widgets["word_timestamps"] = gr.Checkbox(
                value=_DEFAULT.word_timestamps, label="Word timestamps (in the downloads)"
            )
        widgets["initial_prompt"] = gr.Textbox(
            _DEFAULT.initial_prompt,
            label="Initial prompt (text before the audio: style, spelling)",
            max_length=PROMPT_CHARS,
            elem_id="initial_prompt",
        )
        widgets["hotwords"] = gr.Textbox(
            _DEFAULT.hotwords,
            label="Hotwords (prompt every window: names, terms)",
            max_length=PROMPT_CHARS,
            elem_id="hotwords",
        )
        widgets["beam_size"] = gr.Slider(
            1,
            MAX_BEAMS,
            value=_DEFAULT.beam_size,
            step=1,
            label="Beam size (temperature 0; 1 = greedy)",
            elem_id="beam_size",
        )
    return widgets


def build_app(pair=None, options: AppOptions = AppOptions()) -> gr.Blocks:  # noqa: B008 (frozen)
    """The app over `pair` (a ModelPair; None loads the packaged default preset and its draft).

    Launch it with `launch`, which also applies the upload limit of `options`.
    """
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"  # gradio reads it at each telemetry call
    if pair is None:
        from specasr.models.loading import load_pair

        pair = load_pair("base")

    def on_transcribe(audio, *values):
        controls = Controls(*values)
        controls.checked(pair.tokenizer)  # bad values are refused before the audio is decoded
        result = run(pair, _load(audio, options), controls)
        stats = "| statistic | value |\n|---|---|\n" + "\n".join(
            f"| {k} | {v} |" for k, v in result.stats_rows()
        )
        return (
            result.transcript(controls.timestamps),
            stats,
            token_spans(pair, result),
            _accepted_plot(result),
            downloads.write(result, audio),
        )

    def on_compare(audio, *values):
        controls = Controls(*values)
        controls.checked(pair.tokenizer)
        comparison = compare(pair, _load(audio, options), controls)
        left, right = word_diff(comparison.reference.text, comparison.candidate.text)
        return (
            gr.HighlightedText(left, label="autoregressive (target only)"),
            gr.HighlightedText(right, label=comparison.candidate.mode),
            comparison.summary(),
        )

    draft = f", draft `{pair.draft_name}`" if pair.draft is not None else ", no draft (autoregressive only)"
    with gr.Blocks(title="specasr", analytics_enabled=False, delete_cache=(3600, 3600)) as demo:
        os.makedirs(demo.GRADIO_CACHE, exist_ok=True)
        downloads = _DOWNLOADS[demo] = Downloads(demo.GRADIO_CACHE)
        gr.Markdown(_INTRO + f"\n\nModels: target `{pair.target_name}`{draft}, on {pair.device}.")
        with gr.Row():
            with gr.Column():
                audio = gr.Audio(
                    sources=["microphone", "upload"],
                    type="filepath",
                    label=f"Speech (up to {options.max_seconds:g} s, {options.max_upload_mb:g} MB)",
                    elem_id="audio",
                )
                widgets = _control_widgets(pair)
                with gr.Row():
                    transcribe_button = gr.Button("Transcribe", variant="primary", elem_id="transcribe")
                    compare_button = gr.Button("Compare with autoregressive", elem_id="compare")
            with gr.Column():
                transcript = gr.Textbox(label="Transcript", lines=6, buttons=["copy"], elem_id="transcript")
                files = gr.File(label="Download the transcript", file_count="multiple", elem_id="downloads")
                stats = gr.Markdown(elem_id="stats")
                speculation = gr.HighlightedText(
                    label="Where each token came from",
                    color_map=_KIND_COLOURS,
                    show_legend=True,
                    elem_id="speculation",
                )
                accepted = gr.BarPlot(
                    x="draft tokens accepted",
                    y="verify steps",
                    label="Draft tokens accepted per verify step",
                    height=220,
                    elem_id="accepted",
                )
                reference = gr.HighlightedText(
                    label="autoregressive (target only)", color_map={"differs": "red"}, elem_id="reference"
                )
                candidate = gr.HighlightedText(
                    label="chosen mode", color_map={"differs": "red"}, elem_id="candidate"
                )
                speedup = gr.Markdown(elem_id="speedup")
        inputs = [audio, *(widgets[f.name] for f in fields(Controls))]
        shared = {"concurrency_id": "decode", "concurrency_limit": options.concurrency_limit}
        transcribe_button.click(
            _user_errors(on_transcribe),
            inputs,
            [transcript, stats, speculation, accepted, files],
            api_name="transcribe",
            **shared,
        )
        compare_button.click(
            _user_errors(on_compare), inputs, [reference, candidate, speedup], api_name="compare", **shared
        )
    demo.queue(max_size=options.max_queue)
    return demo


def launch(
    demo: gr.Blocks,
    options: AppOptions = AppOptions(),  # noqa: B008 (frozen)
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    share: bool = False,
    block: bool = True,
):
    """Serves `demo` on host:port (loopback unless told otherwise; a public share link only
    when asked). block=False returns at once, the server running in a thread. The app's
    download files go when the server stops (`demo.close()`, Ctrl-C)."""
    downloads = _DOWNLOADS.get(demo)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        try:
            yield
        finally:
            if downloads is not None:
                downloads.close()

    return demo.launch(
        server_name=host,
        server_port=port,
        share=share,
        max_file_size=int(options.max_upload_mb * 2**20),
        prevent_thread_lock=not block,
        show_error=False,
        ssr_mode=False,
        mcp_server=False,
        run_history=False,  # it keeps requests in the browser, or sends them to a Hub bucket
        quiet=not block,
        app_kwargs={"lifespan": lifespan},
    )
