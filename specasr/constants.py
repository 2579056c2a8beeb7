"""Constants of Whisper and of specasr, each defined once. Imports nothing, so every module
(including `specasr.kernels`) can use it without pulling in torch or a model."""

SAMPLE_RATE = 16000  # Hz: every input is resampled to this
HOP_LENGTH = 160  # samples per log-Mel frame (10 ms)
CHUNK_LENGTH = 30  # seconds per decoder window
N_SAMPLES = CHUNK_LENGTH * SAMPLE_RATE  # 480000 samples per window
N_FRAMES = N_SAMPLES // HOP_LENGTH  # 3000 log-Mel frames per window
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100
SECONDS_PER_TIMESTAMP = 0.02  # one timestamp token step (<|0.00|>, <|0.02|>, …): 2 log-Mel frames
N_TEXT_CTX = 448  # Whisper's decoder positions

MODES = ("autoregressive", "baseline", "exact", "sigmoid")  # decoding modes
VERIFY_MODES = MODES[1:]  # the modes that run a verifier (`specasr.kernels.verify`)
BACKENDS = ("auto", "triton", "torch")  # verifier backends

# target compute types (`models.loading.resolve_compute_type`): int8 quantises the decoder's
# per-token products, bfloat16 runs the once-per-window ones in bf16 (`cpu.bf16`), auto picks
COMPUTE_TYPES = ("auto", "float32", "int8", "bfloat16", "int8_bfloat16")


def int8_decoder(compute_type: str) -> bool:
    """Whether a resolved compute type quantises the target decoder (int8, int8_bfloat16)."""
    return compute_type.startswith("int8")


def int8_window(compute_type: str) -> bool:
    """Whether a resolved compute type runs the once-per-window products (the encoder's, the
    cross-attention K/V projections) in int8, each row (frame) quantised on its own (int8, as
    CTranslate2's int8 quantises them; int8_bfloat16 runs them in bf16)."""
    return compute_type == "int8"


def bf16_window(compute_type: str) -> bool:
    """Whether a resolved compute type runs the once-per-window products in bf16: the
    encoder's and the cross-attention K/V projections (bfloat16, int8_bfloat16)."""
    return compute_type.endswith("bfloat16")


# a distilled draft file's optional metadata: its measured cost curve (`decode.gamma.SpeculationCost`)
COST_KEYS = ("cost_c", "cost_verify")
