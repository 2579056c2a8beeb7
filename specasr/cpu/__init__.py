"""The CPU fast path: lean decoder layers with a preallocated cache (`lean`), matrix-product
forms (`linear`), and layers scripted as one TorchScript function each (`scripted`)."""
