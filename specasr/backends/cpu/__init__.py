"""The CPU backend: matrix-product forms (`linear`, `bf16`), layers scripted as one TorchScript
function each (`scripted`), the row-invariance probe behind an int8 target's exact speculation
(`invariant`), an int8 draft's one-token step as one C call (`fused`, `draft_step.cpp`) and the
encoder's heap workspace (`heap`)."""
