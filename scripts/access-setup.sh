#!/usr/bin/env bash
# Set up who may do what, from the permission model (amlhpc/core/catalog/permissions.toml): the CI
# identities with their GitHub federated credentials and roles, the custom roles, two Pulumi
# state containers per environment (state-<env> for its stack, state-<env>-experiments for its
# experiments') and the environments' resource groups (the access program, amlhpc/infra/access),
# then the GitHub environments that use them.
#
#   scripts/access-setup.sh preview|up [-- extra pulumi arguments]
#   scripts/access-setup.sh github [--apply] -- --repository OWNER/NAME --reviewers team:SLUG [--passphrases DIR]
#
# Run by a platform administrator (Owner of the subscription) once, and again whenever the
# model's CI rights or custom roles change; nobody grants CI rights by hand. The program's
# own state lives in ACCESS_BACKEND_URL (default: a file backend in .pulumi-state/access),
# under the stack `access` (config: amlhpc/infra/access/Pulumi.access.yaml; docs/deploying.md says
# which keys). `github` prints the gh commands (environments limited to main, prod's
# reviewers, the environment-level variables and, with --passphrases DIR, the passphrase
# secrets: DIR/<env>.txt and DIR/<env>-experiments.txt to the <env> environment, only
# DIR/<env>-experiments.txt to teardown-<env>); --apply runs them with the gh CLI.
#
# Exit status: 0 done, 2 bad usage or input, 127 a CLI is missing, else pulumi's or gh's.
set -euo pipefail
cd "$(dirname "$0")/.."

STACK=access

die() {  # message [fix] [status]
  printf 'access-setup: %s\n' "$1" >&2
  [[ -n ${2:-} ]] && printf '  fix: %s\n' "$2" >&2
  exit "${3:-2}"
}

(( $# >= 1 )) || die "usage: scripts/access-setup.sh preview|up|github [...]" "e.g. scripts/access-setup.sh up"
action=$1
shift
[[ ${1:-} == "--" ]] && shift

[[ -x .venv/bin/python ]] || die "the project's virtual environment (.venv) is missing" "make bootstrap"

case $action in
  preview|up)
    command -v pulumi >/dev/null 2>&1 || die "the Pulumi CLI is not installed" \
      "curl -fsSL https://get.pulumi.com | sh, then open a new shell" 127
    if [[ -z ${PULUMI_CONFIG_PASSPHRASE+set} && -z ${PULUMI_CONFIG_PASSPHRASE_FILE:-} ]]; then
      die "no passphrase for the access stack's secrets" "export PULUMI_CONFIG_PASSPHRASE=... (its own, not an environment's)"
    fi
    export PULUMI_BACKEND_URL=${ACCESS_BACKEND_URL:-file://$PWD/.pulumi-state/access}
    export PULUMI_SKIP_UPDATE_CHECK=true
    [[ $PULUMI_BACKEND_URL == file://* ]] && mkdir -p "${PULUMI_BACKEND_URL#file://}"
    pulumi -C amlhpc/infra/access stack select --create --secrets-provider passphrase "$STACK"
    pulumi -C amlhpc/infra/access "$action" --stack "$STACK" "$@"
    ;;
  github)
    apply=0
    if [[ ${1:-} == --apply ]]; then apply=1; shift; fi
    [[ ${1:-} == "--" ]] && shift
    command -v pulumi >/dev/null 2>&1 || die "the Pulumi CLI is not installed" "see docs/deploying.md, Tools" 127
    export PULUMI_BACKEND_URL=${ACCESS_BACKEND_URL:-file://$PWD/.pulumi-state/access}
    outputs=$(mktemp)
    trap 'rm -f "$outputs"' EXIT
    pulumi -C amlhpc/infra/access stack output github --json --stack "$STACK" > "$outputs"
    commands=$(.venv/bin/python -m amlhpc.infra.access.github --outputs "$outputs" "$@")
    if (( apply )); then
      command -v gh >/dev/null 2>&1 || die "the GitHub CLI (gh) is not installed" "https://cli.github.com, then gh auth login" 127
      while IFS= read -r line; do
        printf 'access-setup: %s\n' "${line%%--body *}" >&2  # variable values are ids, but keep the log short
        bash -c "$line"
      done <<< "$commands"
    else
      printf '%s\n' "$commands"
    fi
    ;;
  *) die "unknown action '$action'" "use preview, up or github" ;;
esac
