import triton
import triton.language as tl


@triton.jit
def mse_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        d = tl.load(a_ptr + offs, mask=mask, other=0.0) - tl.load(b_ptr + offs, mask=mask, other=0.0)
        acc += d * d
    tl.store(out_ptr, tl.sum(acc, axis=0) / n)


def kernel(a, b, out, n):
    mse_kernel[(1,)](a, b, out, n, BLOCK=1024)
