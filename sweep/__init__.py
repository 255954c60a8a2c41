"""The shape sweep: engines measured over shapes (decode step time against batch size, prefill
tokens/s against prompt length) into a JSON file that `python -m search report` draws. A
measurement tool the search uses, run as `python -m search sweep`; see `search.sweep_command`.
"""
