#!/usr/bin/env bash
# Preview, deploy or tear down one stack with the Pulumi CLI (behind `make preview|up|down`).
#
#   scripts/pulumi-stack.sh preview|up|down STACK [-- extra pulumi arguments]
#
# - State: PULUMI_BACKEND_URL, default a file backend in .pulumi-state/ (solo work). Teams
#   and CI share an Azure Blob backend: azblob://<container>?storage_account=<account>
#   (docs/deploying.md).
# - Secrets: the passphrase provider; set PULUMI_CONFIG_PASSPHRASE (or
#   PULUMI_CONFIG_PASSPHRASE_FILE). Losing it loses the stack's secrets.
# - preview and up run the policy pack (infra/policy/pack) and refresh from Azure first.
# - down refuses an environment stack unless CONFIRM=<stack name>, and then keeps
#   protected resources (dataset storage); experiment stacks (exp-*) go without asking and
#   are removed from the backend afterwards (`pulumi stack rm`, which also deletes the
#   local Pulumi.<stack>.yaml: commit that deletion).
#
# Exit status: 0 done, 2 bad usage or input, 127 the pulumi CLI is missing, else pulumi's.
set -euo pipefail
cd "$(dirname "$0")/.."

POLICY_PACK=infra/policy/pack
EXPERIMENT_PREFIX=exp-

die() {  # message [fix] [status]
  printf 'pulumi-stack: %s\n' "$1" >&2
  [[ -n ${2:-} ]] && printf '  fix: %s\n' "$2" >&2
  exit "${3:-2}"
}

usage() {
  die "usage: scripts/pulumi-stack.sh preview|up|down STACK [-- pulumi arguments]" \
      "e.g. make preview STACK=dev, make up STACK=exp-bert, make down STACK=exp-bert"
}

(( $# >= 2 )) || usage
action=$1
stack=$2
shift 2
[[ ${1:-} == "--" ]] && shift

case $action in
  preview|up|down) ;;
  *) die "unknown action '$action'" "use preview, up or down" ;;
esac

if [[ ! $stack =~ ^[a-z0-9][a-z0-9-]*$ ]]; then
  die "'$stack' is not a stack name of this project" "stack names are lowercase letters, digits and hyphens, e.g. dev or exp-bert"
fi
if [[ ! -f Pulumi.$stack.yaml ]]; then
  known=$(find . -maxdepth 1 -name 'Pulumi.*.yaml' | sed 's#^\./Pulumi\.##; s#\.yaml$##' | sort | paste -sd ' ' -)
  die "no stack file Pulumi.$stack.yaml" "stacks here: ${known:-none}; create an experiment with: make new-experiment NAME=<name> ENV=dev DAYS=7"
fi

kind=environment
[[ $stack == "$EXPERIMENT_PREFIX"* ]] && kind=experiment

if [[ $action == down && $kind == environment && ${CONFIRM:-} != "$stack" ]]; then
  die "refusing to destroy environment stack '$stack': it holds the workspace, registry and data access for everyone" \
      "if you really mean it: make down STACK=$stack CONFIRM=$stack (protected dataset storage is kept either way)"
fi

if ! command -v pulumi >/dev/null 2>&1; then
  die "the Pulumi CLI is not installed (no 'pulumi' on PATH)" \
      "install it: curl -fsSL https://get.pulumi.com | sh (Linux/macOS) or brew install pulumi/tap/pulumi, open a new shell, then check with: pulumi version" \
      127
fi

if [[ -z ${PULUMI_CONFIG_PASSPHRASE+set} && -z ${PULUMI_CONFIG_PASSPHRASE_FILE:-} ]]; then
  die "no passphrase for the stack's secrets" \
      "export PULUMI_CONFIG_PASSPHRASE=... (keep it in your password manager; the team shares one per backend) or PULUMI_CONFIG_PASSPHRASE_FILE=<path>"
fi

if [[ ! -x .venv/bin/python ]]; then
  die "the project's virtual environment (.venv) is missing; Pulumi runs the program in it" "make bootstrap"
fi

export PULUMI_BACKEND_URL=${PULUMI_BACKEND_URL:-file://$PWD/.pulumi-state}
export PULUMI_SKIP_UPDATE_CHECK=true
if [[ $PULUMI_BACKEND_URL == file://* ]]; then
  mkdir -p "${PULUMI_BACKEND_URL#file://}"
fi
printf 'pulumi-stack: %s %s (%s stack) on %s\n' "$action" "$stack" "$kind" "${PULUMI_BACKEND_URL%%\?*}" >&2

case $action in
  preview|up)
    pulumi stack select --create --secrets-provider passphrase "$stack"
    pulumi "$action" --stack "$stack" --refresh --policy-pack "$POLICY_PACK" "$@"
    ;;
  down)
    if ! err=$(pulumi stack select "$stack" 2>&1); then
      if grep -qi "no stack named" <<<"$err"; then
        printf 'pulumi-stack: stack %s is not deployed on this backend: nothing to destroy\n' "$stack" >&2
        exit 0
      fi
      printf '%s\n' "$err" >&2
      exit 1
    fi
    if [[ $kind == experiment ]]; then
      pulumi destroy --stack "$stack" --refresh --yes --non-interactive "$@"
      # No --force: if anything is left (a protected resource), rm refuses and the stack stays.
      pulumi stack rm --stack "$stack" --yes
      printf 'pulumi-stack: destroyed and removed %s; commit the deletion of Pulumi.%s.yaml\n' "$stack" "$stack" >&2
    else
      # Protected resources (dataset storage) and what they depend on stay in Azure and in the stack.
      pulumi destroy --stack "$stack" --refresh --yes --non-interactive --exclude-protected "$@"
      printf 'pulumi-stack: destroyed %s except protected resources; the stack stays on the backend\n' "$stack" >&2
    fi
    ;;
esac
