"""`aml-hpc doctor`: what the first real deploy and submit need, checked one by one.

Each check says pass, fail, warn or skip, what it found, and the command that fixes it:
the Python and the stack file; the Azure sign-in and the subscription; the Pulumi CLI,
its state backend and secrets passphrase; the resource providers the stack's resources
need; the caller's roles for deploying the stack and for submitting to it; GPU quota for
each cluster's family in the stack's region; the stack's submitters. amlhpc/doctor/checks.py
decides, amlhpc/doctor/arm.py asks Azure Resource Manager, amlhpc/doctor/cli.py prints.
"""
