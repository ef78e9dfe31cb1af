"""End-to-end check of the whole pipeline: the CPU smoke run (``make smoke``)."""
