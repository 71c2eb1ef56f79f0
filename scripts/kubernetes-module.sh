# shellcheck shell=bash
# Sourced by scripts/build-control-plane and scripts/build-conformance: how to build packages of
# k8s.io/kubernetes from the Go module proxy. Kubernetes' go.mod points its k8s.io/<staging>
# modules at ./staging/… (`replace` lines), which a dependent module cannot follow; a throwaway
# module requiring k8s.io/kubernetes pins each of them to its published v0.Y.Z instead.

# kubernetes_module DIR VERSION PACKAGE…: make DIR that module unless it is already, its go.mod
# tidied for PACKAGEs (a build-tagged tools.go imports them), and leave the shell in DIR.
kubernetes_module() {
  local dir=$1 version=$2 staging=${2/#v1./v0.} gomod package
  shift 2
  mkdir -p "$dir"
  cd "$dir"
  [[ ! -f go.mod ]] || return 0
  go mod init trio-kubelet/kubernetes >/dev/null 2>&1
  gomod=$(go mod download -json "k8s.io/kubernetes@$version" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    printf 'require k8s.io/kubernetes %s\n' "$version"
    sed -n 's#^[[:space:]]*\(replace \)\{0,1\}\(k8s.io/[^ ]*\) => ./staging/.*#\2#p' "$gomod" \
      | sort -u | while read -r module; do
          printf 'replace %s => %s %s\n' "$module" "$module" "$staging"
        done
  } >>go.mod
  {
    printf '//go:build tools\n\npackage main\n'
    for package in "$@"; do
      printf 'import _ "%s"\n' "$package"
    done
  } >tools.go
  go mod tidy >/dev/null 2>&1 || for package in "$@"; do
    go get "$package"
  done
}

# kubernetes_ldflags VERSION: stripped, and the version `kube-x --version` and the API report.
kubernetes_ldflags() {
  printf '%s' "-s -w \
    -X k8s.io/component-base/version.gitVersion=$1 \
    -X k8s.io/component-base/version.gitMajor=1 \
    -X k8s.io/component-base/version.gitMinor=$(cut -d. -f2 <<<"$1")"
}
