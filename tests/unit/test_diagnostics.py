from kope_mcp.diagnostics import parse_diagnostics

LOG = """\
kernel.c: In function 'kernel':
kernel.c:3:53: error: 'j' undeclared (first use in this function)
kernel.c:7:5: warning: unused variable 'tmp' [-Wunused-variable]
In file included from <command-line>:
kope_prototype.h:3:6: note: previous declaration of 'kernel' with type 'void(float *)'
/usr/bin/ld: kernel.o: undefined reference to `foo'
"""


def test_parses_lines_columns_and_severities_of_the_submitted_source():
    diags = parse_diagnostics(LOG, "kernel.c")
    assert (diags[0].line, diags[0].column, diags[0].severity) == (3, 53, "error")
    assert diags[1].severity == "warning" and diags[1].line == 7


def test_messages_about_other_files_do_not_point_into_the_source():
    diags = parse_diagnostics(LOG, "kernel.c")
    header = next(d for d in diags if d.file == "kope_prototype.h")
    assert header.line == 0 and header.severity == "note"


def test_linker_errors_are_kept():
    assert any(d.file == "<link>" and "undefined reference" in d.message for d in parse_diagnostics(LOG, "kernel.c"))
