"""Reproduction recipes: data preparation, configs, launching, scoring and result tables.

Nothing here is imported by the fairseq plugin itself (``man_fairseq/__init__.py`` only imports
``models/`` and ``criterions/``), so the recipes add no start-up cost to fairseq-train.
"""
