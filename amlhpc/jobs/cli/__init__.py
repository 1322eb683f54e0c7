"""The `python -m amlhpc.jobs` command line: thin commands that parse, call and print.
"""
