import triton
import triton.language as tl


@triton.jit
def rmsnorm_kernel(x_ptr, gamma_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * cols
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < cols, other=0.0)
        acc += x * x
    rrms = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / cols + 1e-6)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < cols
        x = tl.load(x_row + offs, mask=mask, other=0.0)
        g = tl.load(gamma_ptr + offs, mask=mask, other=0.0)
        tl.store(y_ptr + row * cols + offs, x * rrms * g, mask=mask)


def kernel(x, gamma, y, rows, cols):
    rmsnorm_kernel[(rows,)](x, gamma, y, cols, BLOCK=256)
