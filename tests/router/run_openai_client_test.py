#!/usr/bin/env python3
"""CTest driver for the official `openai` Python client against a real k3-router.

Makes a venv under the build dir (K3_VENV) and installs `openai` from PyPI into it (skips, exit 77,
only when PyPI cannot be reached), generates a k3-tiny model with k3-genweights, starts k3-router on
a free port, runs openai_client_test.py with the venv's python, and always stops the router.

With --cluster it starts `k3-cluster --spec <temp spec>` instead (router in cluster mode on a free
port, prefill PP2, decode DP1, the same generated model), so every token crosses prefill -> UCX ->
decode; the launcher is stopped with SIGTERM and must exit 0 (no child crashed). A plain k3-router
on the same model runs beside it (K3_LOCAL_BASE_URL): the cluster's logprobs are compared with local mode's.

With --script NAME it runs tests/router/NAME instead of openai_client_test.py (same server set-up);
--pip PKG (repeatable) installs PKG into the venv too.
"""
import json
import os
import threading
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ["K3_BIN_DIR"]
VENV = os.environ["K3_VENV"]
SKIP = 77


def pypi_reachable():
    try:
        with urllib.request.urlopen("https://pypi.org/simple/openai/", timeout=15) as r:
            return r.status == 200
    except Exception as e:  # noqa: BLE001 - any failure means unreachable here
        print(f"PyPI check failed: {e}")
        return False


def ensure_venv(extra=()):
    py = os.path.join(VENV, "bin", "python")
    packages = ["openai", *extra]
    if os.path.exists(py):
        ok = subprocess.run([py, "-c", "import " + ", ".join(packages)], capture_output=True).returncode == 0
        if ok:
            return py
    if not os.path.exists(py):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    r = subprocess.run([py, "-m", "pip", "install", "--quiet", *packages], capture_output=True, text=True)
    if r.returncode != 0:
        print(r.stdout, r.stderr)
        if not pypi_reachable():
            print(f"SKIP: PyPI is unreachable, {packages} cannot be installed")
            sys.exit(SKIP)
        sys.exit(f"pip install {packages} failed although PyPI is reachable")
    return py


def start_router(model_dir):
    proc = subprocess.Popen([os.path.join(BIN, "k3-router"), "--model", model_dir, "--port", "0",
                             "--served-model-name", "k3-tiny", "--threads", "2"],
                            stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                sys.exit(f"k3-router exited early with {proc.returncode}")
            continue
        if line.startswith("listening on "):
            return proc, line.split("listening on ", 1)[1].strip()
    proc.kill()
    sys.exit("k3-router did not print its endpoint within 120 s")


def start_cluster(model_dir, tmp):
    spec = {"model": model_dir,
            "router": {"host": "127.0.0.1", "port": 0, "placement": "round-robin", "served_model_name": "k3-tiny"},
            "prefill": [{"id": "p", "stages": 2, "chunk_size": 5, "max_requests": 8}],
            "decode": [{"id": "d", "ranks": 1, "max_requests": 8}],
            "threads": 1,
            "timeouts": {"heartbeat_ms": 200, "heartbeat_misses": 5, "startup_s": 240}}
    path = os.path.join(tmp, "spec.json")
    with open(path, "w") as f:
        json.dump(spec, f)
    proc = subprocess.Popen([os.path.join(BIN, "k3-cluster"), "--spec", path], stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                sys.exit(f"k3-cluster exited early with {proc.returncode}")
            continue
        print(line.rstrip())
        if line.startswith("ENDPOINT "):
            # Keep draining the launcher's stdout so it never blocks on a full pipe.
            threading.Thread(target=lambda: [print(l.rstrip()) for l in proc.stdout], daemon=True).start()
            return proc, line.split("ENDPOINT ", 1)[1].strip()
    stop(proc)
    sys.exit("k3-cluster did not print its endpoint within 300 s")


def stop(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def main():
    args = sys.argv[1:]
    cluster = "--cluster" in args
    script = args[args.index("--script") + 1] if "--script" in args else "openai_client_test.py"
    extra = [args[i + 1] for i, a in enumerate(args) if a == "--pip"]
    server = "k3-cluster" if cluster else "k3-router"
    tools = ("k3-cluster", "k3-router", "k3-prefill", "k3-decode") if cluster else ("k3-router",)
    for tool in tools + ("k3-genweights", "k3-generate"):
        if not os.path.exists(os.path.join(BIN, tool)):
            sys.exit(f"{tool} is not built in {BIN}")
    py = ensure_venv(extra)
    with tempfile.TemporaryDirectory(prefix="k3-openai-test-") as tmp:
        model = os.path.join(tmp, "k3-tiny")
        subprocess.run([os.path.join(BIN, "k3-genweights"), "--preset", "k3-tiny", "--out", model, "--seed", "0"],
                       check=True, stdout=subprocess.DEVNULL)
        proc, url = start_cluster(model, tmp) if cluster else start_router(model)
        local = None
        try:
            env = dict(os.environ, K3_BASE_URL=url + "/v1", K3_MODEL_DIR=model, K3_BIN_DIR=BIN)
            if cluster:
                env["K3_SERVER_KIND"] = "cluster"
                local, local_url = start_router(model)
                env["K3_LOCAL_BASE_URL"] = local_url + "/v1"
            rc = subprocess.run([py, os.path.join(HERE, script)], env=env).returncode
        finally:
            if local is not None:
                stop(local)
            code = stop(proc)
        if rc == 0 and code != 0:
            sys.exit(f"{server} exited with {code} on SIGTERM")
        sys.exit(rc)


if __name__ == "__main__":
    main()
