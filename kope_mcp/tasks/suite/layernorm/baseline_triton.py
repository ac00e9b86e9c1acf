import triton
import triton.language as tl


@triton.jit
def layernorm_kernel(x_ptr, gamma_ptr, beta_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    # One program per row: mean, then variance around it, then the normalised row.
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * cols
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_row + offs, mask=offs < cols, other=0.0)
    mean = tl.sum(acc, axis=0) / cols
    acc = tl.zeros([BLOCK], tl.float32)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < cols, other=0.0)
        d = tl.where(offs < cols, x - mean, 0.0)
        acc += d * d
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / cols + 1e-5)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < cols
        x = tl.load(x_row + offs, mask=mask, other=0.0)
        g = tl.load(gamma_ptr + offs, mask=mask, other=0.0)
        b = tl.load(beta_ptr + offs, mask=mask, other=0.0)
        tl.store(y_ptr + row * cols + offs, (x - mean) * rstd * g + b, mask=mask)


def kernel(x, gamma, beta, y, rows, cols):
    layernorm_kernel[(rows,)](x, gamma, beta, y, cols, BLOCK=256)
