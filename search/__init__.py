"""The Optuna layer: search space, trial runner, study, selection, results log and CLI.

`python -m search run` is the main job behind `bash run.sh`; see `search.cli` for the commands.
"""
