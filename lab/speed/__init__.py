"""The one speed command, ``python -m lab.speed MODE`` (:mod:`.__main__`): ``study`` (:mod:`.study`, tables:
:mod:`.records`), ``synthetic`` (:mod:`.synthetic`, :mod:`.workers`), ``profile`` (:mod:`.profile`); one
model builder (:mod:`.model`)."""
