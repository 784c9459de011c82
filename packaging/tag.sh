#!/usr/bin/env bash
# tag.sh: tags the checked-out commit as the release vVERSION (make tag), VERSION being
# [project] version of pyproject.toml, the version's one place (docs/packaging.md, "Versions and releases").
# Refuses (exit 2, saying why) unless the release is whole: CHANGELOG.md has a "## VERSION"
# section, the DaemonSet's image is nlproxy:VERSION, and no file differs from the commit. A tag
# vVERSION already on this commit is fine; on another commit it is refused: a version is released
# once. Prints the tag; pushing it is left to the one who releases (git push origin vVERSION).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=packaging/meta.sh
. "$root/packaging/meta.sh"
tag=v$version
refuse() {
  echo "tag: $tag: $*" >&2
  exit 2
}
grep -Eq "^## ${version//./\\.}( |$)" "$root/CHANGELOG.md" \
  || refuse "CHANGELOG.md has no \"## $version\" section (its Unreleased entries go under it)"
image=$(sed -n 's/^ *image: *\([^ ]*\) *$/\1/p' "$root/deploy/kubernetes/daemonset.yaml" | sort -u)
[ "$image" = "nlproxy:$version" ] \
  || refuse "deploy/kubernetes/daemonset.yaml names image $(echo $image), not nlproxy:$version"
case $revision in
  unknown) refuse "$root is not a git checkout" ;;
  *-dirty) refuse "files differ from the commit (git status): commit them first" ;;
esac
if tagged=$(git -C "$root" rev-parse -q --verify "refs/tags/$tag^{commit}"); then
  [ "$tagged" = "$revision" ] || refuse "already tags commit $tagged"
else
  git -C "$root" tag -a "$tag" -m "nlproxy $version"
fi
echo "$tag"
