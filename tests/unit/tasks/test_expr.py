import pytest

from kope_mcp.tasks.expr import ExpressionError, evaluate, names_in


def test_evaluates_arithmetic_over_sizes():
    assert evaluate("2*M*N*K", {"M": 2, "N": 3, "K": 4}) == 48
    assert evaluate("F*(H-KH+1)", {"F": 2, "H": 5, "KH": 3}) == 6
    assert evaluate("max(a, b) // 2", {"a": 7, "b": 3}) == 3
    assert evaluate(5, {}) == 5


def test_names_in_lists_size_names_but_not_functions():
    assert names_in("min(M, N) * K") == {"M", "N", "K"}


def test_unknown_size_names_the_valid_ones():
    with pytest.raises(ExpressionError, match="sizes are"):
        evaluate("n + m", {"n": 1})


@pytest.mark.parametrize("bad", ["__import__('os')", "a.b", "[1]", "1 if n else 2", "n +"])
def test_rejects_anything_but_integer_arithmetic(bad):
    with pytest.raises(ExpressionError):
        evaluate(bad, {"n": 1})
