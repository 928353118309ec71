"""The machine a result was taken on, and which peers import on it (``treefold info``)."""
from __future__ import annotations

import os
import platform

import torch


def triton_version() -> str:
    try:
        import triton  # noqa: PLC0415
    except Exception as e:  # a broken triton install is worth reporting, not crashing on
        return f"not importable ({short_error(e)})"
    return str(getattr(triton, "__version__", "unknown"))


def short_error(e: BaseException, limit: int = 160) -> str:
    """The first line of an exception, prefixed with its type, at most ``limit`` characters."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    msg = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return msg if len(msg) <= limit else msg[: limit - 3] + "..."


def machine_info(device: torch.device) -> dict:
    from treefold import __version__  # noqa: PLC0415

    info = {
        "treefold": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version(),
        "platform": platform.platform(),
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update({
            "gpu": props.name,
            "sm_count": props.multi_processor_count,
            "l2_bytes": getattr(props, "L2_cache_size", None),
            "memory_bytes": props.total_memory,
            "compute_capability": f"{props.major}.{props.minor}",
            "cuda": torch.version.cuda,
        })
    else:
        info.update({"cpu": platform.processor() or platform.machine(), "cpu_count": os.cpu_count()})
    return info


def describe_machine(info: dict) -> str:
    """One line: what ran, with which software."""
    if "gpu" in info:
        l2 = info.get("l2_bytes")
        l2_text = f", {l2 / 2**20:.0f} MiB L2" if l2 else ""
        hw = f"{info['gpu']} ({info['sm_count']} SMs{l2_text})"
    else:
        hw = f"CPU {info.get('cpu', '')} ({info.get('cpu_count')} cores)"
    return (f"{hw}; treefold {info['treefold']}, torch {info['torch']}, triton {info['triton']}, "
            f"Python {info['python']}")


def peer_status(peer_names=None) -> list[dict]:
    """Try to load each peer; report its version or why it is unavailable."""
    from .providers import PEER_NAMES, make_providers  # noqa: PLC0415

    names = list(peer_names or PEER_NAMES)
    status = []
    for p in make_providers(names)[1:]:
        try:
            p.load()
        except Exception as e:
            status.append({"name": p.name, "title": p.title, "available": False, "version": "",
                           "reason": short_error(e)})
        else:
            status.append({"name": p.name, "title": p.title, "available": True, "version": p.version(),
                           "reason": ""})
    return status
