"""Probe: cost of the grouped halving tree on the GPU for group widths 4 and 8, bf16 and fp32 rows.

python benchmarks/probe_group.py  (CUDA). Prints a short table.
"""
import torch
import triton
import triton.language as tl


@triton.jit
def grouped_tree(x, ROWS: tl.constexpr, WIDTH: tl.constexpr, LOG2_WIDTH: tl.constexpr,
                 GROUP: tl.constexpr, LOG2_GROUP: tl.constexpr):
    GROUPS: tl.constexpr = WIDTH // GROUP
    x = tl.reshape(x, [ROWS, GROUPS, GROUP])
    for level in tl.static_range(LOG2_GROUP):
        x = tl.sum(tl.reshape(x, [ROWS, GROUPS, 2, GROUP >> (level + 1)]), axis=2)
    x = tl.reshape(x, [ROWS, GROUPS])
    for level in tl.static_range(LOG2_WIDTH - LOG2_GROUP):
        x = tl.sum(tl.reshape(x, [ROWS, 2, GROUPS >> (level + 1)]), axis=1)
    return tl.reshape(x, [ROWS])


@triton.jit
def max_sum_merge(m_a, s_a, m_b, s_b):
    m = tl.maximum(m_a, m_b)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    return m, s_a * tl.exp(m_a - m_safe) + s_b * tl.exp(m_b - m_safe)


@triton.jit
def softmax_kernel(x_ptr, y_ptr, rows, n, stride, S: tl.constexpr, LOG2_S: tl.constexpr, C: tl.constexpr,
                   LOG2_C: tl.constexpr, G: tl.constexpr, LOG2_G: tl.constexpr, RPP: tl.constexpr,
                   MODE: tl.constexpr):
    pid = tl.program_id(0)
    for r in range(RPP):
        row = pid * RPP + r
        if row < rows:
            offs = tl.arange(0, S)[:, None] * C + tl.arange(0, C)[None, :]
            mask = offs < n
            x = tl.load(x_ptr + row.to(tl.int64) * stride + offs, mask=mask, other=float("-inf")).to(tl.float32)
            if MODE == 0:
                m_seg = tl.max(x, axis=1)
                m_safe = tl.where(m_seg == float("-inf"), 0.0, m_seg)
                e = tl.exp(x - m_safe[:, None])
                s_seg = grouped_tree(e, S, C, LOG2_C, G, LOG2_G)
                m_seg = tl.reshape(m_seg, [1, S])
                s_seg = tl.reshape(s_seg, [1, S])
                for level in tl.static_range(LOG2_S):
                    m_seg, s_seg = tl.reduce((tl.reshape(m_seg, [1, 2, S >> (level + 1)]),
                                              tl.reshape(s_seg, [1, 2, S >> (level + 1)])), axis=1,
                                             combine_fn=max_sum_merge)
                m = tl.sum(tl.reshape(m_seg, [1]), axis=0)
                z = tl.sum(tl.reshape(s_seg, [1]), axis=0)
            else:
                m = tl.max(tl.max(x, axis=1), axis=0)
                z = tl.sum(tl.sum(tl.exp(x - m), axis=1), axis=0)
            y = tl.exp(x - m) / z
            tl.store(y_ptr + row.to(tl.int64) * stride + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rowsum_kernel(x_ptr, y_ptr, rows, n, stride, S: tl.constexpr, C: tl.constexpr, LOG2_C: tl.constexpr,
                  G: tl.constexpr, LOG2_G: tl.constexpr, RPP: tl.constexpr, MODE: tl.constexpr):
    pid = tl.program_id(0)
    for r in range(RPP):
        row = pid * RPP + r
        if row < rows:
            offs = tl.arange(0, S)[:, None] * C + tl.arange(0, C)[None, :]
            x = tl.load(x_ptr + row.to(tl.int64) * stride + offs, mask=offs < n, other=0.0).to(tl.float32)
            if MODE == 0:
                s = tl.sum(grouped_tree(x, S, C, LOG2_C, G, LOG2_G), axis=0)
            else:
                s = tl.sum(tl.sum(x, axis=1), axis=0)
            tl.store(y_ptr + row, s)


def lg(v):
    return v.bit_length() - 1


def main():
    bench = lambda f: triton.testing.do_bench(f, warmup=25, rep=150, return_mode="median") * 1e-3  # noqa: E731
    a = torch.empty(1 << 28, device="cuda")
    b = torch.empty_like(a)
    roof = 2 * a.numel() * 4 / bench(lambda: b.copy_(a)) / 1e9
    del a, b
    out = []
    for dt in (torch.bfloat16, torch.float32):
        for shape in [(8192, 4096), (32768, 8192), (4096, 32768)]:
            x = torch.randn(*shape, device="cuda", dtype=dt)
            rows, n = shape
            C = 1024
            S = n // C
            y = torch.empty_like(x)
            s = torch.empty(rows, device="cuda")
            nb = x.numel() * x.element_size()
            for kind, kern, nbytes in (("softmax", softmax_kernel, 2 * nb), ("rowsum", rowsum_kernel, nb)):
                best = {}
                for mode, g in ((0, 4), (0, 8), (1, 0)):
                    for nw in (1, 2, 4, 8, 16):
                        for rpp in (1, 2):
                            if n >= 32768 and nw < 4:
                                continue
                            G = max(g, 1)
                            if kind == "softmax":
                                f = lambda: kern[(triton.cdiv(rows, rpp),)](  # noqa: E731
                                    x, y, rows, n, n, S, lg(S), C, lg(C), G, lg(G), rpp, mode, num_warps=nw)
                            else:
                                f = lambda: kern[(triton.cdiv(rows, rpp),)](  # noqa: E731
                                    x, s, rows, n, n, S, C, lg(C), G, lg(G), rpp, mode, num_warps=nw)
                            try:
                                t = bench(f)
                            except Exception as e:  # noqa: BLE001
                                print("fail", kind, shape, mode, g, nw, rpp, repr(e)[:120])
                                continue
                            key = "free" if mode else f"G{g}"
                            if key not in best or t < best[key][0]:
                                best[key] = (t, nw, rpp)
                for key, (t, nw, rpp) in best.items():
                    out.append((kind, str(dt)[6:], f"{rows}x{n}", key, nw, rpp, t, nbytes / t / 1e9))
    print(f"roof {roof:.0f} GB/s")
    print(f"{'op':8} {'dtype':9} {'shape':11} {'tree':5} {'nw':>3} {'rpp':>3} {'us':>8} {'%roof':>6}")
    for kind, dt, shp, key, nw, rpp, t, gbs in out:
        print(f"{kind:8} {dt:9} {shp:11} {key:5} {nw:3} {rpp:3} {t*1e6:8.1f} {100*gbs/roof:6.1f}")


if __name__ == "__main__":
    main()
