#!/usr/bin/env python3
"""Runs the workspace's test binaries two at a time, as `cargo test` would run them one at a
time: the same binaries, each in its package's directory, every one to the end.

Most integration tests wait on a control plane (a CI run used 28% of the machine's two
cores over 27 minutes), so two binaries side by side halve the wall time. Binaries named
in ALONE (timing-sensitive: a real kubelet and containerd with kill faults; kill storms and
search budgets) run with nothing beside them. Each binary's output is printed whole when it ends; a summary with
times closes the run. Exit status 1 when any binary failed.

Usage: scripts/run_tests.py [--jobs N]   (after `cargo build`-ing nothing: it builds)
"""

import json
import os
import subprocess
import sys
import threading
import time

# Seconds each took in a CI run (a clean clone of 96f76f0, 2026-12-05, cached, 14m14s): the
# longest start first, so the two lanes end together. Binaries not listed count 10 s.
EXPECTED = {
    "node_e2e": 202,
    "reference_scheduler": 189,
    "resilience": 105,
    "daemon": 75,
    "neighbours": 80,
    "fence": 37,
    "gang_reference": 63,
    "preemption": 61,
    "scheduler_conformance": 46,
    "gang": 42,
    "kubectl_dra": 32,
    "compat": 31,
    "handoff": 29,
    "simulate_fuzz": 26,
    "differential": 20,
    "least_privilege": 19,
    "images": 14,
    "node": 14,
    "fuzz": 14,
    "conformance": 11,
}
# resilience: under the load of another binary, its "a long search does not hold up other
# pods" test saw 20 ordinary pods wait until the long search ended (20.3 s with a 20 s
# budget, 40.1 s with 40 s; 1.0 s alone): very likely their first tries ran past the 500 ms
# first-try budget on the starved CPUs and queued behind the long search. Alone until the
# scheduler handles that.
ALONE = {"node_e2e", "resilience"}


def build():
    """Builds every test target; returns (name, executable, package directory)."""
    cmd = ["cargo", "test", "--workspace", "--locked", "--no-run", "--message-format=json"]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, text=True)
    tests = []
    for line in out.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        name = target["name"]
        if "lib" in target["kind"] or "bin" in target["kind"]:
            name = f"{name} ({target['kind'][0]})"
        tests.append((name, msg["executable"], os.path.dirname(msg["manifest_path"])))
    return tests


def expected(name):
    return EXPECTED.get(name, 10)


def main():
    jobs = 2
    if "--jobs" in sys.argv:
        jobs = int(sys.argv[sys.argv.index("--jobs") + 1])
    tests = sorted(build(), key=lambda t: -expected(t[0]))
    queue = list(tests)
    lock = threading.Lock()
    running = {"alone": False, "count": 0}
    wake = threading.Condition(lock)
    results = []

    def take():
        """The next binary this lane may start, waiting while one runs alone."""
        with wake:
            while True:
                if not queue:
                    return None
                if running["alone"]:
                    wake.wait()
                    continue
                for i, t in enumerate(queue):
                    if t[0] in ALONE:
                        if running["count"] == 0:
                            running["alone"] = True
                            running["count"] += 1
                            return queue.pop(i)
                        continue
                    running["count"] += 1
                    return queue.pop(i)
                wake.wait()

    def done(test):
        with wake:
            running["count"] -= 1
            if test[0] in ALONE:
                running["alone"] = False
            wake.notify_all()

    def lane():
        while True:
            test = take()
            if test is None:
                return
            name, exe, cwd = test
            started = time.monotonic()
            proc = subprocess.run(
                [exe], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
            )
            took = time.monotonic() - started
            with lock:
                sys.stdout.write(f"\n     Running {name} ({exe})\n")
                sys.stdout.write(proc.stdout.decode("utf-8", "replace"))
                sys.stdout.flush()
                results.append((name, proc.returncode, took))
            done(test)

    threads = [threading.Thread(target=lane) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [r for r in results if r[1] != 0]
    print("\n==> test binaries (seconds, longest first)")
    for name, code, took in sorted(results, key=lambda r: -r[2]):
        print(f"{took:8.1f}  {'FAILED' if code else 'ok    '}  {name}")
    if failed:
        print(f"\n{len(failed)} test binaries failed: {', '.join(r[0] for r in failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
