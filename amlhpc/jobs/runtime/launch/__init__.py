"""The in-job launcher and what supervises the training it starts: in-job restart, the hang
watchdog, completion checks and the warm standby. `python -m amlhpc.jobs.runtime.launch`.
"""
