"""Backend-specific code, one folder per backend, below `specasr.runtime`: `cpu` (matrix-product
forms, TorchScript layer steps, the row-invariance probe, the fused C draft step, the encoder's
heap workspace) and `cuda` (the fixed-shape pass the device loop captures); `process` owns the
process-wide tricks (heap policy, collector, quick exit, private torch switches), each named
and switchable (`process.TRICKS`). Nothing here imports the layers above it; the runtime
chooses a form once at load and passes it in."""
