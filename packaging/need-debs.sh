#!/usr/bin/env bash
# need-debs.sh PKG...: installs the Debian packages among PKG that are missing (apt-get update
# first, as a fresh machine's package lists may be absent or old). Does nothing when all are there.
# PKG:ARCH names another architecture's package (multiarch): that architecture is added to dpkg's
# first.
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing Debian packages: ${missing[*]}"
  for p in "${missing[@]}"; do
    case $p in
      *:*) a=${p##*:}
           if [ "$a" != "$(dpkg --print-architecture)" ] \
              && ! dpkg --print-foreign-architectures | grep -qx "$a"; then
             dpkg --add-architecture "$a"
           fi ;;
    esac
  done
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
