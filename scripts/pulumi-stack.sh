#!/usr/bin/env bash
# Preview, deploy or tear down one stack with the Pulumi CLI (behind `make preview|up|down` in a
# clone and `aml-hpc infra preview|up|down STACK` when installed: the wheel carries this file).
#
#   scripts/pulumi-stack.sh preview|up|down STACK [-- extra pulumi arguments]
#
# - Where: the project folder (its Pulumi.yaml and stack files) is AMLHPC_PROJECT, else the
#   clone this script sits in. The program and the policy pack run with AMLHPC_PYTHON (the
#   installed tool's interpreter; default the clone's .venv/bin/python), passed to Pulumi as
#   PULUMI_PYTHON_CMD; the pack is AMLHPC_POLICY_PACK (default amlhpc/infra/policy/pack).
#   AMLHPC_TOOL (set by the installed command: `aml-hpc infra`) makes the hints name its
#   commands instead of make targets.
#
# - Two state containers and two passphrases per environment: the environment stack's, and
#   its experiments' (aml-hpc:environment), so whoever tears experiments down never holds the
#   environment's passphrase nor reaches its state. State: PULUMI_BACKEND_URL as given; else,
#   with AMLHPC_STATE_ACCOUNT, azblob://state-<env>?storage_account=... for the environment
#   and azblob://state-<env>-experiments?... for its experiments (the access program creates
#   them: scripts/access-setup.sh); else a file backend in .pulumi-state/ (solo work). A
#   backend container that is not the stack's is refused.
# - An environment's up publishes its outputs (never a secret) beside its state:
#   published/outputs.json in state-<env> (a file backend: published/<env>.json in its
#   folder; AMLHPC_PUBLISHED_DIR overrides both); its down removes them. An experiment's
#   preview and up fetch that document and give it to the program (AMLHPC_ENVIRONMENT_OUTPUTS,
#   amlhpc/infra/published.py): no StackReference, which would need the environment's passphrase.
#   Blob reads and writes go through `az storage blob --auth-mode login` (Entra ID, no key).
# - Secrets: the passphrase provider; set PULUMI_CONFIG_PASSPHRASE (or
#   PULUMI_CONFIG_PASSPHRASE_FILE, or AMLHPC_PASSPHRASE_DIR holding <env>.txt per environment
#   and <env>-experiments.txt for its experiments). Losing it loses the stack's secrets.
# - AMLHPC_ENVIRONMENT (set by the workflows to the GitHub environment's aml-hpc environment):
#   a stack of another environment is refused, so a job holding dev's identity and passphrase
#   never touches prod's stacks, whatever a stack file claims.
# - preview and up run the policy pack (amlhpc/infra/policy/pack) and refresh from Azure first.
# - Environment stacks: preview and up first give the stack its random aml-hpc:nameSuffix
#   (written once into Pulumi.<stack>.yaml: commit it), so every copy of this repository
#   gets its own globally unique names. up then adopts what an earlier `down` kept
#   (retainOnDelete: the resource group, data, workspace, Key Vault, registry...):
#   `pulumi stack export`, `python -m amlhpc.infra.adopt import-file` lists the retained resources
#   that exist in Azure but not in the state, and `pulumi import --file` takes them back
#   before `pulumi up` (which would otherwise fail: "cannot create already existing
#   resource"). The subscription comes from ARM_SUBSCRIPTION_ID, AZURE_SUBSCRIPTION_ID or
#   `az account show`.
# - preview of an environment shows that adoption as imports, not creates: the same import
#   plan, then `pulumi import` and `pulumi preview` against a scratch copy of the state (a
#   throwaway file backend holding `pulumi stack export`), so the preview after a `down` lists
#   what `up` will import and creates only what `down` removed. Nothing is written to the
#   stack's backend or to Azure (import reads). Without a subscription id it previews as
#   before, saying that retained resources then show as creates.
# - up runs again, after a wait, when it failed on Azure RBAC propagation: a role assignment
#   made in the same up was not in effect yet when Azure checked it (a customer-managed key
#   for the workspace; amlhpc/infra/quirks.py lists the error codes, amlhpc.infra.adopt decides). At most
#   RBAC_ATTEMPTS (6) attempts, RBAC_WAIT_SECONDS (60) apart.
# - down refuses an environment stack unless CONFIRM=<stack name>, and then keeps
#   protected resources (dataset storage); experiment stacks (exp-*) go without asking and
#   are removed from the backend afterwards (`pulumi stack rm`, which also deletes the
#   local Pulumi.<stack>.yaml: commit that deletion).
# - STACK_MUST_EXIST=1 (the deploy workflow): preview and up never create a stack nor write
#   its name suffix; a stack the backend lacks is refused (exit 2) with the fix. CI must
#   not invent an encryptionsalt or a nameSuffix that nobody commits.
#
# Exit status: 0 done, 2 bad usage or input, 127 the pulumi CLI is missing, else pulumi's.
set -euo pipefail
cd "${AMLHPC_PROJECT:-$(dirname "$0")/..}"

POLICY_PACK=${AMLHPC_POLICY_PACK:-amlhpc/infra/policy/pack}
PYTHON=${AMLHPC_PYTHON:-.venv/bin/python}
EXPERIMENT_PREFIX=exp-

die() {  # message [fix] [status]
  printf 'pulumi-stack: %s\n' "$1" >&2
  [[ -n ${2:-} ]] && printf '  fix: %s\n' "$2" >&2
  exit "${3:-2}"
}

hint() {  # ACTION STACK [confirm]: the command that runs it, as this user runs aml-hpc
  if [[ -n ${AMLHPC_TOOL:-} ]]; then
    printf '%s %s %s%s' "$AMLHPC_TOOL" "$1" "$2" "${3:+ --confirm $2}"
  else
    printf 'make %s STACK=%s%s' "$1" "$2" "${3:+ CONFIRM=$2}"
  fi
}

usage() {
  die "usage: scripts/pulumi-stack.sh preview|up|down STACK [-- pulumi arguments]" \
      "e.g. $(hint preview dev), $(hint up exp-bert), $(hint down exp-bert)"
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
  if [[ -n ${AMLHPC_TOOL:-} ]]; then new="$AMLHPC_TOOL new-experiment <name> --env dev --days 7"; else new="make new-experiment NAME=<name> ENV=dev DAYS=7"; fi
  die "no stack file Pulumi.$stack.yaml" "stacks here: ${known:-none}; create an experiment with: $new"
fi

kind=environment
[[ $stack == "$EXPERIMENT_PREFIX"* ]] && kind=experiment

if [[ $action == down && $kind == environment && ${CONFIRM:-} != "$stack" ]]; then
  die "refusing to destroy environment stack '$stack': it holds the workspace, registry and data access for everyone" \
      "if you really mean it: $(hint down "$stack" confirm) (protected dataset storage is kept either way)"
fi

stack_environment() {  # the environment a stack belongs to: itself, or an experiment's aml-hpc:environment
  if [[ $kind == environment ]]; then
    printf '%s' "$stack"
    return
  fi
  local found
  found=$(sed -nE "s/^[[:space:]]*aml-hpc:environment:[[:space:]]*[\"']?([a-z0-9][a-z0-9-]*)[\"']?[[:space:]]*(#.*)?$/\1/p" \
    "Pulumi.$stack.yaml" | head -n 1)
  [[ -n $found ]] || die "cannot tell which environment experiment '$stack' belongs to: Pulumi.$stack.yaml has no aml-hpc:environment" \
    "pulumi config set aml-hpc:environment dev --stack $stack (the environment whose workspace it joins)"
  printf '%s' "$found"
}

describe_container() {  # CONTAINER: whose state a state-* container holds, in words
  local env=${1#state-}
  if [[ $env == *-experiments ]]; then
    printf "the experiments of environment '%s'" "${env%-experiments}"
  else
    printf "environment '%s'" "$env"
  fi
}

# An experiment always needs its environment (its outputs are fetched); an environment is itself.
environment=$stack
if [[ $kind == experiment ]]; then
  environment=$(stack_environment)
fi
# The stack's state container and passphrase file: the environment's own, or its experiments'.
container=state-$environment
[[ $kind == experiment ]] && container=state-$environment-experiments
if [[ -n ${AMLHPC_ENVIRONMENT:-} && $AMLHPC_ENVIRONMENT != "$environment" ]]; then
  die "refusing $action of '$stack': it belongs to environment '$environment', and this job runs as environment '$AMLHPC_ENVIRONMENT' (its identity, reviewers and passphrase)" \
      "run it in the '$environment' GitHub environment (the workflows pick it from aml-hpc:environment)"
fi
if [[ -z ${PULUMI_BACKEND_URL:-} && -n ${AMLHPC_STATE_ACCOUNT:-} ]]; then
  export PULUMI_BACKEND_URL="azblob://$container?storage_account=$AMLHPC_STATE_ACCOUNT"
fi
if [[ ${PULUMI_BACKEND_URL:-} =~ ^azblob://(state-[a-z0-9-]+)([?/]|$) && ${BASH_REMATCH[1]} != "$container" ]]; then
  die "refusing $action of '$stack': the backend ${PULUMI_BACKEND_URL%%\?*} holds the state of $(describe_container "${BASH_REMATCH[1]}"), and '$stack' belongs in $container" \
      "use azblob://$container?storage_account=..., or unset PULUMI_BACKEND_URL and set AMLHPC_STATE_ACCOUNT"
fi
if [[ -z ${PULUMI_CONFIG_PASSPHRASE+set} && -z ${PULUMI_CONFIG_PASSPHRASE_FILE:-} && -n ${AMLHPC_PASSPHRASE_DIR:-} ]]; then
  passfile=$AMLHPC_PASSPHRASE_DIR/${container#state-}.txt
  [[ -f $passfile ]] || die "no passphrase file $passfile for ${container#state-} stacks" \
    "put that passphrase there (<env>.txt for an environment, <env>-experiments.txt for its experiments), or export PULUMI_CONFIG_PASSPHRASE"
  export PULUMI_CONFIG_PASSPHRASE_FILE=$passfile
fi

if ! command -v pulumi >/dev/null 2>&1; then
  die "the Pulumi CLI is not installed (no 'pulumi' on PATH)" \
      "install it: curl -fsSL https://get.pulumi.com | sh (Linux/macOS) or brew install pulumi/tap/pulumi, open a new shell, then check with: pulumi version" \
      127
fi

if [[ -z ${PULUMI_CONFIG_PASSPHRASE+set} && -z ${PULUMI_CONFIG_PASSPHRASE_FILE:-} ]]; then
  die "no passphrase for the stack's secrets" \
      "export PULUMI_CONFIG_PASSPHRASE=... (keep it in your password manager; one per environment) or PULUMI_CONFIG_PASSPHRASE_FILE=<path>"
fi

if [[ ! -x $PYTHON ]]; then
  [[ -z ${AMLHPC_PYTHON:-} ]] || die "AMLHPC_PYTHON=$PYTHON is not a Python interpreter; Pulumi runs the program with it" \
    "point it at the interpreter aml-hpc is installed in"
  die "the project's virtual environment (.venv) is missing; Pulumi runs the program in it" "make bootstrap"
fi
# The interpreter Pulumi runs the program and the policy pack with (neither names a virtualenv
# Pulumi would look for: a project outside this repository has none).
export PULUMI_PYTHON_CMD
PULUMI_PYTHON_CMD=$(cd "$(dirname "$PYTHON")" && pwd)/$(basename "$PYTHON")

export PULUMI_BACKEND_URL=${PULUMI_BACKEND_URL:-file://$PWD/.pulumi-state}
export PULUMI_SKIP_UPDATE_CHECK=true
if [[ $PULUMI_BACKEND_URL == file://* ]]; then
  mkdir -p "${PULUMI_BACKEND_URL#file://}"
fi
printf 'pulumi-stack: %s %s (%s stack) on %s\n' "$action" "$stack" "$kind" "${PULUMI_BACKEND_URL%%\?*}" >&2

# --- the environment's published outputs (amlhpc/infra/published.py) -------------------------
published_place() {  # file PATH, or blob ACCOUNT CONTAINER NAME (tab-separated): where the document lives
  if [[ -n ${AMLHPC_PUBLISHED_DIR:-} ]]; then
    printf 'file\t%s/%s.json' "$AMLHPC_PUBLISHED_DIR" "$environment"
  elif [[ $PULUMI_BACKEND_URL == file://* ]]; then
    printf 'file\t%s/published/%s.json' "${PULUMI_BACKEND_URL#file://}" "$environment"
  elif [[ $PULUMI_BACKEND_URL =~ ^azblob://([a-z0-9-]+)\?(.*&)?storage_account=([a-z0-9]+) ]]; then
    local own=${BASH_REMATCH[1]} account=${BASH_REMATCH[3]}
    if [[ $own == "state-$environment" || $own == "state-$environment-experiments" ]]; then
      printf 'blob\t%s\tstate-%s\tpublished/outputs.json' "$account" "$environment"
    else  # one container for every stack (a team's own layout)
      printf 'blob\t%s\t%s\tpublished/%s.json' "$account" "$own" "$environment"
    fi
  else
    die "cannot tell where environment '$environment' publishes its outputs on the backend ${PULUMI_BACKEND_URL%%\?*}" \
        "set AMLHPC_PUBLISHED_DIR to a folder shared by whoever deploys '$environment' and its experiments"
  fi
}

need_az() {
  command -v az >/dev/null 2>&1 || die "the Azure CLI is not installed (no 'az' on PATH): it moves environment '$environment's published outputs" \
    "install it (https://learn.microsoft.com/cli/azure/install-azure-cli), then az login"
}

publish_outputs() {  # after an environment's up: its outputs, for its experiments
  local work
  work=$(mktemp -d)
  pulumi stack output --json --stack "$stack" > "$work/outputs.json"
  if ! "$PYTHON" -m amlhpc.infra.published write --environment "$environment" --outputs "$work/outputs.json" \
      --out "$work/published.json"; then
    rm -rf "$work"
    die "up $stack succeeded, but its outputs were not published: its experiments cannot read them" "$(hint up "$stack") again"
  fi
  if [[ ${place[0]} == file ]]; then
    mkdir -p "$(dirname "${place[1]}")"
    cp "$work/published.json" "${place[1]}"
  else
    need_az
    az storage blob upload --auth-mode login --only-show-errors --overwrite --account-name "${place[1]}" \
      --container-name "${place[2]}" --name "${place[3]}" --file "$work/published.json" >/dev/null \
      || { rm -rf "$work"; die "up $stack succeeded, but its outputs were not published to ${place[2]}/${place[3]}" "$(hint up "$stack") again"; }
  fi
  rm -rf "$work"
  printf 'pulumi-stack: published %s'"'"'s outputs for its experiments (%s)\n' "$stack" "${place[*]:1}" >&2
}

unpublish_outputs() {  # after an environment's down: its experiments must not act on what is gone
  if [[ ${place[0]} == file ]]; then
    rm -f "${place[1]}"
  elif command -v az >/dev/null 2>&1; then
    az storage blob delete --auth-mode login --only-show-errors --account-name "${place[1]}" \
      --container-name "${place[2]}" --name "${place[3]}" >/dev/null 2>&1 \
      || printf 'pulumi-stack: %s/%s was not removed (already gone?)\n' "${place[2]}" "${place[3]}" >&2
  fi
}

fetch_outputs() {  # before an experiment's preview or up: its environment's, for the program
  local file=$1 err
  if [[ ${place[0]} == file ]]; then
    [[ -f ${place[1]} ]] || die "environment '$environment' has published no outputs (${place[1]}): experiment '$stack' cannot be planned" \
      "bring the environment up first: $(hint up "$environment")"
    cp "${place[1]}" "$file"
  else
    need_az
    if ! err=$(az storage blob download --auth-mode login --only-show-errors --account-name "${place[1]}" \
        --container-name "${place[2]}" --name "${place[3]}" --file "$file" 2>&1 >/dev/null); then
      die "cannot read environment '$environment's published outputs (${place[2]}/${place[3]} in ${place[1]}): ${err##*$'\n'}" \
        "bring the environment up first ($(hint up "$environment")), and sign in as an identity that may read ${place[2]}"
    fi
  fi
  "$PYTHON" -m amlhpc.infra.published check --environment "$environment" --file "$file" >&2 || exit 2
  export AMLHPC_ENVIRONMENT_OUTPUTS=$file
}

place=()
if [[ $kind == experiment && $action != down ]] || [[ $kind == environment && $action != preview ]]; then
  IFS=$'\t' read -r -a place <<<"$(published_place)"
  (( ${#place[@]} )) || exit 2  # published_place said why
fi
if [[ $kind == experiment && $action != down ]]; then
  fetched=$(mktemp -d)
  trap 'rm -rf "$fetched"' EXIT
  fetch_outputs "$fetched/environment.json"
fi

find_subscription() {  # the subscription id, or nothing
  local sub=${ARM_SUBSCRIPTION_ID:-${AZURE_SUBSCRIPTION_ID:-}}
  if [[ -z $sub ]] && command -v az >/dev/null 2>&1; then
    sub=$(az account show --query id -o tsv 2>/dev/null || true)
  fi
  printf '%s' "$sub"
}

subscription_id() {
  local sub
  sub=$(find_subscription)
  [[ -n $sub ]] || die "cannot tell which Azure subscription stack '$stack' deploys to" \
    "az login && az account set --subscription <id>, or export ARM_SUBSCRIPTION_ID=<id>"
  printf '%s' "$sub"
}

plan_adoption() {  # WORK SUBSCRIPTION: export the state to WORK/state.json, the import plan to WORK/import.json; print its count
  pulumi stack export --stack "$stack" --file "$1/state.json"
  "$PYTHON" -m amlhpc.infra.adopt import-file --stack "$stack" --state "$1/state.json" \
    --subscription "$2" --out "$1/import.json"
}

adopt_retained() {  # import what an earlier destroy kept in Azure, before up creates anything
  local work count sub
  sub=$(subscription_id) || exit 2
  work=$(mktemp -d)
  count=$(plan_adoption "$work" "$sub") || { rm -rf "$work"; exit 2; }
  if [[ -s $work/import.json ]]; then
    printf 'pulumi-stack: adopting %s retained resource(s) kept by an earlier down\n' "$count" >&2
    pulumi import --stack "$stack" --file "$work/import.json" --protect=false --generate-code=false --yes
  fi
  rm -rf "$work"
}

preview_with_adoption() {  # a preview that shows what up adopts as imports, on a scratch copy of the state
  local work count sub status=0
  sub=$(find_subscription)
  if [[ -z $sub ]]; then
    printf 'pulumi-stack: no subscription id (ARM_SUBSCRIPTION_ID, az login): this preview cannot tell what up would adopt; resources an earlier down kept show as creates\n' >&2
    pulumi preview --stack "$stack" --refresh --policy-pack "$POLICY_PACK" "$@"
    return
  fi
  work=$(mktemp -d)
  count=$(plan_adoption "$work" "$sub") || { rm -rf "$work"; exit 2; }
  if [[ ! -s $work/import.json ]]; then
    rm -rf "$work"
    pulumi preview --stack "$stack" --refresh --policy-pack "$POLICY_PACK" "$@"
    return
  fi
  printf 'pulumi-stack: up will import %s retained resource(s) kept by an earlier down: shown as imports below, then the preview of the rest, both on a scratch copy of the state (the stack and Azure are not changed)\n' "$count" >&2
  cp "Pulumi.$stack.yaml" "$work/stack-file.yaml"
  mkdir "$work/backend"
  scratch() { PULUMI_BACKEND_URL="file://$work/backend" pulumi "$@"; }
  scratch stack init "$stack" --secrets-provider passphrase --no-select \
    && scratch stack import --stack "$stack" --file "$work/state.json" \
    && scratch import --stack "$stack" --file "$work/import.json" --protect=false --generate-code=false --yes \
    && scratch preview --stack "$stack" --refresh --policy-pack "$POLICY_PACK" "$@" \
    || status=$?
  cp "$work/stack-file.yaml" "Pulumi.$stack.yaml"  # the scratch stack leaves the stack file as it was
  rm -rf "$work"
  return "$status"
}

select_existing() {  # pulumi stack select without --create; exit 2 when the backend lacks it
  local err
  if ! err=$(pulumi stack select "$stack" 2>&1); then
    if grep -qi "no stack named" <<<"$err"; then
      die "stack '$stack' is not on the backend ${PULUMI_BACKEND_URL%%\?*}, and STACK_MUST_EXIST=1 forbids creating it here" \
          "create it once from a working copy: $(hint preview "$stack"), then commit what it writes into Pulumi.$stack.yaml (encryptionsalt; nameSuffix for an environment)"
    fi
    printf '%s\n' "$err" >&2
    exit 1
  fi
}

up_with_rbac_retries() {  # pulumi up, again after a wait when a fresh grant was not in effect yet
  local attempt=1 attempts=${RBAC_ATTEMPTS:-6} wait=${RBAC_WAIT_SECONDS:-60} log status code
  log=$(mktemp)
  while true; do
    set +e
    pulumi up --stack "$stack" --refresh --policy-pack "$POLICY_PACK" "$@" 2>&1 | tee "$log"
    status=${PIPESTATUS[0]}
    set -e
    (( status == 0 )) && break
    if (( attempt >= attempts )) || ! code=$("$PYTHON" -m amlhpc.infra.adopt propagation --log "$log"); then
      rm -f "$log"
      exit "$status"
    fi
    printf 'pulumi-stack: a role assignment made by this up is not in effect yet (%s); waiting %ss, then up again (attempt %s of %s)\n' \
      "$code" "$wait" "$((attempt + 1))" "$attempts" >&2
    sleep "$wait"
    attempt=$((attempt + 1))
  done
  rm -f "$log"
}

case $action in
  preview|up)
    if [[ ${STACK_MUST_EXIST:-} == 1 ]]; then
      select_existing  # and no suffix written: `pulumi up` refuses a stack file without one
    else
      if [[ $kind == environment ]]; then
        "$PYTHON" -m amlhpc.infra.adopt suffix --stack "$stack" >/dev/null
      fi
      pulumi stack select --create --secrets-provider passphrase "$stack"
    fi
    if [[ $action == up && $kind == environment ]]; then
      adopt_retained
    fi
    if [[ $action == up ]]; then
      up_with_rbac_retries "$@"
      if [[ $kind == environment ]]; then
        publish_outputs
      fi
    elif [[ $kind == environment ]]; then
      preview_with_adoption "$@"
    else
      pulumi preview --stack "$stack" --refresh --policy-pack "$POLICY_PACK" "$@"
    fi
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
      # Protected resources (outside dev) and what they depend on stay in Azure and in the
      # stack; retained ones (data, workspace, Key Vault, registries) stay in Azure and are
      # adopted again by the next `up`.
      pulumi destroy --stack "$stack" --refresh --yes --non-interactive --exclude-protected "$@"
      unpublish_outputs
      printf 'pulumi-stack: destroyed %s except protected and retained resources; the stack stays on the backend; %s adopts them again\n' "$stack" "$(hint up "$stack")" >&2
    fi
    ;;
esac
