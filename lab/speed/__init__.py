"""The one speed command, ``python -m lab.speed MODE`` (:mod:`.__main__`): ``study`` (:mod:`.study`) and
``synthetic`` (:mod:`.synthetic`, the study on random sentences) run fairseq-train and fairseq-generate, their
records and tables in :mod:`.records`; ``profile`` (:mod:`.profile`) builds the models in process (:mod:`.model`)."""
