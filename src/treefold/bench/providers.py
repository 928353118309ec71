"""Who is measured: treefold and its peers (torch eager, Hugging Face's eager model code,
torch.compile, Liger-Kernel, QuACK).

A provider is loaded once (``load`` raises when it cannot be imported: the run goes on without it,
with a line saying so) and then asked, per case and shape, for an ``Impl``: a no-argument call
over the inputs it was given. ``build`` returns None when the provider has no such op, and raises
``Unsupported`` when it has the op but not this shape, dtype or device; either way the run goes on.

The peers' calls follow their published Python APIs: Liger-Kernel's
``liger_kernel.transformers.functional`` (``liger_rms_norm``, ``liger_fused_add_rms_norm``,
``liger_layer_norm``, ``liger_cross_entropy``, ``liger_softmax`` or ``LigerSoftmaxFunction``) and
QuACK's ``quack.softmax``, ``quack.rmsnorm``, ``quack.cross_entropy``, its LayerNorm forward (which
takes float32 weights) and ``quack.topk.topk`` (N a power of two, at most 4096).
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .cases import LN_EPS, RMS_EPS, TOP_K, Case, Shape

PEER_NAMES = ("torch", "hf", "compile", "liger", "quack")


class Unsupported(Exception):
    """The provider has this op but not for this shape, dtype or device."""


@dataclass
class Impl:
    fn: Callable[[], Any]
    inputs: dict                 # the tensors ``fn`` reads; gradients are taken with respect to these
    note: str = ""
    comparable: bool = True      # False: the output is not the case's output (accuracy is not judged)
    mutates_input: bool = False  # True: repeated calls see changed inputs (determinism is not judged)


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version  # noqa: PLC0415
        return version(dist)
    except Exception:
        return "unknown"


def _needs_cuda(name: str, inputs: dict) -> None:
    x = inputs.get("x")
    if isinstance(x, torch.Tensor) and not x.is_cuda:
        raise Unsupported(f"{name} needs a CUDA device")


class Provider:
    """Base class: a named implementation source."""

    name = "provider"
    title = "provider"
    is_peer = True

    def load(self) -> None:
        """Import what the provider needs; raise (ImportError or any error) when it cannot."""

    def version(self) -> str:
        return ""

    def build(self, case: Case, inputs: dict, shape: Shape) -> Impl | None:
        raise NotImplementedError


class TreefoldProvider(Provider):
    name = "treefold"
    title = "treefold"
    is_peer = False

    def __init__(self, namespace: Any = None):
        self._namespace = namespace

    def load(self) -> None:
        if self._namespace is None:
            self._namespace = importlib.import_module("treefold")

    @property
    def namespace(self) -> Any:
        if self._namespace is None:
            self.load()
        return self._namespace

    def version(self) -> str:
        return str(getattr(self.namespace, "__version__", ""))

    def has(self, case: Case) -> bool:
        return callable(getattr(self.namespace, case.treefold_op, None))

    def build(self, case: Case, inputs: dict, shape: Shape) -> Impl | None:
        if not self.has(case):
            return None
        ns = self.namespace
        return Impl(lambda: case.call_treefold(ns, inputs), inputs)


class TorchProvider(Provider):
    name = "torch"
    title = "torch eager"

    def version(self) -> str:
        return torch.__version__

    def build(self, case: Case, inputs: dict, shape: Shape) -> Impl | None:
        return Impl(lambda: case.eager(inputs), inputs)


class HuggingFaceProvider(Provider):
    """Hugging Face's eager model code (transformers' few lines, written in ``cases``) for the ops
    where it is not torch's own call: RMSNorm (a float32 row cast back before the weight), with
    and without the residual add. Elsewhere the models call torch (``nn.LayerNorm``,
    ``torch.softmax``), which the torch peer already measures, or the torch peer is Hugging
    Face's code itself (top-p sampling)."""

    name = "hf"
    title = "Hugging Face eager"

    def version(self) -> str:
        return torch.__version__

    def build(self, case: Case, inputs: dict, shape: Shape) -> Impl | None:
        if case.hf_eager is None:
            return None
        return Impl(lambda: case.hf_eager(inputs), inputs)


class CompileProvider(Provider):
    """torch.compile of the model code (Inductor, default mode, static shapes): Hugging Face's
    where the case has it (``Case.hf_eager``), else the case's torch code."""

    name = "compile"
    title = "torch.compile"

    def load(self) -> None:
        if not hasattr(torch, "compile"):
            raise ImportError("this torch has no torch.compile")
        cfg = importlib.import_module("torch._dynamo").config
        # every (case, shape) compiles its own graph; the default limit of 8 per code object would
        # silently fall back to eager after the eighth shape
        for attr, floor in (("cache_size_limit", 256), ("recompile_limit", 256),
                            ("accumulated_cache_size_limit", 4096), ("accumulated_recompile_limit", 4096)):
            if hasattr(cfg, attr):
                setattr(cfg, attr, max(int(getattr(cfg, attr)), floor))

    def version(self) -> str:
        return torch.__version__

    def build(self, case: Case, inputs: dict, shape: Shape) -> Impl | None:
        compiled = torch.compile(case.hf_eager or case.eager, dynamic=False)
        return Impl(lambda: compiled(inputs), inputs)


class LigerProvider(Provider):
    name = "liger"
    title = "Liger-Kernel"

    def load(self) -> None:
        self._functional = importlib.import_module("liger_kernel.transformers.functional")

    def version(self) -> str:
        return _version("liger-kernel")

    def _softmax(self) -> Callable | None:
        fn = getattr(self._functional, "liger_softmax", None)
        if fn is not None:
            return fn
        try:
            return importlib.import_module("liger_kernel.ops.softmax").LigerSoftmaxFunction.apply
        except (ImportError, AttributeError):
            return None

    def build(self, case: Case, inputs: dict, shape: Shape) -> Impl | None:
        lf, i, base = self._functional, inputs, case.base
        if base == "softmax":
            fn = self._softmax()
            if fn is None:
                return None
            _needs_cuda(self.title, i)
            return Impl(lambda: fn(i["x"]), i)
        if base == "rms_norm":
            _needs_cuda(self.title, i)
            return Impl(lambda: lf.liger_rms_norm(i["x"], i["weight"], RMS_EPS, offset=0.0,
                                                  casting_mode="llama", in_place=False), i)
        if base == "rms_norm+residual":
            fn = getattr(lf, "liger_fused_add_rms_norm", None)
            if fn is None:
                return None
            _needs_cuda(self.title, i)
            return Impl(lambda: tuple(fn(i["x"], i["residual"], i["weight"], RMS_EPS, offset=0.0,
                                         casting_mode="llama", in_place=False)), i)
        if base == "layer_norm":
            _needs_cuda(self.title, i)
            return Impl(lambda: lf.liger_layer_norm(i["x"], i["weight"], i["bias"], LN_EPS), i)
        if base == "cross_entropy":
            _needs_cuda(self.title, i)
            # with a gradient wanted, Liger writes dx into the logits' storage during the forward
            return Impl(lambda: lf.liger_cross_entropy(i["x"], i["target"], reduction="none"), i,
                        mutates_input=bool(i["x"].requires_grad),
                        note="writes dx into its input" if i["x"].requires_grad else "")
        if base == "cross_entropy_mean":
            _needs_cuda(self.title, i)
            return Impl(lambda: lf.liger_cross_entropy(i["x"], i["target"], reduction="mean"), i,
                        mutates_input=bool(i["x"].requires_grad),
                        note="writes dx into its input" if i["x"].requires_grad else "")
        return None


def _first_attr(candidates) -> tuple[Callable, str] | None:
    for module, attr in candidates:
        try:
            fn = getattr(importlib.import_module(module), attr, None)
        except Exception:
            fn = None
        if callable(fn):
            return fn, f"{module}.{attr}"
    return None


def _accepts(fn: Callable, *names: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return all(n in params for n in names)


class QuackProvider(Provider):
    name = "quack"
    title = "QuACK"

    #: Where QuACK's LayerNorm forward lives, newest layout first.
    LAYERNORM_CANDIDATES = (("quack.rmsnorm", "layernorm_fwd"), ("quack.layernorm", "layernorm"),
                            ("quack.layernorm", "layernorm_fwd"), ("quack.layernorm", "_layernorm_fwd"))
    #: QuACK's top-k keeps a whole row in one warp's registers.
    TOPK_MAX_N = 4096

    def load(self) -> None:
        self._quack = importlib.import_module("quack")

    def version(self) -> str:
        return _version("quack-kernels")

    def build(self, case: Case, inputs: dict, shape: Shape) -> Impl | None:
        q, i, base = self._quack, inputs, case.base
        backward = case.backward is not None
        if base == "softmax":
            _needs_cuda(self.title, i)
            return Impl(lambda: q.softmax(i["x"]), i)
        if base == "rms_norm":
            _needs_cuda(self.title, i)
            return Impl(lambda: q.rmsnorm(i["x"], i["weight"], eps=RMS_EPS), i)
        if base == "rms_norm+residual":
            if not _accepts(q.rmsnorm, "residual", "prenorm"):
                raise Unsupported("this QuACK's rmsnorm takes no residual")
            _needs_cuda(self.title, i)
            return Impl(lambda: tuple(q.rmsnorm(i["x"], i["weight"], residual=i["residual"], eps=RMS_EPS,
                                                prenorm=True)), i)
        if base == "layer_norm":
            if backward:
                return None  # QuACK's LayerNorm forward is not differentiable from Python
            found = _first_attr(self.LAYERNORM_CANDIDATES)
            if found is None:
                return None
            fn, where = found
            _needs_cuda(self.title, i)
            # QuACK's LayerNorm asserts float32 weights: converted here, outside the timed call
            w32 = i["weight"].detach().float()
            if _accepts(fn, "bias"):
                b32 = i["bias"].detach().float()
                return Impl(lambda: fn(i["x"], w32, bias=b32, eps=LN_EPS), i, note=f"{where}, fp32 weight")
            return Impl(lambda: fn(i["x"], w32, eps=LN_EPS), i, comparable=False,
                        note=f"{where} takes no bias: timed without it, accuracy not judged")
        if base == "cross_entropy":
            _needs_cuda(self.title, i)
            if _accepts(q.cross_entropy, "reduction"):
                return Impl(lambda: q.cross_entropy(i["x"], i["target"], reduction="none"), i)
            return Impl(lambda: q.cross_entropy(i["x"], i["target"]), i)
        if base == "cross_entropy_mean":
            _needs_cuda(self.title, i)
            if _accepts(q.cross_entropy, "reduction"):
                return Impl(lambda: q.cross_entropy(i["x"], i["target"], reduction="mean"), i)
            # (no target is ignored in these inputs: the mean of the row losses is the loss)
            return Impl(lambda: q.cross_entropy(i["x"], i["target"]).mean(), i, note="mean of its row losses")
        if base == "top_k":
            try:
                topk = importlib.import_module("quack.topk").topk
            except (ImportError, AttributeError):
                return None
            n = shape.n
            if n & (n - 1) or n > self.TOPK_MAX_N:
                raise Unsupported(f"QuACK's top-k needs N a power of two <= {self.TOPK_MAX_N}, got {n}")
            _needs_cuda(self.title, i)
            return Impl(lambda: tuple(topk(i["x"], TOP_K)), i)
        return None


_PEER_CLASSES = {"torch": TorchProvider, "hf": HuggingFaceProvider, "compile": CompileProvider,
                 "liger": LigerProvider, "quack": QuackProvider}


def parse_peers(text: str) -> list[str]:
    """``"torch,compile"`` -> ["torch", "compile"]; raises ValueError naming an unknown peer."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in names if p not in _PEER_CLASSES]
    if unknown:
        raise ValueError(f"unknown peer(s) {', '.join(unknown)}; choose from {', '.join(PEER_NAMES)}")
    return list(dict.fromkeys(names))


def make_providers(peers: list[str], treefold_namespace: Any = None) -> list[Provider]:
    """treefold first, then the named peers in order."""
    return [TreefoldProvider(treefold_namespace), *(_PEER_CLASSES[p]() for p in peers)]
