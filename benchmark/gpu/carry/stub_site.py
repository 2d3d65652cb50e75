"""Give the python stub's numpy<2 environment a host's torch stack: link the host's site-packages into a folder,
leaving out numpy and every distribution that cannot import under the stub's numpy.

    python benchmark/gpu/carry/stub_site.py HOST_SITE DEST --python STUB_PYTHON [--check STATEMENT]

DEST reaches the stub through a `.pth` file this writes into the stub environment's site-packages (the stub reads
no PYTHONPATH, but its interpreter's `site` reads `.pth` files); it removes that file again if STATEMENT cannot be
made to import, so a failure leaves the stub environment as it was (still good for `engine_process=true`).

Why: the hf model's `engine_process=false` runs the engine in the stub's interpreter, which must keep numpy<2
(README, "GPU machines").  Where torch comes with numpy 2 and the host cannot download, the stub environment can
still see the host's torch and transformers through a `.pth` line, but not the host's compiled packages built
against numpy 2: on the H200 host transformers imports scikit-learn, which imports a scipy that uses `np.long`, and
`from transformers import AutoTokenizer` then fails ("Could not import module 'AutoTokenizer'").
transformers only imports what it finds, so a distribution left out is one it does not try.

What is left out, in three steps:
1. numpy itself (the stub environment has its own);
2. distributions whose requirements exclude the stub's numpy (metadata: `numpy>=2`);
3. then, until STATEMENT imports in STUB_PYTHON with DEST on its path (tried at most --tries times): the
   distribution that holds the innermost frame of the failure's chain.
Each step also leaves out every distribution that requires one left out, so none is found half there.
Prints what it left out and why; exits 1 if STATEMENT still fails.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

# runs in STUB_PYTHON: executes STATEMENT; on failure prints, as JSON, the exception chain and every frame's file
_PROBE = r"""
import json, sys, traceback
try:
    exec(sys.argv[1])
except BaseException as exc:
    chain, c = [], exc
    while c is not None and len(chain) < 20:
        chain.append(c)
        c = c.__cause__ or c.__context__
    frames = [f.filename for e in chain for f in traceback.extract_tb(e.__traceback__)]
    print(json.dumps({"error": [f"{type(e).__name__}: {e}" for e in chain], "files": frames}))
    sys.exit(1)
"""


def distributions(site: str) -> dict:
    """canonical name -> (Distribution, its top-level entries in `site`: packages, modules, its .dist-info)."""
    out = {}
    for dist in md.distributions(path=[site]):
        name = canonicalize_name(dist.metadata["Name"] or "")
        if not name or name in out:
            continue
        tops = {os.path.basename(str(dist._path))}  # the .dist-info folder: left out, its version is not found
        for f in dist.files or ():
            first = f.parts[0]
            if first not in ("..", "__pycache__") and not first.endswith(".pth"):
                tops.add(first)  # a folder or a module's file, as named in `site`
        out[name] = (dist, tops)
    return out


def requirements(dist) -> list:
    """The distribution's requirements that hold without extras (what importing it needs)."""
    reqs = []
    for text in dist.requires or ():
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            reqs.append(req)
    return reqs


def close(dropped: dict, dists: dict) -> None:
    """Add, with the reason, every distribution that requires one already in `dropped` (but numpy: the stub has its
    own)."""
    grew = True
    while grew:
        grew = False
        for name, (dist, _) in dists.items():
            if name in dropped:
                continue
            needs = [canonicalize_name(r.name) for r in requirements(dist)]
            hit = next((n for n in needs if n in dropped and n != "numpy"), None)
            if hit:
                dropped[name] = f"requires {hit}"
                grew = True


def refuse_foreign(dest: str) -> None:
    """Exit if DEST holds anything but links: never delete what this did not make."""
    kept = [e for e in os.listdir(dest) if not os.path.islink(os.path.join(dest, e))] if os.path.isdir(dest) else []
    if kept or (os.path.exists(dest) and not os.path.isdir(dest)):
        raise SystemExit(f"stub_site: {dest} holds more than links ({(kept or [dest])[0]}, ...); name a new folder")


def link(site: str, dest: str, skip: set) -> None:
    """DEST holds a link to each entry of SITE except those in `skip` (rebuilt from scratch)."""
    refuse_foreign(dest)
    if os.path.isdir(dest):
        shutil.rmtree(dest)
    os.makedirs(dest)
    for entry in sorted(os.listdir(site)):
        if entry not in skip and not entry.endswith(".pth") and entry != "__pycache__":
            os.symlink(os.path.join(site, entry), os.path.join(dest, entry))


def owner(path: str, site: str, dists: dict) -> str | None:
    """The distribution whose files hold `path` (a frame's file under SITE), if any."""
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(site))
    if rel.startswith(".."):
        return None
    first = rel.split(os.sep)[0]
    return next((n for n, (_, tops) in dists.items() if first in tops), None)


def probe(python: str, statement: str) -> dict | None:
    """None if `statement` imports in `python` as the stub would run it (no PYTHONPATH), else what failed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([python, "-c", _PROBE, statement], capture_output=True, text=True, env=env, timeout=300)
    if p.returncode == 0:
        return None
    last = (p.stdout.strip().splitlines() or [""])[-1]
    try:
        found = json.loads(last)
    except json.JSONDecodeError:
        found = None
    if not isinstance(found, dict) or "error" not in found:  # died without the probe's report (a crash)
        found = {"error": [p.stderr.strip()[-500:] or f"exit {p.returncode}"], "files": []}
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("site", help="the host's site-packages (where torch is)")
    ap.add_argument("dest", help="the folder of links to make (replaced)")
    ap.add_argument("--python", required=True, help="the stub environment's python3 (numpy<2)")
    ap.add_argument(
        "--check",
        default="from transformers import AutoModelForCausalLM, AutoTokenizer",
        help="what must import in the stub environment",
    )
    ap.add_argument("--tries", type=int, default=12, help="at most this many distributions left out for failing")
    ap.add_argument(
        "--pth",
        default="zz_llmlaunch_host_site.pth",
        help="the .pth file's name in the stub environment's site-packages",
    )
    a = ap.parse_args(argv)
    where = "import numpy, sysconfig; print(numpy.__version__); print(sysconfig.get_paths()['purelib'])"
    numpy_version, purelib = subprocess.check_output([a.python, "-I", "-c", where], text=True).split()
    a.dest = os.path.abspath(a.dest)
    refuse_foreign(a.dest)  # before the .pth is written: a refusal leaves the stub environment as it was
    pth = os.path.join(purelib, a.pth)
    with open(pth, "w") as f:  # appended to the stub's path after its own site-packages: its numpy comes first
        f.write(a.dest + "\n")
    dists = distributions(a.site)
    dropped = {"numpy": "the stub environment has its own"} if "numpy" in dists else {}
    for name, (dist, _) in dists.items():
        for req in requirements(dist):
            if (
                canonicalize_name(req.name) == "numpy"
                and req.specifier
                and not req.specifier.contains(numpy_version, prereleases=True)
            ):
                dropped.setdefault(name, f"requires numpy{req.specifier}, the stub has {numpy_version}")
    close(dropped, dists)
    failure = None
    for _ in range(a.tries + 1):
        link(a.site, a.dest, set().union(*(dists[n][1] for n in dropped)))
        failure = probe(a.python, a.check)
        if failure is None:
            break
        # the innermost frame in a host distribution (frames in the stub's own numpy belong to none)
        culprit = next((o for f in reversed(failure["files"]) if (o := owner(f, a.site, dists))), None)
        if culprit is None or culprit in dropped or culprit in ("torch", "transformers"):
            break  # nothing left to leave out that would help
        dropped[culprit] = "fails to import: " + failure["error"][-1][:160]
        close(dropped, dists)
    for name in sorted(dropped):
        print(f"stub_site: left out {name}: {dropped[name]}")
    if failure is not None:
        os.remove(pth)
        print(
            f"stub_site: `{a.check}` still fails in {a.python}: " + " <- ".join(failure["error"])[:1500],
            file=sys.stderr,
        )
        return 1
    print(
        f"stub_site: {pth} -> {a.dest}: {len(dists) - len(dropped)} of {len(dists)} distributions; `{a.check}` imports"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
