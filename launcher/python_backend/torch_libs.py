"""Keep an engine that runs inside another program's process on torch's own cuDNN.

The hf model's `engine_process=false` runs the engine in tritonserver's python stub, whose LD_LIBRARY_PATH starts
with the directory of libpython.  Where that directory also holds a system cuDNN (`/usr/lib/x86_64-linux-gnu` on the
GPU hosts lent here), torch loads its own `libcudnn.so.9` (its RPATH) but cuDNN then opens its sub-libraries
(`libcudnn_graph.so.9`, ...) by name, and LD_LIBRARY_PATH comes first in that search: the system's.  A mix of two
cuDNN versions ran decode attention 0.12-0.16 ms a step slower on H100 and H200 (launcher.triton's
ENGINE_LD_LIBRARY_PATH note).  The engine process sidesteps it with
a library path of its own; a process already running cannot change its path, but a library loaded by full path
first is the one a later open by its soname gets (glibc matches loaded objects by soname), so loading torch's
cuDNN libraries up front keeps the set whole.
"""

from __future__ import annotations

import ctypes
import glob
import importlib.util
import mmap
import os
import struct


def torch_cudnn_dir() -> str | None:
    """The folder of the cuDNN that torch's wheels bring (site-packages/nvidia/cudnn/lib), found without importing
    torch; None for a torch without one (CPU builds, a system install)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return None
    lib = os.path.join(os.path.dirname(os.path.dirname(spec.origin)), "nvidia", "cudnn", "lib")
    return lib if os.path.isdir(lib) else None


def preload_torch_cudnn(lib_dir: str | None = None) -> list[str]:
    """Load every cuDNN library in `lib_dir` (default: torch_cudnn_dir()) by full path, globally, before torch does;
    the paths loaded.  Each loads after the libraries of the set it needs (load_order): loaded before them, its
    dependency would be looked up by name, LD_LIBRARY_PATH first, and the system's copy mapped beside torch's (seen:
    torch's libcudnn_adv pulled in the system's libcudnn_ops).  One that fails to load is left to the loader."""
    lib_dir = lib_dir or torch_cudnn_dir()
    if not lib_dir:
        return []
    loaded = []
    for path in load_order(glob.glob(os.path.join(lib_dir, "libcudnn*.so*"))):
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
            loaded.append(path)
        except OSError:
            pass
    return loaded


def load_order(paths: list[str], needs=None) -> list[str]:
    """`paths` ordered so that each comes after those of them it needs (needs(path): the DT_NEEDED names, default
    elf_needed), matched by file name; ties and what a cycle leaves go in name order."""
    needs = needs or elf_needed
    by_name = {os.path.basename(p): p for p in paths}
    wants = {p: {by_name[n] for n in needs(p) if n in by_name and by_name[n] != p} for p in paths}
    order, done = [], set()
    while len(order) < len(paths):
        ready = sorted(p for p in paths if p not in done and wants[p] <= done)
        if not ready:  # a cycle: take the first left, as the loader would
            ready = sorted(p for p in paths if p not in done)[:1]
        order.extend(ready)
        done.update(ready)
    return order


def elf_needed(path: str) -> list[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF shared library (what the loader will look up by name when
    it loads it); [] for anything else.  Reads the headers only (cuDNN's libraries are hundreds of MB)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m[:6] != b"\x7fELF\x02\x01":  # ELF, 64-bit, little-endian
                return []
            (phoff,) = struct.unpack_from("<Q", m, 0x20)
            phentsize, phnum = struct.unpack_from("<HH", m, 0x36)
            loads, dynamic = [], None
            for i in range(phnum):
                p_type, _, p_offset, p_vaddr, _, p_filesz = struct.unpack_from("<IIQQQQ", m, phoff + i * phentsize)
                if p_type == 1:  # PT_LOAD
                    loads.append((p_vaddr, p_filesz, p_offset))
                elif p_type == 2:  # PT_DYNAMIC
                    dynamic = (p_offset, p_filesz)
            if dynamic is None:
                return []
            entries = [struct.unpack_from("<qQ", m, dynamic[0] + j) for j in range(0, dynamic[1], 16)]
            strtab = next((v for tag, v in entries if tag == 5), None)  # DT_STRTAB, a virtual address
            if strtab is None:
                return []
            base = next((strtab - vaddr + off for vaddr, size, off in loads if vaddr <= strtab < vaddr + size), None)
            if base is None:
                return []
            names = []
            for tag, v in entries:
                if tag == 0:  # DT_NULL
                    break
                if tag == 1:  # DT_NEEDED: an offset into the string table
                    start = base + v
                    names.append(m[start : m.find(b"\0", start)].decode())
            return names
    except (OSError, ValueError, struct.error):
        return []


def mapped_files(keep, pid: int | str = "self") -> list[str]:
    """The distinct files a process (default: this one) has mapped whose file name `keep(name)` accepts, full paths,
    sorted; [] for a process gone or not ours to read."""
    found = set()
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                path = line.split(None, 5)[-1].strip() if line.count(" ") >= 5 else ""
                if path and keep(os.path.basename(path)):
                    found.add(path)
    except OSError:
        return []
    return sorted(found)


def mapped_from(prefix: str) -> list[str]:
    """The distinct files mapped into this process whose name starts with `prefix` (e.g. "libcudnn"), full paths."""
    return mapped_files(lambda name: name.startswith(prefix))
