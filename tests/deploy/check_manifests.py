#!/usr/bin/env python3
"""Builds every Kustomize layout `k3-cluster render --target k8s` wrote (base and each overlay) with
`kubectl kustomize`, validates every resource strictly against the Kubernetes schemas with
kubernetes-validate, and checks what the deployment needs: one StatefulSet per prefill instance (a pod
per stage) and per decode entry (a pod per DP rank: a rank group's leader and members together in one
pod), headless Services that publish not-ready pods, probes on every container, the spec in a ConfigMap
without the API key, a GPU per node pod in the k3 overlay (a GPU per rank for a rank group over NCCL),
the model generated in the k3-tiny-cpu overlay, and every shell script in a container command or probe
parses (sh -n).

usage: check_manifests.py RENDER_DIR KUBECTL EXPECT_JSON
EXPECT_JSON: {"prefill": {"<id>": stages}, "decode": {"<id>": ranks or {"pods": ranks, "group": processes
a rank, "gpus": GPUs a pod on the k3 overlay}}}
Exit status 0 when everything holds; each failure is printed."""
import json
import subprocess
import sys

import kubernetes_validate
import yaml

K8S_VERSION = "1.30.0"
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def build(kubectl, path):
    out = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True)
    if out.returncode != 0:
        failures.append(f"kubectl kustomize {path}: {out.stderr.strip()}")
        return []
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def main():
    render_dir, kubectl, expect = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    layouts = {name: build(kubectl, f"{render_dir}/{path}")
               for name, path in [("base", "base"), ("k3-tiny-cpu", "overlays/k3-tiny-cpu"), ("k3", "overlays/k3")]}
    for name, docs in layouts.items():
        check(len(docs) > 0, f"{name}: no resources")
        for d in docs:
            try:
                kubernetes_validate.validate(d, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                failures.append(f"{name}: {d['kind']}/{d['metadata']['name']}: {e.message} at {list(e.path)}")
        sets, services = by_kind(docs, "StatefulSet"), by_kind(docs, "Service")
        check("k3-router" in by_kind(docs, "Deployment"), f"{name}: no router Deployment")
        check("k3-router" in services, f"{name}: no router Service")
        gpus_of = {}
        for role, groups in expect.items():
            for gid, want in groups.items():
                count = want["pods"] if isinstance(want, dict) else want
                group = want.get("group", 1) if isinstance(want, dict) else 1
                gpus_of[f"k3-{role}-{gid}"] = want.get("gpus", 1) if isinstance(want, dict) else 1
                sts = sets.get(f"k3-{role}-{gid}")
                check(sts is not None, f"{name}: no StatefulSet k3-{role}-{gid}")
                if sts is None:
                    continue
                check(sts["spec"]["replicas"] == count, f"{name}: k3-{role}-{gid} has {sts['spec']['replicas']} pods, want {count}")
                svc = services.get(sts["spec"]["serviceName"])
                check(svc is not None and svc["spec"].get("clusterIP") == "None" and svc["spec"].get("publishNotReadyAddresses"),
                      f"{name}: k3-{role}-{gid} has no headless Service publishing not-ready pods")
                script = sts["spec"]["template"]["spec"]["containers"][0]["command"][2]
                for i in range(count):
                    start = f"  {i}) exec " if group == 1 else f"  {i}) members="
                    check(start in script, f"{name}: k3-{role}-{gid} starts nothing on ordinal {i}")
                members = script.count("'--group-rank'")
                check(members == count * (group - 1),
                      f"{name}: k3-{role}-{gid} starts {members} group members, want {count * (group - 1)}")
        check(len(sets) == sum(len(g) for g in expect.values()), f"{name}: {len(sets)} StatefulSets")
        for w in list(sets.values()) + list(by_kind(docs, "Deployment").values()):
            c = w["spec"]["template"]["spec"]["containers"][0]
            scripts = [c["command"][2]] + [c[p]["exec"]["command"][2] for p in ("startupProbe", "readinessProbe", "livenessProbe")
                                           if "exec" in c.get(p, {})]
            for script in scripts:
                syntax = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True)
                check(syntax.returncode == 0, f"{name}: {w['metadata']['name']}: shell syntax: {syntax.stderr.strip()}")
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                check(probe in c, f"{name}: {w['metadata']['name']} has no {probe}")
            gpu = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
            env = {e["name"]: e.get("value") for e in c["env"]}
            if name == "k3" and w["kind"] == "StatefulSet":
                want_gpus = gpus_of.get(w["metadata"]["name"], 1)
                check(gpu == want_gpus, f"k3: {w['metadata']['name']} asks for {gpu} GPUs, want {want_gpus}")
                check(env["K3_BACKEND"] == "cuda", f"k3: {w['metadata']['name']} backend {env['K3_BACKEND']}")
            if name == "k3-tiny-cpu":
                check(gpu is None, f"k3-tiny-cpu: {w['metadata']['name']} asks for a GPU")
                check(env["K3_BACKEND"] == "cpu", f"k3-tiny-cpu: {w['metadata']['name']} backend {env['K3_BACKEND']}")
                init = w["spec"]["template"]["spec"].get("initContainers", [])
                check(len(init) == 1 and init[0]["command"][0] == "k3-genweights",
                      f"k3-tiny-cpu: {w['metadata']['name']} does not generate the model")
        spec = json.loads(by_kind(docs, "ConfigMap")["k3-spec"]["data"]["spec.json"])
        check("api_key" not in spec.get("router", {}), f"{name}: the ConfigMap carries the API key")
        check(len(spec["prefill"]) == len(expect["prefill"]), f"{name}: the ConfigMap's spec differs")
        keys = by_kind(docs, "Secret").get("k3-control-keys")
        check(keys is not None and "public_keys" in keys["data"], f"{name}: no control-keys Secret")
    for f in failures:
        print("FAIL", f)
    print(f"checked {sum(len(d) for d in layouts.values())} resources in {len(layouts)} layouts, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
