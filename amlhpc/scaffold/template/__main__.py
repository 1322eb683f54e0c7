"""This project's Pulumi program is aml-hpc's, from the installed tool: upgrading aml-hpc
upgrades it. `aml-hpc infra preview|up|down STACK` runs Pulumi with the Python aml-hpc is
installed in; the stacks are the Pulumi.<stack>.yaml files beside this one."""

from amlhpc.infra.engine import run

run()
