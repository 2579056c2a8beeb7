"""The CPU fast path: lean decoder layers with a preallocated cache (`lean`), matrix-product
forms (`linear`), layers scripted as one TorchScript function each (`scripted`), the
row-invariance probe behind an int8 target's exact speculation (`invariant`) and the
process's memory policy (`heap`)."""
