from kope_mcp.memory.signature import compile_signature, failure_signature


def test_the_same_mistake_on_another_line_or_name_has_the_same_signature():
    a = compile_signature("‘brow’ undeclared (first use in this function); did you mean ‘crow’?")
    b = compile_signature("'rowB' undeclared (first use in this function); did you mean 'rowA'?")
    assert a == b and a.startswith("compile: ")


def test_different_mistakes_differ():
    assert compile_signature("expected ';' before '}' token") != compile_signature("'x' undeclared")


def test_test_signatures_name_the_failure_kind_and_detail():
    assert failure_signature("mismatch", "", unwritten=3) == "test:mismatch:unwritten"
    assert failure_signature("mismatch", "", unwritten=0) == "test:mismatch:values"
    assert failure_signature("crash", "the kernel process killed by SIGSEGV (invalid ...)") == "test:crash:SIGSEGV"
    assert failure_signature(None, "") is None
