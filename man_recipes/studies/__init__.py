"""Stage 4, studies: every family against the Transformer over seeds, run by run, with one record
per run and the table rebuilt from the records (``scripts/reproduce.sh``)."""
