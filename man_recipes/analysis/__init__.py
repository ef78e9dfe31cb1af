"""The analyses' library (the ``man-*`` analysis commands of :mod:`man_recipes.cli` parse their
arguments and call it): model and data loading, the calibration statistics and their plots."""
