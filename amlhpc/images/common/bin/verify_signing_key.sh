#!/usr/bin/env bash
# Refuse a downloaded repository signing key unless it is the key amlhpc/images/pins.toml pins.
#
#   verify_signing_key.sh KEYFILE EXPECTED
#
# KEYFILE must hold exactly one OpenPGP primary key (armoured or binary), and its fingerprint
# must equal EXPECTED (40 hex) or end with it (a 64-bit key id, 16 hex, where only that is
# published). A file with a second key (one that could sign a substituted package) or another
# key is refused before apt ever reads it. Exit 0 when it matches, 1 with the reason otherwise.
set -euo pipefail

file="${1:?usage: verify_signing_key.sh KEYFILE EXPECTED}"
want="${2:?usage: verify_signing_key.sh KEYFILE EXPECTED}"
want="${want^^}"
if [[ ! "$want" =~ ^([0-9A-F]{16}|[0-9A-F]{40})$ ]]; then
  echo "[aml-hpc key] error: expected fingerprint '$2' is neither 40 nor 16 hex characters" >&2
  exit 1
fi

home="$(mktemp -d)"
trap 'rm -rf "$home"' EXIT
listing="$(gpg --homedir "$home" --batch --quiet --with-colons --show-keys "$file" 2>/dev/null || true)"
# Primary keys are "pub" records; the "fpr" record right after each one is its fingerprint.
mapfile -t primaries < <(awk -F: '$1 == "pub" {want = 1; next} $1 == "fpr" && want {print $10; want = 0}' <<<"$listing")

if [[ "${#primaries[@]}" -ne 1 ]]; then
  echo "[aml-hpc key] error: $file holds ${#primaries[@]} primary keys, expected exactly one (${want})" >&2
  exit 1
fi
got="${primaries[0]}"
if [[ "$got" != "$want" && "$got" != *"$want" ]]; then
  echo "[aml-hpc key] error: $file is key $got, amlhpc/images/pins.toml pins $want: refusing to trust it" >&2
  exit 1
fi
echo "[aml-hpc key] $file is the pinned key $got"
