import triton
import triton.language as tl


@triton.jit
def leaky_relu_kernel(x_ptr, y_ptr, slope, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.where(x > 0, x, slope * x), mask=mask)


def kernel(negative_slope, x, y, n):
    BLOCK = 256
    leaky_relu_kernel[(triton.cdiv(n, BLOCK),)](x, y, negative_slope, n, BLOCK=BLOCK)
