import triton
import triton.language as tl


@triton.jit
def transpose_kernel(x_ptr, out_ptr, rows, cols, BLOCK: tl.constexpr):
    # One program per input row: reads it contiguously, writes a strided column of the output.
    r = tl.program_id(0).to(tl.int64)
    for start in range(0, cols, BLOCK):
        c = start + tl.arange(0, BLOCK)
        mask = c < cols
        tl.store(out_ptr + c * rows + r, tl.load(x_ptr + r * cols + c, mask=mask), mask=mask)


def kernel(x, out, rows, cols):
    transpose_kernel[(rows,)](x, out, rows, cols, BLOCK=256)
