"""The CPU speed paths, applied to a loaded model as a transform (transform.py): projection weights
in faster layouts (weight_layout.py), the layers' small ops in C (layer_kernels.py) and a decode
step in one C call (fused_decode.py). The C kernels themselves are pdserve/native/'s."""
