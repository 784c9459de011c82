# meta.sh: sourced by the build scripts; what a build says about itself, from the checkout:
#   version             pyproject.toml's [project] version, and licence its licence
#   revision            the commit built (git rev-parse HEAD), "-dirty" added when files differ
#   SOURCE_DATE_EPOCH   exported: the commit's time unless already set, so every timestamp a
#                       build writes (files, .deb, image `created`, SBOM) is the commit's
#   source_url          NLPROXY_SOURCE_URL, else the `origin` remote as an https URL, else empty
#                       (then the .deb has no Homepage and the image no source label)
# Needs $root (the checkout).
version=$(/usr/bin/python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$root/pyproject.toml")
licence=$(/usr/bin/python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["license"])' "$root/pyproject.toml")
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && ! git -C "$root" diff --quiet HEAD -- 2>/dev/null; then
  revision=$revision-dirty
fi
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git -C "$root" log -1 --format=%ct 2>/dev/null || stat -c %Y "$root/pyproject.toml")
fi
export SOURCE_DATE_EPOCH
source_url=${NLPROXY_SOURCE_URL:-}
if [ -z "$source_url" ]; then
  origin=$(git -C "$root" remote get-url origin 2>/dev/null || true)
  case $origin in
    https://*) source_url=${origin%.git} ;;
    git@*:*) hostpath=${origin#git@}; source_url="https://${hostpath%%:*}/${hostpath#*:}"
             source_url=${source_url%.git} ;;
  esac
fi
