"""Carry Triton's compiled kernels from one device machine to the next.

A fresh device machine compiles every kernel a run touches before it times or tests anything:
the sampling GPU tier spends most of a 600 s call compiling (the resolve pass alone about 20 s
per kind of call). Kernels whose source, constexprs and options are unchanged hash to the same
cache entry on any machine with the same Triton, so the cache of one call can serve the next:

    python benchmarks/triton_cache.py unpack .devcache     # first thing in a device call
    ...
    python benchmarks/triton_cache.py pack "$OUT"          # last thing: parts of <= 15 MiB

then, here, copy the returned ``triton-cache.tar.xz.part-*`` files into ``.devcache/``
(ignored by git) and pass ``carry: [".devcache"]`` with the next call.

What is kept: each entry's metadata (``*.json``), its binary (``*.cubin``) and the launchers
(``*.so``); Triton's cache lookup needs only the metadata and the binary, and drops a group's
missing files (``FileCacheManager.get_group``). The intermediate forms (TTIR, TTGIR, LLVM IR,
PTX, source) are most of the bytes: on the sampling probes' 52 kernels 168 MB on disk, 24.5 MB
as tar.gz, against 3.3 MB as tar.xz of the kept files. A kernel loaded from a packed entry has
no ``asm["ptx"]`` or ``asm["ttgir"]``; inspect kernels with ``sass_report.py`` instead.

``unpack`` rewrites each group's child paths to the cache directory it unpacks into (they are
absolute), so ``TRITON_CACHE_DIR`` may differ between machines.
"""
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

#: The file name of the packed cache; ``pack`` writes it in parts NAME.part-00, -01, ...
NAME = "triton-cache.tar.xz"
#: Each part at most this many bytes (the device returns files of at most 16 MiB).
PART_BYTES = 15 * 1024 * 1024
#: The kinds of file an entry keeps (by suffix).
KEPT_SUFFIXES = (".json", ".cubin", ".so")


def cache_dir() -> Path:
    """Triton's cache directory: TRITON_CACHE_DIR, else ~/.triton/cache (Triton's default)."""
    configured = os.environ.get("TRITON_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".triton" / "cache"


def _xz(data_dir: Path, archive: Path) -> None:
    """tar.xz of ``data_dir``'s contents, by the xz tool on all cores where there is one."""
    if shutil.which("xz"):
        with open(archive, "wb") as out:
            tar = subprocess.Popen(["tar", "cf", "-", "-C", str(data_dir), "."], stdout=subprocess.PIPE)
            subprocess.run(["xz", "-6", "-T0", "-c"], stdin=tar.stdout, stdout=out, check=True)
            if tar.wait() != 0:
                raise RuntimeError("tar failed")
    else:
        with tarfile.open(archive, "w:xz") as tar:
            tar.add(data_dir, arcname=".")


def pack(out_dir: Path) -> int:
    """Write the kept files of the cache as NAME's parts into ``out_dir``; returns the entries."""
    source = cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob(NAME + ".part-*"):
        old.unlink()
    entries = 0
    with tempfile.TemporaryDirectory() as tmp:
        kept = Path(tmp) / "kept"
        kept.mkdir()
        if source.is_dir():
            for entry in sorted(p for p in source.iterdir() if p.is_dir()):
                files = [f for f in entry.iterdir() if f.is_file() and f.suffix in KEPT_SUFFIXES]
                if not files:
                    continue
                (kept / entry.name).mkdir()
                for f in files:
                    shutil.copy2(f, kept / entry.name / f.name)
                entries += 1
        archive = Path(tmp) / NAME
        _xz(kept, archive)
        with open(archive, "rb") as whole:
            index = 0
            while True:
                chunk = whole.read(PART_BYTES)
                if not chunk:
                    break
                (out_dir / f"{NAME}.part-{index:02d}").write_bytes(chunk)
                index += 1
    return entries


def _repoint_groups(target: Path) -> None:
    """Point every group file's children at ``target`` (they hold absolute paths of the machine
    that wrote them), and drop the children that were not packed."""
    for group in target.glob("*/__grp__*.json"):
        data = json.loads(group.read_text())
        children = data.get("child_paths")
        if not isinstance(children, dict):
            continue
        moved = {name: str(group.parent / name) for name in children if (group.parent / name).exists()}
        data["child_paths"] = moved
        group.write_text(json.dumps(data))


def unpack(parts_dir: Path) -> int:
    """Extract NAME's parts from ``parts_dir`` into the cache (entries already there are kept);
    returns the entries added, 0 where there are no parts."""
    parts = sorted(parts_dir.glob(NAME + ".part-*"))
    if not parts:
        return 0
    target = cache_dir()
    target.mkdir(parents=True, exist_ok=True)
    data = b"".join(p.read_bytes() for p in parts)
    added = 0
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        for member in tar.getmembers():
            if member.isdir():
                continue
            # (each file is ./HASH/FILE: nothing may land outside the cache)
            names = member.name.split("/")
            if (len(names) != 3 or names[0] != "." or not member.isfile()
                    or any(n in ("", ".", "..") for n in names[1:])):
                raise ValueError(f"unpack: unexpected member {member.name!r} in {parts[0].name}")
            entry, file_name = names[1], names[2]
            destination = target / entry / file_name
            if destination.exists():
                continue
            destination.parent.mkdir(exist_ok=True)
            with tar.extractfile(member) as src, open(destination, "wb") as dst:
                shutil.copyfileobj(src, dst)
            added += file_name.startswith("__grp__")
    _repoint_groups(target)
    return added


def main(argv) -> int:
    if len(argv) != 3 or argv[1] not in ("pack", "unpack"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        print("usage: triton_cache.py pack OUT_DIR | unpack PARTS_DIR", file=sys.stderr)
        return 2
    where = Path(argv[2])
    if argv[1] == "pack":
        print(f"triton_cache: packed {pack(where)} entries of {cache_dir()} into {where}")
    else:
        print(f"triton_cache: {unpack(where)} kernels added to {cache_dir()} from {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
