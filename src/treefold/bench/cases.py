"""What the bench measures: one ``Case`` per op (and per backward pass), with its shapes, inputs,
float64 reference, torch eager code and the bytes it must move.

Bytes are declared once per case, in the ``bytes_*`` functions below: every input read once and
every output written once (backward: read y or x, read dy, write dx, plus the weight vectors and
their gradients; per-program weight-gradient partials are not counted). GB/s is always this count
over the measured time, so a kernel that reads its input twice is not credited for the second read.

Cases call the public treefold functions by name (``Case.treefold_op``); a case whose function
``treefold`` does not have yet is skipped with a line saying so, so the harness runs as ops land.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .accuracy import exact_accuracy, float_accuracy

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SHAPE_SETS = ("small", "llm", "sweep")

TOP_K = 50            # k of the top-k case
SAMPLE_TOP_P = 0.9    # p of the top-p sampling case
SAMPLE_SEED = 1234    # its seed: every provider draws from a freshly seeded generator


def itemsize(dtype: str) -> int:
    return torch.empty((), dtype=DTYPES[dtype]).element_size()


def pow2_label(v: int) -> str:
    """2^k for powers of two from 1024 up (how the project writes whole-tensor sizes)."""
    if v >= 1024 and v & (v - 1) == 0:
        return f"2^{v.bit_length() - 1}"
    return str(v)


@dataclass(frozen=True)
class Shape:
    rows: int
    n: int           # the reduced length (row length; the whole size for whole-tensor cases)
    dtype: str = "bf16"

    def with_dtype(self, dtype: str) -> "Shape":
        return dataclasses.replace(self, dtype=dtype)

    def as_dict(self) -> dict:
        return {"rows": self.rows, "n": self.n, "dtype": self.dtype}


@dataclass(frozen=True)
class Backward:
    wrt: tuple[str, ...]   # the inputs whose gradients are taken
    fused: bool = False    # time forward + gradient as one step (ops that produce both at once)
    unit_grad: bool = False  # dy = 1, as ``loss.backward()`` gives a scalar loss (else random dy)


# ----------------------------------------------------------------------------------------------
# Bytes: the one place each case's minimum traffic is declared
# ----------------------------------------------------------------------------------------------

def bytes_rowwise(s: Shape) -> int:
    """softmax, log_softmax: read x, write y (same shape and dtype)."""
    return 2 * s.rows * s.n * itemsize(s.dtype)


def bytes_row_to_one(s: Shape) -> int:
    """logsumexp, row sum/mean/max/min/norm: read x, write one value per row in x's dtype."""
    return s.rows * s.n * itemsize(s.dtype) + s.rows * itemsize(s.dtype)


def bytes_row_to_index(s: Shape) -> int:
    """argmax/argmin over rows: read x, write one int64 per row."""
    return s.rows * s.n * itemsize(s.dtype) + s.rows * 8


def bytes_whole_to_one(s: Shape) -> int:
    """Whole-tensor sum: read every element, write one value in x's dtype."""
    return s.rows * s.n * itemsize(s.dtype) + itemsize(s.dtype)


def bytes_whole_to_index(s: Shape) -> int:
    """Whole-tensor argmax: read every element, write one int64."""
    return s.rows * s.n * itemsize(s.dtype) + 8


def bytes_rms_norm(s: Shape) -> int:
    """Read x and the weight, write y."""
    return 2 * s.rows * s.n * itemsize(s.dtype) + s.n * itemsize(s.dtype)


def bytes_add_rms_norm(s: Shape) -> int:
    """Read x, the residual and the weight; write y and h = x + residual."""
    return 4 * s.rows * s.n * itemsize(s.dtype) + s.n * itemsize(s.dtype)


def bytes_layer_norm(s: Shape) -> int:
    """Read x, the weight and the bias, write y."""
    return 2 * s.rows * s.n * itemsize(s.dtype) + 2 * s.n * itemsize(s.dtype)


def bytes_softmax_backward(s: Shape) -> int:
    """Read y, read dy, write dx."""
    return 3 * s.rows * s.n * itemsize(s.dtype)


def bytes_rms_norm_backward(s: Shape) -> int:
    """Read x, read dy, write dx; read the weight, write dweight."""
    return 3 * s.rows * s.n * itemsize(s.dtype) + 2 * s.n * itemsize(s.dtype)


def bytes_layer_norm_backward(s: Shape) -> int:
    """Read x, read dy, write dx; read the weight, write dweight and dbias."""
    return 3 * s.rows * s.n * itemsize(s.dtype) + 3 * s.n * itemsize(s.dtype)


def bytes_cross_entropy(s: Shape) -> int:
    """Read the logits and the int64 targets, write one float32 loss per row."""
    return s.rows * s.n * itemsize(s.dtype) + s.rows * (8 + 4)


def bytes_cross_entropy_with_grad(s: Shape) -> int:
    """Forward and dx in one step: read logits, targets and each row's float32 dy, write losses
    and dx."""
    return 2 * s.rows * s.n * itemsize(s.dtype) + s.rows * (8 + 4 + 4)


def bytes_cross_entropy_mean(s: Shape) -> int:
    """Read the logits and the int64 targets, write the one float32 mean loss."""
    return s.rows * s.n * itemsize(s.dtype) + s.rows * 8 + 4


def bytes_cross_entropy_mean_with_grad(s: Shape) -> int:
    """A training step's loss and loss.backward(): read logits and targets, write the loss and dx."""
    return 2 * s.rows * s.n * itemsize(s.dtype) + s.rows * 8 + 4


def bytes_top_k(s: Shape) -> int:
    """Read x, write TOP_K values and TOP_K int64 indices per row."""
    return s.rows * s.n * itemsize(s.dtype) + s.rows * TOP_K * (itemsize(s.dtype) + 8)


def bytes_sample(s: Shape) -> int:
    """Read the logits, write one int64 token per row."""
    return s.rows * s.n * itemsize(s.dtype) + s.rows * 8


# ----------------------------------------------------------------------------------------------
# Shapes
# ----------------------------------------------------------------------------------------------

#: The sweep holds the bytes fixed (2^26 elements) and moves N from 256 to 262144.
SWEEP_ELEMENTS = 1 << 26
SWEEP_NS = tuple(1 << k for k in range(8, 19))


def _shapes(pairs, dtype: str) -> tuple[Shape, ...]:
    return tuple(Shape(r, n, dtype) for r, n in pairs)


def _sweep(dtype: str) -> tuple[Shape, ...]:
    return tuple(Shape(SWEEP_ELEMENTS // n, n, dtype) for n in SWEEP_NS)


def _whole(sizes, dtype: str) -> tuple[Shape, ...]:
    return tuple(Shape(1, n, dtype) for n in sizes)


SMALL_ROWS = ((4, 256), (3, 1000))
WHOLE_SWEEP_SIZES = tuple(1 << k for k in range(16, 29, 2))


def _row_shapes(llm: tuple[Shape, ...], dtype: str = "bf16", check=((64, 4096), (8, 151936))) -> dict:
    return {"small": _shapes(SMALL_ROWS, dtype), "llm": llm, "sweep": _sweep(dtype),
            "check": _shapes(check, dtype)}


# ----------------------------------------------------------------------------------------------
# Inputs (random, never zero) and the tensors' float64 copies
# ----------------------------------------------------------------------------------------------

def _randn(shape, dtype: str, device, gen, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
    return (t * scale + shift).to(DTYPES[dtype])


def _rand(shape, dtype: str, device, gen) -> torch.Tensor:
    # uniform in (0, 1]: 1 - U with U in [0, 1) never gives zero
    return (1.0 - torch.rand(shape, generator=gen, device=device, dtype=torch.float32)).to(DTYPES[dtype])


def inputs_logits(s: Shape, device, gen) -> dict:
    return {"x": _randn((s.rows, s.n), s.dtype, device, gen, scale=2.0)}


def inputs_whole_uniform(s: Shape, device, gen) -> dict:
    return {"x": _rand((s.rows * s.n,), s.dtype, device, gen)}


def inputs_rows_normal(s: Shape, device, gen) -> dict:
    return {"x": _randn((s.rows, s.n), s.dtype, device, gen)}


def inputs_rows_uniform(s: Shape, device, gen) -> dict:
    return {"x": _rand((s.rows, s.n), s.dtype, device, gen)}


def inputs_whole_normal(s: Shape, device, gen) -> dict:
    return {"x": _randn((s.rows * s.n,), s.dtype, device, gen)}


def inputs_rms_norm(s: Shape, device, gen) -> dict:
    return {"x": _randn((s.rows, s.n), s.dtype, device, gen),
            "weight": _randn((s.n,), s.dtype, device, gen, scale=0.1, shift=1.0)}


def inputs_add_rms_norm(s: Shape, device, gen) -> dict:
    d = inputs_rms_norm(s, device, gen)
    d["residual"] = _randn((s.rows, s.n), s.dtype, device, gen)
    return d


def inputs_layer_norm(s: Shape, device, gen) -> dict:
    d = inputs_rms_norm(s, device, gen)
    d["bias"] = _randn((s.n,), s.dtype, device, gen, scale=0.1)
    return d


def inputs_cross_entropy(s: Shape, device, gen) -> dict:
    return {"x": _randn((s.rows, s.n), s.dtype, device, gen, scale=2.0),
            "target": torch.randint(0, s.n, (s.rows,), generator=gen, device=device, dtype=torch.int64)}


def inputs_sample(s: Shape, device, gen) -> dict:
    return {"x": _randn((s.rows, s.n), s.dtype, device, gen, scale=3.0),
            "generator": torch.Generator(device=device)}


def to_float64(inputs: dict) -> dict:
    """Float tensors as float64 copies (leaves, with ``requires_grad`` kept); others unchanged."""
    out = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor) and v.dtype.is_floating_point:
            out[k] = v.detach().to(torch.float64).requires_grad_(v.requires_grad)
        else:
            out[k] = v
    return out


# ----------------------------------------------------------------------------------------------
# torch code: float64 references, eager peers, and the treefold calls
# ----------------------------------------------------------------------------------------------

RMS_EPS = 1e-6
LN_EPS = 1e-5


def _rms_ref(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w


def hf_llama_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float = RMS_EPS) -> torch.Tensor:
    """Hugging Face's Llama RMSNorm: statistics in float32, the row cast back before the weight."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _eager_add_rms_norm(i):
    h = i["x"] + i["residual"]
    return F.rms_norm(h, (h.shape[-1],), i["weight"], RMS_EPS), h


def _hf_add_rms_norm(i):
    h = i["x"] + i["residual"]
    return hf_llama_rms_norm(h, i["weight"]), h


def _ref_add_rms_norm(i):
    h = i["x"] + i["residual"]
    return _rms_ref(h, i["weight"]), h


def hf_top_p_sample(i: dict) -> torch.Tensor:
    """Hugging Face's sort-based top-p filter, then torch.multinomial with a freshly seeded
    generator (so repeated calls draw the same tokens and determinism can be compared)."""
    logits = i["x"]
    sorted_logits, sorted_idx = torch.sort(logits, descending=False, dim=-1)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - SAMPLE_TOP_P)
    remove_sorted[..., -1:] = False
    remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
    probs = logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
    gen = i["generator"]
    gen.manual_seed(SAMPLE_SEED)
    return torch.multinomial(probs, 1, generator=gen).squeeze(1)


def top_p_allowed(i: dict) -> torch.Tensor:
    """float64: which tokens the top-p filter keeps (the smallest set of highest-probability
    tokens whose mass reaches p); a drawn token outside it is an error."""
    logits = i["x"].detach().to(torch.float64)
    probs = logits.softmax(dim=-1)
    sorted_p, sorted_idx = torch.sort(probs, descending=True, dim=-1)
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p
    keep_sorted = mass_before < SAMPLE_TOP_P
    return torch.zeros_like(keep_sorted).scatter(1, sorted_idx, keep_sorted)


# ----------------------------------------------------------------------------------------------
# Accuracy rules per kind of output
# ----------------------------------------------------------------------------------------------

def accuracy_float(actual, expected, inputs) -> dict:
    return float_accuracy(actual, expected)


def accuracy_exact(actual, expected, inputs) -> dict:
    return exact_accuracy(actual, expected)


def accuracy_top_k(actual, expected, inputs) -> dict:
    """Values must equal the float64 top-k values exactly (they are selected, not computed), and
    every index must point at its value (ties may pick either index)."""
    values, indices = actual[0], actual[1]
    out = exact_accuracy(values.to(torch.float64), expected[0])
    picked = inputs["x"].detach().gather(-1, indices.to(torch.int64))
    out["mismatches"] += int((picked != values).sum())
    return out


def accuracy_tokens(actual, allowed, inputs) -> dict:
    """A drawn token must be one the filter keeps."""
    tokens = actual.detach().to(torch.int64).reshape(-1, 1)
    ok = allowed.gather(1, tokens)
    return {"invalid_tokens": int((~ok).sum()), "source": "treefold.bench.cases"}


# ----------------------------------------------------------------------------------------------
# The case record
# ----------------------------------------------------------------------------------------------

@dataclass
class Case:
    name: str                    # unique key, e.g. "softmax", "softmax.bwd", "rms_norm+residual"
    kind: str                    # the op family a user selects it by, e.g. "rms_norm"
    title: str
    treefold_op: str             # the public treefold function the case needs
    shapes: dict                 # "small" / "llm" / "sweep" / "check" -> tuple of Shape
    make_inputs: Callable[[Shape, Any, Any], dict]
    count_bytes: Callable[[Shape], int]
    reference: Callable[[dict], Any]          # float64, differentiable torch code
    eager: Callable[[dict], Any]              # the torch eager peer
    call_treefold: Callable[[Any, dict], Any]
    # Hugging Face's model code, where it is not ``eager``; torch.compile compiles it where given
    hf_eager: Callable[[dict], Any] | None = None
    backward: Backward | None = None
    accuracy: Callable[[Any, Any, dict], dict] = accuracy_float
    whole_tensor: bool = False
    outputs: str = "float"       # "float", "exact" or "tokens": how accuracy is judged
    unary: bool = True           # the op is a function of x alone (with fixed extras): three_way applies
    notes: str = ""              # what a reader of the report should know about the peers

    @property
    def base(self) -> str:
        """The forward case a backward case differentiates (itself for a forward case)."""
        return self.name[:-4] if self.name.endswith(".bwd") else self.name

    def label(self, s: Shape) -> str:
        return pow2_label(s.rows * s.n) if self.whole_tensor else f"{s.rows}x{s.n}"

    def shapes_for(self, shape_set: str, dtype: str | None = None) -> tuple[Shape, ...]:
        if shape_set not in self.shapes:
            raise ValueError(f"shapes must be one of {', '.join(SHAPE_SETS)} or check, got {shape_set!r}")
        shapes = self.shapes[shape_set]
        return tuple(s.with_dtype(dtype) for s in shapes) if dtype else shapes


def _backward_of(fwd: Case, *, wrt: tuple[str, ...], llm: tuple[Shape, ...],
                 count_bytes: Callable[[Shape], int], fused: bool = False, title: str = "") -> Case:
    shapes = dict(fwd.shapes)
    shapes["llm"] = llm
    return dataclasses.replace(fwd, name=fwd.name + ".bwd", title=title or fwd.title + ", backward",
                               shapes=shapes, count_bytes=count_bytes, backward=Backward(wrt, fused),
                               unary=False)


def _cases() -> list[Case]:
    bf = "bf16"
    softmax = Case(
        "softmax", "softmax", "softmax over rows", "softmax",
        _row_shapes(_shapes([(8192, 4096), (32768, 8192), (4096, 32768), (256, 131072), (64, 151936),
                             (1, 151936)], bf) + _shapes([(8192, 4096)], "fp32")),
        inputs_logits, bytes_rowwise,
        reference=lambda i: torch.softmax(i["x"], dim=-1),
        eager=lambda i: torch.softmax(i["x"], dim=-1),
        call_treefold=lambda tf, i: tf.softmax(i["x"], dim=-1))
    log_softmax = Case(
        "log_softmax", "log_softmax", "log-softmax over rows", "log_softmax",
        _row_shapes(_shapes([(8192, 4096), (4096, 32768), (64, 151936)], bf)),
        inputs_logits, bytes_rowwise,
        reference=lambda i: torch.log_softmax(i["x"], dim=-1),
        eager=lambda i: torch.log_softmax(i["x"], dim=-1),
        call_treefold=lambda tf, i: tf.log_softmax(i["x"], dim=-1))
    logsumexp = Case(
        "logsumexp", "logsumexp", "log-sum-exp of rows", "logsumexp",
        _row_shapes(_shapes([(8192, 4096), (64, 151936), (1, 151936)], bf)),
        inputs_logits, bytes_row_to_one,
        reference=lambda i: torch.logsumexp(i["x"], dim=-1),
        eager=lambda i: torch.logsumexp(i["x"], dim=-1),
        call_treefold=lambda tf, i: tf.logsumexp(i["x"], dim=-1))
    rms_norm = Case(
        "rms_norm", "rms_norm", "RMSNorm (llama casting)", "rms_norm",
        _row_shapes(_shapes([(8192, 4096), (32768, 4096), (16384, 8192), (4096, 16384), (65536, 1024),
                             (64, 8192), (1, 4096)], bf) + _shapes([(8192, 4096)], "fp32"),
                    check=((64, 4096), (16, 14336), (7, 33))),
        inputs_rms_norm, bytes_rms_norm,
        reference=lambda i: _rms_ref(i["x"], i["weight"]),
        eager=lambda i: F.rms_norm(i["x"], (i["x"].shape[-1],), i["weight"], RMS_EPS),
        call_treefold=lambda tf, i: tf.rms_norm(i["x"], i["weight"], RMS_EPS),
        hf_eager=lambda i: hf_llama_rms_norm(i["x"], i["weight"]),
        notes="torch eager is F.rms_norm; hf runs Hugging Face's Llama RMSNorm eagerly and "
              "torch.compile compiles it")
    add_rms_norm = Case(
        "rms_norm+residual", "rms_norm", "h = x + residual, then RMSNorm; returns (y, h)", "rms_norm",
        _row_shapes(_shapes([(32768, 4096), (1, 4096)], bf), check=((64, 4096), (16, 14336))),
        inputs_add_rms_norm, bytes_add_rms_norm,
        reference=_ref_add_rms_norm, eager=_eager_add_rms_norm,
        call_treefold=lambda tf, i: tf.rms_norm(i["x"], i["weight"], RMS_EPS, residual=i["residual"]),
        hf_eager=_hf_add_rms_norm, unary=False,
        notes="torch eager is the add then F.rms_norm; hf runs the add and Hugging Face's Llama "
              "RMSNorm eagerly and torch.compile compiles them")
    layer_norm = Case(
        "layer_norm", "layer_norm", "LayerNorm with weight and bias", "layer_norm",
        _row_shapes(_shapes([(8192, 4096), (16384, 8192), (65536, 1024)], bf),
                    check=((64, 4096), (16, 14336), (7, 33))),
        inputs_layer_norm, bytes_layer_norm,
        reference=lambda i: F.layer_norm(i["x"], (i["x"].shape[-1],), i["weight"], i["bias"], LN_EPS),
        eager=lambda i: F.layer_norm(i["x"], (i["x"].shape[-1],), i["weight"], i["bias"], LN_EPS),
        call_treefold=lambda tf, i: tf.layer_norm(i["x"], (i["x"].shape[-1],), i["weight"], i["bias"], LN_EPS))
    cross_entropy = Case(
        "cross_entropy", "cross_entropy", "cross-entropy per row (reduction='none')", "cross_entropy",
        _row_shapes(_shapes([(8192, 128256)], bf), check=((16, 128256), (64, 4096))),
        inputs_cross_entropy, bytes_cross_entropy,
        reference=lambda i: F.cross_entropy(i["x"], i["target"], reduction="none"),
        eager=lambda i: F.cross_entropy(i["x"], i["target"], reduction="none"),
        call_treefold=lambda tf, i: tf.cross_entropy(i["x"], i["target"], reduction="none"),
        unary=False)
    cross_entropy_mean = Case(
        "cross_entropy_mean", "cross_entropy", "cross-entropy mean loss", "cross_entropy",
        _row_shapes(_shapes([(8192, 128256)], bf), check=((16, 128256), (64, 4096))),
        inputs_cross_entropy, bytes_cross_entropy_mean,
        reference=lambda i: F.cross_entropy(i["x"], i["target"]),
        eager=lambda i: F.cross_entropy(i["x"], i["target"]),
        call_treefold=lambda tf, i: tf.cross_entropy(i["x"], i["target"]),
        unary=False)
    whole = {"small": _whole((1000, 4097), "fp32"), "sweep": _whole(WHOLE_SWEEP_SIZES, "fp32"),
             "check": _whole(((1 << 24) + 1, 1 << 20), "fp32")}
    sum_all = Case(
        "sum", "sum", "sum of a whole tensor", "sum",
        dict(whole, llm=_whole((1 << 26, 1 << 28), "fp32") + _whole((1 << 28,), bf)),
        inputs_whole_uniform, bytes_whole_to_one,
        reference=lambda i: i["x"].sum(),
        eager=lambda i: torch.sum(i["x"]),
        call_treefold=lambda tf, i: tf.sum(i["x"]), whole_tensor=True)
    sum_accurate = dataclasses.replace(
        sum_all, name="sum.accurate", title="correctly rounded sum of a whole tensor (accurate=True)",
        shapes=dict(whole, llm=_whole((1 << 28,), "fp32")),
        call_treefold=lambda tf, i: tf.sum(i["x"], accurate=True),
        notes="the peers are the ordinary sums")
    argmax_all = Case(
        "argmax.all", "argmax", "argmax of a whole tensor", "argmax",
        dict(whole, llm=_whole((1 << 28,), "fp32")),
        inputs_whole_normal, bytes_whole_to_index,
        reference=lambda i: i["x"].argmax(),
        eager=lambda i: torch.argmax(i["x"]),
        call_treefold=lambda tf, i: tf.argmax(i["x"]),
        accuracy=accuracy_exact, whole_tensor=True, outputs="exact")

    def row_reduction(op: str, title: str, ref, eager, llm, inputs=inputs_rows_normal,
                      count=bytes_row_to_one, accuracy=accuracy_float, outputs="float", dtype=bf):
        return Case(f"{op}.rows", op, title, op,
                    _row_shapes(llm, dtype=dtype), inputs, count,
                    reference=ref, eager=eager,
                    call_treefold=lambda tf, i: getattr(tf, op)(i["x"], dim=-1),
                    accuracy=accuracy, outputs=outputs)

    sum_rows = row_reduction("sum", "sum of each row", lambda i: i["x"].sum(-1),
                             lambda i: torch.sum(i["x"], dim=-1), _shapes([(8192, 4096)], bf),
                             inputs=inputs_rows_uniform)
    mean_rows = row_reduction("mean", "mean of each row", lambda i: i["x"].mean(-1),
                              lambda i: torch.mean(i["x"], dim=-1), _shapes([(8192, 4096)], bf),
                              inputs=inputs_rows_uniform)
    amax_rows = row_reduction("amax", "max of each row", lambda i: i["x"].amax(-1),
                              lambda i: torch.amax(i["x"], dim=-1), _shapes([(8192, 4096)], bf))
    amin_rows = row_reduction("amin", "min of each row", lambda i: i["x"].amin(-1),
                              lambda i: torch.amin(i["x"], dim=-1), _shapes([(8192, 4096)], bf))
    norm_rows = row_reduction("norm", "2-norm of each row",
                              lambda i: torch.linalg.vector_norm(i["x"], dim=-1),
                              lambda i: torch.linalg.vector_norm(i["x"], dim=-1), _shapes([(8192, 4096)], bf))
    argmax_rows = row_reduction("argmax", "argmax of each row (greedy decoding)",
                                lambda i: i["x"].argmax(-1), lambda i: torch.argmax(i["x"], dim=-1),
                                _shapes([(1, 151936), (64, 151936)], "fp32"), count=bytes_row_to_index,
                                accuracy=accuracy_exact, outputs="exact", dtype="fp32")
    argmin_rows = row_reduction("argmin", "argmin of each row",
                                lambda i: i["x"].argmin(-1), lambda i: torch.argmin(i["x"], dim=-1),
                                _shapes([(64, 151936)], "fp32"), count=bytes_row_to_index,
                                accuracy=accuracy_exact, outputs="exact", dtype="fp32")
    top_k = Case(
        "top_k", "top_k", f"top-k values and indices per row, k={TOP_K}", "top_k",
        _row_shapes(_shapes([(64, 151936)], "fp32"), dtype="fp32", check=((8, 151936), (64, 4096))),
        inputs_rows_normal, bytes_top_k,
        reference=lambda i: tuple(torch.topk(i["x"], TOP_K, dim=-1)),
        eager=lambda i: tuple(torch.topk(i["x"], TOP_K, dim=-1)),
        call_treefold=lambda tf, i: tuple(tf.top_k(i["x"], TOP_K)),
        accuracy=accuracy_top_k, outputs="exact", unary=False)
    sample = Case(
        "sample.top_p", "sample", f"top-p sampling, p={SAMPLE_TOP_P}, seeded", "sample",
        _row_shapes(_shapes([(64, 151936), (1, 151936)], "fp32"), dtype="fp32", check=((8, 151936),)),
        inputs_sample, bytes_sample,
        reference=top_p_allowed, eager=hf_top_p_sample,
        call_treefold=lambda tf, i: tf.sample(i["x"], top_p=SAMPLE_TOP_P, seed=SAMPLE_SEED, offset=0),
        accuracy=accuracy_tokens, outputs="tokens", unary=False,
        notes="torch eager is Hugging Face's sort-based top-p path with torch.multinomial")

    softmax_bwd = _backward_of(softmax, wrt=("x",), llm=_shapes([(8192, 4096), (4096, 32768)], bf),
                               count_bytes=bytes_softmax_backward)
    rms_norm_bwd = _backward_of(rms_norm, wrt=("x", "weight"),
                                llm=_shapes([(32768, 4096), (16384, 8192)], bf),
                                count_bytes=bytes_rms_norm_backward, title="RMSNorm backward (dx, dweight)")
    layer_norm_bwd = _backward_of(layer_norm, wrt=("x", "weight", "bias"), llm=_shapes([(16384, 8192)], bf),
                                  count_bytes=bytes_layer_norm_backward,
                                  title="LayerNorm backward (dx, dweight, dbias)")
    cross_entropy_bwd = _backward_of(cross_entropy, wrt=("x",), llm=_shapes([(8192, 128256)], bf),
                                     count_bytes=bytes_cross_entropy_with_grad, fused=True,
                                     title="cross-entropy forward + dx, one step")
    # a training step: the mean loss and loss.backward() (dy = 1), forward and gradient timed together
    cross_entropy_mean_bwd = dataclasses.replace(
        _backward_of(cross_entropy_mean, wrt=("x",), llm=_shapes([(8192, 128256)], bf),
                     count_bytes=bytes_cross_entropy_mean_with_grad, fused=True,
                     title="cross-entropy mean loss and loss.backward(), one step"),
        backward=Backward(("x",), fused=True, unit_grad=True))
    return [softmax, softmax_bwd, log_softmax, logsumexp, rms_norm, rms_norm_bwd, add_rms_norm,
            layer_norm, layer_norm_bwd, cross_entropy, cross_entropy_bwd, cross_entropy_mean,
            cross_entropy_mean_bwd, sum_all, sum_accurate, sum_rows,
            mean_rows, amax_rows, amin_rows, norm_rows, argmax_rows, argmax_all, argmin_rows, top_k, sample]


CASES: list[Case] = _cases()
CASES_BY_NAME: dict[str, Case] = {c.name: c for c in CASES}
KINDS: tuple[str, ...] = tuple(dict.fromkeys(c.kind for c in CASES))


def select_cases(ops: list[str] | None, backward: bool, cases: list[Case] | None = None) -> list[Case]:
    """Cases named or whose kind is named in ``ops`` (all when empty); backward cases with
    ``backward`` or when named themselves. Raises ValueError naming an op that matches nothing."""
    pool = CASES if cases is None else cases
    if ops:
        known = {c.name for c in pool} | {c.kind for c in pool}
        unknown = [o for o in ops if o not in known]
        if unknown:
            raise ValueError(f"unknown op(s) {', '.join(unknown)}; choose from: {', '.join(sorted(known))}")
    chosen = []
    for c in pool:
        if c.backward is not None and not backward and c.name not in (ops or ()):
            continue
        if ops and c.name not in ops and c.kind not in ops:
            continue
        chosen.append(c)
    return chosen


# ----------------------------------------------------------------------------------------------
# Host overhead: tiny shapes where the launch, not the kernel, is the cost
# ----------------------------------------------------------------------------------------------

HOST_OVERHEAD = (("softmax", Shape(1, 4096, "bf16")), ("rms_norm", Shape(1, 4096, "bf16")),
                 ("rms_norm+residual", Shape(1, 4096, "bf16")), ("argmax.rows", Shape(1, 151936, "fp32")))
