"""Backend-specific code, one folder per backend, below `specasr.runtime`: `cpu` (matrix-product
forms, TorchScript layer steps, the row-invariance probe, the fused C draft step, the process's
heap policy) and `cuda` (the fixed-shape pass the device loop captures). Nothing here imports
the layers above it; the runtime chooses a form once at load and passes it in."""
