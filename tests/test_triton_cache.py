"""benchmarks/triton_cache.py: a packed cache unpacks to the entries Triton's lookup needs."""
import importlib.util
import io
import json
import tarfile
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "triton_cache", Path(__file__).resolve().parents[1] / "benchmarks" / "triton_cache.py")
triton_cache = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(triton_cache)


def _entry(root: Path, key: str, name: str) -> None:
    """A cache entry as Triton writes one: every stage of the kernel and a group naming them."""
    d = root / key
    d.mkdir(parents=True)
    children = {}
    for suffix, payload in ((".source", "src"), (".ttir", "ir"), (".ttgir", "gir"), (".llir", "ll"),
                            (".ptx", "ptx" * 1000), (".cubin", "\x7fELF"), (".json", '{"name": "%s"}' % name)):
        (d / (name + suffix)).write_text(payload)
        children[name + suffix] = f"/root/.triton/cache/{key}/{name}{suffix}"
    (d / f"__grp__{name}.json").write_text(json.dumps({"child_paths": children}))


@pytest.mark.parametrize("xz_tool", [True, False])
def test_pack_keeps_metadata_and_binaries_and_unpack_points_groups_at_the_new_cache(tmp_path, monkeypatch, xz_tool):
    if not xz_tool:  # (Python's lzma where the machine has no xz)
        monkeypatch.setattr(triton_cache.shutil, "which", lambda name: None)
    elif triton_cache.shutil.which("xz") is None:
        pytest.skip("no xz tool on this machine")
    source, target, parts = tmp_path / "a", tmp_path / "b", tmp_path / "parts"
    _entry(source, "KEY1", "resolve_kernel")
    _entry(source, "KEY2", "compact_kernel")
    (source / "KEY3").mkdir()
    (source / "KEY3" / "__triton_launcher.so").write_bytes(b"\x7fELF launcher")
    (source / "KEY4").mkdir()
    (source / "KEY4" / "lock").write_text("")  # nothing kept: no entry
    monkeypatch.setenv("TRITON_CACHE_DIR", str(source))
    assert triton_cache.pack(parts) == 3
    assert [p.name for p in parts.iterdir()] == [triton_cache.NAME + ".part-00"]

    monkeypatch.setenv("TRITON_CACHE_DIR", str(target))
    assert triton_cache.unpack(parts) == 2
    assert sorted(p.name for p in (target / "KEY1").iterdir()) == [
        "__grp__resolve_kernel.json", "resolve_kernel.cubin", "resolve_kernel.json"]
    assert (target / "KEY3" / "__triton_launcher.so").read_bytes() == b"\x7fELF launcher"
    assert not (target / "KEY4").exists()
    group = json.loads((target / "KEY1" / "__grp__resolve_kernel.json").read_text())
    assert group["child_paths"] == {name: str(target / "KEY1" / name)
                                    for name in ("resolve_kernel.cubin", "resolve_kernel.json")}
    # a second unpack adds nothing and keeps what is there
    (target / "KEY2" / "compact_kernel.cubin").write_text("newer")
    assert triton_cache.unpack(parts) == 0
    assert (target / "KEY2" / "compact_kernel.cubin").read_text() == "newer"
    # no parts: nothing to do
    assert triton_cache.unpack(tmp_path / "none") == 0


@pytest.mark.parametrize("name", ["./../KEY/evil.cubin", "./KEY/../../evil", "/abs/KEY/file", "./KEY/sub/file"])
def test_unpack_refuses_members_that_would_land_outside_the_cache(tmp_path, monkeypatch, name):
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        info = tarfile.TarInfo(name)
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / (triton_cache.NAME + ".part-00")).write_bytes(data.getvalue())
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ValueError, match="unexpected member"):
        triton_cache.unpack(parts)
    assert not (tmp_path / "evil.cubin").exists() and not (tmp_path / "evil").exists()
