"""End-to-end checks of the whole pipeline: the CPU smoke run (``make smoke``) and the GPU node's
check (``scripts/gpu_check.sh``)."""
