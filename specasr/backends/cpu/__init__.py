"""The CPU backend: matrix-product forms (`linear`, `bf16`), layers scripted as one TorchScript
function each (`scripted`), the row-invariance probe behind an int8 target's exact speculation
(`invariant`), an int8 draft's one-token step as one C call (`fused`, `draft_step.cpp`) and the
encoder's heap workspace (`heap`)."""


def set_threads(n: int) -> None:
    """Runs the CPU work on `n` threads: torch's intra-op pool, and the fused C draft step's
    OpenMP threads (capped at `fused.MAX_THREADS`), which that step reads from torch when a
    draft is loaded, so call this before `load_pair` (`WhisperModel(cpu_threads=n)`, the CLI's
    `--threads`). Without a call both keep torch's default (the machine's cores)."""
    if not (isinstance(n, int) and n >= 1):
        raise ValueError(f"threads must be a whole number >= 1, got {n!r}")
    import torch  # here, not at import: `specasr.backends.cpu.heap` is imported without torch

    torch.set_num_threads(n)
