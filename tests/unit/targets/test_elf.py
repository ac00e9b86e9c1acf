"""The exported functions of a built library, read from its ELF symbol table as `nm -D --defined-only` shows T."""

import random
import subprocess

from kope_mcp.targets.elf import exported_functions

SOURCE = """
static int helper(int x) { return x + 1; }
int data_symbol = 3;
void kernel(float *x) { x[0] = helper(1); }
__attribute__((weak)) void weak_function(void) {}
extern void elsewhere(void);
void caller(void) { elsewhere(); }
"""


def build(tmp_path) -> bytes:
    (tmp_path / "k.c").write_text(SOURCE)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(tmp_path / "k.so"), str(tmp_path / "k.c")],
                   check=True)
    return (tmp_path / "k.so").read_bytes()


def test_only_defined_global_functions_count(tmp_path):
    assert exported_functions(build(tmp_path)) == {"kernel", "caller"}


def test_what_is_not_an_elf_library_exports_nothing_and_corrupt_bytes_never_raise(tmp_path):
    image = build(tmp_path)
    for junk in (b"", b"\x7fELF", image[:200], b"MZ" + image[2:], bytes(1000)):
        assert exported_functions(junk) == set()
    rng = random.Random(7)
    for _ in range(300):
        corrupt = bytearray(image)
        for _ in range(30):
            corrupt[rng.randrange(len(corrupt))] = rng.randrange(256)
        assert isinstance(exported_functions(bytes(corrupt)), set)
