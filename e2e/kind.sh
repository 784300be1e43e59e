#!/usr/bin/env bash
# kshard against a real host cluster: creates a kind cluster, builds and loads
# the image, installs cert-manager and manifests/overlays/single, waits for the
# APIService to become Available, then checks through the host's
# kube-apiserver (aggregator) what users do with kubectl.
#
# Needs: docker (running), kind, kubectl, internet access (cert-manager).
# Environment:
#   KSHARD_E2E_CLUSTER  kind cluster name (default kshard-e2e; must not exist)
#   KSHARD_E2E_KEEP=1   keep the cluster afterwards (for debugging)
#   KIND_NODE_IMAGE     kind node image (default: kind's own default)
#
# Not run in CI: the CI machines have no Docker daemon or internet.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLUSTER=${KSHARD_E2E_CLUSTER:-kshard-e2e}
KEEP=${KSHARD_E2E_KEEP:-0}
# The image name the manifests use: building it under that name needs no edits.
IMAGE=ghcr.io/kshard/kshard:dev
CERT_MANAGER_VERSION=v1.18.2
GROUP=demo.kshard.dev
APISERVICE=v1.${GROUP}
NS=kshard-e2e-widgets

WORK=$(mktemp -d)
# A private kubeconfig: never touch the user's current context.
export KUBECONFIG="${WORK}/kubeconfig"
CREATED=0
WATCH_PID=

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
ok() { printf '    \033[32mok\033[0m %s\n' "$*"; }
fail() {
  printf '\n\033[31mFAIL\033[0m %s\n' "$*" >&2
  exit 1
}
k() { kubectl --request-timeout=30s "$@"; }

diagnostics() {
  step "diagnostics"
  k get apiservice "${APISERVICE}" -o yaml || true
  k -n kshard-system get pods,certificates,events -o wide || true
  k -n kshard-system logs deploy/kshard --tail=200 || true
}

cleanup() {
  local rc=$?
  if [[ -n "${WATCH_PID}" ]]; then kill "${WATCH_PID}" 2>/dev/null || true; fi
  if [[ ${rc} -ne 0 && ${CREATED} -eq 1 ]]; then diagnostics; fi
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

# Polls `$@` every 2 s until it succeeds or `timeout` seconds pass.
retry() {
  local timeout=$1
  shift
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then return 1; fi
    sleep 2
  done
}

step "checking tools"
for tool in docker kind kubectl; do
  command -v "${tool}" >/dev/null || fail "${tool} is not on PATH"
done
docker info >/dev/null 2>&1 || fail "the Docker daemon is not reachable"
if kind get clusters 2>/dev/null | grep -qx "${CLUSTER}"; then
  fail "kind cluster ${CLUSTER} already exists (delete it or set KSHARD_E2E_CLUSTER)"
fi
ok "docker, kind, kubectl"

step "creating kind cluster ${CLUSTER}"
node_image=()
if [[ -n "${KIND_NODE_IMAGE:-}" ]]; then node_image=(--image "${KIND_NODE_IMAGE}"); fi
CREATED=1
# The +"..." form keeps bash 3.2 (macOS) from calling an empty array unbound.
kind create cluster --name "${CLUSTER}" --kubeconfig "${KUBECONFIG}" --wait 180s ${node_image[@]+"${node_image[@]}"}
ok "cluster up"

step "building ${IMAGE} (e2e/Dockerfile)"
docker build -f "${ROOT}/e2e/Dockerfile" -t "${IMAGE}" "${ROOT}"
kind load docker-image "${IMAGE}" --name "${CLUSTER}"
ok "image loaded into the nodes"

step "installing cert-manager ${CERT_MANAGER_VERSION}"
k apply -f "https://github.com/cert-manager/cert-manager/releases/download/${CERT_MANAGER_VERSION}/cert-manager.yaml" >/dev/null
k -n cert-manager rollout status deploy/cert-manager deploy/cert-manager-cainjector deploy/cert-manager-webhook --timeout=180s
# The webhook's Deployment can be ready before its own certificate is: wait
# until a server-side dry run of an Issuer gets through the webhook.
webhook_answers() {
  k apply --dry-run=server -f - <<'YAML'
apiVersion: cert-manager.io/v1
kind: Issuer
metadata: {name: webhook-probe, namespace: default}
spec: {selfSigned: {}}
YAML
}
retry 120 webhook_answers || fail "cert-manager's webhook never answered"
ok "cert-manager webhook answers"

step "installing kshard (manifests/overlays/single)"
k apply --server-side -k "${ROOT}/manifests/overlays/single"
k -n kshard-system wait --for=condition=Ready certificates.cert-manager.io/kshard-serving --timeout=120s
k -n kshard-system rollout status deploy/kshard --timeout=300s
ok "kshard is running"

step "waiting for APIService ${APISERVICE} to become Available"
k wait --for=condition=Available "apiservice/${APISERVICE}" --timeout=180s
ca_bundle=$(k get apiservice "${APISERVICE}" -o jsonpath='{.spec.caBundle}')
[[ -n "${ca_bundle}" ]] || fail "cainjector did not fill in caBundle"
[[ -z "$(k get apiservice "${APISERVICE}" -o jsonpath='{.spec.insecureSkipTLSVerify}')" ]] ||
  fail "insecureSkipTLSVerify is set"
ok "Available, caBundle injected, TLS verified by the aggregator"

step "kubectl api-resources --api-group ${GROUP}"
resources=$(k api-resources --api-group "${GROUP}" -o name)
printf '%s\n' "${resources}"
grep -qx "widgets.${GROUP}" <<<"${resources}" || fail "widgets not discovered"
ok "widgets discovered through the aggregator"

step "create / get / list / patch / delete a Widget"
k create -f - <<'YAML'
apiVersion: demo.kshard.dev/v1
kind: Widget
metadata: {name: e2e-crud, namespace: default}
spec: {replicas: 1, color: blue}
YAML
[[ "$(k get widget e2e-crud -o jsonpath='{.spec.color}')" == blue ]] || fail "get: wrong color"
ok "create + get"
k get widgets -o name | grep -qx "widget.${GROUP}/e2e-crud" || fail "list: e2e-crud missing"
ok "list"
k patch widget e2e-crud --type merge -p '{"spec":{"color":"red"}}' >/dev/null
[[ "$(k get widget e2e-crud -o jsonpath='{.spec.color}')" == red ]] || fail "patch not visible"
ok "merge patch"
k delete widget e2e-crud --wait=true >/dev/null
if k get widget e2e-crud >/dev/null 2>&1; then fail "e2e-crud still there after delete"; fi
ok "delete"

step "kubectl apply --server-side"
apply_widget() {
  k apply --server-side --field-manager=kshard-e2e -f - <<YAML
apiVersion: demo.kshard.dev/v1
kind: Widget
metadata: {name: e2e-ssa, namespace: default}
spec: {replicas: $1, color: $2}
YAML
}
apply_widget 2 green
apply_widget 3 green
[[ "$(k get widget e2e-ssa -o jsonpath='{.spec.replicas}')" == 3 ]] || fail "re-apply not visible"
managers=$(k get widget e2e-ssa --show-managed-fields -o jsonpath='{.metadata.managedFields[*].manager}')
grep -qw kshard-e2e <<<"${managers}" || fail "managedFields lacks kshard-e2e: ${managers}"
ok "applied twice, managedFields records kshard-e2e"

step "kubectl get -w sees a change"
watch_out="${WORK}/watch.out"
# --request-timeout bounds the watch (no `timeout` binary on macOS).
kubectl --request-timeout=90s get widget e2e-ssa -w -o jsonpath='{.spec.color}{"\n"}' >"${watch_out}" 2>&1 &
WATCH_PID=$!
retry 30 grep -qx green "${watch_out}" || fail "the watch never printed the initial object: $(cat "${watch_out}")"
k patch widget e2e-ssa --type merge -p '{"spec":{"color":"yellow"}}' >/dev/null
retry 30 grep -qx yellow "${watch_out}" || fail "the watch did not see the change: $(cat "${watch_out}")"
kill "${WATCH_PID}" 2>/dev/null || true
WATCH_PID=
ok "watch event arrived"
k delete widget e2e-ssa >/dev/null

step "deleting a namespace removes kshard's objects in it"
k create namespace "${NS}" >/dev/null
k -n "${NS}" create -f - <<'YAML'
apiVersion: demo.kshard.dev/v1
kind: Widget
metadata: {name: doomed}
spec: {replicas: 1, color: black}
YAML
k -n "${NS}" get widget doomed >/dev/null
ok "widget created in ${NS}"
# The host's namespace controller deletes the namespace's contents in every
# API, kshard's through the aggregator, before the namespace goes away.
k delete namespace "${NS}" --timeout=180s >/dev/null
left=$(k -n "${NS}" get widgets -o name)
[[ -z "${left}" ]] || fail "widgets left behind in deleted namespace: ${left}"
if k get namespace "${NS}" >/dev/null 2>&1; then fail "namespace ${NS} still exists"; fi
ok "namespace gone, widget gone"
