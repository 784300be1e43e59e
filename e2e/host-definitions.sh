#!/usr/bin/env bash
# Definitions managed through a real host: a ShardResourceDefinition applied
# to the host's kube-apiserver is served by kshard through the aggregator
# with no restart, kshard registers its APIService (caBundle from the serving
# Secret), a changed definition adds a version, and a deleted one takes its
# objects and APIServices with it.
#
# Needs: kubectl, and either
#   - KSHARD_E2E_KUBECONFIG: a cluster where kshard runs from
#     manifests/overlays/single (e.g. kept by `KSHARD_E2E_KEEP=1 e2e/kind.sh`), or
#   - docker (running), kind and internet access: the cluster is created here
#     as e2e/kind.sh creates it (same image, cert-manager, overlay).
# Environment:
#   KSHARD_E2E_CLUSTER  kind cluster name (default kshard-e2e-defs; must not exist)
#   KSHARD_E2E_KEEP=1   keep the cluster afterwards (for debugging)
#   KIND_NODE_IMAGE     kind node image (default: kind's own default)
#
# Not run in CI: the CI machines have no Docker daemon or internet.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLUSTER=${KSHARD_E2E_CLUSTER:-kshard-e2e-defs}
KEEP=${KSHARD_E2E_KEEP:-0}
IMAGE=ghcr.io/kshard/kshard:dev
CERT_MANAGER_VERSION=v1.18.2
GROUP=things.kshard.dev
SRD=gadgets.${GROUP}

WORK=$(mktemp -d)
CREATED=0

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
ok() { printf '    \033[32mok\033[0m %s\n' "$*"; }
fail() {
  printf '\n\033[31mFAIL\033[0m %s\n' "$*" >&2
  exit 1
}
k() { kubectl --request-timeout=30s "$@"; }
# Milliseconds since the epoch (GNU date and BSD date with gdate absent:
# python3 is on both).
now_ms() { python3 -c 'import time; print(int(time.time()*1000))'; }

diagnostics() {
  step "diagnostics"
  k get shardresourcedefinitions -o yaml || true
  k get apiservices -l app.kubernetes.io/managed-by=kshard -o yaml || true
  k -n kshard-system get pods,events -o wide || true
  k -n kshard-system logs deploy/kshard --tail=200 || true
}

cleanup() {
  local rc=$?
  if [[ ${rc} -ne 0 ]]; then diagnostics; fi
  if [[ ${CREATED} -eq 1 ]]; then
    if [[ "${KEEP}" == 1 ]]; then
      step "keeping cluster ${CLUSTER}: export KUBECONFIG=${KUBECONFIG}; delete with: kind delete cluster --name ${CLUSTER}"
      return
    fi
    step "deleting kind cluster ${CLUSTER}"
    kind delete cluster --name "${CLUSTER}" || true
  fi
  rm -rf "${WORK}"
  if [[ ${rc} -eq 0 ]]; then step "e2e passed"; else printf '\n\033[31me2e failed (exit %s)\033[0m\n' "${rc}" >&2; fi
}
trap cleanup EXIT

# Polls `$@` every second until it succeeds or `timeout` seconds pass.
retry() {
  local timeout=$1
  shift
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then return 1; fi
    sleep 1
  done
}

if [[ -n "${KSHARD_E2E_KUBECONFIG:-}" ]]; then
  export KUBECONFIG="${KSHARD_E2E_KUBECONFIG}"
  step "using the cluster of ${KUBECONFIG}"
  # The overlay of this checkout: the ShardResourceDefinition CRD, RBAC and
  # --manage-apiservices may be newer than what is installed.
  k apply --server-side -k "${ROOT}/manifests/overlays/single" >/dev/null
  k -n kshard-system rollout status deploy/kshard --timeout=300s
else
  export KUBECONFIG="${WORK}/kubeconfig"
  step "checking tools"
  for tool in docker kind kubectl python3; do
    command -v "${tool}" >/dev/null || fail "${tool} is not on PATH"
  done
  docker info >/dev/null 2>&1 || fail "the Docker daemon is not reachable"
  if kind get clusters 2>/dev/null | grep -qx "${CLUSTER}"; then
    fail "kind cluster ${CLUSTER} already exists (delete it or set KSHARD_E2E_CLUSTER)"
  fi

  step "creating kind cluster ${CLUSTER}"
  node_image=()
  if [[ -n "${KIND_NODE_IMAGE:-}" ]]; then node_image=(--image "${KIND_NODE_IMAGE}"); fi
  CREATED=1
  kind create cluster --name "${CLUSTER}" --kubeconfig "${KUBECONFIG}" --wait 180s ${node_image[@]+"${node_image[@]}"}

  step "building ${IMAGE} (e2e/Dockerfile)"
  docker build -f "${ROOT}/e2e/Dockerfile" -t "${IMAGE}" "${ROOT}"
  kind load docker-image "${IMAGE}" --name "${CLUSTER}"

  step "installing cert-manager ${CERT_MANAGER_VERSION}"
  k apply -f "https://github.com/cert-manager/cert-manager/releases/download/${CERT_MANAGER_VERSION}/cert-manager.yaml" >/dev/null
  k -n cert-manager rollout status deploy/cert-manager deploy/cert-manager-cainjector deploy/cert-manager-webhook --timeout=180s
  webhook_answers() {
    k apply --dry-run=server -f - <<'YAML'
apiVersion: cert-manager.io/v1
kind: Issuer
metadata: {name: webhook-probe, namespace: default}
spec: {selfSigned: {}}
YAML
  }
  retry 120 webhook_answers || fail "cert-manager's webhook never answered"

  step "installing kshard (manifests/overlays/single)"
  k apply --server-side -k "${ROOT}/manifests/overlays/single"
  k -n kshard-system wait --for=condition=Ready certificates.cert-manager.io/kshard-serving --timeout=120s
  k -n kshard-system rollout status deploy/kshard --timeout=300s
fi
k wait --for=condition=Established "crd/shardresourcedefinitions.apiextensions.kshard.dev" --timeout=60s
k wait --for=condition=Available apiservice/v1.demo.kshard.dev --timeout=180s
ok "kshard is running and aggregated"

# The gadgets definition: `size`, and with "v2" a second served version and
# a `color` field. A CustomResourceDefinition but for apiVersion and kind.
gadgets() {
  local color='' v2=''
  if [[ "${1:-}" == v2 ]]; then
    color='
              color: {type: string}'
    v2='
  - name: v2
    served: true
    storage: false
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}'"${color}"
  fi
  cat <<YAML
apiVersion: apiextensions.kshard.dev/v1
kind: ShardResourceDefinition
metadata:
  name: ${SRD}
spec:
  group: ${GROUP}
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}${color}${v2}
YAML
}

step "kubectl apply a ShardResourceDefinition to the host"
start=$(now_ms)
gadgets | k apply -f -
retry 30 k get --raw "/apis/${GROUP}/v1" || fail "/apis/${GROUP}/v1 never answered through the aggregator"
ok "served through the aggregator after $(($(now_ms) - start)) ms (APIService registration and the aggregator's availability check included)"
k wait --for=condition=Established "shardresourcedefinition/${SRD}" --timeout=30s
[[ "$(k get srd "${SRD}" -o jsonpath='{.metadata.finalizers[*]}')" == *customresourcecleanup.apiextensions.kshard.dev* ]] ||
  fail "kshard's cleanup finalizer is missing"
[[ "$(k get srd "${SRD}" -o jsonpath='{.status.storedVersions}')" == '["v1"]' ]] || fail "storedVersions"
ok "Established, finalizer and storedVersions set by kshard"

step "APIService v1.${GROUP} registered by kshard"
k wait --for=condition=Available "apiservice/v1.${GROUP}" --timeout=120s
[[ "$(k get apiservice "v1.${GROUP}" -o jsonpath='{.metadata.labels.app\.kubernetes\.io/managed-by}')" == kshard ]] ||
  fail "not labelled as kshard's"
ca_bundle=$(k get apiservice "v1.${GROUP}" -o jsonpath='{.spec.caBundle}')
secret_ca=$(k -n kshard-system get secret kshard-serving-cert -o jsonpath='{.data.ca\.crt}')
[[ -n "${ca_bundle}" && "${ca_bundle}" == "${secret_ca}" ]] || fail "caBundle is not the serving Secret's ca.crt"
[[ "$(k get apiservice "v1.${GROUP}" -o jsonpath='{.spec.groupPriorityMinimum}/{.spec.versionPriority}')" == 1000/100 ]] ||
  fail "priorities are not kube's CRD priorities"
ok "Available, caBundle = the serving CA"

step "create and get a Gadget through the host"
k create -f - <<YAML
apiVersion: ${GROUP}/v1
kind: Gadget
metadata: {name: g1, namespace: default}
spec: {size: 1}
YAML
[[ "$(k get gadget g1 -o jsonpath='{.spec.size}')" == 1 ]] || fail "get: wrong size"
k api-resources --api-group "${GROUP}" -o name | grep -qx "gadgets.${GROUP}" || fail "api-resources"
ok "created, read back, discovered"

step "change the definition on the host: a v2 version and a color field"
gadgets v2 | k apply -f -
retry 30 k get --raw "/apis/${GROUP}/v2" || fail "v2 never served"
k wait --for=condition=Available "apiservice/v2.${GROUP}" --timeout=120s
k create -f - <<YAML
apiVersion: ${GROUP}/v2
kind: Gadget
metadata: {name: g2, namespace: default}
spec: {size: 2, color: blue}
YAML
[[ "$(k get gadgets.v2.${GROUP} g2 -o jsonpath='{.spec.color}')" == blue ]] || fail "the new field was pruned"
ok "v2 served and registered, the new field kept; no restart"

step "delete the definition on the host"
start=$(now_ms)
# Waits for kshard to delete the Gadgets and remove its finalizer.
k delete srd "${SRD}" --timeout=120s
ok "definition gone after $(($(now_ms) - start)) ms"
gone() { ! k get apiservice "v1.${GROUP}" && ! k get apiservice "v2.${GROUP}"; }
retry 60 gone || fail "kshard did not remove the APIServices of ${GROUP}"
if k get --raw "/apis/${GROUP}/v1" >/dev/null 2>&1; then fail "${GROUP} still served"; fi
ok "APIServices removed, group no longer served"

step "applied again: the Gadgets were deleted, not hidden"
gadgets | k apply -f -
retry 60 k get --raw "/apis/${GROUP}/v1" || fail "not served again"
k wait --for=condition=Available "apiservice/v1.${GROUP}" --timeout=120s
left=$(k get gadgets -A -o name)
[[ -z "${left}" ]] || fail "gadgets survived their definition: ${left}"
k delete srd "${SRD}" --timeout=120s >/dev/null
ok "none left"
